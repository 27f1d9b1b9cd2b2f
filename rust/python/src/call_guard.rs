//! One call at a time per manager. A manager's calls read the caller's
//! objects (request attributes, lists, ints, sinks), and any of them can
//! run Python code: a property, `__len__`, `__index__`, a finalizer, or
//! another thread when a read lets go of the GIL. Such code may call the
//! same manager again. Each entry point that changes the manager or runs
//! the caller's code first enters the manager here: a second call on a
//! manager whose call is in progress is refused with a RuntimeError naming
//! that call, before it reads or changes anything, and the call in progress
//! completes as if the second had not been made.
//!
//! The calls in progress live in one list under the GIL (a manager's own
//! state is borrowed by its call, so it cannot say what is running):
//! usually empty, one entry per call under way on any manager.

use std::cell::RefCell;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::pycell::{PyRef, PyRefMut};
use pyo3::sync::GILProtected;

use crate::native_manager::NativeManager;

/// (manager address, name of its call in progress).
static IN_PROGRESS: GILProtected<RefCell<Vec<(usize, &'static str)>>> =
    GILProtected::new(RefCell::new(Vec::new()));

/// A manager's call in progress; leaving it (drop) ends it.
pub(crate) struct InCall<'py> {
    py: Python<'py>,
    manager: usize,
}

/// Enters the manager at `manager` (its object's address) for the call
/// `name`; RuntimeError when a call on it is in progress.
#[inline]
pub(crate) fn enter_addr<'py>(
    py: Python<'py>,
    manager: usize,
    name: &'static str,
) -> PyResult<InCall<'py>> {
    let mut calls = IN_PROGRESS.get(py).borrow_mut();
    if let Some(&(_, running)) = calls.iter().find(|(m, _)| *m == manager) {
        return Err(refused(name, running));
    }
    calls.push((manager, name));
    Ok(InCall { py, manager })
}

/// `enter_addr` for a bound manager.
#[inline]
pub(crate) fn enter<'py>(
    slf: &Bound<'py, NativeManager>,
    name: &'static str,
) -> PyResult<InCall<'py>> {
    enter_addr(slf.py(), slf.as_ptr() as usize, name)
}

impl Drop for InCall<'_> {
    #[inline]
    fn drop(&mut self) {
        let mut calls = IN_PROGRESS.get(self.py).borrow_mut();
        if let Some(i) = calls.iter().rposition(|(m, _)| *m == self.manager) {
            calls.swap_remove(i);
        }
    }
}

/// The name of the call in progress on the manager at `manager`, if any.
pub(crate) fn running(py: Python<'_>, manager: usize) -> Option<&'static str> {
    let calls = IN_PROGRESS.get(py).borrow();
    calls.iter().find(|(m, _)| *m == manager).map(|&(_, n)| n)
}

#[cold]
#[inline(never)]
fn refused(name: &str, running: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{name}: refused, a call on this manager is in progress ({running}); a manager serves \
         one call at a time: a callback of that call (a property, __index__, __len__, a \
         finalizer) or another thread called it again (see the threading contract in \
         docs/ARCHITECTURE.md, Threads and re-entrancy)"
    ))
}

#[cold]
#[inline(never)]
fn busy(py: Python<'_>, manager: usize) -> PyErr {
    let running = running(py, manager).unwrap_or("another call");
    PyRuntimeError::new_err(format!(
        "this manager is in a call ({running}); a manager serves one call at a time \
         (see the threading contract in docs/ARCHITECTURE.md, Threads and re-entrancy)"
    ))
}

/// The manager's state, shared: RuntimeError (not a panic) while a call
/// has it borrowed.
#[inline]
pub(crate) fn borrow<'a, 'py>(slf: &'a Bound<'py, NativeManager>) -> PyResult<PyRef<'py, NativeManager>> {
    slf.try_borrow().map_err(|_| busy(slf.py(), slf.as_ptr() as usize))
}

/// The manager's state, exclusive: RuntimeError (not a panic) while a call
/// has it borrowed.
#[inline]
pub(crate) fn borrow_mut<'a, 'py>(
    slf: &'a Bound<'py, NativeManager>,
) -> PyResult<PyRefMut<'py, NativeManager>> {
    slf.try_borrow_mut()
        .map_err(|_| busy(slf.py(), slf.as_ptr() as usize))
}

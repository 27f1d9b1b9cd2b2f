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
//! The calls in progress live under the GIL (a manager's own state is
//! borrowed by its call, so it cannot say what is running): the first in
//! one slot, which is all a serving loop ever uses, any more (calls on
//! other managers meanwhile, other threads) in a list, usually empty.

use std::cell::{Cell, RefCell};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::pycell::{PyRef, PyRefMut};
use pyo3::sync::GILProtected;

use crate::native_manager::NativeManager;

/// (manager address, name of its call in progress); 0: none.
type Entry = (usize, &'static str);

struct InProgress {
    /// The first call's manager address (0: none) and name (stale when 0:
    /// leaving a call clears the address only).
    first: Cell<usize>,
    first_name: Cell<&'static str>,
    more: RefCell<Vec<Entry>>,
    /// `more.len()`, read without borrowing it.
    num_more: Cell<usize>,
}

static IN_PROGRESS: GILProtected<InProgress> = GILProtected::new(InProgress {
    first: Cell::new(0),
    first_name: Cell::new(""),
    more: RefCell::new(Vec::new()),
    num_more: Cell::new(0),
});

/// A manager's call in progress; leaving it (drop) ends it.
pub(crate) struct InCall<'py> {
    py: Python<'py>,
    manager: usize,
}

/// Enters the manager at `manager` (its object's address) for the call
/// `name`; RuntimeError when a call on it is in progress.
#[inline(always)]
pub(crate) fn enter_addr<'py>(
    py: Python<'py>,
    manager: usize,
    name: &'static str,
) -> PyResult<InCall<'py>> {
    let calls = IN_PROGRESS.get(py);
    // The usual case: no call in progress anywhere.
    if calls.first.get() == 0 && calls.num_more.get() == 0 {
        calls.first.set(manager);
        calls.first_name.set(name);
        return Ok(InCall { py, manager });
    }
    enter_other(py, calls, manager, name)
}

/// `enter_addr` while some call is in progress (on this manager: refused).
#[cold]
#[inline(never)]
fn enter_other<'py>(
    py: Python<'py>,
    calls: &InProgress,
    manager: usize,
    name: &'static str,
) -> PyResult<InCall<'py>> {
    let first = calls.first.get();
    if first == manager {
        return Err(refused(name, calls.first_name.get()));
    }
    if first == 0 && calls.num_more.get() == 0 {
        calls.first.set(manager);
        calls.first_name.set(name);
    } else {
        enter_more(calls, manager, name)?;
    }
    Ok(InCall { py, manager })
}

fn enter_more(calls: &InProgress, manager: usize, name: &'static str) -> PyResult<()> {
    let mut more = calls.more.borrow_mut();
    if let Some(&(_, running)) = more.iter().find(|(m, _)| *m == manager) {
        return Err(refused(name, running));
    }
    more.push((manager, name));
    calls.num_more.set(more.len());
    Ok(())
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
    #[inline(always)]
    fn drop(&mut self) {
        let calls = IN_PROGRESS.get(self.py);
        if calls.first.get() == self.manager {
            calls.first.set(0);
        } else {
            leave_more(calls, self.manager);
        }
    }
}

#[cold]
#[inline(never)]
fn leave_more(calls: &InProgress, manager: usize) {
    let mut more = calls.more.borrow_mut();
    if let Some(i) = more.iter().position(|(m, _)| *m == manager) {
        more.swap_remove(i);
    }
    calls.num_more.set(more.len());
}

/// The name of the call in progress on the manager at `manager`, if any.
pub(crate) fn running(py: Python<'_>, manager: usize) -> Option<&'static str> {
    let calls = IN_PROGRESS.get(py);
    if calls.first.get() == manager {
        return Some(calls.first_name.get());
    }
    let more = calls.more.borrow();
    more.iter().find(|(m, _)| *m == manager).map(|&(_, n)| n)
}

#[cold]
#[inline(never)]
fn refused(name: &str, running: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{name}: refused, a call on this manager is in progress ({running}); a manager serves \
         one call at a time: a callback of that call (a property, __index__, __len__, a \
         finalizer) or another thread called it again (see the threading contract in \
         docs/usage.md, Threads and re-entrancy)"
    ))
}

#[cold]
#[inline(never)]
fn busy(py: Python<'_>, manager: usize) -> PyErr {
    let running = running(py, manager).unwrap_or("another call");
    PyRuntimeError::new_err(format!(
        "this manager is in a call ({running}); a manager serves one call at a time \
         (see the threading contract in docs/usage.md, Threads and re-entrancy)"
    ))
}

/// The manager's state, shared: RuntimeError (not a panic) while a call
/// has it borrowed.
#[inline]
pub(crate) fn borrow<'py>(slf: &Bound<'py, NativeManager>) -> PyResult<PyRef<'py, NativeManager>> {
    slf.try_borrow()
        .map_err(|_| busy(slf.py(), slf.as_ptr() as usize))
}

/// The manager's state, exclusive: RuntimeError (not a panic) while a call
/// has it borrowed.
#[inline]
pub(crate) fn borrow_mut<'py>(
    slf: &Bound<'py, NativeManager>,
) -> PyResult<PyRefMut<'py, NativeManager>> {
    slf.try_borrow_mut()
        .map_err(|_| busy(slf.py(), slf.as_ptr() as usize))
}

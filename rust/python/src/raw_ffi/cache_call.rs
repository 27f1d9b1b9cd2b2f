//! `cache_blocks` as a method of the facade's class (a method descriptor
//! of exactly that class), called with CPython's vectorcall convention
//! (METH_FASTCALL | METH_KEYWORDS).
//!
//! vLLM's scheduler calls `cache_blocks(request, n)` for every
//! running request after every step, and most such calls cache nothing
//! new. Those are judged from the request's hot line (its decode horizon)
//! and end here, without PyO3's argument matching and without reading the
//! request's hashes or shared-prefix boundary. Every other call goes to
//! `NativeManager.cache_blocks`, which this method replaces on the facade.

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;

use super::vectorcall::{call_with, held_request, plain_count, raw_call, MethodDef};
use crate::native_manager::NativeManager;

static CACHE_BLOCKS: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"cache_blocks".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: cache_blocks_fast,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"vLLM's KVCacheManager.cache_blocks(request, num_computed_tokens).".as_ptr(),
});

/// A method descriptor of `cls` (a `NativeManager` subclass: CPython
/// checks every `self` against it) calling `cache_blocks`.
pub fn cache_blocks_descriptor(cls: &Bound<'_, pyo3::types::PyType>) -> PyResult<PyObject> {
    super::vectorcall::method_descriptor(&CACHE_BLOCKS, cls)
}

unsafe extern "C" fn cache_blocks_fast(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls methods with the GIL held, under the
    // vectorcall contract (see `allocate_call`).
    unsafe {
        raw_call(|py| {
            if nargs == 2 && kwnames.is_null() {
                let _in_call = crate::call_guard::enter_addr(py, slf as usize, "cache_blocks")?;
                let judged = judge(py, slf, args)?;
                if let Judged::Noop = judged {
                    return Ok(py.None());
                }
                // SAFETY: `slf` is a live manager: CPython checks it against
                // the descriptor's class, a `NativeManager` subclass
                // (`_raw_methods`).
                let manager = Bound::from_borrowed_ptr(py, slf);
                // The scheduler's spelling: the method's body, directly.
                let (request, n) = (
                    Bound::from_borrowed_ptr(py, *args),
                    Bound::from_borrowed_ptr(py, *args.add(1)),
                );
                let manager = manager.downcast_unchecked();
                match judged {
                    // Its id was read and checked, its count read: on from there.
                    Judged::Held { slot, n } => {
                        NativeManager::cache_blocks_of_slot(manager, &request, slot, n)?
                    }
                    _ => NativeManager::cache_blocks_impl(manager, &request, &n)?,
                }
                return Ok(py.None());
            }
            // SAFETY: as above.
            let manager = Bound::from_borrowed_ptr(py, slf);
            // The native class's method (a subclass's attribute may be this).
            let method = py
                .get_type::<NativeManager>()
                .getattr(intern!(py, "cache_blocks"))?;
            call_with(&method, Some(&manager), args, nargs, kwnames)
        })
    }
}

/// What the scheduler's call `(request, n)` needs, judged from the
/// request's hot line.
enum Judged {
    /// A held request whose caching of `n` tokens changes nothing.
    Noop,
    /// A held request in `slot`, its id checked, that caches something.
    Held { slot: u32, n: usize },
    /// Anything else: the general path handles it, errors included.
    Other,
}

/// How to carry out the scheduler's call `(request, n)` (the reads here
/// have no side effects). An error: a read of the request raised, or its
/// id changed while held (nothing changed).
///
/// # Safety
/// As `cache_blocks_fast`'s arguments, with 2 positional values, with the
/// GIL held.
unsafe fn judge(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
) -> PyResult<Judged> {
    // SAFETY: the vectorcall contract: `args` holds 2 live values.
    unsafe {
        let Some(n) = plain_count(*args.add(1)) else {
            return Ok(Judged::Other);
        };
        // `slf` is a manager (see `cache_blocks_fast`).
        let obj = Borrowed::from_ptr(py, slf);
        let Ok(mut this) = obj.downcast_unchecked::<NativeManager>().try_borrow_mut() else {
            return Ok(Judged::Other);
        };
        // The core keeps the request's computed count (the shared-prefix
        // checkpoint): the general path reads it.
        if this.inner.wants_num_computed_tokens() {
            return Ok(Judged::Other);
        }
        let Some((handle, _)) = held_request(py, &mut this, *args)? else {
            return Ok(Judged::Other);
        };
        Ok(match this.inner.cache_blocks_is_noop_by_handle(handle, n) {
            Some((_, true)) => Judged::Noop,
            Some((slot, false)) => {
                // The call reads the request's hashes before it caches: the
                // tables and blocks it caches arrive meanwhile.
                this.inner
                    .for_each_cache_line(slot, n, super::vectorcall::prefetch);
                Judged::Held { slot, n }
            }
            None => Judged::Other,
        })
    }
}

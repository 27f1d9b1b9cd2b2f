//! A `BlockHasher` as a builtin bound to it, called with CPython's METH_O
//! convention (one argument, no tuple).
//!
//! vLLM's `Request` calls its block hasher whenever tokens are appended,
//! every step for every running request, and most calls find no new full
//! block (the body returns after two list lengths): the call itself, not
//! the hashing, is most of their cost, and METH_O is CPython's cheapest.

use pyo3::ffi;
use pyo3::prelude::*;

use super::vectorcall::{bind, raw_call, MethodDef};
use crate::hasher::BlockHasher;

static REQUEST_BLOCK_HASHER: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"request_block_hasher".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunction: request_block_hasher,
    },
    ml_flags: ffi::METH_O,
    ml_doc: c"vLLM's request_block_hasher(request), bound to this BlockHasher.".as_ptr(),
});

/// A new builtin calling `hasher` on one request.
pub fn bound_hasher(hasher: &Bound<'_, BlockHasher>) -> PyResult<PyObject> {
    bind(&REQUEST_BLOCK_HASHER, hasher.as_any())
}

unsafe extern "C" fn request_block_hasher(
    slf: *mut ffi::PyObject,
    request: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls builtins with the GIL held; METH_O passes the
    // bound object (a BlockHasher: `bound_hasher` binds only those) and one
    // live argument.
    unsafe {
        raw_call(|py| {
            let hasher = Borrowed::from_ptr(py, slf);
            let hasher = hasher.downcast_unchecked::<BlockHasher>().get();
            let request = Borrowed::from_ptr(py, request);
            Ok(hasher.hash_new_blocks(py, &request)?.into_any().unbind())
        })
    }
}

/// The `BlockHasher` a request's `_block_hasher` is (one of `bound_hasher`'s
/// builtins, or the hasher itself), as a borrowed pointer; None: any other
/// callable.
///
/// # Safety
/// `obj` is a live object; the GIL is held.
pub(crate) unsafe fn native_hasher(
    py: Python<'_>,
    obj: *mut ffi::PyObject,
) -> Option<*mut ffi::PyObject> {
    // SAFETY: as this function's; a builtin's `self` is live while it is.
    unsafe {
        let target = if ffi::PyCFunction_Check(obj) != 0 {
            // Only this module's builtin: other methods bound to a hasher
            // (`hasher.hash_blocks`) are builtins with the same `self`.
            let f = ffi::PyCFunction_GetFunction(obj)?;
            if f as *const () != request_block_hasher as *const () {
                return None;
            }
            ffi::PyCFunction_GetSelf(obj)
        } else {
            obj
        };
        let is_hasher =
            !target.is_null() && Borrowed::from_ptr(py, target).is_instance_of::<BlockHasher>();
        is_hasher.then_some(target)
    }
}

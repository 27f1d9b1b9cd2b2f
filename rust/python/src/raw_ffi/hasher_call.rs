//! A `BlockHasher` as a builtin bound to it, called with CPython's METH_O
//! convention (one argument, no tuple).
//!
//! vLLM's `Request` calls its block hasher whenever tokens are appended,
//! every step for every running request, and most calls find no new full
//! block (the body returns after two list lengths): the call itself, not
//! the hashing, is most of their cost, and METH_O is CPython's cheapest.

use pyo3::ffi;
use pyo3::prelude::*;

use super::{bind, raw_call, MethodDef};
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

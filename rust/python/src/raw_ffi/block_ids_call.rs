//! `KVCacheBlocks.get_block_ids` as a raw method descriptor. The scheduler
//! asks `get_block_ids(allow_none=True)` of every allocation result; the
//! spellings `()` and `(allow_none=<bool>)` are answered here without
//! PyO3's argument matching (under a Python scheduler that matching is
//! mostly instruction-cache misses). Every other spelling goes to the
//! PyO3 method this descriptor replaced, which keeps its errors and its
//! `group_ids` argument.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyList, PyString, PyTuple, PyType};

use super::vectorcall::{call_with, raw_call, MethodDef};
use crate::blocks::KVCacheBlocks;

static GET_BLOCK_IDS: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"get_block_ids".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: get_block_ids_fast,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"get_block_ids($self, allow_none=False, group_ids=None)\n--\n\n\
Block ids per KV cache group, as vLLM's KVCacheBlocks.get_block_ids: None \
when allow_none and no group holds a block."
        .as_ptr(),
});

/// The PyO3 method the descriptor replaced (the general spelling).
static PYO3_METHOD: GILOnceCell<PyObject> = GILOnceCell::new();
static ALLOW_NONE: GILOnceCell<Py<PyString>> = GILOnceCell::new();

/// Replaces `KVCacheBlocks.get_block_ids` with the raw descriptor (once,
/// at module initialisation).
pub fn install(ty: &Bound<'_, PyType>) -> PyResult<()> {
    let py = ty.py();
    let original = ty.getattr("get_block_ids")?.unbind();
    PYO3_METHOD
        .set(py, original)
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("installed twice"))?;
    ALLOW_NONE.get_or_init(py, || PyString::intern(py, "allow_none").unbind());
    ty.setattr(
        "get_block_ids",
        super::vectorcall::method_descriptor(&GET_BLOCK_IDS, ty)?,
    )
}

/// The answer for `allow_none` (shared with the PyO3 method's semantics).
fn block_ids(py: Python<'_>, blocks: &KVCacheBlocks, allow_none: bool) -> PyResult<PyObject> {
    let ids = blocks.ids();
    if allow_none && ids.iter().all(|g| g.is_empty()) {
        return Ok(py.None());
    }
    let lists = ids
        .iter()
        .map(|g| PyList::new(py, g.iter()))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyTuple::new(py, lists)?.into_any().unbind())
}

unsafe extern "C" fn get_block_ids_fast(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls methods with the GIL held; the vectorcall
    // contract: `args` holds `nargs` positional values then one per name in
    // `kwnames`; the descriptor checked that `slf` is a KVCacheBlocks.
    unsafe {
        raw_call(|py| {
            let this = Bound::from_borrowed_ptr(py, slf);
            let fast_flag = if nargs == 0 && kwnames.is_null() {
                Some(false)
            } else if nargs == 0
                && ffi::PyTuple_Size(kwnames) == 1
                && ALLOW_NONE
                    .get(py)
                    .is_some_and(|n| ffi::PyTuple_GetItem(kwnames, 0) == n.as_ptr())
            {
                let v = *args;
                (v == ffi::Py_True() || v == ffi::Py_False()).then(|| v == ffi::Py_True())
            } else {
                None
            };
            match fast_flag {
                Some(allow_none) => {
                    // The descriptor checked the type (no type lookup here).
                    let blocks = this.downcast_unchecked::<KVCacheBlocks>();
                    block_ids(py, blocks.get(), allow_none)
                }
                None => general(py, &this, args, nargs, kwnames),
            }
        })
    }
}

/// Any other spelling: the PyO3 method with `self` in front.
///
/// # Safety
/// As `get_block_ids_fast`'s arguments, with the GIL held.
#[cold]
#[inline(never)]
unsafe fn general(
    py: Python<'_>,
    this: &Bound<'_, PyAny>,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<PyObject> {
    let method = PYO3_METHOD
        .get(py)
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("not installed"))?;
    // SAFETY: as this function's.
    unsafe { call_with(method.bind(py), Some(this), args, nargs, kwnames) }
}

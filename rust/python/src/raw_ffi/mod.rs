//! The raw CPython (vectorcall) entry points, in one place behind the
//! default-on `raw-ffi` cargo feature. Without it the binding has no
//! `unsafe` code and the PyO3 methods they shadow serve the same calls
//! (same results, same errors; only slower to reach).
//!
//! - `allocate_call`: `allocate_slots` as a raw method descriptor of the
//!   facade's class, with a straight-line path for the scheduler's decode
//!   call;
//! - `block_ids_call`: `KVCacheBlocks.get_block_ids` as a raw method
//!   descriptor for its two common spellings;
//! - `cache_call`: `cache_blocks` as a raw method descriptor of the
//!   facade's class, with a hot-line path for the calls that cache nothing
//!   new;
//! - `hasher_call`: a `BlockHasher` as a one-argument builtin, with a
//!   path for the calls that find no new full block;
//! - `append_call`: vLLM's `Request.append_output_token_ids` as a raw
//!   method descriptor hashing with a `BlockHasher` in the same call;
//! - `fields`: where the hot calls read a held request's id and computed
//!   count (its `__dict__`, its slots, or the generic lookup);
//! - `vectorcall`: what they share (method definitions, the guarded call
//!   body, argument access, the hot calls' request lookup, prefetch).
//!
//! The module's init calls `register`; `raw_methods` asks
//! `manager_descriptors` for the facade's class. Nothing else names it.

pub(crate) mod allocate_call;
pub(crate) mod append_call;
pub(crate) mod block_ids_call;
pub(crate) mod cache_call;
pub(crate) mod fields;
pub(crate) mod hasher_call;
pub(crate) mod vectorcall;

use pyo3::prelude::*;
use pyo3::types::PyType;

/// Registers what the module's classes get at import:
/// `KVCacheBlocks.get_block_ids`'s raw entry point.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    block_ids_call::install(&m.py().get_type::<crate::blocks::KVCacheBlocks>())
}

/// The raw `allocate_slots` and `cache_blocks` of the facade's class `cls`
/// (a `NativeManager` subclass), as method descriptors.
pub(crate) fn manager_descriptors(cls: &Bound<'_, PyType>) -> PyResult<(PyObject, PyObject)> {
    Ok((
        allocate_call::allocate_slots_descriptor(cls)?,
        cache_call::cache_blocks_descriptor(cls)?,
    ))
}

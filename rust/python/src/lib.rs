//! PyO3 binding of hybridcache-core: argument conversion, request attribute
//! reads and error mapping only. Every decision lives in the core crate.
//!
//! `NativeManager` is subclassed by the Python facade
//! (`hybridcache.KVCacheManager`); the hot methods (`allocate_slots`,
//! `free`, `cache_blocks`) are native so a scheduler step costs one call.
//!
//! All `unsafe` code is in `raw_ffi` (the default-on `raw-ffi` feature);
//! without it the crate forbids `unsafe`.
#![cfg_attr(not(feature = "raw-ffi"), deny(unsafe_code))]

mod allocate_params;
mod batch;
mod blocks;
mod convert;
mod id_cache;
#[cfg(feature = "raw-ffi")]
mod raw_ffi;

mod call_guard;
mod calls;
mod hash_keys;
mod hash_size;
mod hasher;
mod lookup;
mod native_manager;
mod partial_hits;
mod pool_reads;
mod rebuild;
mod release_api;
mod step_waits;

use blocks::{BlockView, KVCacheBlocks};
pub(crate) use calls::AllocateSlotsArgs;
use native_manager::NativeManager;

use convert::count_obj;
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// An optional count: 0 when left out (or None, Python's usual "default");
/// otherwise an int >= 0, the error naming the argument.
pub(crate) fn opt_count(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    v.map_or(Ok(0), |v| count_obj(name, v))
}

/// `AllocateArgs::num_tokens` before `request.num_tokens` is read (see
/// `NativeManager::allocate_one`): as an upper bound it keeps the no-op
/// decode test exact.
pub(crate) const NUM_TOKENS_UNREAD: usize = usize::MAX;

pub(crate) fn request_id<'py>(request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    let rid = convert::req_attr(request, intern!(request.py(), "request_id"))?;
    if let Ok(s) = rid.downcast::<PyString>() {
        return Ok(s.clone());
    }
    Err(PyTypeError::new_err(format!(
        "request.request_id must be str, got {}",
        convert::type_name(&rid)
    )))
}

/// An optional flag: False when left out (or None); otherwise a bool.
pub(crate) fn opt_flag(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    match v {
        None => Ok(false),
        Some(v) if v.is_none() => Ok(false),
        Some(v) => v.extract::<bool>().map_err(|e| {
            convert::or_caller(v.py(), e, || {
                PyTypeError::new_err(format!(
                    "{name} must be a bool, got {}",
                    convert::type_name(v)
                ))
            })
        }),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeManager>()?;
    m.add_class::<KVCacheBlocks>()?;
    #[cfg(feature = "raw-ffi")]
    raw_ffi::block_ids_call::install(&m.py().get_type::<KVCacheBlocks>())?;
    m.add_class::<BlockView>()?;
    m.add_function(wrap_pyfunction!(blocks::block_view, m)?)?;
    hasher::register(m)?;
    m.add_function(wrap_pyfunction!(hash_size::_register_request_class, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Whether the hot calls have their raw entry points (a build without
    // them gives the same answers, slower): the benches print it.
    m.add("RAW_FFI", cfg!(feature = "raw-ffi"))?;
    Ok(())
}

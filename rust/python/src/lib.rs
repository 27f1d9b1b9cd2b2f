//! PyO3 binding of hybridcache-core: argument conversion, request attribute
//! reads and error mapping only. Every decision lives in the core crate.
//!
//! `NativeManager` (`native_manager`: its state) is subclassed by the
//! Python facade (`hybridcache.KVCacheManager`); its Python methods live
//! in one module per job, each a `#[pymethods]` block over the struct. The
//! hot methods (`allocate_slots`, `free`, `cache_blocks`) are native so a
//! scheduler step costs one call.
//!
//! All `unsafe` code is in `raw_ffi` (the default-on `raw-ffi` feature),
//! which this module's init registers; without it the crate forbids
//! `unsafe`.
#![cfg_attr(not(feature = "raw-ffi"), deny(unsafe_code))]

mod allocate_limits;
mod allocate_params;
mod batch;
mod blocks;
mod call_guard;
mod calls;
mod convert;
mod deferred_frees;
mod hash_keys;
mod hash_size;
mod hasher;
mod hasher_methods;
mod id_cache;
mod identity;
mod lookup;
mod mamba_calls;
mod manager_setup;
mod native_manager;
mod partial_hits;
mod pool_reads;
mod py_args;
#[cfg(feature = "raw-ffi")]
mod raw_ffi;
mod raw_methods;
mod read_gate;
mod read_gate_methods;
mod rebuild;
mod request_calls;
mod step_waits;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<native_manager::NativeManager>()?;
    m.add_class::<blocks::KVCacheBlocks>()?;
    m.add_class::<blocks::BlockView>()?;
    m.add_function(wrap_pyfunction!(blocks::block_view, m)?)?;
    hasher_methods::register(m)?;
    m.add_function(wrap_pyfunction!(hash_size::_register_request_class, m)?)?;
    #[cfg(feature = "raw-ffi")]
    raw_ffi::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Whether the hot calls have their raw entry points (a build without
    // them gives the same answers, slower): the benches print it.
    m.add("RAW_FFI", cfg!(feature = "raw-ffi"))?;
    Ok(())
}

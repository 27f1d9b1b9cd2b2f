//! A manager's read gate (`read_gate::ReadGate`, the release's choice made
//! at construction) and the side-effect-free probe of the prefix cache
//! behind vLLM's `get_num_cached_tokens`. A `#[pymethods]` block of
//! its own.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;

use crate::call_guard::{borrow, borrow_mut, enter};
use crate::convert::{guard, hash_update, req_attr, request_num_tokens};
use crate::native_manager::NativeManager;
use crate::read_gate::ReadGate;

#[pymethods]
impl NativeManager {
    /// Chooses the request attribute lookups read (`ReadGate::NAMES`):
    /// "skip_reading_prefix_cache" (the default) or "prefix_cache_hit_limit".
    fn _set_read_gate(slf: &Bound<'_, Self>, attribute: &str) -> PyResult<()> {
        let _in_call = enter(slf, "_set_read_gate")?;
        let found = ReadGate::NAMES.iter().find(|(name, _)| *name == attribute);
        let Some((_, gate)) = found else {
            let names: Vec<_> = ReadGate::NAMES.iter().map(|(n, _)| *n).collect();
            return Err(PyValueError::new_err(format!(
                "unknown read gate {attribute:?}; choose from {}",
                names.join(", ")
            )));
        };
        borrow_mut(slf)?.read_gate = *gate;
        Ok(())
    }

    /// The request attribute lookups read.
    #[getter]
    fn _read_gate(slf: &Bound<'_, Self>) -> PyResult<&'static str> {
        let gate = borrow(slf)?.read_gate;
        Ok(ReadGate::NAMES
            .iter()
            .find(|(_, g)| *g == gate)
            .map_or("", |(n, _)| *n))
    }

    /// vLLM's `get_num_cached_tokens(request)`: how many of the
    /// request's tokens the prefix cache holds, bounded by
    /// `request.num_tokens - 1` (not by its hit limit); 0 where the lookup
    /// is off for it. Takes no reference, touches no block, emits no event,
    /// records no stat and does not register the request.
    fn _num_cached_tokens(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<usize> {
        // The request's reads run its code: a call back into this manager
        // is refused (reads of it are served: this call only reads).
        let _in_call = enter(slf, "get_num_cached_tokens")?;
        let this = borrow(slf)?;
        if this.read_gate.read(&this.inner, request)?.is_none() {
            return Ok(0);
        }
        let num_tokens = request_num_tokens(request)?;
        let hashes = req_attr(request, intern!(request.py(), "block_hashes"))?;
        let hashes = hash_update(&hashes, 0)?.unwrap_or_default().hashes;
        guard(|| Ok(this.inner.probe_cache_hit(&hashes, num_tokens)))
    }
}

//! `NativeManager`'s calls for vLLM's partial hash hits (a Mamba
//! align block spanning hash blocks): the copy-on-write copies the
//! scheduler drains, a finishing request's producer tails, the enabling
//! rule under decode context parallelism, and the shared-prefix checkpoint. A `#[pymethods]` block
//! of its own (PyO3's `multiple-pymethods`).

use pyo3::prelude::*;

use crate::call_guard::{borrow, borrow_mut, enter};
use crate::native_manager::NativeManager;

#[pymethods]
impl NativeManager {
    /// Copy-on-write copies of partial hash hits since the last take:
    /// (source, copy) block ids; both hold an extra reference.
    fn _take_kv_cache_block_copies(slf: &Bound<'_, Self>) -> PyResult<Vec<(u32, u32)>> {
        let _in_call = enter(slf, "take_kv_cache_block_copies")?;
        Ok(borrow_mut(slf)?.inner.take_kv_cache_block_copies())
    }

    /// A finishing request's complete Mamba producer tails: (group, block
    /// id, boundary tokens); its tails are consumed.
    fn _finalize_partial_tail_offloads(
        slf: &Bound<'_, Self>,
        request_id: &str,
        num_computed_tokens: usize,
        num_in_flight_tokens: usize,
    ) -> PyResult<Vec<(u32, u32, usize)>> {
        let _in_call = enter(slf, "finalize_partial_tail_offloads")?;
        Ok(borrow_mut(slf)?.inner.finalize_partial_tail_offloads(
            request_id,
            num_computed_tokens,
            num_in_flight_tokens,
        ))
    }

    /// vLLM's partial-hit rule under decode context parallelism
    /// (the facade scales the groups and builds the core with dcp 1).
    fn _set_partial_hits_dcp(slf: &Bound<'_, Self>, dcp_world_size: u32) -> PyResult<()> {
        let _in_call = enter(slf, "_set_partial_hits_dcp")?;
        borrow_mut(slf)?
            .inner
            .set_partial_hits_dcp(dcp_world_size)
            .map_err(crate::convert::to_py_err)
    }

    /// vLLM's `mamba_shared_prefix_checkpoint`, narrowed by the
    /// facade: Mamba align groups also key states at shared-prefix junctions.
    fn _set_shared_prefix_checkpoint(slf: &Bound<'_, Self>, on: bool) -> PyResult<()> {
        let _in_call = enter(slf, "_set_shared_prefix_checkpoint")?;
        borrow_mut(slf)?
            .inner
            .set_shared_prefix_checkpoint(on)
            .map_err(crate::convert::to_py_err)
    }

    /// Whether hits land on hash blocks (vLLM's partial hash hits).
    #[getter]
    fn _partial_hash_hits(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Ok(borrow(slf)?.inner.partial_hash_hits())
    }
}

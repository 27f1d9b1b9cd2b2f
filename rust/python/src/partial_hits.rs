//! `NativeManager`'s calls for vLLM 0.33.0's partial hash hits (a Mamba
//! align block spanning hash blocks): the copy-on-write copies the
//! scheduler drains, a finishing request's producer tails, the enabling
//! rule under decode context parallelism, and the shared-prefix checkpoint. A `#[pymethods]` block
//! of its own (PyO3's `multiple-pymethods`).

use pyo3::prelude::*;

use crate::native_manager::NativeManager;

#[pymethods]
impl NativeManager {
    /// Copy-on-write copies of partial hash hits since the last take:
    /// (source, copy) block ids; both hold an extra reference.
    fn _take_kv_cache_block_copies(&mut self) -> Vec<(u32, u32)> {
        self.inner.take_kv_cache_block_copies()
    }

    /// A finishing request's complete Mamba producer tails: (group, block
    /// id, boundary tokens); its tails are consumed.
    fn _finalize_partial_tail_offloads(
        &mut self,
        request_id: &str,
        num_computed_tokens: usize,
        num_in_flight_tokens: usize,
    ) -> Vec<(u32, u32, usize)> {
        self.inner.finalize_partial_tail_offloads(
            request_id,
            num_computed_tokens,
            num_in_flight_tokens,
        )
    }

    /// vLLM 0.33.0's partial-hit rule under decode context parallelism
    /// (the facade scales the groups and builds the core with dcp 1).
    fn _set_partial_hits_dcp(&mut self, dcp_world_size: u32) -> PyResult<()> {
        self.inner
            .set_partial_hits_dcp(dcp_world_size)
            .map_err(crate::convert::to_py_err)
    }

    /// vLLM 0.33.0's `mamba_shared_prefix_checkpoint`, narrowed by the
    /// facade: Mamba align groups also key states at shared-prefix junctions.
    fn _set_shared_prefix_checkpoint(&mut self, on: bool) -> PyResult<()> {
        self.inner
            .set_shared_prefix_checkpoint(on)
            .map_err(crate::convert::to_py_err)
    }

    /// Whether hits land on hash blocks (vLLM 0.33.0's partial hash hits).
    #[getter]
    fn _partial_hash_hits(&self) -> bool {
        self.inner.partial_hash_hits()
    }
}

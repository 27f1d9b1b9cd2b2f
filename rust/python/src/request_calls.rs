//! vLLM's per-request calls past allocation and lookup: a request's
//! blocks, `free`, `cache_blocks`, window frees, evictions, the prefix
//! cache's reset and the coordinator's block count.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::convert::{self, block_ids, count_obj, guard, ids_tuple};
use crate::native_manager::NativeManager;
use crate::py_args::request_id;

#[pymethods]
impl NativeManager {
    /// vLLM's `get_blocks(request_id)`: the request's blocks per group (the
    /// shared empty `KVCacheBlocks` for a request without blocks).
    fn get_blocks(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<PyObject> {
        let ids = slf.borrow().inner.get_block_ids(request_id);
        Self::make_blocks(slf, &ids)
    }

    /// vLLM's `free(request)`: frees the request's blocks, tail first.
    fn free(&mut self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let rid = request_id(request)?;
        let rid = rid.to_str()?;
        let slot = self.forget_request_object(rid);
        #[cfg(feature = "raw-ffi")]
        if let Some(s) = slot {
            self.inner
                .for_each_free_line_at(s, crate::raw_ffi::vectorcall::prefetch);
        }
        #[cfg(not(feature = "raw-ffi"))]
        let _ = slot;
        guard(|| {
            self.inner.free(rid);
            Ok(())
        })
    }

    /// vLLM's `cache_blocks(request, num_computed_tokens)`.
    pub(crate) fn cache_blocks(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let n = count_obj("num_computed_tokens", num_computed_tokens)?;
        let rid = request_id(request)?;
        {
            let mut this = slf.borrow_mut();
            if !this.inner.enable_caching() {
                return Ok(());
            }
            // A held request by its id object's address (0.33.0 caches
            // every running request every step): no str hashing.
            if let Some(slot) = this.lookup_id(&rid)? {
                crate::calls::cache_held(&mut this, request, slot, n)?;
            } else {
                let rid = rid.to_str()?;
                let update = this.pending_hashes(request, rid)?;
                crate::calls::note_shared_prefix_boundary(&mut this.inner, request, rid)?;
                guard(|| this.inner.cache_blocks(rid, n, update))?;
            }
        }
        Self::flush_events(slf, Some(request))
    }

    /// `num_prompt_tokens` (vLLM 0.33.0's, None: not passed) frees R-SWA gaps.
    #[pyo3(signature = (request_id, total_computed_tokens, num_prompt_tokens=None))]
    fn remove_skipped_blocks(
        &mut self,
        request_id: &str,
        total_computed_tokens: &Bound<'_, PyAny>,
        num_prompt_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let total = count_obj("total_computed_tokens", total_computed_tokens)?;
        let prompt = num_prompt_tokens
            .filter(|p| !p.is_none())
            .map(|p| count_obj("num_prompt_tokens", p))
            .transpose()?;
        guard(|| {
            self.inner
                .remove_skipped_blocks_of_prompt(request_id, total, prompt);
            Ok(())
        })
    }

    /// Drops the given blocks (any iterable of ids) from the prefix cache.
    fn evict_blocks(slf: &Bound<'_, Self>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        {
            let mut this = slf.borrow_mut();
            let mut ids = Vec::new();
            for b in block_ids.try_iter()? {
                let b = b?;
                let v = b.extract::<i64>().map_err(|_| {
                    PyTypeError::new_err(format!(
                        "evict_blocks: block_ids must be ints, got {}",
                        convert::type_name(&b)
                    ))
                })?;
                ids.push(this.block_id(v)?);
            }
            guard(|| this.inner.evict_blocks(&ids))?;
        }
        Self::flush_events(slf, None)
    }

    fn reset_prefix_cache(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let ok = guard(|| Ok(slf.borrow_mut().inner.reset_prefix_cache()))?;
        Self::flush_events(slf, None)?;
        Ok(ok)
    }

    fn get_num_common_prefix_blocks(&mut self, running_request_id: &str) -> PyResult<Vec<usize>> {
        guard(|| Ok(self.inner.get_num_common_prefix_blocks(running_request_id)))
    }

    fn get_block_ids<'py>(
        &self,
        py: Python<'py>,
        request_id: &str,
    ) -> PyResult<Bound<'py, PyTuple>> {
        ids_tuple(py, &self.inner.get_block_ids(request_id))
    }

    /// vLLM's `coordinator.get_num_blocks_to_allocate` (reads only).
    #[pyo3(signature = (request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
                        total_computed_tokens, num_tokens_main_model, apply_admission_cap=false,
                        prefill_end=None))]
    #[allow(clippy::too_many_arguments)]
    fn get_num_blocks_to_allocate(
        &self,
        request_id: &str,
        num_tokens: &Bound<'_, PyAny>,
        new_computed_blocks: &Bound<'_, PyAny>,
        num_encoder_tokens: &Bound<'_, PyAny>,
        total_computed_tokens: &Bound<'_, PyAny>,
        num_tokens_main_model: &Bound<'_, PyAny>,
        apply_admission_cap: bool,
        prefill_end: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        let nc = block_ids(
            new_computed_blocks,
            self.inner.pool().num_blocks(),
            "new_computed_blocks",
        )?;
        let (n, e, t, mm) = (
            count_obj("num_tokens", num_tokens)?,
            count_obj("num_encoder_tokens", num_encoder_tokens)?,
            count_obj("total_computed_tokens", total_computed_tokens)?,
            count_obj("num_tokens_main_model", num_tokens_main_model)?,
        );
        let pe = prefill_end.map_or(Ok(0), |v| count_obj("prefill_end", v))?;
        guard(|| {
            self.inner.get_num_blocks_to_allocate(
                request_id,
                n,
                &nc,
                e,
                t,
                mm,
                apply_admission_cap,
                pe,
            )
        })
    }
}

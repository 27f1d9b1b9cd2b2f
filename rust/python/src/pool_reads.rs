//! `NativeManager`'s reads of the pool for the facade's views (vLLM's
//! `block_pool.blocks`, `free_block_queue`, `get_cached_block`) and the
//! tests: reference counts, hashes, the free queue, invariants. A second
//! `#[pymethods]` block (PyO3's `multiple-pymethods`), so the manager's
//! calls and these reads live in modules of one job each.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::convert::{block_id_arg, guard, int_list, u32_arg};
use crate::native_manager::NativeManager;

#[pymethods]
impl NativeManager {
    fn ref_cnt(&self, block_id: &Bound<'_, PyAny>) -> PyResult<i32> {
        let b = self.block_id(block_id_arg(block_id)?)?;
        Ok(self.inner.pool().ref_cnt(b))
    }

    /// (hash bytes, group id) of a cached block, else None.
    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        let b = self.block_id(block_id_arg(block_id)?)?;
        Ok(self
            .inner
            .pool()
            .block_hash(b)
            .map(|(h, g)| (PyBytes::new(py, h), g)))
    }

    /// vLLM 0.33.0's `block_hash_num_tokens` of each block: the prefix
    /// tokens its primary hash covers, None without a hash.
    fn block_hash_num_tokens(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<Vec<Option<u32>>> {
        self.hash_num_tokens(block_ids)
    }

    /// vLLM 0.33.0's `estimate_cached_tokens(request)`: the 0.33.0
    /// facade's method, in one native call (the request found by its id
    /// object, no id lists built).
    fn _estimate_cached_tokens(&mut self, request: &Bound<'_, PyAny>) -> PyResult<usize> {
        let rid = crate::py_args::request_id(request)?;
        let slot = self.lookup_id(&rid)?;
        Ok(self.inner.estimate_cached_tokens(slot))
    }

    /// Which of the given blocks carry no cached hash.
    fn unhashed(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        int_list("block_ids", block_ids, false)?
            .into_iter()
            .map(|b| Ok(self.inner.pool().block_hash(self.block_id(b)?).is_none()))
            .collect()
    }

    /// vLLM's `block_pool.get_cached_block`, as ids: the earliest cached
    /// block of `block_hash` in each group, or None on any miss (reads only).
    fn cached_block_ids(
        &self,
        block_hash: &[u8],
        group_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Vec<u32>>> {
        let group_ids = int_list("kv_cache_group_ids", group_ids, true)?
            .into_iter()
            .map(|g| u32_arg("kv_cache_group_ids", g))
            .collect::<PyResult<Vec<u32>>>()?;
        let mut out = Vec::with_capacity(group_ids.len());
        Ok(self
            .inner
            .pool()
            .get_cached_block(block_hash, &group_ids, &mut out)
            .then_some(out))
    }

    /// Number of (block hash, group) keys in the prefix cache.
    #[getter]
    fn num_cached_keys(&self) -> usize {
        self.inner.pool().num_cached_keys()
    }

    /// vLLM 0.33.0's `_checkpoints` of Mamba align group `group`:
    /// (request id, position, table index) per request with a checkpoint.
    fn _align_checkpoints(&self, group: usize) -> Vec<(String, usize, usize)> {
        self.inner
            .align_checkpoints_of(group)
            .into_iter()
            .map(|(r, p, i)| (r.to_owned(), p, i))
            .collect()
    }

    /// Ids of the requests the manager holds state for.
    fn request_ids(&self) -> Vec<String> {
        self.inner.request_ids().map(str::to_owned).collect()
    }

    /// vLLM's `single_type_managers[group].num_cached_block.get(request_id)`.
    fn _num_cached_blocks(&self, request_id: &str, group: usize) -> Option<usize> {
        self.inner.num_cached_blocks_of(request_id, group)
    }

    fn has_request(&self, request_id: &str) -> bool {
        self.inner.has_request(request_id)
    }

    /// (front, back) of the free queue, or None when it is empty.
    fn free_queue_ends(&self) -> Option<(u32, u32)> {
        self.inner.pool().free_queue_ends()
    }

    /// A free block's (previous, next) free-queue neighbours (None at the
    /// queue's ends), or None if the block is not free.
    fn free_queue_neighbors(
        &self,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Option<u32>, Option<u32>)>> {
        let b = self.block_id(block_id_arg(block_id)?)?;
        Ok(self.inner.pool().free_queue_neighbors(b))
    }

    fn free_queue(&self) -> Vec<u32> {
        self.inner.pool().free_queue().collect()
    }

    fn check_invariants(&self) -> PyResult<()> {
        guard(|| self.inner.check_invariants())
    }
}

impl NativeManager {
    /// `block_hash_num_tokens` for a list of block ids.
    pub(crate) fn hash_num_tokens(
        &self,
        block_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<u32>>> {
        let pool = self.inner.pool();
        crate::convert::int_list("block_ids", block_ids, false)?
            .into_iter()
            .map(|b| Ok(pool.block_hash_num_tokens(self.block_id(b)?)))
            .collect()
    }
}

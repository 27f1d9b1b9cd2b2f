//! `NativeManager`'s reads of the pool for the facade's views (vLLM's
//! `block_pool.blocks`, `free_block_queue`, `get_cached_block`) and the
//! tests: reference counts, hashes, the free queue, invariants. A second
//! `#[pymethods]` block (PyO3's `multiple-pymethods`), so the manager's
//! calls and these reads live in modules of one job each.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::call_guard::{borrow, borrow_mut};
use crate::convert::{block_id_arg, guard, int_list, u32_arg};
use crate::native_manager::NativeManager;

#[pymethods]
impl NativeManager {
    fn ref_cnt(slf: &Bound<'_, Self>, block_id: &Bound<'_, PyAny>) -> PyResult<i32> {
        let b = block_id_arg(block_id)?;
        let this = borrow(slf)?;
        Ok(this.inner.pool().ref_cnt(this.block_id(b)?))
    }

    /// (hash bytes, group id) of a cached block, else None.
    fn block_hash<'py>(
        slf: &Bound<'py, Self>,
        block_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        let b = block_id_arg(block_id)?;
        let this = borrow(slf)?;
        let b = this.block_id(b)?;
        Ok(this
            .inner
            .pool()
            .block_hash(b)
            .map(|(h, g)| (PyBytes::new(slf.py(), h), g)))
    }

    /// vLLM's `block_hash_num_tokens` of each block: the prefix
    /// tokens its primary hash covers, None without a hash.
    fn block_hash_num_tokens(
        slf: &Bound<'_, Self>,
        block_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<u32>>> {
        let ids = int_list("block_ids", block_ids, false)?;
        borrow(slf)?.hash_num_tokens(&ids)
    }

    /// vLLM's `estimate_cached_tokens(request)`: the
    /// partial-block-hits facade's method, in one native call (the request
    /// found by its id object, no id lists built).
    fn _estimate_cached_tokens(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let rid = crate::py_args::request_id(request)?;
        let mut this = borrow_mut(slf)?;
        let slot = this.lookup_id(&rid)?;
        Ok(this.inner.estimate_cached_tokens(slot))
    }

    /// Which of the given blocks carry no cached hash.
    fn unhashed(slf: &Bound<'_, Self>, block_ids: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let ids = int_list("block_ids", block_ids, false)?;
        let this = borrow(slf)?;
        ids.into_iter()
            .map(|b| Ok(this.inner.pool().block_hash(this.block_id(b)?).is_none()))
            .collect()
    }

    /// vLLM's `block_pool.get_cached_block`, as ids: the earliest cached
    /// block of `block_hash` in each group, or None on any miss (reads only).
    fn cached_block_ids(
        slf: &Bound<'_, Self>,
        block_hash: &[u8],
        group_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Vec<u32>>> {
        let group_ids = int_list("kv_cache_group_ids", group_ids, true)?
            .into_iter()
            .map(|g| u32_arg("kv_cache_group_ids", g))
            .collect::<PyResult<Vec<u32>>>()?;
        let mut out = Vec::with_capacity(group_ids.len());
        Ok(borrow(slf)?
            .inner
            .pool()
            .get_cached_block(block_hash, &group_ids, &mut out)
            .then_some(out))
    }

    /// Number of (block hash, group) keys in the prefix cache.
    #[getter]
    fn num_cached_keys(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf)?.inner.pool().num_cached_keys())
    }

    /// vLLM's `_checkpoints` of Mamba align group `group`:
    /// (request id, position, table index) per request with a checkpoint.
    fn _align_checkpoints(
        slf: &Bound<'_, Self>,
        group: usize,
    ) -> PyResult<Vec<(String, usize, usize)>> {
        Ok(borrow(slf)?
            .inner
            .align_checkpoints_of(group)
            .into_iter()
            .map(|(r, p, i)| (r.to_owned(), p, i))
            .collect())
    }

    /// Ids of the requests the manager holds state for.
    fn request_ids(slf: &Bound<'_, Self>) -> PyResult<Vec<String>> {
        Ok(borrow(slf)?
            .inner
            .request_ids()
            .map(str::to_owned)
            .collect())
    }

    /// vLLM's `single_type_managers[group].num_cached_block.get(request_id)`.
    fn _num_cached_blocks(
        slf: &Bound<'_, Self>,
        request_id: &str,
        group: usize,
    ) -> PyResult<Option<usize>> {
        Ok(borrow(slf)?.inner.num_cached_blocks_of(request_id, group))
    }

    fn has_request(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<bool> {
        Ok(borrow(slf)?.inner.has_request(request_id))
    }

    /// (front, back) of the free queue, or None when it is empty.
    fn free_queue_ends(slf: &Bound<'_, Self>) -> PyResult<Option<(u32, u32)>> {
        Ok(borrow(slf)?.inner.pool().free_queue_ends())
    }

    /// A free block's (previous, next) free-queue neighbours (None at the
    /// queue's ends), or None if the block is not free.
    fn free_queue_neighbors(
        slf: &Bound<'_, Self>,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Option<u32>, Option<u32>)>> {
        let b = block_id_arg(block_id)?;
        let this = borrow(slf)?;
        Ok(this.inner.pool().free_queue_neighbors(this.block_id(b)?))
    }

    fn free_queue(slf: &Bound<'_, Self>) -> PyResult<Vec<u32>> {
        Ok(borrow(slf)?.inner.pool().free_queue().collect())
    }

    fn check_invariants(slf: &Bound<'_, Self>) -> PyResult<()> {
        let this = borrow(slf)?;
        guard(|| this.inner.check_invariants())
    }
}

impl NativeManager {
    /// `block_hash_num_tokens` for a list of block ids.
    pub(crate) fn hash_num_tokens(&self, block_ids: &[i64]) -> PyResult<Vec<Option<u32>>> {
        let pool = self.inner.pool();
        block_ids
            .iter()
            .copied()
            .map(|b| Ok(pool.block_hash_num_tokens(self.block_id(b)?)))
            .collect()
    }
}

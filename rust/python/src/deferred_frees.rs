//! Deferred frees: `pop_blocks_for_free` hands a request's blocks out
//! still referenced, and `block_pool.free_blocks` frees them later, in the
//! caller's eviction order; and `record_blocks_for_zeroing`. What each
//! means is the core's; this converts.

use pyo3::intern;
use pyo3::prelude::*;

use crate::convert::{count_obj, guard, to_py_err};
use crate::native_manager::NativeManager;

impl NativeManager {
    /// `pop_blocks_for_free`: the request's block ids, still referenced.
    pub(crate) fn pop_handed_out(&mut self, request_id: &str) -> Vec<u32> {
        self.inner.pop_blocks_for_free(request_id)
    }

    /// `block_pool.free_blocks(blocks)` for blocks `pop_blocks_for_free`
    /// handed out: block objects (with `block_id`) or ids, in eviction order.
    pub(crate) fn free_handed_out(
        &mut self,
        blocks: &Bound<'_, PyAny>,
        evict_first: bool,
    ) -> PyResult<()> {
        let py = blocks.py();
        let mut ids = Vec::new();
        for b in blocks.try_iter()? {
            let b = b?;
            let id = match b.getattr(intern!(py, "block_id")) {
                Ok(id) => id,
                Err(_) => b,
            };
            ids.push(self.block_id(count_obj("block_id", &id)? as i64)?);
        }
        guard(|| self.inner.free_handed_out_evicting(&ids, evict_first))
    }
}

#[pymethods]
impl NativeManager {
    /// 0.24+'s `pop_blocks_for_free(request)`, as block ids: the request is
    /// forgotten, its blocks (table order, leading nulls left out) stay
    /// referenced until `_free_handed_out`.
    fn _pop_blocks_for_free(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<Vec<u32>> {
        let _in_call = crate::call_guard::enter(slf, "pop_blocks_for_free")?;
        let (ids, _held) = {
            let mut this = crate::call_guard::borrow_mut(slf)?;
            let (_, held) = this.forget_request_object(request_id);
            (this.pop_handed_out(request_id), held)
        };
        Ok(ids) // `_held` dropped here, the manager settled (a finalizer may run)
    }

    /// vLLM's `record_blocks_for_zeroing(request_id, start_token)`: the
    /// request's blocks from `start_token` on, recorded for zeroing again
    /// in the groups that record new block ids.
    fn _record_blocks_for_zeroing(
        slf: &Bound<'_, Self>,
        request_id: &str,
        start_token: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _in_call = crate::call_guard::enter(slf, "record_blocks_for_zeroing")?;
        let start = count_obj("start_token", start_token)?;
        crate::call_guard::borrow_mut(slf)?
            .inner
            .record_blocks_for_zeroing(request_id, start)
            .map_err(to_py_err)
    }

    /// 0.28+'s `block_pool.free_blocks(blocks)` for blocks
    /// `_pop_blocks_for_free` handed out (objects with `block_id`, or ids),
    /// in eviction order; ValueError (nothing freed) for any other block.
    /// `evict_first`: cached blocks join the front of the free queue too.
    #[pyo3(signature = (blocks, evict_first=false))]
    fn _free_handed_out(
        slf: &Bound<'_, Self>,
        blocks: &Bound<'_, PyAny>,
        evict_first: bool,
    ) -> PyResult<()> {
        let _in_call = crate::call_guard::enter(slf, "block_pool.free_blocks")?;
        crate::call_guard::borrow_mut(slf)?.free_handed_out(blocks, evict_first)
    }
}

//! Deferred frees: `pop_blocks_for_free` forgets a request but
//! leaves its blocks referenced (so do the copy-on-write endpoints of
//! `take_kv_cache_block_copies`); the scheduler hands them back a step later
//! through `block_pool.free_blocks`. The manager counts the references it
//! handed out, so a later free can only return what was handed out (a
//! block freed twice would corrupt the pool) and the invariant check still
//! accounts for every reference.

use super::KvCacheManager;
use crate::error::{invalid, CoreResult};
use crate::BlockId;
use std::collections::HashMap;

/// References handed out by `pop_blocks_for_free` and not yet freed.
#[derive(Debug, Clone, Default)]
pub(crate) struct HandedOut {
    held: HashMap<BlockId, u32>,
}

impl HandedOut {
    pub fn get(&self, b: BlockId) -> u32 {
        self.held.get(&b).copied().unwrap_or(0)
    }
}

impl KvCacheManager {
    /// Forgets the request and returns its blocks (every group's, in table
    /// order, leading null blocks left out) still referenced; they go back
    /// to the pool through `free_handed_out`. An unknown id returns nothing.
    pub fn pop_blocks_for_free(&mut self, request_id: &str) -> Vec<BlockId> {
        let Some(slot) = self.slot(request_id) else {
            self.ghost_entries.retain(|g| g != request_id);
            return Vec::new();
        };
        let blocks = self.coord.pop_blocks(slot);
        self.planner.forget(slot);
        self.drop_slot(slot);
        for &b in &blocks {
            *self.handed_out.held.entry(b).or_insert(0) += 1;
        }
        blocks
    }

    /// vLLM's `BlockPool.free_blocks(blocks)` for blocks handed out
    /// by `pop_blocks_for_free`, in eviction order. Refused as a whole
    /// (nothing changes) when a block was not handed out that many times.
    pub fn free_handed_out(&mut self, blocks: &[BlockId]) -> CoreResult<()> {
        self.free_handed_out_evicting(blocks, false)
    }

    /// `free_handed_out`; with `evict_first` cached blocks reaching zero
    /// join the front of the free queue too (`BlockPool::free_blocks_evicting`).
    pub fn free_handed_out_evicting(
        &mut self,
        blocks: &[BlockId],
        evict_first: bool,
    ) -> CoreResult<()> {
        let mut wanted: HashMap<BlockId, u32> = HashMap::new();
        for &b in blocks {
            self.coord.pool.check_block_id(b)?;
            let n = wanted.entry(b).or_insert(0);
            *n += 1;
            if *n > self.handed_out.get(b) {
                return invalid(format!(
                    "block {b} is not held by a popped request (pop_blocks_for_free) \
                     {n} time(s); only blocks it returned can be freed"
                ));
            }
        }
        for (b, n) in wanted {
            let left = self.handed_out.get(b) - n;
            if left == 0 {
                self.handed_out.held.remove(&b);
            } else {
                self.handed_out.held.insert(b, left);
            }
        }
        self.coord
            .pool
            .free_blocks_evicting(blocks.iter().copied(), evict_first);
        Ok(())
    }

    /// One more reference of `b` the caller frees (`free_handed_out`).
    pub(super) fn hand_out(&mut self, b: BlockId) {
        *self.handed_out.held.entry(b).or_insert(0) += 1;
    }

    /// References `pop_blocks_for_free` handed out for `b`, not yet freed.
    pub fn handed_out_refs(&self, b: BlockId) -> u32 {
        self.handed_out.get(b)
    }
}

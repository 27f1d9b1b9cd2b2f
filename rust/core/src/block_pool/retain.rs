//! What vLLM's copy-on-write does to the pool beside allocating:
//! an extra reference on a copy's endpoint (held until the scheduler
//! frees it after the step) and the prefix-map entry a key stands for
//! (Mamba marks partial keys cached this step by it).

use super::BlockPool;
use crate::BlockId;

impl BlockPool {
    /// One more reference on `b`, which is held already (vLLM's
    /// `ref_cnt += 1` on a CoW endpoint): it stays off the free queue.
    pub(crate) fn retain_block(&mut self, b: BlockId) {
        debug_assert!(self.meta[b as usize].ref_cnt > 0);
        self.meta[b as usize].ref_cnt += 1;
    }

    /// The prefix-map entry of `hash`, if any block is cached under it.
    pub(crate) fn entry_of(&self, hash: &[u8]) -> Option<u32> {
        self.map.find(hash)
    }
}

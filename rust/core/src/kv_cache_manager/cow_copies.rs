//! vLLM's per-step drains of partial hash hits (kv_cache_manager
//! L863-927): the copy-on-write copies the worker runs this step, and a
//! finishing producer's partial-tail boundary block.

use super::KvCacheManager;
use crate::BlockId;

impl KvCacheManager {
    /// vLLM's `coordinator.enable_partial_hash_hits`.
    pub fn partial_hash_hits(&self) -> bool {
        self.coord.partial_hash_hits()
    }

    /// Partial hash hits decided under decode context parallelism `dcp`
    /// (`Coordinator::set_partial_hits_dcp`); refused once a request is
    /// known (hits found so far followed the other alignment).
    pub fn set_partial_hits_dcp(&mut self, dcp: u32) -> crate::error::CoreResult<()> {
        if self.reqs.len() > 0 {
            return crate::error::invalid(
                "the context-parallel hit rule is set before the first request".to_string(),
            );
        }
        self.coord.set_partial_hits_dcp(dcp);
        Ok(())
    }

    /// `take_kv_cache_block_copies`: (source, copy) pairs, drained. Each
    /// endpoint holds an extra reference; the caller gives both back (in
    /// pair order) with `free_blocks` once the copies have run.
    pub fn take_kv_cache_block_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        let copies = self.coord.take_cow_copies();
        // The retained ends are the caller's to free, as popped blocks are.
        for &(src, dst) in &copies {
            self.hand_out(src);
            self.hand_out(dst);
        }
        copies
    }

    /// `finalize_partial_tail_offloads(request)`: (group, block, boundary
    /// tokens) per Mamba align group whose producer tail is complete; the
    /// tails are consumed. An unknown request has none.
    pub fn finalize_partial_tail_offloads(
        &mut self,
        request_id: &str,
        num_computed_tokens: usize,
        num_in_flight_tokens: usize,
    ) -> Vec<(u32, BlockId, usize)> {
        match self.slot(request_id) {
            Some(slot) => {
                self.coord
                    .finalize_partial_tails(slot, num_computed_tokens, num_in_flight_tokens)
            }
            None => Vec::new(),
        }
    }
}

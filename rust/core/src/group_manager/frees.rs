//! How a group's blocks go back to the pool: a finished request's
//! (`free`, or `pop_blocks` for a deferred free), and the blocks that left
//! the window or stopped being a Mamba copy source (`remove_skipped_blocks`).
//! Which end of the free queue they join is the profile's `FreePolicy`.

use smallvec::SmallVec;

use super::SingleTypeManager;
use crate::block_pool::{BlockPool, NULL_BLOCK};
use crate::{BlockId, ReqSlot};

impl SingleTypeManager {
    /// Frees the request's blocks, tail first so tails are evicted first.
    pub fn free(&mut self, pool: &mut BlockPool, slot: ReqSlot) {
        let scratch_first = self
            .free_policy
            .request_scratch_first(self.attn.frees_scratch_first());
        self.drop_offloads(slot);
        self.forget_partial(slot);
        let Some(r) = self.records.reqs.get_mut(slot as usize) else {
            return;
        };
        r.align = None;
        r.worker_view = None;
        r.num_cached = None;
        if std::mem::take(&mut r.has_blocks) {
            self.records.num_block_entries -= 1;
            // The table's buffer stays with the slot for its next request.
            let blocks = &mut r.blocks;
            if self.free_policy.pool_splits() {
                pool.free_blocks_split(blocks.iter().rev().copied());
            } else if scratch_first {
                // Scratch blocks are reused first; cached ones stay behind.
                let (cached, uncached): (Vec<BlockId>, Vec<BlockId>) = blocks
                    .iter()
                    .rev()
                    .copied()
                    .partition(|&b| pool.block_hash(b).is_some());
                pool.free_blocks(cached.iter().copied(), false);
                pool.free_blocks(uncached.iter().copied(), true);
            } else {
                pool.free_blocks(blocks.iter().rev().copied(), false);
            }
            blocks.clear();
            r.null_prefix.set(0);
        }
    }

    /// vLLM's `pop_blocks_for_free`: forgets the request's table and
    /// returns its blocks in table order, leading null blocks left out,
    /// still holding their references (the caller frees them later).
    pub fn pop_blocks(&mut self, slot: ReqSlot) -> Vec<BlockId> {
        self.drop_offloads(slot);
        self.forget_partial(slot);
        let Some(r) = self.records.reqs.get_mut(slot as usize) else {
            return Vec::new();
        };
        r.align = None;
        r.worker_view = None;
        r.num_cached = None;
        if !std::mem::take(&mut r.has_blocks) {
            return Vec::new();
        }
        self.records.num_block_entries -= 1;
        r.null_prefix.set(0);
        let head = r.blocks.iter().take_while(|&&b| b == NULL_BLOCK).count();
        let popped = r.blocks[head..].to_vec();
        r.blocks.clear();
        popped
    }

    /// Frees blocks that fall outside the attention window, replacing them
    /// with the null block; `num_prompt_tokens`: the request's, where the
    /// caller passes it (R-SWA frees the gap after the prompt then).
    pub fn remove_skipped_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        total: usize,
        num_prompt_tokens: Option<usize>,
    ) {
        let total = total.saturating_sub(self.window_drafts());
        self.remove_window_blocks(pool, slot, total, num_prompt_tokens);
        if self.attn.align().is_some() {
            self.free_old_state_block(pool, slot, total);
        }
    }

    fn remove_window_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        total: usize,
        num_prompt_tokens: Option<usize>,
    ) {
        let (first, n) = self.attn.freed_blocks(total, num_prompt_tokens, self.bs());
        if self.attn.has_window() {
            // Any skipped token makes vLLM's defaultdict entry, even below a block.
            if self.attn.skipped_tokens(total) == 0 {
                return;
            }
        } else if n <= first || self.req(slot).is_none_or(|r| !r.has_blocks) {
            // R-SWA's gap free leaves a request without a table alone.
            return;
        }
        let scratch_first = self.free_policy.window_scratch_first();
        let skip_nulls = self.frees_skip_nulls();
        let r = self.records.with_table(slot);
        let n = n.min(r.blocks.len());
        // Everything before the first real block is null already.
        let from = if skip_nulls {
            r.first_real().unwrap_or(n).min(n)
        } else {
            first.min(n)
        };
        let blocks = &mut r.blocks;
        let mut removed_cached: SmallVec<[BlockId; 8]> = SmallVec::new();
        let mut removed_uncached: SmallVec<[BlockId; 8]> = SmallVec::new();
        for i in (from..n).rev() {
            let b = blocks[i];
            if b == NULL_BLOCK {
                if skip_nulls {
                    continue;
                }
                // Earlier calls already nulled everything before it.
                break;
            }
            if scratch_first && !self.free_policy.pool_splits() && pool.block_hash(b).is_none() {
                removed_uncached.push(b);
            } else {
                removed_cached.push(b);
            }
            blocks[i] = NULL_BLOCK;
        }
        if self.free_policy.pool_splits() {
            // The pool splits one list (cached ones were pushed there).
            pool.free_blocks_split(removed_cached.iter().copied());
            return;
        }
        // Scratch blocks go to the front of the free queue (reused first);
        // cached ones stay behind as best-effort prefix-cache entries.
        if !removed_cached.is_empty() {
            pool.free_blocks(removed_cached.iter().copied(), false);
        }
        if !removed_uncached.is_empty() {
            pool.free_blocks(removed_uncached.iter().copied(), true);
        }
    }

    /// The state block of two steps ago is no longer a copy source: free it.
    fn free_old_state_block(&mut self, pool: &mut BlockPool, slot: ReqSlot, total: usize) {
        let Some(idx) = self.align_state(slot).and_then(|a| a.last_state_block_idx) else {
            return;
        };
        if total <= crate::attention::Mamba::old_state_kept_until(idx, self.bs()) {
            return;
        }
        let blocks = &mut self.records.with_table(slot).blocks;
        if blocks[idx] != NULL_BLOCK {
            if self.free_policy.pool_splits() {
                pool.free_blocks_split([blocks[idx]]);
            } else {
                pool.free_blocks([blocks[idx]].iter().copied(), false);
            }
            blocks[idx] = NULL_BLOCK;
        }
    }

    /// Tokens at the end of the computed count window frees ignore:
    /// `DraftsRejected` takes a Mamba group's drafts as rejected under async scheduling (it
    /// subtracts the block count); `ProcessedTokensNullGaps` frees on processed
    /// tokens instead.
    #[inline]
    pub(super) fn window_drafts(&self) -> usize {
        if self.mamba_rules.drafts_rejected() {
            self.attn.draft_tokens()
        } else {
            0
        }
    }

    /// `align_frees_skip_nulls` tables: window frees pass over prefill's null gaps.
    #[inline]
    pub(super) fn frees_skip_nulls(&self) -> bool {
        self.attn.align().is_some() && self.mamba_rules.align_frees_skip_nulls()
    }
}

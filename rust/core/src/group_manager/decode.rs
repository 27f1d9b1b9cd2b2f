//! The decode fast paths of one group, derived from the attention type's
//! rules (`attention::Attention`) and nothing else: a plain decode (no
//! computed blocks, external or encoder tokens) changes no block when
//! 1. no block leaves the window: `skipped_tokens(total - drafts)` ends
//!    at or before a null block (`remove_skipped_blocks`);
//! 2. Mamba align: the old state block stays a copy source;
//! 3. the table covers `sizing().required_blocks(..)` (`allocate_new_blocks`);
//! 4. no new full block is cached (`cache_blocks`), nor, with
//!    `caches_prefill_states`, the prompt's state keyed (`prompt_state_keys_below`).
//!
//! `decode_is_noop` checks these on the tables; `decode_horizon` turns
//! each into a bound on the counts through the rules' exact inverses
//! (`max_computed_skipping_below`, `old_state_kept_until`,
//! `max_tokens_within`); `plain_decode_need` runs steps 1-3 for a decode
//! that does change blocks. Debug builds check each against the general
//! path (`KvCacheManager::allocate_checked`, `is_noop_decode`).

use super::record::GroupReq;
use super::SingleTypeManager;
use crate::attention::{Mamba, RetentionMarks};
use crate::block_pool::{BlockPool, NULL_BLOCK};
use crate::decode_bounds::{DecodeCounts, DecodeHorizon};
use crate::ReqSlot;

impl SingleTypeManager {
    /// The request's record, if a plain decode of it can be judged from its
    /// table here: it runs (vLLM's `num_cached_block` has it), or, with prefix
    /// caching off (where nothing is cached, so no request ever runs in that
    /// sense), it has a table. A decode that needs no block adds none either
    /// way: vLLM's count for a request that does not run, max(required -
    /// max(skipped, held), 0), is 0 whenever required <= held. Cross
    /// attention has no plain decode.
    #[inline]
    fn decodes_known(&self, slot: ReqSlot) -> Option<&GroupReq> {
        // A partial tail may be (re)registered on any call: general path.
        if !self.attn.is_per_token()
            || !self.attn.decodes_compactly()
            || self.partial_tails
            || self.align_extras_may_act(slot)
        {
            return None;
        }
        // A ring never counts cached blocks: its table is what it holds.
        let tabled = !self.enable_caching || self.attn.fixed_blocks().is_some();
        self.req(slot)
            .filter(|r| r.num_cached.is_some() || (tabled && r.has_blocks))
    }

    /// Whether Mamba align rules beyond the table may act on a decode of
    /// the request: a checkpoint block to reserve (a decode with many
    /// drafts may, where the spec exports them) or an earlier count's to
    /// clear, states keyed inside wide blocks (with their copies) or at
    /// the junction by the request's computed count. The decode paths
    /// leave such requests to the general path.
    pub fn align_extras_may_act(&self, slot: ReqSlot) -> bool {
        self.spec.mamba_checkpoints.is_some_and(|c| c.alignment > 0)
            || self.caches_align_states() && (self.scale > 1 || self.shared_prefix_checkpoint)
            || self
                .align_state(slot)
                .is_some_and(|a| a.checkpoint.is_some())
    }

    /// Whether a plain decode step changes nothing in this group: no block
    /// leaves the window, none is allocated, none is cached. False sends the
    /// call the general way. `marks`: the request's, as caching reads them.
    pub fn decode_is_noop(&self, slot: ReqSlot, c: &DecodeCounts, marks: &RetentionMarks) -> bool {
        let Some(r) = self.decodes_known(slot) else {
            return false;
        };
        let bs = self.bs();
        let blocks = r.blocks.as_slice();
        let total = c.total_computed.saturating_sub(self.window_drafts());
        if self.attn.has_window() {
            let n = (self.attn.skipped_tokens(total) / bs).min(blocks.len());
            if n > 0 && blocks[n - 1] != NULL_BLOCK {
                return false;
            }
            if self.frees_skip_nulls() && r.first_real().is_some_and(|j| j < n) {
                return false;
            }
        }
        if self.attn.align().is_some() {
            if r.worker_view.is_none() {
                return false;
            }
            if let Some(idx) = r.live_old_state() {
                if total > Mamba::old_state_kept_until(idx, bs) {
                    return false;
                }
            }
        }
        if self.required_blocks(c.need_slot, c.main_model) > blocks.len() {
            return false;
        }
        c.to_cache.is_none_or(|t| {
            t / bs <= r.num_cached.unwrap_or(0) && t >= self.prompt_state_keys_below(marks)
        })
    }

    /// A plain decode's first phase in this group, for a request running
    /// here: frees what left the window (`remove_skipped_blocks`; not when
    /// `frees` is off, where the horizon shows none leaves) and
    /// returns the blocks the group needs (`get_num_blocks_to_allocate`'s
    /// running-request arm, without computed blocks). Only those arms run,
    /// so the common decode that changes blocks keeps to little code.
    pub fn plain_decode_need(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        c: &DecodeCounts,
        frees: bool,
    ) -> i64 {
        if frees && self.attn.has_window() {
            self.remove_skipped_blocks(pool, slot, c.total_computed, None);
        }
        let have = self.blocks(slot).len();
        if let (Some(m), Some(_)) = (self.attn.mamba(), self.attn.align()) {
            let allocated = self.align_state(slot).is_some_and(|a| a.allocated);
            // Groups with checkpoints take no compact decode (`decodes_known`),
            // nor do those with copies (caching gives them checkpoints).
            return m.align_blocks_to_allocate(
                self.bs(),
                c.main_model,
                have,
                allocated,
                false,
                false,
            );
        }
        self.required_blocks(c.need_slot, c.main_model)
            .saturating_sub(have) as i64
    }

    /// Bounds within which a plain decode changes nothing in this group
    /// (a sound summary of `decode_is_noop`, cached per request so the
    /// common decode costs a few compares). Caching is bounded by the
    /// coordinator, from `num_cached_blocks`; `min_to_cache` is in this
    /// group's tokens to cache (the coordinator maps it to the request's).
    /// None: no such summary.
    pub fn decode_horizon(&self, slot: ReqSlot, marks: &RetentionMarks) -> Option<DecodeHorizon> {
        let r = self.decodes_known(slot)?;
        let bs = self.bs();
        let sizing = self.attn.sizing();
        let room = match self.attn.fixed_blocks() {
            // A held ring covers any count.
            Some(n) => (r.blocks.len() >= n).then_some(usize::MAX)?,
            None => sizing.max_tokens_within(bs, r.blocks.len())?,
        };
        let drafts = self.window_drafts();
        let mut h = DecodeHorizon {
            min_to_cache: self.prompt_state_keys_below(marks),
            ..DecodeHorizon::UNBOUNDED
        };
        if sizing.by_main_model {
            h.max_main = room;
        } else {
            h.max_need_slot = room;
        }
        // Blocks before the first real one are null: a window ending there
        // frees nothing (`remove_window_blocks` stops at a null block).
        if self.attn.has_window() {
            if let Some(j) = r.first_real() {
                h.max_total = self.attn.max_computed_skipping_below((j + 1) * bs) + drafts;
            }
        }
        if self.attn.align().is_some() {
            r.worker_view.as_ref()?;
            if let Some(idx) = r.live_old_state() {
                h.max_total = h
                    .max_total
                    .min(Mamba::old_state_kept_until(idx, bs) + drafts);
            }
        }
        Some(h)
    }
}

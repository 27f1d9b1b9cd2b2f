//! `allocate_slots`: the argument checks (nothing changes before they
//! pass) and the general allocation steps, in vLLM's order.

use std::borrow::Cow;

use super::{admission_check, AllocateArgs, KvCacheManager, NO_BLOCKS};
use crate::error::{invalid, CoreResult};
use crate::hashes::HashUpdate;
use crate::new_blocks::NewBlocks;
use crate::{BlockId, ReqSlot};

impl KvCacheManager {
    pub(super) fn check_new_computed(
        &self,
        slot: Option<ReqSlot>,
        args: &AllocateArgs,
    ) -> CoreResult<()> {
        let Some(nc) = args.new_computed_blocks else {
            return Ok(());
        };
        if nc.len() != self.num_groups() {
            return invalid(format!(
                "new_computed_blocks has {} groups, the manager has {}",
                nc.len(),
                self.num_groups()
            ));
        }
        for &b in nc.iter().flatten() {
            self.coord.pool.check_block_id(b)?;
        }
        if !self.enable_caching && nc.iter().any(|g| !g.is_empty()) {
            return invalid("new_computed_blocks must be empty when prefix caching is disabled");
        }
        for (m, g) in self.coord.managers.iter().zip(nc) {
            let running = slot.is_some_and(|s| m.is_running(s));
            if running && !g.is_empty() {
                return invalid("a running request cannot take new computed blocks");
            }
        }
        Ok(())
    }

    /// vLLM's `allocate_slots`: `Ok(None)` when the free blocks do not suffice
    /// (nothing changed then, except blocks outside the attention window).
    /// Hashes in `update` are stored only once the call is known to be valid.
    pub fn allocate_slots(
        &mut self,
        request_id: &str,
        args: &AllocateArgs,
        update: Option<HashUpdate>,
    ) -> CoreResult<Option<Vec<Vec<BlockId>>>> {
        self.allocate_slots_at(self.slot(request_id), request_id, args, update)
    }

    /// `allocate_slots` for a request whose slot was looked up already.
    pub fn allocate_slots_at(
        &mut self,
        slot: Option<ReqSlot>,
        request_id: &str,
        args: &AllocateArgs,
        update: Option<HashUpdate>,
    ) -> CoreResult<Option<Vec<Vec<BlockId>>>> {
        let mut out = NewBlocks::new();
        let ok = self.allocate_slots_into(slot, request_id, args, update, &mut out)?;
        Ok(ok.then(|| out.to_vecs()))
    }

    /// `new_computed_blocks`, or no blocks for each group.
    pub(super) fn new_computed_or_empty<'a>(
        &self,
        args: &AllocateArgs<'a>,
    ) -> Cow<'a, [Vec<BlockId>]> {
        match args.new_computed_blocks {
            Some(nc) => Cow::Borrowed(nc),
            None if self.num_groups() <= NO_BLOCKS.len() => {
                Cow::Borrowed(&NO_BLOCKS[..self.num_groups()])
            }
            None => Cow::Owned(vec![Vec::new(); self.num_groups()]),
        }
    }

    /// The argument checks of `allocate_slots_into` alone (changes nothing):
    /// `Ok` means that call, with the same state, cannot fail.
    pub fn check_allocate(
        &self,
        slot: Option<ReqSlot>,
        request_id: &str,
        args: &AllocateArgs,
        update: Option<&HashUpdate>,
    ) -> CoreResult<()> {
        admission_check::check_counts(self, slot, request_id, args)?;
        let have = self.hashes_after_at(slot, request_id, update)?;
        self.check_new_computed(slot, args)?;
        admission_check::check_computed_blocks(self, slot, request_id, args, update)?;
        let new_computed = self.new_computed_or_empty(args);
        let new_computed: &[Vec<BlockId>] = &new_computed;
        let adds_computed =
            args.new_computed_blocks.is_some() || args.num_external_computed_tokens > 0;
        if adds_computed {
            if let Some(s) = slot {
                let stale = self
                    .coord
                    .managers
                    .iter()
                    .any(|m| !m.is_running(s) && !m.blocks(s).is_empty());
                if stale {
                    return invalid(format!(
                        "request {request_id:?} already holds blocks but is not running; \
                         free it before giving it computed blocks"
                    ));
                }
            }
        }

        let num_local_computed = args.num_computed_tokens + args.num_new_computed_tokens;
        let total_computed =
            (num_local_computed + args.num_external_computed_tokens).min(self.max_model_len);
        let caches = self.enable_caching && !args.delay_cache_blocks;
        let num_tokens_to_cache = (total_computed + args.num_new_tokens).min(args.num_tokens);
        if caches {
            self.check_hashes_for_cache(
                request_id,
                slot,
                have,
                new_computed,
                adds_computed,
                total_computed,
                num_tokens_to_cache,
            )?;
        }

        Ok(())
    }

    /// `allocate_slots_at` writing the new blocks into `out` (reused by the
    /// caller, so a call allocates nothing): `Ok(false)` for vLLM's `None`.
    pub fn allocate_slots_into(
        &mut self,
        slot: Option<ReqSlot>,
        request_id: &str,
        args: &AllocateArgs,
        update: Option<HashUpdate>,
        out: &mut NewBlocks,
    ) -> CoreResult<bool> {
        if let (Some(s), None) = (slot, &update) {
            if self.try_noop_decode(s, args, out) {
                return Ok(true);
            }
        }
        self.allocate_general_into(slot, request_id, args, update.as_ref(), out)
    }

    /// `allocate_slots_into` without the no-op decode shortcut (for a
    /// caller that tried `try_noop_decode` already).
    pub fn allocate_general_into(
        &mut self,
        slot: Option<ReqSlot>,
        request_id: &str,
        args: &AllocateArgs,
        update: Option<&HashUpdate>,
        out: &mut NewBlocks,
    ) -> CoreResult<bool> {
        debug_assert_eq!(slot, self.slot(request_id));
        out.clear();
        self.check_allocate(slot, request_id, args, update)?;
        // From here on the call is valid; every path below only succeeds.
        let slot = match slot {
            Some(s) => s,
            None => self.slot_or_insert(request_id),
        };
        Ok(self.allocate_checked(slot, args, update, out))
    }

    /// `allocate_general_into` for a request the manager holds (its id,
    /// for messages, is the core's own copy).
    pub fn allocate_held_into(
        &mut self,
        slot: ReqSlot,
        args: &AllocateArgs,
        update: Option<&HashUpdate>,
        out: &mut NewBlocks,
    ) -> CoreResult<bool> {
        out.clear();
        self.check_allocate(Some(slot), self.reqs.id_at(slot), args, update)?;
        Ok(self.allocate_checked(slot, args, update, out))
    }

    /// The allocation of `allocate_slots_into` for a request whose slot
    /// exists, once `check_allocate` accepted these arguments in this state
    /// (a batch checks all its requests first, then allocates them).
    pub fn allocate_checked(
        &mut self,
        slot: ReqSlot,
        args: &AllocateArgs,
        update: Option<&HashUpdate>,
        out: &mut NewBlocks,
    ) -> bool {
        out.clear();
        // The last horizon picks the plain decode's phases; any allocation
        // re-derives it.
        let last = self.reqs.horizon(slot);
        self.set_horizon(slot, None);
        if let Some(n) = args.num_prompt_tokens {
            self.reqs.set_num_prompt_tokens(slot, n);
        }
        if let Some(n) = args.shared_prefix_boundary {
            self.reqs.set_shared_prefix_boundary(slot, n);
        }
        if self.reads_request_computed {
            self.reqs
                .set_num_computed_tokens(slot, args.num_computed_tokens);
        }
        if args.is_plain()
            && self.coord.runs_everywhere(slot)
            && !self.coord.align_extras_may_act(slot)
        {
            // Debug builds check the compact path against the general one.
            #[cfg(debug_assertions)]
            let expected = {
                let mut general = self.clone();
                let mut general_out = NewBlocks::new();
                let ok = general.allocate_general_checked(slot, args, update, &mut general_out);
                (ok, general_out, format!("{general:?}"))
            };
            let ok = self.allocate_plain_decode(slot, args, last, update, out);
            #[cfg(debug_assertions)]
            {
                assert_eq!(
                    (ok, &*out),
                    (expected.0, &expected.1),
                    "plain decode of slot {slot}"
                );
                assert!(
                    format!("{self:?}") == expected.2,
                    "plain decode of slot {slot}: state"
                );
            }
            return ok;
        }
        self.allocate_general_checked(slot, args, update, out)
    }

    /// `allocate_checked` by the general steps (any arguments); `out` is
    /// empty and the horizon unknown on entry.
    pub(super) fn allocate_general_checked(
        &mut self,
        slot: ReqSlot,
        args: &AllocateArgs,
        update: Option<&HashUpdate>,
        out: &mut NewBlocks,
    ) -> bool {
        let new_computed = self.new_computed_or_empty(args);
        let new_computed: &[Vec<BlockId>] = &new_computed;
        let adds_computed =
            args.new_computed_blocks.is_some() || args.num_external_computed_tokens > 0;
        let num_local_computed = args.num_computed_tokens + args.num_new_computed_tokens;
        let total_computed =
            (num_local_computed + args.num_external_computed_tokens).min(self.max_model_len);
        let caches = self.enable_caching && !args.delay_cache_blocks;
        let num_tokens_to_cache = (total_computed + args.num_new_tokens).min(args.num_tokens);
        if let Some(u) = update {
            self.reqs.apply_hashes(slot, u);
        }
        if args.full_sequence_must_fit && !self.full_sequence_fits(slot, args, total_computed) {
            self.release_if_idle(slot);
            return false;
        }
        let num_tokens_main_model = total_computed + args.num_new_tokens;
        let num_tokens_need_slot =
            (num_tokens_main_model + args.num_lookahead_tokens).min(self.max_model_len);

        // Blocks outside the window are freed even if the allocation fails;
        // with `frees_on_processed_tokens`, only below the processed tokens.
        let processed = total_computed.saturating_sub(args.num_in_flight_tokens);
        let prompt = self.gap_prompt_len(slot, args);
        self.coord.remove_skipped_blocks(slot, processed, prompt);
        let prefill_end = self.prefill_end(slot, args);
        let query_start = num_local_computed + args.num_external_computed_tokens;
        let need_with_external = |external| {
            self.coord.get_num_blocks_to_allocate(
                slot,
                num_tokens_need_slot,
                new_computed,
                args.num_encoder_tokens,
                query_start,
                external,
                num_local_computed,
                num_tokens_main_model,
                false,
                prefill_end,
            )
        };
        // vLLM's count decides, as in vLLM; the true count (which adds the
        // external-token block of Mamba align groups vLLM leaves out) only
        // turns what would crash vLLM's pool into None.
        let need = need_with_external(0);
        let need_true = match args.num_external_computed_tokens {
            0 => need,
            external => need_with_external(external),
        };
        // Decided on the tables before the hits and external blocks join;
        // the count records them even when the allocation fails (partial-block-hits).
        let checkpoints =
            self.coord
                .align_checkpoints(slot, query_start, num_tokens_main_model, prefill_end);
        self.coord
            .note_align_checkpoints(slot, checkpoints, num_tokens_main_model);
        let free = self.coord.pool.num_free_blocks() as i64;
        let need = need + args.watermark_blocks as i64;
        if need > free - args.reserved_blocks as i64 || need_true > free {
            self.release_if_idle(slot);
            return false;
        }
        if adds_computed {
            self.coord.allocate_new_computed_blocks(
                slot,
                new_computed,
                num_local_computed,
                args.num_external_computed_tokens,
                args.skip_zeroing_groups,
            );
        }
        self.coord.allocate_new_blocks(
            slot,
            num_tokens_need_slot,
            num_tokens_main_model,
            args.num_encoder_tokens,
            checkpoints,
            out,
        );
        self.coord
            .note_align_checkpoints(slot, checkpoints, num_tokens_main_model);
        if caches {
            self.coord.cache_blocks(
                slot,
                self.reqs.hashes(slot),
                num_tokens_to_cache,
                self.retention_marks(slot),
            );
        }
        self.allocated(slot, total_computed, args.num_new_tokens);
        true
    }

    /// After an allocation that succeeded: the planner's note and the
    /// request's new decode horizon.
    pub(super) fn allocated(
        &mut self,
        slot: ReqSlot,
        total_computed: usize,
        num_new_tokens: usize,
    ) {
        self.note_last_step(slot, total_computed, num_new_tokens);
        if let Some(h) = self.coord.decode_horizon(slot, &self.retention_marks(slot)) {
            self.set_horizon(slot, Some(h));
        }
    }

    /// `full_sequence_must_fit`: the whole sequence (up to max_model_len)
    /// would fit in the free blocks. Rare, so out of the decode's code.
    #[cold]
    #[inline(never)]
    pub(super) fn full_sequence_fits(
        &self,
        slot: ReqSlot,
        args: &AllocateArgs,
        total_computed: usize,
    ) -> bool {
        let full = args.num_tokens.min(self.max_model_len);
        let new_computed = self.new_computed_or_empty(args);
        let need = self.coord.get_num_blocks_to_allocate(
            slot,
            full,
            &new_computed,
            args.num_encoder_tokens,
            total_computed,
            0,
            args.num_computed_tokens + args.num_new_computed_tokens,
            full,
            true,
            self.prefill_end(slot, args),
        );
        need + args.watermark_blocks as i64 <= self.coord.pool.num_free_blocks() as i64
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_hashes_for_cache(
        &self,
        request_id: &str,
        slot: Option<ReqSlot>,
        have: usize,
        new_computed: &[Vec<BlockId>],
        adds_computed: bool,
        total_computed: usize,
        num_tokens: usize,
    ) -> CoreResult<()> {
        // A group caches at most num_tokens / block_size blocks of
        // block_size / hash_block_size hashes each: never more than this.
        // Releases that cap caching at the hashed blocks need none.
        if self.profile.cache_cap_at_hashes
            || have >= num_tokens / self.coord.pool.hash_block_size() as usize
        {
            return Ok(());
        }
        let groups = |g: u32| new_computed[g as usize].len();
        let need = self
            .coord
            .hashes_needed_to_cache(num_tokens, |m| match slot {
                Some(s) if adds_computed => {
                    m.num_cached_after_computed(s, groups(m.group_id), total_computed)
                }
                Some(s) => m.num_cached_blocks(s),
                None if adds_computed => {
                    m.num_cached_after_computed(u32::MAX, groups(m.group_id), total_computed)
                }
                None => 0,
            });
        if have < need {
            return invalid(format!(
                "request {request_id:?} has {have} block hashes but caching {num_tokens} tokens needs {need}"
            ));
        }
        Ok(())
    }

    /// The coordinator's block count for an allocation (vLLM's
    /// `coordinator.get_num_blocks_to_allocate`); reads only.
    #[allow(clippy::too_many_arguments)]
    pub fn get_num_blocks_to_allocate(
        &self,
        request_id: &str,
        num_tokens: usize,
        new_computed: &[Vec<BlockId>],
        num_encoder_tokens: usize,
        total_computed_tokens: usize,
        num_tokens_main_model: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> CoreResult<i64> {
        if new_computed.len() != self.num_groups() {
            return invalid(format!(
                "new_computed_blocks has {} groups, the manager has {}",
                new_computed.len(),
                self.num_groups()
            ));
        }
        for &b in new_computed.iter().flatten() {
            self.coord.pool.check_block_id(b)?;
        }
        // An unknown request is a fresh slot no table refers to.
        let slot = self.slot(request_id).unwrap_or(ReqSlot::MAX);
        Ok(self.coord.get_num_blocks_to_allocate(
            slot,
            num_tokens,
            new_computed,
            num_encoder_tokens,
            total_computed_tokens,
            0,
            // vLLM's num_local_computed_tokens: the query has no external ones.
            total_computed_tokens,
            num_tokens_main_model,
            apply_admission_cap,
            prefill_end,
        ))
    }

    /// The prompt length vLLM's `allocate_slots` hands the window frees
    /// (R-SWA frees its gap by it): known where some group frees gaps.
    fn gap_prompt_len(&self, slot: ReqSlot, args: &AllocateArgs) -> Option<usize> {
        if !self.reads_gap_prompt {
            return None;
        }
        args.num_prompt_tokens
            .or_else(|| self.reqs.num_prompt_tokens(slot))
    }

    /// Where the request's prefill ends for Mamba checkpoints (vLLM:
    /// `max(num_prompt_tokens, num_tokens - 1)`, read only where
    /// checkpoints wait for it; 0 elsewhere: every chunk may checkpoint).
    fn prefill_end(&self, slot: ReqSlot, args: &AllocateArgs) -> usize {
        let waits = self.coord.managers.iter().any(|m| {
            m.spec
                .mamba_checkpoints
                .is_some_and(|c| c.only_at_prefill_end)
        });
        if !waits {
            return 0;
        }
        let prompt = args
            .num_prompt_tokens
            .or_else(|| self.reqs.num_prompt_tokens(slot))
            .unwrap_or(0);
        prompt.max(args.num_tokens.saturating_sub(1))
    }
}

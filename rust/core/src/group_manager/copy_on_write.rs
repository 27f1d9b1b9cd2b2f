//! vLLM's copy-on-write of partial hits (single_type_kv_cache_manager
//! L164-175, L262-266, L319-325, L455-475, Mamba L1748-1923): a hit that
//! ends inside a block shares that block's KV only up to the hit, so the
//! request writes past it into a private copy. Its allocation takes one more
//! block, puts it in the table in place of the shared one and queues the
//! (source, copy) pair for the worker; both endpoints keep an extra
//! reference until the scheduler frees them after the step
//! (`take_cow_copies`). A Mamba producer whose own prompt boundary was
//! cached inside its running state block keeps writing that block, so the
//! cache entry moves to the copy instead (and the copy is offered to a KV
//! connector).

use std::collections::HashMap;

use super::{entry_key, SingleTypeManager};
use crate::block_pool::BlockPool;
use crate::fast_hash::FxBuild;
use crate::{BlockId, ReqSlot};

/// One request's partial hit: the table index of the shared block, and it.
pub(super) type PartialHit = (usize, BlockId);

#[derive(Debug, Clone, Default)]
pub(super) struct CowState {
    /// The profile has partial hits (partial-block-hits); nothing here is used else.
    on: bool,
    /// vLLM's `_partial_hit_reqs`.
    partial_hits: HashMap<ReqSlot, PartialHit, FxBuild>,
    /// vLLM's `_pending_cow_copies`: (source, copy), oldest first.
    copies: Vec<(BlockId, BlockId)>,
    /// Mamba align's `_producer_partial_tail_reqs`: the block holding the
    /// request's own partial-tail boundary state and that boundary.
    producer_tails: HashMap<ReqSlot, (BlockId, usize), FxBuild>,
}

impl CowState {
    pub fn new(on: bool) -> Self {
        CowState {
            on,
            ..Self::default()
        }
    }

    pub fn take_partial_hit(&mut self, slot: ReqSlot) -> Option<PartialHit> {
        if self.partial_hits.is_empty() {
            return None;
        }
        self.partial_hits.remove(&slot)
    }

    /// Mamba align: the pending redirect, if its block is still at its
    /// place in the request's table (`blocks`). A boundary cached behind the
    /// request (in a block it has computed past, which this allocation's
    /// skip has just freed) has no state left to copy, so it is dropped;
    /// vLLM asserts there (its scheduler never caches behind the request).
    pub fn take_live_partial_hit(
        &mut self,
        slot: ReqSlot,
        blocks: &[BlockId],
    ) -> Option<PartialHit> {
        let (idx, source) = self.take_partial_hit(slot)?;
        if blocks.get(idx) == Some(&source) {
            return Some((idx, source));
        }
        self.producer_tails.remove(&slot);
        None
    }
}

impl SingleTypeManager {
    /// vLLM's `_has_partial_local_hit` (hits ending inside a block of this
    /// group), or, for Mamba align, a producer tail waiting for its copy.
    pub(super) fn partial_hit_pending(
        &self,
        slot: ReqSlot,
        new_computed: &[BlockId],
        num_local_computed_tokens: usize,
    ) -> bool {
        if !self.cow.on {
            return false;
        }
        let local = !new_computed.is_empty() && num_local_computed_tokens % self.bs() != 0;
        local || (self.is_mamba_align() && self.cow.partial_hits.contains_key(&slot))
    }

    /// After a new request's hits joined its table (`computed`: those not
    /// skipped): a hit ending inside a block is redirected by the
    /// allocation; its cached count stops before that block, so the copy is
    /// cached once full.
    pub(super) fn note_partial_hit(
        &mut self,
        slot: ReqSlot,
        computed: &[BlockId],
        num_local_computed_tokens: usize,
    ) {
        if !self.cow.on || computed.is_empty() || num_local_computed_tokens % self.bs() == 0 {
            return;
        }
        let idx = num_local_computed_tokens / self.bs();
        let last = *computed.last().expect("not empty");
        self.cow.partial_hits.insert(slot, (idx, last));
        self.records.with_table(slot).num_cached = Some(idx);
    }

    /// Full attention (vLLM's base `allocate_new_blocks`): the private copy
    /// replaces the shared block, is returned first and is recorded as a
    /// new block id (for zeroing, whatever the group records otherwise).
    pub(super) fn copy_on_write(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        (idx, source): PartialHit,
        out: &mut Vec<BlockId>,
    ) {
        let mut fresh = Vec::with_capacity(1);
        pool.get_new_blocks(1, &mut fresh);
        let cow = fresh[0];
        self.apply_cow(pool, slot, idx, source, cow);
        self.new_block_ids.push(cow);
        out.push(cow);
    }

    /// vLLM's `_apply_cow`: the table points at the copy; the source keeps
    /// its hit reference, the copy takes one beyond the request's.
    fn apply_cow(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        idx: usize,
        source: BlockId,
        cow: BlockId,
    ) {
        let blocks = &mut self.records.with_table(slot).blocks;
        debug_assert_eq!(blocks.get(idx), Some(&source));
        if let Some(b) = blocks.get_mut(idx) {
            *b = cow;
        }
        self.cow.copies.push((source, cow));
        pool.retain_block(cow);
    }

    /// Mamba align, after `allocate_align_blocks` took the copy `cow`
    /// (`was_allocated`: the request had blocks before). A new request's
    /// table points at the copy, returned first (at `start` of `out`). A
    /// running request's worker table is append-only, so it stays on the
    /// source: the source's keys move to the copy, filled by this step's
    /// copy before the forward overwrites the source.
    pub(super) fn align_copy_on_write(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        (idx, source): PartialHit,
        (cow, was_allocated): (BlockId, bool),
        start: usize,
        out: &mut Vec<BlockId>,
    ) {
        if !was_allocated {
            self.apply_cow(pool, slot, idx, source, cow);
            out.insert(start, cow);
            return;
        }
        pool.move_block_hashes(source, cow);
        self.cow.copies.push((source, cow));
        pool.retain_block(source);
        if let Some((marker, boundary)) = self.cow.producer_tails.remove(&slot) {
            debug_assert_eq!(marker, source);
            // The copy preserves the producer's own boundary state: offer it.
            self.pending_offloads.push((slot, cow, boundary));
        }
        if let Some(e) = pool.block_entry(cow) {
            // Filled only by this step's copy: same-step hits on it wait.
            self.cached_this_step.insert(entry_key(e));
        }
    }

    /// Mamba align caching registered the request's own prompt boundary
    /// inside block `idx` of its table: the next allocation copies it.
    pub(super) fn note_producer_tail(
        &mut self,
        slot: ReqSlot,
        idx: usize,
        b: BlockId,
        tokens: usize,
    ) {
        self.cow.partial_hits.insert(slot, (idx, b));
        self.cow.producer_tails.insert(slot, (b, tokens));
        self.records.with_table(slot).num_cached = Some(idx);
    }

    /// A request's table goes away (free or pop): its pending redirect and
    /// producer tail too; queued copies stay (their references hold).
    pub(super) fn forget_partial(&mut self, slot: ReqSlot) {
        if self.cow.partial_hits.is_empty() && self.cow.producer_tails.is_empty() {
            return;
        }
        self.cow.partial_hits.remove(&slot);
        self.cow.producer_tails.remove(&slot);
    }

    /// The (source, copy) pairs queued and not yet taken.
    pub fn pending_cow_copies(&self) -> &[(BlockId, BlockId)] {
        &self.cow.copies
    }

    /// vLLM's `take_pending_cow_copies`: this group's (source, copy) pairs
    /// since the last take, oldest first.
    pub fn take_cow_copies(&mut self, out: &mut Vec<(BlockId, BlockId)>) {
        out.append(&mut self.cow.copies);
    }

    /// vLLM's `finalize_partial_tail_offload`: a finishing producer's own
    /// boundary block, if nothing was forwarded past it (num_computed
    /// equals the boundary, none in flight): (group, block, tokens). The
    /// producer tail is consumed either way.
    pub fn finalize_partial_tail(
        &mut self,
        slot: ReqSlot,
        num_computed_tokens: usize,
        num_in_flight_tokens: usize,
    ) -> Option<(u32, BlockId, usize)> {
        if !self.is_mamba_align() {
            return None;
        }
        let (b, tokens) = self.cow.producer_tails.remove(&slot)?;
        (num_in_flight_tokens == 0 && num_computed_tokens == tokens).then_some((
            self.group_id,
            b,
            tokens,
        ))
    }
}

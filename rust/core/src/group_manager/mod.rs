//! One manager per KV-cache group (vLLM's single-type managers): the
//! request -> blocks tables of that group and the steps of an allocation.
//! One struct serves every attention type; what differs by type is asked of
//! `attention::Attention`, which owns each type's rules.

mod caching;
mod copy_on_write;
mod decode;
mod frees;
mod invariants;
mod mamba_cache;
mod mamba_partial;
mod partial_tail;
mod record;

use std::collections::HashSet;

use crate::attention::mamba::AlignState;
use crate::attention::{Attention, HitSearch, ReachableBlocks};
use crate::block_pool::{reserve_table, BlockPool, NULL_BLOCK};
use crate::fast_hash::FxBuild;
use crate::hashes::ScaledHashes;
use crate::profile::{BehaviourProfile, FreePolicy, MambaRules, Retention};
use crate::spec::GroupSpec;
use crate::{cdiv, BlockId, ReqSlot};
use copy_on_write::CowState;
use record::{GroupReq, Records};

#[derive(Debug, Clone)]
pub(crate) struct SingleTypeManager {
    pub spec: GroupSpec,
    /// The spec's attention type: every per-type rule.
    pub attn: Attention,
    pub group_id: u32,
    pub block_size: u32,
    pub scheduler_block_size: u32,
    /// Whether cache hits of this group drop the EAGLE lookahead block.
    pub use_eagle: bool,
    /// Hashes per block (block_size / hash_block_size), and the blocks a
    /// sliding-window hit can use: fixed once the coordinator has set
    /// `use_eagle` (see `settle`), so a decode computes neither.
    pub scale: usize,
    reachable: Option<ReachableBlocks>,
    records: Records,
    new_block_ids: Vec<BlockId>,
    /// New block ids are recorded (spec and profile agree).
    records_new_block_ids: bool,
    free_policy: FreePolicy,
    mamba_rules: MambaRules,
    /// Caching stops at the hashed blocks (partial-block-hits) instead of needing a
    /// hash for every full block.
    cap_at_hashes: bool,
    /// Partial-block entries, full attention over smaller hash blocks: the prompt tail that
    /// ends inside a block is cached as a partial entry (`partial_tail.rs`).
    partial_tails: bool,
    enable_caching: bool,
    // Mamba: blocks cached during this step cannot serve hits until the
    // next. vLLM keeps (hash, group) keys; a prefix-map entry stands for
    // its hash: an entry id reused within the step is held only by blocks
    // cached within the step, so `entry_key` marks are exact.
    cached_this_step: HashSet<u64, FxBuild>,
    /// Mamba align (partial-block-hits): states cached since the last take, for a KV
    /// connector: (slot, block, boundary tokens).
    pending_offloads: Vec<(ReqSlot, BlockId, usize)>,
    /// vLLM's `cache_hit_alignment_tokens`: the hash block size
    /// under partial hash hits, else the scheduler block size (set by the
    /// coordinator).
    pub alignment_tokens: u32,
    /// Partial hits' copy-on-write bookkeeping (`copy_on_write.rs`).
    cow: CowState,
    /// Mamba (vLLM's `shared_prefix_checkpoint`, set by the manager):
    /// align caching also keys the state at the shared-prefix junction
    /// (`SingleTypeManager::keys_prompt_state_at`).
    pub shared_prefix_checkpoint: bool,
}

impl SingleTypeManager {
    pub fn new(
        spec: GroupSpec,
        group_id: u32,
        enable_caching: bool,
        scheduler_block_size: u32,
        profile: &BehaviourProfile,
    ) -> Self {
        SingleTypeManager {
            records_new_block_ids: profile.records_new_block_ids(spec.reports_new_block_ids),
            free_policy: profile.free_policy,
            mamba_rules: profile.mamba,
            cap_at_hashes: profile.cache_cap_at_hashes,
            partial_tails: profile.partial_block_entries,
            block_size: spec.block_size,
            attn: Attention::of(&spec),
            scheduler_block_size,
            spec,
            group_id,
            use_eagle: false,
            scale: 1,
            reachable: None,
            records: Records::default(),
            new_block_ids: Vec::new(),
            enable_caching,
            cached_this_step: HashSet::default(),
            pending_offloads: Vec::new(),
            alignment_tokens: scheduler_block_size,
            cow: CowState::new(profile.partial_hits),
            shared_prefix_checkpoint: false,
        }
    }

    fn req(&self, slot: ReqSlot) -> Option<&GroupReq> {
        self.records.get(slot)
    }

    fn bs(&self) -> usize {
        self.block_size as usize
    }

    /// The worker's view of the request's block ids (Mamba align groups).
    pub fn worker_view(&self, slot: ReqSlot) -> Option<&[BlockId]> {
        self.req(slot).and_then(|r| r.worker_view.as_deref())
    }

    /// Where the request's record lives (for a caller to prefetch).
    pub fn record_addr(&self, slot: ReqSlot) -> Option<*const u8> {
        self.req(slot).map(|r| std::ptr::from_ref(r).cast())
    }

    /// Where the request's tables end (the line a decode reads or grows).
    pub fn for_each_table_tail(&self, slot: ReqSlot, f: &mut impl FnMut(*const u8)) {
        let Some(r) = self.req(slot) else {
            return;
        };
        let tail = |t: &[BlockId]| t.as_ptr().wrapping_add(t.len().saturating_sub(1)).cast();
        f(tail(&r.blocks));
        if let Some(w) = &r.worker_view {
            f(tail(w));
        }
    }

    /// The table index of the oldest live block of a group that frees
    /// from the front as a request decodes (a window, Mamba align).
    fn live_head(&self, slot: ReqSlot) -> Option<(&GroupReq, usize)> {
        if !self.attn.has_window() && self.attn.align().is_none() {
            return None;
        }
        let r = self.req(slot)?;
        Some((r, r.first_real()?))
    }

    /// Where the table's oldest live block is listed (a decode that
    /// changes blocks frees it, or reads up to it).
    pub fn for_each_live_head_line(&self, slot: ReqSlot, f: &mut impl FnMut(*const u8)) {
        if let Some((r, j)) = self.live_head(slot) {
            f(std::ptr::from_ref(&r.blocks[j]).cast());
        }
    }

    /// The pool lines of the table's oldest live block (reads its id: a
    /// caller prefetched the table line first).
    pub fn for_each_live_head_block_line(
        &self,
        pool: &BlockPool,
        slot: ReqSlot,
        f: &mut impl FnMut(*const u8),
    ) {
        if let Some((r, j)) = self.live_head(slot) {
            pool.for_each_block_line(r.blocks[j], f);
        }
    }

    /// Where caching the request's full blocks up to `num_tokens` reads
    /// (the last few it would cache: a decode step fills one or two): the
    /// table's entries and each block's pool lines.
    pub fn for_each_to_cache_line(
        &self,
        pool: &BlockPool,
        slot: ReqSlot,
        num_tokens: usize,
        f: &mut impl FnMut(*const u8),
    ) {
        let Some(r) = self.req(slot) else {
            return;
        };
        if !self.spec.prefix_cacheable {
            return;
        }
        let end = (num_tokens / self.bs()).min(r.blocks.len());
        let from = r
            .num_cached
            .unwrap_or(0)
            .max(end.saturating_sub(2))
            .min(end);
        for &b in &r.blocks[from..end] {
            if b != NULL_BLOCK {
                pool.for_each_block_line(b, f);
            }
        }
    }

    pub fn is_mamba_align(&self) -> bool {
        self.attn.align().is_some()
    }

    pub fn blocks(&self, slot: ReqSlot) -> &[BlockId] {
        self.req(slot).map_or(&[], |r| r.blocks.as_slice())
    }

    /// The request is running in this group (it has a cached-block count).
    pub fn is_running(&self, slot: ReqSlot) -> bool {
        self.req(slot).is_some_and(|r| r.num_cached.is_some())
    }

    pub fn holds(&self, slot: ReqSlot) -> bool {
        self.req(slot).is_some_and(GroupReq::holds)
    }

    /// `first(n)`, remembered per request (see `GroupReq::keying_bound`).
    pub fn keying_bound(
        &self,
        slot: ReqSlot,
        n: usize,
        first: impl FnOnce(usize) -> usize,
    ) -> usize {
        match self.req(slot) {
            Some(r) => r.keying_bound(n, first),
            None => first(n),
        }
    }

    pub fn num_cached_blocks(&self, slot: ReqSlot) -> usize {
        self.req(slot).and_then(|r| r.num_cached).unwrap_or(0)
    }

    pub fn align_state(&self, slot: ReqSlot) -> Option<AlignState> {
        self.req(slot).and_then(|r| r.align)
    }

    /// Blocks required for an allocation of `num_tokens` (tokens that need
    /// a slot) and `num_tokens_main_model`.
    fn required_blocks(&self, num_tokens: usize, num_tokens_main_model: usize) -> usize {
        if let Some(n) = self.attn.fixed_blocks() {
            return n;
        }
        self.attn
            .sizing()
            .required_blocks(self.bs(), num_tokens, num_tokens_main_model)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn get_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: ReqSlot,
        num_tokens: usize,
        new_computed: &[BlockId],
        total_computed_tokens: usize,
        num_external_computed_tokens: usize,
        num_local_computed_tokens: usize,
        num_tokens_main_model: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> i64 {
        let partial = self.partial_hit_pending(slot, new_computed, num_local_computed_tokens);
        if self.attn.hits_wait_a_step() {
            // A hit on a state cached this very step is not usable yet:
            // report more than the pool so the request waits a step.
            if let Some(&last) = new_computed.last() {
                if let Some(key) = pool.block_entry(last).map(entry_key) {
                    if self.cached_this_step.contains(&key) {
                        return i64::from(pool.num_blocks()) + 1;
                    }
                }
            }
        }
        if let (Some(m), Some(_)) = (self.attn.mamba(), self.attn.align()) {
            // vLLM (whole-block-hits) leaves out the block it allocates for external
            // (connector) tokens here and then fails to get it from the
            // pool; counting it keeps the answer "None", not a crash.
            let external = self.external_blocks(
                slot,
                new_computed,
                total_computed_tokens,
                num_external_computed_tokens,
            );
            let have = new_computed.len() + self.blocks(slot).len();
            let allocated = self.align_state(slot).is_some_and(|a| a.allocated);
            let checkpoint = self.align_checkpoint(
                slot,
                total_computed_tokens,
                num_tokens_main_model,
                prefill_end,
            );
            return m.align_blocks_to_allocate(
                self.bs(),
                num_tokens_main_model,
                have,
                allocated,
                checkpoint,
                partial,
            ) + evictable(pool, new_computed) as i64
                + external as i64;
        }
        let mut num_required = self.required_blocks(num_tokens, num_tokens_main_model);
        if apply_admission_cap {
            if let Some(cap) = self.spec.admission_cap {
                num_required = num_required.min(cap);
            }
        }
        let num_req_blocks = self.blocks(slot).len();
        if self.is_running(slot) {
            // Draft tokens may have been rejected: the table can be longer
            // than what is required now.
            return num_required.saturating_sub(num_req_blocks) as i64;
        }
        let num_skipped_blocks = self.attn.skipped_tokens(total_computed_tokens) / self.bs();
        let num_local_computed = new_computed.len() + num_req_blocks;
        let num_new = num_required.saturating_sub(num_skipped_blocks.max(num_local_computed));
        let skip_new = num_skipped_blocks
            .saturating_sub(num_req_blocks)
            .min(new_computed.len());
        // Cache hits sitting in the free queue leave it when touched; a
        // partial hit takes one more block for its private copy.
        (num_new + evictable(pool, &new_computed[skip_new..]) + usize::from(partial)) as i64
    }

    /// Blocks `allocate_new_computed_blocks` takes for external tokens.
    fn external_blocks(
        &self,
        slot: ReqSlot,
        new_computed: &[BlockId],
        total: usize,
        external: usize,
    ) -> usize {
        if external == 0 || self.is_running(slot) || !self.attn.is_per_token() {
            return 0;
        }
        let skipped_tokens = self.attn.skipped_tokens(total);
        let skipped = skipped_tokens / self.bs();
        let external = if skipped > 0 {
            external.min(total - skipped_tokens)
        } else {
            external
        };
        if external == 0 {
            return 0;
        }
        let held = self.blocks(slot).len() + skipped + new_computed.len().saturating_sub(skipped);
        cdiv(total, self.bs()).saturating_sub(held)
    }

    /// Adds a new request's cache hits (touched, so they leave the free
    /// queue) after null padding for skipped blocks. Returns how many blocks
    /// its external (connector) tokens still need: the coordinator allocates
    /// those only once every group has touched its hits (see `Coordinator::
    /// allocate_new_computed_blocks`).
    pub fn add_computed_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        new_computed: &[BlockId],
        num_local_computed_tokens: usize,
        num_external_computed_tokens: usize,
    ) -> usize {
        if self.is_running(slot) || !self.attn.is_per_token() {
            return 0;
        }
        if self.attn.fixed_blocks().is_some() {
            // A ring takes no hits and no count of cached blocks; external
            // tokens claim it (vLLM's `allocate_external_computed_blocks`).
            let held = self.blocks(slot).len();
            return if num_external_computed_tokens > 0 {
                self.required_blocks(0, 0).saturating_sub(held)
            } else {
                0
            };
        }
        let total = num_local_computed_tokens + num_external_computed_tokens;
        let skipped_tokens = self.attn.skipped_tokens(total);
        let num_skipped_blocks = skipped_tokens / self.bs();
        let mut external = num_external_computed_tokens;
        let mut computed = new_computed;
        if num_skipped_blocks > 0 {
            computed = &new_computed[num_skipped_blocks.min(new_computed.len())..];
            external = external.min(total - skipped_tokens);
        }
        if self.enable_caching {
            pool.touch(computed);
        }
        let bs = self.bs();
        let r = self.records.with_table(slot);
        r.blocks
            .extend(std::iter::repeat_n(NULL_BLOCK, num_skipped_blocks));
        r.blocks.extend_from_slice(computed);
        let len = r.blocks.len();
        r.num_cached = Some(len);
        self.note_partial_hit(slot, computed, num_local_computed_tokens);
        if external == 0 {
            return 0;
        }
        cdiv(total, bs).saturating_sub(len)
    }

    /// Fresh blocks for external tokens (after `add_computed_blocks`);
    /// `record`: they are recorded for zeroing (when this group records).
    pub fn allocate_external_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        n: usize,
        record: bool,
    ) {
        if n == 0 {
            return;
        }
        let blocks = &mut self.records.with_table(slot).blocks;
        let start = blocks.len();
        pool.get_new_blocks(n, blocks);
        if self.records_new_block_ids && record {
            self.new_block_ids.extend_from_slice(&blocks[start..]);
        }
    }

    /// Grows the table to cover `num_tokens`; appends the new blocks to `out`
    /// (and records them as handed to the worker).
    pub fn allocate_new_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        num_tokens: usize,
        num_tokens_main_model: usize,
        checkpoint: bool,
        out: &mut Vec<BlockId>,
    ) {
        let bs = self.bs();
        if let (Some(m), Some(_)) = (self.attn.mamba(), self.attn.align()) {
            let start = out.len();
            let r = self.records.with_table(slot);
            let partial = self.cow.take_live_partial_hit(slot, &r.blocks);
            let cow = m.allocate_align_blocks(
                pool,
                bs,
                &mut r.blocks,
                &mut r.align,
                num_tokens_main_model,
                self.mamba_rules.allocated_on_any_call(),
                checkpoint,
                partial.is_some(),
                out,
            );
            if let (Some(p), Some(c)) = (partial, cow) {
                self.align_copy_on_write(pool, slot, p, c, start, out);
            }
            let r = self.records.with_table(slot);
            // What the worker received: the whole table on the request's
            // first allocation, the new blocks afterwards.
            match &mut r.worker_view {
                Some(view) => {
                    reserve_table(view, out.len() - start);
                    view.extend_from_slice(&out[start..]);
                }
                None => r.worker_view = Some(r.blocks.clone()),
            }
            return;
        }
        if let Some(p) = self.cow.take_partial_hit(slot) {
            self.copy_on_write(pool, slot, p, out);
        }
        let num_required = self.required_blocks(num_tokens, num_tokens_main_model);
        let blocks = &mut self.records.with_table(slot).blocks;
        if num_required <= blocks.len() {
            return;
        }
        let start = blocks.len();
        pool.get_new_blocks(num_required - start, blocks);
        if self.records_new_block_ids {
            self.new_block_ids.extend_from_slice(&blocks[start..]);
        }
        out.extend_from_slice(&blocks[start..]);
    }

    pub fn take_new_block_ids(&mut self, out: &mut Vec<BlockId>) {
        out.append(&mut self.new_block_ids);
    }

    /// Whether this group records its new block ids (for zeroing).
    pub fn records_new_block_ids(&self) -> bool {
        self.records_new_block_ids
    }

    /// Records the request's blocks from index `from` on again (vLLM's
    /// `record_blocks_for_zeroing`), if this group records new block ids.
    pub fn record_blocks_for_zeroing(&mut self, slot: ReqSlot, from: usize) {
        if !self.records_new_block_ids {
            return;
        }
        if let Some(r) = self.records.get(slot) {
            if let Some(tail) = r.blocks.get(from..) {
                self.new_block_ids.extend_from_slice(tail);
            }
        }
    }

    /// Fixes what follows from the spec, `use_eagle`, the pool's hash
    /// block size and the retention interval (called once they are set).
    /// `any_eagle`: some group drops an EAGLE block.
    pub fn settle(
        &mut self,
        hash_block_size: u32,
        any_eagle: bool,
        retention: Option<(usize, Retention)>,
    ) {
        self.scale = (self.block_size / hash_block_size) as usize;
        if !self.spec.prefix_cacheable {
            // Reads no hash (a ring may be narrower than a hash block).
            self.scale = self.scale.max(1);
        }
        // FullAttentionManager's rule, R-SWA's too (its subclass; circular
        // buffers, another, cache nothing).
        self.partial_tails &= self.enable_caching
            && self.scale > 1
            && matches!(self.attn, Attention::Full | Attention::Rswa(_));
        self.reachable = self.attn.reachable_blocks(
            self.block_size,
            (self.scheduler_block_size, self.alignment_tokens),
            self.use_eagle,
            any_eagle,
            retention,
        );
    }

    /// Mamba align: whether an allocation for the chunk
    /// `query_start..query_end` reserves a prefill checkpoint block, judged
    /// on the table as it is before the call (`Mamba::needs_checkpoint`).
    pub fn align_checkpoint(
        &self,
        slot: ReqSlot,
        query_start: usize,
        query_end: usize,
        prefill_end: usize,
    ) -> bool {
        let (Some(m), Some(_), Some(c)) = (
            self.attn.mamba(),
            self.attn.align(),
            self.spec.mamba_checkpoints,
        ) else {
            return false;
        };
        let allocated = self.align_state(slot).is_some_and(|a| a.allocated);
        m.needs_checkpoint(
            &c,
            self.bs(),
            self.alignment_tokens as usize,
            self.blocks(slot),
            allocated,
            query_start,
            query_end,
            prefill_end,
        )
    }

    pub fn new_step_starts(&mut self) {
        self.cached_this_step.clear();
    }

    /// Whether a hit ending on `new_computed` must wait a step here: its
    /// last block's state was cached in this very step (the rule
    /// `get_num_blocks_to_allocate` applies).
    pub fn hit_waits_a_step(&self, pool: &BlockPool, new_computed: &[BlockId]) -> bool {
        self.attn.hits_wait_a_step()
            && new_computed
                .last()
                .and_then(|&last| pool.block_entry(last).map(entry_key))
                .is_some_and(|key| self.cached_this_step.contains(&key))
    }

    /// Longest prefix of `hashes` cached in every group of `groups`, at most
    /// `max_length` tokens, for a group of `spec`. Fills `out[k]` for `groups[k]`;
    /// returns the hit's tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn find_longest_cache_hit(
        spec: &GroupSpec,
        pool: &BlockPool,
        hashes: ScaledHashes<'_>,
        max_length: usize,
        groups: &[u32],
        drop_eagle_block: bool,
        alignment_tokens: usize,
        out: &mut [Vec<BlockId>],
    ) -> usize {
        for o in out.iter_mut() {
            o.clear();
        }
        let search = HitSearch {
            pool,
            hashes,
            groups,
            block_size: spec.block_size as usize,
            alignment_tokens,
        };
        Attention::from_spec(&spec.kind).find_hit(&search, max_length, drop_eagle_block, out)
    }
}

/// A `cached_this_step` key: a cached block's (prefix-map entry, group).
fn entry_key((entry, group): (u32, u32)) -> u64 {
    u64::from(entry) << 32 | u64::from(group)
}

fn evictable(pool: &BlockPool, blocks: &[BlockId]) -> usize {
    blocks
        .iter()
        .filter(|&&b| pool.ref_cnt(b) == 0 && b != NULL_BLOCK)
        .count()
}

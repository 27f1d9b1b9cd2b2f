//! One manager per KV-cache group: the request -> blocks tables of that group
//! and the attention-type rules (how many blocks a request needs, which
//! blocks a cache hit may use, which blocks can be dropped).
//!
//! One struct serves every attention type; the per-type differences are the
//! `match self.spec.kind` arms and the Mamba align state, so no manager is a
//! copy of another.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};

use smallvec::SmallVec;

use crate::fast_hash::FxBuild;

use crate::block_pool::{reserve_table, BlockPool, NULL_BLOCK};
use crate::hashes::ScaledHashes;
use crate::spec::{GroupSpec, MambaMode, SpecKind};
use crate::{cdiv, BlockId, ReqSlot};

/// The blocks of a sliding-window group that can serve a hit (a hit is
/// scheduler-block aligned and needs the window's last blocks before the
/// boundary); the others are not cached. vLLM's `reachable_block_mask`.
#[derive(Debug, Clone, Copy)]
pub struct ReachableBlocks {
    shift: usize,
    per_segment: usize,
    need: usize,
}

impl ReachableBlocks {
    pub fn keeps(&self, i: usize) -> bool {
        i >= self.shift && (i - self.shift) % self.per_segment >= self.per_segment - self.need
    }
}

/// Largest counts for which a plain decode of a request changes no block
/// (see `SingleTypeManager::decode_horizon`); `usize::MAX`: no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeHorizon {
    /// Computed tokens (after the max_model_len cap).
    pub max_total: usize,
    /// Tokens that need a slot (with lookahead, capped).
    pub max_need_slot: usize,
    /// Computed + new tokens (Mamba align sizes by this).
    pub max_main: usize,
    /// Tokens to cache (only bounds calls that cache).
    pub max_to_cache: usize,
}

impl DecodeHorizon {
    /// Not known (to be recomputed). As bounds it admits no decode: every
    /// decode needs a slot for at least one token.
    pub const UNKNOWN: DecodeHorizon = DecodeHorizon {
        max_total: 0,
        max_need_slot: 0,
        max_main: 0,
        max_to_cache: 0,
    };

    pub const UNBOUNDED: DecodeHorizon = DecodeHorizon {
        max_total: usize::MAX,
        max_need_slot: usize::MAX,
        max_main: usize::MAX,
        max_to_cache: usize::MAX,
    };

    pub fn min(self, o: DecodeHorizon) -> DecodeHorizon {
        DecodeHorizon {
            max_total: self.max_total.min(o.max_total),
            max_need_slot: self.max_need_slot.min(o.max_need_slot),
            max_main: self.max_main.min(o.max_main),
            max_to_cache: self.max_to_cache.min(o.max_to_cache),
        }
    }

    pub fn allows(&self, c: &DecodeCounts) -> bool {
        c.total_computed <= self.max_total
            && c.need_slot <= self.max_need_slot
            && c.main_model <= self.max_main
            && c.to_cache.is_none_or(|t| t <= self.max_to_cache)
    }
}

/// The token counts a plain decode step is sized by (as `allocate_slots`
/// derives them from its arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeCounts {
    /// Computed tokens, capped at max_model_len.
    pub total_computed: usize,
    /// Tokens that need a slot: computed + new + lookahead, capped.
    pub need_slot: usize,
    /// Computed + new tokens (Mamba align sizes by this).
    pub main_model: usize,
    /// Tokens to cache; None when the call caches nothing.
    pub to_cache: Option<usize>,
}

/// Mamba "align" bookkeeping of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlignState {
    /// Index (in the table) of the state block allocated in the previous
    /// step: the source of this step's state copy. Freed two steps later.
    pub last_state_block_idx: Option<usize>,
    /// The request got blocks before (later rounds reuse speculative blocks).
    pub allocated: bool,
}

/// One request's state in one group, kept in one record so a decode reads
/// one place: vLLM's per-request dict entries of the group, each present
/// exactly where vLLM's dict has the request.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupReq {
    /// `req_to_blocks` has an entry (a defaultdict: entries count for
    /// common prefixes); `blocks` is empty without one.
    has_blocks: bool,
    blocks: Vec<BlockId>,
    /// `num_cached_block`: present while the request runs.
    num_cached: Option<usize>,
    /// Mamba align: `last_state_block_idx` / `_allocated_block_reqs`.
    align: Option<AlignState>,
    /// Mamba align: the block ids as the worker holds them (append-only:
    /// the table as first handed out, then every returned new block). The
    /// worker copies states out of ids the manager has since nulled or moved.
    worker_view: Option<Vec<BlockId>>,
    /// Blocks before this index are all null. Ids are only ever nulled or
    /// appended while the request holds its table, so the first real block
    /// only moves right: each search for it starts where the last ended.
    null_prefix: Hint,
}

/// A search hint kept up to date through `&self` (a relaxed atomic: plain
/// loads and stores; the manager is used under Python's GIL anyway).
#[derive(Debug, Default)]
struct Hint(AtomicU32);

impl Clone for Hint {
    fn clone(&self) -> Self {
        Hint(AtomicU32::new(self.get()))
    }
}

impl Hint {
    fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, v: u32) {
        self.0.store(v, Ordering::Relaxed)
    }
}

impl GroupReq {
    fn holds(&self) -> bool {
        self.has_blocks || self.num_cached.is_some() || self.align.is_some()
    }

    /// Index of the table's first real (non-null) block.
    fn first_real(&self) -> Option<usize> {
        let from = (self.null_prefix.get() as usize).min(self.blocks.len());
        let found = first_non_null(&self.blocks[from..]).map(|i| from + i);
        self.null_prefix
            .set(found.unwrap_or(self.blocks.len()) as u32);
        debug_assert_eq!(found, first_non_null(&self.blocks));
        found
    }
}

#[derive(Debug, Clone)]
pub struct SingleTypeManager {
    pub spec: GroupSpec,
    pub group_id: u32,
    pub block_size: u32,
    pub scheduler_block_size: u32,
    /// Whether cache hits of this group drop the EAGLE lookahead block.
    pub use_eagle: bool,
    /// Hashes per block (block_size / hash_block_size), and the blocks a
    /// sliding-window hit can use: fixed once the coordinator has set
    /// `use_eagle` (see `settle`), so a decode computes neither.
    pub(crate) scale: usize,
    reachable: Option<ReachableBlocks>,
    // Per request slot (see `GroupReq`); absent slots hold the default.
    reqs: Vec<GroupReq>,
    // Requests with a `req_to_blocks` entry (vLLM's `len(req_to_blocks)`).
    num_block_entries: usize,
    new_block_ids: Vec<BlockId>,
    enable_caching: bool,
    // Mamba: blocks cached during this step cannot serve hits until the
    // next. vLLM keeps (hash, group) keys; a prefix-map entry stands for
    // its hash: an entry id reused within the step is held only by blocks
    // cached within the step, so `entry_key` marks are exact.
    cached_this_step: HashSet<u64, FxBuild>,
}

impl SingleTypeManager {
    pub fn new(
        spec: GroupSpec,
        group_id: u32,
        enable_caching: bool,
        scheduler_block_size: u32,
    ) -> Self {
        SingleTypeManager {
            block_size: spec.block_size,
            scheduler_block_size,
            spec,
            group_id,
            use_eagle: false,
            scale: 1,
            reachable: None,
            reqs: Vec::new(),
            num_block_entries: 0,
            new_block_ids: Vec::new(),
            enable_caching,
            cached_this_step: HashSet::default(),
        }
    }

    fn req(&self, slot: ReqSlot) -> Option<&GroupReq> {
        self.reqs.get(slot as usize)
    }

    fn req_mut(&mut self, slot: ReqSlot) -> &mut GroupReq {
        record_mut(&mut self.reqs, slot)
    }

    /// The request's record, its `req_to_blocks` entry created if absent
    /// (vLLM's defaultdict access).
    fn with_blocks(&mut self, slot: ReqSlot) -> &mut GroupReq {
        with_table(&mut self.reqs, &mut self.num_block_entries, slot)
    }

    /// The request's table, its entry created if absent.
    fn blocks_entry(&mut self, slot: ReqSlot) -> &mut Vec<BlockId> {
        &mut self.with_blocks(slot).blocks
    }

    /// Records what the worker received from an allocation of a Mamba align
    /// group: the whole table on the request's first allocation, the new
    /// blocks afterwards.
    fn note_handed_out(&mut self, slot: ReqSlot, new_blocks: &[BlockId]) {
        let r = self.req_mut(slot);
        match &mut r.worker_view {
            Some(view) => {
                reserve_table(view, new_blocks.len());
                view.extend_from_slice(new_blocks);
            }
            None => r.worker_view = Some(r.blocks.clone()),
        }
    }

    /// The worker's view of the request's block ids (Mamba align groups).
    pub fn worker_view(&self, slot: ReqSlot) -> Option<&[BlockId]> {
        self.req(slot).and_then(|r| r.worker_view.as_deref())
    }

    pub fn is_mamba_align(&self) -> bool {
        self.is_align()
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

    /// The request's record, if a plain decode of it can be judged from its
    /// table here: it runs (vLLM's `num_cached_block` has it), or, with prefix
    /// caching off (where nothing is cached, so no request ever runs in that
    /// sense), it has a table. A decode that needs no block adds none either
    /// way: vLLM's count for a request that does not run, max(required -
    /// max(skipped, held), 0), is 0 whenever required <= held.
    fn decodes_known(&self, slot: ReqSlot) -> Option<&GroupReq> {
        self.req(slot)
            .filter(|r| r.num_cached.is_some() || (!self.enable_caching && r.has_blocks))
    }

    pub fn num_cached_blocks(&self, slot: ReqSlot) -> usize {
        self.req(slot).and_then(|r| r.num_cached).unwrap_or(0)
    }

    pub fn align_state(&self, slot: ReqSlot) -> Option<AlignState> {
        self.req(slot).and_then(|r| r.align)
    }

    fn mamba(&self) -> Option<(MambaMode, usize)> {
        match self.spec.kind {
            SpecKind::Mamba {
                mode,
                num_speculative_blocks,
            } => Some((mode, num_speculative_blocks as usize)),
            _ => None,
        }
    }

    fn is_align(&self) -> bool {
        matches!(self.mamba(), Some((MambaMode::Align, _)))
    }

    /// Tokens before this count are outside the attention window.
    fn num_skipped_tokens(&self, n: usize) -> usize {
        match self.spec.kind {
            SpecKind::FullAttention | SpecKind::CrossAttention => 0,
            SpecKind::SlidingWindow { window } => (n + 1).saturating_sub(window as usize),
            SpecKind::ChunkedLocal { chunk } => n / chunk as usize * chunk as usize,
            // Mamba needs only the state after the last computed token.
            SpecKind::Mamba { .. } => n.saturating_sub(1),
        }
    }

    pub fn get_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: ReqSlot,
        num_tokens: usize,
        new_computed: &[BlockId],
        total_computed_tokens: usize,
        num_external_computed_tokens: usize,
        num_tokens_main_model: usize,
        apply_admission_cap: bool,
    ) -> i64 {
        let mut num_tokens = num_tokens;
        if let Some((mode, num_spec)) = self.mamba() {
            // A hit on a state cached this very step is not usable yet:
            // report more than the pool so the request waits a step.
            if let Some(&last) = new_computed.last() {
                if let Some(key) = pool.block_entry(last).map(entry_key) {
                    if self.cached_this_step.contains(&key) {
                        return i64::from(pool.num_blocks()) + 1;
                    }
                }
            }
            if mode == MambaMode::Align {
                // vLLM 0.23.0 leaves out the block it allocates for external
                // (connector) tokens here and then fails to get it from the
                // pool; counting it keeps the answer "None", not a crash.
                let external = self.external_blocks(
                    slot,
                    new_computed,
                    total_computed_tokens,
                    num_external_computed_tokens,
                );
                return self.align_blocks_to_allocate(
                    pool,
                    slot,
                    new_computed,
                    num_tokens_main_model,
                    num_spec,
                ) + external as i64;
            }
            num_tokens += self.block_size as usize * num_spec;
        }
        let mut num_required = cdiv(num_tokens, self.block_size as usize);
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
        let num_skipped_blocks =
            self.num_skipped_tokens(total_computed_tokens) / self.block_size as usize;
        let num_local_computed = new_computed.len() + num_req_blocks;
        let num_new = num_required.saturating_sub(num_skipped_blocks.max(num_local_computed));
        let skip_new = num_skipped_blocks
            .saturating_sub(num_req_blocks)
            .min(new_computed.len());
        // Cache hits sitting in the free queue leave it when touched.
        (num_new + evictable(pool, &new_computed[skip_new..])) as i64
    }

    /// Blocks `allocate_new_computed_blocks` takes for external tokens.
    fn external_blocks(
        &self,
        slot: ReqSlot,
        new_computed: &[BlockId],
        total: usize,
        external: usize,
    ) -> usize {
        if external == 0 || self.is_running(slot) || self.spec.kind == SpecKind::CrossAttention {
            return 0;
        }
        let skipped_tokens = self.num_skipped_tokens(total);
        let skipped = skipped_tokens / self.block_size as usize;
        let external = if skipped > 0 {
            external.min(total - skipped_tokens)
        } else {
            external
        };
        if external == 0 {
            return 0;
        }
        let held = self.blocks(slot).len() + skipped + new_computed.len().saturating_sub(skipped);
        cdiv(total, self.block_size as usize).saturating_sub(held)
    }

    fn align_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: ReqSlot,
        new_computed: &[BlockId],
        num_tokens_main_model: usize,
        num_spec: usize,
    ) -> i64 {
        // Lookahead tokens are ignored: they would break the alignment.
        let num_required =
            (cdiv(num_tokens_main_model, self.block_size as usize) + num_spec) as i64;
        let have = (new_computed.len() + self.blocks(slot).len()) as i64;
        // Negative when drafts shrank (vLLM sums it as is with other groups).
        let mut num_new = num_required - have;
        if num_new > 0 {
            // Later rounds reuse the speculative blocks: one new state block.
            let allocated = self.align_state(slot).is_some_and(|a| a.allocated);
            num_new = if allocated { 1 } else { 1 + num_spec as i64 };
        }
        num_new + evictable(pool, new_computed) as i64
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
        if self.is_running(slot) || self.spec.kind == SpecKind::CrossAttention {
            return 0;
        }
        let total = num_local_computed_tokens + num_external_computed_tokens;
        let skipped_tokens = self.num_skipped_tokens(total);
        let num_skipped_blocks = skipped_tokens / self.block_size as usize;
        let mut external = num_external_computed_tokens;
        let mut computed = new_computed;
        if num_skipped_blocks > 0 {
            computed = &new_computed[num_skipped_blocks.min(new_computed.len())..];
            external = external.min(total - skipped_tokens);
        }
        if self.enable_caching {
            pool.touch(computed);
        }
        let r = self.with_blocks(slot);
        r.blocks
            .extend(std::iter::repeat_n(NULL_BLOCK, num_skipped_blocks));
        r.blocks.extend_from_slice(computed);
        let len = r.blocks.len();
        r.num_cached = Some(len);
        if external == 0 {
            return 0;
        }
        cdiv(total, self.block_size as usize).saturating_sub(len)
    }

    /// Fresh blocks for external tokens (after `add_computed_blocks`).
    pub fn allocate_external_blocks(&mut self, pool: &mut BlockPool, slot: ReqSlot, n: usize) {
        if n == 0 {
            return;
        }
        let blocks = &mut with_table(&mut self.reqs, &mut self.num_block_entries, slot).blocks;
        let start = blocks.len();
        pool.get_new_blocks(n, blocks);
        if self.spec.reports_new_block_ids {
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
        out: &mut Vec<BlockId>,
    ) {
        let mut num_tokens = num_tokens;
        if let Some((mode, num_spec)) = self.mamba() {
            if mode == MambaMode::Align {
                let start = out.len();
                self.allocate_align_blocks(pool, slot, num_tokens_main_model, num_spec, out);
                self.note_handed_out(slot, &out[start..]);
                return;
            }
            num_tokens += self.block_size as usize * num_spec;
        }
        let num_required = cdiv(num_tokens, self.block_size as usize);
        let blocks = &mut with_table(&mut self.reqs, &mut self.num_block_entries, slot).blocks;
        if num_required <= blocks.len() {
            return;
        }
        let start = blocks.len();
        pool.get_new_blocks(num_required - start, blocks);
        if self.spec.reports_new_block_ids {
            self.new_block_ids.extend_from_slice(&blocks[start..]);
        }
        out.extend_from_slice(&blocks[start..]);
    }

    /// Mamba align: the running state moves to a fresh block each time the
    /// request enters a new block; skipped positions hold the null block and
    /// the speculative blocks of the previous round move forward for reuse.
    /// A shrinking draft count (vLLM #39271) simply needs nothing new.
    fn allocate_align_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        num_tokens_main_model: usize,
        num_spec: usize,
        out: &mut Vec<BlockId>,
    ) {
        let num_required = cdiv(num_tokens_main_model, self.block_size as usize) + num_spec;
        let r = self.with_blocks(slot);
        if num_required <= r.blocks.len() {
            return;
        }
        let blocks = &mut r.blocks;
        let prev_len = blocks.len();
        let state = r.align.get_or_insert_default();
        if state.allocated {
            // The running state sits at the last (1 + num_spec)-th block.
            state.last_state_block_idx = prev_len.checked_sub(1 + num_spec);
        } else if prev_len > 0 {
            // A new request that hit the cache: its last block holds the hit state.
            state.last_state_block_idx = Some(prev_len - 1);
        }
        reserve_table(blocks, num_required - prev_len);
        let num_skipped = num_required - num_spec - 1;
        if prev_len < num_skipped {
            blocks.resize(num_skipped, NULL_BLOCK);
        }
        if state.allocated {
            for idx in prev_len.saturating_sub(num_spec)..prev_len {
                if idx >= num_skipped {
                    break;
                }
                let b = std::mem::replace(&mut blocks[idx], NULL_BLOCK);
                blocks.push(b);
            }
        }
        let num_new = num_required.saturating_sub(blocks.len());
        pool.get_new_blocks(num_new, blocks);
        state.allocated = true;
        out.extend_from_slice(&blocks[prev_len..]);
    }

    pub fn take_new_block_ids(&mut self, out: &mut Vec<BlockId>) {
        out.append(&mut self.new_block_ids);
    }

    /// Hashes (at hash_block_size) that caching up to `num_tokens` reads,
    /// given `num_cached` blocks already cached.
    pub fn hashes_needed_to_cache(
        &self,
        num_cached: usize,
        num_tokens: usize,
        scale: usize,
    ) -> usize {
        let num_full = num_tokens / self.block_size as usize;
        if num_cached >= num_full {
            0
        } else {
            num_full * scale
        }
    }

    /// Cached-block count once `allocate_new_computed_blocks` has run (for
    /// checking arguments before anything changes).
    pub fn num_cached_after_computed(
        &self,
        slot: ReqSlot,
        num_new_computed: usize,
        total_computed: usize,
    ) -> usize {
        if self.is_running(slot) {
            return self.num_cached_blocks(slot);
        }
        if self.spec.kind == SpecKind::CrossAttention {
            return 0;
        }
        let skipped = self.num_skipped_tokens(total_computed) / self.block_size as usize;
        skipped.max(num_new_computed)
    }

    /// Fixes what follows from the spec, `use_eagle` and the pool's hash
    /// block size (called once they are set).
    pub(crate) fn settle(&mut self, hash_block_size: u32) {
        self.scale = (self.block_size / hash_block_size) as usize;
        self.reachable = self.compute_reachable_blocks();
    }

    /// Which blocks a sliding-window hit can ever use at an aligned prefix
    /// length; None: all.
    fn compute_reachable_blocks(&self) -> Option<ReachableBlocks> {
        let SpecKind::SlidingWindow { window } = self.spec.kind else {
            return None;
        };
        let need = contiguous_blocks_for_hit(window, self.block_size, self.use_eagle);
        let per_segment = (self.scheduler_block_size / self.block_size) as usize;
        (need < per_segment).then_some(ReachableBlocks {
            shift: usize::from(self.use_eagle),
            per_segment,
            need,
        })
    }

    pub fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        hashes: ScaledHashes<'_>,
        num_tokens: usize,
    ) {
        let num_cached = self.num_cached_blocks(slot);
        let num_full = num_tokens / self.block_size as usize;
        if num_cached >= num_full {
            return;
        }
        let (reachable, block_size, group_id) = (self.reachable, self.block_size, self.group_id);
        let is_mamba = self.mamba().is_some();
        let r = with_table(&mut self.reqs, &mut self.num_block_entries, slot);
        r.num_cached = Some(num_full);
        let blocks = &r.blocks;
        pool.cache_full_blocks(
            blocks,
            num_cached,
            num_full,
            block_size,
            group_id,
            reachable,
            |i| hashes.get(i),
        );
        if is_mamba {
            let end = num_full.min(blocks.len());
            for &b in &blocks[num_cached.min(end)..end] {
                if let Some(key) = pool.block_entry(b).map(entry_key) {
                    self.cached_this_step.insert(key);
                }
            }
        }
    }

    /// Frees the request's blocks, tail first so tails are evicted first.
    pub fn free(&mut self, pool: &mut BlockPool, slot: ReqSlot) {
        let window = matches!(self.spec.kind, SpecKind::SlidingWindow { .. });
        let Some(r) = self.reqs.get_mut(slot as usize) else {
            return;
        };
        r.align = None;
        r.worker_view = None;
        r.num_cached = None;
        if std::mem::take(&mut r.has_blocks) {
            self.num_block_entries -= 1;
            // The table's buffer stays with the slot for its next request.
            let blocks = &mut r.blocks;
            if window {
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

    /// The `req_to_blocks` entry vLLM's full attention makes for a common
    /// prefix question (false: other kinds make none).
    pub(crate) fn note_common_prefix_entry(&mut self, slot: ReqSlot) -> bool {
        if self.spec.kind != SpecKind::FullAttention {
            return false;
        }
        self.with_blocks(slot);
        true
    }

    /// Leading blocks held by every request that has an entry in this group.
    pub fn get_num_common_prefix_blocks(
        &mut self,
        pool: &BlockPool,
        slot: ReqSlot,
        ghosts: usize,
    ) -> usize {
        if !self.note_common_prefix_entry(slot) {
            // Null-padded tables (and per-request states) share nothing usable.
            return 0;
        }
        let holders = (self.num_block_entries + ghosts) as i64;
        self.blocks(slot)
            .iter()
            .take_while(|&&b| i64::from(pool.ref_cnt(b)) == holders)
            .count()
    }

    /// Whether a plain decode step (no computed blocks, no external or
    /// encoder tokens) changes nothing in this group: no block leaves the
    /// window, none is allocated, none is cached. Mirrors
    /// `remove_skipped_blocks`, `allocate_new_blocks` and `cache_blocks`;
    /// false sends the call the general way.
    pub fn decode_is_noop(&self, slot: ReqSlot, c: &DecodeCounts) -> bool {
        let Some(r) = self.decodes_known(slot) else {
            return false;
        };
        let bs = self.block_size as usize;
        let blocks = r.blocks.as_slice();
        let window_noop = |total: usize| {
            let n = (self.num_skipped_tokens(total) / bs).min(blocks.len());
            n == 0 || blocks[n - 1] == NULL_BLOCK
        };
        let num_required = match self.spec.kind {
            SpecKind::FullAttention => cdiv(c.need_slot, bs),
            SpecKind::SlidingWindow { .. } | SpecKind::ChunkedLocal { .. } => {
                if !window_noop(c.total_computed) {
                    return false;
                }
                cdiv(c.need_slot, bs)
            }
            SpecKind::Mamba {
                mode,
                num_speculative_blocks,
            } => {
                let num_spec = num_speculative_blocks as usize;
                let total = c.total_computed.saturating_sub(num_spec);
                if !window_noop(total) {
                    return false;
                }
                if mode == MambaMode::Align {
                    if r.worker_view.is_none() {
                        return false;
                    }
                    let old_state = r.align.and_then(|a| a.last_state_block_idx);
                    if let Some(idx) = old_state {
                        let live = blocks.get(idx).is_some_and(|&b| b != NULL_BLOCK);
                        if idx + 1 < cdiv(total, bs) && live {
                            return false;
                        }
                    }
                    cdiv(c.main_model, bs) + num_spec
                } else {
                    cdiv(c.need_slot + bs * num_spec, bs)
                }
            }
            SpecKind::CrossAttention => return false,
        };
        if num_required > blocks.len() {
            return false;
        }
        c.to_cache
            .is_none_or(|t| t / bs <= r.num_cached.unwrap_or(0))
    }

    /// A plain decode's first phase in this group, for a request running
    /// here: frees what left the window (`remove_skipped_blocks`) and
    /// returns the blocks the group needs (`get_num_blocks_to_allocate`'s
    /// running-request arm, without computed blocks). Only those arms run,
    /// so the common decode that changes blocks keeps to little code.
    pub fn plain_decode_need(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        c: &DecodeCounts,
    ) -> i64 {
        let bs = self.block_size as usize;
        let mut num_tokens = c.need_slot;
        match self.spec.kind {
            // Nothing leaves a full-attention window.
            SpecKind::FullAttention => {}
            SpecKind::Mamba {
                mode: MambaMode::Align,
                num_speculative_blocks,
            } => {
                self.remove_skipped_blocks(pool, slot, c.total_computed);
                let num_spec = num_speculative_blocks as usize;
                return self.align_blocks_to_allocate(pool, slot, &[], c.main_model, num_spec);
            }
            SpecKind::Mamba {
                num_speculative_blocks,
                ..
            } => {
                self.remove_skipped_blocks(pool, slot, c.total_computed);
                num_tokens += bs * num_speculative_blocks as usize;
            }
            _ => self.remove_skipped_blocks(pool, slot, c.total_computed),
        }
        cdiv(num_tokens, bs).saturating_sub(self.blocks(slot).len()) as i64
    }

    /// Bounds within which a plain decode changes nothing in this group
    /// (a sound summary of `decode_is_noop`, cached per request so the
    /// common decode costs a few compares). Caching is bounded by the
    /// coordinator, from `num_cached_blocks`. None: no such summary.
    pub fn decode_horizon(&self, slot: ReqSlot) -> Option<DecodeHorizon> {
        let r = self.decodes_known(slot)?;
        let bs = self.block_size as usize;
        let blocks = r.blocks.as_slice();
        let len = blocks.len();
        // Blocks before the first real one are null: a window ending there
        // frees nothing (`remove_window_blocks` stops at a null block).
        let first_real = || r.first_real();
        let mut h = DecodeHorizon::UNBOUNDED;
        match self.spec.kind {
            SpecKind::FullAttention => h.max_need_slot = len * bs,
            SpecKind::SlidingWindow { window } => {
                if let Some(j) = first_real() {
                    // skipped = total + 1 - window < (j + 1) * bs
                    h.max_total = (j + 1) * bs + window as usize - 2;
                }
                h.max_need_slot = len * bs;
            }
            SpecKind::ChunkedLocal { chunk } => {
                if let Some(j) = first_real() {
                    let chunk = chunk as usize;
                    h.max_total = cdiv((j + 1) * bs, chunk) * chunk - 1;
                }
                h.max_need_slot = len * bs;
            }
            SpecKind::Mamba {
                mode,
                num_speculative_blocks,
            } => {
                let num_spec = num_speculative_blocks as usize;
                let room = len.checked_sub(num_spec)? * bs;
                // The window and the old state apply to total - num_spec.
                if let Some(j) = first_real() {
                    h.max_total = (j + 1) * bs + num_spec;
                }
                if mode == MambaMode::Align {
                    r.worker_view.as_ref()?;
                    let old_state = r.align.and_then(|a| a.last_state_block_idx);
                    let live = |i: &usize| blocks.get(*i).is_some_and(|&b| b != NULL_BLOCK);
                    if let Some(idx) = old_state.filter(live) {
                        h.max_total = h.max_total.min((idx + 1) * bs + num_spec);
                    }
                    h.max_main = room;
                } else {
                    h.max_need_slot = room;
                }
            }
            SpecKind::CrossAttention => return None,
        }
        Some(h)
    }

    /// Frees blocks that fall outside the attention window, replacing them
    /// with the null block.
    pub fn remove_skipped_blocks(&mut self, pool: &mut BlockPool, slot: ReqSlot, total: usize) {
        let mut total = total;
        if let Some((_, num_spec)) = self.mamba() {
            // With async scheduling `total` may count drafts that get
            // rejected; assume they all are (vLLM subtracts the block count).
            total = total.saturating_sub(num_spec);
        }
        self.remove_window_blocks(pool, slot, total);
        if self.is_align() {
            self.free_old_state_block(pool, slot, total);
        }
    }

    fn remove_window_blocks(&mut self, pool: &mut BlockPool, slot: ReqSlot, total: usize) {
        let skipped = self.num_skipped_tokens(total);
        if skipped == 0 {
            return;
        }
        let n = skipped / self.block_size as usize;
        let blocks = self.blocks_entry(slot);
        let n = n.min(blocks.len());
        let mut removed_cached: SmallVec<[BlockId; 8]> = SmallVec::new();
        let mut removed_uncached: SmallVec<[BlockId; 8]> = SmallVec::new();
        for i in (0..n).rev() {
            let b = blocks[i];
            if b == NULL_BLOCK {
                // Earlier calls already nulled everything before it.
                break;
            }
            if pool.block_hash(b).is_none() {
                removed_uncached.push(b);
            } else {
                removed_cached.push(b);
            }
            blocks[i] = NULL_BLOCK;
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
        if idx + 1 >= cdiv(total, self.block_size as usize) {
            return;
        }
        let blocks = self.blocks_entry(slot);
        if blocks[idx] != NULL_BLOCK {
            pool.free_blocks([blocks[idx]].iter().copied(), false);
            blocks[idx] = NULL_BLOCK;
        }
    }

    pub fn new_step_starts(&mut self) {
        self.cached_this_step.clear();
    }

    /// Longest prefix of `hashes` cached in every group of `groups`, at most
    /// `max_length` tokens, for a group of `spec`. Fills `out[k]` for `groups[k]`.
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
    ) {
        for o in out.iter_mut() {
            o.clear();
        }
        let hit = HitSearch {
            pool,
            hashes,
            groups,
            block_size: spec.block_size as usize,
            alignment_tokens,
        };
        match spec.kind {
            SpecKind::FullAttention => hit.full(max_length, drop_eagle_block, out),
            SpecKind::SlidingWindow { window } => {
                hit.sliding_window(window, max_length, drop_eagle_block, out)
            }
            SpecKind::ChunkedLocal { chunk } => hit.chunked_local(chunk as usize, max_length, out),
            SpecKind::Mamba { .. } => hit.mamba(max_length, out),
            SpecKind::CrossAttention => {}
        }
    }

    /// Running slots and whether each has a table, for invariant checks.
    pub(crate) fn running_slots(&self) -> impl Iterator<Item = (ReqSlot, bool)> + '_ {
        self.reqs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.num_cached.is_some())
            .map(|(s, r)| (s as ReqSlot, r.has_blocks))
    }

    /// Slots with Mamba align state, for invariant checks.
    pub(crate) fn align_states(&self) -> impl Iterator<Item = (ReqSlot, AlignState)> + '_ {
        self.reqs
            .iter()
            .enumerate()
            .filter_map(|(s, r)| r.align.map(|a| (s as ReqSlot, a)))
    }

    /// The records agree with the entry count, and a slot without a table
    /// keeps no ids.
    pub(crate) fn check_records(&self) -> Result<(), String> {
        let with_tables = self.reqs.iter().filter(|r| r.has_blocks).count();
        if with_tables != self.num_block_entries {
            return Err(format!(
                "{with_tables} tables but {} counted",
                self.num_block_entries
            ));
        }
        match self
            .reqs
            .iter()
            .position(|r| !r.has_blocks && !r.blocks.is_empty())
        {
            Some(s) => Err(format!("slot {s} keeps block ids without a table")),
            None => Ok(()),
        }
    }

    /// Slots and tables, for invariant checks.
    pub fn tables(&self) -> impl Iterator<Item = (ReqSlot, &[BlockId])> + '_ {
        self.reqs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.has_blocks)
            .map(|(s, r)| (s as ReqSlot, r.blocks.as_slice()))
    }
}

/// `SingleTypeManager::with_blocks` over its fields, so the caller can
/// use the others meanwhile.
fn with_table<'a>(
    reqs: &'a mut Vec<GroupReq>,
    num_block_entries: &mut usize,
    slot: ReqSlot,
) -> &'a mut GroupReq {
    let r = record_mut(reqs, slot);
    if !r.has_blocks {
        r.has_blocks = true;
        *num_block_entries += 1;
    }
    r
}

/// The record of `slot`, the table grown to hold it.
fn record_mut(reqs: &mut Vec<GroupReq>, slot: ReqSlot) -> &mut GroupReq {
    let i = slot as usize;
    if i >= reqs.len() {
        reqs.resize_with(i + 1, GroupReq::default);
    }
    &mut reqs[i]
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

/// Blocks in a row a sliding-window hit needs (one more to drop for EAGLE).
fn contiguous_blocks_for_hit(window: u32, block_size: u32, use_eagle: bool) -> usize {
    cdiv(window as usize - 1, block_size as usize) + usize::from(use_eagle)
}

/// The cache-hit searches of each attention type.
struct HitSearch<'a> {
    pool: &'a BlockPool,
    hashes: ScaledHashes<'a>,
    groups: &'a [u32],
    block_size: usize,
    alignment_tokens: usize,
}

impl HitSearch<'_> {
    fn lookup(&self, i: usize, hit: &mut Vec<BlockId>) -> bool {
        i < self.hashes.len()
            && self
                .pool
                .get_cached_block(&self.hashes.get(i), self.groups, hit)
    }

    fn pop_all(out: &mut [Vec<BlockId>]) {
        out.iter_mut().for_each(|o| {
            o.pop();
        });
    }

    fn pop_to_alignment(&self, out: &mut [Vec<BlockId>]) {
        while self.block_size != self.alignment_tokens
            && out[0].len() * self.block_size % self.alignment_tokens != 0
        {
            Self::pop_all(out);
        }
    }

    /// Left to right; hashes form a chain, so the first miss ends the hit.
    fn full(&self, max_length: usize, drop_eagle: bool, out: &mut [Vec<BlockId>]) {
        let mut hit = Vec::with_capacity(self.groups.len());
        for i in 0..max_length / self.block_size {
            if !self.lookup(i, &mut hit) {
                break;
            }
            for (o, &b) in out.iter_mut().zip(&hit) {
                o.push(b);
            }
        }
        if drop_eagle && !out[0].is_empty() {
            Self::pop_all(out);
        }
        self.pop_to_alignment(out);
    }

    /// Right to left: the first run of blocks covering the window wins;
    /// everything before it is the null block.
    fn sliding_window(
        &self,
        window: u32,
        max_length: usize,
        drop_eagle: bool,
        out: &mut [Vec<BlockId>],
    ) {
        let need = contiguous_blocks_for_hit(window, self.block_size as u32, drop_eagle);
        let max_blocks = max_length / self.block_size;
        for o in out.iter_mut() {
            o.resize(max_blocks, NULL_BLOCK);
        }
        let mut hit = Vec::with_capacity(self.groups.len());
        let mut run = 0;
        let mut found = false;
        for i in (0..max_blocks).rev() {
            if !self.lookup(i, &mut hit) {
                run = 0;
                continue;
            }
            if run == 0 && self.block_size != self.alignment_tokens {
                let after_pop = if drop_eagle { i } else { i + 1 };
                if after_pop * self.block_size % self.alignment_tokens != 0 {
                    continue;
                }
            }
            for (o, &b) in out.iter_mut().zip(&hit) {
                o[i] = b;
            }
            run += 1;
            if run >= need {
                out.iter_mut().for_each(|o| o.truncate(i + run));
                found = true;
                break;
            }
        }
        if !found {
            // A run reaching block 0 is a hit even if shorter than the window.
            out.iter_mut().for_each(|o| o.truncate(run));
            self.pop_to_alignment(out);
        }
        if drop_eagle && !out[0].is_empty() {
            Self::pop_all(out);
            self.pop_to_alignment(out);
        }
    }

    /// Blocks before the current chunk count as computed (null); inside it,
    /// left to right.
    fn chunked_local(&self, chunk: usize, max_length: usize, out: &mut [Vec<BlockId>]) {
        let max_blocks = max_length / self.block_size;
        let start_block = max_length / chunk * chunk / self.block_size;
        for o in out.iter_mut() {
            o.resize(start_block, NULL_BLOCK);
        }
        let mut hit = Vec::with_capacity(self.groups.len());
        for i in start_block..max_blocks {
            if !self.lookup(i, &mut hit) {
                break;
            }
            for (o, &b) in out.iter_mut().zip(&hit) {
                o.push(b);
            }
        }
    }

    /// Only the last aligned cached state matters: right to left, first hit.
    fn mamba(&self, max_length: usize, out: &mut [Vec<BlockId>]) {
        let mut hit = Vec::with_capacity(self.groups.len());
        for i in (0..max_length / self.block_size).rev() {
            if !self.lookup(i, &mut hit) {
                continue;
            }
            if self.block_size != self.alignment_tokens
                && (i + 1) * self.block_size % self.alignment_tokens != 0
            {
                continue;
            }
            for (o, &b) in out.iter_mut().zip(&hit) {
                o.resize(i, NULL_BLOCK);
                o.push(b);
            }
            break;
        }
    }
}

/// Index of the first non-null block. Window tables are long null runs
/// followed by a few live blocks, so the scan goes eight ids at a time
/// (an OR over a fixed chunk the compiler vectorizes).
fn first_non_null(blocks: &[BlockId]) -> Option<usize> {
    let mut chunks = blocks.chunks_exact(8);
    let mut base = 0;
    for c in chunks.by_ref() {
        if c.iter().fold(0, |acc, &b| acc | b) != NULL_BLOCK {
            break;
        }
        base += 8;
    }
    blocks[base..]
        .iter()
        .position(|&b| b != NULL_BLOCK)
        .map(|i| base + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_real_resumes_where_the_last_search_ended() {
        let mut r = GroupReq {
            has_blocks: true,
            blocks: vec![0, 0, 0, 5, 6],
            ..Default::default()
        };
        assert_eq!(r.first_real(), Some(3));
        assert_eq!(r.null_prefix.get(), 3);
        r.blocks[3] = NULL_BLOCK; // left the window
        assert_eq!(r.first_real(), Some(4));
        r.blocks[4] = NULL_BLOCK;
        assert_eq!(r.first_real(), None);
        assert_eq!(r.null_prefix.get(), 5);
        r.blocks.push(9);
        assert_eq!(r.first_real(), Some(5));
    }

    #[test]
    fn first_non_null_finds_the_first_live_block() {
        assert_eq!(first_non_null(&[]), None);
        assert_eq!(first_non_null(&[0; 20]), None);
        for at in [0, 3, 7, 8, 15, 16, 19] {
            let mut t = vec![0; 20];
            t[at] = 5;
            t[19] = 9;
            assert_eq!(first_non_null(&t), Some(at), "live block at {at}");
        }
    }
}

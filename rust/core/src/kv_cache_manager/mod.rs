//! `KvCacheManager`: vLLM's `KVCacheManager` over plain ids and counts,
//! under a behaviour profile (`ManagerConfig::profile`).
//! The facade reads the request object and passes its numbers; this type
//! owns every decision. Arguments are checked before anything changes.

mod admission_check;
mod allocate;
mod batch;
mod caching;
mod cow_copies;
mod decode;
mod deferred_free;
mod hash_sync;
mod invariants;
mod mamba_cache;
mod mamba_copies;
mod stats;

pub use batch::{BatchResult, BatchScratch, DecodeBatch};
pub use stats::LookupStats;

use crate::attention::RetentionMarks;
use crate::block_pool::BlockPool;
use crate::coordinator::{CacheHit, Coordinator};
use crate::decode_bounds::DecodeHorizon;
use crate::error::{invalid, CoreError, CoreResult};
use crate::events::{BlockMetric, PoolEvent};
use crate::hashes::HashList;
use crate::mamba_plan::PlannerState;
use crate::profile::BehaviourProfile;
use crate::requests::RequestRegistry;
use crate::spec::GroupSpec;
use crate::{BlockId, ReqSlot};

#[derive(Debug, Clone)]
pub struct ManagerConfig {
    pub num_blocks: u32,
    pub groups: Vec<GroupSpec>,
    pub max_model_len: usize,
    pub scheduler_block_size: u32,
    pub hash_block_size: u32,
    pub enable_caching: bool,
    pub use_eagle: bool,
    pub enable_events: bool,
    /// Decode / prefill context parallelism (vLLM's `dcp_world_size`,
    /// `pcp_world_size`; 1 = off): each block holds their product times
    /// the spec's tokens (see `Coordinator::new`).
    pub dcp_world_size: u32,
    pub pcp_world_size: u32,
    /// Sparse retention of what is cached (vLLM's
    /// `VLLM_PREFIX_CACHE_RETENTION_INTERVAL`): None dense; 0 only the
    /// prompt's replay boundary; N (a multiple of `scheduler_block_size`)
    /// one hit's blocks per N tokens and the replay boundary. Which groups
    /// it sparsifies is the profile's `retention`.
    pub retention_interval: Option<usize>,
    /// The behaviour the manager follows (`BehaviourProfile::NAMED`).
    pub profile: BehaviourProfile,
}

/// "No new computed blocks" for up to 32 groups, without allocating.
static NO_BLOCKS: [Vec<BlockId>; 32] = [const { Vec::new() }; 32];

/// `allocate_slots` arguments, vLLM's names; request fields are passed as
/// `num_computed_tokens` / `num_tokens`.
#[derive(Debug, Clone, Default)]
pub struct AllocateArgs<'a> {
    pub num_new_tokens: usize,
    pub num_computed_tokens: usize,
    pub num_tokens: usize,
    pub num_new_computed_tokens: usize,
    /// `None` stands for vLLM's `None` or its shared empty `KVCacheBlocks`.
    pub new_computed_blocks: Option<&'a [Vec<BlockId>]>,
    pub num_lookahead_tokens: usize,
    pub num_external_computed_tokens: usize,
    pub delay_cache_blocks: bool,
    pub num_encoder_tokens: usize,
    pub full_sequence_must_fit: bool,
    pub reserved_blocks: usize,
    /// Free blocks to keep beyond the allocation when admitting a waiting
    /// request (vLLM's watermark; the caller decides when it applies).
    pub watermark_blocks: usize,
    /// `request.num_prompt_tokens`, kept for the request's lifetime; pass
    /// it when `wants_num_prompt_tokens` (None otherwise: nothing changes).
    pub num_prompt_tokens: Option<usize>,
    /// `request.shared_prefix_boundary` (partial-block-hits), kept until the
    /// next call passes it; pass it when `wants_shared_prefix_boundary`.
    pub shared_prefix_boundary: Option<usize>,
    /// `request.num_in_flight_tokens` (`frees_on_processed_tokens`: window frees stop that far
    /// below the computed tokens); pass it when `wants_num_in_flight_tokens`.
    pub num_in_flight_tokens: usize,
    /// Groups (bit i: group i) whose external-token blocks an async load
    /// writes, so they are not recorded for zeroing (vLLM's
    /// `skip_zeroing_group_ids`).
    pub skip_zeroing_groups: u64,
}

impl AllocateArgs<'_> {
    /// No computed blocks, external or encoder tokens, and no
    /// full-sequence check: the call a running request makes each step.
    pub fn is_plain(&self) -> bool {
        self.new_computed_blocks.is_none()
            && self.num_new_computed_tokens == 0
            && self.num_external_computed_tokens == 0
            && self.num_encoder_tokens == 0
            && !self.full_sequence_must_fit
            && self.num_in_flight_tokens == 0
    }
}

#[derive(Debug, Clone)]
pub struct KvCacheManager {
    coord: Coordinator,
    /// Lookup counters since the last `take_stats`.
    stats: LookupStats,
    /// Lookups are counted (vLLM's `log_stats`).
    log_stats: bool,
    // Mamba align worker-side state for copy plans.
    planner: PlannerState,
    max_model_len: usize,
    enable_caching: bool,
    profile: BehaviourProfile,
    // Some group is Mamba align (the copy planner tracks requests then).
    has_align_groups: bool,
    reqs: RequestRegistry,
    /// Ids vLLM's `req_to_blocks` (a defaultdict) holds an empty entry for
    /// after `get_num_common_prefix_blocks` asked about them, where this
    /// manager keeps no record (see `admission_check::ghost_entry`).
    ghost_entries: Vec<String>,
    /// Some group sizes a request's table from its computed tokens (see
    /// `admission_check::check_computed_held`).
    sizes_from_computed: bool,
    /// Blocks `pop_blocks_for_free` handed out, still referenced.
    handed_out: deferred_free::HandedOut,
    /// Caching places a replay boundary, from each request's prompt length
    /// (sparse retention with caching on).
    reads_prompt_len: bool,
    /// Caching also keeps the request's shared-prefix junction (the
    /// `ReplayBoundaries` retention rule, caching on).
    reads_junction: bool,
    /// Caching reads each request's own computed count (the Mamba
    /// shared-prefix checkpoint, `set_shared_prefix_checkpoint`).
    reads_request_computed: bool,
    /// Window frees lag the in-flight tokens (`frees_on_processed_tokens`, a group with a window).
    reads_in_flight: bool,
    /// Window frees read the prompt length (an R-SWA group frees the gap
    /// after the prompt: vLLM passes `num_prompt_tokens`).
    reads_gap_prompt: bool,
}

impl KvCacheManager {
    pub fn new(cfg: ManagerConfig) -> CoreResult<Self> {
        if cfg.groups.is_empty() {
            return Err(CoreError::Unsupported(
                "a KV cache config without groups (attention-free model) is not implemented yet"
                    .into(),
            ));
        }
        for (i, g) in cfg.groups.iter().enumerate() {
            g.validate(i)?;
        }
        if cfg.max_model_len == 0 {
            return invalid("max_model_len must be > 0");
        }
        admission_check::check_config(&cfg)?;
        let mut pool = BlockPool::new(
            cfg.num_blocks,
            cfg.enable_caching,
            cfg.hash_block_size,
            cfg.enable_events,
            cfg.profile.null_block_ref_counted,
        )?;
        pool.set_partial_entries(cfg.profile.partial_block_entries);
        let coord = Coordinator::new(
            pool,
            &cfg.groups,
            cfg.use_eagle,
            cfg.scheduler_block_size,
            (cfg.dcp_world_size, cfg.pcp_world_size),
            cfg.retention_interval,
            &cfg.profile,
        )?;
        let has_align_groups = coord.managers.iter().any(|m| m.is_mamba_align());
        let has_window = coord.managers.iter().any(|m| m.attn.frees_blocks());
        let reads_gap_prompt = coord
            .managers
            .iter()
            .any(|m| m.attn.frees_blocks() && !m.attn.has_window());
        let partial_tails = coord.managers.iter().any(|m| m.caches_partial_tails());
        let mut m = KvCacheManager {
            sizes_from_computed: admission_check::sizes_from_computed(&coord),
            coord,
            stats: LookupStats::default(),
            log_stats: false,
            planner: PlannerState::default(),
            max_model_len: cfg.max_model_len,
            enable_caching: cfg.enable_caching,
            profile: cfg.profile,
            has_align_groups,
            reqs: RequestRegistry::default(),
            ghost_entries: Vec::new(),
            handed_out: deferred_free::HandedOut::default(),
            // Sparse retention, Mamba checkpoints that wait for the prefill
            // end, R-SWA's gap frees, partial tails (their boundary is the
            // prompt's), or Mamba align caching under `caches_prefill_states`
            // (always).
            reads_gap_prompt,
            reads_prompt_len: reads_gap_prompt
                || cfg.enable_caching
                    && (cfg.retention_interval.is_some()
                        || cfg.groups.iter().any(|g| g.mamba_checkpoints.is_some()))
                || partial_tails
                || cfg
                    .groups
                    .iter()
                    .any(|g| g.mamba_checkpoints.is_some_and(|c| c.only_at_prefill_end)),
            reads_junction: false,
            reads_request_computed: false,
            reads_in_flight: cfg.profile.frees_on_processed_tokens && has_window,
        };
        m.note_junction_readers();
        Ok(m)
    }

    /// Whether an allocation of the request in `slot` (None: new) should
    /// carry `num_prompt_tokens`: sparse retention is on and the request's
    /// prompt length is not known yet. False without retention.
    #[inline]
    pub fn wants_num_prompt_tokens(&self, slot: Option<ReqSlot>) -> bool {
        self.reads_prompt_len && slot.is_none_or(|s| self.reqs.num_prompt_tokens(s).is_none())
    }

    /// Whether allocations (and `cache_blocks`) should carry the request's
    /// `shared_prefix_boundary` (replay-boundary retention keeps it).
    #[inline]
    pub fn wants_shared_prefix_boundary(&self) -> bool {
        self.reads_junction
    }

    /// Whether allocations should carry `request.num_in_flight_tokens`
    /// (`frees_on_processed_tokens`).
    #[inline]
    pub fn wants_num_in_flight_tokens(&self) -> bool {
        self.reads_in_flight
    }

    /// Whether `cache_blocks` should be preceded by
    /// `set_num_computed_tokens` (the shared-prefix checkpoint is on).
    #[inline]
    pub fn wants_num_computed_tokens(&self) -> bool {
        self.reads_request_computed
    }

    /// Notes `request.num_computed_tokens` before a `cache_blocks` call
    /// (see `wants_num_computed_tokens`); nothing for an unknown request.
    pub fn set_num_computed_tokens(&mut self, request_id: &str, n: usize) {
        if let Some(slot) = self.slot(request_id) {
            self.reqs.set_num_computed_tokens(slot, n);
        }
    }

    /// Notes the request's `shared_prefix_boundary` for caching (see
    /// `wants_shared_prefix_boundary`); nothing for an unknown request.
    pub fn set_shared_prefix_boundary(&mut self, request_id: &str, boundary: usize) {
        if let Some(slot) = self.slot(request_id) {
            self.reqs.set_shared_prefix_boundary(slot, boundary);
        }
    }

    /// What places the tails sparse retention keeps for the request (the
    /// defaults, without touching the request's state, when not retaining).
    #[inline]
    fn retention_marks(&self, slot: ReqSlot) -> RetentionMarks {
        if !self.reads_prompt_len {
            return RetentionMarks::default();
        }
        RetentionMarks {
            num_prompt_tokens: self.reqs.num_prompt_tokens(slot),
            shared_prefix_boundary: self.reqs.shared_prefix_boundary(slot),
            num_computed_tokens: self.reqs.num_computed_tokens(slot),
        }
    }

    /// Prefix caching is on (vLLM's `enable_caching`).
    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    /// The coordinator vLLM would build for this config:
    /// "no_prefix_cache", "unitary" (one group) or "hybrid".
    pub fn coordinator_kind(&self) -> &'static str {
        use crate::coordinator::CoordinatorKind as K;
        match self.coord.kind {
            K::NoPrefixCache => "no_prefix_cache",
            K::Unitary => "unitary",
            K::Hybrid => "hybrid",
        }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.coord.pool
    }

    pub fn num_groups(&self) -> usize {
        self.coord.managers.len()
    }

    pub fn usage(&self) -> f64 {
        self.coord.pool.usage()
    }

    fn slot(&self, request_id: &str) -> Option<ReqSlot> {
        self.reqs.slot(request_id)
    }

    fn slot_or_insert(&mut self, request_id: &str) -> ReqSlot {
        let slot = self.reqs.slot_or_insert(request_id);
        admission_check::adopt_ghost_entry(self, request_id, slot);
        slot
    }

    fn hashes(&self, slot: ReqSlot) -> &HashList {
        self.reqs.hashes(slot)
    }

    /// Cache hit for a request of `num_tokens` tokens: blocks per group and
    /// the number of hit tokens. Changes nothing.
    /// `max_hit`: the most hit tokens (vLLM's `max_cache_hit_length`);
    /// None: all but the last token, whose logits must be recomputed.
    pub fn get_computed_blocks(
        &self,
        request_id: &str,
        num_tokens: usize,
        max_hit: Option<usize>,
    ) -> CoreResult<(Vec<Vec<BlockId>>, usize)> {
        let hit = self.find_cache_hit(request_id, num_tokens, max_hit)?;
        Ok((hit.blocks, hit.len))
    }

    /// `get_computed_blocks` with the longest hit one attention type found
    /// (`CacheHit::longest`, behind vLLM's `shared_prefix_boundary`).
    pub fn find_cache_hit(
        &self,
        request_id: &str,
        num_tokens: usize,
        max_hit: Option<usize>,
    ) -> CoreResult<CacheHit> {
        if num_tokens == 0 {
            return invalid(format!("request {request_id:?} has no tokens"));
        }
        let empty = HashList::new();
        let hashes = self.slot(request_id).map_or(&empty, |s| self.hashes(s));
        // No hit exceeds the tokens (their hashes bound it): capping there
        // changes no answer and keeps the search's tables sized by them.
        let max_hit = max_hit.map_or(num_tokens - 1, |m| m.min(num_tokens));
        Ok(self.coord.find_longest_cache_hit(hashes, max_hit))
    }

    /// How many of a request's tokens the prefix cache holds, for a caller
    /// that has not decided to admit it (vLLM's
    /// `get_num_cached_tokens`): the hit search over the request's `hashes`,
    /// bounded by `num_tokens - 1`. Changes nothing: no reference, touch,
    /// event or stat, and the request is not registered.
    pub fn probe_cache_hit(&self, hashes: &HashList, num_tokens: usize) -> usize {
        if num_tokens == 0 {
            return 0;
        }
        self.coord
            .find_longest_cache_hit(hashes, num_tokens - 1)
            .len
    }

    /// Every spec group's own hit over `hashes` (at most `max_hit` tokens),
    /// not reconciled: see `Coordinator::find_longest_cache_hit_per_group`.
    pub fn find_cache_hit_per_group(
        &self,
        hashes: &HashList,
        max_hit: usize,
    ) -> CoreResult<(Vec<Vec<BlockId>>, Vec<usize>)> {
        self.coord.find_longest_cache_hit_per_group(hashes, max_hit)
    }

    /// The behaviour profile fixed at construction.
    pub fn profile(&self) -> &BehaviourProfile {
        &self.profile
    }

    /// Multi-module MTP (vLLM's `num_prefill_lookahead` - 1): that
    /// many last computed tokens are never cached. Set before the first
    /// request (the decode horizons assume it fixed).
    pub fn set_reprefillable_tokens(&mut self, n: usize) -> CoreResult<()> {
        if self.num_requests() > 0 {
            return invalid("the re-prefillable token count is set before the first request");
        }
        self.coord.reprefillable_tokens = n;
        Ok(())
    }

    /// vLLM's `mamba_shared_prefix_checkpoint`, already narrowed by
    /// the caller (EAGLE groups, partial hash hits, no re-prefillable
    /// tokens): each Mamba align group also keys the running state at the
    /// request's shared-prefix junction inside the prompt chunk being
    /// computed. Set before the first request.
    pub fn set_shared_prefix_checkpoint(&mut self, on: bool) -> CoreResult<()> {
        if self.num_requests() > 0 {
            return invalid("the shared-prefix checkpoint is set before the first request");
        }
        self.coord.set_shared_prefix_checkpoint(on);
        self.reads_request_computed = on;
        self.note_junction_readers();
        Ok(())
    }

    /// Whether allocations and `cache_blocks` read the requests'
    /// shared-prefix junction: with caching on, where a rule uses it
    /// (`Coordinator::reads_junction`); again after any setting it follows.
    fn note_junction_readers(&mut self) {
        self.reads_junction = self.enable_caching && self.coord.reads_junction();
    }

    /// The request's slot, if the manager knows it (saves lookups when
    /// several calls concern one request).
    pub fn lookup(&self, request_id: &str) -> Option<ReqSlot> {
        self.slot(request_id)
    }

    /// A handle for a request the manager holds: stable until the request
    /// is freed (or dropped after a failed first allocation), never reused.
    pub fn handle(&self, request_id: &str) -> Option<u64> {
        self.slot(request_id).map(|s| self.reqs.handle(s))
    }

    /// The handle of a live slot (from `lookup`).
    pub fn handle_at(&self, slot: ReqSlot) -> u64 {
        self.reqs.handle(slot)
    }

    /// Where the decode data of the handle's request lives, for a caller to
    /// prefetch before its next call: the hot line (`RequestRegistry::
    /// hot_line_addr`), then each group's record (two lines each), which a
    /// decode that changes blocks reads.
    #[inline(always)]
    pub fn for_each_decode_line(&self, handle: u64, mut f: impl FnMut(*const u8)) {
        let Some(hot) = self.reqs.hot_line_addr(handle) else {
            return;
        };
        f(hot);
        for m in &self.coord.managers {
            if let Some(r) = m.record_addr(handle as u32) {
                f(r);
                f(r.wrapping_add(64));
            }
        }
    }

    /// Where a decode of `slot` that changes blocks reads beyond the lines
    /// `for_each_decode_line` gives: each group's table tails and oldest
    /// live block (a window or Mamba align frees it), the first free block,
    /// and the prefix-map entries the first two free blocks' eviction
    /// removes. A caller prefetches them all at once, so their misses
    /// overlap instead of coming one after another.
    pub fn for_each_general_decode_line(&self, slot: ReqSlot, mut f: impl FnMut(*const u8)) {
        for m in &self.coord.managers {
            m.for_each_table_tail(slot, &mut f);
            m.for_each_live_head_line(slot, &mut f);
        }
        self.coord.pool.for_each_next_free_line(1, &mut f);
        // Then what those lines name (their loads overlap one another).
        for m in &self.coord.managers {
            m.for_each_live_head_block_line(&self.coord.pool, slot, &mut f);
        }
        self.coord.pool.for_each_next_evicted_line(2, &mut f);
    }

    /// Where the next call that takes free blocks starts reading: the two
    /// front blocks' metadata and queue links (after taking blocks, the
    /// front block's links are at hand: finding the second reads no cold
    /// line). A caller prefetches them after a call that took blocks, long
    /// before they are read.
    pub fn for_each_next_free_line(&self, mut f: impl FnMut(*const u8)) {
        self.coord.pool.for_each_next_free_line(2, &mut f);
    }

    /// Where `cache_blocks(slot, num_computed_tokens)` reads beyond the
    /// request's hot line: per group, the table entries and pool lines of
    /// the blocks it caches and the table's oldest live block, then the
    /// prefix-map entry a new key takes (the groups share one hash a
    /// position). A caller prefetches them all at once, so their misses
    /// overlap.
    pub fn for_each_cache_line(
        &self,
        slot: ReqSlot,
        num_computed_tokens: usize,
        mut f: impl FnMut(*const u8),
    ) {
        if !self.enable_caching {
            return;
        }
        for m in &self.coord.managers {
            m.for_each_to_cache_line(&self.coord.pool, slot, num_computed_tokens, &mut f);
            // The decode horizon re-derived after caching reads up to it.
            m.for_each_live_head_line(slot, &mut f);
        }
        self.coord.pool.for_each_next_new_entry_line(1, &mut f);
    }

    /// Where freeing the request reads: the pool lines (metadata, queue
    /// links) of every block its tables hold, for a caller to prefetch
    /// before `free` (they are scattered and cold: fetched together, their
    /// misses overlap instead of coming one after another).
    pub fn for_each_free_line(&self, request_id: &str, f: impl FnMut(*const u8)) {
        if let Some(slot) = self.slot(request_id) {
            self.for_each_free_line_at(slot, f);
        }
    }

    /// `for_each_free_line` of the request in `slot` (a caller that has
    /// resolved the id already).
    pub fn for_each_free_line_at(&self, slot: ReqSlot, mut f: impl FnMut(*const u8)) {
        for m in &self.coord.managers {
            for &b in m.blocks(slot).iter().filter(|&&b| b != crate::NULL_BLOCK) {
                self.coord.pool.for_each_block_line(b, &mut f);
            }
        }
    }

    /// The live slot a handle names, if any (`resolve_handle` without an
    /// error to build).
    pub fn slot_of_handle(&self, handle: u64) -> Option<ReqSlot> {
        self.reqs.resolve_handle(handle)
    }

    /// The slot of the request a handle names.
    pub fn resolve_handle(&self, handle: u64) -> CoreResult<ReqSlot> {
        self.reqs.resolve_handle(handle).ok_or_else(|| {
            CoreError::UnknownRequest(format!(
                "request handle {handle} names no request the manager holds (freed, or never allocated)"
            ))
        })
    }

    /// Hashes held for the request of `slot` (from `lookup`).
    pub fn known_hashes_at(&self, slot: Option<ReqSlot>) -> usize {
        slot.map_or(0, |s| self.reqs.known_hashes(s))
    }

    /// Drops a request entry that holds nothing (a failed first allocation),
    /// so unknown requests do not accumulate. Hashes are kept when present.
    fn release_if_idle(&mut self, slot: ReqSlot) {
        let holds = self.coord.managers.iter().any(|m| m.holds(slot));
        let has_hashes = !self.hashes(slot).is_empty();
        if !holds && !has_hashes {
            self.drop_slot(slot);
        }
    }

    fn set_horizon(&mut self, slot: ReqSlot, horizon: Option<DecodeHorizon>) {
        self.reqs.set_horizon(slot, horizon);
    }

    fn drop_slot(&mut self, slot: ReqSlot) {
        self.reqs.release(slot);
    }

    /// Frees every block of the request (tail first) and forgets it.
    pub fn free(&mut self, request_id: &str) {
        if let Some(slot) = self.slot(request_id) {
            self.coord.free(slot);
            self.planner.forget(slot);
            self.drop_slot(slot);
        } else {
            self.ghost_entries.retain(|g| g != request_id);
        }
    }

    pub fn remove_skipped_blocks(&mut self, request_id: &str, total_computed_tokens: usize) {
        self.remove_skipped_blocks_of_prompt(request_id, total_computed_tokens, None);
    }

    /// `remove_skipped_blocks` with vLLM's `num_prompt_tokens` (R-SWA
    /// groups free the gap after the prompt given it; None: window frees only).
    pub fn remove_skipped_blocks_of_prompt(
        &mut self,
        request_id: &str,
        total_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
    ) {
        if let Some(slot) = self.slot(request_id) {
            self.set_horizon(slot, None);
            self.coord
                .remove_skipped_blocks(slot, total_computed_tokens, num_prompt_tokens);
        }
    }

    /// vLLM's `record_blocks_for_zeroing`: the request's blocks from
    /// `start_token` on are handed to the worker for zeroing again (after a
    /// failed async KV load), in each group that records new block ids.
    /// `start_token` must be block-aligned in those groups (ValueError,
    /// nothing recorded); an unknown request records nothing.
    pub fn record_blocks_for_zeroing(
        &mut self,
        request_id: &str,
        start_token: usize,
    ) -> CoreResult<()> {
        for m in self
            .coord
            .managers
            .iter()
            .filter(|m| m.records_new_block_ids())
        {
            if start_token % m.block_size as usize != 0 {
                return invalid(format!(
                    "record_blocks_for_zeroing: start_token {start_token} is not a multiple of group {}'s \
                     block size {}",
                    m.group_id, m.block_size
                ));
            }
        }
        let Some(slot) = self.slot(request_id) else {
            return Ok(());
        };
        for m in self.coord.managers.iter_mut() {
            let from = start_token / m.block_size as usize;
            m.record_blocks_for_zeroing(slot, from);
        }
        Ok(())
    }

    pub fn evict_blocks(&mut self, ids: &[u32]) -> CoreResult<()> {
        self.coord.pool.evict_blocks(ids)
    }

    pub fn get_num_common_prefix_blocks(&mut self, request_id: &str) -> Vec<usize> {
        if self.coord.kind == crate::coordinator::CoordinatorKind::NoPrefixCache
            || !self.profile.common_prefix
        {
            return vec![0; self.num_groups()];
        }
        match self.slot(request_id) {
            Some(slot) => self
                .coord
                .get_num_common_prefix_blocks(slot, self.ghost_entries.len()),
            None => admission_check::ghost_entry(self, request_id),
        }
    }

    pub fn get_block_ids(&self, request_id: &str) -> Vec<Vec<BlockId>> {
        let slot = self.slot(request_id);
        self.coord
            .managers
            .iter()
            .map(|m| slot.map_or_else(Vec::new, |s| m.blocks(s).to_vec()))
            .collect()
    }

    pub fn take_events(&mut self) -> Vec<PoolEvent> {
        self.coord.pool.take_events()
    }

    pub fn has_events(&self) -> bool {
        self.coord.pool.has_events()
    }

    /// Logs the calls vLLM's block pool makes on a `metrics_collector`
    /// (allocated / accessed / evicted / reset), for `take_block_metrics`.
    pub fn set_record_block_metrics(&mut self, on: bool) {
        self.coord.pool.set_record_metrics(on);
    }

    pub fn has_block_metrics(&self) -> bool {
        self.coord.pool.has_metrics()
    }

    pub fn take_block_metrics(&mut self) -> Vec<BlockMetric> {
        self.coord.pool.take_metrics()
    }

    pub fn take_new_block_ids(&mut self) -> Vec<BlockId> {
        let mut out = Vec::new();
        for m in self.coord.managers.iter_mut() {
            m.take_new_block_ids(&mut out);
        }
        out
    }

    pub fn new_step_starts(&mut self) {
        self.coord.new_step_starts();
    }

    /// Whether a hit of `new_computed` blocks (per group) waits a step in
    /// some group: a state it ends on was cached in this very step, so an
    /// allocation that takes it answers "no room" until `new_step_starts`.
    pub fn hit_waits_a_step(&self, new_computed: &[Vec<BlockId>]) -> bool {
        let pool = &self.coord.pool;
        self.coord
            .managers
            .iter()
            .zip(new_computed)
            .any(|(m, blocks)| m.hit_waits_a_step(pool, blocks))
    }

    /// Ids of the requests the manager holds state for (any order; reads only).
    pub fn request_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.reqs.ids()
    }

    /// Whether some group holds blocks for the request (a lookup of one
    /// that holds none may be of a new request reusing its id).
    pub fn holds_blocks(&self, request_id: &str) -> bool {
        self.slot(request_id)
            .is_some_and(|s| self.holds_blocks_at(s))
    }

    /// Hash `i` the core holds for the request in `slot`.
    pub fn known_hash_at(&self, slot: ReqSlot, i: usize) -> Option<&[u8]> {
        let h = self.reqs.hashes(slot);
        (i < h.len()).then(|| h.get(i))
    }

    /// `holds_blocks` by slot.
    pub fn holds_blocks_at(&self, slot: ReqSlot) -> bool {
        self.coord.managers.iter().any(|m| m.holds(slot))
    }

    /// vLLM's `_checkpoints` of a Mamba align group: each request's
    /// prefill checkpoint of its last allocation (id, position, table index).
    pub fn align_checkpoints_of(&self, group: usize) -> Vec<(&str, usize, usize)> {
        let Some(m) = self.coord.managers.get(group) else {
            return Vec::new();
        };
        m.align_states()
            .filter_map(|(s, a)| a.checkpoint.map(|(p, i)| (self.reqs.id_at(s), p, i)))
            .collect()
    }

    /// Blocks of group `group` cached for the request, None unless it is
    /// running there (vLLM's `num_cached_block`).
    pub fn num_cached_blocks_of(&self, request_id: &str, group: usize) -> Option<usize> {
        let s = self.slot(request_id)?;
        let m = self.coord.managers.get(group)?;
        m.is_running(s).then(|| m.num_cached_blocks(s))
    }

    pub fn has_request(&self, request_id: &str) -> bool {
        self.reqs.contains(request_id)
    }

    /// The id of the request in a live slot (from `lookup` / `resolve_handle`).
    pub fn request_id_at(&self, slot: ReqSlot) -> &str {
        self.reqs.id_at(slot)
    }

    /// One more than the highest request slot ever used (slots index dense tables).
    pub fn slot_capacity(&self) -> usize {
        self.reqs.capacity()
    }

    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }
}

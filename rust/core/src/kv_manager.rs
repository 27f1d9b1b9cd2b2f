//! `KvCacheManager`: vLLM 0.23.0's `KVCacheManager` over plain ids and counts.
//! The facade reads the request object and passes its numbers; this type
//! owns every decision. Arguments are checked before anything changes.

use std::borrow::Cow;

use crate::admission_check;
use crate::block_pool::BlockPool;
use crate::coordinator::Coordinator;
use crate::error::{invalid, CoreError, CoreResult};
use crate::events::PoolEvent;
use crate::hashes::HashList;
use crate::mamba_plan::{post_rows, pre_rows, PlanRequest, PlannerState, PreRow};
use crate::manager::{DecodeCounts, DecodeHorizon};
use crate::new_blocks::NewBlocks;
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
    pub max_num_batched_tokens: Option<usize>,
    pub enable_caching: bool,
    pub use_eagle: bool,
    pub enable_events: bool,
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
    }
}

/// New block hashes of a request: those from index `offset` on. Each
/// hash crosses from Python once; this is how the rest arrive.
#[derive(Debug, Clone, Default)]
pub struct HashUpdate {
    pub offset: usize,
    pub hashes: HashList,
}

/// Prefix-cache lookup counters (vLLM's `PrefixCacheStats` fields).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupStats {
    /// `reset_prefix_cache` succeeded since the last take.
    pub reset: bool,
    pub requests: u64,
    pub queries: u64,
    pub hits: u64,
    pub preempted_requests: u64,
    pub preempted_queries: u64,
    pub preempted_hits: u64,
}

impl LookupStats {
    pub fn record(&mut self, num_tokens: usize, num_hits: usize, preempted: bool) {
        let (requests, queries, hits) = if preempted {
            (
                &mut self.preempted_requests,
                &mut self.preempted_queries,
                &mut self.preempted_hits,
            )
        } else {
            (&mut self.requests, &mut self.queries, &mut self.hits)
        };
        *requests += 1;
        *queries += num_tokens as u64;
        *hits += num_hits as u64;
    }
}

#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pub(crate) coord: Coordinator,
    /// Lookup counters since the last `take_stats`.
    pub stats: LookupStats,
    // Mamba align worker-side state for copy plans.
    planner: PlannerState,
    pub(crate) max_model_len: usize,
    enable_caching: bool,
    // Some group is Mamba align (the copy planner tracks requests then).
    has_align_groups: bool,
    pub(crate) reqs: RequestRegistry,
    /// Ids vLLM's `req_to_blocks` (a defaultdict) holds an empty entry for
    /// after `get_num_common_prefix_blocks` asked about them, where this
    /// manager keeps no record (see `admission_check::ghost_entry`).
    pub(crate) ghost_entries: Vec<String>,
    /// Some group sizes a request's table from its computed tokens (see
    /// `admission_check::check_computed_held`).
    pub(crate) sizes_from_computed: bool,
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
        let pool = BlockPool::new(
            cfg.num_blocks,
            cfg.enable_caching,
            cfg.hash_block_size,
            cfg.enable_events,
        )?;
        let coord = Coordinator::new(pool, &cfg.groups, cfg.use_eagle, cfg.scheduler_block_size)?;
        let has_align_groups = coord.managers.iter().any(|m| m.is_mamba_align());
        Ok(KvCacheManager {
            sizes_from_computed: admission_check::sizes_from_computed(&coord),
            coord,
            stats: LookupStats::default(),
            planner: PlannerState::default(),
            max_model_len: cfg.max_model_len,
            enable_caching: cfg.enable_caching,
            has_align_groups,
            reqs: RequestRegistry::default(),
            ghost_entries: Vec::new(),
        })
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

    /// How many of the request's block hashes the core holds.
    pub fn num_known_hashes(&self, request_id: &str) -> usize {
        self.known_hashes_at(self.slot(request_id))
    }

    /// Stores the request's hashes from index `offset` on (the facade sends
    /// each hash once). Creates the request's entry if needed.
    pub fn sync_hashes(
        &mut self,
        request_id: &str,
        offset: usize,
        new: Vec<Box<[u8]>>,
    ) -> CoreResult<()> {
        let update = HashUpdate {
            offset,
            hashes: new.iter().collect(),
        };
        self.hashes_after(request_id, Some(&update))?;
        self.apply_hashes(request_id, update);
        Ok(())
    }

    /// `sync_hashes` for an update already in the core's form.
    pub fn sync_update(&mut self, request_id: &str, update: HashUpdate) -> CoreResult<()> {
        self.hashes_after(request_id, Some(&update))?;
        self.apply_hashes(request_id, update);
        Ok(())
    }

    /// How many hashes the request will hold once `update` is applied;
    /// refuses an update that leaves a gap.
    fn hashes_after(&self, request_id: &str, update: Option<&HashUpdate>) -> CoreResult<usize> {
        self.hashes_after_at(self.slot(request_id), request_id, update)
    }

    fn hashes_after_at(
        &self,
        slot: Option<ReqSlot>,
        request_id: &str,
        update: Option<&HashUpdate>,
    ) -> CoreResult<usize> {
        let known = self.known_hashes_at(slot);
        match update {
            None => Ok(known),
            Some(u) if u.offset > known => invalid(format!(
                "request {request_id:?}: hashes sent from index {}, but only {known} are known",
                u.offset
            )),
            Some(u) if u.offset < known => {
                admission_check::check_resend(self, slot, request_id, u)?;
                Ok(u.offset + u.hashes.len())
            }
            Some(u) => Ok(u.offset + u.hashes.len()),
        }
    }

    fn apply_hashes_at(&mut self, slot: ReqSlot, update: HashUpdate) {
        self.reqs.take_hashes(slot, update);
    }

    fn apply_hashes(&mut self, request_id: &str, update: HashUpdate) {
        if update.hashes.is_empty() && update.offset == self.num_known_hashes(request_id) {
            return;
        }
        let s = self.slot_or_insert(request_id);
        self.apply_hashes_at(s, update);
    }

    /// Cache hit for a request of `num_tokens` tokens: blocks per group and
    /// the number of hit tokens. Changes nothing.
    pub fn get_computed_blocks(
        &self,
        request_id: &str,
        num_tokens: usize,
    ) -> CoreResult<(Vec<Vec<BlockId>>, usize)> {
        if num_tokens == 0 {
            return invalid(format!("request {request_id:?} has no tokens"));
        }
        let empty = HashList::new();
        let hashes = self.slot(request_id).map_or(&empty, |s| self.hashes(s));
        // A full hit must still recompute the last token to get logits.
        Ok(self.coord.find_longest_cache_hit(hashes, num_tokens - 1))
    }

    fn check_new_computed(&self, slot: Option<ReqSlot>, args: &AllocateArgs) -> CoreResult<()> {
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

    /// Whether `allocate_slots` with these arguments may read hashes beyond
    /// `known`: callers can skip fetching new hashes otherwise.
    pub fn may_need_hashes(&self, known: usize, args: &AllocateArgs) -> bool {
        if !self.enable_caching || args.delay_cache_blocks {
            return false;
        }
        let total = (args.num_computed_tokens
            + args.num_new_computed_tokens
            + args.num_external_computed_tokens)
            .min(self.max_model_len);
        let to_cache = (total + args.num_new_tokens).min(args.num_tokens);
        to_cache / self.coord.pool.hash_block_size() as usize > known
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

    /// A plain decode of a running request that changes no block (most
    /// decode steps): it needs no check beyond `num_new_tokens > 0` and no
    /// work beyond what the planner records. False: take the general path.
    pub fn is_noop_decode(&self, slot: ReqSlot, args: &AllocateArgs) -> bool {
        let plain = args.new_computed_blocks.is_none()
            && args.num_new_computed_tokens == 0
            && args.num_external_computed_tokens == 0
            && args.num_encoder_tokens == 0
            && args.reserved_blocks == 0
            && !args.full_sequence_must_fit
            && args.num_new_tokens > 0;
        if !plain {
            return false;
        }
        let counts = self.decode_counts(
            args.num_new_tokens,
            args.num_computed_tokens,
            args.num_tokens,
            args.num_lookahead_tokens,
            !args.delay_cache_blocks,
        );
        match self.reqs.horizon(slot) {
            Some(h) => {
                let noop = h.allows(&counts);
                debug_assert!(
                    !noop || self.coord.decode_is_noop(slot, &counts),
                    "decode horizon {h:?} of slot {slot} admits a decode that changes blocks"
                );
                noop
            }
            None => self.coord.decode_is_noop(slot, &counts),
        }
    }

    /// The counts a plain decode (no computed blocks, external or encoder
    /// tokens) is sized by, as `allocate_slots` derives them; `caches`:
    /// the call may cache (`delay_cache_blocks` is off).
    #[inline]
    fn decode_counts(
        &self,
        num_new_tokens: usize,
        num_computed_tokens: usize,
        num_tokens: usize,
        lookahead: usize,
        caches: bool,
    ) -> DecodeCounts {
        let total_computed = num_computed_tokens.min(self.max_model_len);
        let main_model = total_computed + num_new_tokens;
        DecodeCounts {
            total_computed,
            need_slot: (main_model + lookahead).min(self.max_model_len),
            main_model,
            to_cache: (caches && self.enable_caching).then(|| main_model.min(num_tokens)),
        }
    }

    /// A plain decode's first look at a request: the slot its handle
    /// names (None: no live request) and whether `allocate_slots(request,
    /// num_new_tokens, num_lookahead_tokens=lookahead)` is a decode that
    /// changes no block and reads no new hash. Judged from the request's
    /// hot line alone, or from the tables when its horizon is unknown;
    /// exact either way.
    #[inline]
    pub fn plain_decode_by_handle(
        &self,
        handle: u64,
        num_new_tokens: usize,
        num_computed_tokens: usize,
        num_tokens: usize,
        lookahead: usize,
    ) -> Option<(ReqSlot, bool)> {
        let (slot, h, known) = self.reqs.resolve_for_decode(handle)?;
        let c = self.decode_counts(
            num_new_tokens,
            num_computed_tokens,
            num_tokens,
            lookahead,
            true,
        );
        let hash_block_size = self.coord.pool.hash_block_size() as usize;
        let noop = num_new_tokens > 0
            && c.to_cache.is_none_or(|t| t / hash_block_size <= known)
            && if *h == DecodeHorizon::UNKNOWN {
                self.decode_is_noop_by_tables(slot, &c)
            } else {
                h.allows(&c)
            };
        debug_assert_eq!(
            noop,
            {
                let args = AllocateArgs {
                    num_new_tokens,
                    num_computed_tokens,
                    num_tokens,
                    num_lookahead_tokens: lookahead,
                    ..Default::default()
                };
                !self.may_need_hashes(known, &args) && self.is_noop_decode(slot, &args)
            },
            "hot-line check of slot {slot} disagrees with is_noop_decode"
        );
        Some((slot, noop))
    }

    /// `coord.decode_is_noop` for a request without a known horizon (rare
    /// where horizons apply: out of the hot-line check's code).
    #[cold]
    #[inline(never)]
    fn decode_is_noop_by_tables(&self, slot: ReqSlot, c: &DecodeCounts) -> bool {
        self.coord.decode_is_noop(slot, c)
    }

    /// A decode that changes no block, done in full (no hashes are due and
    /// `is_noop_decode` holds): `out` gets an empty run per group. False:
    /// nothing was done. `args.num_tokens` may be an upper bound here: the
    /// test only gets stricter with more tokens to cache.
    pub fn try_noop_decode(
        &mut self,
        slot: ReqSlot,
        args: &AllocateArgs,
        out: &mut NewBlocks,
    ) -> bool {
        let known = self.known_hashes_at(Some(slot));
        if self.may_need_hashes(known, args) || !self.is_noop_decode(slot, args) {
            return false;
        }
        self.record_noop_decode(slot, args);
        out.clear();
        out.push_empty_groups(self.num_groups());
        true
    }

    /// The whole effect of a decode `is_noop_decode` accepted: the Mamba
    /// planner notes the step (callers that checked already skip the rest).
    pub fn record_noop_decode(&mut self, slot: ReqSlot, args: &AllocateArgs) {
        self.record_plain_noop_decode(slot, args.num_computed_tokens, args.num_new_tokens);
    }

    /// `record_noop_decode` from the two counts it reads.
    #[inline]
    pub fn record_plain_noop_decode(
        &mut self,
        slot: ReqSlot,
        num_computed_tokens: usize,
        num_new_tokens: usize,
    ) {
        let total_computed = num_computed_tokens.min(self.max_model_len);
        self.note_last_step(slot, total_computed, num_new_tokens);
    }

    /// What the Mamba copy planner needs of a request's last allocation
    /// (nothing to keep without Mamba align groups).
    fn note_last_step(&mut self, slot: ReqSlot, total_computed: usize, num_new_tokens: usize) {
        if self.has_align_groups {
            self.reqs
                .set_last_step(slot, (total_computed, num_new_tokens));
        }
    }

    /// `new_computed_blocks`, or no blocks for each group.
    fn new_computed_or_empty<'a>(&self, args: &AllocateArgs<'a>) -> Cow<'a, [Vec<BlockId>]> {
        match args.new_computed_blocks {
            Some(nc) => Cow::Borrowed(nc),
            None if self.num_groups() <= NO_BLOCKS.len() => {
                Cow::Borrowed(&NO_BLOCKS[..self.num_groups()])
            }
            None => Cow::Owned(vec![Vec::new(); self.num_groups()]),
        }
    }

    /// `allocate_checked` for a plain decode (see `AllocateArgs::is_plain`)
    /// of a request running in every group: the coordinator's compact path.
    fn allocate_plain_decode(
        &mut self,
        slot: ReqSlot,
        args: &AllocateArgs,
        update: Option<&HashUpdate>,
        out: &mut NewBlocks,
    ) -> bool {
        if let Some(u) = update {
            self.reqs.apply_hashes(slot, u);
        }
        let c = self.decode_counts(
            args.num_new_tokens,
            args.num_computed_tokens,
            args.num_tokens,
            args.num_lookahead_tokens,
            !args.delay_cache_blocks,
        );
        let hashes = self.reqs.hashes(slot);
        if !self
            .coord
            .plain_decode(slot, &c, args.reserved_blocks, hashes, out)
        {
            // A running request holds blocks: `release_if_idle` keeps it.
            return false;
        }
        self.allocated(slot, c.total_computed, args.num_new_tokens);
        true
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
        self.set_horizon(slot, None);
        if args.is_plain() && self.coord.runs_everywhere(slot) {
            // Debug builds check the compact path against the general one.
            #[cfg(debug_assertions)]
            let expected = {
                let mut general = self.clone();
                let mut general_out = NewBlocks::new();
                let ok = general.allocate_general_checked(slot, args, update, &mut general_out);
                (ok, general_out, format!("{general:?}"))
            };
            let ok = self.allocate_plain_decode(slot, args, update, out);
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
    fn allocate_general_checked(
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

        // Blocks outside the window are freed even if the allocation fails.
        self.coord.remove_skipped_blocks(slot, total_computed);
        let need_with_external = |external| {
            self.coord.get_num_blocks_to_allocate(
                slot,
                num_tokens_need_slot,
                new_computed,
                args.num_encoder_tokens,
                num_local_computed + args.num_external_computed_tokens,
                external,
                num_tokens_main_model,
                false,
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
        let free = self.coord.pool.num_free_blocks() as i64;
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
            );
        }
        self.coord.allocate_new_blocks(
            slot,
            num_tokens_need_slot,
            num_tokens_main_model,
            args.num_encoder_tokens,
            out,
        );
        if caches {
            self.coord
                .cache_blocks(slot, self.reqs.hashes(slot), num_tokens_to_cache);
        }
        self.allocated(slot, total_computed, args.num_new_tokens);
        true
    }

    /// After an allocation that succeeded: the planner's note and the
    /// request's new decode horizon.
    fn allocated(&mut self, slot: ReqSlot, total_computed: usize, num_new_tokens: usize) {
        self.note_last_step(slot, total_computed, num_new_tokens);
        if let Some(h) = self.coord.decode_horizon(slot) {
            self.set_horizon(slot, Some(h));
        }
    }

    /// `full_sequence_must_fit`: the whole sequence (up to max_model_len)
    /// would fit in the free blocks. Rare, so out of the decode's code.
    #[cold]
    #[inline(never)]
    fn full_sequence_fits(
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
            full,
            true,
        );
        need <= self.coord.pool.num_free_blocks() as i64
    }

    #[allow(clippy::too_many_arguments)]
    fn check_hashes_for_cache(
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
        if have >= num_tokens / self.coord.pool.hash_block_size() as usize {
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
        if let Some(slot) = self.slot(request_id) {
            self.set_horizon(slot, None);
            self.coord
                .remove_skipped_blocks(slot, total_computed_tokens);
        }
    }

    /// Caches the request's full blocks up to `num_computed_tokens`.
    pub fn cache_blocks(
        &mut self,
        request_id: &str,
        num_computed_tokens: usize,
        update: Option<HashUpdate>,
    ) -> CoreResult<()> {
        if !self.enable_caching {
            return Ok(());
        }
        let slot = self.slot(request_id);
        let have = self.hashes_after(request_id, update.as_ref())?;
        let need = slot.map_or(0, |s| {
            self.coord
                .hashes_needed_to_cache(num_computed_tokens, |m| m.num_cached_blocks(s))
        });
        let holds = slot.is_some_and(|s| {
            self.coord
                .managers
                .iter()
                .all(|m| m.blocks(s).len() >= num_computed_tokens / m.block_size as usize)
        });
        if slot.is_none() || !holds {
            return invalid(format!(
                "request {request_id:?} has no blocks for {num_computed_tokens} computed tokens"
            ));
        }
        if have < need {
            return invalid(format!(
                "request {request_id:?} has {have} block hashes but caching needs {need}"
            ));
        }
        let slot = slot.expect("checked");
        if let Some(u) = update {
            self.apply_hashes(request_id, u);
        }
        self.set_horizon(slot, None);
        self.coord
            .cache_blocks(slot, self.reqs.hashes(slot), num_computed_tokens);
        Ok(())
    }

    pub fn evict_blocks(&mut self, ids: &[u32]) -> CoreResult<()> {
        self.coord.pool.evict_blocks(ids)
    }

    pub fn reset_prefix_cache(&mut self) -> bool {
        let ok = self.coord.pool.reset_prefix_cache();
        self.stats.reset |= ok;
        ok
    }

    /// The lookup counters, reset to zero.
    pub fn take_stats(&mut self) -> LookupStats {
        std::mem::take(&mut self.stats)
    }

    pub fn get_num_common_prefix_blocks(&mut self, request_id: &str) -> Vec<usize> {
        if self.coord.kind == crate::coordinator::CoordinatorKind::NoPrefixCache {
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
            num_tokens_main_model,
            apply_admission_cap,
        ))
    }

    /// Mamba align bookkeeping of a request in a group, if any.
    pub fn align_state(
        &self,
        request_id: &str,
        group: usize,
    ) -> Option<crate::manager::AlignState> {
        let slot = self.slot(request_id)?;
        self.coord.managers.get(group)?.align_state(slot)
    }

    /// Mamba align groups: (block size, speculative blocks), or None.
    fn align_geometry(&self) -> Option<(usize, usize)> {
        self.coord
            .managers
            .iter()
            .find(|m| m.is_mamba_align())
            .map(|m| match m.spec.kind {
                crate::spec::SpecKind::Mamba {
                    num_speculative_blocks,
                    ..
                } => (m.block_size as usize, num_speculative_blocks as usize),
                _ => unreachable!("is_mamba_align"),
            })
    }

    fn plan_request(&self, request_id: &str) -> CoreResult<(ReqSlot, PlanRequest<'_>)> {
        let slot = self.slot(request_id);
        let step = slot.and_then(|s| self.reqs.last_step(s));
        let (Some(slot), Some((num_computed, num_scheduled))) = (slot, step) else {
            return Err(CoreError::UnknownRequest(format!(
                "request {request_id:?} has no allocation this step to plan Mamba copies for"
            )));
        };
        let views = self
            .coord
            .managers
            .iter()
            .filter(|m| m.is_mamba_align())
            .map(|m| m.worker_view(slot).unwrap_or(&[]))
            .collect();
        let prev_state_idx = self.planner.state_idx.get(slot).copied();
        Ok((
            slot,
            PlanRequest {
                views,
                num_computed,
                num_scheduled,
                prev_state_idx,
            },
        ))
    }

    /// Pre-forward Mamba state copies of this step for `request_ids` (the
    /// batch, in order), given the worker's accepted-token counts of the
    /// previous step. Advances each request's running-state index; on an
    /// error nothing is advanced.
    pub fn mamba_pre_copy_plan(
        &mut self,
        request_ids: &[&str],
        num_accepted: &[i64],
    ) -> CoreResult<Vec<PreRow>> {
        let Some((block_size, _)) = self.align_geometry() else {
            return invalid("no Mamba align group: nothing to plan");
        };
        if request_ids.len() != num_accepted.len() {
            return invalid(format!(
                "num_accepted has {} entries for {} requests",
                num_accepted.len(),
                request_ids.len()
            ));
        }
        if let Some(i) = num_accepted.iter().position(|&a| a < 0) {
            return invalid(format!(
                "num_accepted[{i}] must be >= 0, got {}",
                num_accepted[i]
            ));
        }
        let mut rows = Vec::new();
        let mut updates = Vec::with_capacity(request_ids.len());
        for (i, (rid, &a)) in request_ids.iter().zip(num_accepted).enumerate() {
            let (slot, r) = self.plan_request(rid)?;
            updates.push((slot, pre_rows(i, &r, a, block_size, &mut rows)?));
        }
        for (slot, cur) in updates {
            self.planner.state_idx.insert(slot, cur);
        }
        Ok(rows)
    }

    /// Post-verification selection rows for `request_ids` (after this step's
    /// pre plan), given each request's scheduled draft count. Flat
    /// `[group, req, (dst, conv_src, temp_src, bias, reset) * (k + 1)]` rows.
    pub fn mamba_post_select_plan(
        &self,
        request_ids: &[&str],
        num_draft: &[usize],
    ) -> CoreResult<(Vec<i32>, usize)> {
        let Some((block_size, num_spec)) = self.align_geometry() else {
            return invalid("no Mamba align group: nothing to plan");
        };
        if request_ids.len() != num_draft.len() {
            return invalid(format!(
                "num_draft has {} entries for {} requests",
                num_draft.len(),
                request_ids.len()
            ));
        }
        let mut out = Vec::new();
        for (i, (rid, &d)) in request_ids.iter().zip(num_draft).enumerate() {
            let (_, r) = self.plan_request(rid)?;
            let Some(state_idx) = r.prev_state_idx else {
                return invalid(format!(
                    "request {rid:?}: run the pre-copy plan of this step first"
                ));
            };
            post_rows(i, &r, state_idx, d, num_spec, block_size, &mut out)?;
        }
        Ok((out, 2 + 5 * (num_spec + 1)))
    }

    pub fn take_events(&mut self) -> Vec<PoolEvent> {
        self.coord.pool.take_events()
    }

    pub fn has_events(&self) -> bool {
        self.coord.pool.has_events()
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

    /// Ids of the requests the manager holds state for (any order; reads only).
    pub fn request_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.reqs.ids()
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

    /// Full consistency check of pool, tables and ref counts.
    pub fn check_invariants(&self) -> CoreResult<()> {
        use crate::block_pool::NULL_BLOCK;
        use crate::hashes::ScaledHashes;
        use crate::spec::{MambaMode, SpecKind};
        let fail = |m: String| Err(CoreError::Invariant(m));
        if let Err(m) = self.coord.pool.check_invariants() {
            return fail(m);
        }
        if let Err(m) = self.reqs.check_invariants() {
            return fail(m);
        }
        let live = |s: ReqSlot| self.reqs.is_live(s);
        let pool = &self.coord.pool;
        let n = pool.num_blocks() as usize;
        let num_groups = self.coord.managers.len() as u32;
        let hbs = pool.hash_block_size();
        let mut holders = vec![0i64; n];
        let mut owner_group = vec![u32::MAX; n];
        let mut in_table = vec![u32::MAX; n];
        let mut stamp = 0u32;
        for m in &self.coord.managers {
            let g = m.group_id;
            let (align, num_spec) = match m.spec.kind {
                SpecKind::Mamba {
                    mode,
                    num_speculative_blocks,
                } => (mode == MambaMode::Align, num_speculative_blocks as usize),
                _ => (false, 0),
            };
            for (slot, table) in m.tables() {
                if !live(slot) {
                    return fail(format!("group {g} holds a table for a dead request slot"));
                }
                let num_cached = m.num_cached_blocks(slot);
                if num_cached > table.len() {
                    return fail(format!(
                        "group {g}: slot {slot} counts {num_cached} cached blocks but holds {}",
                        table.len()
                    ));
                }
                // Without caching, hash_block_size may exceed a group's block
                // size (scale 0); no block is cached then, so no hash is read.
                let scale = ((m.block_size / hbs) as usize).max(1);
                let hashes = ScaledHashes::new(self.hashes(slot), scale);
                stamp += 1;
                for (i, &b) in table.iter().enumerate() {
                    if b == NULL_BLOCK {
                        continue;
                    }
                    if b as usize >= n {
                        return fail(format!("group {g}: block id {b} out of range"));
                    }
                    if std::mem::replace(&mut in_table[b as usize], stamp) == stamp {
                        return fail(format!("block {b} is twice in one table of group {g}"));
                    }
                    if owner_group[b as usize] != u32::MAX && owner_group[b as usize] != g {
                        return fail(format!("block {b} is in two groups"));
                    }
                    owner_group[b as usize] = g;
                    holders[b as usize] += 1;
                    if let Some((h, hg)) = pool.block_hash(b) {
                        if hg != g {
                            return fail(format!(
                                "block {b} of group {g} is cached for group {hg}"
                            ));
                        }
                        // A cached position holds the request's own hash (align
                        // mode moves speculative blocks, so it is exempt).
                        if !align && i < num_cached && i < hashes.len() && *hashes.get(i) != *h {
                            return fail(format!(
                                "group {g}: block {b} at position {i} is cached under another hash"
                            ));
                        }
                    }
                }
            }
            if let Err(e) = m.check_records() {
                return fail(format!("group {g}: {e}"));
            }
            for (slot, has_table) in m.running_slots() {
                if !live(slot) || !has_table {
                    return fail(format!(
                        "group {g} counts cached blocks of slot {slot} without a table"
                    ));
                }
            }
            for (slot, a) in m.align_states() {
                if !align || !live(slot) {
                    return fail(format!("group {g} keeps Mamba align state of slot {slot}"));
                }
                let len = m.blocks(slot).len();
                if a.last_state_block_idx.is_some_and(|i| i >= len) {
                    return fail(format!(
                        "group {g}: last_state_block_idx {:?} beyond the table ({len} blocks)",
                        a.last_state_block_idx
                    ));
                }
                if a.allocated && len < 1 + num_spec {
                    return fail(format!(
                        "group {g}: allocated align state with {len} blocks < 1 + {num_spec}"
                    ));
                }
            }
        }
        for b in 1..n {
            let rc = i64::from(pool.ref_cnt(b as BlockId));
            if rc != holders[b] {
                return fail(format!(
                    "block {b} has ref_cnt {rc} but {} holders",
                    holders[b]
                ));
            }
            if let Some((_, hg)) = pool.block_hash(b as BlockId) {
                if hg >= num_groups {
                    return fail(format!(
                        "block {b} is cached for group {hg} of {num_groups}"
                    ));
                }
            }
        }
        Ok(())
    }
}

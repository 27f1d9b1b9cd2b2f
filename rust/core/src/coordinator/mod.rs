//! The coordinator: drives one manager per KV-cache group and finds cache
//! hits across them, as vLLM's `get_kv_cache_coordinator` chooses:
//! no prefix cache, unitary (one group), or hybrid (several attention types).

use crate::attention::RetentionMarks;

mod build;
mod connector_hit;
mod hit_search;
mod partial_hits;

use crate::block_pool::BlockPool;
use crate::decode_bounds::{DecodeCounts, DecodeHorizon, DecodePhases};
use crate::group_manager::SingleTypeManager;
use crate::hashes::{HashList, ScaledHashes};
use crate::new_blocks::NewBlocks;
use crate::profile::{BlockHashView, HybridHit};
use crate::spec::SpecKind;
use crate::{cdiv, BlockId, ReqSlot};
pub use hit_search::CacheHit;
use hit_search::SpecGroup;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorKind {
    NoPrefixCache,
    Unitary,
    Hybrid,
}

#[derive(Debug, Clone)]
pub struct Coordinator {
    pub kind: CoordinatorKind,
    pub pool: BlockPool,
    pub managers: Vec<SingleTypeManager>,
    pub scheduler_block_size: u32,
    eagle_groups: Vec<bool>,
    // Hybrid only: spec groups, full attention first.
    spec_groups: Vec<SpecGroup>,
    hybrid_hit: HybridHit,
    pub hash_view: BlockHashView,
    // External tokens' metrics logged after every group's touches.
    two_phase_external: bool,
    /// Multi-module MTP (vLLM's `num_reprefillable_tokens`, its
    /// `num_prefill_lookahead - 1`): the last tokens may be re-prefilled,
    /// so their KV is not final and is not cached. 0 otherwise (whole-block-hits).
    pub reprefillable_tokens: usize,
    /// vLLM's `enable_partial_hash_hits` (`partial_hits.rs`).
    partial_hits: bool,
    /// What `settle` read, kept for `set_partial_hits_dcp`.
    settled: (bool, Option<(usize, crate::profile::Retention)>, bool),
}

impl Coordinator {
    /// Blocks the allocation needs (may be negative: Mamba align counts
    /// over-allocated blocks against the other groups, as vLLM sums them).
    #[allow(clippy::too_many_arguments)]
    pub fn get_num_blocks_to_allocate(
        &self,
        slot: ReqSlot,
        num_tokens: usize,
        new_computed: &[Vec<BlockId>],
        num_encoder_tokens: usize,
        total_computed_tokens: usize,
        num_external_computed_tokens: usize,
        num_local_computed_tokens: usize,
        num_tokens_main_model: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> i64 {
        self.managers
            .iter()
            .zip(new_computed)
            .map(|(m, nc)| {
                if m.spec.kind == SpecKind::CrossAttention {
                    // One static allocation for the encoder input.
                    m.get_num_blocks_to_allocate(
                        &self.pool,
                        slot,
                        num_encoder_tokens,
                        &[],
                        0,
                        0,
                        0,
                        num_encoder_tokens,
                        apply_admission_cap,
                        0,
                    )
                } else {
                    m.get_num_blocks_to_allocate(
                        &self.pool,
                        slot,
                        num_tokens,
                        nc,
                        total_computed_tokens,
                        num_external_computed_tokens,
                        num_local_computed_tokens,
                        num_tokens_main_model,
                        apply_admission_cap,
                        prefill_end,
                    )
                }
            })
            .sum()
    }

    /// Adds a new request's cache hits to every group, then allocates the
    /// blocks of its external tokens. vLLM (whole-block-hits) interleaves the two per
    /// group, so an earlier group's external blocks can pop a later group's
    /// free hit block, which that group then takes too: one block in two
    /// groups. Touching all hits first gives the same blocks whenever vLLM's
    /// result is sound; a metrics collector's log is then put back in vLLM's
    /// per-group order (each group's touches, then its external blocks).
    #[inline(never)] // admissions only: kept out of the decode's code
    pub fn allocate_new_computed_blocks(
        &mut self,
        slot: ReqSlot,
        new_computed: &[Vec<BlockId>],
        num_local_computed_tokens: usize,
        num_external_computed_tokens: usize,
        skip_zeroing_groups: u64,
    ) {
        let log = self.pool.records_metrics();
        let start = self.pool.metrics_len();
        let mut ends = Vec::new(); // the log's length after each group's step
        let mut external = Vec::with_capacity(self.managers.len());
        for (m, nc) in self.managers.iter_mut().zip(new_computed) {
            external.push(m.add_computed_blocks(
                &mut self.pool,
                slot,
                nc,
                num_local_computed_tokens,
                num_external_computed_tokens,
            ));
            if log {
                ends.push(self.pool.metrics_len());
            }
        }
        for (i, (m, &n)) in self.managers.iter_mut().zip(&external).enumerate() {
            let record = skip_zeroing_groups.checked_shr(i as u32).unwrap_or(0) & 1 == 0;
            m.allocate_external_blocks(&mut self.pool, slot, n, record);
            if log {
                ends.push(self.pool.metrics_len());
            }
        }
        if log
            && !self.two_phase_external
            && self.pool.metrics_len() > ends[self.managers.len() - 1]
        {
            self.pool.interleave_metrics(start, &ends);
        }
    }

    /// Mamba align groups (bit i: group i) whose allocation for the chunk
    /// `query_start..query_end` reserves a prefill checkpoint block, judged
    /// before the call changes any table (as vLLM's count records it).
    pub fn align_checkpoints(
        &self,
        slot: ReqSlot,
        query_start: usize,
        query_end: usize,
        prefill_end: usize,
    ) -> u64 {
        let mut mask = 0u64;
        for (i, m) in self.managers.iter().enumerate().take(64) {
            if m.align_checkpoint(slot, query_start, query_end, prefill_end) {
                mask |= 1 << i;
            }
        }
        mask
    }

    /// Records each Mamba align group's checkpoint of this count
    /// (`checkpoints`: `align_checkpoints`), for caching to key it.
    pub fn note_align_checkpoints(&mut self, slot: ReqSlot, checkpoints: u64, query_end: usize) {
        for (i, m) in self.managers.iter_mut().enumerate() {
            let on = checkpoints.checked_shr(i as u32).unwrap_or(0) & 1 == 1;
            m.note_align_checkpoint(slot, on, query_end);
        }
    }

    /// Whether some group's Mamba align rules beyond the table may act on
    /// a decode of the request (no compact decode then; see
    /// `SingleTypeManager::align_extras_may_act`).
    pub fn align_extras_may_act(&self, slot: ReqSlot) -> bool {
        self.managers.iter().any(|m| m.align_extras_may_act(slot))
    }

    /// Whether a caching rule uses the requests' shared-prefix junction:
    /// sparse retention keeping replay boundaries, or a Mamba group's
    /// checkpoint rules (vLLM uses `request.shared_prefix_boundary`
    /// there and nowhere else).
    pub fn reads_junction(&self) -> bool {
        matches!(
            self.settled.1,
            Some((_, crate::profile::Retention::ReplayBoundaries))
        ) || self.managers.iter().any(|m| m.reads_junction())
    }

    /// vLLM's `shared_prefix_checkpoint` on every Mamba group (only
    /// align caching reads it).
    pub fn set_shared_prefix_checkpoint(&mut self, on: bool) {
        for m in self.managers.iter_mut() {
            m.shared_prefix_checkpoint =
                on && matches!(m.attn, crate::attention::Attention::Mamba(_));
        }
    }

    /// `checkpoints`: `align_checkpoints` for this call.
    pub fn allocate_new_blocks(
        &mut self,
        slot: ReqSlot,
        num_tokens: usize,
        num_tokens_main_model: usize,
        num_encoder_tokens: usize,
        checkpoints: u64,
        out: &mut NewBlocks,
    ) {
        out.clear();
        for (i, m) in self.managers.iter_mut().enumerate() {
            let n = if m.spec.kind == SpecKind::CrossAttention {
                num_encoder_tokens
            } else {
                num_tokens
            };
            let checkpoint = checkpoints.checked_shr(i as u32).unwrap_or(0) & 1 == 1;
            m.allocate_new_blocks(
                &mut self.pool,
                slot,
                n,
                num_tokens_main_model,
                checkpoint,
                &mut out.ids,
            );
            out.ends.push(out.ids.len() as u32);
        }
    }

    /// Whether a plain decode step changes no block in any group (see
    /// `SingleTypeManager::decode_is_noop`).
    pub fn decode_is_noop(&self, slot: ReqSlot, c: &DecodeCounts, marks: &RetentionMarks) -> bool {
        self.managers.iter().all(|m| {
            let to_cache = c.to_cache.map(|t| self.tokens_to_cache(m, t));
            m.decode_is_noop(slot, &DecodeCounts { to_cache, ..*c }, marks)
        })
    }

    /// The request's decode horizon over all groups (see
    /// `SingleTypeManager::decode_horizon`), with each group's caching bound:
    /// the most tokens whose `tokens_to_cache` stays within its cached blocks.
    pub fn decode_horizon(&self, slot: ReqSlot, marks: &RetentionMarks) -> Option<DecodeHorizon> {
        let mut h = DecodeHorizon::UNBOUNDED;
        let (kind, sbs) = (self.kind, self.scheduler_block_size as usize);
        for m in &self.managers {
            let mut g = m.decode_horizon(slot, marks)?;
            if g.min_to_cache > 0 {
                g.min_to_cache = m.keying_bound(slot, g.min_to_cache, |n| {
                    first_count_caching(self.cacheable(), m, n)
                });
            }
            // tokens_to_cache(t) / bs <= cached  <=>  tokens_to_cache(t) < limit
            let limit = (m.num_cached_blocks(slot) + 1) * m.block_size as usize;
            g.max_to_cache = match kind {
                // Caches nothing, ever (`tokens_to_cache` is 0).
                _ if !m.spec.prefix_cacheable => usize::MAX,
                // Multi-module MTP's EAGLE rule has no closed form here: no
                // horizon (the tables judge each decode).
                CoordinatorKind::Hybrid if m.use_eagle && self.reprefillable_tokens > 0 => {
                    return None
                }
                CoordinatorKind::Hybrid if m.use_eagle => {
                    crate::decode_bounds::eagle_max_to_cache(limit, sbs, m.block_size as usize)
                }
                // t / sbs * sbs < limit  <=>  t < ceil(limit / sbs) * sbs
                CoordinatorKind::Hybrid => cdiv(limit, sbs) * sbs - 1,
                // t - reprefillable < limit
                _ => limit - 1 + self.reprefillable_tokens,
            };
            h = h.min(g);
        }
        Some(h)
    }

    /// Tokens each manager caches for `num_tokens` computed tokens.
    pub fn tokens_to_cache(&self, m: &SingleTypeManager, num_tokens: usize) -> usize {
        tokens_to_cache(self.cacheable(), m, num_tokens)
    }

    fn cacheable(&self) -> Cacheable {
        Cacheable {
            kind: self.kind,
            scheduler_block_size: self.scheduler_block_size as usize,
            reprefillable: self.reprefillable_tokens,
            partial_hits: self.partial_hits,
        }
    }

    /// Hashes (at hash_block_size) that caching up to `num_tokens` reads;
    /// `cached(m)` gives each manager's cached-block count at that point.
    pub fn hashes_needed_to_cache(
        &self,
        num_tokens: usize,
        cached: impl Fn(&SingleTypeManager) -> usize,
    ) -> usize {
        self.managers
            .iter()
            .map(|m| m.hashes_needed_to_cache(cached(m), self.tokens_to_cache(m, num_tokens)))
            .max()
            .unwrap_or(0)
    }

    /// Caches the request's blocks up to `num_tokens` computed tokens;
    /// `marks` place the replay boundaries that sparse retention keeps.
    pub fn cache_blocks(
        &mut self,
        slot: ReqSlot,
        hashes: &HashList,
        num_tokens: usize,
        marks: RetentionMarks,
    ) {
        let (rule, view) = (self.cacheable(), self.hash_view);
        for m in self.managers.iter_mut() {
            let tokens = tokens_to_cache(rule, m, num_tokens);
            m.cache_blocks(
                &mut self.pool,
                slot,
                ScaledHashes::viewed(hashes, m.scale, view),
                tokens,
                marks,
            );
        }
    }

    pub fn free(&mut self, slot: ReqSlot) {
        for m in self.managers.iter_mut() {
            m.free(&mut self.pool, slot);
        }
    }

    /// Every group's popped table, group by group (`pop_blocks_for_free`).
    pub fn pop_blocks(&mut self, slot: ReqSlot) -> Vec<BlockId> {
        let mut out = Vec::new();
        for m in self.managers.iter_mut() {
            out.extend(m.pop_blocks(slot));
        }
        out
    }

    /// `ghosts`: entries vLLM holds beyond this manager's requests.
    pub fn get_num_common_prefix_blocks(&mut self, slot: ReqSlot, ghosts: usize) -> Vec<usize> {
        match self.kind {
            CoordinatorKind::NoPrefixCache => vec![0; self.managers.len()],
            _ => self
                .managers
                .iter_mut()
                .map(|m| m.get_num_common_prefix_blocks(&self.pool, slot, ghosts))
                .collect(),
        }
    }

    /// Whether the request runs in every group (then a call without
    /// computed blocks, external or encoder tokens is a plain decode).
    pub fn runs_everywhere(&self, slot: ReqSlot) -> bool {
        self.managers.iter().all(|m| {
            // A ring never counts cached blocks: it runs once it holds its block.
            let runs = m.is_running(slot)
                || (m.attn.fixed_blocks().is_some() && !m.blocks(slot).is_empty());
            runs && m.spec.kind != SpecKind::CrossAttention && m.attn.decodes_compactly()
        })
    }

    /// A plain decode of a request that `runs_everywhere`: the window
    /// frees and the counts in one pass over the groups, then (if the pool
    /// has room after `reserved` blocks) the new blocks, then caching up
    /// to `c.to_cache` tokens. The same steps, in the same order, as the
    /// general path; false: no room (the window frees stay done, as there).
    /// `out` starts empty. A phase left out of `phases` is one the request's
    /// decode horizon shows changes nothing: its code is not run at all.
    #[allow(clippy::too_many_arguments)]
    pub fn plain_decode(
        &mut self,
        slot: ReqSlot,
        c: &DecodeCounts,
        phases: DecodePhases,
        reserved: usize,
        hashes: &HashList,
        marks: RetentionMarks,
        out: &mut NewBlocks,
    ) -> bool {
        debug_assert!(self.runs_everywhere(slot));
        let mut need = 0;
        // Within the allocation bound no group needs a block, and a Mamba
        // align group may need fewer than none: the count matters past the
        // bound, or where the pool has no room beyond `reserved`.
        let no_room = (self.pool.num_free_blocks() as usize) < reserved;
        if phases.frees || phases.allocation || no_room {
            for m in self.managers.iter_mut() {
                need += m.plain_decode_need(&mut self.pool, slot, c, phases.frees);
            }
        }
        if need > self.pool.num_free_blocks() as i64 - reserved as i64 {
            return false;
        }
        if phases.allocation {
            for m in self.managers.iter_mut() {
                m.allocate_new_blocks(
                    &mut self.pool,
                    slot,
                    c.need_slot,
                    c.main_model,
                    false,
                    &mut out.ids,
                );
                out.ends.push(out.ids.len() as u32);
            }
        } else {
            out.push_empty_groups(self.managers.len());
        }
        if let Some(t) = c.to_cache.filter(|_| phases.caching) {
            self.cache_blocks(slot, hashes, t, marks);
        }
        true
    }

    /// `num_prompt_tokens`: as vLLM's (R-SWA frees its gap given it).
    pub fn remove_skipped_blocks(
        &mut self,
        slot: ReqSlot,
        total_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
    ) {
        for m in self.managers.iter_mut() {
            m.remove_skipped_blocks(
                &mut self.pool,
                slot,
                total_computed_tokens,
                num_prompt_tokens,
            );
        }
    }

    pub fn new_step_starts(&mut self) {
        for m in self.managers.iter_mut() {
            m.new_step_starts();
        }
    }
}

/// What decides how much of a request a group caches.
#[derive(Debug, Clone, Copy)]
struct Cacheable {
    kind: CoordinatorKind,
    scheduler_block_size: usize,
    reprefillable: usize,
    /// Partial hash hits: hits end anywhere, so nothing is rounded.
    partial_hits: bool,
}

/// The fewest tokens for which `m` caches at least `n` (`tokens_to_cache`
/// is non-decreasing and never above its count, so a bisection from `n`
/// finds it from the rule itself); at most `n + reprefillable + sbs + bs`,
/// where it caches at least `n` (usize::MAX, admitting no count, should
/// the rule ever fall short).
fn first_count_caching(rule: Cacheable, m: &SingleTypeManager, n: usize) -> usize {
    let caches = |t: usize| tokens_to_cache(rule, m, t) >= n;
    let (mut lo, mut hi) = (
        n,
        n + rule.reprefillable + rule.scheduler_block_size + m.block_size as usize,
    );
    if !caches(hi) {
        return usize::MAX;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if caches(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Tokens `m` caches for `num_tokens` computed tokens (vLLM's
/// `get_num_cacheable_tokens`; with no re-prefillable tokens, the
/// whole-block-hits rule).
fn tokens_to_cache(rule: Cacheable, m: &SingleTypeManager, num_tokens: usize) -> usize {
    if !m.spec.prefix_cacheable {
        // Out of prefix caching (vLLM's `cache_blocks` returns).
        return 0;
    }
    // KV the next step may re-prefill (multi-module MTP) is not final.
    let finalized = num_tokens.saturating_sub(rule.reprefillable);
    if rule.kind != CoordinatorKind::Hybrid {
        return finalized;
    }
    // Hits are multiples of scheduler_block_size, so is what is cached;
    // EAGLE groups match one block past the boundary, so cache it too
    // (of the finalized tokens only).
    let sbs = rule.scheduler_block_size;
    let align = |n: usize| if rule.partial_hits { n } else { n / sbs * sbs };
    let aligned = align(num_tokens);
    if m.use_eagle && aligned > 0 {
        finalized.min(align(finalized) + m.block_size as usize)
    } else {
        aligned
    }
}

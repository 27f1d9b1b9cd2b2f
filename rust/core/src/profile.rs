//! Behaviour profiles: which semantics a manager follows, fixed at
//! construction (`ManagerConfig::profile`). A profile is data and small
//! strategy choices read where the rule is decided, never a second copy of
//! the managers. Flags are named for the behaviour, never for a release.
//! Each profile has a name (`BehaviourProfile::NAMED`, the one table of
//! them); the Python side's release table says which profile each vLLM
//! release follows. A release whose rules match a profile's reuses it; a
//! release with a new rule adds a variant of that flag's enum (the enums
//! are `#[non_exhaustive]`) or a flag, and a profile, not a new seam.
//!
//! The flags are those of the shared reference's release comparison
//! (§4.2). Where each is read:
//! - `free_policy`: `group_manager` (window frees and request frees choose
//!   the free-queue end through it);
//! - `new_block_ids`: `group_manager` (which groups record new block ids);
//! - `mamba`: `group_manager` (window frees, the no-op decode check and
//!   horizon) and `attention::mamba` (`allocate_align_blocks`);
//! - `common_prefix`: `kv_cache_manager` (`get_num_common_prefix_blocks`);
//! - `stats`: `kv_cache_manager::stats` (which lookups are counted);
//! - `hashing`: `block_hasher` (`extra_keys`: how LoRA / mm / cache salt
//!   / prompt embeds enter a block's key; `none_hash_seed`; `mm_window`:
//!   where a resumed multimodal scan starts; `lookahead`) through the
//!   binding's `BlockHasher` and `block_extra_keys`, which take the rules
//!   by profile name (the named profile's `hashing`);
//! - `retention`: `attention::sliding_window` and `attention::mamba`
//!   (which blocks sparse retention keeps: `reachable_blocks`, the replay
//!   boundary) and
//!   `coordinator` (which configs accept a retention interval);
//! - `hybrid_hit`: `coordinator` (the hybrid hit search: which groups are
//!   truncated, the EAGLE margin's cap, one spec group allowed, the
//!   uncached common prefix it reports);
//! - `block_hash_view`: `hashes::ScaledHashes` (what a wide block's hash
//!   is), through `coordinator` and the invariant check;
//! - `frees_on_processed_tokens`: `kv_cache_manager::allocate` (window
//!   frees lag the request's in-flight tokens);
//! - `partial_block_entries`: `block_pool` (`block_pool_keys.rs`: several
//!   keys per block), `group_manager/partial_tail.rs` (which full-attention
//!   groups cache the prompt's partial tail) and `attention::full` (the
//!   fine-grained phase of a hit, when hits align on hash blocks);
//! - `partial_hits`: `coordinator/partial_hits.rs` (when hits align on hash
//!   blocks) and `group_manager/copy_on_write.rs` (the private copy of a
//!   hit's partial tail block, Mamba's producer tails);
//! - `null_block_ref_counted`, `cache_cap_at_hashes`: the pool's touch/free
//!   (null counting), the caching step (the cap).

use crate::error::{CoreError, CoreResult};

/// Which end of the free queue freed blocks join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FreePolicy {
    /// Whole-block-hits: freed blocks are appended (evicted last), except that
    /// blocks leaving a window, and a sliding-window request's blocks when
    /// it is freed, go to the front (reused first) when not cached.
    AppendWindowScratchFirst,
    /// Partial-block-hits: every free goes through one rule: a block
    /// reaching zero references joins the front (reused first, LIFO) when it
    /// has no hash or caching is off, the back (LRU) when it is cached.
    UnhashedOrCachingOffFirst,
}

impl FreePolicy {
    /// Blocks leaving a window: does an uncached one go to the front?
    #[inline]
    pub(crate) fn window_scratch_first(self) -> bool {
        match self {
            FreePolicy::AppendWindowScratchFirst => true,
            FreePolicy::UnhashedOrCachingOffFirst => true,
        }
    }

    /// Whether the pool itself splits every freed list by hash, so
    /// callers hand their blocks over in eviction order and nothing else.
    #[inline]
    pub(crate) fn pool_splits(self) -> bool {
        match self {
            FreePolicy::AppendWindowScratchFirst => false,
            FreePolicy::UnhashedOrCachingOffFirst => true,
        }
    }

    /// A freed request's table: are its uncached blocks split off to the
    /// front (`type_scratch_first`: the attention type asks for it)?
    #[inline]
    pub(crate) fn request_scratch_first(self, type_scratch_first: bool) -> bool {
        match self {
            FreePolicy::AppendWindowScratchFirst => type_scratch_first,
            FreePolicy::UnhashedOrCachingOffFirst => true,
        }
    }
}

/// The NONE_HASH seed of the first block's parent (the rule:
/// `block_hasher::none_hash_seed`; the facade computes the bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoneHashMode {
    /// Plain keys: `hash_fn(PYTHONHASHSEED)`, else 32 random bytes per process.
    SeededOrRandom,
    /// Tagged keys: `hash_fn(seed)` always; the seed is PYTHONHASHSEED, else
    /// "vllm-none-hash" for sha256 / sha256_cbor (shareable across
    /// processes), else random hex for xxhash* (not collision resistant).
    SeededOrDefault,
}

/// How a block's extra keys (LoRA, cache salt, multimodal) are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtraKeyMode {
    /// Plain values (LoRA name, then the salt on the first block).
    Plain,
    /// Each value tagged with its source: `("lora", name, path)`,
    /// `("mm", id, offset)`, `("cache_salt", salt)`, `("prompt_embeds", d)`.
    Tagged,
}

impl ExtraKeyMode {
    /// The form KV events publish: untagged in every release so far
    /// (vLLM's `to_event_extra_keys` strips the tags).
    pub fn event_form(self) -> ExtraKeyMode {
        ExtraKeyMode::Plain
    }

    /// Whether a LoRA key names the adapter's path too (callers read
    /// `lora_path` only then).
    pub fn reads_lora_path(self) -> bool {
        matches!(self, ExtraKeyMode::Tagged)
    }
}

/// Where a request's multimodal scan starts when its hasher resumes at a
/// block after the first (`start_mm_idx` of the first new block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MmStart {
    /// Plain keys: `-1` (the last input), 0 on the first block.
    LastInput,
    /// Tagged keys: the first input ending after the block's start
    /// (`get_mm_features_in_window`), 0 when none does.
    Window,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hashing {
    pub none_hash: NoneHashMode,
    pub extra_keys: ExtraKeyMode,
    /// Lookahead hashes (vLLM's `num_hash_lookahead_tokens`): a block's
    /// hash also covers the next L tokens. False: L must be 0.
    pub lookahead_hash_tokens: bool,
    pub mm_start: MmStart,
}

impl Hashing {
    /// Untagged extra keys, a seeded-or-random NONE_HASH, no lookahead,
    /// a resumed multimodal scan from the last input (whole-block-hits).
    pub const PLAIN_KEYS: Hashing = Hashing {
        none_hash: NoneHashMode::SeededOrRandom,
        extra_keys: ExtraKeyMode::Plain,
        lookahead_hash_tokens: false,
        mm_start: MmStart::LastInput,
    };

    /// Tagged extra keys, a seeded-or-default NONE_HASH, lookahead hashes,
    /// a resumed multimodal scan from the block's window (partial-block-hits).
    pub const TAGGED_KEYS: Hashing = Hashing {
        none_hash: NoneHashMode::SeededOrDefault,
        extra_keys: ExtraKeyMode::Tagged,
        lookahead_hash_tokens: true,
        mm_start: MmStart::Window,
    };
}

/// How a retention interval (`ManagerConfig::retention_interval`: None
/// dense, 0 the replay boundary only, N one tail per N-token segment)
/// sparsifies what is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retention {
    /// Whole-block-hits (`VLLM_PREFIX_CACHE_RETENTION_INTERVAL`): sliding-window
    /// groups only; the one replay boundary kept is the last
    /// scheduler-block boundary before the prompt's last token.
    SlidingWindowPromptTail,
    /// Partial-block-hits (`KVCacheConfig.prefix_cache_retention_interval`): sliding
    /// window and Mamba groups (`attention::mamba::retention`); the
    /// tails kept are those ending at each of `replay_boundaries` (one
    /// position, two with EAGLE) and at the request's shared-prefix
    /// junction (`request.shared_prefix_boundary`, one block lower too for
    /// an EAGLE group). A config without such a group accepts 0.
    ReplayBoundaries,
}

impl Retention {
    /// Whether a config with no group this rule sparsifies accepts
    /// `interval` (replay boundaries take 0 there: dense either way).
    pub(crate) fn accepts_without_sparse_groups(self, interval: usize) -> bool {
        match self {
            Retention::SlidingWindowPromptTail => false,
            Retention::ReplayBoundaries => interval == 0,
        }
    }
}

/// A block's hash in a group whose blocks span several hash blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockHashView {
    /// Whole-block-hits: the concatenation of the block's hash-block hashes.
    Concatenated,
    /// Partial-block-hits: the last hash-block hash in the block (it chains over the
    /// whole prefix already).
    LastHashBlock,
}

/// The hybrid coordinator's hit search: what differs after its fixed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HybridHit {
    /// Whole-block-hits: only the first full-attention spec group is cut to the hit;
    /// an EAGLE group's lookup may reach one block past the candidate but
    /// not past `max_cache_hit_length`; two different specs at least.
    FirstFullTruncated,
    /// Partial-block-hits: every full-attention group is cut to the hit; the EAGLE
    /// lookup's cap is the tokens the request has hashes for; one spec
    /// group suffices (several equal full-attention groups); the search
    /// also reports the longest hit any type found (the uncached common
    /// prefix behind `shared_prefix_boundary`); a Mamba group's EAGLE
    /// lookup gets no margin (its finder drops nothing).
    EveryFullTruncated,
}

impl HybridHit {
    /// Whether an EAGLE Mamba group's lookup reaches one block past the
    /// candidate (`FirstFullTruncated`), or stops at it.
    #[inline]
    pub(crate) fn mamba_eagle_margin(self) -> bool {
        matches!(self, HybridHit::FirstFullTruncated)
    }
}

/// Mamba's rules that changed between releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MambaRules {
    /// Whole-block-hits: window frees take every draft token as rejected (the
    /// computed count less `num_speculative_blocks`); an align table's
    /// frees stop at the first null block below the window.
    DraftsRejected,
    /// Partial-block-hits: window frees follow the processed tokens alone
    /// (see `frees_on_processed_tokens`); an align table's frees pass over
    /// the null gaps prefill leaves (`_remove_blocks_in_range` down to the
    /// retired blocks); a request counts as allocated after its first
    /// allocation call, even one that needed no block. With prefix caching
    /// an align group also keys each prefill checkpoint block at its
    /// position (or evicts a transient one), caches the prompt's last
    /// reusable boundary, and queues every state it caches as a
    /// boundary-state offload for a KV connector.
    ProcessedTokensNullGaps,
}

impl MambaRules {
    /// Window frees subtract the speculative block count from the tokens.
    #[inline]
    pub(crate) fn drafts_rejected(self) -> bool {
        matches!(self, MambaRules::DraftsRejected)
    }

    /// Align frees pass over null blocks instead of stopping at one.
    #[inline]
    pub(crate) fn align_frees_skip_nulls(self) -> bool {
        matches!(self, MambaRules::ProcessedTokensNullGaps)
    }

    /// An align allocation that needs no block still marks the request
    /// allocated (its next round reuses the speculative blocks).
    #[inline]
    pub(crate) fn allocated_on_any_call(self) -> bool {
        matches!(self, MambaRules::ProcessedTokensNullGaps)
    }

    /// Align caching keys prefill checkpoints and the prompt boundary at
    /// their positions and queues boundary-state offloads.
    #[inline]
    pub(crate) fn caches_prefill_states(self) -> bool {
        matches!(self, MambaRules::ProcessedTokensNullGaps)
    }
}

/// Which groups record the ids of new blocks (`take_new_block_ids`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NewBlockIds {
    /// The groups whose spec says so (full attention, MLA, TQ).
    BySpec,
}

/// Which lookups count in the prefix-cache stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatsPolicy {
    /// Whole-block-hits: `get_computed_blocks` counts each lookup it makes (not the
    /// ones `skip_reading_prefix_cache` skips), preempted ones apart.
    CountedInLookup,
    /// Partial-block-hits: lookups count nothing; the scheduler records each
    /// admission (`record_prefix_cache_stats`).
    RecordedByScheduler,
}

/// One behaviour, as the core's flags (the profiles: `NAMED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BehaviourProfile {
    /// The profile's name in `NAMED`, as the binding is given it.
    pub name: &'static str,
    pub free_policy: FreePolicy,
    pub hashing: Hashing,
    pub retention: Retention,
    /// Sub-block hash hits with copy-on-write of the partial block.
    pub partial_hits: bool,
    /// Partial-block prefix-cache entries: a block
    /// may carry several keys, full attention over smaller hash blocks
    /// caches the prompt's partial tail, and a full-attention hit aligned
    /// to hash blocks probes the boundaries inside its next block. Off: one
    /// hash per block.
    pub partial_block_entries: bool,
    /// The null block's ref count is maintained.
    pub null_block_ref_counted: bool,
    /// Caching stops at the tokens that have hashes.
    pub cache_cap_at_hashes: bool,
    pub new_block_ids: NewBlockIds,
    /// `get_num_common_prefix_blocks` reports real counts (later releases
    /// answer zeros).
    pub common_prefix: bool,
    pub stats: StatsPolicy,
    /// `allocate_slots` may adopt prefix-cache hits with no new token; off,
    /// it needs new or external tokens.
    pub adopt_only_steps: bool,
    pub hybrid_hit: HybridHit,
    /// `allocate_slots` frees window blocks up to the processed tokens,
    /// `total_computed - request.num_in_flight_tokens` (async steps still
    /// read the blocks below); off, up to `total_computed`.
    pub frees_on_processed_tokens: bool,
    /// External tokens' blocks are allocated after every group touched its
    /// hits, and a metrics collector sees it in that order; off, the two
    /// interleave per group (that log order is kept).
    pub two_phase_external: bool,
    /// Groups flagged `is_eagle_group` drop their last hit block only when
    /// `use_eagle` is on (vLLM's `drop_eagle_group_ids`; with lookahead
    /// hashes the scheduler turns it off); off, they drop always.
    pub eagle_drop_needs_use_eagle: bool,
    pub block_hash_view: BlockHashView,
    pub mamba: MambaRules,
    /// `allocate_slots` takes `has_scheduled_reqs` and
    /// `skip_zeroing_group_ids` after its first ten parameters; off, the
    /// ten only.
    pub allocate_step_args: bool,
    /// `get_computed_blocks` takes `max_cache_hit_length`.
    pub lookup_hit_cap_arg: bool,
}

impl BehaviourProfile {
    /// Whole-block hits: one hash per block, appended frees, lookups
    /// counted as they are made.
    pub const WHOLE_BLOCK_HITS: BehaviourProfile = BehaviourProfile {
        name: "whole-block-hits",
        free_policy: FreePolicy::AppendWindowScratchFirst,
        hashing: Hashing::PLAIN_KEYS,
        retention: Retention::SlidingWindowPromptTail,
        partial_hits: false,
        partial_block_entries: false,
        null_block_ref_counted: true,
        cache_cap_at_hashes: false,
        new_block_ids: NewBlockIds::BySpec,
        common_prefix: true,
        stats: StatsPolicy::CountedInLookup,
        adopt_only_steps: false,
        hybrid_hit: HybridHit::FirstFullTruncated,
        frees_on_processed_tokens: false,
        two_phase_external: false,
        eagle_drop_needs_use_eagle: false,
        block_hash_view: BlockHashView::Concatenated,
        mamba: MambaRules::DraftsRejected,
        allocate_step_args: false,
        lookup_hit_cap_arg: false,
    };

    /// Partial-block hits: partial-block cache entries, sub-block hash
    /// hits with copy-on-write where a Mamba align block spans hash blocks,
    /// tagged hash keys with lookahead, one free rule for every free,
    /// scheduler-recorded stats (the shared reference's §4.1 feature table,
    /// last row).
    pub const PARTIAL_BLOCK_HITS: BehaviourProfile = BehaviourProfile {
        name: "partial-block-hits",
        free_policy: FreePolicy::UnhashedOrCachingOffFirst,
        hashing: Hashing::TAGGED_KEYS,
        retention: Retention::ReplayBoundaries,
        partial_hits: true,
        partial_block_entries: true,
        null_block_ref_counted: false,
        cache_cap_at_hashes: true,
        new_block_ids: NewBlockIds::BySpec,
        common_prefix: false,
        stats: StatsPolicy::RecordedByScheduler,
        adopt_only_steps: true,
        hybrid_hit: HybridHit::EveryFullTruncated,
        frees_on_processed_tokens: true,
        two_phase_external: true,
        eagle_drop_needs_use_eagle: true,
        block_hash_view: BlockHashView::LastHashBlock,
        mamba: MambaRules::ProcessedTokensNullGaps,
        allocate_step_args: true,
        lookup_hit_cap_arg: true,
    };

    /// Every profile by name: the one table of them.
    pub const NAMED: &'static [BehaviourProfile] = &[
        BehaviourProfile::WHOLE_BLOCK_HITS,
        BehaviourProfile::PARTIAL_BLOCK_HITS,
    ];

    /// The profile named `name` ("partial-block-hits").
    pub fn named(name: &str) -> CoreResult<BehaviourProfile> {
        Self::NAMED
            .iter()
            .find(|p| p.name == name)
            .copied()
            .ok_or_else(|| {
                let known: Vec<&str> = Self::NAMED.iter().map(|p| p.name).collect();
                CoreError::Unsupported(format!(
                    "no behaviour profile named {name:?} (known: {})",
                    known.join(", ")
                ))
            })
    }

    /// Whether a group of this spec records new block ids.
    #[inline]
    pub(crate) fn records_new_block_ids(&self, spec_reports: bool) -> bool {
        match self.new_block_ids {
            NewBlockIds::BySpec => spec_reports,
        }
    }
}

impl Default for BehaviourProfile {
    fn default() -> Self {
        BehaviourProfile::WHOLE_BLOCK_HITS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_resolve_by_name() {
        for p in BehaviourProfile::NAMED {
            assert_eq!(BehaviourProfile::named(p.name).unwrap(), *p);
        }
        assert_eq!(
            BehaviourProfile::named("partial-block-hits").unwrap(),
            BehaviourProfile::PARTIAL_BLOCK_HITS
        );
        let err = BehaviourProfile::named("no-such-profile").unwrap_err();
        assert!(format!("{err:?}").contains("whole-block-hits"), "{err:?}");
    }

    #[test]
    fn names_are_unique() {
        let names: std::collections::HashSet<&str> =
            BehaviourProfile::NAMED.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), BehaviourProfile::NAMED.len());
    }
}

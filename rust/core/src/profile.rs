//! Behaviour profiles: which vLLM release's semantics a manager follows,
//! fixed at construction (`ManagerConfig::profile`). A profile is data and
//! small strategy choices read where the rule is decided, never a second
//! copy of the managers. Only vLLM 0.23.0 exists today; each later release
//! adds a constant and, where its rule is new, a variant of the flag's enum
//! (the enums are `#[non_exhaustive]`), not a new seam.
//!
//! The flags are those of `reference/vllm-0.23-to-0.33.md` §4.2. Where each
//! is read:
//! - `free_policy`: `group_manager` (window frees and request frees choose
//!   the free-queue end through it);
//! - `new_block_ids`: `group_manager` (which groups record new block ids);
//! - `common_prefix`: `kv_cache_manager` (`get_num_common_prefix_blocks`);
//! - `stats`: `kv_cache_manager::stats` (which lookups are counted);
//! - `hashing`: `block_hasher::extra_keys` (how LoRA / cache salt enter a
//!   block's key) and the facade's NONE_HASH seed;
//! - `retention`: `attention::sliding_window` (which blocks sparse
//!   retention keeps: `reachable_blocks`, the replay boundary) and
//!   `coordinator` (which configs accept a retention interval);
//! - `partial_hits`, `null_block_ref_counted`, `cache_cap_at_hashes`: one
//!   value each today (0.23.0 has no such feature or does it one way); the
//!   0.33.0 port reads them where its rule goes (the pool's touch/free for
//!   null counting, the caching step for the cap, the hit search for
//!   partial hits).

use crate::error::{CoreError, CoreResult};

/// Which end of the free queue freed blocks join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FreePolicy {
    /// 0.23.0: freed blocks are appended (evicted last), except that
    /// blocks leaving a window, and a sliding-window request's blocks when
    /// it is freed, go to the front (reused first) when not cached.
    AppendWindowScratchFirst,
}

impl FreePolicy {
    /// Blocks leaving a window: does an uncached one go to the front?
    #[inline]
    pub(crate) fn window_scratch_first(self) -> bool {
        match self {
            FreePolicy::AppendWindowScratchFirst => true,
        }
    }

    /// A freed request's table: are its uncached blocks split off to the
    /// front (`type_scratch_first`: the attention type asks for it)?
    #[inline]
    pub(crate) fn request_scratch_first(self, type_scratch_first: bool) -> bool {
        match self {
            FreePolicy::AppendWindowScratchFirst => type_scratch_first,
        }
    }
}

/// The NONE_HASH seed of the first block's parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoneHashMode {
    /// 0.23.0: from PYTHONHASHSEED, else random per process (the facade
    /// computes it and passes the bytes).
    SeededOrRandom,
}

/// How a block's extra keys (LoRA, cache salt, multimodal) are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtraKeyMode {
    /// 0.23.0: plain values (LoRA name, then the salt on the first block).
    Plain,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hashing {
    pub none_hash: NoneHashMode,
    pub extra_keys: ExtraKeyMode,
    /// Hash tokens past the computed ones (0.33.0's lookahead hashes).
    pub lookahead_hash_tokens: bool,
}

/// How a retention interval (`ManagerConfig::retention_interval`: None
/// dense, 0 the replay boundary only, N one tail per N-token segment)
/// sparsifies what is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retention {
    /// 0.23.0 (`VLLM_PREFIX_CACHE_RETENTION_INTERVAL`): sliding-window
    /// groups only; the one replay boundary kept is the last
    /// scheduler-block boundary before the prompt's last token.
    SlidingWindowPromptTail,
}

/// Which groups record the ids of new blocks (`take_new_block_ids`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NewBlockIds {
    /// 0.23.0: the groups whose spec says so (full attention, MLA, TQ).
    BySpec,
}

/// Which lookups count in the prefix-cache stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatsPolicy {
    /// 0.23.0: `get_computed_blocks` counts each lookup it makes (not the
    /// ones `skip_reading_prefix_cache` skips), preempted ones apart.
    CountedInLookup,
}

/// One vLLM release's behaviour, as the core's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BehaviourProfile {
    /// The release, as `vllm.__version__` names it.
    pub release: &'static str,
    pub free_policy: FreePolicy,
    pub hashing: Hashing,
    pub retention: Retention,
    /// Sub-block hash hits with copy-on-write of the partial block.
    pub partial_hits: bool,
    /// The null block's ref count is maintained.
    pub null_block_ref_counted: bool,
    /// Caching stops at the tokens that have hashes.
    pub cache_cap_at_hashes: bool,
    pub new_block_ids: NewBlockIds,
    /// `get_num_common_prefix_blocks` reports real counts (later releases
    /// answer zeros).
    pub common_prefix: bool,
    pub stats: StatsPolicy,
}

impl BehaviourProfile {
    pub const V0_23: BehaviourProfile = BehaviourProfile {
        release: "0.23.0",
        free_policy: FreePolicy::AppendWindowScratchFirst,
        hashing: Hashing {
            none_hash: NoneHashMode::SeededOrRandom,
            extra_keys: ExtraKeyMode::Plain,
            lookahead_hash_tokens: false,
        },
        retention: Retention::SlidingWindowPromptTail,
        partial_hits: false,
        null_block_ref_counted: true,
        cache_cap_at_hashes: false,
        new_block_ids: NewBlockIds::BySpec,
        common_prefix: true,
        stats: StatsPolicy::CountedInLookup,
    };

    /// Every profile, oldest release first.
    pub const ALL: &'static [BehaviourProfile] = &[BehaviourProfile::V0_23];

    /// The profile of a vLLM release ("0.23.0"; "0.23" names it too).
    pub fn for_release(release: &str) -> CoreResult<BehaviourProfile> {
        Self::ALL
            .iter()
            .find(|p| p.release == release || p.release.strip_suffix(".0") == Some(release))
            .copied()
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|p| p.release).collect();
                CoreError::Unsupported(format!(
                    "no behaviour profile for vLLM {release:?} (known: {})",
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
        BehaviourProfile::V0_23
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_resolve() {
        assert_eq!(
            BehaviourProfile::for_release("0.23.0").unwrap(),
            BehaviourProfile::V0_23
        );
        assert_eq!(
            BehaviourProfile::for_release("0.23").unwrap(),
            BehaviourProfile::V0_23
        );
        assert!(BehaviourProfile::for_release("0.33.0").is_err());
    }
}

//! Building a coordinator (vLLM's `get_kv_cache_coordinator` and the
//! coordinators' constructors): the block-size and retention checks, the
//! kind, the spec groups of a hybrid hit search, EAGLE groups, and what each
//! group manager settles on.

use super::hit_search::split_spec_groups;
use super::partial_hits;
use super::{Coordinator, CoordinatorKind};
use crate::attention::Attention;
use crate::block_pool::BlockPool;
use crate::error::{CoreError, CoreResult};
use crate::group_manager::SingleTypeManager;
use crate::profile::BehaviourProfile;
use crate::spec::{context_parallel_groups, GroupSpec, SpecKind};

fn check_sizes(
    groups: &[GroupSpec],
    scheduler_block_size: u32,
    hash_block_size: u32,
) -> CoreResult<()> {
    if scheduler_block_size == 0
        || scheduler_block_size % hash_block_size != 0
        || groups
            .iter()
            .any(|g| scheduler_block_size % g.block_size != 0)
    {
        return Err(CoreError::InvalidArgument(format!(
            "scheduler_block_size ({scheduler_block_size}) must be a multiple of \
             hash_block_size ({hash_block_size}) and of every group's block_size"
        )));
    }
    Ok(())
}

/// A retention interval needs a group it sparsifies and must be a
/// multiple of the scheduler block (hits land there), as vLLM checks.
fn check_retention(
    groups: &[GroupSpec],
    interval: Option<usize>,
    scheduler_block_size: u32,
    profile: &BehaviourProfile,
) -> CoreResult<()> {
    let Some(n) = interval else {
        return Ok(());
    };
    let rule = profile.retention;
    if !groups
        .iter()
        .any(|g| Attention::from_spec(&g.kind).retains_sparsely(rule))
    {
        if rule.accepts_without_sparse_groups(n) {
            return Ok(());
        }
        return Err(CoreError::InvalidArgument(
            "a retention interval is set but this model has no sliding-window KV cache group, \
             so retention has no effect"
                .into(),
        ));
    }
    if n % scheduler_block_size as usize != 0 {
        return Err(CoreError::InvalidArgument(format!(
            "retention interval ({n}) must be non-negative and a multiple of \
             scheduler_block_size ({scheduler_block_size})"
        )));
    }
    Ok(())
}

impl Coordinator {
    /// `retention_interval`: see `ManagerConfig::retention_interval`.
    pub fn new(
        pool: BlockPool,
        groups: &[GroupSpec],
        use_eagle: bool,
        scheduler_block_size: u32,
        context_parallel: (u32, u32),
        retention_interval: Option<usize>,
        profile: &BehaviourProfile,
    ) -> CoreResult<Self> {
        let enable_caching = pool.enable_caching();
        let hash_block_size = pool.hash_block_size();
        check_sizes(groups, scheduler_block_size, hash_block_size)?;
        check_retention(groups, retention_interval, scheduler_block_size, profile)?;
        let groups = &context_parallel_groups(groups, enable_caching, context_parallel)?[..];
        let kind = if !enable_caching {
            CoordinatorKind::NoPrefixCache
        } else if groups.len() == 1 {
            if groups[0].block_size != hash_block_size {
                return Err(CoreError::InvalidArgument(format!(
                    "with one KV cache group and prefix caching, hash_block_size ({hash_block_size}) \
                     must equal the group's block_size times dcp_world_size * pcp_world_size \
                     ({}), as vLLM requires",
                    groups[0].block_size
                )));
            }
            CoordinatorKind::Unitary
        } else {
            // Groups out of prefix caching hash nothing (as in vLLM).
            if let Some(g) = groups
                .iter()
                .find(|g| g.prefix_cacheable && g.block_size % hash_block_size != 0)
            {
                return Err(CoreError::InvalidArgument(format!(
                    "block_size {} must be divisible by hash_block_size {hash_block_size}",
                    g.block_size
                )));
            }
            CoordinatorKind::Hybrid
        };
        if enable_caching && groups.iter().any(|g| g.kind == SpecKind::CrossAttention) {
            // vLLM accepts this config but fails on the first lookup
            // (CrossAttentionManager's hit search raises).
            return Err(CoreError::Unsupported(
                "prefix caching with cross-attention groups (vLLM cannot serve it either: its \
                 cross-attention hit search raises; encoder-decoder models run without it)"
                    .into(),
            ));
        }
        let mut eagle_groups: Vec<bool> = groups.iter().map(|g| g.is_eagle_group).collect();
        // vLLM flags every group when EAGLE is on but no group says it is one.
        if use_eagle && !eagle_groups.iter().any(|&e| e) {
            eagle_groups.iter_mut().for_each(|e| *e = true);
        }
        if !use_eagle && profile.eagle_drop_needs_use_eagle {
            // Lookahead hashes clear use_eagle: flagged groups drop nothing.
            eagle_groups.iter_mut().for_each(|e| *e = false);
        }
        let mut managers: Vec<SingleTypeManager> = groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                SingleTypeManager::new(
                    g.clone(),
                    i as u32,
                    enable_caching,
                    scheduler_block_size,
                    profile,
                )
            })
            .collect();
        let mut spec_groups = Vec::new();
        match kind {
            CoordinatorKind::Unitary => managers[0].use_eagle = eagle_groups[0],
            CoordinatorKind::Hybrid => {
                spec_groups = split_spec_groups(groups, &eagle_groups, profile.hybrid_hit)?;
                for sg in spec_groups.iter().filter(|sg| sg.use_eagle) {
                    for &g in &sg.group_ids {
                        managers[g as usize].use_eagle = true;
                    }
                }
            }
            CoordinatorKind::NoPrefixCache => {}
        }
        let partial_hits = kind == CoordinatorKind::Hybrid
            && profile.partial_hits
            && partial_hits::partial_hash_hits_enabled(groups, hash_block_size, context_parallel.0);
        if partial_hits {
            for m in managers.iter_mut() {
                m.alignment_tokens = hash_block_size;
            }
        }
        let retention = retention_interval.map(|n| (n, profile.retention));
        // Replay boundaries follow every EAGLE group, cacheable or not
        // (vLLM's `drop_eagle_group_ids`); a group outside the hit search
        // never gets `use_eagle` itself.
        let any_eagle = managers.iter().any(|m| m.use_eagle)
            || (kind != CoordinatorKind::NoPrefixCache && eagle_groups.iter().any(|&e| e));
        for m in managers.iter_mut() {
            m.settle(hash_block_size, any_eagle, retention);
        }
        Ok(Coordinator {
            kind,
            pool,
            managers,
            scheduler_block_size,
            eagle_groups,
            spec_groups,
            hybrid_hit: profile.hybrid_hit,
            hash_view: profile.block_hash_view,
            two_phase_external: profile.two_phase_external,
            reprefillable_tokens: 0,
            partial_hits,
            settled: (any_eagle, retention, profile.partial_hits),
        })
    }
}

//! The coordinator's cache-hit search: one group (unitary), or the hybrid
//! fixed point over spec groups (vLLM's `HybridKVCacheCoordinator`), whose
//! end differs by release (`profile::HybridHit`).

use super::{Coordinator, CoordinatorKind};
use crate::error::{CoreError, CoreResult};
use crate::group_manager::SingleTypeManager;
use crate::hashes::{HashList, ScaledHashes};
use crate::profile::HybridHit;
use crate::spec::GroupSpec;
use crate::{cdiv, BlockId};

/// Groups with one spec, looked up together (vLLM's `SpecGroup`).
#[derive(Debug, Clone)]
pub(super) struct SpecGroup {
    pub spec: GroupSpec,
    pub group_ids: Vec<u32>,
    pub use_eagle: bool,
}

/// A cache hit: blocks per group, its length in tokens, and the longest
/// hit one attention type found on its own (`>= len`; the difference is
/// the shared prefix a sparse-retention group has not cached, reported
/// under `HybridHit::EveryFullTruncated` only, else `len`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheHit {
    pub blocks: Vec<Vec<BlockId>>,
    pub len: usize,
    pub longest: usize,
}

fn same_spec(a: &GroupSpec, b: &GroupSpec) -> bool {
    if a.spec_class != u32::MAX || b.spec_class != u32::MAX {
        return a.spec_class == b.spec_class;
    }
    a.kind == b.kind && a.block_size == b.block_size
}

impl Coordinator {
    /// Longest cache hit (see `CacheHit`).
    pub fn find_longest_cache_hit(
        &self,
        hashes: &HashList,
        max_cache_hit_length: usize,
    ) -> CacheHit {
        let mut out = vec![Vec::new(); self.managers.len()];
        let hit = |blocks, len| CacheHit {
            blocks,
            len,
            longest: len,
        };
        match self.kind {
            CoordinatorKind::NoPrefixCache => hit(out, 0),
            CoordinatorKind::Unitary => {
                let m = &self.managers[0];
                SingleTypeManager::find_longest_cache_hit(
                    &m.spec,
                    &self.pool,
                    ScaledHashes::new(hashes, 1),
                    max_cache_hit_length,
                    &[0],
                    self.eagle_groups[0],
                    m.block_size as usize,
                    &mut out,
                );
                let len = out[0].len() * m.block_size as usize;
                hit(out, len)
            }
            CoordinatorKind::Hybrid => self.hybrid_cache_hit(hashes, max_cache_hit_length),
        }
    }

    /// Fixed point over attention types: each accepts the candidate length
    /// or shortens it; any shortening restarts the round. Lengths only
    /// decrease, so it ends.
    fn hybrid_cache_hit(&self, hashes: &HashList, max_len: usize) -> CacheHit {
        let hash_block_size = self.pool.hash_block_size();
        let every_full = self.hybrid_hit == HybridHit::EveryFullTruncated;
        // How far an EAGLE lookup may reach past the candidate.
        let eagle_cap = match self.hybrid_hit {
            HybridHit::FirstFullTruncated => max_len,
            HybridHit::EveryFullTruncated => hashes.len() * hash_block_size as usize,
        };
        let mut longest = 0;
        let mut by_group: Vec<Option<Vec<BlockId>>> = vec![None; self.managers.len()];
        let mut hit_length = max_len;
        let simple = self.spec_groups.len() == 2 && self.spec_groups[0].spec.is_full_attention();
        // Spec groups whose EAGLE drop is verified at the current length.
        let mut eagle_verified = vec![false; self.spec_groups.len()];
        let mut scratch: Vec<Vec<BlockId>> = Vec::new();
        // Each spec group's own hit length (partial hits: a full-attention
        // hit may end inside a block, so it is not the blocks' span).
        let mut group_len = vec![0; self.spec_groups.len()];
        loop {
            let mut curr = hit_length;
            for (idx, sg) in self.spec_groups.iter().enumerate() {
                let bs = sg.spec.block_size as usize;
                if sg.spec.is_full_attention() && by_group[sg.group_ids[0] as usize].is_some() {
                    // Full attention is downward closed: trim, no new lookup.
                    curr = if self.partial_hits {
                        curr.min(group_len[idx])
                    } else {
                        curr / bs * bs
                    };
                    continue;
                }
                let drop_eagle = sg.use_eagle && !eagle_verified[idx];
                let new_len =
                    self.spec_group_hit(sg, hashes, curr, eagle_cap, drop_eagle, &mut scratch);
                if drop_eagle {
                    eagle_verified[idx] = true;
                } else if new_len < curr {
                    eagle_verified.iter_mut().for_each(|v| *v = false);
                }
                curr = new_len;
                group_len[idx] = new_len;
                longest = longest.max(curr);
                for (&g, blocks) in sg.group_ids.iter().zip(scratch.iter_mut()) {
                    by_group[g as usize] = Some(std::mem::take(blocks));
                }
            }
            if curr >= hit_length {
                break;
            }
            hit_length = curr;
            if simple {
                break;
            }
        }
        let truncated = self
            .spec_groups
            .iter()
            .enumerate()
            .filter(|(i, sg)| sg.spec.is_full_attention() && (every_full || *i == 0));
        for (_, sg) in truncated {
            let n = cdiv(hit_length, sg.spec.block_size as usize);
            for &g in &sg.group_ids {
                if let Some(b) = by_group[g as usize].as_mut() {
                    b.truncate(n);
                }
            }
        }
        CacheHit {
            blocks: by_group
                .into_iter()
                .map(Option::unwrap_or_default)
                .collect(),
            len: hit_length,
            longest: if every_full { longest } else { hit_length },
        }
    }

    /// One spec group's lookup of at most `max_len` tokens into `out` (one
    /// list per member group); its hit length. With `drop_eagle`, EAGLE
    /// matches one more block (at most `eagle_cap` tokens), then drops it.
    fn spec_group_hit(
        &self,
        sg: &SpecGroup,
        hashes: &HashList,
        max_len: usize,
        eagle_cap: usize,
        drop_eagle: bool,
        out: &mut Vec<Vec<BlockId>>,
    ) -> usize {
        let bs = sg.spec.block_size as usize;
        // `EveryFullTruncated`: no margin for Mamba, whose finder drops nothing.
        let margin = !sg.spec.is_mamba() || self.hybrid_hit.mamba_eagle_margin();
        let max_length = if drop_eagle && margin {
            (max_len + self.eagle_margin(&sg.spec.kind, bs)).min(eagle_cap)
        } else {
            max_len
        };
        out.resize(sg.group_ids.len(), Vec::new());
        // The finder's own length: a fine-grained hit can end inside a block.
        SingleTypeManager::find_longest_cache_hit(
            &sg.spec,
            &self.pool,
            ScaledHashes::viewed(
                hashes,
                (sg.spec.block_size / self.pool.hash_block_size()) as usize,
                self.hash_view,
            ),
            max_length,
            &sg.group_ids,
            drop_eagle,
            self.alignment_tokens(),
            out,
        )
    }

    /// vLLM's `find_longest_cache_hit_per_group`: every spec group's
    /// own hit, not reconciled with the others (the offloading connector
    /// bounds its loads by the groups it does not offload): blocks and hit
    /// tokens per group; empty for groups outside the hit search. Hybrid
    /// coordinators only (vLLM's other coordinators lack it).
    pub fn find_longest_cache_hit_per_group(
        &self,
        hashes: &HashList,
        max_len: usize,
    ) -> CoreResult<(Vec<Vec<BlockId>>, Vec<usize>)> {
        if self.kind != CoordinatorKind::Hybrid || self.hybrid_hit != HybridHit::EveryFullTruncated
        {
            return Err(CoreError::InvalidArgument(
                "find_longest_cache_hit_per_group is the partial-block-hits hybrid coordinator's \
                 (several KV cache groups with prefix caching)"
                    .into(),
            ));
        }
        let eagle_cap = hashes.len() * self.pool.hash_block_size() as usize;
        let mut blocks = vec![Vec::new(); self.managers.len()];
        let mut lens = vec![0; self.managers.len()];
        let mut scratch = Vec::new();
        for sg in &self.spec_groups {
            let len =
                self.spec_group_hit(sg, hashes, max_len, eagle_cap, sg.use_eagle, &mut scratch);
            for (&g, b) in sg.group_ids.iter().zip(scratch.iter_mut()) {
                blocks[g as usize] = std::mem::take(b);
                lens[g as usize] = len;
            }
        }
        Ok((blocks, lens))
    }
}

/// Groups with equal specs, in first-seen order, then full attention first
/// (its left-to-right scan gives the tightest first bound).
pub(super) fn split_spec_groups(
    groups: &[GroupSpec],
    eagle: &[bool],
    rule: HybridHit,
) -> CoreResult<Vec<SpecGroup>> {
    let mut out: Vec<SpecGroup> = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        if !g.prefix_cacheable {
            // Scratch groups take no part in hits: their slot stays empty.
            continue;
        }
        match out.iter_mut().find(|sg| same_spec(&sg.spec, g)) {
            Some(sg) => {
                sg.group_ids.push(i as u32);
                sg.use_eagle |= eagle[i];
            }
            None => out.push(SpecGroup {
                spec: g.clone(),
                group_ids: vec![i as u32],
                use_eagle: eagle[i],
            }),
        }
    }
    let fewest = match rule {
        HybridHit::FirstFullTruncated => 2,
        HybridHit::EveryFullTruncated => 1,
    };
    if out.len() < fewest {
        return Err(CoreError::InvalidArgument(if fewest == 1 {
            "several KV cache groups with prefix caching need at least one prefix-cacheable group"
                .into()
        } else {
            "several KV cache groups with prefix caching need at least two different specs".into()
        }));
    }
    out.sort_by_key(|sg| !sg.spec.is_full_attention());
    Ok(out)
}

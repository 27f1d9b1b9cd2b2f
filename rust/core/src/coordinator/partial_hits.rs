//! vLLM's partial hash hits (kv_cache_utils
//! `partial_hash_hits_enabled` L762, `eagle_proof_margin` L804; coordinator
//! L694-716): a hybrid model with a Mamba align group whose block spans
//! several hash blocks finds hits at hash-block granularity, so a hit can
//! end inside a block, when every other prefix-cacheable group can look up
//! inner hash boundaries too (full attention and its subclasses) or has
//! blocks of one hash block. The copies such hits need
//! (`group_manager/copy_on_write.rs`) are drained here for the scheduler.

use super::Coordinator;
use crate::group_manager::SingleTypeManager;
use crate::spec::{GroupSpec, MambaMode, SpecKind};
use crate::BlockId;

/// Whether hits land on hash blocks (`groups`: with their context-parallel
/// block sizes). With dcp a Mamba block as wide as the hash block already
/// counts (the full-attention block is the one scaled).
pub(super) fn partial_hash_hits_enabled(
    groups: &[GroupSpec],
    hash_block_size: u32,
    dcp: u32,
) -> bool {
    let mamba_wide = groups.iter().any(|g| {
        matches!(
            g.kind,
            SpecKind::Mamba {
                mode: MambaMode::Align,
                ..
            }
        ) && if dcp == 1 {
            g.block_size > hash_block_size
        } else {
            g.block_size >= hash_block_size
        }
    });
    mamba_wide
        && groups.iter().all(|g| {
            !g.prefix_cacheable
                || supports_fine_grained_lookup(&g.kind)
                || g.block_size == hash_block_size
        })
}

/// vLLM's `supports_fine_grained_hash_lookup`: FullAttentionManager and
/// its subclasses (R-SWA) and MambaManager.
fn supports_fine_grained_lookup(kind: &SpecKind) -> bool {
    matches!(
        kind,
        SpecKind::FullAttention | SpecKind::Rswa { .. } | SpecKind::Mamba { .. }
    )
}

impl Coordinator {
    /// vLLM's `enable_partial_hash_hits`.
    pub fn partial_hash_hits(&self) -> bool {
        self.partial_hits
    }

    /// The enabling rule again under decode context parallelism `dcp`
    /// (vLLM's facade scales the dcp-sharded groups itself and
    /// builds the core with dcp 1; only this rule reads the real one): the
    /// hit alignment and what each group settled from it follow. Call
    /// before the first request.
    pub fn set_partial_hits_dcp(&mut self, dcp: u32) {
        let (any_eagle, retention, profile_on) = self.settled;
        let groups: Vec<GroupSpec> = self.managers.iter().map(|m| m.spec.clone()).collect();
        let hbs = self.pool.hash_block_size();
        self.partial_hits = self.kind == super::CoordinatorKind::Hybrid
            && profile_on
            && partial_hash_hits_enabled(&groups, hbs, dcp.max(1));
        let align = if self.partial_hits {
            hbs
        } else {
            self.scheduler_block_size
        };
        for m in self.managers.iter_mut() {
            m.alignment_tokens = align;
            m.settle(hbs, any_eagle, retention);
        }
    }

    /// vLLM's `_cache_hit_alignment_tokens`: where hits may end.
    pub fn alignment_tokens(&self) -> usize {
        if self.partial_hits {
            self.pool.hash_block_size() as usize
        } else {
            self.scheduler_block_size as usize
        }
    }

    /// vLLM's `eagle_proof_margin`: how far an EAGLE lookup of a group of
    /// block size `bs` matches past the candidate before dropping it (one
    /// hash block for fine-grained lookups, else one block).
    pub(super) fn eagle_margin(&self, kind: &SpecKind, bs: usize) -> usize {
        let hbs = self.pool.hash_block_size() as usize;
        if self.partial_hits && supports_fine_grained_lookup(kind) && bs > hbs {
            hbs
        } else {
            bs
        }
    }

    /// vLLM's `take_kv_cache_block_copies`: every group's pending
    /// copy-on-write pairs (source, copy), in group order, drained. Both
    /// ends hold an extra reference the caller gives back afterwards.
    pub fn take_cow_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        let mut out = Vec::new();
        for m in self.managers.iter_mut() {
            m.take_cow_copies(&mut out);
        }
        out
    }

    /// vLLM's `finalize_partial_tail_offloads`: (group, block, boundary
    /// tokens) of each Mamba align group whose producer tail is complete.
    pub fn finalize_partial_tails(
        &mut self,
        slot: crate::ReqSlot,
        num_computed_tokens: usize,
        num_in_flight_tokens: usize,
    ) -> Vec<(u32, BlockId, usize)> {
        self.managers
            .iter_mut()
            .filter_map(|m: &mut SingleTypeManager| {
                m.finalize_partial_tail(slot, num_computed_tokens, num_in_flight_tokens)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mamba(bs: u32) -> GroupSpec {
        GroupSpec::new(
            SpecKind::Mamba {
                mode: MambaMode::Align,
                num_speculative_blocks: 0,
            },
            bs,
        )
    }

    #[test]
    fn enabled_where_vllm_enables_it() {
        let full = GroupSpec::new(SpecKind::FullAttention, 16);
        let sw = |bs| GroupSpec::new(SpecKind::SlidingWindow { window: 8 }, bs);
        assert!(partial_hash_hits_enabled(&[full.clone(), mamba(64)], 16, 1));
        assert!(!partial_hash_hits_enabled(
            &[full.clone(), mamba(16)],
            16,
            1
        ));
        assert!(partial_hash_hits_enabled(&[full.clone(), mamba(16)], 16, 2));
        assert!(partial_hash_hits_enabled(
            &[full.clone(), sw(16), mamba(64)],
            16,
            1
        ));
        assert!(!partial_hash_hits_enabled(
            &[full, sw(32), mamba(64)],
            16,
            1
        ));
    }
}

//! vLLM 0.33.0's lookup for requests with a KV connector on hybrid models
//! with Mamba layers (`get_computed_blocks_for_connector`): each spec group
//! looked up on its own (`find_longest_cache_hit_per_group`); the
//! full-attention hit is the local prefix unless another group hit deeper.

use super::{Coordinator, CoordinatorKind};
use crate::group_manager::SingleTypeManager;
use crate::hashes::{HashList, ScaledHashes};
use crate::BlockId;

impl Coordinator {
    /// The first spec group's first group when it is full attention (the
    /// dense reference of per-group lookups); hybrid coordinators only.
    pub fn full_attention_group_id(&self) -> Option<usize> {
        if self.kind != CoordinatorKind::Hybrid {
            return None;
        }
        let first = self.spec_groups.first()?;
        first
            .spec
            .is_full_attention()
            .then(|| first.group_ids[0] as usize)
    }

    /// Every spec group's own longest hit (EAGLE margins as in the fixed
    /// point, none for Mamba): the blocks and hit tokens per group.
    pub fn find_longest_cache_hit_per_group(
        &self,
        hashes: &HashList,
        max_len: usize,
    ) -> (Vec<Vec<BlockId>>, Vec<usize>) {
        let n = self.managers.len();
        let mut blocks = vec![Vec::new(); n];
        let mut lens = vec![0; n];
        let hbs = self.pool.hash_block_size();
        let sbs = self.scheduler_block_size as usize;
        let mut scratch: Vec<Vec<BlockId>> = Vec::new();
        for sg in &self.spec_groups {
            let bs = sg.spec.block_size as usize;
            let max_length = if sg.use_eagle && !sg.spec.is_mamba() {
                (max_len + bs).min(hashes.len() * hbs as usize)
            } else {
                max_len
            };
            scratch.resize(sg.group_ids.len(), Vec::new());
            SingleTypeManager::find_longest_cache_hit(
                &sg.spec,
                &self.pool,
                ScaledHashes::viewed(hashes, (sg.spec.block_size / hbs) as usize, self.hash_view),
                max_length,
                &sg.group_ids,
                sg.use_eagle,
                sbs,
                &mut scratch,
            );
            let len = scratch[0].len() * bs;
            for (&g, b) in sg.group_ids.iter().zip(scratch.iter_mut()) {
                blocks[g as usize] = std::mem::take(b);
                lens[g as usize] = len;
            }
        }
        (blocks, lens)
    }
}

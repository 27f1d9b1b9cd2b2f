//! The coordinator: drives one manager per KV-cache group and finds cache
//! hits across them, as vLLM 0.23.0's `get_kv_cache_coordinator` chooses:
//! no prefix cache, unitary (one group), or hybrid (several attention types).

use crate::block_pool::BlockPool;
use crate::error::{CoreError, CoreResult};
use crate::hashes::ScaledHashes;
use crate::manager::SingleTypeManager;
use crate::spec::GroupSpec;
use crate::{BlockId, ReqSlot};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorKind {
    NoPrefixCache,
    Unitary,
}

#[derive(Debug, Clone)]
pub struct Coordinator {
    pub kind: CoordinatorKind,
    pub pool: BlockPool,
    pub managers: Vec<SingleTypeManager>,
    pub scheduler_block_size: u32,
    eagle_groups: Vec<bool>,
}

impl Coordinator {
    pub fn new(
        pool: BlockPool,
        groups: &[GroupSpec],
        use_eagle: bool,
        scheduler_block_size: u32,
    ) -> CoreResult<Self> {
        let enable_caching = pool.enable_caching();
        let hash_block_size = pool.hash_block_size();
        if scheduler_block_size == 0
            || scheduler_block_size % hash_block_size != 0
            || groups.iter().any(|g| scheduler_block_size % g.block_size != 0)
        {
            return Err(CoreError::InvalidArgument(format!(
                "scheduler_block_size ({scheduler_block_size}) must be a multiple of \
                 hash_block_size ({hash_block_size}) and of every group's block_size"
            )));
        }
        let kind = if !enable_caching {
            CoordinatorKind::NoPrefixCache
        } else if groups.len() == 1 {
            if groups[0].block_size != hash_block_size {
                return Err(CoreError::InvalidArgument(format!(
                    "with one KV cache group and prefix caching, hash_block_size ({hash_block_size}) \
                     must equal the group's block_size ({}), as vLLM 0.23.0 requires",
                    groups[0].block_size
                )));
            }
            CoordinatorKind::Unitary
        } else {
            return Err(CoreError::Unsupported(
                "prefix caching with several KV cache groups (HybridKVCacheCoordinator) \
                 is not implemented yet"
                    .into(),
            ));
        };
        let mut eagle_groups: Vec<bool> = groups.iter().map(|g| g.is_eagle_group).collect();
        // vLLM flags every group when EAGLE is on but no group says it is one.
        if use_eagle && !eagle_groups.iter().any(|&e| e) {
            eagle_groups.iter_mut().for_each(|e| *e = true);
        }
        let mut managers: Vec<SingleTypeManager> = groups
            .iter()
            .enumerate()
            .map(|(i, g)| SingleTypeManager::new(g.clone(), i as u32, enable_caching))
            .collect();
        if kind == CoordinatorKind::Unitary {
            managers[0].use_eagle = eagle_groups[0];
        }
        Ok(Coordinator { kind, pool, managers, scheduler_block_size, eagle_groups })
    }

    fn scale(&self, m: &SingleTypeManager) -> usize {
        (m.block_size / self.pool.hash_block_size()) as usize
    }

    pub fn get_num_blocks_to_allocate(
        &self,
        slot: ReqSlot,
        num_tokens: usize,
        new_computed: &[Vec<BlockId>],
        total_computed_tokens: usize,
    ) -> usize {
        self.managers
            .iter()
            .zip(new_computed)
            .map(|(m, nc)| {
                m.get_num_blocks_to_allocate(&self.pool, slot, num_tokens, nc, total_computed_tokens)
            })
            .sum()
    }

    pub fn allocate_new_computed_blocks(
        &mut self,
        slot: ReqSlot,
        new_computed: &[Vec<BlockId>],
        num_local_computed_tokens: usize,
        num_external_computed_tokens: usize,
    ) {
        for (m, nc) in self.managers.iter_mut().zip(new_computed) {
            m.allocate_new_computed_blocks(
                &mut self.pool,
                slot,
                nc,
                num_local_computed_tokens,
                num_external_computed_tokens,
            );
        }
    }

    pub fn allocate_new_blocks(&mut self, slot: ReqSlot, num_tokens: usize) -> Vec<Vec<BlockId>> {
        self.managers
            .iter_mut()
            .map(|m| m.allocate_new_blocks(&mut self.pool, slot, num_tokens).to_vec())
            .collect()
    }

    /// Hashes (at hash_block_size) that caching up to `num_tokens` reads.
    pub fn hashes_needed_to_cache(&self, slot: ReqSlot, num_tokens: usize) -> usize {
        self.managers
            .iter()
            .map(|m| m.hashes_needed_to_cache(slot, num_tokens, self.scale(m)))
            .max()
            .unwrap_or(0)
    }

    pub fn cache_blocks(&mut self, slot: ReqSlot, hashes: &[Box<[u8]>], num_tokens: usize) {
        let hash_block_size = self.pool.hash_block_size();
        for m in self.managers.iter_mut() {
            let scale = (m.block_size / hash_block_size) as usize;
            m.cache_blocks(&mut self.pool, slot, ScaledHashes::new(hashes, scale), num_tokens);
        }
    }

    pub fn free(&mut self, slot: ReqSlot) {
        for m in self.managers.iter_mut() {
            m.free(&mut self.pool, slot);
        }
    }

    pub fn get_num_common_prefix_blocks(&mut self, slot: ReqSlot) -> Vec<usize> {
        match self.kind {
            CoordinatorKind::NoPrefixCache => vec![0; self.managers.len()],
            CoordinatorKind::Unitary => self
                .managers
                .iter_mut()
                .map(|m| m.get_num_common_prefix_blocks(&self.pool, slot))
                .collect(),
        }
    }

    pub fn remove_skipped_blocks(&mut self, slot: ReqSlot, total_computed_tokens: usize) {
        for m in self.managers.iter_mut() {
            m.remove_skipped_blocks(&mut self.pool, slot, total_computed_tokens);
        }
    }

    /// Longest cache hit: blocks per group and the hit length in tokens.
    pub fn find_longest_cache_hit(
        &self,
        hashes: &[Box<[u8]>],
        max_cache_hit_length: usize,
    ) -> (Vec<Vec<BlockId>>, usize) {
        let mut out = vec![Vec::new(); self.managers.len()];
        match self.kind {
            CoordinatorKind::NoPrefixCache => (out, 0),
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
                (out, len)
            }
        }
    }

    pub fn new_step_starts(&mut self) {}
}

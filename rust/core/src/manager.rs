//! One manager per KV-cache group: the request -> blocks tables of that group
//! and the attention-type rules (how many blocks a request needs, which
//! blocks a cache hit may use, which blocks can be dropped).
//!
//! One struct serves every attention type; the per-type differences are the
//! `match self.spec.kind` arms, so no manager is a copy of another.

use std::collections::HashMap;

use crate::block_pool::BlockPool;
use crate::hashes::ScaledHashes;
use crate::spec::{GroupSpec, SpecKind};
use crate::{cdiv, BlockId, ReqSlot};

#[derive(Debug, Clone)]
pub struct SingleTypeManager {
    pub spec: GroupSpec,
    pub group_id: u32,
    pub block_size: u32,
    /// Whether cache hits of this group drop the EAGLE lookahead block.
    pub use_eagle: bool,
    // Entries exist exactly where vLLM's defaultdict has them: the count of
    // entries decides common-prefix blocks.
    pub(crate) req_to_blocks: HashMap<ReqSlot, Vec<BlockId>>,
    // Running requests only: how many of their blocks are cached.
    pub(crate) num_cached_block: HashMap<ReqSlot, usize>,
    new_block_ids: Vec<BlockId>,
    enable_caching: bool,
}

impl SingleTypeManager {
    pub fn new(spec: GroupSpec, group_id: u32, enable_caching: bool) -> Self {
        SingleTypeManager {
            block_size: spec.block_size,
            spec,
            group_id,
            use_eagle: false,
            req_to_blocks: HashMap::new(),
            num_cached_block: HashMap::new(),
            new_block_ids: Vec::new(),
            enable_caching,
        }
    }

    pub fn blocks(&self, slot: ReqSlot) -> &[BlockId] {
        self.req_to_blocks.get(&slot).map_or(&[], |v| v.as_slice())
    }

    /// The request is running in this group (it has a cached-block count).
    pub fn is_running(&self, slot: ReqSlot) -> bool {
        self.num_cached_block.contains_key(&slot)
    }

    pub fn holds(&self, slot: ReqSlot) -> bool {
        self.req_to_blocks.contains_key(&slot) || self.num_cached_block.contains_key(&slot)
    }

    /// Tokens before this count are outside the attention window.
    fn num_skipped_tokens(&self, _num_computed_tokens: usize) -> usize {
        match self.spec.kind {
            SpecKind::FullAttention => 0,
        }
    }

    pub fn get_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: ReqSlot,
        num_tokens: usize,
        new_computed: &[BlockId],
        total_computed_tokens: usize,
    ) -> usize {
        let num_required = cdiv(num_tokens, self.block_size as usize);
        let num_req_blocks = self.blocks(slot).len();
        if self.is_running(slot) {
            // Draft tokens may have been rejected: the table can be longer
            // than what is required now.
            return num_required.saturating_sub(num_req_blocks);
        }
        let num_skipped_blocks =
            self.num_skipped_tokens(total_computed_tokens) / self.block_size as usize;
        let num_local_computed = new_computed.len() + num_req_blocks;
        let num_new = num_required.saturating_sub(num_skipped_blocks.max(num_local_computed));
        let skip_new = num_skipped_blocks.saturating_sub(num_req_blocks).min(new_computed.len());
        // Cache hits sitting in the free queue leave it when touched.
        let num_evictable = new_computed[skip_new..]
            .iter()
            .filter(|&&b| pool.ref_cnt(b) == 0 && b != crate::block_pool::NULL_BLOCK)
            .count();
        num_new + num_evictable
    }

    pub fn allocate_new_computed_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        new_computed: &[BlockId],
        num_local_computed_tokens: usize,
        num_external_computed_tokens: usize,
    ) {
        if self.is_running(slot) {
            return;
        }
        let total = num_local_computed_tokens + num_external_computed_tokens;
        let skipped_tokens = self.num_skipped_tokens(total);
        let num_skipped_blocks = skipped_tokens / self.block_size as usize;
        let mut external = num_external_computed_tokens;
        let mut computed = new_computed;
        if num_skipped_blocks > 0 {
            computed = &new_computed[num_skipped_blocks.min(new_computed.len())..];
            external = external.min(total - skipped_tokens);
        }
        if self.enable_caching {
            pool.touch(computed);
        }
        let blocks = self.req_to_blocks.entry(slot).or_default();
        blocks.extend(std::iter::repeat_n(crate::block_pool::NULL_BLOCK, num_skipped_blocks));
        blocks.extend_from_slice(computed);
        self.num_cached_block.insert(slot, blocks.len());
        if external > 0 {
            let n = cdiv(total, self.block_size as usize).saturating_sub(blocks.len());
            let start = blocks.len();
            pool.get_new_blocks(n, blocks);
            if self.spec.reports_new_block_ids {
                self.new_block_ids.extend_from_slice(&blocks[start..]);
            }
        }
    }

    /// Grows the table to cover `num_tokens`; returns the new blocks' range.
    pub fn allocate_new_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        num_tokens: usize,
    ) -> &[BlockId] {
        let blocks = self.req_to_blocks.entry(slot).or_default();
        let num_required = cdiv(num_tokens, self.block_size as usize);
        if num_required <= blocks.len() {
            return &[];
        }
        let start = blocks.len();
        pool.get_new_blocks(num_required - start, blocks);
        if self.spec.reports_new_block_ids {
            self.new_block_ids.extend_from_slice(&blocks[start..]);
        }
        &blocks[start..]
    }

    pub fn take_new_block_ids(&mut self, out: &mut Vec<BlockId>) {
        out.append(&mut self.new_block_ids);
    }

    /// Hashes needed (at hash_block_size) to cache up to `num_tokens`.
    pub fn hashes_needed_to_cache(&self, slot: ReqSlot, num_tokens: usize, scale: usize) -> usize {
        let num_cached = self.num_cached_block.get(&slot).copied().unwrap_or(0);
        let num_full = num_tokens / self.block_size as usize;
        if num_cached >= num_full {
            0
        } else {
            num_full * scale
        }
    }

    pub fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        hashes: ScaledHashes<'_>,
        num_tokens: usize,
    ) {
        let num_cached = self.num_cached_block.get(&slot).copied().unwrap_or(0);
        let num_full = num_tokens / self.block_size as usize;
        if num_cached >= num_full {
            return;
        }
        let blocks = self.req_to_blocks.entry(slot).or_default();
        pool.cache_full_blocks(
            blocks,
            num_cached,
            num_full,
            self.block_size,
            self.group_id,
            None,
            |i| hashes.get(i),
        );
        self.num_cached_block.insert(slot, num_full);
    }

    /// Frees the request's blocks, tail first so tails are evicted first.
    pub fn free(&mut self, pool: &mut BlockPool, slot: ReqSlot) {
        if let Some(blocks) = self.req_to_blocks.remove(&slot) {
            pool.free_blocks(blocks.iter().rev().copied(), false);
        }
        self.num_cached_block.remove(&slot);
    }

    /// Leading blocks held by every request that has an entry in this group.
    pub fn get_num_common_prefix_blocks(&mut self, pool: &BlockPool, slot: ReqSlot) -> usize {
        self.req_to_blocks.entry(slot).or_default();
        let holders = self.req_to_blocks.len() as i64;
        match self.spec.kind {
            SpecKind::FullAttention => self.req_to_blocks[&slot]
                .iter()
                .take_while(|&&b| i64::from(pool.ref_cnt(b)) == holders)
                .count(),
        }
    }

    /// Frees blocks that fall outside the attention window, replacing them
    /// with the null block.
    pub fn remove_skipped_blocks(&mut self, pool: &mut BlockPool, slot: ReqSlot, total: usize) {
        let skipped = self.num_skipped_tokens(total);
        if skipped == 0 {
            return;
        }
        let blocks = self.req_to_blocks.entry(slot).or_default();
        let n = (skipped / self.block_size as usize).min(blocks.len());
        let mut removed_cached = Vec::new();
        let mut removed_uncached = Vec::new();
        for i in (0..n).rev() {
            let b = blocks[i];
            if b == crate::block_pool::NULL_BLOCK {
                break;
            }
            if pool.block_hash(b).is_none() {
                removed_uncached.push(b);
            } else {
                removed_cached.push(b);
            }
            blocks[i] = crate::block_pool::NULL_BLOCK;
        }
        // Scratch blocks go to the front of the free queue (reused first);
        // cached ones stay behind as best-effort prefix-cache entries.
        pool.free_blocks(removed_cached, false);
        pool.free_blocks(removed_uncached, true);
    }

    /// Longest prefix of `hashes` cached in every group of `groups`, at most
    /// `max_length` tokens. Fills `out[k]` for `groups[k]`.
    #[allow(clippy::too_many_arguments)]
    pub fn find_longest_cache_hit(
        spec: &GroupSpec,
        pool: &BlockPool,
        hashes: ScaledHashes<'_>,
        max_length: usize,
        groups: &[u32],
        drop_eagle_block: bool,
        alignment_tokens: usize,
        out: &mut [Vec<BlockId>],
    ) {
        for o in out.iter_mut() {
            o.clear();
        }
        let block_size = spec.block_size as usize;
        match spec.kind {
            SpecKind::FullAttention => {
                let max_blocks = (max_length / block_size).min(hashes.len());
                let mut hit = Vec::with_capacity(groups.len());
                for i in 0..max_blocks {
                    // Hashes form a chain: after the first miss nothing can hit.
                    if !pool.get_cached_block(&hashes.get(i), groups, &mut hit) {
                        break;
                    }
                    for (o, &b) in out.iter_mut().zip(&hit) {
                        o.push(b);
                    }
                }
                if drop_eagle_block && !out[0].is_empty() {
                    out.iter_mut().for_each(|o| {
                        o.pop();
                    });
                }
                while block_size != alignment_tokens && out[0].len() * block_size % alignment_tokens != 0 {
                    out.iter_mut().for_each(|o| {
                        o.pop();
                    });
                }
            }
        }
    }

    /// Slots and tables, for invariant checks.
    pub fn tables(&self) -> impl Iterator<Item = (ReqSlot, &[BlockId])> + '_ {
        self.req_to_blocks.iter().map(|(s, b)| (*s, b.as_slice()))
    }
}

//! Caching a request's blocks in one group (vLLM's `cache_blocks`): how
//! many hashes a call needs, what a lookup's computed tokens leave cached,
//! the prefix-cache keys of the full blocks (sparse retention's marks and
//! replay tails decide which), and the common-prefix count a
//! whole-block-hits scheduler asks for.

use super::{entry_key, SingleTypeManager};
use crate::attention::{ReplayTails, RetentionMarks};
use crate::block_pool::BlockPool;
use crate::hashes::ScaledHashes;
use crate::ReqSlot;

impl SingleTypeManager {
    /// Hashes (at hash_block_size) that caching up to `num_tokens` reads,
    /// given `num_cached` blocks already cached.
    pub fn hashes_needed_to_cache(&self, num_cached: usize, num_tokens: usize) -> usize {
        let num_full = num_tokens / self.bs();
        if num_cached >= num_full {
            0
        } else {
            num_full * self.scale
        }
    }

    /// Cached-block count once `allocate_new_computed_blocks` has run (for
    /// checking arguments before anything changes).
    pub fn num_cached_after_computed(
        &self,
        slot: ReqSlot,
        num_new_computed: usize,
        total_computed: usize,
    ) -> usize {
        if self.is_running(slot) {
            return self.num_cached_blocks(slot);
        }
        if !self.attn.is_per_token() {
            return 0;
        }
        let skipped = self.attn.skipped_tokens(total_computed) / self.bs();
        skipped.max(num_new_computed)
    }

    /// Caches the full blocks up to `num_tokens` the type keeps (`marks`:
    /// see `ReachableBlocks::replay_tails`).
    pub fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        hashes: ScaledHashes<'_>,
        num_tokens: usize,
        marks: RetentionMarks,
    ) {
        let num_cached = self.num_cached_blocks(slot);
        self.cache_full(pool, slot, &hashes, num_tokens, marks);
        if self.caches_align_states() {
            self.cache_align_states(pool, slot, &hashes, num_tokens, marks, num_cached);
        }
        if self.partial_tails {
            self.cache_partial_tail(pool, slot, hashes, num_tokens, marks.num_prompt_tokens);
        }
    }

    fn cache_full(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        hashes: &ScaledHashes<'_>,
        num_tokens: usize,
        marks: RetentionMarks,
    ) {
        let num_cached = self.num_cached_blocks(slot);
        let mut num_full = num_tokens / self.bs();
        if num_cached >= num_full {
            // Nothing to cache (always so out of prefix caching, where the
            // hash view may not fit the block size).
            return;
        }
        if self.cap_at_hashes {
            // Lookahead hashes arrive after their block is full.
            num_full = num_full.min(hashes.len());
        }
        if num_cached >= num_full {
            return;
        }
        let (reachable, block_size, group_id) = (self.reachable, self.block_size, self.group_id);
        let tails = reachable.map_or(ReplayTails::default(), |r| r.replay_tails(marks));
        // Mamba align groups note what they cached this step only after
        // keying their states (`cache_align_states`): a checkpoint block is
        // then re-keyed or evicted, and vLLM notes the hashes blocks hold.
        let marks = self.attn.hits_wait_a_step() && !self.caches_align_states();
        let r = self.records.with_table(slot);
        r.num_cached = Some(num_full);
        let blocks = &r.blocks;
        pool.cache_full_blocks(
            blocks,
            num_cached,
            num_full,
            block_size,
            group_id,
            |i| reachable.is_none_or(|r| r.keeps(i, &tails)),
            |i| hashes.get(i),
        );
        if marks {
            let end = num_full.min(blocks.len());
            for &b in &blocks[num_cached.min(end)..end] {
                if let Some(key) = pool.block_entry(b).map(entry_key) {
                    self.cached_this_step.insert(key);
                }
            }
        }
    }

    /// The `req_to_blocks` entry vLLM makes for a common-prefix question
    /// (false: types whose tables share no prefix make none).
    pub(crate) fn note_common_prefix_entry(&mut self, slot: ReqSlot) -> bool {
        if !self.attn.shares_prefix() {
            return false;
        }
        self.records.with_table(slot);
        true
    }

    /// Leading blocks held by every request that has an entry in this group;
    /// `ghosts`: entries vLLM holds beyond this manager's requests.
    pub fn get_num_common_prefix_blocks(
        &mut self,
        pool: &BlockPool,
        slot: ReqSlot,
        ghosts: usize,
    ) -> usize {
        if !self.note_common_prefix_entry(slot) {
            return 0;
        }
        let holders = (self.records.num_block_entries + ghosts) as i64;
        self.blocks(slot)
            .iter()
            .take_while(|&&b| i64::from(pool.ref_cnt(b)) == holders)
            .count()
    }
}

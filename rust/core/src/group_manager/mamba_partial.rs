//! vLLM's Mamba align caching beyond the full blocks when a block
//! spans several hash blocks (`MambaManager.cache_blocks` /
//! `_cache_partial_tail_block`, L1978-2135): states are keyed at hash
//! boundaries inside their block (`cache_partial_block`). The prefill
//! checkpoint block is re-keyed at its position (or evicted when that
//! state is transient); the prompt's last reusable hash boundary is keyed
//! on the running state block, which the request keeps writing: it becomes
//! a producer tail, copied on its next allocation (`copy_on_write.rs`). With
//! the shared-prefix checkpoint the junction inside the prompt chunk being
//! computed is keyed the same way (`keys_prompt_state_at`).
//! Blocks of one hash block each keep `mamba_cache.rs`.

use super::{entry_key, SingleTypeManager};
use crate::attention::RetentionMarks;
use crate::block_pool::{BlockPool, PartialEntry, NULL_BLOCK};
use crate::hashes::ScaledHashes;
use crate::{cdiv, BlockId, ReqSlot};

impl SingleTypeManager {
    /// `cache_partial_block` of `b` at `tokens` (a hash boundary the
    /// request has hashed); the entry its key landed in.
    fn cache_state_at(
        &self,
        pool: &mut BlockPool,
        b: BlockId,
        hashes: &ScaledHashes<'_>,
        tokens: usize,
        replace_existing: bool,
    ) -> Option<u32> {
        let hbs = pool.hash_block_size() as usize;
        let raw = hashes.raw();
        let n = tokens / hbs;
        if b == NULL_BLOCK || n == 0 || n > raw.len() {
            return None;
        }
        let hash = raw.get(n - 1);
        pool.cache_partial_block(PartialEntry {
            block: b,
            group: self.group_id,
            num_tokens: tokens,
            hash,
            parent: (n > 1).then(|| raw.get(n - 2)),
            replace_existing,
        });
        pool.entry_of(hash)
    }

    /// After the full blocks `before..` of `num_tokens` are cached (scale >
    /// 1): the offloads of those blocks, then the checkpoint or prompt tail.
    pub(super) fn cache_align_states_fine(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        hashes: &ScaledHashes<'_>,
        num_tokens: usize,
        marks: RetentionMarks,
        before: usize,
    ) {
        let Some(c) = self.spec.mamba_checkpoints else {
            return;
        };
        let bs = self.bs();
        let hbs = pool.hash_block_size() as usize;
        let prompt = marks.num_prompt_tokens.unwrap_or(0);
        // vLLM reads the cached count before the tail may lower it.
        let after = self.num_cached_blocks(slot).min(self.blocks(slot).len());
        let block_at = |m: &Self, i: usize| m.blocks(slot).get(i).copied();
        let mut key = None;
        if let Some((position, idx)) = self.align_state(slot).and_then(|a| a.checkpoint) {
            let b = block_at(self, idx).unwrap_or(NULL_BLOCK);
            if !self.checkpoint_is_reusable(&c, position, prompt, &marks) {
                // A transient state overwrites this slot: not reusable.
                pool.evict_cached_block(b);
            } else if pool.block_hash_num_tokens(b) != Some(position as u32) {
                key = self.cache_state_at(pool, b, hashes, position, true);
            }
        } else if num_tokens > 0 && num_tokens % hbs == 0 {
            let idx = cdiv(num_tokens, bs) - 1;
            let keys = self.keys_prompt_state_at(&c, num_tokens, hbs, &marks);
            if let Some(b) = block_at(self, idx).filter(|_| keys) {
                if b != NULL_BLOCK && pool.block_hash_num_tokens(b) != Some(num_tokens as u32) {
                    key = self.cache_state_at(pool, b, hashes, num_tokens, false);
                    if key.is_some() && num_tokens % bs != 0 {
                        self.note_producer_tail(slot, idx, b, num_tokens);
                    }
                }
            }
        }
        if let Some(e) = key {
            self.cached_this_step.insert(entry_key((e, self.group_id)));
        }
        for i in before.min(after)..after {
            let b = block_at(self, i).unwrap_or(NULL_BLOCK);
            if b == NULL_BLOCK || pool.block_entry(b).is_none() {
                continue;
            }
            if let Some(e) = pool.block_entry(b) {
                self.cached_this_step.insert(entry_key(e));
            }
            let tokens = pool.block_hash_num_tokens(b).unwrap_or(0) as usize;
            self.pending_offloads.push((slot, b, tokens));
        }
    }
}

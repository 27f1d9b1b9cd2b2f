//! vLLM's `FullAttentionManager._cache_partial_tail_block`
//! (single_type_kv_cache_manager.py L866-897): when a full-attention block
//! spans several hash blocks, the last hash boundary of the prompt that a
//! later request can resend (`num_prompt_tokens - 1` tokens, the whole
//! prompt for EAGLE lookups) is cached as a partial entry on the block it
//! ends in, if that block is not full there. Called on every caching call
//! (the pool ignores a key the block already has).

use super::SingleTypeManager;
use crate::block_pool::{BlockPool, PartialEntry};
use crate::hashes::ScaledHashes;
use crate::ReqSlot;

impl SingleTypeManager {
    /// Whether this group caches the prompt's partial tail.
    pub fn caches_partial_tails(&self) -> bool {
        self.partial_tails
    }

    pub(super) fn cache_partial_tail(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        hashes: ScaledHashes<'_>,
        num_tokens: usize,
        num_prompt_tokens: Option<usize>,
    ) {
        // The manager asks for the prompt length whenever partial tails
        // are on (`KvCacheManager::wants_num_prompt_tokens`).
        let Some(prompt) = num_prompt_tokens else {
            debug_assert!(false, "a partial tail needs the prompt length");
            return;
        };
        let Some(b) = self.partial_tail_boundary(hashes, num_tokens, prompt) else {
            return;
        };
        let Some(&block) = self.req(slot).and_then(|r| r.blocks.get(b / self.bs())) else {
            return;
        };
        let hbs = self.bs() / hashes.scale();
        let raw = hashes.raw();
        let n = b / hbs;
        pool.cache_partial_block(PartialEntry {
            block,
            group: self.group_id,
            num_tokens: b,
            hash: raw.get(n - 1),
            parent: (n > 1).then(|| raw.get(n - 2)),
            replace_existing: false,
        });
    }

    /// The prompt's partial-tail boundary (tokens), if caching up to
    /// `num_tokens` registers one: a hash boundary, hashed already, inside
    /// a block.
    fn partial_tail_boundary(
        &self,
        hashes: ScaledHashes<'_>,
        num_tokens: usize,
        prompt: usize,
    ) -> Option<usize> {
        let hbs = self.bs() / hashes.scale();
        let limit = if self.use_eagle {
            prompt
        } else {
            prompt.saturating_sub(1)
        };
        let b = (limit / hbs).min(hashes.raw().len()) * hbs;
        (b != 0 && b <= num_tokens && b % self.bs() != 0).then_some(b)
    }
}

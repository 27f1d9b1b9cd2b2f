//! Re-keying one cached block (vLLM's `cache_partial_block` where
//! the entry is one whole hash block): Mamba align keys a prefill
//! checkpoint block, or the prompt's last reusable boundary, at a prefix
//! position other than its own table index.

use std::borrow::Cow;

use super::BlockPool;
use crate::BlockId;

impl BlockPool {
    /// Drops `b`'s hash (a `Removed` event if it had one), then caches it
    /// under `hash_of(i)`, the hash ending hash block `i`, for `group`,
    /// with the `Stored` event of that one hash block (parent `hash_of(i -
    /// 1)`). Returns the new prefix-map entry.
    pub(crate) fn recache_block<'h>(
        &mut self,
        b: BlockId,
        i: usize,
        group: u32,
        hash_of: impl Fn(usize) -> Cow<'h, [u8]>,
    ) -> u32 {
        self.drop_block_keys(b);
        let entry = self.map.insert(&hash_of(i), group, b);
        let m = &mut self.meta[b as usize];
        m.entry = entry;
        m.group = group;
        m.num_tokens = ((i + 1) * self.hash_block_size as usize) as u32;
        if self.enable_events {
            let hbs = self.hash_block_size;
            self.record_stored(vec![i as u32], i, i + 1, hbs, group, &hash_of);
        }
        entry
    }

    /// Evicts `b`'s hash as a reused block would (the collector hears of
    /// it either way); vLLM's `_maybe_evict_cached_block`.
    pub(crate) fn evict_cached_block(&mut self, b: BlockId) -> bool {
        self.maybe_evict_cached_block(b)
    }
}

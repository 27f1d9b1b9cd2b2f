//! Re-keying one cached block (vLLM 0.33.0's `cache_partial_block` where
//! the entry is one whole hash block): Mamba align keys a prefill
//! checkpoint block, or the prompt's last reusable boundary, at a prefix
//! position other than its own table index.

use std::borrow::Cow;

use super::{BlockPool, NO_ENTRY};
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
        self.drop_hash(b);
        let entry = self.map.insert(&hash_of(i), group, b);
        self.meta[b as usize].entry = entry;
        self.meta[b as usize].group = group;
        if self.enable_events {
            let hbs = self.hash_block_size;
            self.record_stored(vec![i as u32], i, i + 1, hbs, group, &hash_of);
        }
        entry
    }

    /// Drops `b`'s hash, if any, with its `Removed` event but without the
    /// collector's eviction call (vLLM's `_remove_cached_block_hashes`).
    pub(crate) fn drop_hash(&mut self, b: BlockId) {
        let m = self.meta[b as usize];
        if m.entry == NO_ENTRY {
            return;
        }
        if self.enable_events {
            self.record_removed(m.entry, m.group);
        }
        self.map.pop(m.entry, m.group, b);
        self.meta[b as usize].entry = NO_ENTRY;
    }

    /// Evicts `b`'s hash as a reused block would (the collector hears of
    /// it either way); vLLM's `_maybe_evict_cached_block`.
    pub(crate) fn evict_cached_block(&mut self, b: BlockId) -> bool {
        self.maybe_evict_cached_block(b)
    }
}

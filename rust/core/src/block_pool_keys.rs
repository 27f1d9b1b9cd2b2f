//! vLLM's partial-block entries (block_pool.py L486-704): a cached
//! block can carry several prefix-cache keys, its primary hash (with the
//! prefix tokens it covers, `block_hash_num_tokens`) and extra keys; a
//! partial entry makes a block reachable from a hash boundary inside it.
//! Eviction, promotion to a full block and reset drop every key of a
//! block. Without `partial_block_entries` no block gets a second key, so
//! none of this changes the pool.

use smallvec::SmallVec;

use super::BlockPool;
use crate::events::PoolEvent;
use crate::prefix_map::NO_ENTRY;
use crate::BlockId;

/// One `cache_partial_block` call: the request's hash at `num_tokens` (a
/// multiple of the hash block size), the one before it (the event's
/// parent), and whether the block's contents were replaced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PartialEntry<'h> {
    pub block: BlockId,
    pub group: u32,
    pub num_tokens: usize,
    pub hash: &'h [u8],
    pub parent: Option<&'h [u8]>,
    pub replace_existing: bool,
}

impl BlockPool {
    /// Every key a block is cached under: its primary hash first, then its
    /// extra keys in the order added.
    pub fn block_keys(&self, b: BlockId) -> impl Iterator<Item = (&[u8], u32)> + '_ {
        let m = self.meta[b as usize];
        let primary = (m.entry != NO_ENTRY).then(|| (self.map.key(m.entry), m.group));
        let extras = self.extra_keys.get(&b).into_iter().flatten();
        primary
            .into_iter()
            .chain(extras.map(|&(e, g)| (self.map.key(e), g)))
    }

    /// vLLM's `block_hash_num_tokens`: prefix tokens the primary hash
    /// covers, None for a block without a hash.
    pub fn block_hash_num_tokens(&self, b: BlockId) -> Option<u32> {
        let m = self.meta[b as usize];
        (m.entry != NO_ENTRY).then_some(m.num_tokens)
    }

    /// vLLM's `_remove_cached_block_hashes` with its events: drops every
    /// key of the block from the map; true if any was held.
    pub(super) fn drop_block_keys(&mut self, b: BlockId) -> bool {
        let m = self.meta[b as usize];
        let extras = if self.extra_keys.is_empty() {
            None
        } else {
            self.extra_keys.remove(&b)
        };
        let mut any = false;
        if m.entry != NO_ENTRY {
            if self.enable_events {
                self.record_removed(m.entry, m.group);
            }
            // A cached block is always held by its entry (checked by
            // `check_invariants`), so the pop succeeds.
            let popped = self.map.pop(m.entry, m.group, b);
            debug_assert!(popped);
            any |= popped;
            let meta = &mut self.meta[b as usize];
            meta.entry = NO_ENTRY;
            meta.num_tokens = 0;
        }
        if let Some(extras) = extras {
            let mut removed: Vec<(Box<[u8]>, u32)> = Vec::new();
            for (e, g) in extras {
                let key = self.enable_events.then(|| Box::from(self.map.key(e)));
                if self.map.pop(e, g, b) {
                    any = true;
                    removed.extend(key.map(|k| (k, g)));
                }
            }
            match removed.len() {
                0 => {}
                1 => {
                    let (hash, group) = removed.pop().expect("one");
                    self.events.push(PoolEvent::Removed { hash, group });
                }
                _ => self.events.push(PoolEvent::RemovedSet { keys: removed }),
            }
        }
        any
    }

    /// vLLM's `_insert_block_hash`: the key becomes the block's primary
    /// hash if it has none, else an extra key; nothing if already held.
    fn insert_block_key(&mut self, hash: &[u8], group: u32, b: BlockId, num_tokens: u32) {
        let m = self.meta[b as usize];
        if let Some(e) = self.map.find(hash) {
            if (m.entry == e && m.group == group) || self.map.holds(e, group, b) {
                return;
            }
        }
        let e = self.map.insert(hash, group, b);
        if m.entry == NO_ENTRY {
            let meta = &mut self.meta[b as usize];
            meta.entry = e;
            meta.group = group;
            meta.num_tokens = num_tokens;
        } else {
            self.extra_keys.entry(b).or_default().push((e, group));
        }
    }

    /// vLLM's `cache_partial_block`: registers the partial entry `p`
    /// (nothing for the null block). A block whose primary hash covers
    /// fewer tokens loses its keys first (with events); a new key is
    /// reported by a `Stored` event spanning its last hash block.
    pub(crate) fn cache_partial_block(&mut self, p: PartialEntry<'_>) {
        if p.block == super::NULL_BLOCK {
            return;
        }
        let hbs = self.hash_block_size as usize;
        debug_assert!(p.num_tokens > 0 && p.num_tokens % hbs == 0);
        let m = self.meta[p.block as usize];
        let mut already = self.map.find(p.hash).is_some_and(|e| {
            (m.entry == e && m.group == p.group) || self.map.holds(e, p.group, p.block)
        });
        if p.replace_existing {
            self.drop_block_keys(p.block);
            already = false;
        } else if !already && m.entry != NO_ENTRY && (m.num_tokens as usize) < p.num_tokens {
            self.drop_block_keys(p.block);
        }
        self.insert_block_key(p.hash, p.group, p.block, p.num_tokens as u32);
        if self.enable_events && !already {
            let pos = p.num_tokens / hbs - 1;
            self.events.push(PoolEvent::Stored {
                hashes: vec![Box::from(p.hash)],
                parent: p.parent.map(Box::from),
                start_token: pos * hbs,
                end_token: p.num_tokens,
                block_size: hbs as u32,
                group: p.group,
                positions: vec![pos as u32],
            });
        }
    }

    /// vLLM's `move_block_hashes`: `src`'s keys re-point to `dst` (which
    /// has none), the primary first with `src`'s token count; no events.
    pub fn move_block_hashes(&mut self, src: BlockId, dst: BlockId) {
        debug_assert!(self.meta[dst as usize].entry == NO_ENTRY);
        debug_assert!(!self.extra_keys.contains_key(&dst));
        let num_tokens = self.meta[src as usize].num_tokens;
        let keys: SmallVec<[(Box<[u8]>, u32); 4]> = self
            .block_keys(src)
            .map(|(h, g)| (Box::from(h), g))
            .collect();
        let events = std::mem::replace(&mut self.enable_events, false);
        self.drop_block_keys(src);
        self.enable_events = events;
        for (h, g) in keys {
            self.insert_block_key(&h, g, dst, num_tokens);
        }
    }
}

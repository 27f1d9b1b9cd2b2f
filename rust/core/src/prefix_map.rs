//! The prefix-cache map: (block hash bytes, group id) -> cached blocks.
//!
//! As in vLLM's `BlockHashToBlockMap`, several blocks may share one key (a
//! block becomes full and is cached without de-duplication, so block tables
//! stay append-only); a lookup returns the earliest inserted one.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::BlockId;

/// Block hashes are already uniformly distributed (sha256, xxhash), so the
/// table hashes a few of their bytes instead of running SipHash over all.
#[derive(Default)]
pub struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        let word = |s: &[u8]| {
            let mut w = [0u8; 8];
            w[..s.len()].copy_from_slice(s);
            u64::from_le_bytes(w)
        };
        // First and last 8 bytes: concatenated keys (a group whose block
        // spans several hash blocks) share their first bytes with siblings.
        let v = if n <= 16 {
            word(&bytes[..n.min(8)]) ^ word(&bytes[n.min(8)..]).rotate_left(29)
        } else {
            word(&bytes[..8]) ^ word(&bytes[n - 8..]).rotate_left(29)
        };
        self.0 = (self.0.rotate_left(17) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, i: usize) {
        self.0 ^= i as u64;
    }
}

type Build = BuildHasherDefault<PrehashedHasher>;

#[derive(Debug, Clone, Default)]
struct Entry {
    // (group id, blocks in insertion order); almost always one group, one block.
    groups: Vec<(u32, Vec<BlockId>)>,
}

#[derive(Debug, Clone, Default)]
pub struct PrefixMap {
    map: HashMap<Box<[u8]>, Entry, Build>,
    num_keys: usize,
}

impl PrefixMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of (hash, group) keys held.
    pub fn len(&self) -> usize {
        self.num_keys
    }

    pub fn is_empty(&self) -> bool {
        self.num_keys == 0
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.num_keys = 0;
    }

    /// Any block cached under the key: the earliest inserted.
    pub fn get_one(&self, hash: &[u8], group: u32) -> Option<BlockId> {
        let entry = self.map.get(hash)?;
        entry
            .groups
            .iter()
            .find(|(g, _)| *g == group)
            .and_then(|(_, blocks)| blocks.first().copied())
    }

    pub fn insert(&mut self, hash: &[u8], group: u32, block: BlockId) {
        let entry = match self.map.get_mut(hash) {
            Some(e) => e,
            None => self.map.entry(hash.into()).or_default(),
        };
        match entry.groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, blocks)) => blocks.push(block),
            None => {
                entry.groups.push((group, vec![block]));
                self.num_keys += 1;
            }
        }
    }

    /// Removes `block` from the key; true if it was there.
    pub fn pop(&mut self, hash: &[u8], group: u32, block: BlockId) -> bool {
        let Some(entry) = self.map.get_mut(hash) else {
            return false;
        };
        let Some(gi) = entry.groups.iter().position(|(g, _)| *g == group) else {
            return false;
        };
        let blocks = &mut entry.groups[gi].1;
        let Some(pos) = blocks.iter().position(|&b| b == block) else {
            return false;
        };
        blocks.remove(pos);
        if blocks.is_empty() {
            entry.groups.swap_remove(gi);
            self.num_keys -= 1;
            if entry.groups.is_empty() {
                self.map.remove(hash);
            }
        }
        true
    }

    /// Every (hash, group, block) held, for invariant checks.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u32, BlockId)> + '_ {
        self.map.iter().flat_map(|(h, e)| {
            e.groups
                .iter()
                .flat_map(move |(g, bs)| bs.iter().map(move |&b| (&h[..], *g, b)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_keep_insertion_order() {
        let mut m = PrefixMap::new();
        m.insert(b"hash-a", 0, 5);
        m.insert(b"hash-a", 0, 3);
        m.insert(b"hash-a", 1, 9);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get_one(b"hash-a", 0), Some(5));
        assert_eq!(m.get_one(b"hash-a", 1), Some(9));
        assert!(m.pop(b"hash-a", 0, 5));
        assert_eq!(m.get_one(b"hash-a", 0), Some(3));
        assert!(!m.pop(b"hash-a", 0, 5), "already popped");
        assert!(m.pop(b"hash-a", 0, 3));
        assert_eq!(m.get_one(b"hash-a", 0), None);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn pop_of_other_block_keeps_entry() {
        let mut m = PrefixMap::new();
        m.insert(b"k", 0, 1);
        assert!(!m.pop(b"k", 0, 2));
        assert!(!m.pop(b"k", 1, 1));
        assert_eq!(m.get_one(b"k", 0), Some(1));
        m.clear();
        assert!(m.is_empty());
        assert_eq!(m.get_one(b"k", 0), None);
    }

    #[test]
    fn concatenated_keys_do_not_collide_in_lookup() {
        let mut m = PrefixMap::new();
        let ab = [[1u8; 32], [2u8; 32]].concat();
        let ac = [[1u8; 32], [3u8; 32]].concat();
        m.insert(&ab, 0, 1);
        m.insert(&ac, 0, 2);
        assert_eq!(m.get_one(&ab, 0), Some(1));
        assert_eq!(m.get_one(&ac, 0), Some(2));
    }
}

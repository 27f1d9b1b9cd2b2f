//! The prefix-cache map: (block hash bytes, group id) -> cached blocks.
//!
//! As in vLLM's `BlockHashToBlockMap`, several blocks may share one key (a
//! block becomes full and is cached without de-duplication, so block tables
//! stay append-only); a lookup returns the earliest inserted one.
//!
//! Each distinct hash is interned once as an *entry* (a slab slot); the pool
//! stores a block's entry id instead of its hash bytes. Slots and their
//! holder lists are recycled, so caching and evicting allocate nothing in a
//! steady state.

use hashbrown::HashTable;
use smallvec::SmallVec;

use crate::BlockId;

/// Hash bytes inline up to 32 (a sha256 or xxhash digest); longer keys
/// (hashes concatenated for groups with larger blocks) on the heap.
#[derive(Clone, PartialEq, Eq)]
pub enum HashKey {
    Inline { len: u8, bytes: [u8; 32] },
    Heap(Box<[u8]>),
}

impl HashKey {
    pub fn new(hash: &[u8]) -> Self {
        if hash.len() <= 32 {
            let mut bytes = [0u8; 32];
            bytes[..hash.len()].copy_from_slice(hash);
            HashKey::Inline {
                len: hash.len() as u8,
                bytes,
            }
        } else {
            HashKey::Heap(hash.into())
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            HashKey::Inline { len, bytes } => &bytes[..*len as usize],
            HashKey::Heap(b) => b,
        }
    }
}

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HashKey({:02x?})", self.as_slice())
    }
}

impl std::hash::Hash for HashKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(key_hash(self.as_slice()));
    }
}

/// Block hashes are already uniformly distributed (sha256, xxhash), so the
/// table mixes a few of their bytes instead of hashing them all.
pub fn key_hash(bytes: &[u8]) -> u64 {
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
    (v ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Entry id stored for blocks that carry no hash.
pub const NO_ENTRY: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Entry {
    key: HashKey,
    // key_hash(key), kept to unlink the entry without re-reading the key.
    hash: u64,
    // (group id, block) in insertion order; almost always one per group,
    // and a hybrid model's groups share one hash, so four fit inline.
    holders: SmallVec<[(u32, BlockId); 4]>,
}

#[derive(Debug, Clone, Default)]
pub struct PrefixMap {
    // Entry ids, found by their key's hash.
    index: HashTable<u32>,
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
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

    pub fn clear(&mut self) {
        self.index.clear();
        self.entries.clear();
        self.free_entries.clear();
        self.num_keys = 0;
    }

    /// The entry id of `hash`, if some block is cached under it.
    pub fn find(&self, hash: &[u8]) -> Option<u32> {
        let entries = &self.entries;
        self.index
            .find(key_hash(hash), |&e| {
                entries[e as usize].key.as_slice() == hash
            })
            .copied()
    }

    /// The hash bytes of a live entry.
    pub fn key(&self, entry: u32) -> &[u8] {
        self.entries[entry as usize].key.as_slice()
    }

    /// Any block cached under the key: the earliest inserted.
    pub fn get_one(&self, hash: &[u8], group: u32) -> Option<BlockId> {
        let e = self.find(hash)?;
        self.entries[e as usize]
            .holders
            .iter()
            .find(|(g, _)| *g == group)
            .map(|&(_, b)| b)
    }

    /// Whether `block` of `group` is cached under entry `entry` (vLLM's
    /// `BlockHashToBlockMap.contain`).
    pub fn holds(&self, entry: u32, group: u32, block: BlockId) -> bool {
        self.entries
            .get(entry as usize)
            .is_some_and(|e| e.holders.contains(&(group, block)))
    }

    /// Where entry `entry` lives (its key, hash and holders: two lines),
    /// for a caller to prefetch before it evicts or re-keys the entry.
    pub fn for_each_entry_line(&self, entry: u32, f: &mut impl FnMut(*const u8)) {
        if let Some(e) = self.entries.get(entry as usize) {
            let p: *const u8 = std::ptr::from_ref(e).cast();
            f(p);
            f(p.wrapping_add(64));
        }
    }

    /// Where the next `n` new keys are written (the recycled entries the
    /// next inserts take), for a caller to prefetch.
    pub fn for_each_next_new_entry_line(&self, n: usize, f: &mut impl FnMut(*const u8)) {
        for &e in self.free_entries.iter().rev().take(n) {
            self.for_each_entry_line(e, f);
        }
    }

    /// Caches `block` under (hash, group); returns the hash's entry id.
    pub fn insert(&mut self, hash: &[u8], group: u32, block: BlockId) -> u32 {
        let e = match self.find(hash) {
            Some(e) => e,
            None => self.new_entry(hash),
        };
        let holders = &mut self.entries[e as usize].holders;
        if !holders.iter().any(|(g, _)| *g == group) {
            self.num_keys += 1;
        }
        holders.push((group, block));
        e
    }

    fn new_entry(&mut self, hash: &[u8]) -> u32 {
        let key = HashKey::new(hash);
        let h = key_hash(hash);
        let e = match self.free_entries.pop() {
            Some(e) => {
                let entry = &mut self.entries[e as usize];
                entry.key = key;
                entry.hash = h;
                e
            }
            None => {
                self.entries.push(Entry {
                    key,
                    hash: h,
                    holders: SmallVec::new(),
                });
                (self.entries.len() - 1) as u32
            }
        };
        let entries = &self.entries;
        self.index
            .insert_unique(h, e, |&x| entries[x as usize].hash);
        e
    }

    /// Removes `block` of `group` from entry `entry`; true if it was there.
    /// The entry is recycled once it holds no block.
    pub fn pop(&mut self, entry: u32, group: u32, block: BlockId) -> bool {
        let Some(e) = self.entries.get_mut(entry as usize) else {
            return false;
        };
        let Some(pos) = e.holders.iter().position(|&h| h == (group, block)) else {
            return false;
        };
        e.holders.remove(pos);
        if !e.holders.iter().any(|(g, _)| *g == group) {
            self.num_keys -= 1;
        }
        if e.holders.is_empty() {
            if let Ok(found) = self.index.find_entry(e.hash, |&x| x == entry) {
                found.remove();
            }
            self.free_entries.push(entry);
        }
        true
    }

    /// Every (hash, group, block) held, for invariant checks.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u32, BlockId)> + '_ {
        self.index.iter().flat_map(move |&e| {
            let entry = &self.entries[e as usize];
            entry
                .holders
                .iter()
                .map(move |&(g, b)| (entry.key.as_slice(), g, b))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_keep_insertion_order() {
        let mut m = PrefixMap::new();
        let e = m.insert(b"hash-a", 0, 5);
        assert_eq!(m.insert(b"hash-a", 0, 3), e, "one entry per hash");
        m.insert(b"hash-a", 1, 9);
        assert_eq!(m.len(), 2);
        assert_eq!(m.key(e), b"hash-a");
        assert_eq!(m.get_one(b"hash-a", 0), Some(5));
        assert_eq!(m.get_one(b"hash-a", 1), Some(9));
        assert!(m.pop(e, 0, 5));
        assert_eq!(m.get_one(b"hash-a", 0), Some(3));
        assert!(!m.pop(e, 0, 5), "already popped");
        assert!(m.pop(e, 0, 3));
        assert_eq!(m.get_one(b"hash-a", 0), None);
        assert_eq!(m.len(), 1);
        assert!(m.pop(e, 1, 9));
        assert_eq!(m.len(), 0);
        // The slot is recycled for the next new hash.
        assert_eq!(m.insert(b"hash-b", 0, 1), e);
        assert_eq!(m.get_one(b"hash-a", 1), None);
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![(&b"hash-b"[..], 0, 1)]);
    }

    #[test]
    fn pop_of_other_block_keeps_entry() {
        let mut m = PrefixMap::new();
        let e = m.insert(b"k", 0, 1);
        assert!(!m.pop(e, 0, 2));
        assert!(!m.pop(e, 1, 1));
        assert_eq!(m.get_one(b"k", 0), Some(1));
        m.clear();
        assert_eq!(m.len(), 0);
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
        let long = HashKey::new(&ab);
        assert!(matches!(long, HashKey::Heap(_)));
        assert_eq!(long.as_slice(), &ab[..]);
    }
}

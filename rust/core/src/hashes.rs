//! A request's block hashes: stored back to back in one buffer (one
//! allocation per request, not per hash), and viewed at a group's block size.

use std::borrow::Cow;

use crate::profile::BlockHashView;

/// Spare hashes a list gets room for when it must grow (see `extend`).
const HASH_HEADROOM: usize = 8;

/// Block hashes at hash_block_size granularity, contiguous.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HashList {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl HashList {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn start(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.ends[i - 1] as usize
        }
    }

    pub fn get(&self, i: usize) -> &[u8] {
        &self.bytes[self.start(i)..self.ends[i] as usize]
    }

    /// Hashes `from..to` as one byte run (they are stored back to back).
    pub fn run(&self, from: usize, to: usize) -> &[u8] {
        &self.bytes[self.start(from)..self.start(to)]
    }

    pub fn push(&mut self, hash: &[u8]) {
        self.bytes.extend_from_slice(hash);
        self.ends.push(self.bytes.len() as u32);
    }

    pub fn truncate(&mut self, n: usize) {
        if n < self.len() {
            self.bytes.truncate(self.start(n));
            self.ends.truncate(n);
        }
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Room for `n` more hashes of `bytes` bytes in all, in place.
    pub fn reserve(&mut self, n: usize, bytes: usize) {
        self.bytes.reserve(bytes);
        self.ends.reserve(n);
    }

    pub fn extend(&mut self, other: &HashList) {
        // A decoding request gains a hash per block: when a buffer must
        // grow, room for a few more saves a reallocation on most of them.
        if self.ends.capacity() - self.ends.len() < other.len() {
            self.ends.reserve(other.len() + HASH_HEADROOM);
        }
        if self.bytes.capacity() - self.bytes.len() < other.bytes.len() {
            let per_hash = other.bytes.len() / other.len().max(1);
            self.bytes
                .reserve(other.bytes.len() + HASH_HEADROOM * per_hash);
        }
        // One copy per buffer (pushing one by one regrew them repeatedly).
        let base = self.bytes.len() as u32;
        self.bytes.extend_from_slice(&other.bytes);
        self.ends.extend(other.ends.iter().map(|&e| e + base));
    }
}

impl<T: AsRef<[u8]>> FromIterator<T> for HashList {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut out = HashList::new();
        for h in iter {
            out.push(h.as_ref());
        }
        out
    }
}

/// Hashes computed every `hash_block_size` tokens, read at a block size that
/// is `scale` times larger, as vLLM's `BlockHashListWithBlockSize`: block
/// i's hash is the concatenation of hashes `i*scale .. (i+1)*scale`
/// (whole-block-hits), or the last of them, which chains over the whole
/// prefix already (`last_only`; `profile::BlockHashView`).
#[derive(Clone, Copy)]
pub struct ScaledHashes<'a> {
    hashes: &'a HashList,
    scale: usize,
    last_only: bool,
}

impl<'a> ScaledHashes<'a> {
    pub fn new(hashes: &'a HashList, scale: usize) -> Self {
        debug_assert!(scale >= 1);
        ScaledHashes {
            hashes,
            scale,
            last_only: false,
        }
    }

    /// `new`, block hashes as `view` reads them.
    pub fn viewed(hashes: &'a HashList, scale: usize, view: BlockHashView) -> Self {
        ScaledHashes {
            last_only: view == BlockHashView::LastHashBlock,
            ..Self::new(hashes, scale)
        }
    }

    pub fn len(&self) -> usize {
        self.hashes.len() / self.scale
    }

    /// The hashes at hash-block granularity (fine-grained lookups and
    /// partial-block entries read boundaries inside a block).
    pub fn raw(&self) -> &'a HashList {
        self.hashes
    }

    /// Hash blocks per block.
    pub fn scale(&self) -> usize {
        self.scale
    }

    pub fn get(&self, i: usize) -> Cow<'a, [u8]> {
        let first = if self.last_only {
            (i + 1) * self.scale - 1
        } else {
            i * self.scale
        };
        Cow::Borrowed(self.hashes.run(first, (i + 1) * self.scale))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenates_at_larger_block_size() {
        let h: HashList = (1..=5u8).map(|i| vec![i; 2]).collect();
        let s = ScaledHashes::new(&h, 2);
        assert_eq!(s.len(), 2);
        assert_eq!(&*s.get(1), &[3, 3, 4, 4]);
        let one = ScaledHashes::new(&h, 1);
        assert_eq!(one.len(), 5);
        assert_eq!(&*one.get(4), &[5, 5]);
        let last = ScaledHashes::viewed(&h, 2, BlockHashView::LastHashBlock);
        assert_eq!((last.len(), &*last.get(1)), (2, &[4u8, 4][..]));
    }

    #[test]
    fn truncate_and_extend_keep_boundaries() {
        let mut h: HashList = [b"ab".as_slice(), b"cde", b"f"].into_iter().collect();
        h.truncate(1);
        assert_eq!((h.len(), h.get(0)), (1, b"ab".as_slice()));
        let more: HashList = [b"xy".as_slice()].into_iter().collect();
        h.extend(&more);
        assert_eq!(h.get(1), b"xy");
        h.truncate(5);
        assert_eq!(h.len(), 2);
    }
}

/// New block hashes of a request: those from index `offset` on. Each
/// hash crosses from Python once; this is how the rest arrive.
#[derive(Debug, Clone, Default)]
pub struct HashUpdate {
    pub offset: usize,
    pub hashes: HashList,
}

//! A request's block hashes, viewed at a group's block size.

use std::borrow::Cow;

/// Hashes computed every `hash_block_size` tokens, read at a block size that
/// is `scale` times larger: block i's hash is the concatenation of hashes
/// `i*scale .. (i+1)*scale`, as vLLM's `BlockHashListWithBlockSize`.
#[derive(Clone, Copy)]
pub struct ScaledHashes<'a> {
    hashes: &'a [Box<[u8]>],
    scale: usize,
}

impl<'a> ScaledHashes<'a> {
    pub fn new(hashes: &'a [Box<[u8]>], scale: usize) -> Self {
        debug_assert!(scale >= 1);
        ScaledHashes { hashes, scale }
    }

    pub fn len(&self) -> usize {
        self.hashes.len() / self.scale
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Cow<'a, [u8]> {
        if self.scale == 1 {
            Cow::Borrowed(&self.hashes[i])
        } else {
            Cow::Owned(self.hashes[i * self.scale..(i + 1) * self.scale].concat())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenates_at_larger_block_size() {
        let h: Vec<Box<[u8]>> = (1..=5u8).map(|i| vec![i; 2].into()).collect();
        let s = ScaledHashes::new(&h, 2);
        assert_eq!(s.len(), 2);
        assert_eq!(&*s.get(1), &[3, 3, 4, 4]);
        let one = ScaledHashes::new(&h, 1);
        assert_eq!(one.len(), 5);
        assert!(matches!(one.get(0), Cow::Borrowed(_)));
    }
}

//! The full-attention hit, by hand: blocks of 8 tokens over hash blocks of
//! 4; block A (tokens 0..8) cached full, block B a partial entry at 12
//! tokens (vLLM's `cache_partial_block`).

use super::*;
use crate::block_pool::{BlockPool, PartialEntry};
use crate::hashes::{HashList, ScaledHashes};
use crate::profile::BlockHashView;
use std::borrow::Cow;

fn setup(partial_entries: bool) -> (BlockPool, HashList, [BlockId; 2]) {
    let mut pool = BlockPool::new(8, true, 4, false, false).unwrap();
    pool.set_partial_entries(partial_entries);
    let hashes: HashList = (1..=5u8).map(|i| vec![i; 8]).collect();
    let mut ab = Vec::new();
    pool.get_new_blocks(2, &mut ab);
    pool.cache_full_blocks(&ab, 0, 1, 8, 0, |_| true, |_| Cow::Owned(vec![2u8; 8]));
    pool.cache_partial_block(PartialEntry {
        block: ab[1],
        group: 0,
        num_tokens: 12,
        hash: &[3u8; 8],
        parent: Some(&[2u8; 8]),
        replace_existing: false,
    });
    (pool, hashes, [ab[0], ab[1]])
}

fn hit(
    pool: &BlockPool,
    hashes: &HashList,
    max: usize,
    eagle: bool,
    align: usize,
) -> (Vec<BlockId>, usize) {
    let s = HitSearch {
        pool,
        hashes: ScaledHashes::viewed(hashes, 2, BlockHashView::LastHashBlock),
        groups: &[0],
        block_size: 8,
        alignment_tokens: align,
    };
    let mut out = vec![Vec::new()];
    let len = find_hit(&s, max, eagle, &mut out);
    (out.pop().unwrap(), len)
}

#[test]
fn fine_grained_hit_ends_inside_the_next_block() {
    let (pool, hashes, [a, b]) = setup(true);
    // Phase 1: block 0 (key h2) hits, block 1 (key h4) misses; phase 2
    // probes boundary 12 (h3): the partial entry on B.
    assert_eq!(hit(&pool, &hashes, 20, false, 4), (vec![a, b], 12));
    // EAGLE drops one hash unit: 8 tokens, B no longer needed.
    assert_eq!(hit(&pool, &hashes, 20, true, 4), (vec![a], 8));
    // The cap stops the probe: 10 tokens reach no inner boundary of B.
    assert_eq!(hit(&pool, &hashes, 10, false, 4), (vec![a], 8));
    assert_eq!(hit(&pool, &hashes, 12, false, 4), (vec![a, b], 12));
}

#[test]
fn block_aligned_hits_ignore_partial_entries() {
    // Hits aligned to blocks (partial hash hits off), or the profile
    // without partial entries: phase 1 only.
    let (pool, hashes, [a, _]) = setup(true);
    assert_eq!(hit(&pool, &hashes, 20, false, 8), (vec![a], 8));
    assert_eq!(hit(&pool, &hashes, 20, true, 8), (vec![], 0));
    let (pool, hashes, [a, _]) = setup(false);
    assert_eq!(hit(&pool, &hashes, 20, false, 4), (vec![a], 8));
}

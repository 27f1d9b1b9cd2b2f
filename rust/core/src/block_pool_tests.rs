//! The pool's unit tests (one hash per block, and partial-block
//! entries: several keys per block, promotion, eviction, reset).

use super::*;
use std::borrow::Cow;

fn pool(n: u32, events: bool) -> BlockPool {
    BlockPool::new(n, true, 4, events, true).unwrap()
}

fn new_blocks(p: &mut BlockPool, n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    p.get_new_blocks(n, &mut out);
    out
}

#[test]
fn null_block_is_reserved() {
    let p = pool(4, false);
    assert_eq!(p.num_free_blocks(), 3);
    assert!(!p.is_free(NULL_BLOCK));
    assert_eq!(p.usage(), 0.0);
    assert!(BlockPool::new(0, true, 4, false, true).is_err());
    p.check_invariants().unwrap();
}

#[test]
fn alloc_free_order_and_usage() {
    let mut p = pool(5, false);
    let a = new_blocks(&mut p, 3);
    assert_eq!(a, vec![1, 2, 3]);
    assert_eq!(p.usage(), 0.75);
    p.free_blocks(a.iter().rev().copied(), false);
    assert_eq!(p.free_queue().collect::<Vec<_>>(), vec![4, 3, 2, 1]);
    let b = new_blocks(&mut p, 1);
    p.free_blocks(b.iter().copied(), true);
    assert_eq!(p.free_queue().collect::<Vec<_>>(), vec![4, 3, 2, 1]);
    p.check_invariants().unwrap();
}

#[test]
fn cache_hit_touch_and_eviction_event() {
    let mut p = pool(4, true);
    let a = new_blocks(&mut p, 2);
    p.cache_full_blocks(
        &a,
        0,
        2,
        4,
        0,
        |_| true,
        |i| Cow::Owned(vec![i as u8 + 1; 8]),
    );
    assert_eq!(p.block_hash(a[0]).unwrap().0, &[1u8; 8][..]);
    p.free_blocks(a.iter().rev().copied(), false);
    let mut hit = Vec::new();
    assert!(p.get_cached_block(&[1u8; 8], &[0], &mut hit));
    assert_eq!(hit, vec![a[0]]);
    p.touch(&hit);
    assert_eq!(p.ref_cnt(a[0]), 1);
    assert!(!p.is_free(a[0]));
    // Reusing the free cached block a[1] drops its hash with an event.
    let got = new_blocks(&mut p, 2);
    assert_eq!(got, vec![3, a[1]]);
    assert!(p.block_hash(a[1]).is_none());
    let ev = p.take_events();
    assert!(matches!(ev[0], PoolEvent::Stored { ref hashes, .. } if hashes.len() == 2));
    assert_eq!(
        ev[1],
        PoolEvent::Removed {
            hash: vec![2u8; 8].into(),
            group: 0
        }
    );
    p.check_invariants().unwrap();
}

#[test]
fn evict_and_reset() {
    let mut p = pool(4, true);
    let a = new_blocks(&mut p, 1);
    p.cache_full_blocks(&a, 0, 1, 4, 0, |_| true, |_| Cow::Owned(vec![9; 8]));
    assert!(p.evict_blocks(&[7]).is_err());
    assert!(
        p.block_hash(a[0]).is_some(),
        "rejected call changed nothing"
    );
    assert!(!p.reset_prefix_cache(), "refused while a block is held");
    p.evict_blocks(&[a[0]]).unwrap();
    assert!(p.block_hash(a[0]).is_none());
    assert_eq!(p.ref_cnt(a[0]), 1, "eviction keeps holders");
    p.free_blocks(a.clone(), false);
    assert!(p.reset_prefix_cache());
    assert_eq!(p.take_events().last(), Some(&PoolEvent::AllCleared));
    p.check_invariants().unwrap();
}

// Partial-block entries: blocks of 8 tokens over hash blocks of 4.

fn partial_pool(events: bool) -> BlockPool {
    let mut p = BlockPool::new(6, true, 4, events, false).unwrap();
    p.set_partial_entries(true);
    p
}

fn partial<'h>(
    block: u32,
    num_tokens: usize,
    hash: &'h [u8],
    parent: Option<&'h [u8]>,
) -> PartialEntry<'h> {
    PartialEntry {
        block,
        group: 0,
        num_tokens,
        hash,
        parent,
        replace_existing: false,
    }
}

#[test]
fn partial_entry_then_promotion_to_full() {
    let mut p = partial_pool(true);
    let a = new_blocks(&mut p, 2);
    p.cache_partial_block(partial(a[1], 12, &[3; 8], Some(&[2; 8])));
    assert_eq!(p.block_hash(a[1]).unwrap().0, &[3u8; 8][..]);
    assert_eq!(p.block_hash_num_tokens(a[1]), Some(12));
    // The same key again: no change, no event.
    p.cache_partial_block(partial(a[1], 12, &[3; 8], Some(&[2; 8])));
    let ev = p.take_events();
    assert_eq!(
        ev,
        vec![PoolEvent::Stored {
            hashes: vec![vec![3u8; 8].into()],
            parent: Some(vec![2u8; 8].into()),
            start_token: 8,
            end_token: 12,
            block_size: 4,
            group: 0,
            positions: vec![2],
        }]
    );
    // The block fills: BlockRemoved for the partial key, then BlockStored.
    p.cache_full_blocks(
        &a,
        0,
        2,
        8,
        0,
        |_| true,
        |i| Cow::Owned(vec![2 * i as u8 + 2; 8]),
    );
    let ev = p.take_events();
    assert_eq!(
        ev[0],
        PoolEvent::Removed {
            hash: vec![3u8; 8].into(),
            group: 0
        }
    );
    assert!(matches!(&ev[1], PoolEvent::Stored { hashes, .. } if hashes.len() == 2));
    assert_eq!(p.block_hash(a[1]).unwrap().0, &[4u8; 8][..]);
    assert_eq!(p.block_hash_num_tokens(a[1]), Some(16));
    assert_eq!(p.num_cached_keys(), 2);
    p.check_invariants().unwrap();
}

#[test]
fn a_block_with_several_keys_is_evicted_whole() {
    let mut p = partial_pool(true);
    let a = new_blocks(&mut p, 1);
    p.cache_full_blocks(&a, 0, 1, 8, 0, |_| true, |_| Cow::Owned(vec![2; 8]));
    // Extra keys on the full block (prompts ending inside it).
    p.cache_partial_block(partial(a[0], 4, &[1; 8], None));
    p.cache_partial_block(partial(a[0], 4, &[7; 8], None));
    assert_eq!(p.block_hash_num_tokens(a[0]), Some(8), "the primary stays");
    assert_eq!(p.block_keys(a[0]).count(), 3);
    assert_eq!(p.num_cached_keys(), 3);
    let mut hit = Vec::new();
    assert!(p.get_cached_block(&[7; 8], &[0], &mut hit));
    assert_eq!(hit, a);
    p.check_invariants().unwrap();
    p.take_events();
    p.free_blocks_split(a.iter().copied());
    assert_eq!(
        p.free_queue().last(),
        Some(a[0]),
        "a cached block joins the back"
    );
    let got = new_blocks(&mut p, 5);
    assert_eq!(got.last(), Some(&a[0]));
    assert_eq!(
        p.take_events(),
        vec![
            PoolEvent::Removed {
                hash: vec![2u8; 8].into(),
                group: 0
            },
            PoolEvent::RemovedSet {
                keys: vec![(vec![1u8; 8].into(), 0), (vec![7u8; 8].into(), 0)]
            },
        ]
    );
    assert_eq!(p.num_cached_keys(), 0);
    assert!(p.block_hash_num_tokens(a[0]).is_none());
    p.check_invariants().unwrap();
}

#[test]
fn a_longer_partial_entry_replaces_a_shorter_one() {
    let mut p = partial_pool(true);
    let a = new_blocks(&mut p, 1);
    p.cache_partial_block(partial(a[0], 4, &[1; 8], None));
    p.cache_partial_block(partial(a[0], 8, &[2; 8], Some(&[1; 8])));
    assert_eq!(p.block_keys(a[0]).count(), 1);
    assert_eq!(p.block_hash_num_tokens(a[0]), Some(8));
    let ev = p.take_events();
    assert_eq!(ev.len(), 3);
    assert_eq!(
        ev[1],
        PoolEvent::Removed {
            hash: vec![1u8; 8].into(),
            group: 0
        }
    );
    // replace_existing drops every key first.
    let mut e = partial(a[0], 4, &[5; 8], None);
    e.replace_existing = true;
    p.cache_partial_block(e);
    assert_eq!(p.block_hash_num_tokens(a[0]), Some(4));
    assert_eq!(p.num_cached_keys(), 1);
    // The null block is never cached.
    p.cache_partial_block(partial(NULL_BLOCK, 4, &[6; 8], None));
    assert!(p.block_hash(NULL_BLOCK).is_none());
    p.check_invariants().unwrap();
}

#[test]
fn moved_keys_stay_live_and_reset_clears_them() {
    let mut p = partial_pool(true);
    let a = new_blocks(&mut p, 2);
    p.cache_full_blocks(&a, 0, 1, 8, 0, |_| true, |_| Cow::Owned(vec![2; 8]));
    p.cache_partial_block(partial(a[0], 4, &[1; 8], None));
    p.take_events();
    p.move_block_hashes(a[0], a[1]);
    assert!(p.take_events().is_empty(), "a move emits nothing");
    assert!(p.block_hash(a[0]).is_none());
    assert_eq!(p.block_hash_num_tokens(a[1]), Some(8));
    assert_eq!(p.block_keys(a[1]).count(), 2);
    let mut hit = Vec::new();
    assert!(p.get_cached_block(&[1; 8], &[0], &mut hit));
    assert_eq!(hit, vec![a[1]]);
    p.check_invariants().unwrap();
    p.free_blocks_split(a.iter().copied());
    assert!(p.reset_prefix_cache());
    assert_eq!(p.num_cached_keys(), 0);
    assert_eq!(p.block_keys(a[1]).count(), 0);
    p.check_invariants().unwrap();
}

#[test]
fn evict_first_puts_cached_blocks_in_front() {
    for evict_first in [false, true] {
        let mut p = partial_pool(true);
        let a = new_blocks(&mut p, 3);
        // a[0] and a[1] cached, a[2] not.
        p.cache_full_blocks(&a, 0, 2, 8, 0, |_| true, |i| Cow::Owned(vec![i as u8; 8]));
        p.free_blocks_evicting(a.iter().rev().copied(), evict_first);
        let queue: Vec<_> = p.free_queue().collect();
        let front: Vec<_> = queue.iter().take(3).copied().collect();
        if evict_first {
            assert_eq!(
                front,
                vec![a[2], a[1], a[0]],
                "all to the front, in the given order"
            );
        } else {
            assert_eq!(front[0], a[2], "the unhashed block to the front");
            assert_eq!(
                &queue[queue.len() - 2..],
                &[a[1], a[0]],
                "cached ones to the back"
            );
        }
        p.check_invariants().unwrap();
    }
}

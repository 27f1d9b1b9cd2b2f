//! The groups outside the classic attention types through the
//! manager's public API: R-SWA's gap frees, a circular buffer's ring, a
//! group out of prefix caching. The same scenarios run against vLLM
//! in the release tests' `test_scratch_groups.py` and in the fuzz.

use hybridcache_core::{
    AllocateArgs, BehaviourProfile, GroupSpec, KvCacheManager, ManagerConfig, SpecKind,
};

fn manager(groups: Vec<GroupSpec>, num_blocks: u32, sbs: u32, hbs: u32) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        num_blocks,
        groups,
        max_model_len: 1024,
        scheduler_block_size: sbs,
        hash_block_size: hbs,
        profile: BehaviourProfile::PARTIAL_BLOCK_HITS,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: None,
        enable_caching: true,
        use_eagle: false,
        enable_events: false,
    })
    .unwrap()
}

fn hashes(n: usize) -> Vec<Box<[u8]>> {
    (0..n)
        .map(|i| vec![9, i as u8, 7, 7, 7, 7, 7, 7].into_boxed_slice())
        .collect()
}

/// One allocation of `new` tokens after `computed`, the request `total` long.
fn step(
    m: &mut KvCacheManager,
    id: &str,
    computed: usize,
    new: usize,
    prompt: usize,
) -> Vec<Vec<u32>> {
    let args = AllocateArgs {
        num_new_tokens: new,
        num_computed_tokens: computed,
        num_tokens: computed + new,
        num_prompt_tokens: Some(prompt),
        ..Default::default()
    };
    let out = m.allocate_slots(id, &args, None).unwrap().unwrap();
    m.check_invariants().unwrap();
    out
}

#[test]
fn rswa_frees_the_decode_gap_after_the_prompt() {
    let mut m = manager(
        vec![GroupSpec::new(SpecKind::Rswa { window: 6 }, 4)],
        20,
        4,
        4,
    );
    step(&mut m, "r", 0, 10, 10);
    for n in 10..24 {
        step(&mut m, "r", n, 1, 10);
    }
    // At 23 processed tokens the window starts at 17: block 3 (12..16) left.
    let ids = &m.get_block_ids("r")[0];
    assert!(ids[..3].iter().all(|&b| b != 0));
    assert_eq!(ids[3], 0);
    assert!(ids[4..].iter().all(|&b| b != 0));
    // Without the prompt length nothing leaves; with it, up to the window.
    m.remove_skipped_blocks("r", 40);
    assert_eq!(m.get_block_ids("r")[0][4], ids[4]);
    m.remove_skipped_blocks_of_prompt("r", 40, Some(10));
    assert_eq!(&m.get_block_ids("r")[0][3..], &[0, 0, 0]);
    m.check_invariants().unwrap();
    // An unknown request gets no table.
    m.remove_skipped_blocks_of_prompt("nobody", 40, Some(10));
    assert!(m.get_block_ids("nobody")[0].is_empty());
}

#[test]
fn a_ring_is_one_block_never_cached_nor_hit() {
    let ring = GroupSpec::new(SpecKind::CircularBuffer, 2);
    assert!(!ring.prefix_cacheable);
    let mut m = manager(vec![GroupSpec::full_attention(4), ring], 20, 8, 4);
    m.sync_hashes("a", 0, hashes(5)).unwrap();
    let first = step(&mut m, "a", 0, 20, 20);
    assert_eq!((first[0].len(), first[1].len()), (5, 1));
    for n in 20..30 {
        let out = step(&mut m, "a", n, 1, 20);
        assert!(out[1].is_empty());
    }
    assert_eq!(m.get_block_ids("a")[1].len(), 1);
    m.sync_hashes("b", 0, hashes(5)).unwrap();
    let (blocks, len) = m.get_computed_blocks("b", 20, None).unwrap();
    assert_eq!((len, blocks[1].len()), (16, 0));
    let ring_block = m.get_block_ids("a")[1][0];
    m.free("a");
    // Unhashed, freed last: the next block handed out.
    assert_eq!(m.pool().free_queue().next(), Some(ring_block));
    m.check_invariants().unwrap();
}

#[test]
fn a_group_out_of_prefix_caching_caches_nothing() {
    let mut bounded = GroupSpec::new(SpecKind::SlidingWindow { window: 6 }, 4);
    bounded.prefix_cacheable = false;
    let mut m = manager(
        vec![GroupSpec::full_attention(4), bounded.clone()],
        30,
        8,
        4,
    );
    m.sync_hashes("a", 0, hashes(8)).unwrap();
    step(&mut m, "a", 0, 33, 33);
    let ids = m.get_block_ids("a");
    // The 8 full blocks of full attention are cached, the partial 9th not.
    assert!(ids[0][..8]
        .iter()
        .all(|&b| m.pool().block_hash(b).is_some()));
    assert!(ids[1]
        .iter()
        .all(|&b| b == 0 || m.pool().block_hash(b).is_none()));
    // Only cacheable groups: refused, as vLLM's hybrid coordinator asserts.
    let ring = GroupSpec::new(SpecKind::CircularBuffer, 4);
    let err = KvCacheManager::new(ManagerConfig {
        num_blocks: 10,
        groups: vec![ring, bounded],
        max_model_len: 1024,
        scheduler_block_size: 4,
        hash_block_size: 4,
        profile: BehaviourProfile::PARTIAL_BLOCK_HITS,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: None,
        enable_caching: true,
        use_eagle: false,
        enable_events: false,
    });
    assert!(err.is_err());
}

//! The partial-block-hits profile through the
//! manager's public API: the free-queue rule, deferred frees, caching
//! capped at the hashed blocks,
//! scheduler-recorded stats and adopt-only steps. The same scenarios run
//! against vLLM itself in the Python differential tests (the releases
//! whose table row names this profile).

use hybridcache_core::{
    AllocateArgs, BehaviourProfile, GroupSpec, KvCacheManager, MambaMode, ManagerConfig, SpecKind,
};

fn manager(num_blocks: u32, caching: bool) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        num_blocks,
        groups: vec![GroupSpec::full_attention(16)],
        max_model_len: 1024,
        scheduler_block_size: 16,
        hash_block_size: 16,
        profile: BehaviourProfile::PARTIAL_BLOCK_HITS,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: None,
        enable_caching: caching,
        use_eagle: false,
        enable_events: false,
    })
    .unwrap()
}

fn hashes(prefix: u8, n: usize) -> Vec<Box<[u8]>> {
    (0..n)
        .map(|i| vec![prefix, i as u8, 7, 7, 7, 7, 7, 7].into_boxed_slice())
        .collect()
}

fn prefill(m: &mut KvCacheManager, id: &str, tokens: usize) -> Vec<Vec<u32>> {
    let args = AllocateArgs {
        num_new_tokens: tokens,
        num_tokens: tokens,
        ..Default::default()
    };
    m.allocate_slots(id, &args, None).unwrap().unwrap()
}

fn free_queue(m: &KvCacheManager) -> Vec<u32> {
    m.pool().free_queue().collect()
}

#[test]
fn unhashed_tail_is_reused_first_cached_blocks_last() {
    // Reference §2.3: 40 tokens in blocks of 16, then freed.
    let mut m = manager(10, true);
    m.sync_hashes("r0", 0, hashes(1, 2)).unwrap();
    assert_eq!(prefill(&mut m, "r0", 40), vec![vec![1, 2, 3]]);
    m.free("r0");
    assert_eq!(free_queue(&m), vec![3, 4, 5, 6, 7, 8, 9, 2, 1]);
}

#[test]
fn caching_off_frees_are_lifo() {
    let mut m = manager(10, false);
    prefill(&mut m, "r0", 40);
    m.free("r0");
    assert_eq!(free_queue(&m), vec![3, 2, 1, 4, 5, 6, 7, 8, 9]);
}

#[test]
fn deferred_free_returns_only_what_was_handed_out() {
    let mut m = manager(10, true);
    m.sync_hashes("r0", 0, hashes(1, 2)).unwrap();
    prefill(&mut m, "r0", 40);
    let blocks = m.pop_blocks_for_free("r0");
    assert_eq!(blocks, vec![1, 2, 3]);
    // Still referenced: nothing joined the free queue.
    assert_eq!(m.pool().num_free_blocks(), 6);
    m.check_invariants().unwrap();
    // A block never handed out, or one handed out once and freed twice, is
    // refused with nothing freed.
    assert!(m.free_handed_out(&[3, 4]).is_err());
    assert!(m.free_handed_out(&[3, 3]).is_err());
    assert_eq!(m.pool().num_free_blocks(), 6);
    let tail_first: Vec<u32> = blocks.iter().rev().copied().collect();
    m.free_handed_out(&tail_first).unwrap();
    assert_eq!(free_queue(&m), vec![3, 4, 5, 6, 7, 8, 9, 2, 1]);
    m.check_invariants().unwrap();
    assert!(m.free_handed_out(&[1]).is_err());
}

#[test]
fn caching_stops_at_the_hashed_blocks() {
    // Lookahead hashes: 3 full blocks, only 1 hash yet. whole-block-hits
    // refuses; partial-block-hits caches the hashed block and the rest
    // once their hashes come.
    let mut m = manager(10, true);
    m.sync_hashes("r0", 0, hashes(1, 1)).unwrap();
    prefill(&mut m, "r0", 48);
    assert_eq!(m.pool().num_cached_keys(), 1);
    m.sync_hashes("r0", 1, hashes(1, 3)[1..].to_vec()).unwrap();
    m.cache_blocks("r0", 48, None).unwrap();
    assert_eq!(m.pool().num_cached_keys(), 3);
}

#[test]
fn lookups_count_nothing() {
    // The scheduler records admissions itself (the facade's stats object).
    let mut m = manager(10, true);
    m.set_log_stats(true);
    m.sync_hashes("r0", 0, hashes(1, 2)).unwrap();
    m.get_computed_blocks("r0", 40, None).unwrap();
    assert!(!m.counts_lookups());
    assert_eq!(m.stats().requests, 0);
}

#[test]
fn a_step_may_adopt_hits_without_new_tokens() {
    let mut m = manager(10, true);
    m.sync_hashes("a", 0, hashes(1, 2)).unwrap();
    prefill(&mut m, "a", 40);
    m.sync_hashes("b", 0, hashes(1, 2)).unwrap();
    let (hit, n) = m.get_computed_blocks("b", 40, None).unwrap();
    assert_eq!(n, 32);
    let args = AllocateArgs {
        num_new_tokens: 0,
        num_tokens: 40,
        num_new_computed_tokens: n,
        new_computed_blocks: Some(&hit),
        ..Default::default()
    };
    assert_eq!(
        m.allocate_slots("b", &args, None).unwrap(),
        Some(vec![vec![]])
    );
    m.check_invariants().unwrap();
}

#[test]
fn watermark_keeps_blocks_free() {
    let mut m = manager(5, true);
    let args = AllocateArgs {
        num_new_tokens: 48,
        num_tokens: 48,
        watermark_blocks: 2,
        ..Default::default()
    };
    // 3 blocks of the 4 usable, 2 must stay free: refused.
    assert_eq!(m.allocate_slots("r0", &args, None).unwrap(), None);
    let args = AllocateArgs {
        watermark_blocks: 1,
        ..args
    };
    assert!(m.allocate_slots("r0", &args, None).unwrap().is_some());
}

fn full_and_mamba(
    profile: BehaviourProfile,
    mode: MambaMode,
    num_speculative_blocks: u32,
) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        num_blocks: 40,
        groups: vec![
            GroupSpec::full_attention(4),
            GroupSpec::new(
                SpecKind::Mamba {
                    mode,
                    num_speculative_blocks,
                },
                4,
            ),
        ],
        max_model_len: 1024,
        scheduler_block_size: 4,
        hash_block_size: 4,
        profile,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: None,
        enable_caching: false,
        use_eagle: false,
        enable_events: false,
    })
    .unwrap()
}

#[test]
fn mamba_window_frees_count_drafts_as_rejected_only_with_whole_block_hits() {
    // 13 computed tokens, 2 speculative blocks: whole-block-hits
    // frees below (13 - 2 - 1) / 4 = 2 blocks, partial-block-hits below (13 - 1) / 4 = 3.
    for (profile, freed) in [
        (BehaviourProfile::WHOLE_BLOCK_HITS, 2),
        (BehaviourProfile::PARTIAL_BLOCK_HITS, 3),
    ] {
        let mut m = full_and_mamba(profile, MambaMode::None, 2);
        prefill(&mut m, "r", 13);
        let before = m.get_block_ids("r")[1].clone();
        m.remove_skipped_blocks("r", 13);
        let after = &m.get_block_ids("r")[1];
        let nulls = after.iter().take_while(|&&b| b == 0).count();
        assert_eq!(
            (before.len(), nulls),
            (cdiv(13, 4) + 2, freed),
            "{}",
            profile.name
        );
        m.check_invariants().unwrap();
    }
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn hybrid(
    profile: BehaviourProfile,
    groups: Vec<GroupSpec>,
    retention: Option<usize>,
) -> Result<KvCacheManager, hybridcache_core::CoreError> {
    KvCacheManager::new(ManagerConfig {
        num_blocks: 40,
        groups,
        max_model_len: 1024,
        scheduler_block_size: 16,
        hash_block_size: 16,
        profile,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: retention,
        enable_caching: true,
        use_eagle: false,
        enable_events: false,
    })
}

#[test]
fn equal_full_attention_groups_are_one_spec_group_with_partial_block_hits_only() {
    let two = || vec![GroupSpec::full_attention(16), GroupSpec::full_attention(16)];
    assert!(hybrid(BehaviourProfile::WHOLE_BLOCK_HITS, two(), None).is_err());
    let mut m = hybrid(BehaviourProfile::PARTIAL_BLOCK_HITS, two(), None).unwrap();
    m.sync_hashes("a", 0, hashes(1, 3)).unwrap();
    assert_eq!(prefill(&mut m, "a", 48), vec![vec![1, 2, 3], vec![4, 5, 6]]);
    m.cache_blocks("a", 48, None).unwrap();
    m.sync_hashes("b", 0, hashes(1, 3)).unwrap();
    let (hit, n) = m.get_computed_blocks("b", 49, None).unwrap();
    assert_eq!((hit, n), (vec![vec![1, 2, 3], vec![4, 5, 6]], 48));
}

#[test]
fn a_sparse_window_behind_full_attention_reports_the_longer_hit() {
    // Retention 0 keeps only the replay boundary's window: a sibling that
    // shares 3 of the 4 cached blocks misses in the window group, and the
    // search reports how far full attention alone reached.
    let groups = || {
        vec![
            GroupSpec::full_attention(16),
            GroupSpec::new(hybridcache_core::SpecKind::SlidingWindow { window: 8 }, 16),
        ]
    };
    let mut m = hybrid(BehaviourProfile::PARTIAL_BLOCK_HITS, groups(), Some(0)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 4)).unwrap();
    let args = AllocateArgs {
        num_new_tokens: 70,
        num_tokens: 70,
        num_prompt_tokens: Some(70),
        ..Default::default()
    };
    m.allocate_slots("a", &args, None).unwrap().unwrap();
    let mut b = hashes(1, 3);
    b.push(vec![9; 8].into_boxed_slice());
    m.sync_hashes("b", 0, b).unwrap();
    let hit = m.find_cache_hit("b", 64, None).unwrap();
    assert_eq!((hit.len, hit.longest), (0, 48));
}

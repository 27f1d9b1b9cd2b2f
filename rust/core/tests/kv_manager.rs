//! Behaviour of `KvCacheManager` through its public API, mirroring vLLM's
//! single-group full-attention semantics (the whole-block-hits profile).

use hybridcache_core::{
    AllocateArgs, BlockMetric, CoreError, GroupSpec, KvCacheManager, ManagerConfig, PoolEvent,
    SpecKind,
};

fn config(num_blocks: u32, block_size: u32, caching: bool, events: bool) -> ManagerConfig {
    ManagerConfig {
        num_blocks,
        groups: vec![GroupSpec::full_attention(block_size)],
        max_model_len: 1024,
        scheduler_block_size: block_size,
        hash_block_size: block_size,
        profile: Default::default(),
        enable_caching: caching,
        use_eagle: false,
        enable_events: events,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: None,
    }
}

fn hashes(prefix: u8, n: usize) -> Vec<Box<[u8]>> {
    (0..n)
        .map(|i| vec![prefix, i as u8, 7, 7, 7, 7, 7, 7].into_boxed_slice())
        .collect()
}

fn alloc(
    m: &mut KvCacheManager,
    id: &str,
    new: usize,
    computed: usize,
    total: usize,
) -> Option<Vec<Vec<u32>>> {
    let args = AllocateArgs {
        num_new_tokens: new,
        num_computed_tokens: computed,
        num_tokens: total,
        ..Default::default()
    };
    m.allocate_slots(id, &args, None).unwrap()
}

#[test]
fn prefill_decode_and_prefix_hit() {
    let mut m = KvCacheManager::new(config(10, 4, true, false)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 2)).unwrap();
    assert_eq!(alloc(&mut m, "a", 10, 0, 10), Some(vec![vec![1, 2, 3]]));
    assert_eq!(m.pool().num_free_blocks(), 6);
    // A request sharing both full blocks hits them; the last token is recomputed.
    m.sync_hashes("b", 0, hashes(1, 2)).unwrap();
    let (hit, n) = m.get_computed_blocks("b", 9, None).unwrap();
    assert_eq!((hit.clone(), n), (vec![vec![1, 2]], 8));
    let args = AllocateArgs {
        num_new_tokens: 1,
        num_tokens: 9,
        num_new_computed_tokens: 8,
        new_computed_blocks: Some(&hit),
        ..Default::default()
    };
    assert_eq!(
        m.allocate_slots("b", &args, None).unwrap(),
        Some(vec![vec![4]])
    );
    assert_eq!(m.pool().ref_cnt(1), 2);
    assert_eq!(m.get_num_common_prefix_blocks("a"), vec![2]);
    m.check_invariants().unwrap();
    // Decode: one more token fits in block 3; the 13th token needs a new block.
    assert_eq!(alloc(&mut m, "a", 1, 10, 11), Some(vec![vec![]]));
    m.sync_hashes("a", 2, hashes(1, 3)[2..].to_vec()).unwrap();
    assert_eq!(alloc(&mut m, "a", 2, 11, 13), Some(vec![vec![5]]));
    m.free("a");
    m.free("b");
    // Freed tail first: a's tail (5, 3) then b's (4), shared blocks last.
    let q: Vec<u32> = m.pool().free_queue().collect();
    assert_eq!(q, vec![6, 7, 8, 9, 5, 3, 4, 2, 1]);
    m.check_invariants().unwrap();
}

#[test]
fn out_of_blocks_returns_none_and_changes_nothing() {
    let mut m = KvCacheManager::new(config(4, 4, true, false)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 4)).unwrap();
    assert_eq!(alloc(&mut m, "a", 8, 0, 16), Some(vec![vec![1, 2]]));
    let before: Vec<u32> = m.pool().free_queue().collect();
    assert_eq!(alloc(&mut m, "a", 8, 8, 16), None);
    assert_eq!(m.pool().free_queue().collect::<Vec<_>>(), before);
    assert_eq!(m.get_block_ids("a"), vec![vec![1, 2]]);
    // reserved_blocks keeps the last free block away from this request.
    let args = AllocateArgs {
        num_new_tokens: 4,
        num_computed_tokens: 8,
        num_tokens: 16,
        reserved_blocks: 1,
        ..Default::default()
    };
    assert_eq!(m.allocate_slots("a", &args, None).unwrap(), None);
    m.check_invariants().unwrap();
}

#[test]
fn full_sequence_must_fit_gates_admission() {
    let mut m = KvCacheManager::new(config(4, 4, false, false)).unwrap();
    let args = AllocateArgs {
        num_new_tokens: 4,
        num_tokens: 20,
        full_sequence_must_fit: true,
        ..Default::default()
    };
    assert_eq!(m.allocate_slots("a", &args, None).unwrap(), None);
    assert_eq!(m.num_requests(), 0, "a refused admission leaves no trace");
    let args = AllocateArgs {
        num_new_tokens: 4,
        num_tokens: 12,
        full_sequence_must_fit: true,
        ..Default::default()
    };
    assert_eq!(
        m.allocate_slots("a", &args, None).unwrap(),
        Some(vec![vec![1]])
    );
}

#[test]
fn drafts_shrinking_keeps_table() {
    let mut m = KvCacheManager::new(config(20, 4, true, false)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 1)).unwrap();
    alloc(&mut m, "a", 5, 0, 5).unwrap();
    // 16 drafts then 1: the table never shrinks and nothing fails.
    assert_eq!(alloc(&mut m, "a", 17, 5, 6).unwrap()[0].len(), 4);
    assert_eq!(alloc(&mut m, "a", 2, 6, 7), Some(vec![vec![]]));
    assert_eq!(m.get_block_ids("a")[0].len(), 6);
    m.check_invariants().unwrap();
}

#[test]
fn lookahead_and_max_model_len_cap() {
    let mut cfg = config(40, 4, false, false);
    cfg.max_model_len = 16;
    let mut m = KvCacheManager::new(cfg).unwrap();
    let args = AllocateArgs {
        num_new_tokens: 10,
        num_tokens: 10,
        num_lookahead_tokens: 100,
        ..Default::default()
    };
    assert_eq!(
        m.allocate_slots("a", &args, None).unwrap().unwrap()[0].len(),
        4,
        "capped at max_model_len"
    );
}

#[test]
fn external_computed_tokens_get_fresh_blocks() {
    let mut m = KvCacheManager::new(config(10, 4, true, false)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 3)).unwrap();
    let args = AllocateArgs {
        num_new_tokens: 2,
        num_tokens: 14,
        num_external_computed_tokens: 12,
        ..Default::default()
    };
    assert_eq!(
        m.allocate_slots("a", &args, None).unwrap(),
        Some(vec![vec![4]])
    );
    assert_eq!(m.get_block_ids("a"), vec![vec![1, 2, 3, 4]]);
    assert_eq!(m.take_new_block_ids(), vec![1, 2, 3, 4]);
    assert!(m.take_new_block_ids().is_empty());
    m.check_invariants().unwrap();
}

#[test]
fn events_store_remove_clear() {
    let mut m = KvCacheManager::new(config(3, 4, true, true)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 2)).unwrap();
    alloc(&mut m, "a", 8, 0, 9).unwrap();
    let ev = m.take_events();
    assert!(
        matches!(&ev[..], [PoolEvent::Stored { hashes, parent: None, start_token: 0, end_token: 8, .. }] if hashes.len() == 2)
    );
    m.free("a");
    m.sync_hashes("b", 0, hashes(2, 2)).unwrap();
    alloc(&mut m, "b", 8, 0, 9).unwrap();
    let ev = m.take_events();
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, PoolEvent::Removed { .. }))
            .count(),
        2
    );
    m.free("b");
    assert!(m.reset_prefix_cache());
    assert_eq!(m.take_events(), vec![PoolEvent::AllCleared]);
}

#[test]
fn eagle_drops_last_hit_block() {
    let mut cfg = config(10, 4, true, false);
    cfg.use_eagle = true;
    let mut m = KvCacheManager::new(cfg).unwrap();
    m.sync_hashes("a", 0, hashes(1, 3)).unwrap();
    alloc(&mut m, "a", 13, 0, 13).unwrap();
    m.sync_hashes("b", 0, hashes(1, 3)).unwrap();
    let (hit, n) = m.get_computed_blocks("b", 13, None).unwrap();
    assert_eq!((hit[0].len(), n), (2, 8));
}

#[test]
fn bad_input_is_rejected_without_change() {
    let mut m = KvCacheManager::new(config(6, 4, true, false)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 1)).unwrap();
    alloc(&mut m, "a", 4, 0, 4).unwrap();
    let snapshot = (
        m.pool().free_queue().collect::<Vec<_>>(),
        m.get_block_ids("a"),
    );
    let zero = AllocateArgs {
        num_new_tokens: 0,
        num_tokens: 4,
        ..Default::default()
    };
    assert!(matches!(
        m.allocate_slots("a", &zero, None),
        Err(CoreError::InvalidArgument(_))
    ));
    let foreign = vec![vec![99]];
    let bad = AllocateArgs {
        num_new_tokens: 1,
        num_tokens: 5,
        new_computed_blocks: Some(&foreign),
        ..Default::default()
    };
    assert!(m.allocate_slots("b", &bad, None).is_err());
    let two_groups = vec![vec![], vec![]];
    let bad = AllocateArgs {
        num_new_tokens: 1,
        num_tokens: 5,
        new_computed_blocks: Some(&two_groups),
        ..Default::default()
    };
    assert!(m.allocate_slots("b", &bad, None).is_err());
    // Caching 8 tokens needs 2 hashes; "c" has none.
    let no_hash = AllocateArgs {
        num_new_tokens: 8,
        num_tokens: 8,
        ..Default::default()
    };
    assert!(m.allocate_slots("c", &no_hash, None).is_err());
    assert!(m.evict_blocks(&[1, 6]).is_err());
    assert!(m.sync_hashes("a", 5, hashes(1, 1)).is_err());
    assert_eq!(
        (
            m.pool().free_queue().collect::<Vec<_>>(),
            m.get_block_ids("a")
        ),
        snapshot
    );
    assert_eq!(m.num_requests(), 1);
    m.check_invariants().unwrap();
}

#[test]
fn config_is_validated() {
    let mut cfg = config(6, 16, true, false);
    cfg.hash_block_size = 8;
    cfg.scheduler_block_size = 16;
    assert!(matches!(
        KvCacheManager::new(cfg),
        Err(CoreError::InvalidArgument(_))
    ));
    let mut cfg = config(6, 16, false, false);
    cfg.hash_block_size = 8;
    cfg.scheduler_block_size = 16;
    assert!(
        KvCacheManager::new(cfg).is_ok(),
        "without caching hash size is free"
    );
    // Two groups of one spec are not hybrid: vLLM refuses them too.
    let mut cfg = config(6, 16, true, false);
    cfg.groups.push(GroupSpec::full_attention(16));
    assert!(matches!(
        KvCacheManager::new(cfg),
        Err(CoreError::InvalidArgument(_))
    ));
    let mut cfg = config(6, 16, true, false);
    cfg.groups
        .push(GroupSpec::new(SpecKind::SlidingWindow { window: 32 }, 16));
    assert!(KvCacheManager::new(cfg).is_ok());
    assert!(KvCacheManager::new(config(0, 16, true, false)).is_err());
}

#[test]
fn common_prefix_counts_every_holder() {
    let mut m = KvCacheManager::new(config(10, 4, true, false)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 2)).unwrap();
    alloc(&mut m, "a", 9, 0, 9).unwrap();
    assert_eq!(m.get_num_common_prefix_blocks("a"), vec![3]);
    // An unknown id gets an empty entry (as vLLM's defaultdict), which lowers the count.
    assert_eq!(m.get_num_common_prefix_blocks("ghost"), vec![0]);
    assert_eq!(m.get_num_common_prefix_blocks("a"), vec![0]);
    m.free("ghost");
    assert_eq!(m.get_num_common_prefix_blocks("a"), vec![3]);
}

#[test]
fn handles_name_one_request_and_go_stale_when_it_is_freed() {
    let mut m = KvCacheManager::new(config(10, 4, false, false)).unwrap();
    assert_eq!(m.handle("a"), None, "no handle before the first allocation");
    alloc(&mut m, "a", 4, 0, 4).unwrap();
    let h = m.handle("a").unwrap();
    assert_eq!(m.handle("a"), Some(h), "stable while held");
    let slot = m.resolve_handle(h).unwrap();
    assert_eq!((Some(slot), m.request_id_at(slot)), (m.lookup("a"), "a"));
    m.free("a");
    assert!(matches!(
        m.resolve_handle(h),
        Err(CoreError::UnknownRequest(_))
    ));
    // The slot is reused by the next request; the old handle stays stale.
    alloc(&mut m, "b", 4, 0, 4).unwrap();
    let hb = m.handle("b").unwrap();
    assert_eq!(hb as u32, h as u32, "same slot");
    assert_ne!(hb, h);
    assert!(m.resolve_handle(h).is_err());
    assert_eq!(m.request_id_at(m.resolve_handle(hb).unwrap()), "b");
    assert!(m.resolve_handle(u64::MAX).is_err());
}

#[test]
fn context_parallel_scales_the_block_size() {
    // dcp 2 x pcp 2: a block of a 4-token spec holds 16 tokens, hashed at 16.
    let mut cfg = config(10, 4, true, true);
    cfg.dcp_world_size = 2;
    cfg.pcp_world_size = 2;
    cfg.scheduler_block_size = 16;
    cfg.hash_block_size = 16;
    let mut m = KvCacheManager::new(cfg.clone()).unwrap();
    m.sync_hashes("a", 0, hashes(1, 2)).unwrap();
    assert_eq!(alloc(&mut m, "a", 33, 0, 33), Some(vec![vec![1, 2, 3]]));
    match &m.take_events()[..] {
        [PoolEvent::Stored {
            block_size: 16,
            end_token: 32,
            ..
        }] => {}
        ev => panic!("unexpected events {ev:?}"),
    }
    m.sync_hashes("b", 0, hashes(1, 2)).unwrap();
    assert_eq!(
        m.get_computed_blocks("b", 40, None).unwrap(),
        (vec![vec![1, 2]], 32)
    );
    m.check_invariants().unwrap();
    // The unitary coordinator's hash size is the scaled block size.
    cfg.hash_block_size = 4;
    assert!(matches!(
        KvCacheManager::new(cfg),
        Err(CoreError::InvalidArgument(_))
    ));
}

#[test]
fn context_parallel_refuses_what_vllm_asserts_against() {
    let window = GroupSpec::new(SpecKind::SlidingWindow { window: 8 }, 4);
    let mut cfg = config(10, 4, true, false);
    cfg.dcp_world_size = 2;
    cfg.scheduler_block_size = 8;
    cfg.hash_block_size = 8;
    cfg.groups = vec![window.clone()];
    let err = KvCacheManager::new(cfg.clone()).unwrap_err();
    assert!(matches!(&err, CoreError::InvalidArgument(m) if m.starts_with("dcp_world_size=2")));
    cfg.groups = vec![GroupSpec::full_attention(4), window.clone()];
    cfg.hash_block_size = 4;
    assert!(matches!(
        KvCacheManager::new(cfg.clone()),
        Err(CoreError::InvalidArgument(_))
    ));
    // Without prefix caching vLLM builds the same groups with scaled blocks.
    cfg.enable_caching = false;
    let mut m = KvCacheManager::new(cfg.clone()).unwrap();
    assert_eq!(
        alloc(&mut m, "a", 9, 0, 9),
        Some(vec![vec![1, 2], vec![3, 4]])
    );
    cfg.dcp_world_size = 0;
    assert!(matches!(
        KvCacheManager::new(cfg),
        Err(CoreError::InvalidArgument(_))
    ));
}

#[test]
fn block_metrics_log_vllms_collector_calls() {
    use BlockMetric::*;
    let mut m = KvCacheManager::new(config(5, 4, true, false)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 2)).unwrap();
    alloc(&mut m, "a", 9, 0, 9);
    assert!(!m.has_block_metrics(), "nothing is logged until asked for");
    m.set_record_block_metrics(true);
    m.free("a");
    m.sync_hashes("b", 0, hashes(1, 1)).unwrap();
    let (hit, n) = m.get_computed_blocks("b", 6, None).unwrap();
    let args = AllocateArgs {
        num_new_tokens: 2,
        num_tokens: 6,
        num_new_computed_tokens: n,
        new_computed_blocks: Some(&hit),
        ..Default::default()
    };
    // The hit is touched; with caching every popped block is first
    // "evicted", cached or not (block 4 was never used, 3 not cached).
    assert_eq!(
        m.allocate_slots("b", &args, None).unwrap(),
        Some(vec![vec![4]])
    );
    m.evict_blocks(&[2, 0]).unwrap();
    m.free("b");
    assert!(m.reset_prefix_cache());
    assert_eq!(
        m.take_block_metrics(),
        vec![
            Accessed(1),
            Evicted(4),
            Allocated(4),
            Evicted(2),
            Evicted(0),
            Reset
        ]
    );
    let mut off = KvCacheManager::new(config(4, 4, false, false)).unwrap();
    off.set_record_block_metrics(true);
    alloc(&mut off, "a", 5, 0, 5);
    assert_eq!(off.take_block_metrics(), vec![Allocated(1), Allocated(2)]);
    assert!(!off.has_block_metrics());
}

#[test]
fn prefetch_hints_name_the_lines_a_decode_and_a_free_read() {
    let mut m = KvCacheManager::new(config(10, 4, true, false)).unwrap();
    m.sync_hashes("a", 0, hashes(1, 2)).unwrap();
    assert_eq!(alloc(&mut m, "a", 10, 0, 10), Some(vec![vec![1, 2, 3]]));
    let slot = m.lookup("a").unwrap();
    let mut decode = Vec::new();
    m.for_each_general_decode_line(slot, |p| decode.push(p as usize));
    // The table's tail, then the first free block's metadata and links.
    assert_eq!(decode.len(), 3);
    let mut free = Vec::new();
    m.for_each_free_line("a", |p| free.push(p as usize));
    // Metadata and links of each of the three blocks, all distinct.
    assert_eq!(free.len(), 6);
    free.sort_unstable();
    free.dedup();
    assert_eq!(free.len(), 6);
    let mut none = 0;
    m.for_each_free_line("nobody", |_| none += 1);
    assert_eq!(none, 0);
    // Hints read nothing they change: the manager is as it was.
    m.free("a");
    assert_eq!(m.pool().num_free_blocks(), 10 - 1);
}

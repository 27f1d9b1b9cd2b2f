//! Core-only decode loop for profiling (`perf record`): N running requests,
//! decode steps with 0..16 drafts and random acceptance, hashes appended as
//! blocks fill. Prints ns per decode allocate_slots (whole loop: includes hash updates and frees).
//! cargo run --release -p hybridcache-core --example decode_profile -- [full|swa|mamba] [running] [steps] [wide|small]
use std::time::Instant;

use hybridcache_core::{
    AllocateArgs, GroupSpec, HashList, HashUpdate, KvCacheManager, MambaMode, ManagerConfig,
    NewBlocks, SpecKind,
};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let config = args.get(1).map_or("full", String::as_str);
    let running: usize = args.get(2).map_or(256, |s| s.parse().unwrap());
    let steps: usize = args.get(3).map_or(2000, |s| s.parse().unwrap());
    // "wide": 0..16 drafts (3 in 4 steps); "small": 0, 0, 1, 2 or 4 drafts.
    let drafts = args.get(4).map_or("wide", String::as_str);
    let bs = 16u32;
    let mut groups = vec![GroupSpec::full_attention(bs)];
    match config {
        "full" => {}
        "swa" => groups.push(GroupSpec::new(SpecKind::SlidingWindow { window: 128 }, bs)),
        "mamba" => {
            for _ in 0..3 {
                let mut g = GroupSpec::new(
                    SpecKind::Mamba {
                        mode: MambaMode::Align,
                        num_speculative_blocks: 16,
                    },
                    bs,
                );
                g.spec_class = 1;
                groups.push(g);
            }
        }
        other => panic!("unknown config {other}"),
    }
    groups[0].spec_class = 0;
    let num_groups = groups.len();
    let mut m = KvCacheManager::new(ManagerConfig {
        num_blocks: (running * (4200 / 16 + 40 * (num_groups - 1)) + 64) as u32,
        groups,
        max_model_len: 1 << 20,
        scheduler_block_size: bs,
        hash_block_size: bs,
        profile: Default::default(),
        enable_caching: true,
        use_eagle: false,
        enable_events: false,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: None,
    })
    .unwrap();
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let ids: Vec<String> = (0..running).map(|i| format!("req-{i}")).collect();
    // Per request: known tokens, hashes sent.
    let mut len = vec![0usize; running];
    let mut sent = vec![0usize; running];
    let mut counter = 0u64;
    let mut hash_for = |_: usize| {
        counter += 1;
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&counter.to_le_bytes());
        h
    };
    let update = |len: usize, sent: &mut usize, hash_for: &mut dyn FnMut(usize) -> [u8; 32]| {
        let full = len / bs as usize;
        if full <= *sent {
            return None;
        }
        let mut hashes = HashList::new();
        for i in *sent..full {
            hashes.push(&hash_for(i));
        }
        let u = HashUpdate {
            offset: *sent,
            hashes,
        };
        *sent = full;
        Some(u)
    };
    for i in 0..running {
        let prompt = 32 + rng.below(480) as usize;
        len[i] = prompt;
        let u = update(prompt, &mut sent[i], &mut hash_for);
        let a = AllocateArgs {
            num_new_tokens: prompt,
            num_tokens: prompt,
            ..Default::default()
        };
        m.allocate_slots(&ids[i], &a, u).unwrap().unwrap();
        len[i] += 1;
    }
    let mut total_ns = 0u128;
    let mut calls = 0u64;
    let mut out = NewBlocks::new();
    let t = Instant::now();
    for _ in 0..steps {
        m.new_step_starts();
        m.take_new_block_ids();
        for i in 0..running {
            let d = match drafts {
                "small" => [0, 0, 1, 2, 4][rng.below(5) as usize],
                _ if rng.below(4) == 0 => 0,
                _ => rng.below(17) as usize,
            };
            let computed = len[i] - 1;
            let u = update(len[i], &mut sent[i], &mut hash_for);
            let a = AllocateArgs {
                num_new_tokens: 1 + d,
                num_computed_tokens: computed,
                num_tokens: len[i],
                ..Default::default()
            };
            let slot = m.lookup(&ids[i]);
            let ok = m
                .allocate_slots_into(slot, &ids[i], &a, u, &mut out)
                .unwrap();
            calls += 1;
            assert!(ok, "pool too small");
            let accepted = rng.below(d as u64 + 1) as usize;
            len[i] += 1 + accepted;
            if len[i] > 4000 {
                m.free(&ids[i]);
                len[i] = 33;
                sent[i] = 0;
                let u = update(32, &mut sent[i], &mut hash_for);
                let a = AllocateArgs {
                    num_new_tokens: 32,
                    num_tokens: 32,
                    ..Default::default()
                };
                m.allocate_slots(&ids[i], &a, u).unwrap().unwrap();
            }
        }
    }
    total_ns += t.elapsed().as_nanos();
    println!(
        "{config} running={running} steps={steps}: {:.1} ns per decode allocate_slots (whole loop: includes hash updates and frees)",
        total_ns as f64 / calls as f64
    );
}

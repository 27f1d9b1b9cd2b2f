//! cargo-fuzz target: random operation sequences on `KvCacheManager`.
//!
//! The input bytes choose a spec mix (full; full+sw; full+mamba align with
//! speculative blocks; sw+mamba; full+mamba x3; full+chunked local), prefix
//! caching on/off, the pool size and EAGLE, then a sequence of operations
//! (admissions with prefix hits and external tokens, prefill chunks, decode
//! rounds with draft counts jumping up and down, lookahead, async loads,
//! preemption, eviction of any block ids, prefix-cache resets,
//! remove_skipped_blocks, new_step_starts, cache_blocks, common-prefix
//! queries). Every sequence is legal; the target panics when
//! `check_invariants()` fails, `allocate_slots` errs, the core panics, an
//! `Ok(None)` allocation changed more than vLLM's `remove_skipped_blocks`
//! does, or a table does not end with the blocks an allocation returned.
//!
//! Run (needs nightly and cargo-fuzz: `cargo install cargo-fuzz`):
//!
//! ```text
//! cd fuzz
//! cargo +nightly fuzz run manager_ops -- -max_total_time=300
//! cargo +nightly fuzz run manager_ops --features known-bugs   # finds the known vLLM bugs
//! ```
//!
//! This folder is its own workspace (the root workspace excludes it), so the
//! normal `cargo build` / `cargo test` never build it.
#![no_main]

use hybridcache_core::{
    AllocateArgs, GroupSpec, HashUpdate, KvCacheManager, MambaMode, ManagerConfig, SpecKind,
    NULL_BLOCK,
};
use libfuzzer_sys::fuzz_target;

const MAX_MODEL_LEN: usize = 96;
const KNOWN_BUGS: bool = cfg!(feature = "known-bugs");

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.u8() as usize % n
        }
    }
    fn bit(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn sw(window: u32, bs: u32) -> GroupSpec {
    let mut g = GroupSpec::new(SpecKind::SlidingWindow { window }, bs);
    g.admission_cap = Some(
        cdiv(
            (window as usize - 1 + MAX_MODEL_LEN).min(MAX_MODEL_LEN),
            bs as usize,
        ) + 1,
    );
    g
}

fn chunked(chunk: u32, bs: u32) -> GroupSpec {
    let mut g = GroupSpec::new(SpecKind::ChunkedLocal { chunk }, bs);
    g.admission_cap = Some(cdiv(
        (chunk as usize + MAX_MODEL_LEN).min(MAX_MODEL_LEN),
        bs as usize,
    ));
    g
}

fn mamba(mode: MambaMode, num_spec: u32, bs: u32) -> GroupSpec {
    GroupSpec::new(
        SpecKind::Mamba {
            mode,
            num_speculative_blocks: num_spec,
        },
        bs,
    )
}

/// (groups, scheduler_block_size, hash_block_size)
fn mix(i: usize, caching: bool, b: &mut Bytes) -> (Vec<GroupSpec>, u32, u32) {
    let align = if caching {
        MambaMode::Align
    } else {
        MambaMode::None
    };
    match i {
        0 => (vec![GroupSpec::full_attention(4)], 4, 4),
        1 => (
            vec![
                GroupSpec::full_attention(4),
                sw(3 + b.below(12) as u32, [4, 8][b.below(2)]),
            ],
            8,
            4,
        ),
        2 => (
            vec![
                GroupSpec::full_attention(4),
                mamba(align, 1 + b.below(3) as u32, 8),
            ],
            8,
            4,
        ),
        3 => {
            let mode = if caching {
                [MambaMode::All, MambaMode::Align][b.below(2)]
            } else {
                MambaMode::None
            };
            (
                vec![
                    sw(2 + b.below(9) as u32, 4),
                    mamba(mode, b.below(2) as u32, 4),
                ],
                4,
                4,
            )
        }
        4 => {
            let m = mamba(align, b.below(3) as u32, 4);
            (
                vec![GroupSpec::full_attention(4), m.clone(), m.clone(), m],
                4,
                4,
            )
        }
        _ => (
            vec![
                GroupSpec::full_attention(4),
                chunked([8, 16][b.below(2)], 4),
            ],
            8,
            4,
        ),
    }
}

fn block_hashes(tokens: &[u32], hbs: usize) -> Vec<Box<[u8]>> {
    let mut out: Vec<Box<[u8]>> = Vec::new();
    let mut parent: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in tokens.chunks_exact(hbs) {
        let mut h = parent;
        for &t in chunk {
            for x in t.to_le_bytes() {
                h ^= u64::from(x);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        parent = h;
        out.push(h.to_le_bytes().to_vec().into_boxed_slice());
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Waiting,
    Running,
    Loading(usize),
}

struct Req {
    id: String,
    tokens: Vec<u32>,
    computed: usize,
    st: St,
}

type Snap = (
    Vec<u32>,
    Vec<i32>,
    Vec<Option<(Vec<u8>, u32)>>,
    Vec<Vec<Vec<u32>>>,
);

fn snap(m: &KvCacheManager, reqs: &[Req]) -> Snap {
    let p = m.pool();
    let n = p.num_blocks();
    (
        p.free_queue().collect(),
        (0..n).map(|b| p.ref_cnt(b)).collect(),
        (0..n)
            .map(|b| p.block_hash(b).map(|(h, g)| (h.to_vec(), g)))
            .collect(),
        reqs.iter().map(|r| m.get_block_ids(&r.id)).collect(),
    )
}

struct Fuzz {
    m: KvCacheManager,
    groups: Vec<GroupSpec>,
    caching: bool,
    align: bool,
    hbs: usize,
    sbs: usize,
    reqs: Vec<Req>,
    next: usize,
}

impl Fuzz {
    fn update(&self, i: usize) -> Option<HashUpdate> {
        if !self.caching {
            return None;
        }
        let all = block_hashes(&self.reqs[i].tokens, self.hbs);
        let known = self.m.num_known_hashes(&self.reqs[i].id);
        (all.len() > known).then(|| HashUpdate {
            offset: known,
            hashes: all[known..].iter().collect(),
        })
    }

    fn pick(&self, b: &mut Bytes, want: impl Fn(&Req) -> bool) -> Option<usize> {
        let c: Vec<usize> = (0..self.reqs.len())
            .filter(|&i| want(&self.reqs[i]))
            .collect();
        (!c.is_empty()).then(|| c[b.below(c.len())])
    }

    fn chunk(&self, b: &mut Bytes, start: usize, left: usize) -> usize {
        let mut n = (1 + b.below(left.max(1))).min(left);
        if self.align && n < left {
            let end = (start + n) / self.sbs * self.sbs;
            n = if end > start {
                end - start
            } else {
                left.min(self.sbs - start % self.sbs)
            };
        }
        n.max(1)
    }

    fn allocate(&mut self, i: usize, args: &AllocateArgs) -> Option<Vec<Vec<u32>>> {
        let id = self.reqs[i].id.clone();
        let before = snap(&self.m, &self.reqs);
        let total = (args.num_computed_tokens
            + args.num_new_computed_tokens
            + args.num_external_computed_tokens)
            .min(MAX_MODEL_LEN);
        let gate = args.full_sequence_must_fit && {
            let full = args.num_tokens.min(MAX_MODEL_LEN);
            let empty = vec![Vec::new(); self.m.num_groups()];
            let nc = args.new_computed_blocks.unwrap_or(&empty);
            let need = self
                .m
                .get_num_blocks_to_allocate(&id, full, nc, 0, total, full, true)
                .unwrap();
            need > self.m.pool().num_free_blocks() as i64
        };
        let expected = if gate {
            before
        } else {
            let mut c = self.m.clone();
            c.remove_skipped_blocks(&id, total);
            snap(&c, &self.reqs)
        };
        let update = self.update(i);
        let out = self
            .m
            .allocate_slots(&id, args, update)
            .unwrap_or_else(|e| panic!("allocate_slots({id}, {args:?}) -> Err({e})"));
        match &out {
            None => assert!(
                snap(&self.m, &self.reqs) == expected,
                "Ok(None) changed state"
            ),
            Some(new) => {
                for (g, (n, t)) in new.iter().zip(self.m.get_block_ids(&id)).enumerate() {
                    assert!(
                        t.ends_with(n),
                        "group {g}: table {t:?} does not end with {n:?}"
                    );
                    if !matches!(self.groups[g].kind, SpecKind::Mamba { .. }) {
                        assert!(!n.contains(&NULL_BLOCK), "null block handed out");
                    }
                }
            }
        }
        out
    }

    fn op(&mut self, b: &mut Bytes) {
        match b.below(12) {
            0 | 1 => {
                if self.reqs.len() >= 10 {
                    return;
                }
                let prefix: &[u32] = match b.below(4) {
                    0 => &[],
                    1 => &[
                        11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                    ],
                    2 => &[
                        11, 12, 13, 14, 15, 16, 17, 18, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,
                        51,
                    ],
                    _ => &[60, 61, 62, 63, 64, 65, 66, 67],
                };
                let mut tokens = prefix.to_vec();
                let salt = b.u8() as u32;
                for k in 0..b.below(40) as u32 {
                    tokens.push(200 + (salt + k) % 5);
                }
                if tokens.is_empty() {
                    tokens.push(1);
                }
                let id = format!("r{}", self.next % 14);
                self.next += 1;
                if !self.reqs.iter().any(|r| r.id == id) {
                    self.reqs.push(Req {
                        id,
                        tokens,
                        computed: 0,
                        st: St::Waiting,
                    });
                }
            }
            2 | 3 => {
                let Some(i) = self.pick(b, |r| r.st == St::Waiting) else {
                    return;
                };
                let id = self.reqs[i].id.clone();
                let num_tokens = self.reqs[i].tokens.len();
                let (hit, n) = if self.caching && b.bit() {
                    if let Some(u) = self.update(i) {
                        self.m.sync_update(&id, u).unwrap();
                    }
                    self.m.get_computed_blocks(&id, num_tokens).unwrap()
                } else {
                    (vec![Vec::new(); self.m.num_groups()], 0)
                };
                assert!(n < num_tokens);
                let rest = num_tokens - n;
                let mut ext = if b.below(4) == 0 {
                    b.below(12).min(rest - 1)
                } else {
                    0
                };
                let later_free_hit = hit
                    .iter()
                    .skip(1)
                    .flatten()
                    .any(|&x| x != NULL_BLOCK && self.m.pool().ref_cnt(x) == 0);
                // A vLLM bug the whole-block-hits profile reproduces: an earlier
                // group's external-token blocks may pop a later group's free hit block.
                if !KNOWN_BUGS && later_free_hit {
                    ext = 0;
                }
                let async_load = ext > 0 && b.bit();
                let new = if async_load {
                    0
                } else {
                    self.chunk(b, n + ext, rest - ext)
                };
                let any_hit = hit.iter().any(|g| !g.is_empty());
                let args = AllocateArgs {
                    num_new_tokens: new,
                    num_tokens,
                    num_new_computed_tokens: n,
                    new_computed_blocks: any_hit.then_some(&hit[..]),
                    num_lookahead_tokens: b.below(8).saturating_sub(4),
                    num_external_computed_tokens: ext,
                    delay_cache_blocks: async_load,
                    full_sequence_must_fit: b.below(5) == 0,
                    reserved_blocks: usize::from(b.below(8) == 0),
                    ..Default::default()
                };
                if self.allocate(i, &args).is_some() {
                    let r = &mut self.reqs[i];
                    if async_load {
                        r.st = St::Loading(n + ext);
                    } else {
                        r.st = St::Running;
                        r.computed = n + ext + new;
                        if r.computed == r.tokens.len() {
                            r.tokens.push(100);
                        }
                    }
                }
            }
            4..=6 => {
                let Some(i) = self.pick(b, |r| r.st == St::Running) else {
                    return;
                };
                let (num_tokens, computed) = (self.reqs[i].tokens.len(), self.reqs[i].computed);
                let left = num_tokens - computed;
                let decode = left == 1;
                let k = if decode { b.below(9) } else { 0 };
                let new = if decode {
                    1 + k
                } else {
                    self.chunk(b, computed, left)
                };
                if computed + new >= MAX_MODEL_LEN - 1 || num_tokens + k + 2 >= MAX_MODEL_LEN {
                    self.m.free(&self.reqs[i].id);
                    self.reqs.remove(i);
                    return;
                }
                let args = AllocateArgs {
                    num_new_tokens: new,
                    num_computed_tokens: computed,
                    num_tokens,
                    num_lookahead_tokens: b.below(8).saturating_sub(4),
                    reserved_blocks: usize::from(b.below(8) == 0),
                    ..Default::default()
                };
                if self.allocate(i, &args).is_some() {
                    let r = &mut self.reqs[i];
                    if decode {
                        let acc = b.below(k + 1);
                        r.computed += 1 + acc;
                        r.tokens
                            .extend(std::iter::repeat_n(100 + (acc as u32 % 3), acc + 1));
                    } else {
                        r.computed += new;
                        if r.computed == num_tokens {
                            r.tokens.push(101);
                        }
                    }
                }
            }
            7 => {
                let Some(i) = self.pick(b, |r| matches!(r.st, St::Loading(_))) else {
                    return;
                };
                let St::Loading(target) = self.reqs[i].st else {
                    unreachable!()
                };
                let update = self.update(i);
                self.m
                    .cache_blocks(&self.reqs[i].id, target, update)
                    .unwrap();
                self.reqs[i].computed = target;
                self.reqs[i].st = St::Running;
            }
            8 => {
                // Preemption storm / finish.
                let mask = b.u8();
                for i in (0..self.reqs.len().min(8)).rev() {
                    if mask & (1 << i) != 0 {
                        self.m.free(&self.reqs[i].id);
                        if b.bit() {
                            self.reqs.remove(i);
                        } else {
                            self.reqs[i].st = St::Waiting;
                            self.reqs[i].computed = 0;
                        }
                    }
                }
            }
            9 => {
                let n = self.m.pool().num_blocks() as usize;
                let ids: Vec<u32> = (0..b.below(5)).map(|_| b.below(n) as u32).collect();
                self.m.evict_blocks(&ids).unwrap();
            }
            10 => match b.below(4) {
                0 => {
                    let all_free =
                        self.m.pool().num_free_blocks() + 1 == self.m.pool().num_blocks() as usize;
                    assert_eq!(self.m.reset_prefix_cache(), all_free);
                }
                1 => self.m.new_step_starts(),
                _ => {
                    let Some(i) = self.pick(b, |r| r.st == St::Running) else {
                        return;
                    };
                    let total = self.reqs[i].computed.saturating_sub(b.below(6));
                    self.m
                        .remove_skipped_blocks(&self.reqs[i].id.clone(), total);
                }
            },
            _ => {
                let Some(i) = self.pick(b, |r| r.st == St::Running) else {
                    return;
                };
                let id = self.reqs[i].id.clone();
                if b.bit() {
                    let n = self.reqs[i].computed.saturating_sub(b.below(6));
                    let update = self.update(i);
                    self.m.cache_blocks(&id, n, update).unwrap();
                } else {
                    let v = self.m.get_num_common_prefix_blocks(&id);
                    assert_eq!(v.len(), self.m.num_groups());
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let caching = b.bit();
    let mix_id = b.below(6);
    let (groups, sbs, hbs) = mix(mix_id, caching, &mut b);
    let num_blocks = 6 + b.below(34) as u32;
    let eagle = b.below(4) == 0;
    let align = groups.iter().any(|g| {
        matches!(
            g.kind,
            SpecKind::Mamba {
                mode: MambaMode::Align,
                ..
            }
        )
    });
    let m = KvCacheManager::new(ManagerConfig {
        num_blocks,
        groups: groups.clone(),
        max_model_len: MAX_MODEL_LEN,
        scheduler_block_size: sbs,
        hash_block_size: hbs,
        profile: Default::default(),
        enable_caching: caching,
        use_eagle: eagle,
        enable_events: b.bit(),
        retention_interval: None,
    })
    .expect("valid config");
    let mut f = Fuzz {
        m,
        groups,
        caching,
        align,
        hbs: hbs as usize,
        sbs: sbs as usize,
        reqs: Vec::new(),
        next: 0,
    };
    let mut steps = 0;
    while !b.done() && steps < 400 {
        f.op(&mut b);
        if let Err(e) = f.m.check_invariants() {
            panic!("invariant violated after op {steps}: {e}");
        }
        steps += 1;
    }
    for r in std::mem::take(&mut f.reqs) {
        f.m.free(&r.id);
    }
    f.m.check_invariants().unwrap();
    assert_eq!(f.m.pool().num_free_blocks(), num_blocks as usize - 1);
    assert!(f.m.reset_prefix_cache());
});

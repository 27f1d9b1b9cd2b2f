//! Property-based state-machine tests of `KvCacheManager`.
//!
//! Random operation sequences (admissions with prefix hits, chunked prefill,
//! decode with draft counts jumping up and down, lookahead, external computed
//! tokens with async loads, preemption storms, evictions, prefix-cache resets,
//! remove_skipped_blocks, new_step_starts, cache_blocks) run against every
//! spec mix, with prefix caching on and off. After every operation:
//!
//! * `check_invariants()` passes;
//! * `allocate_slots` never returns `Err` on legal input;
//! * an allocation returning `Ok(None)` left the free queue, ref counts,
//!   block hashes, every table and the Mamba align state exactly as vLLM
//!   leaves them: untouched when the `full_sequence_must_fit` gate refused,
//!   else as after `remove_skipped_blocks(total_computed)` (vLLM frees
//!   blocks outside the window before it checks capacity);
//! * each group's table ends with the blocks the allocation returned, and
//!   blocks handed out by a non-Mamba group are never the null block.
//!
//! Case counts: `PROPTEST_CASES` overrides the per-mix default (kept small so
//! `cargo test -p hybridcache-core` stays fast in debug builds).

use hybridcache_core::{
    AllocateArgs, BehaviourProfile, GroupSpec, HashUpdate, KvCacheManager, MambaCheckpoints,
    MambaMode, ManagerConfig, SpecKind, NULL_BLOCK,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};

// ---------------------------------------------------------------------------
// Spec mixes

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    Full,
    FullSw,
    FullMambaAlignSpec,
    SwMamba,
    FullMamba3,
    FullChunked,
    /// Full attention with dcp 2 x pcp 2: blocks of 16 tokens.
    FullContextParallel,
    /// The partial-block-hits profile: full attention + Mamba align with
    /// two speculative blocks, with or without caching (that profile runs
    /// align without a prefix cache too).
    PartialHitsMambaAlign,
    /// The same with prefill checkpoint blocks (alignment 1).
    PartialHitsMambaAlignCheckpoints,
    /// The partial-block-hits profile: full attention of 8 over hash blocks of 4
    /// (partial-tail entries) beside a sliding window of 4.
    PartialHitsWideSw,
}

const ALL_MIXES: [Mix; 10] = [
    Mix::Full,
    Mix::FullSw,
    Mix::FullMambaAlignSpec,
    Mix::SwMamba,
    Mix::FullMamba3,
    Mix::FullChunked,
    Mix::FullContextParallel,
    Mix::PartialHitsMambaAlign,
    Mix::PartialHitsMambaAlignCheckpoints,
    Mix::PartialHitsWideSw,
];

const MAX_MODEL_LEN: usize = 96;

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn sw(window: u32, bs: u32) -> GroupSpec {
    let mut g = GroupSpec::new(SpecKind::SlidingWindow { window }, bs);
    // SlidingWindowSpec.max_admission_blocks_per_request with
    // max_num_batched_tokens = max_model_len (the facade's default).
    let n = (window as usize - 1 + MAX_MODEL_LEN).min(MAX_MODEL_LEN);
    g.admission_cap = Some(cdiv(n, bs as usize) + 1);
    g
}

fn chunked(chunk: u32, bs: u32) -> GroupSpec {
    let mut g = GroupSpec::new(SpecKind::ChunkedLocal { chunk }, bs);
    let n = (chunk as usize + MAX_MODEL_LEN).min(MAX_MODEL_LEN);
    g.admission_cap = Some(cdiv(n, bs as usize));
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
fn mix_groups(mix: Mix, caching: bool) -> (Vec<GroupSpec>, u32, u32) {
    // Mamba prefix caching needs "all"/"align"; without caching vLLM runs "none".
    let align = if caching {
        MambaMode::Align
    } else {
        MambaMode::None
    };
    match mix {
        Mix::Full => (vec![GroupSpec::full_attention(4)], 4, 4),
        // Different block sizes: hashes are scaled, SW caching is masked.
        Mix::FullSw => (vec![GroupSpec::full_attention(4), sw(7, 4)], 8, 4),
        Mix::FullMambaAlignSpec => (vec![GroupSpec::full_attention(4), mamba(align, 2, 8)], 8, 4),
        Mix::SwMamba => {
            let mode = if caching {
                MambaMode::All
            } else {
                MambaMode::None
            };
            (vec![sw(6, 4), mamba(mode, 0, 4)], 4, 4)
        }
        Mix::FullMamba3 => (
            vec![
                GroupSpec::full_attention(4),
                mamba(align, 1, 4),
                mamba(align, 1, 4),
                mamba(align, 1, 4),
            ],
            4,
            4,
        ),
        Mix::FullChunked => (vec![GroupSpec::full_attention(4), chunked(8, 4)], 8, 4),
        // vLLM's scheduler passes block_size * dcp * pcp for both sizes.
        Mix::FullContextParallel => (vec![GroupSpec::full_attention(4)], 16, 16),
        Mix::PartialHitsMambaAlign => (
            vec![GroupSpec::full_attention(4), mamba(MambaMode::Align, 2, 4)],
            4,
            4,
        ),
        Mix::PartialHitsMambaAlignCheckpoints => {
            let mut m = mamba(MambaMode::Align, 2, 4);
            m.mamba_checkpoints = Some(MambaCheckpoints {
                alignment: 1,
                hash_block_size: 4,
                num_hash_lookahead_tokens: 0,
                drop_eagle_block: false,
                only_at_prefill_end: false,
            });
            (vec![GroupSpec::full_attention(4), m], 4, 4)
        }
        Mix::PartialHitsWideSw => (vec![GroupSpec::full_attention(8), sw(7, 4)], 8, 4),
    }
}

fn is_align_mix(mix: Mix, caching: bool) -> bool {
    mix == Mix::PartialHitsMambaAlign
        || caching && matches!(mix, Mix::FullMambaAlignSpec | Mix::FullMamba3)
}

fn make_manager(
    mix: Mix,
    caching: bool,
    num_blocks: u32,
    eagle: bool,
    retention: Option<usize>,
) -> KvCacheManager {
    let (groups, sbs, hbs) = mix_groups(mix, caching);
    KvCacheManager::new(ManagerConfig {
        num_blocks,
        groups,
        max_model_len: MAX_MODEL_LEN,
        scheduler_block_size: sbs,
        hash_block_size: hbs,
        profile: if matches!(
            mix,
            Mix::PartialHitsMambaAlign
                | Mix::PartialHitsMambaAlignCheckpoints
                | Mix::PartialHitsWideSw
        ) {
            BehaviourProfile::PARTIAL_BLOCK_HITS
        } else {
            Default::default()
        },
        enable_caching: caching,
        use_eagle: eagle,
        enable_events: true,
        dcp_world_size: if mix == Mix::FullContextParallel {
            2
        } else {
            1
        },
        pcp_world_size: if mix == Mix::FullContextParallel {
            2
        } else {
            1
        },
        retention_interval: retention,
    })
    .expect("valid config")
}

// ---------------------------------------------------------------------------
// Operations: raw numbers, interpreted against the current state so that
// every sequence is legal (and shrinks well).

#[derive(Debug, Clone)]
enum Op {
    /// A new waiting request: prompt = shared prefix `prefix` (0: none) + tail.
    Arrive {
        prefix: u8,
        tail: u8,
        salt: u8,
    },
    /// Admit a waiting request: cache lookup, then allocate.
    Admit {
        who: u8,
        chunk: u8,
        use_hit: bool,
        ext: u8,
        async_load: bool,
        lookahead: u8,
        must_fit: bool,
        reserved: u8,
    },
    /// One step of a running request: a prefill chunk or a decode round.
    Step {
        who: u8,
        chunk: u8,
        drafts: u8,
        accepted: u8,
        lookahead: u8,
        reserved: u8,
    },
    /// An async external load finished: cache_blocks and go on.
    FinishLoad {
        who: u8,
    },
    /// Preempt (free, keep tokens) every request whose bit is set.
    PreemptStorm {
        mask: u16,
    },
    /// Finish (free and forget) one request.
    Finish {
        who: u8,
    },
    Evict {
        ids: Vec<u8>,
    },
    Reset,
    RemoveSkipped {
        who: u8,
        back: u8,
    },
    NewStep,
    CacheBlocks {
        who: u8,
        back: u8,
    },
    CommonPrefix {
        who: u8,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..4, 0u8..40, any::<u8>()).prop_map(|(prefix, tail, salt)| Op::Arrive { prefix, tail, salt }),
        5 => (any::<u8>(), any::<u8>(), any::<bool>(), 0u8..24, any::<bool>(), 0u8..6, prop::bool::weighted(0.2), 0u8..3)
            .prop_map(|(who, chunk, use_hit, ext, async_load, lookahead, must_fit, reserved)| Op::Admit {
                who, chunk, use_hit: use_hit || chunk % 3 != 0, ext: if ext > 12 { 0 } else { ext }, async_load,
                lookahead: if lookahead > 3 { 0 } else { lookahead }, must_fit, reserved: if reserved == 2 { 1 } else { 0 },
            }),
        10 => (any::<u8>(), any::<u8>(), 0u8..10, any::<u8>(), 0u8..6, 0u8..4)
            .prop_map(|(who, chunk, drafts, accepted, lookahead, reserved)| Op::Step {
                who, chunk, drafts: if drafts > 6 { 0 } else { drafts }, accepted,
                lookahead: if lookahead > 3 { 0 } else { lookahead }, reserved: if reserved == 3 { 1 } else { 0 },
            }),
        2 => any::<u8>().prop_map(|who| Op::FinishLoad { who }),
        1 => any::<u16>().prop_map(|mask| Op::PreemptStorm { mask }),
        2 => any::<u8>().prop_map(|who| Op::Finish { who }),
        1 => prop::collection::vec(any::<u8>(), 0..4).prop_map(|ids| Op::Evict { ids }),
        1 => Just(Op::Reset),
        1 => (any::<u8>(), 0u8..6).prop_map(|(who, back)| Op::RemoveSkipped { who, back }),
        2 => Just(Op::NewStep),
        1 => (any::<u8>(), 0u8..6).prop_map(|(who, back)| Op::CacheBlocks { who, back }),
        1 => any::<u8>().prop_map(|who| Op::CommonPrefix { who }),
    ]
}

// ---------------------------------------------------------------------------
// The driver's view of requests.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Waiting,
    /// Holds blocks; num_cached_block is tracked (or caching is off).
    Running,
    /// Allocated for an async external load (delay_cache_blocks); the load
    /// completes with FinishLoad.
    Loading {
        target: usize,
    },
}

#[derive(Debug, Clone)]
struct Req {
    id: String,
    tokens: Vec<u32>,
    /// Tokens at arrival (what sparse retention's replay boundary reads).
    prompt: usize,
    computed: usize,
    st: St,
}

const PREFIXES: [&[u32]; 4] = [
    &[],
    &[
        11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
    ],
    &[
        11, 12, 13, 14, 15, 16, 17, 18, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54,
        55,
    ],
    &[60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71],
];

/// Chained block hashes at `hbs` tokens (8 bytes, FNV-1a over parent + tokens).
fn block_hashes(tokens: &[u32], hbs: usize) -> Vec<Box<[u8]>> {
    let mut out: Vec<Box<[u8]>> = Vec::new();
    let mut parent: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in tokens.chunks_exact(hbs) {
        let mut h = parent;
        for &t in chunk {
            for b in t.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        parent = h;
        out.push(h.to_le_bytes().to_vec().into_boxed_slice());
    }
    out
}

// ---------------------------------------------------------------------------
// Exact state snapshots for the Ok(None) checks.

/// (last_state_block_idx, allocated) of a Mamba align group.
type AlignTuple = (Option<usize>, bool);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Snap {
    free: Vec<u32>,
    refs: Vec<i32>,
    hashes: Vec<Option<(Vec<u8>, u32)>>,
    tables: Vec<(String, Vec<Vec<u32>>)>,
    align: Vec<(String, Vec<Option<AlignTuple>>)>,
}

fn snap(m: &KvCacheManager, ids: &[String]) -> Snap {
    let p = m.pool();
    let n = p.num_blocks();
    Snap {
        free: p.free_queue().collect(),
        refs: (0..n).map(|b| p.ref_cnt(b)).collect(),
        hashes: (0..n)
            .map(|b| p.block_hash(b).map(|(h, g)| (h.to_vec(), g)))
            .collect(),
        tables: ids
            .iter()
            .map(|id| (id.clone(), m.get_block_ids(id)))
            .collect(),
        align: ids
            .iter()
            .map(|id| {
                let st = (0..m.num_groups())
                    .map(|g| {
                        m.align_state(id, g)
                            .map(|a| (a.last_state_block_idx, a.allocated))
                    })
                    .collect();
                (id.clone(), st)
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------
// The machine.

struct Machine {
    m: KvCacheManager,
    mix: Mix,
    caching: bool,
    align: bool,
    hbs: usize,
    sbs: usize,
    reqs: Vec<Req>,
    next_id: usize,
    stats: Stats,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    allocs: usize,
    nones: usize,
    hits: usize,
    ext: usize,
    drafts_down: usize,
}

type R = Result<(), TestCaseError>;

impl Machine {
    fn new(
        mix: Mix,
        caching: bool,
        num_blocks: u32,
        eagle: bool,
        retention: Option<usize>,
    ) -> Self {
        let (_, sbs, hbs) = mix_groups(mix, caching);
        Machine {
            m: make_manager(mix, caching, num_blocks, eagle, retention),
            mix,
            caching,
            align: is_align_mix(mix, caching),
            hbs: hbs as usize,
            sbs: sbs as usize,
            reqs: Vec::new(),
            next_id: 0,
            stats: Stats::default(),
        }
    }

    fn ids(&self) -> Vec<String> {
        self.reqs.iter().map(|r| r.id.clone()).collect()
    }

    fn pick(&self, who: u8, want: impl Fn(&Req) -> bool) -> Option<usize> {
        let cands: Vec<usize> = (0..self.reqs.len())
            .filter(|&i| want(&self.reqs[i]))
            .collect();
        (!cands.is_empty()).then(|| cands[who as usize % cands.len()])
    }

    fn update(&self, i: usize) -> Option<HashUpdate> {
        if !self.caching {
            return None;
        }
        let r = &self.reqs[i];
        let all = block_hashes(&r.tokens, self.hbs);
        let known = self.m.num_known_hashes(&r.id);
        (all.len() > known).then(|| HashUpdate {
            offset: known,
            hashes: all[known..].iter().collect(),
        })
    }

    /// Calls allocate_slots and checks everything an allocation promises.
    fn allocate(
        &mut self,
        i: usize,
        args: &AllocateArgs,
    ) -> Result<Option<Vec<Vec<u32>>>, TestCaseError> {
        let ids = self.ids();
        let id = self.reqs[i].id.clone();
        let before = snap(&self.m, &ids);
        // What vLLM's state is after a refusal: the full_sequence_must_fit gate
        // changes nothing; the capacity check comes after remove_skipped_blocks.
        let total_computed = (args.num_computed_tokens
            + args.num_new_computed_tokens
            + args.num_external_computed_tokens)
            .min(MAX_MODEL_LEN);
        let gate_refuses = args.full_sequence_must_fit && {
            let full = args.num_tokens.min(MAX_MODEL_LEN);
            let empty = vec![Vec::new(); self.m.num_groups()];
            let nc = args.new_computed_blocks.unwrap_or(&empty);
            let need = self
                .m
                .get_num_blocks_to_allocate(
                    &id,
                    full,
                    nc,
                    args.num_encoder_tokens,
                    total_computed,
                    full,
                    true,
                    0,
                )
                .map_err(|e| TestCaseError::fail(format!("get_num_blocks_to_allocate: {e}")))?;
            need > self.m.pool().num_free_blocks() as i64
        };
        let expected_if_none = if gate_refuses {
            before.clone()
        } else {
            let mut c = self.m.clone();
            c.remove_skipped_blocks(&id, total_computed);
            snap(&c, &ids)
        };
        let update = self.update(i);
        let out = self.m.allocate_slots(&id, args, update).map_err(|e| {
            TestCaseError::fail(format!("allocate_slots({id}, {args:?}) -> Err({e})"))
        })?;
        self.stats.allocs += 1;
        match &out {
            None => {
                self.stats.nones += 1;
                let after = snap(&self.m, &ids);
                prop_assert_eq!(
                    &after,
                    &expected_if_none,
                    "Ok(None) changed state beyond remove_skipped_blocks (gate_refuses={})",
                    gate_refuses
                );
                if !matches!(
                    self.mix,
                    Mix::FullSw
                        | Mix::SwMamba
                        | Mix::FullChunked
                        | Mix::FullMambaAlignSpec
                        | Mix::FullMamba3
                        | Mix::PartialHitsMambaAlign
                        | Mix::PartialHitsMambaAlignCheckpoints
                        | Mix::PartialHitsWideSw
                ) {
                    prop_assert_eq!(&after, &before, "Ok(None) changed state (full attention)");
                }
            }
            Some(new) => {
                let tables = self.m.get_block_ids(&id);
                prop_assert_eq!(new.len(), tables.len());
                let (groups, _, _) = mix_groups(self.mix, self.caching);
                for (g, (n, t)) in new.iter().zip(&tables).enumerate() {
                    prop_assert!(
                        t.ends_with(n),
                        "group {} table {:?} does not end with new {:?}",
                        g,
                        t,
                        n
                    );
                    if !matches!(groups[g].kind, SpecKind::Mamba { .. }) {
                        prop_assert!(!n.contains(&NULL_BLOCK), "null block handed out: {:?}", n);
                    }
                    for &b in n {
                        if b != NULL_BLOCK {
                            prop_assert!(self.m.pool().ref_cnt(b) >= 1);
                            prop_assert!(!self.m.pool().is_free(b));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    fn sample(&mut self, i: usize, n: usize, seed: u8) {
        let r = &mut self.reqs[i];
        for k in 0..n {
            // Few distinct tokens: decodes of different requests collide often.
            r.tokens.push(100 + ((u32::from(seed) + k as u32) % 3));
        }
    }

    fn apply(&mut self, op: &Op) -> R {
        match *op {
            Op::Arrive { prefix, tail, salt } => {
                if self.reqs.len() >= 12 {
                    return Ok(());
                }
                let mut tokens: Vec<u32> = PREFIXES[prefix as usize].to_vec();
                for k in 0..tail as u32 {
                    tokens.push(200 + (u32::from(salt) * 7 + k) % 5);
                }
                if tokens.is_empty() {
                    tokens.push(1);
                }
                tokens.truncate(MAX_MODEL_LEN - 16);
                // Reuse ids of finished requests now and then.
                let id = format!("r{}", self.next_id % 16);
                self.next_id += 1;
                if self.reqs.iter().any(|r| r.id == id) {
                    return Ok(());
                }
                self.reqs.push(Req {
                    id,
                    prompt: tokens.len(),
                    tokens,
                    computed: 0,
                    st: St::Waiting,
                });
            }
            Op::Admit {
                who,
                chunk,
                use_hit,
                ext,
                async_load,
                lookahead,
                must_fit,
                reserved,
            } => {
                let Some(i) = self.pick(who, |r| r.st == St::Waiting) else {
                    return Ok(());
                };
                let id = self.reqs[i].id.clone();
                let num_tokens = self.reqs[i].tokens.len();
                let prompt = self.reqs[i].prompt;
                let (hit, hit_len) = if self.caching && use_hit {
                    if let Some(u) = self.update(i) {
                        self.m
                            .sync_update(&id, u)
                            .map_err(|e| TestCaseError::fail(format!("sync_hashes: {e}")))?;
                    }
                    self.m
                        .get_computed_blocks(&id, num_tokens, None)
                        .map_err(|e| TestCaseError::fail(format!("get_computed_blocks: {e}")))?
                } else {
                    (vec![Vec::new(); self.m.num_groups()], 0)
                };
                prop_assert!(hit_len < num_tokens);
                if hit_len > 0 {
                    self.stats.hits += 1;
                }
                let rest = num_tokens - hit_len;
                let ext = (ext as usize).min(rest - 1);
                // A vLLM bug the whole-block-hits profile keeps (see `vllm_bug_external_tokens_take_a_later_groups_free_hit`):
                // an earlier group's external-token blocks may pop a free hit
                // block of a later group. Kept out unless asked for.
                let later_free_hit = hit
                    .iter()
                    .skip(1)
                    .flatten()
                    .any(|&b| b != NULL_BLOCK && self.m.pool().ref_cnt(b) == 0);
                let ext = if later_free_hit && !known_bugs() {
                    0
                } else {
                    ext
                };
                let async_load = async_load && ext > 0;
                let new = if async_load {
                    0
                } else {
                    let left = rest - ext;
                    self.chunk_size(hit_len + ext, left, chunk)
                };
                let any_hit = hit.iter().any(|g| !g.is_empty());
                let args = AllocateArgs {
                    num_new_tokens: new,
                    num_computed_tokens: 0,
                    num_tokens,
                    num_new_computed_tokens: hit_len,
                    new_computed_blocks: any_hit.then_some(&hit[..]),
                    num_lookahead_tokens: lookahead as usize,
                    num_external_computed_tokens: ext,
                    delay_cache_blocks: async_load,
                    num_encoder_tokens: 0,
                    full_sequence_must_fit: must_fit,
                    reserved_blocks: reserved as usize,
                    watermark_blocks: 0,
                    num_prompt_tokens: Some(prompt),
                    ..Default::default()
                };
                if ext > 0 {
                    self.stats.ext += 1;
                }
                if self.allocate(i, &args)?.is_some() {
                    let r = &mut self.reqs[i];
                    if async_load {
                        r.st = St::Loading {
                            target: hit_len + ext,
                        };
                    } else {
                        r.st = St::Running;
                        r.computed = hit_len + ext + new;
                        if r.computed == r.tokens.len() {
                            self.sample(i, 1, chunk);
                        }
                    }
                }
            }
            Op::Step {
                who,
                chunk,
                drafts,
                accepted,
                lookahead,
                reserved,
            } => {
                let Some(i) = self.pick(who, |r| r.st == St::Running) else {
                    return Ok(());
                };
                let (num_tokens, computed) = (self.reqs[i].tokens.len(), self.reqs[i].computed);
                let left = num_tokens - computed;
                let decode = left == 1;
                let (new, k) = if decode {
                    let k = (drafts as usize).min(MAX_MODEL_LEN.saturating_sub(num_tokens + 2));
                    (1 + k, k)
                } else {
                    (self.chunk_size(computed, left, chunk), 0)
                };
                if computed + new >= MAX_MODEL_LEN - 1 || num_tokens + k + 2 >= MAX_MODEL_LEN {
                    // At the length limit the request finishes.
                    self.m.free(&self.reqs[i].id);
                    self.reqs.remove(i);
                    return Ok(());
                }
                let args = AllocateArgs {
                    num_new_tokens: new,
                    num_computed_tokens: computed,
                    num_tokens,
                    num_lookahead_tokens: lookahead as usize,
                    reserved_blocks: reserved as usize,
                    ..Default::default()
                };
                if k < drafts as usize {
                    self.stats.drafts_down += 1;
                }
                if self.allocate(i, &args)?.is_some() {
                    if decode {
                        let acc = accepted as usize % (k + 1);
                        self.reqs[i].computed += 1 + acc;
                        self.sample(i, acc + 1, accepted);
                    } else {
                        self.reqs[i].computed += new;
                        if self.reqs[i].computed == num_tokens {
                            self.sample(i, 1, chunk);
                        }
                    }
                }
            }
            Op::FinishLoad { who } => {
                let Some(i) = self.pick(who, |r| matches!(r.st, St::Loading { .. })) else {
                    return Ok(());
                };
                let St::Loading { target } = self.reqs[i].st else {
                    unreachable!()
                };
                let id = self.reqs[i].id.clone();
                let update = self.update(i);
                self.m
                    .cache_blocks(&id, target, update)
                    .map_err(|e| TestCaseError::fail(format!("cache_blocks after load: {e}")))?;
                let r = &mut self.reqs[i];
                r.computed = target;
                r.st = St::Running;
            }
            Op::PreemptStorm { mask } => {
                for i in 0..self.reqs.len().min(16) {
                    if mask & (1 << i) != 0 && self.reqs[i].st != St::Waiting {
                        self.m.free(&self.reqs[i].id);
                        let r = &mut self.reqs[i];
                        r.st = St::Waiting;
                        r.computed = 0;
                    }
                }
            }
            Op::Finish { who } => {
                let Some(i) = self.pick(who, |_| true) else {
                    return Ok(());
                };
                self.m.free(&self.reqs[i].id);
                self.reqs.remove(i);
            }
            Op::Evict { ref ids } => {
                let n = self.m.pool().num_blocks();
                let ids: Vec<u32> = ids.iter().map(|&b| u32::from(b) % n).collect();
                self.m
                    .evict_blocks(&ids)
                    .map_err(|e| TestCaseError::fail(format!("evict_blocks({ids:?}): {e}")))?;
            }
            Op::Reset => {
                let all_free =
                    self.m.pool().num_free_blocks() + 1 == self.m.pool().num_blocks() as usize;
                let ok = self.m.reset_prefix_cache();
                prop_assert_eq!(ok, all_free);
                if ok {
                    let p = self.m.pool();
                    prop_assert_eq!(p.num_cached_keys(), 0);
                    prop_assert!((0..p.num_blocks()).all(|b| p.block_hash(b).is_none()));
                }
            }
            Op::RemoveSkipped { who, back } => {
                let Some(i) = self.pick(who, |r| r.st == St::Running) else {
                    return Ok(());
                };
                let total = self.reqs[i].computed.saturating_sub(back as usize);
                let id = self.reqs[i].id.clone();
                self.m.remove_skipped_blocks(&id, total);
            }
            Op::NewStep => self.m.new_step_starts(),
            Op::CacheBlocks { who, back } => {
                let Some(i) = self.pick(who, |r| r.st == St::Running) else {
                    return Ok(());
                };
                let n = self.reqs[i].computed.saturating_sub(back as usize);
                let id = self.reqs[i].id.clone();
                let update = self.update(i);
                self.m
                    .cache_blocks(&id, n, update)
                    .map_err(|e| TestCaseError::fail(format!("cache_blocks({id}, {n}): {e}")))?;
            }
            Op::CommonPrefix { who } => {
                let Some(i) = self.pick(who, |r| r.st == St::Running) else {
                    return Ok(());
                };
                let id = self.reqs[i].id.clone();
                let v = self.m.get_num_common_prefix_blocks(&id);
                prop_assert_eq!(v.len(), self.m.num_groups());
                let tables = self.m.get_block_ids(&id);
                for (n, t) in v.iter().zip(&tables) {
                    prop_assert!(*n <= t.len());
                }
                if !self.caching {
                    prop_assert!(v.iter().all(|&n| n == 0));
                }
            }
        }
        Ok(())
    }

    /// A prefill chunk of at most `left` tokens starting at `start`; Mamba
    /// align mode ends non-final chunks on block boundaries, as vLLM's
    /// scheduler does.
    fn chunk_size(&self, start: usize, left: usize, raw: u8) -> usize {
        let mut n = 1 + raw as usize % left.max(1);
        n = n.min(left);
        if self.align && n < left {
            let end = (start + n) / self.sbs * self.sbs;
            if end > start {
                n = end - start;
            } else {
                n = left.min(self.sbs - start % self.sbs);
            }
        }
        n.max(1)
    }

    fn check(&self, op: &Op, step: usize) -> R {
        if let Err(e) = self.m.check_invariants() {
            return Err(TestCaseError::fail(format!(
                "invariant violated after op #{step} {op:?} ({:?}, caching={}): {e}",
                self.mix, self.caching
            )));
        }
        let p = self.m.pool();
        prop_assert_eq!(p.free_queue().count(), p.num_free_blocks());
        prop_assert!(!p.is_free(NULL_BLOCK));
        prop_assert!(p.block_hash(NULL_BLOCK).is_none());
        // Every request the driver thinks holds nothing holds nothing.
        for r in &self.reqs {
            let t = self.m.get_block_ids(&r.id);
            if r.st == St::Waiting {
                prop_assert!(
                    t.iter().all(|g| g.is_empty()),
                    "waiting {} holds {:?}",
                    r.id,
                    t
                );
            }
        }
        Ok(())
    }
}

fn run(
    mix: Mix,
    caching: bool,
    num_blocks: u32,
    eagle: bool,
    retention: Option<usize>,
    ops: &[Op],
) -> Result<Stats, TestCaseError> {
    let mut mach = Machine::new(mix, caching, num_blocks, eagle, retention);
    for (step, op) in ops.iter().enumerate() {
        mach.apply(op)?;
        mach.check(op, step)?;
    }
    // Drain: freeing everything returns every block; reset then succeeds.
    for r in std::mem::take(&mut mach.reqs) {
        mach.m.free(&r.id);
    }
    mach.m
        .check_invariants()
        .map_err(|e| TestCaseError::fail(format!("after drain: {e}")))?;
    prop_assert_eq!(mach.m.pool().num_free_blocks(), num_blocks as usize - 1);
    prop_assert!(mach.m.reset_prefix_cache());
    prop_assert_eq!(mach.m.num_requests(), 0);
    Ok(mach.stats)
}

/// `HC_PROPTEST_KNOWN_BUGS=1` also generates inputs that hit known vLLM bugs
/// of the whole-block-hits profile (which hybridcache reproduces, so the
/// invariant check then fails).
fn known_bugs() -> bool {
    std::env::var("HC_PROPTEST_KNOWN_BUGS").is_ok_and(|v| v == "1")
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

fn check_mix(mix: Mix, caching: bool, retention: Option<usize>) {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    // A fixed seed: the coverage checks below (some case runs out of
    // blocks, some hits) hold or fail the same on every run, so CI is not
    // flaky; HC_PROPTEST_RANDOM=1 draws a fresh seed (for long local runs).
    let mut runner = if std::env::var("HC_PROPTEST_RANDOM").is_ok_and(|v| v == "1") {
        proptest::test_runner::TestRunner::new(config)
    } else {
        proptest::test_runner::TestRunner::new_with_rng(
            config,
            proptest::test_runner::TestRng::deterministic_rng(
                proptest::test_runner::RngAlgorithm::ChaCha,
            ),
        )
    };
    // Context parallelism makes blocks 4x larger: a smaller pool still runs out.
    let pool = if mix == Mix::FullContextParallel {
        4u32..10
    } else {
        8u32..28
    };
    let strat = (
        pool,
        prop::bool::weighted(0.25),
        prop::collection::vec(op_strategy(), 1..90),
    );
    let acc = std::cell::Cell::new(Stats::default());
    let result = runner.run(&strat, |(num_blocks, eagle, ops)| {
        let s = run(mix, caching, num_blocks, eagle, retention, &ops)?;
        let mut t = acc.get();
        t.allocs += s.allocs;
        t.nones += s.nones;
        t.hits += s.hits;
        t.ext += s.ext;
        t.drafts_down += s.drafts_down;
        acc.set(t);
        Ok(())
    });
    let total = acc.get();
    eprintln!("{mix:?} caching={caching}: {total:?}");
    if let Err(e) = result {
        panic!("{mix:?} caching={caching}: {e}");
    }
    // The sequences must reach the interesting paths.
    assert!(
        total.allocs > 0 && total.nones > 0,
        "{mix:?}/{caching}: {total:?}"
    );
    if caching && cases() >= 16 {
        assert!(
            total.hits > 0,
            "{mix:?}: no cache hit in any case: {total:?}"
        );
    }
}

macro_rules! mix_tests {
    ($($name:ident: $mix:expr, $caching:expr $(, $retention:expr)?;)*) => {$(
        #[test]
        fn $name() {
            check_mix($mix, $caching, None $(.or($retention))?);
        }
    )*};
}

mix_tests! {
    full_caching: Mix::Full, true;
    full_no_caching: Mix::Full, false;
    full_sw_caching: Mix::FullSw, true;
    full_sw_no_caching: Mix::FullSw, false;
    full_mamba_align_spec_caching: Mix::FullMambaAlignSpec, true;
    full_mamba_no_caching: Mix::FullMambaAlignSpec, false;
    sw_mamba_caching: Mix::SwMamba, true;
    sw_mamba_no_caching: Mix::SwMamba, false;
    full_mamba3_caching: Mix::FullMamba3, true;
    full_mamba3_no_caching: Mix::FullMamba3, false;
    full_chunked_caching: Mix::FullChunked, true;
    full_chunked_no_caching: Mix::FullChunked, false;
    full_context_parallel_caching: Mix::FullContextParallel, true;
    full_context_parallel_no_caching: Mix::FullContextParallel, false;
    // Sparse retention (segments of 2 and 3 scheduler blocks; 0: the
    // replay boundary only): the compact decode against the general path.
    full_sw_retention_2: Mix::FullSw, true, Some(16);
    full_sw_retention_0: Mix::FullSw, true, Some(0);
    sw_mamba_retention_3: Mix::SwMamba, true, Some(12);
    partial_hits_mamba_align_no_caching: Mix::PartialHitsMambaAlign, false;
    partial_hits_mamba_align_checkpoints_no_caching: Mix::PartialHitsMambaAlignCheckpoints, false;
    partial_hits_wide_sw_caching: Mix::PartialHitsWideSw, true;
    partial_hits_wide_sw_no_caching: Mix::PartialHitsWideSw, false;
}

#[test]
fn every_mix_builds() {
    for mix in ALL_MIXES {
        for caching in [true, false] {
            let m = make_manager(mix, caching, 16, false, None);
            m.check_invariants().unwrap();
        }
    }
}

/// A vLLM bug the whole-block-hits profile reproduces exactly (drop-in
/// parity; `two_phase_external` off): with several groups, `allocate_new_computed_blocks` runs group by group, and an
/// earlier group's blocks for external computed tokens come from the front
/// of the free queue, which may hold a later group's prefix-cache hit
/// (ref_cnt 0). That group then touches the block anyway: one block serves
/// two groups (ref_cnt 2, hash dropped). `get_num_blocks_to_allocate`
/// counted it once. Ignored until the parent decides whether to deviate
/// from vLLM here; run with `cargo test -- --ignored`.
#[test]
fn vllm_bug_external_tokens_take_a_later_groups_free_hit() {
    let mut m = KvCacheManager::new(ManagerConfig {
        num_blocks: 9,
        groups: vec![
            GroupSpec::full_attention(4),
            GroupSpec::new(SpecKind::SlidingWindow { window: 4 }, 4),
        ],
        max_model_len: 64,
        scheduler_block_size: 4,
        hash_block_size: 4,
        profile: Default::default(),
        enable_caching: true,
        use_eagle: false,
        enable_events: false,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: None,
    })
    .unwrap();
    let a: Vec<u32> = (0..16).collect();
    m.sync_hashes("a", 0, block_hashes(&a, 4)).unwrap();
    let args = AllocateArgs {
        num_new_tokens: 16,
        num_tokens: 16,
        ..Default::default()
    };
    m.allocate_slots("a", &args, None).unwrap().unwrap();
    // a's sliding-window blocks 5, 6, 7 leave the window: free, still cached.
    m.remove_skipped_blocks("a", 16);
    let mut b: Vec<u32> = (0..12).collect();
    b.extend([99; 5]);
    m.sync_hashes("b", 0, block_hashes(&b, 4)).unwrap();
    let (hit, n) = m.get_computed_blocks("b", b.len(), None).unwrap();
    assert_eq!((hit.clone(), n), (vec![vec![1, 2, 3], vec![0, 0, 7]], 12));
    let args = AllocateArgs {
        num_new_tokens: 1,
        num_tokens: b.len(),
        num_new_computed_tokens: n,
        new_computed_blocks: Some(&hit),
        num_external_computed_tokens: 1,
        ..Default::default()
    };
    m.allocate_slots("b", &args, None).unwrap().unwrap();
    // vLLM (whole-block-hits) gives b ([1, 2, 3, 7], [0, 0, 7, 6]): block 7 in both
    // groups. hybridcache touches every group's hits before allocating.
    let ids = m.get_block_ids("b");
    assert_eq!(&ids[0][..3], &[1, 2, 3]);
    assert_eq!(&ids[1][..3], &[0, 0, 7]);
    assert!(
        !ids[0].contains(&7),
        "block 7 must stay in the sliding-window group only: {ids:?}"
    );
    m.check_invariants()
        .expect("a block must not serve two groups");
}

/// A vLLM bug of the whole-block-hits profile, fixed in hybridcache: in Mamba "align" mode vLLM's
/// `get_num_blocks_to_allocate` counts only `1 + num_speculative_blocks` new
/// blocks, not the blocks `allocate_new_computed_blocks` takes for external
/// computed tokens. With a pool that tight vLLM raises `ValueError: Cannot
/// get 1 free blocks from the pool` half-way through `allocate_slots`
/// (blocks already taken); the core used to panic in
/// `BlockPool::get_new_blocks`. Now: `Ok(None)`, nothing taken.
#[test]
fn mamba_align_external_tokens_out_of_blocks_is_none() {
    let mut m = KvCacheManager::new(ManagerConfig {
        num_blocks: 5,
        groups: vec![GroupSpec::full_attention(4), mamba(MambaMode::Align, 0, 4)],
        max_model_len: 64,
        scheduler_block_size: 4,
        hash_block_size: 4,
        profile: Default::default(),
        enable_caching: true,
        use_eagle: false,
        enable_events: false,
        dcp_world_size: 1,
        pcp_world_size: 1,
        retention_interval: None,
    })
    .unwrap();
    let tokens: Vec<u32> = (0..9).collect();
    m.sync_hashes("r", 0, block_hashes(&tokens, 4)).unwrap();
    let empty = vec![Vec::new(); 2];
    // Counted: 4 (full 3, mamba 1); taken: 5 (mamba: 1 for the external tokens + 1).
    assert_eq!(
        m.get_num_blocks_to_allocate("r", 9, &empty, 0, 8, 9, false, 0)
            .unwrap(),
        4
    );
    assert_eq!(m.pool().num_free_blocks(), 4);
    let args = AllocateArgs {
        num_new_tokens: 1,
        num_tokens: 9,
        num_external_computed_tokens: 8,
        ..Default::default()
    };
    let out = m.allocate_slots("r", &args, None).unwrap();
    assert_eq!(out, None, "too few free blocks: Ok(None), nothing taken");
    m.check_invariants().unwrap();
}

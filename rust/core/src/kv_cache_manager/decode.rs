//! The decode fast paths of `KvCacheManager`: the hot-line no-op check
//! (the request's cached horizon), the no-op decode done in full, and the
//! compact plain decode. Each is exact: debug builds compare it with the
//! general path (`allocate.rs`).

use super::{AllocateArgs, KvCacheManager};
use crate::decode_bounds::{DecodeCounts, DecodeHorizon, DecodePhases};
use crate::hashes::HashUpdate;
use crate::new_blocks::NewBlocks;
use crate::ReqSlot;

impl KvCacheManager {
    /// Whether `allocate_slots` with these arguments may read hashes beyond
    /// `known`: callers can skip fetching new hashes otherwise.
    pub fn may_need_hashes(&self, known: usize, args: &AllocateArgs) -> bool {
        if !self.enable_caching || args.delay_cache_blocks {
            return false;
        }
        let total = (args.num_computed_tokens
            + args.num_new_computed_tokens
            + args.num_external_computed_tokens)
            .min(self.max_model_len);
        let to_cache = (total + args.num_new_tokens).min(args.num_tokens);
        to_cache / self.coord.pool.hash_block_size() as usize > known
    }

    /// A plain decode of a running request that changes no block (most
    /// decode steps): it needs no check beyond `num_new_tokens > 0` and no
    /// work beyond what the planner records. False: take the general path.
    pub fn is_noop_decode(&self, slot: ReqSlot, args: &AllocateArgs) -> bool {
        let plain = args.new_computed_blocks.is_none()
            && args.num_new_computed_tokens == 0
            && args.num_external_computed_tokens == 0
            && args.num_encoder_tokens == 0
            && args.reserved_blocks == 0
            && args.watermark_blocks == 0
            && !args.full_sequence_must_fit
            && args.num_new_tokens > 0;
        if !plain {
            return false;
        }
        let counts = self.decode_counts(
            args.num_new_tokens,
            args.num_computed_tokens,
            args.num_tokens,
            args.num_lookahead_tokens,
            !args.delay_cache_blocks,
        );
        match self.reqs.horizon(slot) {
            Some(h) => {
                let noop = h.allows(&counts);
                debug_assert!(
                    !noop
                        || self
                            .coord
                            .decode_is_noop(slot, &counts, &self.retention_marks(slot)),
                    "decode horizon {h:?} of slot {slot} admits a decode that changes blocks"
                );
                noop
            }
            None => self
                .coord
                .decode_is_noop(slot, &counts, &self.retention_marks(slot)),
        }
    }

    /// The counts a plain decode (no computed blocks, external or encoder
    /// tokens) is sized by, as `allocate_slots` derives them; `caches`:
    /// the call may cache (`delay_cache_blocks` is off).
    #[inline]
    pub(super) fn decode_counts(
        &self,
        num_new_tokens: usize,
        num_computed_tokens: usize,
        num_tokens: usize,
        lookahead: usize,
        caches: bool,
    ) -> DecodeCounts {
        let total_computed = num_computed_tokens.min(self.max_model_len);
        let main_model = total_computed + num_new_tokens;
        DecodeCounts {
            total_computed,
            need_slot: (main_model + lookahead).min(self.max_model_len),
            main_model,
            to_cache: (caches && self.enable_caching).then(|| main_model.min(num_tokens)),
        }
    }

    /// A plain decode's first look at a request: the slot its handle
    /// names (None: no live request) and whether `allocate_slots(request,
    /// num_new_tokens, num_lookahead_tokens=lookahead)` is a decode that
    /// changes no block and reads no new hash. Judged from the request's
    /// hot line alone, or from the tables when its horizon is unknown;
    /// exact either way. Always inlined: it is the scheduler's hottest
    /// call's body (a call costs a measurable share of it).
    #[inline(always)]
    pub fn plain_decode_by_handle(
        &self,
        handle: u64,
        num_new_tokens: usize,
        num_computed_tokens: usize,
        num_tokens: usize,
        lookahead: usize,
    ) -> Option<(ReqSlot, bool)> {
        let (slot, h, known) = self.reqs.resolve_for_decode(handle)?;
        let c = self.decode_counts(
            num_new_tokens,
            num_computed_tokens,
            num_tokens,
            lookahead,
            true,
        );
        let hash_block_size = self.coord.pool.hash_block_size() as usize;
        let noop = num_new_tokens > 0
            && c.to_cache.is_none_or(|t| t / hash_block_size <= known)
            && if *h == DecodeHorizon::UNKNOWN {
                self.decode_is_noop_by_tables(slot, &c)
            } else {
                h.allows(&c)
            };
        debug_assert_eq!(
            noop,
            {
                let args = plain_args(num_new_tokens, num_computed_tokens, num_tokens, lookahead);
                !self.may_need_hashes(known, &args) && self.is_noop_decode(slot, &args)
            },
            "hot-line check of slot {slot} disagrees with is_noop_decode"
        );
        #[cfg(debug_assertions)]
        if noop {
            let args = plain_args(num_new_tokens, num_computed_tokens, num_tokens, lookahead);
            self.check_noop_decode(slot, &args);
        }
        Some((slot, noop))
    }

    /// Debug builds: a decode judged a no-op changes nothing the general
    /// path would (blocks, caching, checkpoints, events), bar the
    /// planner's note and the horizon it re-derives.
    #[cfg(debug_assertions)]
    fn check_noop_decode(&self, slot: ReqSlot, args: &AllocateArgs) {
        self.assert_skip_matches(
            slot,
            "no-op decode",
            |general| {
                let mut out = NewBlocks::new();
                assert!(general.allocate_general_checked(slot, args, None, &mut out));
                assert!(out.is_empty(), "no-op decode of slot {slot} allocates");
            },
            |noop| noop.record_noop_decode(slot, args),
        );
    }

    /// Debug builds: what a fast path did instead of a call (`skip`) leaves
    /// the manager as the call in full (`run`) would, bar the request's
    /// horizon (each may re-derive it) and lookup hints (`Hint(n)`).
    #[cfg(debug_assertions)]
    pub(super) fn assert_skip_matches(
        &self,
        slot: ReqSlot,
        what: &str,
        run: impl FnOnce(&mut KvCacheManager),
        skip: impl FnOnce(&mut KvCacheManager),
    ) {
        let (mut called, mut skipped) = (self.clone(), self.clone());
        run(&mut called);
        skip(&mut skipped);
        let state = |m: &mut KvCacheManager| {
            m.set_horizon(slot, None);
            let s = format!("{m:?}");
            let mut out = String::with_capacity(s.len());
            let mut parts = s.split("Hint(");
            out.push_str(parts.next().unwrap_or_default());
            for p in parts {
                out.push_str("Hint(_");
                out.push_str(p.trim_start_matches(|c: char| c.is_ascii_digit()));
            }
            out
        };
        assert_eq!(
            state(&mut called),
            state(&mut skipped),
            "{what} of slot {slot} differs from the call in full"
        );
    }

    /// `coord.decode_is_noop` for a request without a known horizon (rare
    /// where horizons apply: out of the hot-line check's code).
    #[cold]
    #[inline(never)]
    pub(super) fn decode_is_noop_by_tables(&self, slot: ReqSlot, c: &DecodeCounts) -> bool {
        self.coord
            .decode_is_noop(slot, c, &self.retention_marks(slot))
    }

    /// A decode that changes no block, done in full (no hashes are due and
    /// `is_noop_decode` holds): `out` gets an empty run per group. False:
    /// nothing was done. `args.num_tokens` may be an upper bound here: the
    /// test only gets stricter with more tokens to cache.
    pub fn try_noop_decode(
        &mut self,
        slot: ReqSlot,
        args: &AllocateArgs,
        out: &mut NewBlocks,
    ) -> bool {
        let known = self.known_hashes_at(Some(slot));
        if self.may_need_hashes(known, args) || !self.is_noop_decode(slot, args) {
            return false;
        }
        self.record_noop_decode(slot, args);
        out.clear();
        out.push_empty_groups(self.num_groups());
        true
    }

    /// The whole effect of a decode `is_noop_decode` accepted: the Mamba
    /// planner notes the step (callers that checked already skip the rest).
    pub fn record_noop_decode(&mut self, slot: ReqSlot, args: &AllocateArgs) {
        self.record_plain_noop_decode(slot, args.num_computed_tokens, args.num_new_tokens);
    }

    /// `record_noop_decode` from the two counts it reads.
    #[inline]
    pub fn record_plain_noop_decode(
        &mut self,
        slot: ReqSlot,
        num_computed_tokens: usize,
        num_new_tokens: usize,
    ) {
        let total_computed = num_computed_tokens.min(self.max_model_len);
        self.note_last_step(slot, total_computed, num_new_tokens);
    }

    /// What the Mamba copy planner needs of a request's last allocation
    /// (nothing to keep without Mamba align groups).
    pub(super) fn note_last_step(
        &mut self,
        slot: ReqSlot,
        total_computed: usize,
        num_new_tokens: usize,
    ) {
        if self.has_align_groups {
            self.reqs
                .set_last_step(slot, (total_computed, num_new_tokens));
        }
    }

    /// `allocate_checked` for a plain decode (see `AllocateArgs::is_plain`)
    /// of a request running in every group: the coordinator's compact path,
    /// only the phases whose bound in the request's last horizon (`last`,
    /// None: unknown) these counts cross.
    pub(super) fn allocate_plain_decode(
        &mut self,
        slot: ReqSlot,
        args: &AllocateArgs,
        last: Option<DecodeHorizon>,
        update: Option<&HashUpdate>,
        out: &mut NewBlocks,
    ) -> bool {
        if let Some(u) = update {
            self.reqs.apply_hashes(slot, u);
        }
        let c = self.decode_counts(
            args.num_new_tokens,
            args.num_computed_tokens,
            args.num_tokens,
            args.num_lookahead_tokens,
            !args.delay_cache_blocks,
        );
        let phases = last.map_or(DecodePhases::ALL, |h| h.crossed(&c));
        let (hashes, marks) = (self.reqs.hashes(slot), self.retention_marks(slot));
        if !self.coord.plain_decode(
            slot,
            &c,
            phases,
            args.reserved_blocks + args.watermark_blocks,
            hashes,
            marks,
            out,
        ) {
            // A running request holds blocks: `release_if_idle` keeps it.
            return false;
        }
        self.allocated(slot, c.total_computed, args.num_new_tokens);
        true
    }
}

/// The arguments of the scheduler's decode call (the debug checks rebuild
/// them from its counts).
fn plain_args(
    num_new_tokens: usize,
    num_computed_tokens: usize,
    num_tokens: usize,
    lookahead: usize,
) -> AllocateArgs<'static> {
    AllocateArgs {
        num_new_tokens,
        num_computed_tokens,
        num_tokens,
        num_lookahead_tokens: lookahead,
        ..Default::default()
    }
}

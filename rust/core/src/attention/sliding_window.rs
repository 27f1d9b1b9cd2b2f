//! Sliding-window attention (also sliding-window MLA): the last `window`
//! tokens stay in the window; a hit is the right-most run of cached blocks
//! that covers the window; only blocks a hit can ever use are cached; freed
//! scratch blocks are reused first.

use super::HitSearch;
use crate::profile::Retention;
use crate::{cdiv, BlockId, NULL_BLOCK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlidingWindow {
    window: usize,
    /// Tokens kept below the window, never attended (vLLM's
    /// `extra_retained_tokens`: multi-module MTP may re-prefill them).
    extra: usize,
}

/// What places the tails sparse retention keeps besides the segment
/// tails: the request's prompt length (its replay boundaries) and, under
/// `Retention::ReplayBoundaries`, its shared-prefix junction (0: none).
/// Mamba align caching reads them too, and `num_computed_tokens` (the
/// request's own count at the call: vLLM's shared-prefix checkpoint
/// keys the junction only inside the prompt chunk being computed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RetentionMarks {
    pub num_prompt_tokens: Option<usize>,
    pub shared_prefix_boundary: usize,
    pub num_computed_tokens: usize,
}

/// The blocks of a sliding-window group that caching keeps (vLLM's
/// `reachable_block_mask`); the others are not cached. A hit ends on a
/// segment boundary and needs the `need` blocks before it (one more past
/// it with EAGLE, `shift`). Dense (no retention interval) the segments are
/// scheduler blocks; a retention interval N makes them N tokens (0: none)
/// and keeps the tails ending at the request's replay boundaries as well.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReachableBlocks {
    shift: usize,
    need: usize,
    /// Blocks per segment; 0: no segment tails (retention interval 0).
    per_segment: usize,
    /// Sparse retention: the rule placing the replay boundaries, the hit
    /// alignment (scheduler block) and whether any group drops an EAGLE
    /// block (vLLM's `replay_boundaries(..., use_eagle)`).
    replay: Option<(Retention, usize, bool)>,
    /// Where hits end (vLLM's `cache_hit_alignment_tokens`: the hash block
    /// under partial hash hits, else the scheduler block): boundaries
    /// round down to it.
    alignment: usize,
    block_size: usize,
    /// The group drops an EAGLE block: the junction's lower block is kept.
    junction_below: bool,
}

/// The block ranges ending at a request's replay boundaries (at most
/// four: two replay positions, the junction and the block below it).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ReplayTails {
    ranges: [(usize, usize); 4],
    len: usize,
}

impl ReplayTails {
    fn push(&mut self, r: (usize, usize)) {
        self.ranges[self.len] = r;
        self.len += 1;
    }

    #[inline]
    fn contains(&self, i: usize) -> bool {
        self.ranges[..self.len]
            .iter()
            .any(|&(a, b)| a <= i && i < b)
    }
}

impl ReachableBlocks {
    pub(crate) fn new(
        shift: usize,
        need: usize,
        per_segment: usize,
        replay: Option<(Retention, usize, bool)>,
        alignment: usize,
        block_size: usize,
        junction_below: bool,
    ) -> Self {
        ReachableBlocks {
            shift,
            need,
            per_segment,
            replay,
            alignment,
            block_size,
            junction_below,
        }
    }

    /// Whether block `i` is cached; `tails` from `replay_tails`.
    #[inline]
    pub fn keeps(&self, i: usize, tails: &ReplayTails) -> bool {
        let p = self.per_segment;
        (p > 0 && i >= self.shift && (i - self.shift) % p >= p - self.need) || tails.contains(i)
    }

    /// The blocks ending at the positions a later request replaying this
    /// one resumes at: kept under sparse retention, which would otherwise
    /// skip them. Empty when dense or when the prompt length is unknown.
    /// `SlidingWindowPromptTail`: the last aligned boundary before the
    /// prompt's last token (lookups cap a hit at `num_prompt_tokens - 1`).
    /// `ReplayBoundaries`: each of
    /// `replay_boundaries` (that one; with EAGLE one block below the
    /// resend's and the extension's boundaries) and the shared-prefix
    /// junction (one block lower too for an EAGLE group).
    pub fn replay_tails(&self, marks: RetentionMarks) -> ReplayTails {
        let mut t = ReplayTails::default();
        let (Some((rule, sbs, any_eagle)), Some(p)) = (self.replay, marks.num_prompt_tokens) else {
            return t;
        };
        let alignment = self.alignment;
        // The `need` blocks ending on the aligned boundary at or below `b`.
        let tail = |b: usize| {
            let end = b / alignment * alignment / self.block_size + self.shift;
            (end.saturating_sub(self.need), end)
        };
        match rule {
            Retention::SlidingWindowPromptTail => {
                if p > 0 {
                    t.push(tail(p - 1));
                }
            }
            Retention::ReplayBoundaries => {
                if p > 0 && !any_eagle {
                    t.push(tail(p - 1));
                } else if p > 0 {
                    // `replay_boundaries` places these on scheduler blocks.
                    let resend = (p - 1) / sbs * sbs;
                    let extension = p / sbs * sbs;
                    t.push(tail(resend.saturating_sub(sbs)));
                    t.push(tail(extension.saturating_sub(sbs)));
                }
                let junction = marks.shared_prefix_boundary;
                if junction > 0 {
                    t.push(tail(junction));
                    // Below 0 vLLM's range is empty.
                    if self.junction_below && junction >= self.block_size {
                        t.push(tail(junction - self.block_size));
                    }
                }
            }
        }
        t
    }
}

impl SlidingWindow {
    pub fn new(window: u32) -> Self {
        SlidingWindow {
            window: window as usize,
            extra: 0,
        }
    }

    /// The same window keeping `extra` more tokens below it.
    pub fn retaining(self, extra: u32) -> Self {
        SlidingWindow {
            extra: extra as usize,
            ..self
        }
    }

    /// All but the last `window - 1 + extra` computed tokens (and the new one).
    #[inline]
    pub fn skipped_tokens(&self, n: usize) -> usize {
        (n + 1).saturating_sub(self.window + self.extra)
    }

    /// n + 1 - window - extra < limit  <=>  n <= limit + window + extra - 2.
    #[inline]
    pub fn max_computed_skipping_below(&self, limit: usize) -> usize {
        limit + self.window + self.extra - 2
    }

    /// Blocks in a row a hit needs (one more to drop for EAGLE).
    fn contiguous_blocks_for_hit(&self, block_size: usize, use_eagle: bool) -> usize {
        cdiv(self.window - 1, block_size) + usize::from(use_eagle)
    }

    /// Which blocks caching keeps (None: all): those a hit can use at a
    /// scheduler-block aligned length, or, with a retention interval
    /// (`retention`: its value and rule), the segment tails it leaves and
    /// the replay boundaries' tails (`any_eagle`: see `ReachableBlocks`).
    pub fn reachable_blocks(
        &self,
        block_size: u32,
        (scheduler_block_size, alignment): (u32, u32),
        use_eagle: bool,
        any_eagle: bool,
        retention: Option<(usize, Retention)>,
    ) -> Option<ReachableBlocks> {
        let bs = block_size as usize;
        if alignment as usize % bs != 0 {
            // vLLM: a block-granular mask cannot hold it: keep every block.
            return None;
        }
        let need = self.contiguous_blocks_for_hit(bs, use_eagle);
        let segment_tokens = match retention {
            None => alignment as usize,
            Some((interval, _)) => interval,
        };
        let per_segment = segment_tokens / bs;
        if segment_tokens > 0 && need >= per_segment {
            // Every block can end a segment's hit.
            return None;
        }
        Some(ReachableBlocks::new(
            usize::from(use_eagle),
            need,
            per_segment,
            retention.map(|(_, rule)| (rule, scheduler_block_size as usize, any_eagle)),
            alignment as usize,
            bs,
            use_eagle,
        ))
    }

    /// Right to left: the first run of blocks covering the window wins;
    /// everything before it is the null block.
    pub fn find_hit(
        &self,
        s: &HitSearch<'_>,
        max_length: usize,
        drop_eagle: bool,
        out: &mut [Vec<BlockId>],
    ) {
        let need = self.contiguous_blocks_for_hit(s.block_size, drop_eagle);
        let max_blocks = max_length / s.block_size;
        for o in out.iter_mut() {
            o.resize(max_blocks, NULL_BLOCK);
        }
        let mut hit = Vec::with_capacity(s.groups.len());
        let mut run = 0;
        let mut found = false;
        for i in (0..max_blocks).rev() {
            if !s.lookup(i, &mut hit) {
                run = 0;
                continue;
            }
            if run == 0 && s.block_size != s.alignment_tokens {
                let after_pop = if drop_eagle { i } else { i + 1 };
                if after_pop * s.block_size % s.alignment_tokens != 0 {
                    continue;
                }
            }
            for (o, &b) in out.iter_mut().zip(&hit) {
                o[i] = b;
            }
            run += 1;
            if run >= need {
                out.iter_mut().for_each(|o| o.truncate(i + run));
                found = true;
                break;
            }
        }
        if !found {
            // A run reaching block 0 is a hit even if shorter than the window.
            out.iter_mut().for_each(|o| o.truncate(run));
            s.pop_to_alignment(out);
        }
        if drop_eagle && !out[0].is_empty() {
            HitSearch::pop_all(out);
            s.pop_to_alignment(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Retention = Retention::SlidingWindowPromptTail;

    /// The blocks below `end` caching keeps for a prompt of `prompt` tokens.
    fn kept(r: Option<ReachableBlocks>, end: usize, prompt: usize) -> Vec<usize> {
        kept_with(r, end, prompt, 0)
    }

    fn kept_with(
        r: Option<ReachableBlocks>,
        end: usize,
        prompt: usize,
        junction: usize,
    ) -> Vec<usize> {
        let marks = RetentionMarks {
            num_prompt_tokens: Some(prompt),
            shared_prefix_boundary: junction,
            num_computed_tokens: 0,
        };
        let tails = r.map_or(ReplayTails::default(), |r| r.replay_tails(marks));
        (0..end)
            .filter(|&i| r.is_none_or(|r| r.keeps(i, &tails)))
            .collect()
    }

    fn tails(r: &ReachableBlocks, prompt: Option<usize>) -> Vec<(usize, usize)> {
        let marks = RetentionMarks {
            num_prompt_tokens: prompt,
            shared_prefix_boundary: 0,
            num_computed_tokens: 0,
        };
        let t = r.replay_tails(marks);
        t.ranges[..t.len].to_vec()
    }

    #[test]
    fn retention_keeps_segment_tails_and_the_replay_tail() {
        // Pure SWA, 16-token blocks and window, interval 64, 256-token
        // prompt: tails of each 4-block segment, and block 14 before the
        // replay boundary 240.
        let sw = SlidingWindow::new(16);
        let r = sw.reachable_blocks(16, (16, 16), false, false, Some((64, RULE)));
        assert_eq!(kept(r, 16, 256), vec![3, 7, 11, 14, 15]);
        // Dense: every block can serve a hit of one 16-token block.
        assert!(sw
            .reachable_blocks(16, (16, 16), false, false, None)
            .is_none());
        // Interval 0: only the replay tail.
        let r = sw.reachable_blocks(16, (16, 16), false, false, Some((0, RULE)));
        assert_eq!(kept(r, 16, 256), vec![14]);
        // Hybrid (scheduler block 32, SWA blocks of 8, window 8), interval
        // 64, 128-token prompt: tails at 64 and 128, replay boundary 96.
        let sw = SlidingWindow::new(8);
        let r = sw.reachable_blocks(8, (32, 32), false, false, Some((64, RULE)));
        assert_eq!(kept(r, 16, 128), vec![7, 11, 15]);
        assert_eq!(
            kept(
                sw.reachable_blocks(8, (32, 32), false, false, None),
                16,
                128
            ),
            vec![3, 7, 11, 15]
        );
    }

    #[test]
    fn retention_with_eagle_keeps_the_block_past_each_boundary() {
        let sw = SlidingWindow::new(8);
        // need = 1 + 1 (EAGLE) ending one block past the boundary: blocks
        // 7..9 for the 64-token segment, 11..13 for the replay boundary 96
        // (prompt of 100 tokens), 15 (and 16) for the boundary 128.
        let r = sw.reachable_blocks(8, (32, 32), true, true, Some((64, RULE)));
        assert_eq!(kept(r, 16, 100), vec![7, 8, 11, 12, 15]);
        let r = sw.reachable_blocks(8, (32, 32), true, true, Some((0, RULE)));
        assert_eq!(kept(r, 16, 100), vec![11, 12]);
        // A window that needs a whole segment: everything is cached.
        assert!(SlidingWindow::new(40)
            .reachable_blocks(8, (32, 32), false, false, Some((32, RULE)))
            .is_none());
    }

    #[test]
    fn replay_tail_of_short_or_unknown_prompts_is_empty() {
        let r = SlidingWindow::new(8)
            .reachable_blocks(8, (32, 32), false, false, Some((0, RULE)))
            .expect("sparse");
        assert_eq!(tails(&r, None), vec![]);
        assert_eq!(tails(&r, Some(0)), vec![]);
        assert_eq!(tails(&r, Some(32)), vec![(0, 0)]);
        assert_eq!(tails(&r, Some(33)), vec![(3, 4)]);
    }

    #[test]
    fn replay_boundaries_rule_keeps_junctions_and_eagle_resend_tails() {
        const NEW: Retention = Retention::ReplayBoundaries;
        let sw = SlidingWindow::new(8);
        // Without EAGLE the replay boundary is the prompt tail's; the junction at 64
        // keeps the block before it.
        let r = sw.reachable_blocks(8, (32, 32), false, false, Some((0, NEW)));
        assert_eq!(kept_with(r, 16, 100, 0), vec![11]);
        assert_eq!(kept_with(r, 16, 100, 64), vec![7, 11]);
        // EAGLE (need 2, shift 1): one scheduler block below the resend
        // (96 - 32) and the extension (96 - 32) boundaries of a 100-token
        // prompt; a 96-token one has resend 64 - 32 and extension 96 - 32;
        // the junction 64 and the block below it (56 -> aligned 32).
        let r = sw.reachable_blocks(8, (32, 32), true, true, Some((0, NEW)));
        assert_eq!(kept_with(r, 16, 100, 0), vec![7, 8]);
        assert_eq!(kept_with(r, 16, 96, 0), vec![3, 4, 7, 8]);
        assert_eq!(kept_with(r, 16, 100, 64), vec![3, 4, 7, 8]);
    }
}

//! Sliding-window attention (also sliding-window MLA): the last `window`
//! tokens stay in the window; a hit is the right-most run of cached blocks
//! that covers the window; only blocks a hit can ever use are cached; freed
//! scratch blocks are reused first.

use super::HitSearch;
use crate::{cdiv, BlockId, NULL_BLOCK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlidingWindow {
    window: usize,
}

/// The blocks of a sliding-window group that can serve a hit (a hit is
/// scheduler-block aligned and needs the window's last blocks before the
/// boundary); the others are not cached. vLLM's `reachable_block_mask`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReachableBlocks {
    shift: usize,
    per_segment: usize,
    need: usize,
}

impl ReachableBlocks {
    #[inline]
    pub fn keeps(&self, i: usize) -> bool {
        i >= self.shift && (i - self.shift) % self.per_segment >= self.per_segment - self.need
    }
}

impl SlidingWindow {
    pub fn new(window: u32) -> Self {
        SlidingWindow {
            window: window as usize,
        }
    }

    /// All but the last `window - 1` computed tokens (and the new one).
    #[inline]
    pub fn skipped_tokens(&self, n: usize) -> usize {
        (n + 1).saturating_sub(self.window)
    }

    /// n + 1 - window < limit  <=>  n <= limit + window - 2.
    #[inline]
    pub fn max_computed_skipping_below(&self, limit: usize) -> usize {
        limit + self.window - 2
    }

    /// Blocks in a row a hit needs (one more to drop for EAGLE).
    fn contiguous_blocks_for_hit(&self, block_size: usize, use_eagle: bool) -> usize {
        cdiv(self.window - 1, block_size) + usize::from(use_eagle)
    }

    /// Which blocks a hit can ever use at an aligned prefix length; None: all.
    pub fn reachable_blocks(
        &self,
        block_size: u32,
        scheduler_block_size: u32,
        use_eagle: bool,
    ) -> Option<ReachableBlocks> {
        let need = self.contiguous_blocks_for_hit(block_size as usize, use_eagle);
        let per_segment = (scheduler_block_size / block_size) as usize;
        (need < per_segment).then_some(ReachableBlocks {
            shift: usize::from(use_eagle),
            per_segment,
            need,
        })
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

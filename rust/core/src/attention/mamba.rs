//! Mamba / linear-attention state: only the state after the last computed
//! token is needed; a hit is the last aligned cached state; speculative
//! tokens are counted as rejected. In align mode the running state moves to
//! a fresh block each time the request enters a new block, and the state
//! block of two steps ago is freed once it is no longer a copy source.

use super::{HitSearch, Sizing};
use crate::block_pool::{reserve_table, BlockPool};
use crate::spec::MambaMode;
use crate::{BlockId, NULL_BLOCK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mamba {
    mode: MambaMode,
    num_spec: usize,
}

/// Mamba "align" bookkeeping of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlignState {
    /// Index (in the table) of the state block allocated in the previous
    /// step: the source of this step's state copy. Freed two steps later.
    pub last_state_block_idx: Option<usize>,
    /// The request got blocks before (later rounds reuse speculative blocks).
    pub allocated: bool,
}

impl Mamba {
    pub fn new(mode: MambaMode, num_speculative_blocks: u32) -> Self {
        Mamba {
            mode,
            num_spec: num_speculative_blocks as usize,
        }
    }

    pub fn mode(&self) -> MambaMode {
        self.mode
    }

    pub fn num_spec(&self) -> usize {
        self.num_spec
    }

    /// Only the state after the last computed token is needed.
    #[inline]
    pub fn skipped_tokens(&self, n: usize) -> usize {
        n.saturating_sub(1)
    }

    /// n - 1 < limit  <=>  n <= limit (limit > 0).
    #[inline]
    pub fn max_computed_skipping_below(&self, limit: usize) -> usize {
        limit
    }

    /// One block per speculative token's state on top; align mode sizes by
    /// the main model's tokens (lookahead tokens would break the alignment).
    #[inline]
    pub fn sizing(&self) -> Sizing {
        Sizing {
            by_main_model: self.mode == MambaMode::Align,
            extra_blocks: self.num_spec,
        }
    }

    /// Align: the old state block at `idx` stays a copy source while the
    /// window's computed count (drafts removed) is at most this.
    #[inline]
    pub fn old_state_kept_until(idx: usize, block_size: usize) -> usize {
        (idx + 1) * block_size
    }

    /// Align: blocks a (re)allocation takes, `have` held or hit: one new
    /// state block once the request got blocks before (later rounds reuse
    /// the speculative blocks), all of them on its first. Negative when
    /// drafts shrank (vLLM sums it as is with other groups).
    #[inline]
    pub fn align_blocks_to_allocate(
        &self,
        block_size: usize,
        num_tokens_main_model: usize,
        have: usize,
        allocated: bool,
    ) -> i64 {
        let num_required = self
            .sizing()
            .required_blocks(block_size, 0, num_tokens_main_model);
        let num_new = num_required as i64 - have as i64;
        if num_new <= 0 {
            return num_new;
        }
        if allocated {
            1
        } else {
            1 + self.num_spec as i64
        }
    }

    /// Align: grows the table for `num_tokens_main_model` tokens. The
    /// running state moves to a fresh block; skipped positions hold the null
    /// block and the speculative blocks of the previous round move forward
    /// for reuse. A shrinking draft count (vLLM #39271) needs nothing new.
    /// Appends the ids handed out (new or moved) to `out`.
    /// `allocated_on_any_call` (0.29+): a call that needs no block marks
    /// the request allocated too.
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_align_blocks(
        &self,
        pool: &mut BlockPool,
        block_size: usize,
        blocks: &mut Vec<BlockId>,
        state: &mut Option<AlignState>,
        num_tokens_main_model: usize,
        allocated_on_any_call: bool,
        out: &mut Vec<BlockId>,
    ) {
        let num_spec = self.num_spec;
        let num_required = self
            .sizing()
            .required_blocks(block_size, 0, num_tokens_main_model);
        if num_required <= blocks.len() {
            if allocated_on_any_call {
                state.get_or_insert_default().allocated = true;
            }
            return;
        }
        let prev_len = blocks.len();
        let state = state.get_or_insert_default();
        if state.allocated {
            // The running state sits at the last (1 + num_spec)-th block.
            state.last_state_block_idx = prev_len.checked_sub(1 + num_spec);
        } else if prev_len > 0 {
            // A new request that hit the cache: its last block holds the hit state.
            state.last_state_block_idx = Some(prev_len - 1);
        }
        reserve_table(blocks, num_required - prev_len);
        let num_skipped = num_required - num_spec - 1;
        if prev_len < num_skipped {
            blocks.resize(num_skipped, NULL_BLOCK);
        }
        if state.allocated {
            for idx in prev_len.saturating_sub(num_spec)..prev_len {
                if idx >= num_skipped {
                    break;
                }
                let b = std::mem::replace(&mut blocks[idx], NULL_BLOCK);
                blocks.push(b);
            }
        }
        let num_new = num_required.saturating_sub(blocks.len());
        pool.get_new_blocks(num_new, blocks);
        state.allocated = true;
        out.extend_from_slice(&blocks[prev_len..]);
    }
}

/// Only the last aligned cached state matters: right to left, first hit.
pub(super) fn find_hit(s: &HitSearch<'_>, max_length: usize, out: &mut [Vec<BlockId>]) {
    let mut hit = Vec::with_capacity(s.groups.len());
    for i in (0..max_length / s.block_size).rev() {
        if !s.lookup(i, &mut hit) {
            continue;
        }
        if s.block_size != s.alignment_tokens && (i + 1) * s.block_size % s.alignment_tokens != 0 {
            continue;
        }
        for (o, &b) in out.iter_mut().zip(&hit) {
            o.resize(i, NULL_BLOCK);
            o.push(b);
        }
        break;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdiv;

    #[test]
    fn old_state_bound_matches_block_count() {
        // Kept while idx + 1 >= cdiv(total, bs), as vLLM frees it.
        for bs in [1, 4, 16] {
            for idx in 0..10 {
                for total in 0..200 {
                    assert_eq!(
                        total <= Mamba::old_state_kept_until(idx, bs),
                        idx + 1 >= cdiv(total, bs)
                    );
                }
            }
        }
    }
}

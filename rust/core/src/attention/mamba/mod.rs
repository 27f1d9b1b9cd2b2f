//! Mamba / linear-attention state: only the state after the last computed
//! token is needed; a hit is the last aligned cached state; speculative
//! tokens are counted as rejected. In align mode the running state moves to
//! a fresh block each time the request enters a new block, and the state
//! block of two steps ago is freed once it is no longer a copy source.

mod retention;

use super::{HitSearch, Sizing};
use crate::block_pool::{reserve_table, BlockPool};
use crate::spec::{MambaCheckpoints, MambaMode};
use crate::{cdiv, BlockId, NULL_BLOCK};

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
    /// vLLM's `_checkpoints`: the prefill checkpoint of the last count
    /// (position, table index), which caching keys at that position.
    pub checkpoint: Option<(usize, usize)>,
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
    /// the speculative blocks), all of them on its first, plus the
    /// checkpoint block a chunk reserves. Negative when drafts shrank (vLLM
    /// sums it as is with other groups).
    #[inline]
    pub fn align_blocks_to_allocate(
        &self,
        block_size: usize,
        num_tokens_main_model: usize,
        have: usize,
        allocated: bool,
        checkpoint: bool,
        partial: bool,
    ) -> i64 {
        let num_required = self
            .sizing()
            .required_blocks(block_size, 0, num_tokens_main_model);
        let mut num_new = num_required as i64 - have as i64;
        if partial {
            // The private copy of a partial hit's (or producer's) tail state.
            num_new = num_new.max(0) + 1;
        }
        if num_new <= 0 {
            return num_new;
        }
        let cap = 1
            + i64::from(partial)
            + i64::from(checkpoint)
            + if allocated { 0 } else { self.num_spec as i64 };
        num_new.min(cap)
    }

    /// Align: whether a chunk computing `query_start..query_end`
    /// reserves a checkpoint block (at index `cdiv(query_end, bs) - 2`) for
    /// the state the worker exports at the prompt's reusable boundary.
    /// `blocks`: the table before this call; `prefill_end` 0 lets every
    /// chunk checkpoint.
    #[allow(clippy::too_many_arguments)]
    pub fn needs_checkpoint(
        &self,
        c: &MambaCheckpoints,
        block_size: usize,
        alignment_tokens: usize,
        blocks: &[BlockId],
        allocated: bool,
        query_start: usize,
        query_end: usize,
        prefill_end: usize,
    ) -> bool {
        if c.alignment == 0 {
            // The spec exports no checkpoints (caching rules only).
            return false;
        }
        let position = checkpoint_position(c, query_end, alignment_tokens);
        let hbs = c.hash_block_size as usize;
        let Some(idx) = cdiv(query_end, block_size).checked_sub(2) else {
            return false;
        };
        // The state before the chunk lives in column (query_start - 1) / bs.
        let exports_later_column = query_start == 0 || idx > (query_start - 1) / block_size;
        query_end >= prefill_end
            && query_start % hbs == 0
            && exports_later_column
            && query_start + hbs <= position
            && query_start < position
            && position < query_end
            && (position - query_start) % c.alignment as usize == 0
            && (idx >= blocks.len()
                || blocks[idx] == NULL_BLOCK
                || (allocated && idx + self.num_spec >= blocks.len()))
    }

    /// Align: grows the table for `num_tokens_main_model` tokens. The
    /// running state moves to a fresh block; skipped positions hold the null
    /// block and the speculative blocks of the previous round move forward
    /// for reuse. A shrinking draft count (vLLM #39271) needs nothing new.
    /// Appends the ids handed out (new or moved) to `out`.
    /// `allocated_on_any_call`: a call that needs no block marks
    /// the request allocated too. `checkpoint` (`needs_checkpoint`):
    /// the block before the running state is a real one, not null, and a
    /// speculative block there stays for it. `partial` (partial-block-hits): one more
    /// block for a copy-on-write, returned with whether the request had
    /// been allocated before.
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_align_blocks(
        &self,
        pool: &mut BlockPool,
        block_size: usize,
        blocks: &mut Vec<BlockId>,
        state: &mut Option<AlignState>,
        num_tokens_main_model: usize,
        allocated_on_any_call: bool,
        checkpoint: bool,
        partial: bool,
        out: &mut Vec<BlockId>,
    ) -> Option<(BlockId, bool)> {
        let num_spec = self.num_spec;
        let num_required = self
            .sizing()
            .required_blocks(block_size, 0, num_tokens_main_model);
        if num_required <= blocks.len() && !checkpoint && !partial {
            if allocated_on_any_call {
                state.get_or_insert_default().allocated = true;
            }
            return None;
        }
        let prev_len = blocks.len();
        let state = state.get_or_insert_default();
        let was_allocated = state.allocated;
        if state.allocated {
            // The running state sits at the last (1 + num_spec)-th block.
            state.last_state_block_idx = prev_len.checked_sub(1 + num_spec);
        } else if prev_len > 0 {
            // A new request that hit the cache: its last block holds the hit state.
            state.last_state_block_idx = Some(prev_len - 1);
        }
        reserve_table(blocks, num_required.saturating_sub(prev_len));
        let num_skipped = num_required - num_spec - 1;
        // The checkpoint block sits just below the running state.
        let null_end = num_skipped - usize::from(checkpoint);
        if prev_len < num_skipped && prev_len < null_end {
            blocks.resize(null_end, NULL_BLOCK);
        }
        if state.allocated {
            for idx in prev_len.saturating_sub(num_spec)..prev_len {
                if idx >= null_end {
                    break;
                }
                let b = std::mem::replace(&mut blocks[idx], NULL_BLOCK);
                blocks.push(b);
            }
        }
        let num_new = num_required.saturating_sub(blocks.len()) + usize::from(partial);
        let new_start = blocks.len();
        pool.get_new_blocks(num_new, blocks);
        state.allocated = true;
        // A partial hit's copy-on-write block is the first new one; the
        // caller places it (`copy_on_write.rs`).
        let cow = partial.then(|| (blocks.remove(new_start), was_allocated));
        out.extend_from_slice(&blocks[prev_len..]);
        cow
    }
}

/// vLLM's `get_mamba_prefill_checkpoint_position(num_tokens,
/// alignment_tokens, drop_eagle_block, num_hash_lookahead_tokens)`: the last
/// boundary that leaves tokens for the logits (and EAGLE's dropped block).
pub(crate) fn checkpoint_position(
    c: &MambaCheckpoints,
    num_tokens: usize,
    alignment_tokens: usize,
) -> usize {
    let proof_limit = if c.drop_eagle_block {
        num_tokens
    } else {
        num_tokens.saturating_sub((c.num_hash_lookahead_tokens as usize).max(1))
    };
    let position = proof_limit / alignment_tokens * alignment_tokens;
    if c.drop_eagle_block {
        position.saturating_sub(alignment_tokens)
    } else {
        position
    }
}

/// Only the last aligned cached state matters: right to left, first hit.
/// With partial hash hits (`HitSearch::fine_grained`) every hash boundary
/// is a candidate state: the hit may end inside its block. Returns the
/// hit's tokens.
pub(super) fn find_hit(s: &HitSearch<'_>, max_length: usize, out: &mut [Vec<BlockId>]) -> usize {
    let mut hit = Vec::with_capacity(s.groups.len());
    if s.fine_grained() {
        let unit = s.alignment_tokens;
        let scale = s.block_size / unit;
        let raw = s.hashes.raw();
        for fine in (0..(max_length / unit).min(raw.len())).rev() {
            if s.pool.get_cached_block(raw.get(fine), s.groups, &mut hit) {
                for (o, &b) in out.iter_mut().zip(&hit) {
                    o.resize(fine / scale, NULL_BLOCK);
                    o.push(b);
                }
                return (fine + 1) * unit;
            }
        }
        return 0;
    }
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
        return (i + 1) * s.block_size;
    }
    0
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

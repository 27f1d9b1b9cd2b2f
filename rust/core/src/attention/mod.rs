//! One module per attention type; each owns its type's rules. `Attention`
//! is the closed set of types: its arms only call into the modules.
//!
//! A type is defined by a few primitive rules, and everything else the
//! group manager does is derived from them, once, for every type:
//! - `skipped_tokens(n)`: tokens before this count are outside the window
//!   (and its exact inverse, `max_computed_skipping_below`, which the decode
//!   horizon reads: a unit test checks the pair on every small input);
//! - `draft_tokens()`: tokens the window ignores at the end (Mamba counts
//!   speculative tokens as rejected);
//! - `sizing()`: what the block count is sized by, and the extra blocks;
//! - the hit search, the cache mask and the few flags below.
//!
//! The general allocation path, the no-op decode check, the compact decode
//! and the decode horizon (`group_manager::decode`) all read these; none
//! restates a type's rule.

mod chunked_local;
mod circular_buffer;
mod cross;
mod full;
pub(crate) mod hit;
pub(crate) mod mamba;
mod rswa;
pub(crate) mod sliding_window;

use crate::profile::Retention;
use crate::spec::{GroupSpec, MambaMode, SpecKind};
use crate::BlockId;

pub(crate) use chunked_local::ChunkedLocal;
pub(crate) use hit::HitSearch;
pub(crate) use mamba::Mamba;
pub(crate) use rswa::Rswa;
pub(crate) use sliding_window::{ReachableBlocks, ReplayTails, RetentionMarks, SlidingWindow};

/// What a group's block count is sized by: `cdiv(tokens, block_size) +
/// extra_blocks`, where `tokens` counts the tokens that need a slot
/// (lookahead included) or, `by_main_model`, the computed + new tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizing {
    pub by_main_model: bool,
    pub extra_blocks: usize,
}

impl Sizing {
    pub const BY_SLOTS: Sizing = Sizing {
        by_main_model: false,
        extra_blocks: 0,
    };

    /// Blocks required for `need_slot` / `main_model` tokens.
    #[inline]
    pub fn required_blocks(&self, block_size: usize, need_slot: usize, main_model: usize) -> usize {
        let tokens = if self.by_main_model {
            main_model
        } else {
            need_slot
        };
        crate::cdiv(tokens, block_size) + self.extra_blocks
    }

    /// The most tokens (of the kind sized by) `len` blocks cover; None:
    /// `len` covers no count (fewer blocks than the extra ones).
    #[inline]
    pub fn max_tokens_within(&self, block_size: usize, len: usize) -> Option<usize> {
        Some(len.checked_sub(self.extra_blocks)? * block_size)
    }
}

/// A group's attention type with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attention {
    Full,
    SlidingWindow(SlidingWindow),
    ChunkedLocal(ChunkedLocal),
    Mamba(Mamba),
    Cross,
    Rswa(Rswa),
    CircularBuffer,
}

impl Attention {
    pub fn from_spec(kind: &SpecKind) -> Self {
        match *kind {
            SpecKind::FullAttention => Attention::Full,
            SpecKind::SlidingWindow { window } => {
                Attention::SlidingWindow(SlidingWindow::new(window))
            }
            SpecKind::ChunkedLocal { chunk } => Attention::ChunkedLocal(ChunkedLocal::new(chunk)),
            SpecKind::Mamba {
                mode,
                num_speculative_blocks,
            } => Attention::Mamba(Mamba::new(mode, num_speculative_blocks)),
            SpecKind::CrossAttention => Attention::Cross,
            SpecKind::Rswa { window } => Attention::Rswa(Rswa::new(window)),
            SpecKind::CircularBuffer => Attention::CircularBuffer,
        }
    }

    /// The group's type with the spec's own settings beside its kind (a
    /// sliding window's `extra_retained_tokens`).
    pub fn of(spec: &GroupSpec) -> Self {
        match Self::from_spec(&spec.kind) {
            Attention::SlidingWindow(t) => {
                Attention::SlidingWindow(t.retaining(spec.extra_retained_tokens))
            }
            t => t,
        }
    }

    /// Tokens before this count (of `n` computed) are outside the window.
    #[inline]
    pub fn skipped_tokens(&self, n: usize) -> usize {
        match self {
            // R-SWA frees a gap after the prompt instead (`freed_blocks`).
            Attention::Full | Attention::Rswa(_) | Attention::CircularBuffer => {
                full::skipped_tokens(n)
            }
            Attention::Cross => cross::skipped_tokens(n),
            Attention::SlidingWindow(t) => t.skipped_tokens(n),
            Attention::ChunkedLocal(t) => t.skipped_tokens(n),
            Attention::Mamba(t) => t.skipped_tokens(n),
        }
    }

    /// The most computed tokens for which `skipped_tokens(n) < limit`
    /// (`usize::MAX`: all); the inverse the decode horizon reads.
    #[inline]
    pub fn max_computed_skipping_below(&self, limit: usize) -> usize {
        match self {
            Attention::Full | Attention::Cross | Attention::Rswa(_) | Attention::CircularBuffer => {
                usize::MAX
            }
            Attention::SlidingWindow(t) => t.max_computed_skipping_below(limit),
            Attention::ChunkedLocal(t) => t.max_computed_skipping_below(limit),
            Attention::Mamba(t) => t.max_computed_skipping_below(limit),
        }
    }

    /// Whether any block ever leaves the window (`skipped_tokens` is not
    /// always 0): the decode paths skip the window for the others.
    #[inline]
    pub fn has_window(&self) -> bool {
        !matches!(
            self,
            Attention::Full | Attention::Cross | Attention::Rswa(_) | Attention::CircularBuffer
        )
    }

    /// The table blocks `[first, last)` a window free at `n` processed
    /// tokens drops (the caller caps `last` at the table): those before
    /// the window, or, R-SWA given the prompt length, the gap after it.
    #[inline]
    pub fn freed_blocks(
        &self,
        n: usize,
        num_prompt_tokens: Option<usize>,
        bs: usize,
    ) -> (usize, usize) {
        match (self, num_prompt_tokens) {
            (Attention::Rswa(t), Some(p)) => t.gap_blocks(n, p, bs),
            _ => (0, self.skipped_tokens(n) / bs),
        }
    }

    /// Window frees may drop blocks (a window, or R-SWA's gap).
    #[inline]
    pub fn frees_blocks(&self) -> bool {
        self.has_window() || matches!(self, Attention::Rswa(_))
    }

    /// A plain decode can be judged and sized from the table alone (R-SWA's
    /// gap frees need the prompt length: its decodes take the general path).
    #[inline]
    pub fn decodes_compactly(&self) -> bool {
        !matches!(self, Attention::Rswa(_))
    }

    /// Blocks a request holds whatever its token counts (a circular
    /// buffer's ring); None: sized by `sizing`.
    #[inline]
    pub fn fixed_blocks(&self) -> Option<usize> {
        match self {
            Attention::CircularBuffer => Some(circular_buffer::RING_BLOCKS),
            _ => None,
        }
    }

    /// Tokens at the end of the computed count the window ignores.
    #[inline]
    pub fn draft_tokens(&self) -> usize {
        match self {
            Attention::Mamba(t) => t.num_spec(),
            _ => 0,
        }
    }

    #[inline]
    pub fn sizing(&self) -> Sizing {
        match self {
            Attention::Mamba(t) => t.sizing(),
            _ => Sizing::BY_SLOTS,
        }
    }

    /// Mamba align: the speculative block count.
    #[inline]
    pub fn align(&self) -> Option<usize> {
        match self {
            Attention::Mamba(t) if t.mode() == MambaMode::Align => Some(t.num_spec()),
            _ => None,
        }
    }

    pub fn mamba(&self) -> Option<&Mamba> {
        match self {
            Attention::Mamba(t) => Some(t),
            _ => None,
        }
    }

    /// The group takes part in prefix hits and plain decodes (cross
    /// attention holds one static allocation of encoder states).
    #[inline]
    pub fn is_per_token(&self) -> bool {
        !matches!(self, Attention::Cross)
    }

    /// Freed blocks not cached go to the front of the free queue (reused
    /// first), cached ones behind (sliding window only, as vLLM).
    #[inline]
    pub fn frees_scratch_first(&self) -> bool {
        matches!(self, Attention::SlidingWindow(_))
    }

    /// Requests can share leading blocks (full attention only: null-padded
    /// tables and per-request states share nothing usable).
    #[inline]
    pub fn shares_prefix(&self) -> bool {
        matches!(self, Attention::Full)
    }

    /// Blocks cached this step serve hits only from the next step (Mamba).
    #[inline]
    pub fn hits_wait_a_step(&self) -> bool {
        matches!(self, Attention::Mamba(_))
    }

    /// Which blocks caching keeps (None: all), for blocks of `bs` tokens,
    /// scheduler blocks of `sbs` = (scheduler block, hit alignment) and the retention interval, if any, with
    /// the profile's rule (a type the rule does not sparsify ignores it).
    /// `any_eagle`: some group drops an EAGLE block (where `ReplayBoundaries`
    /// puts the replay boundaries).
    pub fn reachable_blocks(
        &self,
        bs: u32,
        sbs: (u32, u32),
        eagle: bool,
        any_eagle: bool,
        retention: Option<(usize, Retention)>,
    ) -> Option<ReachableBlocks> {
        let retention = retention.filter(|&(_, rule)| self.retains_sparsely(rule));
        match self {
            Attention::SlidingWindow(t) => t.reachable_blocks(bs, sbs, eagle, any_eagle, retention),
            Attention::Mamba(t) => t.reachable_blocks(bs, sbs, eagle, any_eagle, retention),
            _ => None,
        }
    }

    /// Whether a retention interval under `rule` sparsifies this type
    /// (`SlidingWindowPromptTail`: sliding windows only; `ReplayBoundaries`
    /// Mamba states too).
    pub fn retains_sparsely(&self, rule: Retention) -> bool {
        match rule {
            Retention::SlidingWindowPromptTail => matches!(self, Attention::SlidingWindow(_)),
            Retention::ReplayBoundaries => {
                matches!(self, Attention::SlidingWindow(_) | Attention::Mamba(_))
            }
        }
    }

    /// The type's cache-hit search into `out` (one list per group); returns
    /// the hit's tokens (a multiple of the
    /// block size except for a fine-grained full-attention hit).
    pub fn find_hit(
        &self,
        search: &HitSearch<'_>,
        max_length: usize,
        drop_eagle: bool,
        out: &mut [Vec<BlockId>],
    ) -> usize {
        match self {
            // R-SWA's hits are full attention's (vLLM: a FullAttentionManager).
            Attention::Full | Attention::Rswa(_) => {
                return full::find_hit(search, max_length, drop_eagle, out)
            }
            Attention::SlidingWindow(t) => t.find_hit(search, max_length, drop_eagle, out),
            Attention::ChunkedLocal(t) => t.find_hit(search, max_length, out),
            Attention::Mamba(_) => return mamba::find_hit(search, max_length, out),
            Attention::Cross => cross::find_hit(out),
            Attention::CircularBuffer => circular_buffer::find_hit(out),
        }
        out.first().map_or(0, |o| o.len() * search.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `max_computed_skipping_below` is the exact inverse of
    /// `skipped_tokens` for every type (the decode horizon relies on it).
    #[test]
    fn window_inverse_is_exact() {
        let types = [
            Attention::Full,
            Attention::Cross,
            Attention::SlidingWindow(SlidingWindow::new(1)),
            Attention::SlidingWindow(SlidingWindow::new(5)),
            Attention::SlidingWindow(SlidingWindow::new(32)),
            Attention::SlidingWindow(SlidingWindow::new(5).retaining(3)),
            Attention::SlidingWindow(SlidingWindow::new(1).retaining(7)),
            Attention::Rswa(Rswa::new(8)),
            Attention::CircularBuffer,
            Attention::ChunkedLocal(ChunkedLocal::new(1)),
            Attention::ChunkedLocal(ChunkedLocal::new(7)),
            Attention::ChunkedLocal(ChunkedLocal::new(16)),
            Attention::Mamba(Mamba::new(MambaMode::All, 0)),
            Attention::Mamba(Mamba::new(MambaMode::Align, 3)),
        ];
        for t in types {
            for limit in 1..200 {
                let max = t.max_computed_skipping_below(limit);
                for n in 0..400 {
                    assert_eq!(
                        t.skipped_tokens(n) < limit,
                        n <= max,
                        "{t:?}: n={n} limit={limit} max={max}"
                    );
                }
            }
        }
    }

    #[test]
    fn sizing_inverse_is_exact() {
        for extra in 0..4 {
            for by_main_model in [false, true] {
                let s = Sizing {
                    by_main_model,
                    extra_blocks: extra,
                };
                for bs in [1, 4, 16] {
                    for len in 0..20 {
                        for tokens in 1..400 {
                            let fits = s.required_blocks(bs, tokens, tokens) <= len;
                            let max = s.max_tokens_within(bs, len);
                            assert_eq!(fits, max.is_some_and(|m| tokens <= m));
                        }
                    }
                }
            }
        }
    }
}

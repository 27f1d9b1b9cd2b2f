//! Full attention (and the subclasses vLLM manages the same way: MLA,
//! TurboQuant full attention, attention sinks, the hidden-state cache):
//! every token stays in the window; a hit is the longest chain of cached
//! blocks from the start; requests share leading blocks.

use super::HitSearch;
use crate::{cdiv, BlockId};

pub(super) fn skipped_tokens(_n: usize) -> usize {
    0
}

/// Left to right; hashes form a chain, so the first miss ends the hit.
/// When hits align on hash blocks smaller than a block (partial
/// hash hits, `HitSearch::fine_grained`), the hit then extends into the
/// next block at the longest of its inner hash boundaries cached there (a
/// partial-block entry). Returns the hit's tokens.
pub(super) fn find_hit(
    s: &HitSearch<'_>,
    max_length: usize,
    drop_eagle: bool,
    out: &mut [Vec<BlockId>],
) -> usize {
    let mut hit = Vec::with_capacity(s.groups.len());
    for i in 0..max_length / s.block_size {
        if !s.lookup(i, &mut hit) {
            break;
        }
        for (o, &b) in out.iter_mut().zip(&hit) {
            o.push(b);
        }
    }
    if !s.fine_grained() {
        if drop_eagle && !out[0].is_empty() {
            HitSearch::pop_all(out);
        }
        s.pop_to_alignment(out);
        return out[0].len() * s.block_size;
    }
    let unit = s.alignment_tokens;
    let raw = s.hashes.raw();
    let mut len = out[0].len() * s.block_size;
    let scale = s.block_size / unit;
    let first = out[0].len() * scale;
    let last = (first + scale - 1).min(max_length / unit).min(raw.len());
    for fine in (first..last).rev() {
        if s.pool.get_cached_block(raw.get(fine), s.groups, &mut hit) {
            for (o, &b) in out.iter_mut().zip(&hit) {
                o.push(b);
            }
            len = (fine + 1) * unit;
            break;
        }
    }
    // EAGLE drops one hash unit: the tail block still covers the rest.
    if drop_eagle && len > 0 {
        len -= unit.min(s.block_size);
    }
    len -= len % unit;
    let keep = cdiv(len, s.block_size);
    out.iter_mut().for_each(|o| o.truncate(keep));
    len
}

#[cfg(test)]
#[path = "full_tests.rs"]
mod tests;

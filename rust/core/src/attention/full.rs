//! Full attention (and the subclasses vLLM manages the same way: MLA,
//! TurboQuant full attention, attention sinks, the hidden-state cache):
//! every token stays in the window; a hit is the longest chain of cached
//! blocks from the start; requests share leading blocks.

use super::HitSearch;
use crate::BlockId;

pub(super) fn skipped_tokens(_n: usize) -> usize {
    0
}

/// Left to right; hashes form a chain, so the first miss ends the hit.
pub(super) fn find_hit(
    s: &HitSearch<'_>,
    max_length: usize,
    drop_eagle: bool,
    out: &mut [Vec<BlockId>],
) {
    let mut hit = Vec::with_capacity(s.groups.len());
    for i in 0..max_length / s.block_size {
        if !s.lookup(i, &mut hit) {
            break;
        }
        for (o, &b) in out.iter_mut().zip(&hit) {
            o.push(b);
        }
    }
    if drop_eagle && !out[0].is_empty() {
        HitSearch::pop_all(out);
    }
    s.pop_to_alignment(out);
}

//! Chunked local attention: tokens attend within fixed chunks; blocks of
//! earlier chunks leave the window; a hit counts the earlier chunks as
//! computed (null blocks) and searches inside the current one.

use super::HitSearch;
use crate::{cdiv, BlockId, NULL_BLOCK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkedLocal {
    chunk: usize,
}

impl ChunkedLocal {
    pub fn new(chunk: u32) -> Self {
        ChunkedLocal {
            chunk: chunk as usize,
        }
    }

    /// Everything before the current chunk.
    #[inline]
    pub fn skipped_tokens(&self, n: usize) -> usize {
        n / self.chunk * self.chunk
    }

    /// n / chunk * chunk < limit  <=>  n < ceil(limit / chunk) * chunk.
    #[inline]
    pub fn max_computed_skipping_below(&self, limit: usize) -> usize {
        cdiv(limit, self.chunk) * self.chunk - 1
    }

    /// Blocks before the current chunk count as computed (null); inside it,
    /// left to right.
    pub fn find_hit(&self, s: &HitSearch<'_>, max_length: usize, out: &mut [Vec<BlockId>]) {
        let max_blocks = max_length / s.block_size;
        let start_block = max_length / self.chunk * self.chunk / s.block_size;
        for o in out.iter_mut() {
            o.resize(start_block, NULL_BLOCK);
        }
        let mut hit = Vec::with_capacity(s.groups.len());
        for i in start_block..max_blocks {
            if !s.lookup(i, &mut hit) {
                break;
            }
            for (o, &b) in out.iter_mut().zip(&hit) {
                o.push(b);
            }
        }
    }
}

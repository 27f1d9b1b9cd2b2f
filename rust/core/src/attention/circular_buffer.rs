//! Circular buffers (vLLM's `CircularBufferManager`): a request holds
//! one ring block for its whole life, claimed on its first allocation (or by
//! its external tokens); nothing is skipped, hit or cached.

use crate::BlockId;

/// Blocks a request holds, whatever its token counts.
pub(crate) const RING_BLOCKS: usize = 1;

/// A ring holds scratch state: never a hit.
pub(super) fn find_hit(_out: &mut [Vec<BlockId>]) {}

//! One request's state in one group, kept in one record so a decode reads
//! one place, and the dense per-slot table of those records.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::attention::mamba::AlignState;
use crate::{BlockId, ReqSlot, NULL_BLOCK};

/// vLLM's per-request dict entries of the group, each present exactly
/// where vLLM's dict has the request.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupReq {
    /// `req_to_blocks` has an entry (a defaultdict: entries count for
    /// common prefixes); `blocks` is empty without one.
    pub has_blocks: bool,
    pub blocks: Vec<BlockId>,
    /// `num_cached_block`: present while the request runs.
    pub num_cached: Option<usize>,
    /// Mamba align: `last_state_block_idx` / `_allocated_block_reqs`.
    pub align: Option<AlignState>,
    /// Mamba align: the block ids as the worker holds them (append-only:
    /// the table as first handed out, then every returned new block). The
    /// worker copies states out of ids the manager has since nulled or moved.
    pub worker_view: Option<Vec<BlockId>>,
    /// Blocks before this index are all null. Ids are only ever nulled or
    /// appended while the request holds its table, so the first real block
    /// only moves right: each search for it starts where the last ended.
    pub null_prefix: Hint,
    /// The decode horizon's keying bound, `(n, fewest tokens caching n)`,
    /// for the last `n` asked (a request's `n` is fixed by its prompt): the
    /// bisection that finds it runs once per request, not per allocation.
    pub keying_bound: (Hint, Hint),
}

/// A search hint kept up to date through `&self` (a relaxed atomic: plain
/// loads and stores; the manager is used under Python's GIL anyway).
#[derive(Debug, Default)]
pub(crate) struct Hint(AtomicU32);

impl Clone for Hint {
    fn clone(&self) -> Self {
        Hint(AtomicU32::new(self.get()))
    }
}

impl Hint {
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, v: u32) {
        self.0.store(v, Ordering::Relaxed)
    }
}

impl GroupReq {
    /// `first(n)` for `n > 0`, remembered for the last `n` (`first` is a
    /// function of `n` alone for a given group; `usize::MAX` is kept).
    pub fn keying_bound(&self, n: usize, first: impl FnOnce(usize) -> usize) -> usize {
        let (key, value) = &self.keying_bound;
        let Ok(n32) = u32::try_from(n) else {
            return first(n);
        };
        if n32 != 0 && key.get() == n32 {
            let v = value.get();
            return if v == u32::MAX {
                usize::MAX
            } else {
                v as usize
            };
        }
        let v = first(n);
        let stored = match v {
            usize::MAX => Some(u32::MAX),
            v => u32::try_from(v).ok().filter(|&x| x != u32::MAX),
        };
        if let Some(x) = stored {
            key.set(n32);
            value.set(x);
        }
        v
    }

    pub fn holds(&self) -> bool {
        self.has_blocks || self.num_cached.is_some() || self.align.is_some()
    }

    /// Index of the table's first real (non-null) block.
    pub fn first_real(&self) -> Option<usize> {
        let from = (self.null_prefix.get() as usize).min(self.blocks.len());
        let found = first_non_null(&self.blocks[from..]).map(|i| from + i);
        self.null_prefix
            .set(found.unwrap_or(self.blocks.len()) as u32);
        debug_assert_eq!(found, first_non_null(&self.blocks));
        found
    }

    /// The Mamba align old state block's index, if it is still live.
    pub fn live_old_state(&self) -> Option<usize> {
        let idx = self.align?.last_state_block_idx?;
        self.blocks
            .get(idx)
            .is_some_and(|&b| b != NULL_BLOCK)
            .then_some(idx)
    }
}

/// The records of every slot (absent slots hold the default) and the count
/// of those with a `req_to_blocks` entry (vLLM's `len(req_to_blocks)`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Records {
    pub reqs: Vec<GroupReq>,
    pub num_block_entries: usize,
}

impl Records {
    pub fn get(&self, slot: ReqSlot) -> Option<&GroupReq> {
        self.reqs.get(slot as usize)
    }

    /// The request's record, its `req_to_blocks` entry created if absent
    /// (vLLM's defaultdict access).
    pub fn with_table(&mut self, slot: ReqSlot) -> &mut GroupReq {
        let i = slot as usize;
        if i >= self.reqs.len() {
            self.reqs.resize_with(i + 1, GroupReq::default);
        }
        let r = &mut self.reqs[i];
        if !r.has_blocks {
            r.has_blocks = true;
            self.num_block_entries += 1;
        }
        r
    }
}

/// Index of the first non-null block. Window tables are long null runs
/// followed by a few live blocks, so the scan goes eight ids at a time
/// (an OR over a fixed chunk the compiler vectorizes).
fn first_non_null(blocks: &[BlockId]) -> Option<usize> {
    let mut chunks = blocks.chunks_exact(8);
    let mut base = 0;
    for c in chunks.by_ref() {
        if c.iter().fold(0, |acc, &b| acc | b) != NULL_BLOCK {
            break;
        }
        base += 8;
    }
    blocks[base..]
        .iter()
        .position(|&b| b != NULL_BLOCK)
        .map(|i| base + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_real_resumes_where_the_last_search_ended() {
        let mut r = GroupReq {
            has_blocks: true,
            blocks: vec![0, 0, 0, 5, 6],
            ..Default::default()
        };
        assert_eq!(r.first_real(), Some(3));
        assert_eq!(r.null_prefix.get(), 3);
        r.blocks[3] = NULL_BLOCK; // left the window
        assert_eq!(r.first_real(), Some(4));
        r.blocks[4] = NULL_BLOCK;
        assert_eq!(r.first_real(), None);
        assert_eq!(r.null_prefix.get(), 5);
        r.blocks.push(9);
        assert_eq!(r.first_real(), Some(5));
    }

    /// The bound is computed once per `n`, a new `n` replaces it, and
    /// values that do not fit the memo are computed every time.
    #[test]
    fn keying_bound_is_remembered_per_n() {
        let r = GroupReq::default();
        let calls = std::cell::Cell::new(0);
        let first = |n: usize| {
            calls.set(calls.get() + 1);
            n + 15 - (n + 15) % 16
        };
        assert_eq!(r.keying_bound(33, first), 48);
        assert_eq!(r.keying_bound(33, first), 48);
        assert_eq!(calls.get(), 1);
        assert_eq!(r.keying_bound(65, first), 80);
        assert_eq!(r.keying_bound(33, first), 48);
        assert_eq!(calls.get(), 3);
        // "No count caches n" is kept as such.
        assert_eq!(r.keying_bound(7, |_| usize::MAX), usize::MAX);
        assert_eq!(r.keying_bound(7, |_| unreachable!()), usize::MAX);
        // Past u32: no memo, the rule answers each time.
        let big = u32::MAX as usize + 1;
        assert_eq!(r.keying_bound(big, |n| n + 1), big + 1);
        assert_eq!(
            r.keying_bound(9, |n| n + (u32::MAX as usize)),
            9 + u32::MAX as usize
        );
        assert_eq!(r.keying_bound(9, |n| n), 9);
    }

    #[test]
    fn first_non_null_finds_the_first_live_block() {
        assert_eq!(first_non_null(&[]), None);
        assert_eq!(first_non_null(&[0; 20]), None);
        for at in [0, 3, 7, 8, 15, 16, 19] {
            let mut t = vec![0; 20];
            t[at] = 5;
            t[19] = 9;
            assert_eq!(first_non_null(&t), Some(at), "live block at {at}");
        }
    }
}

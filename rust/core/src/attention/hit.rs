//! What every type's cache-hit search reads: the pool's lookup over the
//! request's hashes for a set of groups with one spec, and the alignment
//! to the scheduler's block size.

use crate::block_pool::BlockPool;
use crate::hashes::ScaledHashes;
use crate::BlockId;

pub(crate) struct HitSearch<'a> {
    pub pool: &'a BlockPool,
    pub hashes: ScaledHashes<'a>,
    pub groups: &'a [u32],
    pub block_size: usize,
    pub alignment_tokens: usize,
}

impl HitSearch<'_> {
    /// Block `i` is cached in every group; their blocks go to `hit`.
    pub fn lookup(&self, i: usize, hit: &mut Vec<BlockId>) -> bool {
        i < self.hashes.len()
            && self
                .pool
                .get_cached_block(&self.hashes.get(i), self.groups, hit)
    }

    /// Hits land on hash-block boundaries inside blocks (partial
    /// hash hits: the coordinator aligns hits to the hash block size).
    pub fn fine_grained(&self) -> bool {
        let unit = self.alignment_tokens;
        self.pool.partial_entries()
            && unit == self.pool.hash_block_size() as usize
            && unit < self.block_size
            && self.block_size % unit == 0
    }

    pub fn pop_all(out: &mut [Vec<BlockId>]) {
        out.iter_mut().for_each(|o| {
            o.pop();
        });
    }

    pub fn pop_to_alignment(&self, out: &mut [Vec<BlockId>]) {
        while self.block_size != self.alignment_tokens
            && out[0].len() * self.block_size % self.alignment_tokens != 0
        {
            Self::pop_all(out);
        }
    }
}

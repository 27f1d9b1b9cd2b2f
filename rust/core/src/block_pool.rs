//! The block pool: ref counts, cached-block hashes, the free queue and the
//! prefix-cache map, with vLLM's `BlockPool` semantics; the
//! extra keys per block (partial-block entries) are in `block_pool_keys.rs`.

use crate::error::{invalid, CoreResult};
use crate::events::{BlockMetric, PoolEvent};
use crate::free_queue::FreeQueue;
use smallvec::SmallVec;

use crate::prefix_map::{PrefixMap, NO_ENTRY};
use crate::BlockId;

#[path = "block_pool_keys.rs"]
mod keys;
pub(crate) use keys::PartialEntry;
mod rekey;
mod retain;

pub const NULL_BLOCK: BlockId = 0;

/// Spare room a block table gets when it must grow (see `get_new_blocks`).
const TABLE_HEADROOM: usize = 8;

/// What the pool keeps per block.
#[derive(Debug, Clone, Copy)]
struct BlockMeta {
    // Signed: vLLM does not maintain the null block's count, which may dip below 0.
    ref_cnt: i32,
    // Prefix-map entry (the interned hash) of a cached block, or NO_ENTRY.
    entry: u32,
    group: u32,
    // Prefix tokens the primary hash covers (vLLM's `block_hash_num_tokens`):
    // a full block's end, or a partial entry's boundary; 0 without a hash.
    num_tokens: u32,
}

impl BlockMeta {
    const FREE: BlockMeta = BlockMeta {
        ref_cnt: 0,
        entry: NO_ENTRY,
        group: 0,
        num_tokens: 0,
    };
}

#[derive(Debug, Clone)]
pub struct BlockPool {
    num_blocks: u32,
    // Ref count, prefix-map entry and group of each block side by side:
    // allocating, freeing and evicting a block touch one cache line.
    meta: Vec<BlockMeta>,
    queue: FreeQueue,
    map: PrefixMap,
    // Partial-block entries: a cached block's keys beyond its primary hash,
    // (entry, group) in the order added (vLLM's
    // `cached_block_hashes_by_block`); empty with one hash per block.
    extra_keys: std::collections::HashMap<BlockId, SmallVec<[(u32, u32); 2]>>,
    enable_caching: bool,
    enable_events: bool,
    hash_block_size: u32,
    events: Vec<PoolEvent>,
    /// The null block's count moves with touches and frees
    /// (`null_block_ref_counted`); else both skip the null block.
    null_ref_counted: bool,
    /// Partial-block entries are on (`profile.partial_block_entries`).
    partial_entries: bool,
    // vLLM's metrics-collector calls, in order; only when a collector is set.
    record_metrics: bool,
    metrics: Vec<BlockMetric>,
}

/// Room for `n` more ids in a block table (or a list of ids handed out).
/// A table grows a block at a time while its request decodes: room for a
/// few more saves a reallocation (and malloc's code) on most of the decodes
/// that need a block.
pub fn reserve_table(table: &mut Vec<BlockId>, n: usize) {
    if table.capacity() - table.len() < n {
        table.reserve(n + TABLE_HEADROOM);
    }
}

impl BlockPool {
    pub fn new(
        num_blocks: u32,
        enable_caching: bool,
        hash_block_size: u32,
        enable_events: bool,
        null_ref_counted: bool,
    ) -> CoreResult<Self> {
        if num_blocks == 0 {
            return invalid("num_blocks must be > 0");
        }
        if hash_block_size == 0 {
            return invalid("hash_block_size must be > 0");
        }
        let mut queue = FreeQueue::new(num_blocks);
        // Block 0 becomes the null block, exactly as vLLM pops it first.
        let null = queue.popleft();
        debug_assert_eq!(null, Some(NULL_BLOCK));
        Ok(BlockPool {
            num_blocks,
            meta: vec![BlockMeta::FREE; num_blocks as usize],
            queue,
            map: PrefixMap::new(),
            extra_keys: std::collections::HashMap::new(),
            enable_caching,
            enable_events,
            hash_block_size,
            events: Vec::new(),
            null_ref_counted,
            partial_entries: false,
            record_metrics: false,
            metrics: Vec::new(),
        })
    }

    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    pub fn hash_block_size(&self) -> u32 {
        self.hash_block_size
    }

    /// Turns on partial-block entries (fine-grained lookups read it).
    pub fn set_partial_entries(&mut self, on: bool) {
        self.partial_entries = on;
    }

    pub fn partial_entries(&self) -> bool {
        self.partial_entries
    }

    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    pub fn num_free_blocks(&self) -> usize {
        self.queue.len()
    }

    pub fn usage(&self) -> f64 {
        let total = self.num_blocks as usize - 1;
        if total == 0 {
            return 0.0;
        }
        1.0 - (self.num_free_blocks() as f64 / total as f64)
    }

    pub fn ref_cnt(&self, b: BlockId) -> i32 {
        self.meta[b as usize].ref_cnt
    }

    /// The cached hash (without group) and group of a block, if cached.
    pub fn block_hash(&self, b: BlockId) -> Option<(&[u8], u32)> {
        match self.meta[b as usize].entry {
            NO_ENTRY => None,
            e => Some((self.map.key(e), self.meta[b as usize].group)),
        }
    }

    /// The prefix-map entry (interned hash) and group of a cached block.
    pub fn block_entry(&self, b: BlockId) -> Option<(u32, u32)> {
        let m = self.meta[b as usize];
        (m.entry != NO_ENTRY).then_some((m.entry, m.group))
    }

    pub fn is_free(&self, b: BlockId) -> bool {
        self.queue.contains(b)
    }

    pub fn free_queue(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.queue.iter()
    }

    /// Front and back of the free queue, `None` when empty (reads only).
    pub fn free_queue_ends(&self) -> Option<(BlockId, BlockId)> {
        self.queue.ends()
    }

    /// A free block's (previous, next) free-queue neighbours, `None` for the
    /// queue's ends; `None` overall if the block is not free (reads only).
    pub fn free_queue_neighbors(&self, b: BlockId) -> Option<(Option<BlockId>, Option<BlockId>)> {
        self.queue.neighbors(b)
    }

    pub fn num_cached_keys(&self) -> usize {
        self.map.len()
    }

    pub fn check_block_id(&self, b: u32) -> CoreResult<()> {
        if b >= self.num_blocks {
            return invalid(format!(
                "block id {b} out of range: the pool has {} blocks",
                self.num_blocks
            ));
        }
        Ok(())
    }

    /// The earliest cached block for `hash` in each group, or None on any miss.
    pub fn get_cached_block(&self, hash: &[u8], groups: &[u32], out: &mut Vec<BlockId>) -> bool {
        out.clear();
        for &g in groups {
            match self.map.get_one(hash, g) {
                Some(b) => out.push(b),
                None => return false,
            }
        }
        true
    }

    /// Pops `n` blocks from the front of the free queue, dropping any cached
    /// hash they carry. The caller has checked that `n` blocks are free.
    pub fn get_new_blocks(&mut self, n: usize, out: &mut Vec<BlockId>) {
        assert!(n <= self.queue.len(), "caller must check free blocks");
        reserve_table(out, n);
        for _ in 0..n {
            let b = self.queue.popleft().expect("checked above");
            if self.enable_caching {
                self.maybe_evict_cached_block(b);
            }
            self.meta[b as usize].ref_cnt += 1;
            if self.record_metrics {
                self.metrics.push(BlockMetric::Allocated(b));
            }
            out.push(b);
        }
    }

    /// Where taking the next `n` free blocks reads: their queue links and
    /// metadata (the queue is walked, so only lines already at hand).
    pub fn for_each_next_free_line(&self, n: usize, f: &mut impl FnMut(*const u8)) {
        for b in self.queue.first(n) {
            self.for_each_block_line(b, f);
        }
    }

    /// Where block `b`'s state lives: its metadata and its queue links.
    pub fn for_each_block_line(&self, b: BlockId, f: &mut impl FnMut(*const u8)) {
        f(std::ptr::from_ref(&self.meta[b as usize]).cast());
        f(self.queue.link_addr(b));
    }

    /// Where taking the next `n` free blocks reads past their own lines:
    /// the prefix-map entries they carry, which their eviction removes.
    /// Reads the blocks' links and metadata (a caller prefetched them
    /// first, with `for_each_next_free_line`).
    pub fn for_each_next_evicted_line(&self, n: usize, f: &mut impl FnMut(*const u8)) {
        if !self.enable_caching {
            return;
        }
        for b in self.queue.first(n) {
            let e = self.meta[b as usize].entry;
            if e != NO_ENTRY {
                self.map.for_each_entry_line(e, f);
            }
        }
    }

    /// Where the next `n` new prefix-cache keys are written.
    pub fn for_each_next_new_entry_line(&self, n: usize, f: &mut impl FnMut(*const u8)) {
        self.map.for_each_next_new_entry_line(n, f);
    }

    fn maybe_evict_cached_block(&mut self, b: BlockId) -> bool {
        // vLLM tells its collector first, whether the block is cached or not.
        if self.record_metrics {
            self.metrics.push(BlockMetric::Evicted(b));
        }
        if self.meta[b as usize].entry == NO_ENTRY {
            return false;
        }
        self.drop_block_keys(b)
    }

    // Event recording stays out of line: with events off (the common
    // case) the allocation paths keep to fewer cache lines of code.
    #[cold]
    #[inline(never)]
    fn record_removed(&mut self, entry: u32, group: u32) {
        let hash = Box::from(self.map.key(entry));
        self.events.push(PoolEvent::Removed { hash, group });
    }

    /// A cache hit by another request: take blocks off the free queue and
    /// count the new holder.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            if b == NULL_BLOCK && !self.null_ref_counted {
                // Not `null_block_ref_counted`: the null block is never
                // pooled nor counted.
                continue;
            }
            if self.meta[b as usize].ref_cnt == 0 && b != NULL_BLOCK {
                self.queue.remove(b);
            }
            self.meta[b as usize].ref_cnt += 1;
            if self.record_metrics {
                self.metrics.push(BlockMetric::Accessed(b));
            }
        }
    }

    /// Drops one reference from each block; those reaching zero join the free
    /// queue in the given order (front first when `prepend`).
    pub fn free_blocks<I: IntoIterator<Item = BlockId> + Clone>(
        &mut self,
        blocks: I,
        prepend: bool,
    ) {
        // All counts drop before any block joins the queue (a block listed
        // twice joins it twice, as in vLLM).
        for b in blocks.clone() {
            if b != NULL_BLOCK || self.null_ref_counted {
                self.meta[b as usize].ref_cnt -= 1;
            }
        }
        let freed = blocks
            .into_iter()
            .filter(|&b| self.meta[b as usize].ref_cnt == 0 && b != NULL_BLOCK);
        if prepend {
            let freed: SmallVec<[BlockId; 16]> = freed.collect();
            self.queue.prepend_n(&freed);
        } else {
            // Appending changes no count, so the filter can run lazily.
            for b in freed {
                self.queue.append(b);
            }
        }
    }

    /// vLLM's `free_blocks`: drops one reference from each block in
    /// eviction order; of those reaching zero, blocks without a hash (every
    /// block when caching is off) join the front in that order, to be
    /// reused first, and cached ones the back (LRU). Null entries are
    /// skipped.
    pub fn free_blocks_split(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        self.free_blocks_evicting(blocks, false);
    }

    /// `free_blocks_split`, or with `evict_first` (vLLM's
    /// `free_blocks(..., evict_first=True)`, for blocks another tier holds)
    /// cached blocks reaching zero join the front too, in that order.
    pub fn free_blocks_evicting(
        &mut self,
        blocks: impl IntoIterator<Item = BlockId>,
        evict_first: bool,
    ) {
        let mut first: SmallVec<[BlockId; 16]> = SmallVec::new();
        let mut last: SmallVec<[BlockId; 16]> = SmallVec::new();
        for b in blocks {
            if b == NULL_BLOCK {
                continue;
            }
            let m = &mut self.meta[b as usize];
            m.ref_cnt -= 1;
            if m.ref_cnt == 0 {
                if m.entry == NO_ENTRY || !self.enable_caching || evict_first {
                    first.push(b);
                } else {
                    last.push(b);
                }
            }
        }
        if !first.is_empty() {
            self.queue.prepend_n(&first);
        }
        for b in last {
            self.queue.append(b);
        }
    }

    /// Caches `blocks[num_cached..num_full]` under `hash_of(i)` for group
    /// `group`, skipping null blocks and blocks whose mask entry is false.
    #[allow(clippy::too_many_arguments)]
    pub fn cache_full_blocks<'h>(
        &mut self,
        blocks: &[BlockId],
        num_cached: usize,
        num_full: usize,
        block_size: u32,
        group: u32,
        keeps: impl Fn(usize) -> bool,
        hash_of: impl Fn(usize) -> std::borrow::Cow<'h, [u8]>,
    ) {
        if num_cached >= num_full {
            return;
        }
        let end = num_full.min(blocks.len());
        let cached = |i: usize| blocks[i] != NULL_BLOCK && keeps(i);
        for i in num_cached..end {
            if !cached(i) {
                continue;
            }
            let b = blocks[i];
            let num_tokens = ((i + 1) * block_size as usize) as u32;
            if self.meta[b as usize].entry != NO_ENTRY {
                // Only a partial entry of this block (partial-block-hits), or a Mamba
                // checkpoint keyed lower, is promoted: its keys go (with
                // events) before the full hash comes.
                debug_assert!(self.meta[b as usize].num_tokens < num_tokens);
                self.drop_block_keys(b);
            }
            let m = &mut self.meta[b as usize];
            m.entry = self.map.insert(&hash_of(i), group, b);
            m.group = group;
            m.num_tokens = num_tokens;
        }
        if self.enable_events {
            let positions: Vec<u32> = (num_cached..end)
                .filter(|&i| cached(i))
                .map(|i| i as u32)
                .collect();
            self.record_stored(positions, num_cached, num_full, block_size, group, &hash_of);
        }
    }

    #[cold]
    #[inline(never)]
    fn record_stored<'h>(
        &mut self,
        positions: Vec<u32>,
        num_cached: usize,
        num_full: usize,
        block_size: u32,
        group: u32,
        hash_of: &impl Fn(usize) -> std::borrow::Cow<'h, [u8]>,
    ) {
        let owned = |i: usize| hash_of(i).into_owned().into_boxed_slice();
        self.events.push(PoolEvent::Stored {
            hashes: positions.iter().map(|&i| owned(i as usize)).collect(),
            parent: (num_cached > 0).then(|| owned(num_cached - 1)),
            start_token: num_cached * block_size as usize,
            end_token: num_full * block_size as usize,
            block_size,
            group,
            positions,
        });
    }

    /// Drops the listed blocks from the prefix cache (not from their holders).
    pub fn evict_blocks(&mut self, ids: &[u32]) -> CoreResult<()> {
        for &b in ids {
            self.check_block_id(b)?;
        }
        for &b in ids {
            self.maybe_evict_cached_block(b);
        }
        Ok(())
    }

    /// Forgets every cached hash; refused (false) while any block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let used = self.num_blocks as usize - self.num_free_blocks();
        if used != 1 {
            return false;
        }
        self.map.clear();
        self.extra_keys.clear();
        self.meta.iter_mut().for_each(|m| {
            m.entry = NO_ENTRY;
            m.num_tokens = 0;
        });
        if self.record_metrics {
            self.metrics.push(BlockMetric::Reset);
        }
        if self.enable_events {
            self.events.push(PoolEvent::AllCleared);
        }
        true
    }

    pub fn take_events(&mut self) -> Vec<PoolEvent> {
        std::mem::take(&mut self.events)
    }

    /// Logs vLLM's metrics-collector calls from now on (`take_metrics`).
    pub fn set_record_metrics(&mut self, on: bool) {
        self.record_metrics = on;
    }

    pub fn records_metrics(&self) -> bool {
        self.record_metrics
    }

    pub fn has_metrics(&self) -> bool {
        !self.metrics.is_empty()
    }

    /// Entries in the metrics log (0 while not recording).
    pub fn metrics_len(&self) -> usize {
        self.metrics.len()
    }

    /// Reorders the log from `start` on, made of two passes over `k` groups
    /// (`ends`: the log length after each group of the first pass, then of
    /// the second), into group order: group 0's two parts, group 1's, ...
    pub fn interleave_metrics(&mut self, start: usize, ends: &[usize]) {
        let k = ends.len() / 2;
        let part = |j: usize| (if j == 0 { start } else { ends[j - 1] })..ends[j];
        let tail: Vec<BlockMetric> = (0..k)
            .flat_map(|g| part(g).chain(part(k + g)))
            .map(|i| self.metrics[i])
            .collect();
        self.metrics.truncate(start);
        self.metrics.extend(tail);
    }

    /// The collector calls logged since the last take, oldest first.
    pub fn take_metrics(&mut self) -> Vec<BlockMetric> {
        std::mem::take(&mut self.metrics)
    }

    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Checks the pool's own invariants; returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let nb = self.num_blocks as usize;
        let mut seen = vec![false; nb];
        let mut n = 0;
        // Bounded walk: a corrupted (cyclic) queue must not hang the check.
        for b in self.queue.iter().take(nb + 1) {
            if b >= self.num_blocks {
                return Err(format!("free queue holds block id {b} out of range"));
            }
            if b == NULL_BLOCK {
                return Err("null block is in the free queue".into());
            }
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(format!("block {b} is in the free queue twice"));
            }
            if self.meta[b as usize].ref_cnt != 0 {
                return Err(format!(
                    "free block {b} has ref_cnt {}",
                    self.meta[b as usize].ref_cnt
                ));
            }
            n += 1;
        }
        if n != self.queue.len() {
            return Err(format!(
                "free count {} != queue length {n}",
                self.queue.len()
            ));
        }
        for b in 0..self.num_blocks {
            if self.queue.contains(b) != seen[b as usize] {
                return Err(format!(
                    "block {b}: its free-queue links disagree with the queue's walk"
                ));
            }
            if b != NULL_BLOCK && !seen[b as usize] && self.meta[b as usize].ref_cnt <= 0 {
                return Err(format!("block {b} is neither free nor referenced"));
            }
        }
        if self.meta[NULL_BLOCK as usize].entry != NO_ENTRY {
            return Err("null block is cached".into());
        }
        let mut in_map = vec![0usize; nb];
        let mut keys: std::collections::HashSet<(&[u8], u32)> = std::collections::HashSet::new();
        let mut pairs: std::collections::HashSet<(&[u8], u32, BlockId)> =
            std::collections::HashSet::new();
        for (h, g, b) in self.map.iter() {
            if b >= self.num_blocks {
                return Err(format!("prefix map holds block id {b} out of range"));
            }
            if !pairs.insert((h, g, b)) {
                return Err(format!(
                    "block {b} is in the prefix map twice under one key"
                ));
            }
            in_map[b as usize] += 1;
            if !self.block_keys(b).any(|(bh, bg)| bh == h && bg == g) {
                return Err(format!("prefix map holds block {b} under a hash it lacks"));
            }
            keys.insert((h, g));
        }
        for b in 0..nb {
            let n = self.block_keys(b as BlockId).count();
            if n != in_map[b] {
                return Err(format!(
                    "block {b} carries {n} keys but the prefix map holds it under {}",
                    in_map[b]
                ));
            }
        }
        if let Some(b) = self
            .extra_keys
            .keys()
            .find(|&&b| self.meta[b as usize].entry == NO_ENTRY)
        {
            return Err(format!("block {b} has extra keys but no primary hash"));
        }
        if keys.len() != self.map.len() {
            return Err(format!(
                "prefix map counts {} keys but holds {}",
                self.map.len(),
                keys.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "block_pool_tests.rs"]
mod tests;

//! KV-cache events as the block pool records them. The facade turns them into
//! vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`, adding what only
//! the request knows (token ids, LoRA, extra keys).

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEvent {
    Stored {
        /// Hashes of the blocks newly cached, at this group's block size.
        hashes: Vec<Box<[u8]>>,
        /// Hash of the block before the first one of this batch, if any.
        parent: Option<Box<[u8]>>,
        /// Token range covered, as vLLM reports it (includes skipped blocks).
        start_token: usize,
        end_token: usize,
        block_size: u32,
        group: u32,
        /// Block positions (index in the request's table) that were cached:
        /// one per hash, for per-block extra keys.
        positions: Vec<u32>,
    },
    Removed {
        hash: Box<[u8]>,
        group: u32,
    },
    /// The extra keys (partial-block entries) of one block dropped
    /// together, in the order they were added. vLLM keeps them in a Python
    /// `set` and emits one `BlockRemoved` each in that set's order, which
    /// only Python can reproduce: the facade rebuilds the set.
    RemovedSet {
        keys: Vec<(Box<[u8]>, u32)>,
    },
    AllCleared,
}

/// A call vLLM's `BlockPool` makes on its `metrics_collector`, as the
/// pool logs it when block metrics are on (the binding hands the log to the
/// user's collector after each manager call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockMetric {
    /// `on_block_allocated`: the block left the free queue for a request.
    Allocated(u32),
    /// `on_block_accessed`: a cache hit touched the block (null block included).
    Accessed(u32),
    /// `on_block_evicted`: the pool dropped (or tried to drop) the block's hash.
    Evicted(u32),
    /// `reset`: the prefix cache was reset.
    Reset,
}

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
    AllCleared,
}

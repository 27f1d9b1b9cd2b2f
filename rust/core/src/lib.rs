//! hybridcache-core: a KV-cache block manager with vLLM 0.23.0's semantics,
//! in pure Rust (no PyO3; `unsafe_code` is forbidden). The Python facade lives in
//! `python/hybridcache`, the binding in `rust/python`.
#![forbid(unsafe_code)]

pub mod admission_check;
pub mod block_hasher;
pub mod block_pool;
pub mod coordinator;
pub mod error;
pub mod events;
pub mod fast_hash;
pub mod free_queue;
pub mod hashes;
pub mod kv_manager;
pub mod mamba_plan;
pub mod manager;
pub mod new_blocks;
pub mod prefix_map;
pub mod requests;
pub mod slot_table;
pub mod spec;

pub use block_pool::{BlockPool, NULL_BLOCK};
pub use error::{CoreError, CoreResult};
pub use events::PoolEvent;
pub use hashes::HashList;
pub use kv_manager::{AllocateArgs, HashUpdate, KvCacheManager, LookupStats, ManagerConfig};
pub use new_blocks::NewBlocks;
pub use spec::{GroupSpec, MambaMode, SpecKind};

/// Block ids are u32; block 0 is the null block.
pub type BlockId = u32;
/// Dense index of a request inside the manager.
pub type ReqSlot = u32;

pub(crate) fn cdiv(n: usize, d: usize) -> usize {
    n.div_ceil(d)
}

//! hybridcache-core: a KV-cache block manager with vLLM's `KVCacheManager`
//! semantics, the rules each release follows chosen by a behaviour profile
//! (`profile`), in pure Rust (no PyO3; `unsafe_code` is forbidden). The Python facade lives in
//! `python/hybridcache`, the binding in `rust/python`.
#![forbid(unsafe_code)]

pub mod addr_table;
mod attention;
pub mod block_hasher;
mod block_pool;
mod coordinator;
mod decode_bounds;
mod error;
mod events;
pub mod fast_hash;
mod free_queue;
mod group_manager;
mod hashes;
mod kv_cache_manager;
mod mamba_plan;
mod new_blocks;
mod prefix_map;
pub mod profile;
mod requests;
mod spec;

pub use attention::mamba::AlignState;
pub use block_pool::{BlockPool, NULL_BLOCK};
pub use coordinator::CacheHit;
pub use error::{CoreError, CoreResult};
pub use events::{BlockMetric, PoolEvent};
pub use hashes::{HashList, HashUpdate};
pub use kv_cache_manager::{
    AllocateArgs, BatchResult, BatchScratch, DecodeBatch, KvCacheManager, LookupStats,
    ManagerConfig,
};
pub use mamba_plan::PreRow;
pub use new_blocks::NewBlocks;
pub use profile::BehaviourProfile;
pub use spec::{GroupSpec, MambaCheckpoints, MambaMode, SpecKind};

/// Block ids are u32; block 0 is the null block.
pub type BlockId = u32;
/// Dense index of a request inside the manager.
pub type ReqSlot = u32;

pub(crate) fn cdiv(n: usize, d: usize) -> usize {
    n.div_ceil(d)
}

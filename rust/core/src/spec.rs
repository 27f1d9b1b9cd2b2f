//! What the core needs to know about a KV-cache group's spec.

use crate::error::{CoreError, CoreResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MambaMode {
    /// One running state per request, no prefix caching.
    None,
    /// A state for every block, all cacheable.
    All,
    /// States only at block boundaries the scheduler aligns to; the running
    /// state moves to a new block each time a block fills.
    Align,
}

/// The attention type of a group, which decides its manager's behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecKind {
    /// Full attention and its subclasses vLLM manages the same way
    /// (MLA, TurboQuant full attention, hidden-state cache).
    FullAttention,
    /// Sliding-window attention (also sliding-window MLA).
    SlidingWindow { window: u32 },
    /// Chunked local attention (attention within fixed token chunks).
    ChunkedLocal { chunk: u32 },
    /// Mamba / linear attention state.
    Mamba {
        mode: MambaMode,
        num_speculative_blocks: u32,
    },
    /// Cross attention of encoder-decoder models (per-request encoder states).
    CrossAttention,
    /// Reference sliding window attention (vLLM's `RSWASpec`): full
    /// attention whose decode blocks older than `window` tokens past the
    /// prompt are freed.
    Rswa { window: u32 },
    /// One ring block per request, never cached (vLLM's
    /// `CircularBufferSpec`).
    CircularBuffer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub kind: SpecKind,
    pub block_size: u32,
    /// The group holds EAGLE/MTP draft layers (`KVCacheGroupSpec.is_eagle_group`).
    pub is_eagle_group: bool,
    /// New blocks of this group are reported by `take_new_block_ids` (vLLM
    /// does so for exactly FullAttentionSpec, TQFullAttentionSpec, MLAAttentionSpec).
    pub reports_new_block_ids: bool,
    /// Groups with equal specs share this id; the hybrid coordinator looks
    /// them up together (vLLM compares the spec objects).
    pub spec_class: u32,
    /// Per-request admission cap in blocks (sliding window, chunked local),
    /// as the spec's `max_admission_blocks_per_request` gives it.
    pub admission_cap: Option<usize>,
    /// Mamba align prefill checkpoint blocks (vLLM's
    /// `num_prefill_checkpoint_blocks > 0`, with an alignment): a chunk may
    /// reserve the block before its running state for an exported state.
    pub mamba_checkpoints: Option<MambaCheckpoints>,
    /// The group takes part in prefix caching (vLLM's
    /// `spec.prefix_cacheable`: false for circular buffers and bounded-replay
    /// sliding windows); a group that does not is left out of hit searches
    /// and never caches.
    pub prefix_cacheable: bool,
    /// Sliding window: tokens kept below the window (vLLM's
    /// `extra_retained_tokens`, the multi-module MTP lag); 0 elsewhere.
    pub extra_retained_tokens: u32,
}

/// What decides a Mamba align prefill checkpoint (vLLM's
/// `_needs_internal_checkpoint` and `get_mamba_prefill_checkpoint_position`):
/// the spec's alignment and the manager's settings it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MambaCheckpoints {
    /// `prefill_checkpoint_alignment`; 0: the spec exports no checkpoints
    /// (set with prefix caching for the partial-block-hits caching rules alone).
    pub alignment: u32,
    pub hash_block_size: u32,
    pub num_hash_lookahead_tokens: u32,
    /// `drop_eagle_checkpoint_block` (the manager's `use_eagle`).
    pub drop_eagle_block: bool,
    /// Only the chunk reaching the prefill end checkpoints (retention 0).
    pub only_at_prefill_end: bool,
}

impl GroupSpec {
    pub fn new(kind: SpecKind, block_size: u32) -> Self {
        let reports_new_block_ids = kind == SpecKind::FullAttention;
        let kind_is_cacheable = kind != SpecKind::CircularBuffer;
        GroupSpec {
            kind,
            block_size,
            is_eagle_group: false,
            reports_new_block_ids,
            spec_class: u32::MAX,
            admission_cap: None,
            mamba_checkpoints: None,
            prefix_cacheable: kind_is_cacheable,
            extra_retained_tokens: 0,
        }
    }

    pub fn full_attention(block_size: u32) -> Self {
        Self::new(SpecKind::FullAttention, block_size)
    }

    /// Full attention as vLLM's hit search sees it (`FullAttentionSpec`
    /// and its subclass `RSWASpec`).
    pub fn is_full_attention(&self) -> bool {
        matches!(self.kind, SpecKind::FullAttention | SpecKind::Rswa { .. })
    }

    pub fn is_mamba(&self) -> bool {
        matches!(self.kind, SpecKind::Mamba { .. })
    }

    pub(crate) fn validate(&self, index: usize) -> CoreResult<()> {
        let bad = |what: &str| {
            Err(CoreError::InvalidArgument(format!(
                "kv_cache_groups[{index}]: {what}"
            )))
        };
        if self.block_size == 0 {
            return bad("block_size must be > 0");
        }
        match self.kind {
            SpecKind::SlidingWindow { window: 0 } => bad("sliding_window must be > 0"),
            SpecKind::ChunkedLocal { chunk: 0 } => bad("attention_chunk_size must be > 0"),
            SpecKind::CircularBuffer if self.prefix_cacheable => {
                bad("a circular buffer is never prefix-cacheable")
            }
            _ if self.extra_retained_tokens > 0
                && !matches!(self.kind, SpecKind::SlidingWindow { .. }) =>
            {
                bad("extra_retained_tokens applies to sliding-window groups only")
            }
            _ => Ok(()),
        }
    }
}

/// The groups as a manager with decode / prefill context parallelism sees
/// them, or why vLLM cannot run them. vLLM scales every manager's
/// block size by `dcp * pcp` (the base `SingleTypeKVCacheManager`
/// constructor; the unitary coordinator and full attention's hit search
/// scale theirs alike), and only its coordinator's divisibility check reads
/// the spec's own size: scaling the specs once, after that check, gives
/// every later reader (tables, hits, caching, events, usage) vLLM's size.
pub(crate) fn context_parallel_groups(
    groups: &[GroupSpec],
    enable_caching: bool,
    (dcp, pcp): (u32, u32),
) -> CoreResult<Vec<GroupSpec>> {
    if dcp == 0 || pcp == 0 {
        return Err(CoreError::InvalidArgument(format!(
            "dcp_world_size and pcp_world_size must be > 0, got {dcp} and {pcp}"
        )));
    }
    let factor = dcp.checked_mul(pcp).ok_or_else(|| {
        CoreError::InvalidArgument(format!(
            "dcp_world_size * pcp_world_size is out of range ({dcp} * {pcp})"
        ))
    })?;
    if factor == 1 {
        return Ok(groups.to_vec());
    }
    let refuse = |why: &str| {
        Err(CoreError::InvalidArgument(format!(
            "dcp_world_size={dcp}, pcp_world_size={pcp}: {why}"
        )))
    };
    let mamba = groups
        .iter()
        .any(|g| matches!(g.kind, SpecKind::Mamba { .. }));
    if enable_caching && groups.len() > 1 {
        return refuse(
            "vLLM supports context parallelism only for a single KV cache group \
             (its hybrid coordinator asserts dcp == pcp == 1)",
        );
    }
    if enable_caching && !groups[0].is_full_attention() {
        return refuse(
            "with prefix caching, vLLM supports context parallelism only for full \
             attention (the sliding-window, chunked-local and Mamba hit searches assert \
             dcp == pcp == 1)",
        );
    }
    if mamba {
        return Err(CoreError::Unsupported(format!(
            "dcp_world_size={dcp}, pcp_world_size={pcp} with a Mamba group (vLLM's \
             Mamba manager asserts dcp == pcp == 1 on lookup)"
        )));
    }
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let block_size = g.block_size.checked_mul(factor).ok_or_else(|| {
                CoreError::InvalidArgument(format!(
                    "kv_cache_groups[{i}]: block_size * dcp_world_size * pcp_world_size \
                     is out of range"
                ))
            })?;
            Ok(GroupSpec {
                block_size,
                ..g.clone()
            })
        })
        .collect()
}

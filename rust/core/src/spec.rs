//! What the core needs to know about a KV-cache group's spec.

use crate::error::{CoreError, CoreResult};

/// The attention type of a group, which decides its manager's behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecKind {
    /// Full attention and its subclasses vLLM manages the same way
    /// (MLA, TurboQuant full attention, ...).
    FullAttention,
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
}

impl GroupSpec {
    pub fn full_attention(block_size: u32) -> Self {
        GroupSpec {
            kind: SpecKind::FullAttention,
            block_size,
            is_eagle_group: false,
            reports_new_block_ids: true,
        }
    }

    pub(crate) fn validate(&self, index: usize) -> CoreResult<()> {
        if self.block_size == 0 {
            return Err(CoreError::InvalidArgument(format!(
                "kv_cache_groups[{index}] has block_size 0"
            )));
        }
        Ok(())
    }
}

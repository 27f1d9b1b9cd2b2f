//! vLLM's lookup for requests with a KV connector on hybrid models
//! with Mamba layers (`get_computed_blocks_for_connector`): each spec group
//! looked up on its own (`find_longest_cache_hit_per_group`, in
//! `hit_search`); the full-attention hit is the local prefix unless another
//! group hit deeper.

use super::{Coordinator, CoordinatorKind};

impl Coordinator {
    /// The first spec group's first group when it is full attention (the
    /// dense reference of per-group lookups); hybrid coordinators only.
    pub fn full_attention_group_id(&self) -> Option<usize> {
        if self.kind != CoordinatorKind::Hybrid {
            return None;
        }
        let first = self.spec_groups.first()?;
        first
            .spec
            .is_full_attention()
            .then(|| first.group_ids[0] as usize)
    }
}

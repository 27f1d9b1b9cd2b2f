//! vLLM's manager calls that Mamba prefix caching adds: the KV
//! connector's per-group lookup and the boundary-state offloads.

use super::KvCacheManager;
use crate::coordinator::CacheHit;
use crate::error::{invalid, CoreResult};
use crate::hashes::HashList;
use crate::{BlockId, ReqSlot};

impl KvCacheManager {
    /// vLLM's `get_computed_blocks_for_connector` on hybrid models with
    /// Mamba layers and a full-attention group: each group's own hit, the
    /// full-attention one as the local prefix, and whether a group lags it
    /// (`hit_diverged`); `None` where vLLM answers `get_computed_blocks`
    /// (no such layout, or a group hit deeper than full attention).
    pub fn find_cache_hit_for_connector(
        &self,
        request_id: &str,
        num_tokens: usize,
        max_hit: Option<usize>,
    ) -> CoreResult<Option<(CacheHit, bool)>> {
        let has_mamba = self.coord.managers.iter().any(|m| m.spec.is_mamba());
        let Some(fa) = self.coord.full_attention_group_id().filter(|_| has_mamba) else {
            return Ok(None);
        };
        if num_tokens == 0 {
            return invalid(format!("request {request_id:?} has no tokens"));
        }
        let empty = HashList::new();
        let hashes = self.slot(request_id).map_or(&empty, |s| self.hashes(s));
        let max_hit = max_hit.map_or(num_tokens - 1, |m| m.min(num_tokens));
        let (blocks, lens) = self
            .coord
            .find_longest_cache_hit_per_group(hashes, max_hit)?;
        let local = lens[fa];
        if lens.iter().any(|&h| h > local) {
            return Ok(None);
        }
        let diverged = lens.iter().any(|&h| h < local);
        let hit = CacheHit {
            blocks,
            len: local,
            longest: local,
        };
        Ok(Some((hit, diverged)))
    }

    /// vLLM's `take_boundary_state_offloads`: the Mamba align states
    /// cached since the last take, group by group, oldest first: (request
    /// slot, group, block, boundary tokens). Every slot is live (a free
    /// drops the request's entries): `request_id_at` names it.
    pub fn take_boundary_state_offloads(&mut self) -> Vec<(ReqSlot, u32, BlockId, usize)> {
        let mut raw = Vec::new();
        for m in self.coord.managers.iter_mut() {
            m.take_offloads(&mut raw);
        }
        raw
    }
}

//! `cache_blocks`: by request id, and for a request the caller already
//! resolved to its slot (vLLM's scheduler caches every running
//! request after every step, so that call is as hot as a decode).

use super::KvCacheManager;
use crate::decode_bounds::DecodeHorizon;
use crate::error::{invalid, CoreResult};
use crate::hashes::HashUpdate;
use crate::spec::SpecKind;
use crate::{BlockId, ReqSlot};

impl KvCacheManager {
    /// Caches the request's full blocks up to `num_computed_tokens`.
    pub fn cache_blocks(
        &mut self,
        request_id: &str,
        num_computed_tokens: usize,
        update: Option<HashUpdate>,
    ) -> CoreResult<()> {
        if !self.enable_caching {
            return Ok(());
        }
        if let Some(slot) = self.slot(request_id) {
            return self.cache_blocks_held(slot, num_computed_tokens, update);
        }
        // Not held: the hash check's error comes first, as for a held one.
        self.hashes_after_at(None, request_id, update.as_ref())?;
        invalid(format!(
            "request {request_id:?} has no blocks for {num_computed_tokens} computed tokens"
        ))
    }

    /// `cache_blocks` of the request in `slot` (a live one, from `lookup`
    /// or a handle); the same checks, errors and effects.
    pub fn cache_blocks_held(
        &mut self,
        slot: ReqSlot,
        num_computed_tokens: usize,
        update: Option<HashUpdate>,
    ) -> CoreResult<()> {
        if !self.enable_caching {
            return Ok(());
        }
        let request_id = self.reqs.id_at(slot);
        let have = self.hashes_after_at(Some(slot), request_id, update.as_ref())?;
        let need = self
            .coord
            .hashes_needed_to_cache(num_computed_tokens, |m| m.num_cached_blocks(slot));
        let holds = self
            .coord
            .managers
            .iter()
            // Groups out of prefix caching cache nothing (a ring holds one block).
            .all(|m| {
                !m.spec.prefix_cacheable
                    || m.blocks(slot).len() >= num_computed_tokens / m.block_size as usize
            });
        if !holds {
            return invalid(format!(
                "request {request_id:?} has no blocks for {num_computed_tokens} computed tokens"
            ));
        }
        if have < need && !self.profile.cache_cap_at_hashes {
            return invalid(format!(
                "request {request_id:?} has {have} block hashes but caching needs {need}"
            ));
        }
        if let Some(u) = update {
            // `apply_hashes`: an empty update at the known end changes nothing.
            if !(u.hashes.is_empty() && u.offset == self.known_hashes_at(Some(slot))) {
                self.apply_hashes_at(slot, u);
            }
        }
        self.set_horizon(slot, None);
        self.coord.cache_blocks(
            slot,
            self.reqs.hashes(slot),
            num_computed_tokens,
            self.retention_marks(slot),
        );
        // The horizon is re-derived by the one rule an allocation uses
        // (`coord.decode_horizon`): the next decode stays on the hot line.
        if let Some(h) = self.coord.decode_horizon(slot, &self.retention_marks(slot)) {
            self.set_horizon(slot, Some(h));
        }
        Ok(())
    }

    /// `cache_blocks_held(slot, n, None)` judged from the request's hot
    /// line alone (`handle`: a live request's, as `plain_decode_by_handle`
    /// takes): `(slot, true)` when that call would change nothing and raise
    /// nothing, so the caller need neither read the request's new hashes
    /// nor make it. The decode horizon admits caching `n` tokens (no group
    /// caches a block or keys a state), and its room bounds cover `n`, so
    /// every group holds the `n / block_size` blocks the call checks for.
    #[inline]
    pub fn cache_blocks_is_noop_by_handle(
        &self,
        handle: u64,
        num_computed_tokens: usize,
    ) -> Option<(ReqSlot, bool)> {
        let (slot, h, _) = self.reqs.resolve_for_decode(handle)?;
        let n = num_computed_tokens;
        let noop = !self.enable_caching
            || *h != DecodeHorizon::UNKNOWN
                && n <= h.max_need_slot
                && n <= h.max_main
                && n <= h.max_to_cache
                && n >= h.min_to_cache;
        #[cfg(debug_assertions)]
        if noop {
            self.assert_skip_matches(
                slot,
                "skipped cache_blocks",
                |called| assert!(called.cache_blocks_held(slot, n, None).is_ok()),
                |_| {},
            );
        }
        Some((slot, noop))
    }

    /// `set_shared_prefix_boundary` for a live slot.
    pub fn set_shared_prefix_boundary_at(&mut self, slot: ReqSlot, boundary: usize) {
        self.reqs.set_shared_prefix_boundary(slot, boundary);
    }

    /// `set_num_computed_tokens` for a live slot.
    pub fn set_num_computed_tokens_at(&mut self, slot: ReqSlot, n: usize) {
        self.reqs.set_num_computed_tokens(slot, n);
    }

    /// vLLM's `estimate_cached_tokens`: over the groups it counts
    /// (prefix-cacheable, not cross attention), the fewest of each group's
    /// most tokens any of the request's blocks' hash covers
    /// (`BlockPool::block_hash_num_tokens`); 0 for none, or for a request
    /// the manager does not hold.
    pub fn estimate_cached_tokens(&self, slot: Option<ReqSlot>) -> usize {
        let Some(s) = slot else {
            return 0;
        };
        let pool = &self.coord.pool;
        self.coord
            .managers
            .iter()
            .filter(|m| m.spec.prefix_cacheable && m.spec.kind != SpecKind::CrossAttention)
            .map(|m| {
                let covers = |&b: &BlockId| pool.block_hash_num_tokens(b);
                let blocks = m.blocks(s);
                let all = || blocks.iter().filter_map(covers).max();
                let most = if m.is_mamba_align() {
                    // Align tables move speculative blocks: all of them.
                    all()
                } else {
                    // Block i holds tokens [i·bs, (i+1)·bs) and a cached
                    // block's hash ends inside it (the invariants check
                    // it), so the last cached block covers the most: a
                    // long table's other blocks (cold lines) go unread.
                    let last = blocks.iter().rev().find_map(covers);
                    debug_assert_eq!(last, all());
                    last
                };
                most.unwrap_or(0) as usize
            })
            .min()
            .unwrap_or(0)
    }
}

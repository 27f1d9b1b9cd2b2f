//! Mamba align state-copy plans of `KvCacheManager` (the planner itself is
//! `mamba_plan`): which requests' views and counts a plan reads.

use super::KvCacheManager;
use crate::error::{invalid, CoreError, CoreResult};
use crate::mamba_plan::{post_rows, pre_rows, PlanRequest, PreRow};
use crate::ReqSlot;

impl KvCacheManager {
    /// Mamba align bookkeeping of a request in a group, if any.
    pub fn align_state(
        &self,
        request_id: &str,
        group: usize,
    ) -> Option<crate::attention::mamba::AlignState> {
        let slot = self.slot(request_id)?;
        self.coord.managers.get(group)?.align_state(slot)
    }

    /// Mamba align groups: (block size, speculative blocks), or None.
    pub(super) fn align_geometry(&self) -> Option<(usize, usize)> {
        self.coord
            .managers
            .iter()
            .find(|m| m.is_mamba_align())
            .map(|m| match m.spec.kind {
                crate::spec::SpecKind::Mamba {
                    num_speculative_blocks,
                    ..
                } => (m.block_size as usize, num_speculative_blocks as usize),
                _ => unreachable!("is_mamba_align"),
            })
    }

    pub(super) fn plan_request(&self, request_id: &str) -> CoreResult<(ReqSlot, PlanRequest<'_>)> {
        let slot = self.slot(request_id);
        let step = slot.and_then(|s| self.reqs.last_step(s));
        let (Some(slot), Some((num_computed, num_scheduled))) = (slot, step) else {
            return Err(CoreError::UnknownRequest(format!(
                "request {request_id:?} has no allocation this step to plan Mamba copies for"
            )));
        };
        let views = self
            .coord
            .managers
            .iter()
            .filter(|m| m.is_mamba_align())
            .map(|m| m.worker_view(slot).unwrap_or(&[]))
            .collect();
        let prev_state_idx = self.planner.state_idx(slot);
        Ok((
            slot,
            PlanRequest {
                views,
                num_computed,
                num_scheduled,
                prev_state_idx,
            },
        ))
    }

    /// Pre-forward Mamba state copies of this step for `request_ids` (the
    /// batch, in order), given the worker's accepted-token counts of the
    /// previous step. Advances each request's running-state index; on an
    /// error nothing is advanced.
    pub fn mamba_pre_copy_plan(
        &mut self,
        request_ids: &[&str],
        num_accepted: &[i64],
    ) -> CoreResult<Vec<PreRow>> {
        let Some((block_size, _)) = self.align_geometry() else {
            return invalid("no Mamba align group: nothing to plan");
        };
        if request_ids.len() != num_accepted.len() {
            return invalid(format!(
                "num_accepted has {} entries for {} requests",
                num_accepted.len(),
                request_ids.len()
            ));
        }
        let mut rows = Vec::new();
        let mut updates = Vec::with_capacity(request_ids.len());
        if let Some(i) = num_accepted.iter().position(|&a| a < 0) {
            return invalid(format!(
                "num_accepted[{i}] must be >= 0, got {}",
                num_accepted[i]
            ));
        }
        for (i, (rid, &a)) in request_ids.iter().zip(num_accepted).enumerate() {
            let (slot, r) = self.plan_request(rid)?;
            updates.push((slot, pre_rows(i, &r, a, block_size, &mut rows)?));
        }
        for (slot, cur) in updates {
            self.planner.set_state_idx(slot, cur);
        }
        Ok(rows)
    }

    /// Post-verification selection rows for `request_ids` (after this step's
    /// pre plan), given each request's scheduled draft count. Flat
    /// `[group, req, (dst, conv_src, temp_src, bias, reset) * (k + 1)]` rows.
    pub fn mamba_post_select_plan(
        &self,
        request_ids: &[&str],
        num_draft: &[usize],
    ) -> CoreResult<(Vec<i32>, usize)> {
        let Some((block_size, num_spec)) = self.align_geometry() else {
            return invalid("no Mamba align group: nothing to plan");
        };
        if request_ids.len() != num_draft.len() {
            return invalid(format!(
                "num_draft has {} entries for {} requests",
                num_draft.len(),
                request_ids.len()
            ));
        }
        let mut out = Vec::new();
        for (i, (rid, &d)) in request_ids.iter().zip(num_draft).enumerate() {
            let (_, r) = self.plan_request(rid)?;
            let Some(state_idx) = r.prev_state_idx else {
                return invalid(format!(
                    "request {rid:?}: run the pre-copy plan of this step first"
                ));
            };
            post_rows(i, &r, state_idx, d, num_spec, block_size, &mut out)?;
        }
        Ok((out, 2 + 5 * (num_spec + 1)))
    }
}

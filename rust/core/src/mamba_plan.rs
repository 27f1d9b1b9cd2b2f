//! Mamba "align" state-copy plans, built natively from the manager's own
//! tables: what vLLM's worker computes per step in Python
//! (`preprocess_mamba` + `collect_mamba_copy_meta`, and the decisions of
//! `postprocess_mamba_fused_kernel`), as compact int32 rows for one kernel
//! launch. Row formats are those of `hybridcache.kernels`.

use crate::error::{invalid, CoreResult};
use crate::{cdiv, ReqSlot};

/// Pre-forward row: group, dst, conv src, temporal src, bias.
pub type PreRow = [i32; 5];

/// What the planner remembers per request between steps (worker state).
#[derive(Debug, Clone, Default)]
pub struct PlannerState {
    /// `mamba_state_idx`: the running-state index after the last plan.
    state_idx: Vec<Option<i64>>,
}

impl PlannerState {
    pub fn state_idx(&self, slot: ReqSlot) -> Option<i64> {
        self.state_idx.get(slot as usize).copied().flatten()
    }

    pub fn set_state_idx(&mut self, slot: ReqSlot, idx: i64) {
        let i = slot as usize;
        if i >= self.state_idx.len() {
            self.state_idx.resize(i + 1, None);
        }
        self.state_idx[i] = Some(idx);
    }

    pub fn forget(&mut self, slot: ReqSlot) {
        if let Some(s) = self.state_idx.get_mut(slot as usize) {
            *s = None;
        }
    }
}

/// The request's inputs to one plan row set.
pub struct PlanRequest<'a> {
    /// The worker's block ids per Mamba align group.
    pub views: Vec<&'a [u32]>,
    pub num_computed: usize,
    pub num_scheduled: usize,
    pub prev_state_idx: Option<i64>,
}

fn id(view: &[u32], idx: i64, what: &str, req: usize) -> CoreResult<i32> {
    match usize::try_from(idx).ok().and_then(|i| view.get(i)) {
        Some(&b) => Ok(b as i32),
        None => invalid(format!(
            "request {req}: {what} index {idx} outside its {} block ids",
            view.len()
        )),
    }
}

/// Pre-forward copy rows for one request; returns its new state index.
/// `num_accepted` is the worker's count from the previous step (1 if none).
pub fn pre_rows(
    req: usize,
    r: &PlanRequest<'_>,
    num_accepted: i64,
    block_size: usize,
    out: &mut Vec<PreRow>,
) -> CoreResult<i64> {
    let b = block_size as i64;
    let prev = r
        .prev_state_idx
        .unwrap_or((r.num_computed as i64 - 1).div_euclid(b));
    let cur = cdiv(r.num_computed + r.num_scheduled, block_size) as i64 - 1;
    if prev != -1 && prev != cur {
        let bias = num_accepted - 1;
        if bias < 0 {
            return invalid(format!(
                "request {req}: num_accepted must be >= 1, got {num_accepted}"
            ));
        }
        for (g, view) in r.views.iter().enumerate() {
            out.push([
                g as i32,
                id(view, cur, "cur", req)?,
                id(view, prev, "prev", req)?,
                id(view, prev + bias, "prev + bias", req)?,
                bias as i32,
            ]);
        }
    }
    Ok(cur)
}

/// Post-verification rows (vLLM's fused postprocess decisions for every
/// possible acceptance count), one per (request, group) where any copies:
/// `[group, req, (dst, conv_src, temp_src, bias, reset) * (k + 1)]`.
pub fn post_rows(
    req: usize,
    r: &PlanRequest<'_>,
    state_idx: i64,
    num_draft: usize,
    num_spec: usize,
    block_size: usize,
    out: &mut Vec<i32>,
) -> CoreResult<()> {
    if num_draft > num_spec {
        return invalid(format!(
            "request {req}: {num_draft} drafts > num_speculative_blocks {num_spec}"
        ));
    }
    let running = (r.num_computed + r.num_scheduled) as i64 - num_draft as i64;
    let b = block_size as i64;
    // (copy, dst index, bias, reset) for a = j + 1 accepted tokens.
    let decisions: Vec<Option<(bool, i64, i64, bool)>> = (0..=num_spec as i64)
        .map(|j| {
            if j > num_draft as i64 {
                return None;
            }
            let aligned = (running + j).div_euclid(b) * b;
            if aligned < running {
                return None;
            }
            let bias = aligned - running;
            let dst = aligned / b - 1;
            let reset = state_idx == dst;
            Some((!(reset && bias == 0), dst, bias, reset))
        })
        .collect();
    if !decisions.iter().any(|d| d.is_some_and(|d| d.0)) {
        return Ok(());
    }
    for (g, view) in r.views.iter().enumerate() {
        out.push(g as i32);
        out.push(req as i32);
        for d in &decisions {
            match *d {
                None => out.extend([-1, -1, -1, 0, 0]),
                Some((false, _, _, reset)) => out.extend([-1, -1, -1, 0, i32::from(reset)]),
                Some((true, dst, bias, reset)) => out.extend([
                    id(view, dst, "dst", req)?,
                    id(view, state_idx, "src", req)?,
                    id(view, state_idx + bias, "src + bias", req)?,
                    bias as i32,
                    i32::from(reset),
                ]),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(views: Vec<&'a [u32]>, nc: usize, ns: usize, prev: Option<i64>) -> PlanRequest<'a> {
        PlanRequest {
            views,
            num_computed: nc,
            num_scheduled: ns,
            prev_state_idx: prev,
        }
    }

    #[test]
    fn decode_crossing_a_block_copies_the_running_state() {
        // B=4, k=0: running block 1 -> 2 when token 9 is scheduled.
        let view: &[u32] = &[0, 7, 9];
        let mut out = Vec::new();
        let cur = pre_rows(0, &req(vec![view], 8, 1, Some(1)), 1, 4, &mut out).unwrap();
        assert_eq!(cur, 2);
        assert_eq!(out, vec![[0, 9, 7, 7, 0]]);
        out.clear();
        // Same block: nothing to copy.
        assert_eq!(
            pre_rows(0, &req(vec![view], 9, 1, Some(2)), 1, 4, &mut out).unwrap(),
            2
        );
        assert!(out.is_empty());
    }

    #[test]
    fn accepted_offset_selects_temporal_source() {
        // B=4, k=2: prev=2 -> cur=cdiv(14, 4)-1=3, two drafts accepted: bias 2.
        let view: &[u32] = &[0, 100, 101, 102, 103, 104];
        let mut out = Vec::new();
        pre_rows(0, &req(vec![view, view], 11, 3, Some(2)), 3, 4, &mut out).unwrap();
        assert_eq!(out, vec![[0, 102, 101, 103, 2], [1, 102, 101, 103, 2]]);
        assert!(pre_rows(0, &req(vec![view], 11, 3, Some(2)), 0, 4, &mut out).is_err());
    }

    #[test]
    fn new_request_without_state_copies_nothing() {
        let view: &[u32] = &[5];
        let mut out = Vec::new();
        assert_eq!(
            pre_rows(0, &req(vec![view], 0, 3, None), 1, 4, &mut out).unwrap(),
            0
        );
        assert!(out.is_empty());
    }

    #[test]
    fn post_rows_only_when_a_boundary_is_crossed() {
        let view: &[u32] = &[0, 100, 101, 102, 103, 104];
        let mut out = Vec::new();
        // running = 12 + 3 - 2 = 13; state 3; accepting 3 reaches token 15 -> no boundary.
        post_rows(0, &req(vec![view], 12, 3, None), 3, 2, 2, 4, &mut out).unwrap();
        assert!(out.is_empty());
        // running = 10 + 3 - 2 = 11, state 2: a=2 crosses 12 (bias 1 -> dst 2 == src: reset+copy).
        post_rows(0, &req(vec![view], 10, 3, None), 2, 2, 2, 4, &mut out).unwrap();
        assert_eq!(out.len(), 2 + 5 * 3);
        assert_eq!(&out[..2], &[0, 0]);
    }
}

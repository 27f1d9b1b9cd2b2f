//! The calls later vLLM releases added to the manager (0.24+ deferred
//! frees, the watermark, scheduler-recorded stats), shared by the methods
//! in `native_manager.rs`. What each means is the core's; this converts.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::{count_obj, guard, req_attr};
use crate::native_manager::NativeManager;

/// vLLM 0.24+'s watermark: blocks an admission leaves free, and the
/// request statuses it applies to (`RequestStatus.WAITING` / `PREEMPTED`,
/// the facade's objects, compared by equality).
#[derive(Default)]
pub(crate) struct Watermark {
    pub(crate) blocks: usize,
    pub(crate) statuses: Vec<PyObject>,
}

impl NativeManager {
    /// The manager follows vLLM 0.23.0, whose API lacks the later calls
    /// and parameters.
    pub(crate) fn is_0_23(&self) -> bool {
        self.inner.profile().release == "0.23.0"
    }

    /// How many `allocate_slots` parameters this manager's release has.
    pub(crate) fn num_allocate_params(&self) -> usize {
        if self.is_0_23() {
            crate::allocate_params::NUM_PARAMS_0_23
        } else {
            crate::allocate_params::NUM_PARAMS
        }
    }

    /// The watermark an allocation for `request` must leave free (the
    /// caller knows another request is scheduled this step): the request
    /// is waiting or preempted.
    pub(crate) fn watermark_for(&self, request: &Bound<'_, PyAny>) -> PyResult<usize> {
        if self.watermark.blocks == 0 {
            return Ok(0);
        }
        let status = req_attr(request, intern!(request.py(), "status"))?;
        for s in &self.watermark.statuses {
            if status.eq(s)? {
                return Ok(self.watermark.blocks);
            }
        }
        Ok(0)
    }

    /// Checks that `groups` is an iterable of this manager's group indices.
    /// Group indices, checked, as a bit mask (bit i: group i).
    pub(crate) fn group_mask(&self, name: &str, groups: &Bound<'_, PyAny>) -> PyResult<u64> {
        let n = self.inner.num_groups();
        let mut mask = 0u64;
        for g in groups.try_iter().map_err(|e| {
            crate::convert::or_caller(groups.py(), e, || {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "{name} must be an iterable of group indices"
                ))
            })
        })? {
            let g = count_obj(name, &g?)?;
            if g >= n {
                return Err(PyValueError::new_err(format!(
                    "{name}: group {g} out of range: the manager has {n} groups"
                )));
            }
            // Masks hold 64 groups; no model comes near that.
            mask |= 1u64.checked_shl(g as u32).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{name}: group {g}: at most 64 groups are supported"
                ))
            })?;
        }
        Ok(mask)
    }

    /// `pop_blocks_for_free`: the request's block ids, still referenced.
    pub(crate) fn pop_handed_out(&mut self, request_id: &str) -> Vec<u32> {
        self.inner.pop_blocks_for_free(request_id)
    }

    /// `block_pool.free_blocks(blocks)` for blocks `pop_blocks_for_free`
    /// handed out: block objects (with `block_id`) or ids, in eviction order.
    pub(crate) fn free_handed_out(&mut self, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = blocks.py();
        let mut ids = Vec::new();
        for b in blocks.try_iter()? {
            let b = b?;
            let id = match b.getattr(intern!(py, "block_id")) {
                Ok(id) => id,
                Err(_) => b,
            };
            ids.push(self.block_id(count_obj("block_id", &id)? as i64)?);
        }
        guard(|| self.inner.free_handed_out(&ids))
    }

    /// `block_hash_num_tokens` for a list of block ids.
    pub(crate) fn hash_num_tokens(
        &self,
        block_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<u32>>> {
        let pool = self.inner.pool();
        crate::convert::int_list("block_ids", block_ids, false)?
            .into_iter()
            .map(|b| Ok(pool.block_hash_num_tokens(self.block_id(b)?)))
            .collect()
    }

    /// vLLM 0.33.0's `take_boundary_state_offloads`, drained: {request id:
    /// [(group, block id, boundary tokens), ...]}, requests in the order of
    /// their first entry. Built here: at 1024 running a step has hundreds.
    pub(crate) fn boundary_state_offloads<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let mut lists: std::collections::HashMap<u32, Bound<'py, PyList>> = Default::default();
        for (slot, group, block, tokens) in self.inner.take_boundary_state_offloads() {
            let list = match lists.entry(slot) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let list = PyList::empty(py);
                    out.set_item(self.inner.request_id_at(slot), &list)?;
                    e.insert(list)
                }
            };
            list.append((group, block, tokens))?;
        }
        Ok(out)
    }
}

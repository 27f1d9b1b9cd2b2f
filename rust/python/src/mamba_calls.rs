//! `NativeManager`'s calls for Mamba layers: a request's align state, the
//! state-copy plans around a speculative step, and the align boundary
//! states cached for a KV connector to offload.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyList, PyString};

use crate::call_guard::{borrow, borrow_mut, enter};
use crate::convert::{count_obj, guard, int_list};
use crate::native_manager::NativeManager;

#[pymethods]
impl NativeManager {
    /// Mamba align state of a request in a group:
    /// (last_state_block_idx or None, allocated), or None.
    fn align_state(
        slf: &Bound<'_, Self>,
        request_id: &str,
        group: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Option<usize>, bool)>> {
        let group = count_obj("group", group)?;
        Ok(borrow(slf)?
            .inner
            .align_state(request_id, group)
            .map(|a| (a.last_state_block_idx, a.allocated)))
    }

    /// Pre-forward Mamba state-copy plan of this step (int32 rows of
    /// `group, dst, conv_src, temp_src, bias`, little endian) for the batch
    /// `request_ids`, given the worker's accepted-token counts.
    fn mamba_pre_copy_plan<'py>(
        slf: &Bound<'py, Self>,
        request_ids: Vec<String>,
        num_accepted: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let py = slf.py();
        let _in_call = enter(slf, "mamba_pre_copy_plan")?;
        let num_accepted = int_list("num_accepted", num_accepted, false)?;
        let ids: Vec<&str> = request_ids.iter().map(String::as_str).collect();
        let mut this = borrow_mut(slf)?;
        let rows = guard(|| this.inner.mamba_pre_copy_plan(&ids, &num_accepted))?;
        let bytes: Vec<u8> = rows
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        Ok(PyByteArray::new(py, &bytes))
    }

    /// Post-verification selection plan: (int32 rows as bytes, columns).
    fn mamba_post_select_plan<'py>(
        slf: &Bound<'py, Self>,
        request_ids: Vec<String>,
        num_draft: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyByteArray>, usize)> {
        let num_draft: Vec<usize> = int_list("num_draft", num_draft, true)?
            .into_iter()
            .map(|d| d as usize)
            .collect();
        let ids: Vec<&str> = request_ids.iter().map(String::as_str).collect();
        let this = borrow(slf)?;
        let (rows, cols) = guard(|| this.inner.mamba_post_select_plan(&ids, &num_draft))?;
        let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok((PyByteArray::new(slf.py(), &bytes), cols))
    }

    /// Mamba align boundary states cached since the last take: {request
    /// id: [(group, block id, boundary tokens), ...]}, oldest first.
    fn _take_boundary_state_offloads<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let _in_call = enter(slf, "take_boundary_state_offloads")?;
        borrow_mut(slf)?.boundary_state_offloads(slf.py())
    }
}

impl NativeManager {
    /// vLLM's `take_boundary_state_offloads`, drained: {request id:
    /// [(group, block id, boundary tokens), ...]}, requests in the order of
    /// their first entry. Built here: at 1024 running a step has hundreds.
    /// Each request's list is found by its slot (a dense index), and keyed
    /// by the id str the manager holds for it (its hash already computed)
    /// while that is still the id the core has for the slot.
    pub(crate) fn boundary_state_offloads<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let offloads = self.inner.take_boundary_state_offloads();
        if offloads.is_empty() {
            return Ok(out);
        }
        let mut lists: Vec<Option<Bound<'py, PyList>>> = vec![None; self.inner.slot_capacity()];
        for (slot, group, block, tokens) in offloads {
            let at = slot as usize;
            if at >= lists.len() {
                lists.resize(at + 1, None);
            }
            let list = match &mut lists[at] {
                Some(list) => list,
                empty => {
                    let list = PyList::empty(py);
                    out.set_item(self.request_id_str(py, slot), &list)?;
                    empty.insert(list)
                }
            };
            list.append((group, block, tokens))?;
        }
        Ok(out)
    }

    /// The id of the request in `slot`, as a str: the one held for the
    /// slot when it reads the same, else a new one.
    fn request_id_str<'py>(&self, py: Python<'py>, slot: u32) -> Bound<'py, PyString> {
        let id = self.inner.request_id_at(slot);
        match self.ids.id_at(slot).map(|held| held.bind(py)) {
            Some(held) if held.to_str().is_ok_and(|s| s == id) => held.clone(),
            _ => PyString::new(py, id),
        }
    }
}

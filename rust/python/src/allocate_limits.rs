//! What an allocation leaves alone: the watermark of free blocks an
//! admission keeps (`Watermark`), and the groups it skips zeroing, as a
//! mask.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;

use crate::convert::{count_obj, req_attr};
use crate::native_manager::NativeManager;

impl NativeManager {
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
}

//! Reading the arguments the Python methods share: optional counts and
//! flags as PyO3 gives them, and a request's id.

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::convert::{count_obj, req_attr, type_name};

/// An optional count: 0 when left out (or None, Python's usual "default");
/// otherwise an int >= 0, the error naming the argument.
pub(crate) fn opt_count(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    v.map_or(Ok(0), |v| count_obj(name, v))
}

/// `AllocateArgs::num_tokens` before `request.num_tokens` is read (see
/// `NativeManager::allocate_one`): as an upper bound it keeps the no-op
/// decode test exact.
pub(crate) const NUM_TOKENS_UNREAD: usize = usize::MAX;

pub(crate) fn request_id<'py>(request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    let rid = req_attr(request, intern!(request.py(), "request_id"))?;
    if let Ok(s) = rid.downcast::<PyString>() {
        return Ok(s.clone());
    }
    Err(PyTypeError::new_err(format!(
        "request.request_id must be str, got {}",
        type_name(&rid)
    )))
}

/// An optional flag: False when left out (or None); otherwise a bool.
pub(crate) fn opt_flag(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    match v {
        None => Ok(false),
        Some(v) if v.is_none() => Ok(false),
        Some(v) => v.extract::<bool>().map_err(|e| {
            crate::convert::or_caller(v.py(), e, || {
                PyTypeError::new_err(format!("{name} must be a bool, got {}", type_name(v)))
            })
        }),
    }
}

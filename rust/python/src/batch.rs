//! `allocate_decode_arrays` conversion: the core runs the batch
//! (`KvCacheManager::allocate_decode_batch`); this reads the requests'
//! `block_hashes` when the core asks for them.

use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};

use hybridcache_core::{BatchResult, DecodeBatch};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::convert::{fill_hash_update, to_py_err};
use crate::NativeManager;

/// The per-request inputs of one step, as typed slices.
pub struct DecodeArrays<'a> {
    pub handles: Cow<'a, [u64]>,
    pub num_new_tokens: Cow<'a, [u32]>,
    pub num_computed_tokens: Cow<'a, [u32]>,
    pub num_tokens: Cow<'a, [u32]>,
    pub lookahead: usize,
}

/// A core error or the Python error of a hash read.
struct BatchErr(PyErr);

impl From<hybridcache_core::CoreError> for BatchErr {
    fn from(e: hybridcache_core::CoreError) -> Self {
        BatchErr(to_py_err(e))
    }
}

/// Runs one step. `requests[i]` is read only for `block_hashes`, and only
/// when request i fills a block.
pub fn run(
    state: &mut NativeManager,
    py: Python<'_>,
    a: &DecodeArrays<'_>,
    requests: Option<&Bound<'_, PyList>>,
    events_on: bool,
) -> PyResult<BatchResult> {
    let batch = DecodeBatch {
        handles: &a.handles,
        num_new_tokens: &a.num_new_tokens,
        num_computed_tokens: &a.num_computed_tokens,
        num_tokens: &a.num_tokens,
        lookahead: a.lookahead,
    };
    let (inner, scratch) = (&mut state.inner, &mut state.batch);
    let fill = |i: usize, known: usize, id: &str, out: &mut _| -> Result<bool, BatchErr> {
        let Some(reqs) = requests else {
            return Err(BatchErr(PyValueError::new_err(format!(
                "request {id:?} fills a block this step: pass requests= so its block_hashes can be read"
            ))));
        };
        let hashes = reqs
            .get_item(i)
            .and_then(|r| r.getattr(intern!(py, "block_hashes")))
            .map_err(BatchErr)?;
        fill_hash_update(&hashes, known, out).map_err(BatchErr)
    };
    match catch_unwind(AssertUnwindSafe(|| {
        inner.allocate_decode_batch(&batch, scratch, events_on, fill)
    })) {
        Ok(r) => r.map_err(|e| e.0),
        Err(_) => Err(PyRuntimeError::new_err(
            "hybridcache core panicked (bug); state may be inconsistent",
        )),
    }
}

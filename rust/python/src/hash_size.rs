//! The hash block size of hybridcache's own `Request`: each request
//! carries the size its `block_hashes` were made at, and a manager hashing
//! at another size refuses it where its hashes would be used (a lookup, an
//! admission), with a ValueError naming both sizes. A hash of another size
//! covers other tokens than the manager's block of the same index, so two
//! such requests would match each other's wrong blocks: only refusing them
//! keeps every hit true. Other request types (vLLM's) are not asked.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyType;

/// `hybridcache.request.Request`, registered when that module is imported.
static REQUEST_CLASS: GILOnceCell<Py<PyType>> = GILOnceCell::new();

/// Registers hybridcache's `Request` class (whose instances carry
/// `_hash_block_size`); later calls must name the same class.
#[pyfunction]
pub(crate) fn _register_request_class(cls: &Bound<'_, PyType>) -> PyResult<()> {
    let mine = REQUEST_CLASS.get_or_init(cls.py(), || cls.clone().unbind());
    if !mine.is(cls) {
        return Err(PyValueError::new_err(
            "another Request class is registered already",
        ));
    }
    Ok(())
}

/// ValueError when `request` is a hybridcache `Request` hashed at another
/// size than `hash_block_size` (a request without hashes passes).
pub(crate) fn check(request: &Bound<'_, PyAny>, hash_block_size: u32) -> PyResult<()> {
    let py = request.py();
    let Some(cls) = REQUEST_CLASS.get(py) else {
        return Ok(());
    };
    if !request.is_instance(cls.bind(py))? {
        return Ok(());
    }
    let size = request.getattr(intern!(py, "_hash_block_size"))?;
    if size.is_none() {
        return Ok(());
    }
    match size.extract::<u64>() {
        Ok(s) if s == u64::from(hash_block_size) => Ok(()),
        _ => Err(PyValueError::new_err(format!(
            "request {} was hashed at hash_block_size={size} but this manager hashes at \
             hash_block_size={hash_block_size}: build it with Request(..., hash_block_size={hash_block_size})",
            request
                .getattr(intern!(py, "request_id"))
                .map_or_else(|_| "?".to_string(), |r| format!("{r}"))
        ))),
    }
}

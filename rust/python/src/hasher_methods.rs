//! `BlockHasher`'s Python methods, its registration with the module
//! (with `hash_keys`' functions), and `native_token_append`.

use hybridcache_core::block_hasher::{BlockHashError, BlockHasher as CoreHasher, HashFn};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::hash_keys::{hashing_for, value_err};
use crate::hasher::{BlockHasher, Scratch};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlockHasher>()?;
    m.add_function(wrap_pyfunction!(native_token_append, m)?)?;
    crate::hash_keys::register(m)
}

/// A method descriptor for vLLM's `Request` class (`request_class`) standing
/// for its `append_output_token_ids` (`append`) and hashing appended tokens
/// with a request's `BlockHasher` in the same call (see
/// `raw_ffi::append_call`); `update` is the class's `update_block_hashes`.
/// None without the `raw-ffi` feature: vLLM's method stays.
#[pyfunction]
fn native_token_append(
    request_class: &Bound<'_, pyo3::types::PyType>,
    append: PyObject,
    update: PyObject,
) -> PyResult<Option<PyObject>> {
    #[cfg(feature = "raw-ffi")]
    return crate::raw_ffi::append_call::token_append(request_class, append, update).map(Some);
    #[cfg(not(feature = "raw-ffi"))]
    {
        let _ = (request_class, append, update);
        Ok(None)
    }
}

#[pymethods]
impl BlockHasher {
    #[new]
    #[pyo3(signature = (hash_name, block_size, none_hash, extra_keys_fn=None, profile="whole-block-hits", num_hash_lookahead_tokens=0))]
    fn new(
        hash_name: &str,
        block_size: i64,
        none_hash: Bound<'_, PyBytes>,
        extra_keys_fn: Option<PyObject>,
        profile: &str,
        num_hash_lookahead_tokens: i64,
    ) -> PyResult<Self> {
        let hashing = hashing_for(profile)?;
        let lookahead = usize::try_from(num_hash_lookahead_tokens).map_err(|_| {
            PyValueError::new_err(format!(
                "num_hash_lookahead_tokens must be >= 0, got {num_hash_lookahead_tokens}"
            ))
        })?;
        if lookahead > 0 && !hashing.lookahead_hash_tokens {
            return Err(PyValueError::new_err(format!(
                "profile {profile} has no lookahead hashes: num_hash_lookahead_tokens must be 0, \
                 got {lookahead}"
            )));
        }
        let hash_fn = HashFn::from_name(hash_name).map_err(value_err)?;
        let block_size = usize::try_from(block_size)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                PyValueError::new_err(format!("block_size must be > 0, got {block_size}"))
            })?;
        let core = CoreHasher::new(hash_fn, block_size, none_hash.as_bytes()).map_err(value_err)?;
        if let Some(f) = &extra_keys_fn {
            if !f.bind(none_hash.py()).is_callable() {
                return Err(PyTypeError::new_err("extra_keys_fn must be callable"));
            }
        }
        Ok(Self {
            core,
            none_hash: none_hash.unbind(),
            extra_keys_fn,
            hashing,
            lookahead,
        })
    }

    #[getter]
    fn hash_name(&self) -> &'static str {
        self.hash_fn().name()
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.core.block_size()
    }

    /// `num_hash_lookahead_tokens`: tokens after a block its hash covers.
    #[getter]
    fn num_hash_lookahead_tokens(&self) -> usize {
        self.lookahead
    }

    #[getter]
    fn none_hash(&self, py: Python<'_>) -> Py<PyBytes> {
        self.none_hash.clone_ref(py)
    }

    /// Length of a block hash in bytes: 32 (sha256*) or 16 (xxhash*).
    #[getter]
    fn digest_size(&self) -> usize {
        self.hash_fn().digest_len()
    }

    /// The hash function on already serialized bytes (`hashlib.sha256(data)
    /// .digest()` or `xxhash.xxh3_128_digest(data)`).
    fn digest<'py>(&self, py: Python<'py>, data: &[u8]) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.hash_fn().digest(data).as_bytes())
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockHasher({:?}, block_size={})",
            self.hash_fn().name(),
            self.core.block_size()
        )
    }

    /// vLLM's `hash_block_tokens(hash_fn, parent, token_ids, extra_keys)`.
    #[pyo3(signature = (parent, token_ids, extra_keys=None))]
    fn hash_block<'py>(
        &self,
        py: Python<'py>,
        parent: Option<&Bound<'py, PyAny>>,
        token_ids: &Bound<'py, PyAny>,
        extra_keys: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let parent = self.resolve_parent(parent, py)?;
        let none = py.None().into_bound(py);
        let extra = extra_keys.unwrap_or(&none);
        self.block(
            py,
            &mut Scratch::for_block(token_ids.len()?),
            &parent,
            token_ids,
            0,
            token_ids.len()?,
            extra,
        )
    }

    /// Hashes of the full blocks of `token_ids` from block `start_block` on,
    /// chained from `parent` (the hash of block `start_block - 1`, or None).
    /// `extra_keys_per_block[i]` (None or a tuple) belongs to the i-th
    /// hashed block; it must have one entry per hashed block.
    #[pyo3(signature = (token_ids, parent=None, start_block=0, extra_keys_per_block=None))]
    fn hash_blocks<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        parent: Option<&Bound<'py, PyAny>>,
        start_block: i64,
        extra_keys_per_block: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let start_block = usize::try_from(start_block).map_err(|_| {
            PyValueError::new_err(format!("start_block must be >= 0, got {start_block}"))
        })?;
        let tokens =
            if token_ids.is_instance_of::<PyList>() || token_ids.is_instance_of::<PyTuple>() {
                token_ids.clone()
            } else {
                py.get_type::<PyList>().call1((token_ids,))?
            };
        let bs = self.core.block_size();
        let n = self.core.num_new_blocks(tokens.len()?, start_block);
        if let Some(e) = extra_keys_per_block {
            let got = e.len()?;
            if got != n {
                return Err(value_err(BlockHashError::ExtraKeysLength {
                    expected: n,
                    got,
                }));
            }
        }
        let out = PyList::empty(py);
        let none = py.None().into_bound(py);
        let mut parent = self.resolve_parent(parent, py)?;
        let mut s = Scratch::for_block(bs);
        for i in 0..n {
            let start = (start_block + i) * bs;
            let extra = match extra_keys_per_block {
                Some(e) => e.get_item(i)?,
                None => none.clone(),
            };
            let h = self.block(py, &mut s, &parent, &tokens, start, start + bs, &extra)?;
            out.append(&h)?;
            parent = h.into_any();
        }
        Ok(out)
    }

    /// vLLM's `request_block_hasher(request)`: hashes of the request's full
    /// blocks after `len(request.block_hashes)` (whose lookahead tokens
    /// exist), from `request.all_token_ids` and `request.num_tokens` (read
    /// as the `_all_token_ids` list and its length where the request has
    /// one, as vLLM's and hybridcache's do) and its extra keys.
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.hash_new_blocks(py, request)
    }

    /// This hasher as the engine calls it: with the `raw-ffi` feature a
    /// one-argument builtin bound to it (see `raw_ffi::hasher_call`), else
    /// the hasher itself. Same results either way.
    fn _bound_call(slf: &Bound<'_, Self>) -> PyResult<PyObject> {
        #[cfg(feature = "raw-ffi")]
        return crate::raw_ffi::hasher_call::bound_hasher(slf);
        #[cfg(not(feature = "raw-ffi"))]
        return Ok(slf.clone().into_any().unbind());
    }
}

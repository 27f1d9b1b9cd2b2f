//! PyO3 binding of `hybridcache_core::block_hasher`: vLLM's request block
//! hasher (a behaviour profile's hashing rules), natively. Reads the
//! request's attributes and converts the values; the rules, encoding and
//! digests live in the core crate.
//!
//! Values the core cannot encode exactly (a token that is not a plain int in
//! i64 range, an extra key of another type, a pickle that would reuse a memo
//! entry or span several frames) are serialized here by Python's own
//! `cbor2.dumps(x, canonical=True)` / `pickle.dumps(x, HIGHEST_PROTOCOL)`,
//! as vLLM does, and digested natively; the result is the same either way.

use hybridcache_core::block_hasher::{
    extra_keys, hashable_tokens, lookahead_key, lookahead_rewind, resume_index, BlockHashError,
    BlockHasher as CoreHasher, Digest, Encoding, HashFn,
};
use hybridcache_core::profile::{Hashing, MmStart};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PySlice, PyTuple};

use crate::convert::type_name;
use crate::hash_keys::{
    attr_or_none, keys_value, mm_ends, read_tokens, request_keys, tuple_keys, value_err, PyKeys,
};

/// Scratch space reused across the blocks of one call.
pub(crate) struct Scratch {
    buf: Vec<u8>,
    tokens: Vec<i64>,
    ids: Vec<usize>,
}

impl Scratch {
    /// Room for a block of `n` tokens without growing (a key-free block
    /// encodes to at most ~40 + 9n bytes).
    pub(crate) fn for_block(n: usize) -> Self {
        Self {
            buf: Vec::with_capacity(64 + 9 * n),
            tokens: Vec::with_capacity(n),
            ids: Vec::new(),
        }
    }
}

/// vLLM's request block hasher under a named profile's rules (`profile`),
/// bit-identical for `sha256_cbor`, `xxhash_cbor`, `sha256` and `xxhash`.
///
/// `BlockHasher(hash_name, block_size, none_hash, extra_keys_fn=None,
/// profile="whole-block-hits", num_hash_lookahead_tokens=0)`; `none_hash` is vLLM's
/// `NONE_HASH`. Calling it with a request is
/// `get_request_block_hasher(block_size, hash_fn[, L])(request)`: the
/// hashes of the request's new full blocks (with L > 0, where the profile has lookahead hashes, those
/// whose L next tokens exist). Extra keys for LoRA and cache salt are built
/// natively; for requests with multimodal features or prompt embeds
/// `extra_keys_fn(request, start, end, mm_idx) -> (keys | None, mm_idx)`
/// (the release's `generate_block_hash_extra_keys`) is called per block,
/// over the block's window (the block and its L next tokens).
#[pyclass(module = "hybridcache._native", name = "BlockHasher", frozen)]
pub struct BlockHasher {
    pub(crate) core: CoreHasher,
    pub(crate) none_hash: Py<PyBytes>,
    pub(crate) extra_keys_fn: Option<PyObject>,
    /// The profile's rules (extra-key form, multimodal resume index).
    pub(crate) hashing: Hashing,
    /// `num_hash_lookahead_tokens`: tokens after a block its hash covers.
    pub(crate) lookahead: usize,
}

impl BlockHasher {
    pub(crate) fn hash_fn(&self) -> HashFn {
        self.core.hash_fn()
    }

    /// vLLM's `if not parent_block_hash: parent_block_hash = NONE_HASH`.
    pub(crate) fn resolve_parent<'py>(
        &self,
        parent: Option<&Bound<'py, PyAny>>,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(p) = parent else {
            return Ok(self.none_hash.bind(py).clone().into_any());
        };
        let empty = match p.downcast_exact::<PyBytes>() {
            Ok(b) => b.as_bytes().is_empty(),
            Err(_) => !p.is_truthy()?,
        };
        Ok(if empty {
            self.none_hash.bind(py).clone().into_any()
        } else {
            p.clone()
        })
    }

    /// The native path; None where only Python's serializer is exact.
    pub(crate) fn try_native(
        &self,
        s: &mut Scratch,
        parent: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        start: usize,
        end: usize,
        extra: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Digest>> {
        let Ok(parent) = parent.downcast_exact::<PyBytes>() else {
            return Ok(None);
        };
        if !read_tokens(tokens, start, end, &mut s.tokens)? {
            return Ok(None);
        }
        s.ids.clear();
        let keys = if extra.is_none() {
            None
        } else {
            let Ok(t) = extra.downcast_exact::<PyTuple>() else {
                return Ok(None);
            };
            match tuple_keys(t, &mut s.ids)? {
                Some(k) => Some(k),
                None => return Ok(None),
            }
        };
        if self.hash_fn().encoding() == Encoding::Pickle && !s.ids.is_empty() {
            // Pickle writes an object seen twice as a memo reference.
            s.ids.push(parent.as_ptr() as usize);
            s.ids.sort_unstable();
            if s.ids.windows(2).any(|w| w[0] == w[1]) {
                return Ok(None);
            }
        }
        s.buf.clear();
        match self
            .hash_fn()
            .encode_block(&mut s.buf, parent.as_bytes(), &s.tokens, keys.as_deref())
        {
            Ok(()) => Ok(Some(self.hash_fn().digest(&s.buf))),
            Err(BlockHashError::PickleTooLarge(_)) => Ok(None),
            Err(e) => Err(value_err(e)),
        }
    }

    /// `hash_fn((parent, tuple(tokens[start:end]), extra))` with Python's
    /// serializer and the native digest.
    pub(crate) fn python_hash(
        &self,
        parent: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        start: usize,
        end: usize,
        extra: &Bound<'_, PyAny>,
    ) -> PyResult<Digest> {
        let py = parent.py();
        let slice = PySlice::new(py, start as isize, end as isize, 1);
        let block = py.get_type::<PyTuple>().call1((tokens.get_item(slice)?,))?;
        let value = PyTuple::new(py, [parent.clone(), block, extra.clone()])?;
        let data = match self.hash_fn().encoding() {
            Encoding::Cbor => {
                let kw = PyDict::new(py);
                kw.set_item("canonical", true)?;
                py.import("cbor2")?
                    .getattr("dumps")?
                    .call((value,), Some(&kw))?
            }
            Encoding::Pickle => {
                let pickle = py.import("pickle")?;
                let proto = pickle.getattr("HIGHEST_PROTOCOL")?;
                pickle.getattr("dumps")?.call1((value, proto))?
            }
        };
        let data = data.downcast_into::<PyBytes>()?;
        Ok(self.hash_fn().digest(data.as_bytes()))
    }

    /// `hash_block_tokens` of `tokens[start:end]` under an already resolved parent.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn block<'py>(
        &self,
        py: Python<'py>,
        s: &mut Scratch,
        parent: &Bound<'py, PyAny>,
        tokens: &Bound<'py, PyAny>,
        start: usize,
        end: usize,
        extra: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let d = match self.try_native(s, parent, tokens, start, end, extra)? {
            Some(d) => d,
            None => self.python_hash(parent, tokens, start, end, extra)?,
        };
        Ok(PyBytes::new(py, d.as_bytes()))
    }
}

impl BlockHasher {
    /// Whether a request holding `have` block hashes and `num_tokens`
    /// tokens has a new full block to hash (whose lookahead tokens exist).
    #[inline]
    pub(crate) fn has_new_block(&self, have: usize, num_tokens: usize) -> bool {
        let bs = self.core.block_size();
        (have + 1) * bs <= hashable_tokens(num_tokens, self.lookahead)
    }

    /// `__call__`'s body: the hashes of the request's new full blocks.
    pub(crate) fn hash_new_blocks<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let bs = self.core.block_size();
        let la = self.lookahead;
        let out = PyList::empty(py);
        let hashes = request.getattr(intern!(py, "block_hashes"))?;
        let have = hashes.len()?;
        let mut start = have * bs;
        // The tokens and their count straight from vLLM's list where there is one.
        let (tokens, num_tokens) = match crate::convert::token_list(request)? {
            Some(t) => {
                let n = t.len();
                (t.into_any(), n)
            }
            // A token container that is not a list (vLLM's TokenBuffer):
            // itself, sliced once per block (`read_tokens`).
            None => match request
                .getattr(intern!(py, "_all_token_ids"))
                .ok()
                .filter(|t| t.hasattr(intern!(py, "tolist")).unwrap_or(false))
            {
                Some(t) => {
                    let n = t.len()?;
                    (t, n)
                }
                None => (
                    request.getattr(intern!(py, "all_token_ids"))?,
                    request.getattr(intern!(py, "num_tokens"))?.extract()?,
                ),
            },
        };
        if !self.has_new_block(have, num_tokens) {
            return Ok(out);
        }
        let num_tokens = hashable_tokens(num_tokens, la);
        let mut parent = if have > 0 {
            Some(hashes.get_item(have - 1)?)
        } else {
            None
        };

        // The release's generate_block_hash_extra_keys: lora, mm inputs,
        // cache salt (first block), prompt-embeds digest.
        let mode = self.hashing.extra_keys;
        let mm = attr_or_none(request, intern!(py, "mm_features"))?;
        let embeds = attr_or_none(request, intern!(py, "prompt_embeds"))?;
        let has_mm = mm.is_truthy()?;
        let in_python = has_mm || !embeds.is_none();
        let (lora, salt) = if in_python {
            (None, None)
        } else {
            request_keys(
                mode,
                &attr_or_none(request, intern!(py, "lora_request"))?,
                attr_or_none(request, intern!(py, "cache_salt"))?,
            )?
        };
        let extra_fn = match (&self.extra_keys_fn, in_python) {
            (Some(f), true) => Some(f.bind(py)),
            (None, true) => {
                return Err(PyValueError::new_err(format!(
                    "request has multimodal features or prompt embeds ({}); \
                     this BlockHasher was built without extra_keys_fn",
                    type_name(request)
                )))
            }
            (_, false) => None,
        };
        // Input ends, where the release's index rules read them.
        let ends = if has_mm && (la > 0 || self.hashing.mm_start != MmStart::LastInput) {
            mm_ends(&mm)?
        } else {
            Vec::new()
        };
        let mut mm_idx: i64 = resume_index(self.hashing.mm_start, &ends, start);
        let keys_of = PyKeys(py);
        let mut s = Scratch::for_block(bs);
        while start + bs <= num_tokens {
            let end = start + bs;
            let window_end = end + la;
            let keys = if let Some(f) = extra_fn {
                let (keys, idx): (Bound<'py, PyAny>, i64) =
                    f.call1((request, start, window_end, mm_idx))?.extract()?;
                // A window reaches into the next block: rescan its inputs.
                mm_idx = if la > 0 {
                    lookahead_rewind(&ends, end, idx)
                } else {
                    idx
                };
                keys
            } else {
                let mut keys: Vec<Bound<'py, PyAny>> = Vec::with_capacity(2);
                extra_keys(
                    &keys_of,
                    mode,
                    start,
                    lora.clone(),
                    [],
                    salt.clone(),
                    [],
                    &mut keys,
                )?;
                keys_value(py, keys)?
            };
            let extra = if la > 0 {
                let next = (end..window_end)
                    .map(|i| tokens.get_item(i))
                    .collect::<PyResult<Vec<_>>>()?;
                lookahead_key(&keys_of, Some(keys), next)?
            } else {
                keys
            };
            let p = self.resolve_parent(parent.as_ref(), py)?;
            let h = self.block(py, &mut s, &p, &tokens, start, end, &extra)?;
            out.append(&h)?;
            parent = Some(h.into_any());
            start = end;
        }
        Ok(out)
    }
}

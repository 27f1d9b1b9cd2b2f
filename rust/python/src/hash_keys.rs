//! What the native hasher reads from a request and how its values become
//! keys: the named profile's rules (its `hashing`), LoRA / salt keys,
//! multimodal input ends, token and key conversion to the core's types;
//! and the module functions `block_extra_keys` and `none_hash_seed`.

use hybridcache_core::block_hasher::{
    extra_keys, none_hash_seed as seed_rule, BlockHashError, HashFn, Key, KeyBuilder, NoneHashSeed,
};
use hybridcache_core::profile::{BehaviourProfile, ExtraKeyMode, Hashing};
use hybridcache_core::CoreError;
use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyList, PyString, PyTuple};

use crate::convert::type_name;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(block_extra_keys, m)?)?;
    m.add_function(wrap_pyfunction!(none_hash_seed, m)?)
}

pub(crate) fn hashing_for(profile: &str) -> PyResult<Hashing> {
    BehaviourProfile::named(profile)
        .map(|p| p.hashing)
        .map_err(|e| match e {
            CoreError::Unsupported(why) => crate::convert::to_py_err(CoreError::Unsupported(
                format!("no hashing rules: {why}"),
            )),
            e => crate::convert::to_py_err(e),
        })
}

/// Keys as Python objects; tags are interned strs, the objects vLLM's
/// literals are.
pub(crate) struct PyKeys<'py>(pub(crate) Python<'py>);

impl<'py> KeyBuilder for PyKeys<'py> {
    type Key = Bound<'py, PyAny>;
    type Error = PyErr;
    fn tuple(&self, items: Vec<Self::Key>) -> PyResult<Self::Key> {
        Ok(PyTuple::new(self.0, items)?.into_any())
    }
    fn tag(&self, tag: &'static str) -> Self::Key {
        PyString::intern(self.0, tag).into_any()
    }
    fn none(&self) -> Self::Key {
        self.0.None().into_bound(self.0)
    }
}

/// (LoRA (name, path), cache salt) of a request, each where it has one.
type RequestKeys<'py> = (
    Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    Option<Bound<'py, PyAny>>,
);

/// A request's `lora_request` and `cache_salt` as the keys they give: the
/// LoRA name (and path, where `mode` tags it) where a LoRA request is set,
/// the salt where it is non-empty.
pub(crate) fn request_keys<'py>(
    mode: ExtraKeyMode,
    lora_request: &Bound<'py, PyAny>,
    cache_salt: Bound<'py, PyAny>,
) -> PyResult<RequestKeys<'py>> {
    let py = lora_request.py();
    let lora = if lora_request.is_truthy()? {
        let name = lora_request.getattr(intern!(py, "lora_name"))?;
        let path = if mode.reads_lora_path() {
            lora_request.getattr(intern!(py, "lora_path"))?
        } else {
            py.None().into_bound(py)
        };
        Some((name, path))
    } else {
        None
    };
    let salt = cache_salt.is_truthy()?.then_some(cache_salt);
    Ok((lora, salt))
}

/// The core's extra keys as vLLM's value: None or a tuple.
pub(crate) fn keys_value<'py>(
    py: Python<'py>,
    keys: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    if keys.is_empty() {
        return Ok(py.None().into_bound(py));
    }
    Ok(PyTuple::new(py, keys)?.into_any())
}

/// `offset + length` of each of a request's multimodal inputs.
pub(crate) fn mm_ends(features: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let py = features.py();
    let mut ends = Vec::new();
    for f in features.try_iter()? {
        let pos = f?.getattr(intern!(py, "mm_position"))?;
        let offset: usize = pos.getattr(intern!(py, "offset"))?.extract()?;
        let length: usize = pos.getattr(intern!(py, "length"))?.extract()?;
        ends.push(offset + length);
    }
    Ok(ends)
}

/// What vLLM's `init_none_hash(hash_fn)` derives NONE_HASH from under a
/// profile's rules, given `$PYTHONHASHSEED`: the seed string to hash, or
/// None for 32 random bytes (whole-block-hits, without a seed). A random seed
/// (vLLM's xxhash* without one) is `os.urandom(32).hex()`.
#[pyfunction]
#[pyo3(signature = (hash_name, pythonhashseed=None, profile="whole-block-hits"))]
fn none_hash_seed(
    py: Python<'_>,
    hash_name: &str,
    pythonhashseed: Option<&str>,
    profile: &str,
) -> PyResult<Option<String>> {
    let hashing = hashing_for(profile)?;
    let hash_fn = HashFn::from_name(hash_name).map_err(value_err)?;
    Ok(
        match seed_rule(hashing.none_hash, hash_fn, pythonhashseed) {
            NoneHashSeed::Seed(s) => Some(s.to_owned()),
            NoneHashSeed::RandomBytes => None,
            NoneHashSeed::RandomHexSeed => Some(
                py.import("os")?
                    .getattr("urandom")?
                    .call1((32,))?
                    .call_method0("hex")?
                    .extract()?,
            ),
        },
    )
}

/// The extra keys of the block starting at token `start` (the core's
/// rule: `block_hasher::extra_keys`, in the release's form), from a
/// request's `lora_request` and `cache_salt` and the block's multimodal
/// `(identifier, offset)` pairs and prompt-embeds digest; `for_event`: in
/// the form KV events publish. None when there are none, as vLLM.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // Python's signature
#[pyo3(signature = (start, lora_request=None, mm_keys=None, cache_salt=None, prompt_embeds_keys=None, profile="whole-block-hits", for_event=false))]
fn block_extra_keys<'py>(
    py: Python<'py>,
    start: usize,
    lora_request: Option<Bound<'py, PyAny>>,
    mm_keys: Option<Vec<Bound<'py, PyAny>>>,
    cache_salt: Option<Bound<'py, PyAny>>,
    prompt_embeds_keys: Option<Vec<Bound<'py, PyAny>>>,
    profile: &str,
    for_event: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let mode = hashing_for(profile)?.extra_keys;
    let mode = if for_event { mode.event_form() } else { mode };
    let none = py.None().into_bound(py);
    let (lora, cache_salt) = request_keys(
        mode,
        lora_request.as_ref().unwrap_or(&none),
        cache_salt.unwrap_or_else(|| none.clone()),
    )?;
    let mut mm = Vec::new();
    for k in mm_keys.into_iter().flatten() {
        let pair = k
            .extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>()
            .map_err(|e| {
                crate::convert::or_caller(k.py(), e, || {
                    PyTypeError::new_err(format!(
                        "mm_keys items must be (identifier, offset) pairs, got {}",
                        type_name(&k)
                    ))
                })
            })?;
        mm.push(pair);
    }
    let mut keys = Vec::new();
    extra_keys(
        &PyKeys(py),
        mode,
        start,
        lora,
        mm,
        cache_salt,
        prompt_embeds_keys.into_iter().flatten(),
        &mut keys,
    )?;
    if keys.is_empty() {
        return Ok(None);
    }
    PyTuple::new(py, keys).map(Some)
}

pub(crate) fn value_err(e: BlockHashError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// `getattr(obj, name, None)`.
pub(crate) fn attr_or_none<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    match obj.getattr(name) {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyAttributeError>(obj.py()) => {
            Ok(obj.py().None().into_bound(obj.py()))
        }
        Err(e) => Err(e),
    }
}

/// Reads `seq[start:end]` into `out` as i64; false when an item is not an
/// exact int in i64 range (then Python serializes the block).
pub(crate) fn read_tokens(
    seq: &Bound<'_, PyAny>,
    start: usize,
    end: usize,
    out: &mut Vec<i64>,
) -> PyResult<bool> {
    out.clear();
    let push = |item: Bound<'_, PyAny>, out: &mut Vec<i64>| -> bool {
        if !item.is_exact_instance_of::<PyInt>() {
            return false;
        }
        match item.extract::<i64>() {
            Ok(v) => {
                out.push(v);
                true
            }
            Err(_) => false,
        }
    };
    if let Ok(list) = seq.downcast::<PyList>() {
        let end = end.min(list.len());
        for i in start..end {
            if !push(list.get_item(i)?, out) {
                return Ok(false);
            }
        }
    } else if let Ok(tuple) = seq.downcast::<PyTuple>() {
        let end = end.min(tuple.len());
        for i in start..end {
            if !push(tuple.get_item(i)?, out) {
                return Ok(false);
            }
        }
    } else {
        // Another sequence (vLLM's `array('i')`-based TokenBuffer,
        // whose slices are lists): one slice, not an item call per token.
        let end = end.min(seq.len()?);
        if start >= end {
            return Ok(true);
        }
        let slice = pyo3::types::PySlice::new(seq.py(), start as isize, end as isize, 1);
        let part = seq.get_item(slice)?;
        if let Ok(list) = part.downcast::<PyList>() {
            for item in list.iter() {
                if !push(item, out) {
                    return Ok(false);
                }
            }
        } else {
            for i in start..end {
                if !push(seq.get_item(i)?, out) {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

/// One extra key as a core [`Key`]; None when it has no exact native
/// encoding. `ids` collects the objects pickle would memoize.
pub(crate) fn to_key(v: &Bound<'_, PyAny>, ids: &mut Vec<usize>) -> PyResult<Option<Key>> {
    if v.is_none() {
        return Ok(Some(Key::None));
    }
    if let Ok(b) = v.downcast_exact::<PyBool>() {
        return Ok(Some(Key::Bool(b.is_true())));
    }
    if v.is_exact_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            return Ok(Some(Key::Int(i as i128)));
        }
        return Ok(v.extract::<i128>().ok().map(Key::Int));
    }
    if let Ok(s) = v.downcast_exact::<PyString>() {
        ids.push(s.as_ptr() as usize);
        // A str with lone surrogates has no UTF-8: Python decides.
        return Ok(s.to_str().ok().map(|s| Key::Str(s.to_owned())));
    }
    if let Ok(b) = v.downcast_exact::<PyBytes>() {
        ids.push(b.as_ptr() as usize);
        return Ok(Some(Key::Bytes(b.as_bytes().to_vec())));
    }
    if let Ok(t) = v.downcast_exact::<PyTuple>() {
        return Ok(tuple_keys(t, ids)?.map(Key::Tuple));
    }
    Ok(None)
}

pub(crate) fn tuple_keys(
    t: &Bound<'_, PyTuple>,
    ids: &mut Vec<usize>,
) -> PyResult<Option<Vec<Key>>> {
    if !t.is_empty() {
        ids.push(t.as_ptr() as usize); // the empty tuple is never memoized
    }
    let mut keys = Vec::with_capacity(t.len());
    for item in t.iter() {
        match to_key(&item, ids)? {
            Some(k) => keys.push(k),
            None => return Ok(None),
        }
    }
    Ok(Some(keys))
}

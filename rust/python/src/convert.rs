//! Conversions between Python objects and core arguments, with errors that
//! name the offending argument. No allocation decision is made here.

use std::sync::atomic::{AtomicUsize, Ordering};

use hybridcache_core::{
    BehaviourProfile, CoreError, GroupSpec, HashUpdate, MambaCheckpoints, MambaMode, ManagerConfig,
    SpecKind,
};
use pyo3::exceptions::{
    PyKeyError, PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyTuple};
use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub fn to_py_err(e: CoreError) -> PyErr {
    match e {
        CoreError::InvalidArgument(m) => PyValueError::new_err(m),
        CoreError::UnknownRequest(m) => PyKeyError::new_err(m),
        CoreError::Unsupported(m) => PyNotImplementedError::new_err(m),
        CoreError::Invariant(m) => PyRuntimeError::new_err(m),
    }
}

/// Runs a core call so that neither an error nor a panic crosses as a crash.
pub fn guard<T>(f: impl FnOnce() -> Result<T, CoreError>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(to_py_err),
        Err(_) => Err(PyRuntimeError::new_err(
            "hybridcache core panicked (bug); state may be inconsistent",
        )),
    }
}

/// Whether `e` was raised by the caller's Python code (a property,
/// `__index__`, `__len__`, ...): it carries a traceback, where an error
/// made by CPython's C code or by this binding has none. Such an error
/// propagates unchanged, never replaced by one naming the argument.
#[cold]
pub fn caller_raised(py: Python<'_>, e: &PyErr) -> bool {
    e.traceback(py).is_some()
}

/// `e` where the caller's code raised it, else the binding's own error `ours()`.
#[cold]
pub fn or_caller(py: Python<'_>, e: PyErr, ours: impl FnOnce() -> PyErr) -> PyErr {
    if caller_raised(py, &e) {
        e
    } else {
        ours()
    }
}

pub fn count(name: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {v}")))
}

/// A non-negative int argument; the error names it.
#[inline]
pub fn count_obj(name: &str, v: &Bound<'_, PyAny>) -> PyResult<usize> {
    match v.extract::<i64>() {
        Ok(i) if i >= 0 => Ok(i as usize),
        other => count_obj_error(name, v, other),
    }
}

// Out of line: the scheduler's calls never get here, and the formatting
// would otherwise sit between the hot instructions.
#[cold]
#[inline(never)]
fn count_obj_error(name: &str, v: &Bound<'_, PyAny>, got: PyResult<i64>) -> PyResult<usize> {
    match got {
        Ok(i) => count(name, i),
        Err(e) if caller_raised(v.py(), &e) => Err(e),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(v.py()) => Err(
            PyValueError::new_err(format!("{name} must be >= 0 and < 2**63, got {v}")),
        ),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{name} must be an int, got {}",
            type_name(v)
        ))),
    }
}

pub fn u32_arg(name: &str, v: i64) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| PyValueError::new_err(format!("{name} out of range: {v}")))
}

/// vLLM's `Request._all_token_ids`, the list behind `all_token_ids`, whose
/// length is `num_tokens` (a property, run as Python code at every read,
/// in the releases whose request keeps a list); None where the request has
/// no such list (no such attribute, or not a list). Any other error of the read propagates.
pub fn token_list<'py>(request: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyList>>> {
    let py = request.py();
    let ty = request.get_type().as_ptr() as usize;
    if TYPE_WITHOUT_TOKEN_LIST.load(Ordering::Relaxed) == ty {
        return Ok(None);
    }
    let list = match request.getattr(pyo3::intern!(py, "_all_token_ids")) {
        Ok(t) => t.downcast_into_exact::<PyList>().ok(),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => None,
        Err(e) => return Err(e),
    };
    if list.is_none() {
        TYPE_WITHOUT_TOKEN_LIST.store(ty, Ordering::Relaxed);
    }
    Ok(list)
}

/// The type of the last request found without a `_all_token_ids` list:
/// requests of that type are not asked again (a failed attribute read
/// builds an exception). A hint only: the callers read the properties then.
static TYPE_WITHOUT_TOKEN_LIST: AtomicUsize = AtomicUsize::new(0);

/// `request.num_tokens`, read as the length of `token_list` where there is one.
pub fn request_num_tokens(request: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Some(list) = token_list(request)? {
        return Ok(list.len());
    }
    count_obj(
        "request.num_tokens",
        &req_attr(request, pyo3::intern!(request.py(), "num_tokens"))?,
    )
}

/// `request.<name>`, where a missing attribute means the caller passed
/// something that is not a request: a TypeError saying what was expected.
#[inline]
pub fn req_attr<'py>(
    request: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    request
        .getattr(name)
        .map_err(|e| not_a_request(request, name, e))
}

#[cold]
#[inline(never)]
pub fn not_a_request(request: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>, e: PyErr) -> PyErr {
    if !e.is_instance_of::<pyo3::exceptions::PyAttributeError>(request.py()) {
        return e;
    }
    PyTypeError::new_err(format!(
        "request must be a vLLM Request (an object with .{name}), got {}",
        type_name(request)
    ))
}

/// A list of ints (`name` in the errors): the values, each >= 0 when
/// `non_negative`.
pub fn int_list(name: &str, v: &Bound<'_, PyAny>, non_negative: bool) -> PyResult<Vec<i64>> {
    let list = v.downcast::<PyList>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a list of ints, got {}",
            type_name(v)
        ))
    })?;
    list.iter()
        .enumerate()
        .map(|(i, x)| match x.extract::<i64>() {
            Ok(n) if n >= 0 || !non_negative => Ok(n),
            Ok(n) => Err(PyValueError::new_err(format!(
                "{name}[{i}] must be >= 0, got {n}"
            ))),
            Err(_) if x.is_instance_of::<pyo3::types::PyInt>() => Err(PyValueError::new_err(
                format!("{name}[{i}] must fit 64 bits, got {x}"),
            )),
            Err(_) => Err(PyTypeError::new_err(format!(
                "{name}[{i}] must be an int, got {}",
                type_name(&x)
            ))),
        })
        .collect()
}

/// A block id as `KVCacheBlocks(...)` takes it: any int that fits 64
/// bits (range-checked where it is used); anything else is refused here.
pub fn block_id_arg(b: &Bound<'_, PyAny>) -> PyResult<i64> {
    b.extract::<i64>().map_err(|e| {
        or_caller(b.py(), e, || {
            if b.is_instance_of::<pyo3::types::PyInt>() {
                PyValueError::new_err(format!("block id {b} out of range"))
            } else {
                PyTypeError::new_err(format!("block ids must be ints, got {}", type_name(b)))
            }
        })
    })
}

pub fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// One group as the facade describes it: (kind, block_size, is_eagle_group,
/// reports_new_block_ids, spec_class, admission_cap, window_or_chunk,
/// mamba_cache_mode, num_speculative_blocks).
/// One KV-cache group as the facade sends it: `hybridcache.config.NativeGroup`
/// (a frozen dataclass), read attribute by attribute.
#[derive(FromPyObject)]
pub struct GroupRecord {
    kind: String,
    block_size: i64,
    is_eagle_group: bool,
    reports_new_block_ids: bool,
    spec_class: i64,
    admission_cap: Option<i64>,
    window_or_chunk: i64,
    mamba_cache_mode: String,
    num_speculative_blocks: i64,
    /// (alignment, hash_block_size, num_hash_lookahead_tokens,
    /// drop_eagle_block, only_at_prefill_end), or None.
    mamba_checkpoints: Option<(i64, i64, i64, bool, bool)>,
    /// The spec's `prefix_cacheable` (partial-block-hits releases; True
    /// where the spec has none).
    prefix_cacheable: bool,
    /// A sliding window's `extra_retained_tokens` (partial-block-hits
    /// releases; 0 where the spec has none).
    extra_retained_tokens: i64,
}

pub fn parse_group(i: usize, g: GroupRecord) -> PyResult<GroupSpec> {
    let GroupRecord {
        kind,
        block_size,
        is_eagle_group,
        reports_new_block_ids,
        spec_class,
        admission_cap: cap,
        window_or_chunk: param,
        mamba_cache_mode: mode,
        num_speculative_blocks: num_spec,
        mamba_checkpoints,
        prefix_cacheable,
        extra_retained_tokens,
    } = g;
    let field = |f: &str| format!("kv_cache_groups[{i}].{f}");
    let kind = match kind.as_str() {
        "full_attention" => SpecKind::FullAttention,
        "sliding_window" => SpecKind::SlidingWindow {
            window: u32_arg(&field("sliding_window"), param)?,
        },
        "chunked_local" => SpecKind::ChunkedLocal {
            chunk: u32_arg(&field("attention_chunk_size"), param)?,
        },
        "cross_attention" => SpecKind::CrossAttention,
        "rswa" => SpecKind::Rswa {
            window: u32_arg(&field("rswa_window"), param)?,
        },
        "circular_buffer" => SpecKind::CircularBuffer,
        "mamba" => SpecKind::Mamba {
            mode: match mode.as_str() {
                "none" => MambaMode::None,
                "all" => MambaMode::All,
                "align" => MambaMode::Align,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "{}: unknown mamba_cache_mode {other:?} (none, all, align)",
                        field("mamba_cache_mode")
                    )))
                }
            },
            num_speculative_blocks: u32_arg(&field("num_speculative_blocks"), num_spec)?,
        },
        other => {
            return Err(PyNotImplementedError::new_err(format!(
                "KV cache spec kind {other:?} is not implemented yet"
            )))
        }
    };
    Ok(GroupSpec {
        kind,
        block_size: u32_arg(&field("block_size"), block_size)?,
        is_eagle_group,
        reports_new_block_ids,
        spec_class: u32_arg(&field("spec_class"), spec_class)?,
        admission_cap: cap.map(|c| count(&field("admission_cap"), c)).transpose()?,
        prefix_cacheable,
        extra_retained_tokens: u32_arg(&field("extra_retained_tokens"), extra_retained_tokens)?,
        mamba_checkpoints: mamba_checkpoints
            .map(
                |(alignment, hbs, lookahead, drop_eagle_block, only_at_prefill_end)| {
                    let positive = |name: &str, v: i64| match u32_arg(&field(name), v)? {
                        0 => Err(PyValueError::new_err(format!(
                            "{} must be > 0",
                            field(name)
                        ))),
                        v => Ok(v),
                    };
                    Ok::<_, PyErr>(MambaCheckpoints {
                        // 0: no checkpoint blocks (the caching rules alone).
                        alignment: u32_arg(&field("prefill_checkpoint_alignment"), alignment)?,
                        hash_block_size: positive("hash_block_size", hbs)?,
                        num_hash_lookahead_tokens: u32_arg(
                            &field("num_hash_lookahead_tokens"),
                            lookahead,
                        )?,
                        drop_eagle_block,
                        only_at_prefill_end,
                    })
                },
            )
            .transpose()?,
    })
}

pub fn ids_tuple<'py>(py: Python<'py>, groups: &[Vec<u32>]) -> PyResult<Bound<'py, PyTuple>> {
    let lists = groups
        .iter()
        .map(|g| PyList::new(py, g))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, lists)
}

/// Block ids per group from Python lists, range-checked.
pub fn block_ids(
    groups: &Bound<'_, PyAny>,
    num_blocks: u32,
    what: &str,
) -> PyResult<Vec<Vec<u32>>> {
    let mut out = Vec::new();
    for g in groups.try_iter()? {
        let mut ids = Vec::new();
        for b in g?.try_iter()? {
            let b = b?;
            let id = match b.extract::<i64>() {
                Ok(v) => u32::try_from(v).ok(),
                Err(e) if caller_raised(b.py(), &e) => return Err(e),
                Err(_) => None,
            }
            .filter(|&v| v < num_blocks);
            match id {
                Some(id) => ids.push(id),
                None => {
                    return Err(PyValueError::new_err(format!(
                        "{what}: block id {b} out of range: the pool has {num_blocks} blocks"
                    )))
                }
            }
        }
        out.push(ids);
    }
    Ok(out)
}

/// The hashes of `block_hashes` the core does not hold yet (`known` of them
/// it does). A shorter list than known means the request restarted: resend.
pub fn hash_update(block_hashes: &Bound<'_, PyAny>, known: usize) -> PyResult<Option<HashUpdate>> {
    let mut update = HashUpdate::default();
    Ok(fill_hash_update(block_hashes, known, &mut update)?.then_some(update))
}

/// `hash_update` into a reused buffer (a decode allocates nothing for it):
/// false when there is nothing new.
pub fn fill_hash_update(
    block_hashes: &Bound<'_, PyAny>,
    known: usize,
    out: &mut HashUpdate,
) -> PyResult<bool> {
    let list = block_hashes.downcast::<PyList>().map_err(|_| {
        PyTypeError::new_err(format!(
            "request.block_hashes must be a list of bytes, got {}",
            type_name(block_hashes)
        ))
    })?;
    let n = list.len();
    if n == known {
        return Ok(false);
    }
    let offset = if n < known { 0 } else { known };
    // Room for all of them at once (hashes of one function share a size).
    let first_len = list
        .get_item(offset)
        .ok()
        .and_then(|h| h.downcast::<PyBytes>().ok().map(|b| b.as_bytes().len()))
        .unwrap_or(0);
    out.offset = offset;
    out.hashes.clear();
    out.hashes.reserve(n - offset, (n - offset) * first_len);
    for i in offset..n {
        let h = list.get_item(i)?;
        let bytes = h.downcast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err(format!(
                "request.block_hashes[{i}] must be bytes, got {}",
                type_name(&h)
            ))
        })?;
        out.hashes.push(bytes.as_bytes());
    }
    Ok(true)
}

/// An unsigned int type an array argument holds (uint32 counts, uint64
/// handles).
pub trait LeUint: bytemuck::Pod + TryFrom<i64> {
    fn from_le_chunk(chunk: &[u8]) -> Self;
}

impl LeUint for u32 {
    fn from_le_chunk(chunk: &[u8]) -> Self {
        u32::from_le_bytes(chunk.try_into().expect("4 bytes"))
    }
}

impl LeUint for u64 {
    fn from_le_chunk(chunk: &[u8]) -> Self {
        u64::from_le_bytes(chunk.try_into().expect("8 bytes"))
    }
}

/// Unsigned ints from a list of ints, or from bytes / bytearray holding
/// little-endian values of `T`'s width (what `numpy.ndarray.tobytes()`
/// gives for uint32 / uint64 on every common platform). Bytes are used in
/// place when their alignment allows. The error names `name`.
pub fn uint_array<'a, T: LeUint>(name: &str, v: &'a Bound<'_, PyAny>) -> PyResult<Cow<'a, [T]>> {
    let width = std::mem::size_of::<T>();
    let check = |bytes: &[u8]| -> PyResult<()> {
        if bytes.len().is_multiple_of(width) {
            return Ok(());
        }
        Err(PyValueError::new_err(format!(
            "{name}: {} bytes is not a whole number of {width}-byte ints",
            bytes.len()
        )))
    };
    let decode =
        |bytes: &[u8]| -> Vec<T> { bytes.chunks_exact(width).map(T::from_le_chunk).collect() };
    if let Ok(b) = v.downcast::<PyBytes>() {
        let bytes = b.as_bytes();
        check(bytes)?;
        if cfg!(target_endian = "little") {
            if let Ok(ints) = bytemuck::try_cast_slice(bytes) {
                return Ok(Cow::Borrowed(ints));
            }
        }
        return Ok(Cow::Owned(decode(bytes)));
    }
    if let Ok(b) = v.downcast::<PyByteArray>() {
        // A bytearray can change under us: read a copy.
        let bytes = b.to_vec();
        check(&bytes)?;
        return Ok(Cow::Owned(decode(&bytes)));
    }
    let Ok(list) = v.downcast::<PyList>() else {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a list of ints or bytes of {width}-byte little-endian ints, got {}",
            type_name(v)
        )));
    };
    list.iter()
        .enumerate()
        .map(|(i, x)| {
            let x: i64 = x.extract().map_err(|e| {
                or_caller(x.py(), e, || {
                    PyTypeError::new_err(format!(
                        "{name}[{i}] must be an int, got {}",
                        type_name(&x)
                    ))
                })
            })?;
            T::try_from(x).map_err(|_| {
                PyValueError::new_err(format!(
                    "{name}[{i}] must be >= 0 and fit {} bits, got {x}",
                    8 * width
                ))
            })
        })
        .collect::<PyResult<Vec<T>>>()
        .map(Cow::Owned)
}

/// Little-endian bytes of u32 values (a compact result numpy reads with
/// `numpy.frombuffer(b, dtype="<u4")`).
pub fn u32_bytes<'py>(py: Python<'py>, values: &[u32]) -> Bound<'py, PyBytes> {
    if cfg!(target_endian = "little") {
        return PyBytes::new(py, bytemuck::cast_slice(values));
    }
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    PyBytes::new(py, &raw)
}

/// The core's configuration from `NativeManager(...)`'s arguments, each
/// checked and named when it is wrong.
#[allow(clippy::too_many_arguments)]
pub(crate) fn manager_config(
    num_blocks: &Bound<'_, PyAny>,
    groups: &Bound<'_, PyAny>,
    max_model_len: &Bound<'_, PyAny>,
    (scheduler_block_size, hash_block_size): (&Bound<'_, PyAny>, &Bound<'_, PyAny>),
    (enable_caching, use_eagle, enable_events): (bool, bool, bool),
    retention_interval: &Bound<'_, PyAny>,
    profile: &str,
    (dcp_world_size, pcp_world_size): (u32, u32),
) -> PyResult<ManagerConfig> {
    let groups: Vec<GroupRecord> = groups.extract().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(groups.py()) {
            PyValueError::new_err(format!("kv_cache_groups: a size is out of range ({e})"))
        } else {
            e
        }
    })?;
    let u32_of = |name: &str, v: &Bound<'_, PyAny>| -> PyResult<u32> {
        u32_arg(name, count_obj(name, v)? as i64)
    };
    let groups = groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| parse_group(i, g))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(ManagerConfig {
        num_blocks: u32_of("num_blocks", num_blocks)?,
        groups,
        max_model_len: count_obj("max_model_len", max_model_len)?,
        scheduler_block_size: u32_of("scheduler_block_size", scheduler_block_size)?,
        hash_block_size: u32_of("hash_block_size", hash_block_size)?,
        enable_caching,
        use_eagle,
        enable_events,
        retention_interval: if retention_interval.is_none() {
            None
        } else {
            Some(count_obj("retention_interval", retention_interval)?)
        },
        dcp_world_size,
        pcp_world_size,
        profile: BehaviourProfile::named(profile).map_err(to_py_err)?,
    })
}

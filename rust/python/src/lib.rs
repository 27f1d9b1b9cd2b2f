//! PyO3 binding of hybridcache-core: argument conversion and error mapping
//! only. Every decision lives in the core crate.

use std::panic::{catch_unwind, AssertUnwindSafe};

use hybridcache_core::{
    AllocateArgs, CoreError, GroupSpec, HashUpdate, KvCacheManager, MambaMode, ManagerConfig,
    PoolEvent, SpecKind,
};
use pyo3::exceptions::{PyKeyError, PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

fn to_py_err(e: CoreError) -> PyErr {
    match e {
        CoreError::InvalidArgument(m) => PyValueError::new_err(m),
        CoreError::UnknownRequest(m) => PyKeyError::new_err(m),
        CoreError::Unsupported(m) => PyNotImplementedError::new_err(m),
        CoreError::Invariant(m) => PyRuntimeError::new_err(m),
    }
}

/// Runs a core call so that neither an error nor a panic crosses as a crash.
fn guard<T>(f: impl FnOnce() -> Result<T, CoreError>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(to_py_err),
        Err(_) => Err(PyRuntimeError::new_err(
            "hybridcache core panicked (bug); state may be inconsistent",
        )),
    }
}

fn count(name: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {v}")))
}

/// One group as the facade describes it: (kind, block_size, is_eagle_group,
/// reports_new_block_ids, spec_class, admission_cap, window_or_chunk,
/// mamba_cache_mode, num_speculative_blocks).
type GroupTuple = (String, i64, bool, bool, i64, Option<i64>, i64, String, i64);

fn u32_arg(name: &str, v: i64) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| PyValueError::new_err(format!("{name} out of range: {v}")))
}

fn parse_group(i: usize, g: GroupTuple) -> PyResult<GroupSpec> {
    let (
        kind,
        block_size,
        is_eagle_group,
        reports_new_block_ids,
        spec_class,
        cap,
        param,
        mode,
        num_spec,
    ) = g;
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
    })
}

fn ids_list<'py>(py: Python<'py>, groups: &[Vec<u32>]) -> PyResult<Bound<'py, PyTuple>> {
    let lists = groups
        .iter()
        .map(|g| PyList::new(py, g))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, lists)
}

/// Block hashes must be `bytes` (not any sequence of small ints).
fn hashes_arg(hashes: Option<Vec<Bound<'_, PyBytes>>>) -> Vec<Box<[u8]>> {
    hashes
        .unwrap_or_default()
        .iter()
        .map(|h| Box::from(h.as_bytes()))
        .collect()
}

fn hash_update(
    offset: i64,
    hashes: Option<Vec<Bound<'_, PyBytes>>>,
) -> PyResult<Option<HashUpdate>> {
    let offset = count("hash offset", offset)?;
    Ok(hashes.map(|h| HashUpdate {
        offset,
        hashes: hashes_arg(Some(h)),
    }))
}

fn block_ids_arg(
    groups: Option<Vec<Vec<i64>>>,
    num_blocks: u32,
) -> PyResult<Option<Vec<Vec<u32>>>> {
    groups
        .map(|gs| {
            gs.into_iter()
                .map(|g| {
                    g.into_iter()
                        .map(|b| {
                            u32::try_from(b).ok().filter(|&b| b < num_blocks).ok_or_else(|| {
                                PyValueError::new_err(format!(
                                    "new_computed_blocks: block id {b} out of range: the pool has {num_blocks} blocks"
                                ))
                            })
                        })
                        .collect()
                })
                .collect()
        })
        .transpose()
}

/// The native manager; use `hybridcache.KVCacheManager`, which wraps it.
#[pyclass(module = "hybridcache._native", name = "NativeManager")]
struct NativeManager {
    inner: KvCacheManager,
}

#[pymethods]
impl NativeManager {
    #[new]
    #[pyo3(signature = (num_blocks, groups, max_model_len, scheduler_block_size, hash_block_size,
                        max_num_batched_tokens, enable_caching, use_eagle, enable_events))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_blocks: i64,
        groups: Vec<GroupTuple>,
        max_model_len: i64,
        scheduler_block_size: i64,
        hash_block_size: i64,
        max_num_batched_tokens: Option<i64>,
        enable_caching: bool,
        use_eagle: bool,
        enable_events: bool,
    ) -> PyResult<Self> {
        let num_blocks = u32_arg("num_blocks", num_blocks)?;
        let groups = groups
            .into_iter()
            .enumerate()
            .map(|(i, g)| parse_group(i, g))
            .collect::<PyResult<Vec<_>>>()?;
        let cfg = ManagerConfig {
            num_blocks,
            groups,
            max_model_len: count("max_model_len", max_model_len)?,
            scheduler_block_size: u32_arg("scheduler_block_size", scheduler_block_size)?,
            hash_block_size: u32_arg("hash_block_size", hash_block_size)?,
            max_num_batched_tokens: max_num_batched_tokens
                .map(|v| count("max_num_batched_tokens", v))
                .transpose()?,
            enable_caching,
            use_eagle,
            enable_events,
        };
        Ok(NativeManager {
            inner: guard(|| KvCacheManager::new(cfg))?,
        })
    }

    #[getter]
    fn num_blocks(&self) -> u32 {
        self.inner.pool().num_blocks()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.pool().num_free_blocks()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    fn num_known_hashes(&self, request_id: &str) -> usize {
        self.inner.num_known_hashes(request_id)
    }

    #[pyo3(signature = (request_id, offset, hashes))]
    fn sync_hashes(
        &mut self,
        request_id: &str,
        offset: i64,
        hashes: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<()> {
        let offset = count("hash offset", offset)?;
        guard(|| {
            self.inner
                .sync_hashes(request_id, offset, hashes_arg(Some(hashes)))
        })
    }

    /// Hashes from `hashes_from` on are stored first; returns (blocks per group, hit tokens).
    #[pyo3(signature = (request_id, num_tokens, hashes_from, new_hashes))]
    fn get_computed_blocks<'py>(
        &mut self,
        py: Python<'py>,
        request_id: &str,
        num_tokens: i64,
        hashes_from: i64,
        new_hashes: Option<Vec<Bound<'py, PyBytes>>>,
    ) -> PyResult<(Bound<'py, PyTuple>, usize)> {
        let num_tokens = count("request.num_tokens", num_tokens)?;
        let hashes_from = count("hash offset", hashes_from)?;
        let (blocks, hit) = guard(|| {
            if num_tokens == 0 {
                return Err(CoreError::InvalidArgument(format!(
                    "request {request_id:?} has no tokens"
                )));
            }
            if new_hashes.is_some() {
                self.inner
                    .sync_hashes(request_id, hashes_from, hashes_arg(new_hashes))?;
            }
            self.inner.get_computed_blocks(request_id, num_tokens)
        })?;
        Ok((ids_list(py, &blocks)?, hit))
    }

    #[pyo3(signature = (request_id, num_new_tokens, num_computed_tokens, num_tokens,
                        num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
                        num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens,
                        full_sequence_must_fit, reserved_blocks, hashes_from, new_hashes))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        &mut self,
        py: Python<'py>,
        request_id: &str,
        num_new_tokens: i64,
        num_computed_tokens: i64,
        num_tokens: i64,
        num_new_computed_tokens: i64,
        new_computed_blocks: Option<Vec<Vec<i64>>>,
        num_lookahead_tokens: i64,
        num_external_computed_tokens: i64,
        delay_cache_blocks: bool,
        num_encoder_tokens: i64,
        full_sequence_must_fit: bool,
        reserved_blocks: i64,
        hashes_from: i64,
        new_hashes: Option<Vec<Bound<'py, PyBytes>>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let new_computed_blocks =
            block_ids_arg(new_computed_blocks, self.inner.pool().num_blocks())?;
        let args = AllocateArgs {
            num_new_tokens: count("num_new_tokens", num_new_tokens)?,
            num_computed_tokens: count("request.num_computed_tokens", num_computed_tokens)?,
            num_tokens: count("request.num_tokens", num_tokens)?,
            num_new_computed_tokens: count("num_new_computed_tokens", num_new_computed_tokens)?,
            new_computed_blocks: new_computed_blocks.as_deref(),
            num_lookahead_tokens: count("num_lookahead_tokens", num_lookahead_tokens)?,
            num_external_computed_tokens: count(
                "num_external_computed_tokens",
                num_external_computed_tokens,
            )?,
            delay_cache_blocks,
            num_encoder_tokens: count("num_encoder_tokens", num_encoder_tokens)?,
            full_sequence_must_fit,
            reserved_blocks: count("reserved_blocks", reserved_blocks)?,
        };
        let update = hash_update(hashes_from, new_hashes)?;
        let out = guard(|| self.inner.allocate_slots(request_id, &args, update))?;
        out.map(|g| ids_list(py, &g)).transpose()
    }

    fn free(&mut self, request_id: &str) -> PyResult<()> {
        guard(|| {
            self.inner.free(request_id);
            Ok(())
        })
    }

    fn remove_skipped_blocks(
        &mut self,
        request_id: &str,
        total_computed_tokens: i64,
    ) -> PyResult<()> {
        let total = count("total_computed_tokens", total_computed_tokens)?;
        guard(|| {
            self.inner.remove_skipped_blocks(request_id, total);
            Ok(())
        })
    }

    #[pyo3(signature = (request_id, num_computed_tokens, hashes_from, new_hashes))]
    fn cache_blocks(
        &mut self,
        request_id: &str,
        num_computed_tokens: i64,
        hashes_from: i64,
        new_hashes: Option<Vec<Bound<'_, PyBytes>>>,
    ) -> PyResult<()> {
        let n = count("num_computed_tokens", num_computed_tokens)?;
        let update = hash_update(hashes_from, new_hashes)?;
        guard(|| self.inner.cache_blocks(request_id, n, update))
    }

    fn evict_blocks(&mut self, block_ids: Vec<i64>) -> PyResult<()> {
        let n = self.inner.pool().num_blocks();
        let ids = block_ids
            .into_iter()
            .map(|b| {
                u32::try_from(b).ok().filter(|&b| b < n).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "block id {b} out of range: the pool has {n} blocks"
                    ))
                })
            })
            .collect::<PyResult<Vec<u32>>>()?;
        guard(|| self.inner.evict_blocks(&ids))
    }

    fn reset_prefix_cache(&mut self) -> PyResult<bool> {
        guard(|| Ok(self.inner.reset_prefix_cache()))
    }

    fn get_num_common_prefix_blocks(&mut self, request_id: &str) -> PyResult<Vec<usize>> {
        guard(|| Ok(self.inner.get_num_common_prefix_blocks(request_id)))
    }

    fn get_block_ids<'py>(
        &self,
        py: Python<'py>,
        request_id: &str,
    ) -> PyResult<Bound<'py, PyTuple>> {
        ids_list(py, &self.inner.get_block_ids(request_id))
    }

    /// vLLM's `coordinator.get_num_blocks_to_allocate` (reads only).
    #[pyo3(signature = (request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
                        total_computed_tokens, num_tokens_main_model, apply_admission_cap=false))]
    #[allow(clippy::too_many_arguments)]
    fn get_num_blocks_to_allocate(
        &self,
        request_id: &str,
        num_tokens: i64,
        new_computed_blocks: Vec<Vec<i64>>,
        num_encoder_tokens: i64,
        total_computed_tokens: i64,
        num_tokens_main_model: i64,
        apply_admission_cap: bool,
    ) -> PyResult<i64> {
        let nc = block_ids_arg(Some(new_computed_blocks), self.inner.pool().num_blocks())?.unwrap_or_default();
        let (n, e, t, mm) = (
            count("num_tokens", num_tokens)?,
            count("num_encoder_tokens", num_encoder_tokens)?,
            count("total_computed_tokens", total_computed_tokens)?,
            count("num_tokens_main_model", num_tokens_main_model)?,
        );
        guard(|| self.inner.get_num_blocks_to_allocate(request_id, n, &nc, e, t, mm, apply_admission_cap))
    }

    /// Mamba align state of a request in a group:
    /// (last_state_block_idx or None, allocated), or None.
    fn align_state(&self, request_id: &str, group: usize) -> Option<(Option<usize>, bool)> {
        self.inner.align_state(request_id, group).map(|a| (a.last_state_block_idx, a.allocated))
    }

    fn has_events(&self) -> bool {
        self.inner.has_events()
    }

    /// Events as tuples: ("stored", hashes, parent, start_token, end_token,
    /// block_size, group, positions), ("removed", hash, group), ("cleared",).
    fn take_events<'py>(&mut self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let bytes = |b: &[u8]| PyBytes::new(py, b).into_any();
        self.inner
            .take_events()
            .into_iter()
            .map(|e| match e {
                PoolEvent::Stored {
                    hashes,
                    parent,
                    start_token,
                    end_token,
                    block_size,
                    group,
                    positions,
                } => {
                    let hs = PyList::new(py, hashes.iter().map(|h| bytes(h)))?;
                    let parent = match parent {
                        Some(p) => bytes(&p),
                        None => py.None().into_bound(py),
                    };
                    (
                        "stored",
                        hs,
                        parent,
                        start_token,
                        end_token,
                        block_size,
                        group,
                        PyList::new(py, positions)?,
                    )
                        .into_pyobject(py)
                }
                PoolEvent::Removed { hash, group } => {
                    ("removed", bytes(&hash), group).into_pyobject(py)
                }
                PoolEvent::AllCleared => ("cleared",).into_pyobject(py),
            })
            .collect()
    }

    fn take_new_block_ids(&mut self) -> Vec<u32> {
        self.inner.take_new_block_ids()
    }

    fn new_step_starts(&mut self) {
        self.inner.new_step_starts();
    }

    fn ref_cnt(&self, block_id: i64) -> PyResult<i32> {
        let b = self.block_id(block_id)?;
        Ok(self.inner.pool().ref_cnt(b))
    }

    /// (hash bytes, group id) of a cached block, else None.
    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: i64,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        let b = self.block_id(block_id)?;
        Ok(self
            .inner
            .pool()
            .block_hash(b)
            .map(|(h, g)| (PyBytes::new(py, h), g)))
    }

    /// Which of the given blocks carry no cached hash.
    fn unhashed(&self, block_ids: Vec<i64>) -> PyResult<Vec<bool>> {
        block_ids
            .into_iter()
            .map(|b| Ok(self.inner.pool().block_hash(self.block_id(b)?).is_none()))
            .collect()
    }

    fn free_queue(&self) -> Vec<u32> {
        self.inner.pool().free_queue().collect()
    }

    fn check_invariants(&self) -> PyResult<()> {
        guard(|| self.inner.check_invariants())
    }
}

impl NativeManager {
    fn block_id(&self, b: i64) -> PyResult<u32> {
        let n = self.inner.pool().num_blocks();
        u32::try_from(b).ok().filter(|&b| b < n).ok_or_else(|| {
            PyValueError::new_err(format!(
                "block id {b} out of range: the pool has {n} blocks"
            ))
        })
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeManager>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

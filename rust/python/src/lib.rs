//! PyO3 binding of hybridcache-core: argument conversion, request attribute
//! reads and error mapping only. Every decision lives in the core crate.
//!
//! `NativeManager` is subclassed by the Python facade
//! (`hybridcache.KVCacheManager`); the hot methods (`allocate_slots`,
//! `free`, `cache_blocks`) are native so a scheduler step costs one call.

use std::borrow::Cow;

mod batch;
mod block_ids_call;
mod blocks;
mod convert;
mod fast_call;
mod id_cache;

use blocks::{BlockView, KVCacheBlocks};
mod hasher;

use convert::{
    block_ids, count, count_obj, fill_hash_update, guard, hash_update, ids_tuple, int_list,
    parse_group, req_attr, u32_arg, u32_bytes, uint_array, GroupTuple,
};
use hybridcache_core::{
    AllocateArgs, CoreError, HashUpdate, KvCacheManager, ManagerConfig, NewBlocks, PoolEvent,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

/// An optional count: 0 when left out (or None, Python's usual "default");
/// otherwise an int >= 0, the error naming the argument.
fn opt_count(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    v.map_or(Ok(0), |v| count_obj(name, v))
}

/// `AllocateArgs::num_tokens` before `request.num_tokens` is read (see
/// `NativeManager::allocate_one`): as an upper bound it keeps the no-op
/// decode test exact.
pub(crate) const NUM_TOKENS_UNREAD: usize = usize::MAX;

/// Python-side collaborators the facade binds after construction.
struct Bound_ {
    /// The shared empty `KVCacheBlocks` (vLLM hands out one instance).
    empty: PyObject,
    /// `sink(raw_events, request)` turns raw events into event objects.
    event_sink: Option<PyObject>,
}

/// The native manager; use `hybridcache.KVCacheManager`, which extends it.
#[pyclass(module = "hybridcache._native", name = "NativeManager", subclass)]
struct NativeManager {
    inner: KvCacheManager,
    enable_caching: bool,
    /// Count lookups for prefix-cache stats (vLLM's `log_stats`).
    log_stats: bool,
    py_side: Option<Bound_>,
    // The last allocation's new blocks (reused: a call allocates nothing).
    scratch: NewBlocks,
    // A decode's new block hashes on their way to the core (reused too).
    hash_buf: HashUpdate,
    // What `allocate_decode_arrays` reuses across steps.
    batch: batch::BatchScratch,
    ids: id_cache::IdCache,
}

pub(crate) fn request_id<'py>(request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    let rid = req_attr(request, intern!(request.py(), "request_id"))?;
    if let Ok(s) = rid.downcast::<PyString>() {
        return Ok(s.clone());
    }
    Err(PyTypeError::new_err(format!(
        "request.request_id must be str, got {}",
        convert::type_name(&rid)
    )))
}

fn raw_events<'py>(py: Python<'py>, events: Vec<PoolEvent>) -> PyResult<Bound<'py, PyList>> {
    let bytes = |b: &[u8]| PyBytes::new(py, b).into_any();
    let items = events
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
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// Appends one request's batch result: its new blocks per group (from
/// `scratch` when `got`), or an empty run per group.
pub(crate) fn push_result(
    got: bool,
    scratch: &NewBlocks,
    num_groups: usize,
    offsets: &mut Vec<u32>,
    ids: &mut Vec<u32>,
) {
    if got {
        for g in scratch.groups() {
            ids.extend_from_slice(g);
            offsets.push(ids.len() as u32);
        }
    } else {
        offsets.extend(std::iter::repeat_n(ids.len() as u32, num_groups));
    }
}

/// The optional arguments of `allocate_slots` as given (None: left out;
/// the flags already converted, as PyO3 does first).
struct AllocateSlotsArgs<'a, 'py> {
    num_new_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    new_computed_blocks: Option<&'a Bound<'py, PyAny>>,
    num_lookahead_tokens: Option<&'a Bound<'py, PyAny>>,
    num_external_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    delay_cache_blocks: bool,
    num_encoder_tokens: Option<&'a Bound<'py, PyAny>>,
    full_sequence_must_fit: bool,
    reserved_blocks: Option<&'a Bound<'py, PyAny>>,
}

/// An optional flag: False when left out (or None); otherwise a bool.
pub(crate) fn opt_flag(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    match v {
        None => Ok(false),
        Some(v) if v.is_none() => Ok(false),
        Some(v) => v.extract::<bool>().map_err(|_| {
            PyTypeError::new_err(format!(
                "{name} must be a bool, got {}",
                convert::type_name(v)
            ))
        }),
    }
}

impl NativeManager {
    /// `allocate_slots` after argument matching (both entries land here).
    fn allocate_slots_impl(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_new_tokens: &Bound<'_, PyAny>,
        opt: AllocateSlotsArgs<'_, '_>,
    ) -> PyResult<PyObject> {
        let py = slf.py();
        let rid = request_id(request)?;
        let new_computed = Self::computed_ids(slf, opt.new_computed_blocks)?;
        let args = AllocateArgs {
            num_new_tokens: count_obj("num_new_tokens", num_new_tokens)?,
            num_computed_tokens: count_obj(
                "request.num_computed_tokens",
                &req_attr(request, intern!(py, "num_computed_tokens"))?,
            )?,
            num_tokens: NUM_TOKENS_UNREAD,
            num_new_computed_tokens: opt_count(
                "num_new_computed_tokens",
                opt.num_new_computed_tokens,
            )?,
            new_computed_blocks: new_computed.as_deref(),
            num_lookahead_tokens: opt_count("num_lookahead_tokens", opt.num_lookahead_tokens)?,
            num_external_computed_tokens: opt_count(
                "num_external_computed_tokens",
                opt.num_external_computed_tokens,
            )?,
            delay_cache_blocks: opt.delay_cache_blocks,
            num_encoder_tokens: opt_count("num_encoder_tokens", opt.num_encoder_tokens)?,
            full_sequence_must_fit: opt.full_sequence_must_fit,
            reserved_blocks: opt_count("reserved_blocks", opt.reserved_blocks)?,
        };
        Self::allocation_result(slf, request, |this| this.allocate_one(request, &rid, args))
    }

    /// Runs one allocation (`allocate` answers vLLM's None with false) and
    /// returns its result, its events handed to the sink.
    fn allocation_result(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        allocate: impl FnOnce(&mut Self) -> PyResult<bool>,
    ) -> PyResult<PyObject> {
        let (result, has_events) = {
            let mut this = slf.borrow_mut();
            let ok = allocate(&mut this)?;
            let result = if ok {
                this.scratch_blocks(slf)?
            } else {
                slf.py().None()
            };
            (result, this.inner.has_events())
        };
        if has_events {
            Self::flush_events(slf, Some(request))?;
        }
        Ok(result)
    }
}

impl NativeManager {
    /// A block id argument (any int object), range-checked.
    fn block_id_obj(&self, b: &Bound<'_, PyAny>) -> PyResult<u32> {
        self.block_id(convert::block_id_arg(b)?)
    }

    fn block_id(&self, b: i64) -> PyResult<u32> {
        let n = self.inner.pool().num_blocks();
        u32::try_from(b).ok().filter(|&b| b < n).ok_or_else(|| {
            PyValueError::new_err(format!(
                "block id {b} out of range: the pool has {n} blocks"
            ))
        })
    }

    fn py_side(&self) -> PyResult<&Bound_> {
        self.py_side.as_ref().ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("NativeManager used before _bind_python")
        })
    }

    /// The hashes of `request` the core lacks (None when caching is off).
    fn pending_hashes(
        &self,
        request: &Bound<'_, PyAny>,
        rid: &str,
    ) -> PyResult<Option<HashUpdate>> {
        // Used by lookups and cache_blocks; allocation uses `allocate_one`.
        if !self.enable_caching {
            return Ok(None);
        }
        let hashes = req_attr(request, intern!(request.py(), "block_hashes"))?;
        hash_update(&hashes, self.inner.num_known_hashes(rid))
    }

    /// One allocation into `self.scratch`; false for vLLM's None.
    /// `args.num_tokens` of `NUM_TOKENS_UNREAD` means not read yet: a
    /// decode that changes no block is done without it (it only bounds
    /// caching, so the no-op test with an upper bound is exact), otherwise
    /// it is read from `request`. The request's new hashes are read only if
    /// caching may need them (a block filled since they were last sent).
    fn allocate_one(
        &mut self,
        request: &Bound<'_, PyAny>,
        rid: &Bound<'_, PyString>,
        args: AllocateArgs,
    ) -> PyResult<bool> {
        let slot = self.lookup_id(rid)?;
        if let Some(s) = slot {
            let (inner, out) = (&mut self.inner, &mut self.scratch);
            if guard(|| Ok(inner.try_noop_decode(s, &args, out)))? {
                return Ok(true);
            }
        }
        self.allocate_general(slot, request, rid, args)
    }

    /// `allocate_one` past the no-op decode test (which failed, or does
    /// not apply).
    fn allocate_general(
        &mut self,
        slot: Option<u32>,
        request: &Bound<'_, PyAny>,
        rid: &Bound<'_, PyString>,
        mut args: AllocateArgs,
    ) -> PyResult<bool> {
        if args.num_tokens == NUM_TOKENS_UNREAD {
            args.num_tokens = count_obj(
                "request.num_tokens",
                &req_attr(request, intern!(request.py(), "num_tokens"))?,
            )?;
        }
        let has_update = self.update_if_needed(slot, request, &args)?;
        let (inner, out) = (&mut self.inner, &mut self.scratch);
        let update = has_update.then_some(&self.hash_buf);
        match slot {
            // A held request's id is the core's own: no UTF-8 view of the str.
            Some(s) => guard(|| inner.allocate_held_into(s, &args, update, out)),
            None => {
                let rid = rid.to_str()?;
                guard(|| inner.allocate_general_into(None, rid, &args, update, out))
            }
        }
    }

    /// The slot of the request whose id is `rid`: by the str object's
    /// address when this object was seen before (see `id_cache`).
    pub(crate) fn lookup_id(&mut self, rid: &Bound<'_, PyString>) -> PyResult<Option<u32>> {
        if let Some(slot) = self.ids.get(rid).and_then(|h| self.inner.slot_of_handle(h)) {
            return Ok(Some(slot));
        }
        let slot = self.inner.lookup(rid.to_str()?);
        if let Some(s) = slot {
            self.ids.remember(rid, self.inner.handle_at(s));
        }
        Ok(slot)
    }

    /// The request's hashes the core lacks, read only when this allocation
    /// may cache a block they cover.
    /// True when `hash_buf` now holds them.
    fn update_if_needed(
        &mut self,
        slot: Option<u32>,
        request: &Bound<'_, PyAny>,
        args: &AllocateArgs,
    ) -> PyResult<bool> {
        let known = self.inner.known_hashes_at(slot);
        if !self.inner.may_need_hashes(known, args) {
            return Ok(false);
        }
        fill_hash_update(
            &req_attr(request, intern!(request.py(), "block_hashes"))?,
            known,
            &mut self.hash_buf,
        )
    }

    /// The result of the allocation in `scratch`: the shared empty
    /// `KVCacheBlocks` when no group got a block.
    fn scratch_blocks(&self, slf: &Bound<'_, Self>) -> PyResult<PyObject> {
        let py = slf.py();
        if self.scratch.is_empty() {
            return Ok(self.py_side()?.empty.clone_ref(py));
        }
        Ok(Bound::new(
            py,
            KVCacheBlocks::from_groups(self.scratch.groups(), slf.clone().into_any().unbind()),
        )?
        .into_any()
        .unbind())
    }

    /// Block ids of `new_computed_blocks`; None for None or the shared empty.
    fn computed_ids(
        slf: &Bound<'_, Self>,
        blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Vec<Vec<u32>>>> {
        let Some(blocks) = blocks else {
            return Ok(None);
        };
        let this = slf.borrow();
        let side = this.py_side()?;
        if blocks.is(&side.empty) || blocks.is_none() {
            return Ok(None);
        }
        let py = slf.py();
        let num_blocks = this.inner.pool().num_blocks();
        if let Ok(native) = blocks.downcast::<KVCacheBlocks>() {
            let native = native.get();
            if native.owner().is_some_and(|o| !o.is(slf)) {
                return Err(PyValueError::new_err(
                    "new_computed_blocks come from another KVCacheManager",
                ));
            }
            let ids = native
                .ids()
                .iter()
                .map(|g| {
                    g.iter()
                        .map(|&b| {
                            u32::try_from(b).ok().filter(|&b| b < num_blocks).ok_or_else(|| {
                                let shown = if b == i64::MIN { "that is not an int".to_string() } else { b.to_string() };
                                PyValueError::new_err(format!(
                                    "new_computed_blocks: block id {shown} out of range: the pool has {num_blocks} blocks"
                                ))
                            })
                        })
                        .collect::<PyResult<Vec<u32>>>()
                })
                .collect::<PyResult<Vec<_>>>()?;
            return Ok(Some(ids));
        }
        // Any KVCacheBlocks-like object (vLLM's own): read block ids.
        let groups = blocks.getattr(intern!(py, "blocks")).map_err(|_| {
            PyTypeError::new_err(format!(
                "new_computed_blocks must be KVCacheBlocks, got {}",
                convert::type_name(blocks)
            ))
        })?;
        let ids = groups
            .try_iter()?
            .map(|g| {
                g?.try_iter()?
                    .map(|b| b?.getattr(intern!(py, "block_id")))
                    .collect::<PyResult<Vec<_>>>()
            })
            .collect::<PyResult<Vec<_>>>()?;
        let lists = PyList::new(
            py,
            ids.into_iter()
                .map(|g| PyList::new(py, g))
                .collect::<PyResult<Vec<_>>>()?,
        )?;
        block_ids(lists.as_any(), num_blocks, "new_computed_blocks").map(Some)
    }

    /// Hands pending events to the facade's sink, with the request they came from.
    fn flush_events(slf: &Bound<'_, Self>, request: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let py = slf.py();
        let (sink, events) = {
            let mut this = slf.borrow_mut();
            if !this.inner.has_events() {
                return Ok(());
            }
            let Some(sink) = this
                .py_side
                .as_ref()
                .and_then(|s| s.event_sink.as_ref())
                .map(|s| s.clone_ref(py))
            else {
                this.inner.take_events();
                return Ok(());
            };
            (sink, this.inner.take_events())
        };
        let raw = raw_events(py, events)?;
        sink.call1(
            py,
            (
                raw,
                request.map_or_else(|| py.None(), |r| r.clone().unbind()),
            ),
        )?;
        Ok(())
    }

    /// A facade `KVCacheBlocks` for `ids`, or the shared empty one.
    fn make_blocks(slf: &Bound<'_, Self>, ids: &[Vec<u32>]) -> PyResult<PyObject> {
        let py = slf.py();
        let this = slf.borrow();
        let side = this.py_side()?;
        if ids.iter().all(Vec::is_empty) {
            return Ok(side.empty.clone_ref(py));
        }
        Ok(Bound::new(
            py,
            KVCacheBlocks::from_ids(ids, slf.clone().into_any().unbind()),
        )?
        .into_any()
        .unbind())
    }
}

#[pymethods]
impl NativeManager {
    #[new]
    #[pyo3(signature = (num_blocks, groups, max_model_len, scheduler_block_size, hash_block_size,
                        max_num_batched_tokens, enable_caching, use_eagle, enable_events))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_blocks: &Bound<'_, PyAny>,
        groups: &Bound<'_, PyAny>,
        max_model_len: &Bound<'_, PyAny>,
        scheduler_block_size: &Bound<'_, PyAny>,
        hash_block_size: &Bound<'_, PyAny>,
        max_num_batched_tokens: Option<&Bound<'_, PyAny>>,
        enable_caching: bool,
        use_eagle: bool,
        enable_events: bool,
    ) -> PyResult<Self> {
        let groups: Vec<GroupTuple> = groups.extract().map_err(|e| {
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
        let cfg = ManagerConfig {
            num_blocks: u32_of("num_blocks", num_blocks)?,
            groups,
            max_model_len: count_obj("max_model_len", max_model_len)?,
            scheduler_block_size: u32_of("scheduler_block_size", scheduler_block_size)?,
            hash_block_size: u32_of("hash_block_size", hash_block_size)?,
            max_num_batched_tokens: max_num_batched_tokens
                .filter(|v| !v.is_none())
                .map(|v| count_obj("max_num_batched_tokens", v))
                .transpose()?,
            enable_caching,
            use_eagle,
            enable_events,
        };
        Ok(NativeManager {
            inner: guard(|| KvCacheManager::new(cfg))?,
            enable_caching,
            log_stats: false,
            py_side: None,
            scratch: NewBlocks::new(),
            hash_buf: HashUpdate::default(),
            batch: batch::BatchScratch::default(),
            ids: id_cache::IdCache::default(),
        })
    }

    /// The Python objects this manager holds, for the garbage collector
    /// (the event sink is a bound method of the manager: a cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(side) = &self.py_side {
            visit.call(&side.empty)?;
            if let Some(sink) = &side.event_sink {
                visit.call(sink)?;
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.py_side = None;
    }

    /// Called once by the facade: the shared empty KVCacheBlocks, the event
    /// sink (None when events are off) and whether lookups are counted.
    #[pyo3(signature = (empty, event_sink, log_stats=false))]
    fn _bind_python(&mut self, empty: PyObject, event_sink: Option<PyObject>, log_stats: bool) {
        self.py_side = Some(Bound_ { empty, event_sink });
        self.log_stats = log_stats;
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

    /// vLLM's `get_computed_blocks(request)`: the longest prefix-cache hit
    /// as (KVCacheBlocks, hit tokens); the request's new hashes are stored
    /// first, and the lookup is counted for prefix-cache stats.
    fn get_computed_blocks<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<(PyObject, usize)> {
        let py = slf.py();
        let empty = || -> PyResult<PyObject> { Ok(slf.borrow().py_side()?.empty.clone_ref(py)) };
        if !slf.borrow().enable_caching
            || req_attr(request, intern!(py, "skip_reading_prefix_cache"))?.is_truthy()?
        {
            return Ok((empty()?, 0));
        }
        let rid = request_id(request)?;
        let rid = rid.to_str()?;
        let num_tokens = count_obj(
            "request.num_tokens",
            &req_attr(request, intern!(py, "num_tokens"))?,
        )?;
        let (blocks, hit) = {
            let mut this = slf.borrow_mut();
            let update = this.pending_hashes(request, rid)?;
            let (blocks, hit) = guard(|| {
                if num_tokens == 0 {
                    return Err(CoreError::InvalidArgument(format!(
                        "request {rid:?} has no tokens"
                    )));
                }
                if let Some(u) = update {
                    this.inner.sync_update(rid, u)?;
                }
                this.inner.get_computed_blocks(rid, num_tokens)
            })?;
            if this.log_stats {
                let preempted = count_obj(
                    "request.num_preemptions",
                    &req_attr(request, intern!(py, "num_preemptions"))?,
                )? > 0;
                this.inner.stats.record(num_tokens, hit, preempted);
            }
            (blocks, hit)
        };
        Ok((Self::make_blocks(slf, &blocks)?, hit))
    }

    /// Prefix-cache lookup counters since the last call, reset:
    /// (reset, requests, queries, hits, preempted_requests, preempted_queries, preempted_hits).
    #[pyo3(signature = (take=true))]
    fn _take_stats(&mut self, take: bool) -> (bool, u64, u64, u64, u64, u64, u64) {
        let s = if take {
            self.inner.take_stats()
        } else {
            self.inner.stats
        };
        (
            s.reset,
            s.requests,
            s.queries,
            s.hits,
            s.preempted_requests,
            s.preempted_queries,
            s.preempted_hits,
        )
    }

    /// vLLM 0.23.0's `KVCacheManager.allocate_slots`. (The facade calls it
    /// through `_bound_allocate_slots`, the same call without PyO3's
    /// argument matching.)
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens=None, new_computed_blocks=None,
                        num_lookahead_tokens=None, num_external_computed_tokens=None,
                        delay_cache_blocks=false, num_encoder_tokens=None, full_sequence_must_fit=false,
                        reserved_blocks=None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_new_tokens: &Bound<'_, PyAny>,
        num_new_computed_tokens: Option<&Bound<'_, PyAny>>,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'_, PyAny>>,
        num_external_computed_tokens: Option<&Bound<'_, PyAny>>,
        delay_cache_blocks: bool,
        num_encoder_tokens: Option<&Bound<'_, PyAny>>,
        full_sequence_must_fit: bool,
        reserved_blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        Self::allocate_slots_impl(
            slf,
            request,
            num_new_tokens,
            AllocateSlotsArgs {
                num_new_computed_tokens,
                new_computed_blocks,
                num_lookahead_tokens,
                num_external_computed_tokens,
                delay_cache_blocks,
                num_encoder_tokens,
                full_sequence_must_fit,
                reserved_blocks,
            },
        )
    }

    /// `allocate_slots` as a builtin bound to this manager, called without
    /// PyO3's argument matching (see `fast_call`).
    fn _bound_allocate_slots(slf: &Bound<'_, Self>) -> PyResult<PyObject> {
        fast_call::bound_allocate_slots(slf)
    }

    /// The decode `allocate_slots` of a whole step in one call: for each
    /// request in order, exactly `allocate_slots(request, num_new_tokens[i],
    /// num_lookahead_tokens=num_lookahead_tokens)`. Returns `(ok, offsets,
    /// ids)`: `ok[i]` is False where that call would return None; the new
    /// block ids of request i in group g are
    /// `ids[offsets[i*G + g] : offsets[i*G + g + 1]]`. A serving loop that
    /// tracks the counts itself passes `num_computed_tokens` / `num_tokens`
    /// lists, and the requests' attributes are then not read (their block
    /// hashes still are, when a block fills). Every request is read and
    /// checked before any is allocated (a request given twice is refused),
    /// so an error leaves the manager as it was.
    #[pyo3(signature = (requests, num_new_tokens, num_lookahead_tokens=None, num_computed_tokens=None, num_tokens=None))]
    fn allocate_decode_batch<'py>(
        slf: &Bound<'py, Self>,
        requests: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_lookahead_tokens: Option<&Bound<'py, PyAny>>,
        num_computed_tokens: Option<&Bound<'py, PyAny>>,
        num_tokens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, Bound<'py, PyList>)> {
        let py = slf.py();
        let lookahead = opt_count("num_lookahead_tokens", num_lookahead_tokens)?;
        let requests = requests
            .downcast::<PyList>()
            .map_err(|_| PyTypeError::new_err("requests must be a list"))?;
        let n = requests.len();
        let counts_arg =
            |name: &str, v: Option<&Bound<'py, PyAny>>| -> PyResult<Option<Vec<usize>>> {
                let Some(v) = v else { return Ok(None) };
                let vals: Vec<i64> = v
                    .extract()
                    .map_err(|_| PyTypeError::new_err(format!("{name} must be a list of ints")))?;
                if vals.len() != n {
                    return Err(PyValueError::new_err(format!(
                        "{name} has {} entries for {n} requests",
                        vals.len()
                    )));
                }
                vals.into_iter()
                    .map(|x| count(name, x))
                    .collect::<PyResult<Vec<_>>>()
                    .map(Some)
            };
        let lists = batch::DecodeLists {
            num_new_tokens: counts_arg("num_new_tokens", Some(num_new_tokens))?.expect("given"),
            num_computed_tokens: counts_arg("num_computed_tokens", num_computed_tokens)?,
            num_tokens: counts_arg("num_tokens", num_tokens)?,
            lookahead,
        };
        let (ok, offsets, ids, pending_events) = {
            let mut this = slf.borrow_mut();
            let events_on = this
                .py_side
                .as_ref()
                .is_some_and(|s| s.event_sink.is_some());
            batch::run_requests(&mut this, requests, &lists, events_on)?
        };
        if !pending_events.is_empty() {
            let sink = slf
                .borrow()
                .py_side()?
                .event_sink
                .as_ref()
                .map(|s| s.clone_ref(py));
            if let Some(sink) = sink {
                for (events, request) in pending_events {
                    sink.call1(py, (raw_events(py, events)?, request))?;
                }
            }
        }
        Ok((
            PyList::new(py, ok)?,
            PyList::new(py, offsets)?,
            PyList::new(py, ids)?,
        ))
    }

    /// A handle for a request the manager holds (after its first
    /// allocation): an int `allocate_decode_arrays` takes in place of the
    /// request. It names that request until it is freed and is never reused;
    /// KeyError for a request the manager does not hold.
    fn request_handle(&self, request_id: &str) -> PyResult<u64> {
        self.inner.handle(request_id).ok_or_else(|| {
            pyo3::exceptions::PyKeyError::new_err(format!(
                "request {request_id:?} holds no state in this manager (allocate it first)"
            ))
        })
    }

    /// `allocate_decode_batch` over arrays, for serving loops that keep
    /// their per-request counts in arrays: request `i` is `handles[i]`
    /// (from `request_handle`), with `num_new_tokens[i]`,
    /// `num_computed_tokens[i]` and `num_tokens[i]` as the request's
    /// attributes would give them. Each array is a list of ints or bytes of
    /// little-endian ints (uint64 handles, uint32 counts: `ndarray.tobytes()`).
    /// `requests[i]` is read only for its `block_hashes`, and only when a
    /// block fills; it is required when prefix caching is on.
    ///
    /// Everything is checked before any request is allocated, so an error
    /// leaves the manager as it was. Returns `(ok, offsets, ids)` as bytes:
    /// `ok` one byte per request (0 where `allocate_slots` would return
    /// None), `offsets` and `ids` uint32 (little-endian): the new blocks of
    /// request i in group g are `ids[offsets[i*G+g] : offsets[i*G+g+1]]`.
    #[pyo3(signature = (handles, num_new_tokens, num_computed_tokens, num_tokens,
                        num_lookahead_tokens=None, requests=None))]
    fn allocate_decode_arrays<'py>(
        slf: &Bound<'py, Self>,
        handles: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_computed_tokens: &Bound<'py, PyAny>,
        num_tokens: &Bound<'py, PyAny>,
        num_lookahead_tokens: Option<&Bound<'py, PyAny>>,
        requests: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        let py = slf.py();
        let lookahead = opt_count("num_lookahead_tokens", num_lookahead_tokens)?;
        let handles = uint_array::<u64>("handles", handles)?;
        let n = handles.len();
        fn counts<'a>(name: &str, v: &'a Bound<'_, PyAny>, n: usize) -> PyResult<Cow<'a, [u32]>> {
            let vals = uint_array::<u32>(name, v)?;
            if vals.len() != n {
                return Err(PyValueError::new_err(format!(
                    "{name} has {} entries for {n} handles",
                    vals.len()
                )));
            }
            Ok(vals)
        }
        let new_tokens = counts("num_new_tokens", num_new_tokens, n)?;
        let computed = counts("num_computed_tokens", num_computed_tokens, n)?;
        let totals = counts("num_tokens", num_tokens, n)?;
        if let Some(i) = (0..n).find(|&i| totals[i] < computed[i]) {
            return Err(PyValueError::new_err(format!(
                "num_tokens[{i}] ({}) is less than num_computed_tokens[{i}] ({})",
                totals[i], computed[i]
            )));
        }
        let requests = match requests {
            None => None,
            Some(r) if r.is_none() => None,
            Some(r) => {
                let list = r
                    .downcast::<PyList>()
                    .map_err(|_| PyTypeError::new_err("requests must be a list"))?;
                if list.len() != n {
                    return Err(PyValueError::new_err(format!(
                        "requests has {} entries for {n} handles",
                        list.len()
                    )));
                }
                Some(list)
            }
        };
        let arrays = batch::DecodeArrays {
            handles,
            num_new_tokens: new_tokens,
            num_computed_tokens: computed,
            num_tokens: totals,
            lookahead,
        };
        let mut this = slf.borrow_mut();
        let events_on = this
            .py_side
            .as_ref()
            .is_some_and(|s| s.event_sink.is_some());
        let result = batch::run(&mut this, py, &arrays, requests, events_on)?;
        let sink = this
            .py_side
            .as_ref()
            .and_then(|s| s.event_sink.as_ref())
            .map(|s| s.clone_ref(py));
        drop(this);
        if let Some(sink) = sink {
            for (events, i) in result.events {
                let request = match requests {
                    Some(r) => r.get_item(i)?.unbind(),
                    None => py.None(),
                };
                sink.call1(py, (raw_events(py, events)?, request))?;
            }
        }
        Ok((
            PyBytes::new(py, &result.ok),
            u32_bytes(py, &result.offsets),
            u32_bytes(py, &result.ids),
        ))
    }

    /// vLLM's `get_blocks(request_id)`: the request's blocks per group (the
    /// shared empty `KVCacheBlocks` for a request without blocks).
    fn get_blocks(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<PyObject> {
        let ids = slf.borrow().inner.get_block_ids(request_id);
        Self::make_blocks(slf, &ids)
    }

    /// vLLM's `free(request)`: frees the request's blocks, tail first.
    fn free(&mut self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let rid = request_id(request)?;
        let rid = rid.to_str()?;
        guard(|| {
            self.inner.free(rid);
            Ok(())
        })
    }

    /// vLLM's `cache_blocks(request, num_computed_tokens)`.
    fn cache_blocks(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let n = count_obj("num_computed_tokens", num_computed_tokens)?;
        let rid = request_id(request)?;
        let rid = rid.to_str()?;
        {
            let mut this = slf.borrow_mut();
            if !this.enable_caching {
                return Ok(());
            }
            let update = this.pending_hashes(request, rid)?;
            guard(|| this.inner.cache_blocks(rid, n, update))?;
        }
        Self::flush_events(slf, Some(request))
    }

    fn remove_skipped_blocks(
        &mut self,
        request_id: &str,
        total_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let total = count_obj("total_computed_tokens", total_computed_tokens)?;
        guard(|| {
            self.inner.remove_skipped_blocks(request_id, total);
            Ok(())
        })
    }

    /// Drops the given blocks (any iterable of ids) from the prefix cache.
    fn evict_blocks(slf: &Bound<'_, Self>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        {
            let mut this = slf.borrow_mut();
            let mut ids = Vec::new();
            for b in block_ids.try_iter()? {
                let b = b?;
                let v = b.extract::<i64>().map_err(|_| {
                    PyTypeError::new_err(format!(
                        "evict_blocks: block_ids must be ints, got {}",
                        convert::type_name(&b)
                    ))
                })?;
                ids.push(this.block_id(v)?);
            }
            guard(|| this.inner.evict_blocks(&ids))?;
        }
        Self::flush_events(slf, None)
    }

    fn reset_prefix_cache(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let ok = guard(|| Ok(slf.borrow_mut().inner.reset_prefix_cache()))?;
        Self::flush_events(slf, None)?;
        Ok(ok)
    }

    fn get_num_common_prefix_blocks(&mut self, running_request_id: &str) -> PyResult<Vec<usize>> {
        guard(|| Ok(self.inner.get_num_common_prefix_blocks(running_request_id)))
    }

    fn get_block_ids<'py>(
        &self,
        py: Python<'py>,
        request_id: &str,
    ) -> PyResult<Bound<'py, PyTuple>> {
        ids_tuple(py, &self.inner.get_block_ids(request_id))
    }

    /// vLLM's `coordinator.get_num_blocks_to_allocate` (reads only).
    #[pyo3(signature = (request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
                        total_computed_tokens, num_tokens_main_model, apply_admission_cap=false))]
    #[allow(clippy::too_many_arguments)]
    fn get_num_blocks_to_allocate(
        &self,
        request_id: &str,
        num_tokens: &Bound<'_, PyAny>,
        new_computed_blocks: &Bound<'_, PyAny>,
        num_encoder_tokens: &Bound<'_, PyAny>,
        total_computed_tokens: &Bound<'_, PyAny>,
        num_tokens_main_model: &Bound<'_, PyAny>,
        apply_admission_cap: bool,
    ) -> PyResult<i64> {
        let nc = block_ids(
            new_computed_blocks,
            self.inner.pool().num_blocks(),
            "new_computed_blocks",
        )?;
        let (n, e, t, mm) = (
            count_obj("num_tokens", num_tokens)?,
            count_obj("num_encoder_tokens", num_encoder_tokens)?,
            count_obj("total_computed_tokens", total_computed_tokens)?,
            count_obj("num_tokens_main_model", num_tokens_main_model)?,
        );
        guard(|| {
            self.inner
                .get_num_blocks_to_allocate(request_id, n, &nc, e, t, mm, apply_admission_cap)
        })
    }

    /// Mamba align state of a request in a group:
    /// (last_state_block_idx or None, allocated), or None.
    fn align_state(
        &self,
        request_id: &str,
        group: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Option<usize>, bool)>> {
        let group = count_obj("group", group)?;
        Ok(self
            .inner
            .align_state(request_id, group)
            .map(|a| (a.last_state_block_idx, a.allocated)))
    }

    /// Pre-forward Mamba state-copy plan of this step (int32 rows of
    /// `group, dst, conv_src, temp_src, bias`, little endian) for the batch
    /// `request_ids`, given the worker's accepted-token counts.
    fn mamba_pre_copy_plan<'py>(
        &mut self,
        py: Python<'py>,
        request_ids: Vec<String>,
        num_accepted: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let num_accepted = int_list("num_accepted", num_accepted, false)?;
        let ids: Vec<&str> = request_ids.iter().map(String::as_str).collect();
        let rows = guard(|| self.inner.mamba_pre_copy_plan(&ids, &num_accepted))?;
        let bytes: Vec<u8> = rows
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        Ok(PyByteArray::new(py, &bytes))
    }

    /// Post-verification selection plan: (int32 rows as bytes, columns).
    fn mamba_post_select_plan<'py>(
        &self,
        py: Python<'py>,
        request_ids: Vec<String>,
        num_draft: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyByteArray>, usize)> {
        let num_draft: Vec<usize> = int_list("num_draft", num_draft, true)?
            .into_iter()
            .map(|d| d as usize)
            .collect();
        let ids: Vec<&str> = request_ids.iter().map(String::as_str).collect();
        let (rows, cols) = guard(|| self.inner.mamba_post_select_plan(&ids, &num_draft))?;
        let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok((PyByteArray::new(py, &bytes), cols))
    }

    fn take_new_block_ids(&mut self) -> Vec<u32> {
        self.inner.take_new_block_ids()
    }

    fn new_step_starts(&mut self) {
        self.inner.new_step_starts();
    }

    fn ref_cnt(&self, block_id: &Bound<'_, PyAny>) -> PyResult<i32> {
        let b = self.block_id_obj(block_id)?;
        Ok(self.inner.pool().ref_cnt(b))
    }

    /// (hash bytes, group id) of a cached block, else None.
    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        let b = self.block_id_obj(block_id)?;
        Ok(self
            .inner
            .pool()
            .block_hash(b)
            .map(|(h, g)| (PyBytes::new(py, h), g)))
    }

    /// Which of the given blocks carry no cached hash.
    fn unhashed(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        int_list("block_ids", block_ids, false)?
            .into_iter()
            .map(|b| Ok(self.inner.pool().block_hash(self.block_id(b)?).is_none()))
            .collect()
    }

    /// vLLM's `block_pool.get_cached_block`, as ids: the earliest cached
    /// block of `block_hash` in each group, or None on any miss (reads only).
    fn cached_block_ids(
        &self,
        block_hash: &[u8],
        group_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Vec<u32>>> {
        let group_ids = int_list("kv_cache_group_ids", group_ids, true)?
            .into_iter()
            .map(|g| u32_arg("kv_cache_group_ids", g))
            .collect::<PyResult<Vec<u32>>>()?;
        let mut out = Vec::with_capacity(group_ids.len());
        Ok(self
            .inner
            .pool()
            .get_cached_block(block_hash, &group_ids, &mut out)
            .then_some(out))
    }

    /// Number of (block hash, group) keys in the prefix cache.
    #[getter]
    fn num_cached_keys(&self) -> usize {
        self.inner.pool().num_cached_keys()
    }

    /// Ids of the requests the manager holds state for.
    fn request_ids(&self) -> Vec<String> {
        self.inner.request_ids().map(str::to_owned).collect()
    }

    fn has_request(&self, request_id: &str) -> bool {
        self.inner.has_request(request_id)
    }

    /// (front, back) of the free queue, or None when it is empty.
    fn free_queue_ends(&self) -> Option<(u32, u32)> {
        self.inner.pool().free_queue_ends()
    }

    /// A free block's (previous, next) free-queue neighbours (None at the
    /// queue's ends), or None if the block is not free.
    fn free_queue_neighbors(
        &self,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Option<u32>, Option<u32>)>> {
        let b = self.block_id_obj(block_id)?;
        Ok(self.inner.pool().free_queue_neighbors(b))
    }

    fn free_queue(&self) -> Vec<u32> {
        self.inner.pool().free_queue().collect()
    }

    fn check_invariants(&self) -> PyResult<()> {
        guard(|| self.inner.check_invariants())
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeManager>()?;
    m.add_class::<KVCacheBlocks>()?;
    block_ids_call::install(&m.py().get_type::<KVCacheBlocks>())?;
    m.add_class::<BlockView>()?;
    hasher::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

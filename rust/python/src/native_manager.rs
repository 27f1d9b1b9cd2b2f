//! `NativeManager`, the Python class the facade extends: its state and
//! its Python methods, each a conversion around one core call.

use hybridcache_core::{BatchScratch, HashUpdate, KvCacheManager, NewBlocks};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::call_guard::{borrow, borrow_mut, enter};
use crate::convert::{self, block_ids, count_obj, guard, ids_tuple, int_list, to_py_err};
use crate::{allocate_params, batch, lookup, request_id};

/// Python-side collaborators the facade binds after construction.
pub(crate) struct Bound_ {
    /// The shared empty `KVCacheBlocks` (vLLM hands out one instance).
    pub(crate) empty: PyObject,
    /// `sink(raw_events, request)` turns raw events into event objects.
    pub(crate) event_sink: Option<PyObject>,
    /// `read(request)`: what the event sink will read of a request, read
    /// before the call changes anything (handed to the sink in its place),
    /// so that a read that raises leaves the manager as it was. None: the
    /// sink gets the request.
    pub(crate) event_read: Option<PyObject>,
    /// `sink(raw_metrics)` makes the metrics collector's calls, from the
    /// pool's log of them: a list of (kind, block_id), kind 0 allocated,
    /// 1 accessed, 2 evicted, 3 reset (block_id 0).
    pub(crate) metrics_sink: Option<PyObject>,
}

/// The native manager; use `hybridcache.KVCacheManager`, which extends it.
#[pyclass(module = "hybridcache._native", name = "NativeManager", subclass)]
pub(crate) struct NativeManager {
    pub(crate) inner: KvCacheManager,
    pub(crate) py_side: Option<Bound_>,
    // The last allocation's new blocks (reused: a call allocates nothing).
    pub(crate) scratch: NewBlocks,
    // A decode's new block hashes on their way to the core (reused too).
    pub(crate) hash_buf: HashUpdate,
    // What `allocate_decode_arrays` reuses across steps.
    pub(crate) batch: BatchScratch,
    pub(crate) ids: crate::id_cache::IdCache,
    pub(crate) watermark: crate::release_api::Watermark,
    pub(crate) step_waits: crate::step_waits::StepWaits,
}

#[pymethods]
impl NativeManager {
    #[new]
    #[pyo3(signature = (num_blocks, groups, max_model_len, scheduler_block_size, hash_block_size,
                        enable_caching, use_eagle, enable_events, retention_interval, profile,
                        dcp_world_size, pcp_world_size))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_blocks: &Bound<'_, PyAny>,
        groups: &Bound<'_, PyAny>,
        max_model_len: &Bound<'_, PyAny>,
        scheduler_block_size: &Bound<'_, PyAny>,
        hash_block_size: &Bound<'_, PyAny>,
        enable_caching: bool,
        use_eagle: bool,
        enable_events: bool,
        retention_interval: &Bound<'_, PyAny>,
        profile: &str,
        dcp_world_size: u32,
        pcp_world_size: u32,
    ) -> PyResult<Self> {
        let cfg = crate::convert::manager_config(
            num_blocks,
            groups,
            max_model_len,
            (scheduler_block_size, hash_block_size),
            (enable_caching, use_eagle, enable_events),
            retention_interval,
            profile,
            (dcp_world_size, pcp_world_size),
        )?;
        Ok(NativeManager {
            inner: guard(|| KvCacheManager::new(cfg))?,
            py_side: None,
            scratch: NewBlocks::new(),
            hash_buf: HashUpdate::default(),
            batch: BatchScratch::default(),
            ids: crate::id_cache::IdCache::default(),
            watermark: Default::default(),
            step_waits: Default::default(),
        })
    }

    /// The Python objects this manager holds, for the garbage collector
    /// (the event sink is a bound method of the manager: a cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(side) = &self.py_side {
            visit.call(&side.empty)?;
            for sink in [&side.event_sink, &side.metrics_sink, &side.event_read]
                .into_iter()
                .flatten()
            {
                visit.call(sink)?;
            }
        }
        for request in self.ids.held_requests() {
            visit.call(request)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.py_side = None;
        self.ids.forget_requests();
    }

    /// Called once by the facade: the shared empty KVCacheBlocks, the event
    /// sink (None when events are off), whether lookups are counted and the
    /// block-metrics sink (None without a metrics collector), and what
    /// reads a request for the event sink before a call changes anything.
    /// `explain_step_waits`: an allocation whose hit waits for a step that
    /// never starts (`new_step_starts()` never called) raises, not None.
    #[pyo3(signature = (empty, event_sink, log_stats=false, metrics_sink=None, event_read=None,
                        explain_step_waits=false))]
    fn _bind_python(
        &mut self,
        empty: PyObject,
        event_sink: Option<PyObject>,
        log_stats: bool,
        metrics_sink: Option<PyObject>,
        event_read: Option<PyObject>,
        explain_step_waits: bool,
    ) {
        self.step_waits.explain = explain_step_waits;
        self.inner.set_record_block_metrics(metrics_sink.is_some());
        self.py_side = Some(Bound_ {
            empty,
            event_sink,
            metrics_sink,
            event_read,
        });
        self.inner.set_log_stats(log_stats);
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

    #[getter]
    fn coordinator_kind(&self) -> &'static str {
        self.inner.coordinator_kind()
    }

    fn num_known_hashes(&self, request_id: &str) -> usize {
        self.inner.num_known_hashes(request_id)
    }

    /// vLLM's `get_computed_blocks(request)`: the longest prefix-cache hit
    /// as (KVCacheBlocks, hit tokens); the request's new hashes are stored
    /// first, and the lookup is counted for prefix-cache stats.
    /// `max_cache_hit_length` (0.33.0): the most hit tokens; default
    /// `request.num_tokens - 1`.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn get_computed_blocks<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(PyObject, usize)> {
        let _in_call = enter(slf, "get_computed_blocks")?;
        let (blocks, hit, _) = lookup::computed_blocks(slf, request, max_cache_hit_length)?;
        Ok((blocks, hit))
    }

    /// 0.33.0's `get_computed_blocks`: (KVCacheBlocks, hit tokens,
    /// shared_prefix_boundary), the boundary where the longest hit one
    /// attention type found ends when it passes the hit, else 0.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn _get_computed_blocks_033<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(PyObject, usize, usize)> {
        let _in_call = enter(slf, "get_computed_blocks")?;
        lookup::computed_blocks(slf, request, max_cache_hit_length)
    }

    /// 0.33.0's `find_longest_cache_hit_per_group` (hybrid coordinators):
    /// (KVCacheBlocks, hit tokens per group).
    fn _find_longest_cache_hit_per_group<'py>(
        slf: &Bound<'py, Self>,
        block_hashes: &Bound<'py, PyAny>,
        max_cache_hit_length: &Bound<'py, PyAny>,
    ) -> PyResult<(PyObject, Vec<usize>)> {
        let _in_call = enter(slf, "find_longest_cache_hit_per_group")?;
        lookup::per_group_hits(slf, block_hashes, max_cache_hit_length)
    }

    /// 0.33.0's `get_computed_blocks_for_connector` core: (KVCacheBlocks,
    /// hit tokens, shared_prefix_boundary, hit_diverged), hit_diverged None
    /// where the reconciled lookup (`_get_computed_blocks_033`) answered.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn _get_computed_blocks_for_connector_033<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(PyObject, usize, usize, Option<bool>)> {
        let _in_call = enter(slf, "get_computed_blocks_for_connector")?;
        lookup::lookup(slf, request, max_cache_hit_length, true)
    }

    /// The release whose semantics this manager follows ("0.23.0", ...).
    #[getter]
    fn release(&self) -> &'static str {
        self.inner.profile().release
    }

    /// 0.33.0's multi-module MTP: the last `n` computed tokens are not
    /// cached (set at construction).
    fn _set_reprefillable_tokens(slf: &Bound<'_, Self>, n: &Bound<'_, PyAny>) -> PyResult<()> {
        let _in_call = enter(slf, "_set_reprefillable_tokens")?;
        let n = count_obj("num_reprefillable_tokens", n)?;
        let mut this = borrow_mut(slf)?;
        guard(|| this.inner.set_reprefillable_tokens(n))
    }

    /// 0.33.0's watermark: `blocks` stay free when a request whose status
    /// equals one of `statuses` is admitted while others are scheduled.
    fn _set_watermark(
        &mut self,
        blocks: &Bound<'_, PyAny>,
        statuses: Vec<PyObject>,
    ) -> PyResult<()> {
        self.watermark = crate::release_api::Watermark {
            blocks: count_obj("watermark_blocks", blocks)?,
            statuses,
        };
        Ok(())
    }

    /// 0.24+'s `pop_blocks_for_free(request)`, as block ids: the request is
    /// forgotten, its blocks (table order, leading nulls left out) stay
    /// referenced until `_free_handed_out`.
    fn _pop_blocks_for_free(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<Vec<u32>> {
        let _in_call = enter(slf, "pop_blocks_for_free")?;
        let (ids, _held) = {
            let mut this = borrow_mut(slf)?;
            let (_, held) = this.forget_request_object(request_id);
            (this.pop_handed_out(request_id), held)
        };
        Ok(ids) // `_held` dropped here, the manager settled (a finalizer may run)
    }

    /// 0.33.0's `record_blocks_for_zeroing(request_id, start_token)`: the
    /// request's blocks from `start_token` on, recorded for zeroing again
    /// in the groups that record new block ids.
    fn _record_blocks_for_zeroing(
        slf: &Bound<'_, Self>,
        request_id: &str,
        start_token: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _in_call = enter(slf, "record_blocks_for_zeroing")?;
        let start = count_obj("start_token", start_token)?;
        borrow_mut(slf)?
            .inner
            .record_blocks_for_zeroing(request_id, start)
            .map_err(to_py_err)
    }

    /// 0.28+'s `block_pool.free_blocks(blocks)` for blocks
    /// `_pop_blocks_for_free` handed out (objects with `block_id`, or ids),
    /// in eviction order; ValueError (nothing freed) for any other block.
    fn _free_handed_out(slf: &Bound<'_, Self>, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        let _in_call = enter(slf, "block_pool.free_blocks")?;
        borrow_mut(slf)?.free_handed_out(blocks)
    }

    /// Prefix-cache lookup counters since the last call, reset:
    /// (reset, requests, queries, hits, preempted_requests, preempted_queries, preempted_hits).
    #[pyo3(signature = (take=true))]
    fn _take_stats(slf: &Bound<'_, Self>, take: bool) -> PyResult<(bool, u64, u64, u64, u64, u64, u64)> {
        let _in_call = enter(slf, "make_prefix_cache_stats")?;
        let mut this = borrow_mut(slf)?;
        let s = if take {
            this.inner.take_stats()
        } else {
            this.inner.stats()
        };
        Ok((
            s.reset,
            s.requests,
            s.queries,
            s.hits,
            s.preempted_requests,
            s.preempted_queries,
            s.preempted_hits,
        ))
    }

    /// vLLM 0.23.0's `KVCacheManager.allocate_slots(request, num_new_tokens,
    /// num_new_computed_tokens=0, new_computed_blocks=None,
    /// num_lookahead_tokens=0, num_external_computed_tokens=0,
    /// delay_cache_blocks=False, num_encoder_tokens=0,
    /// full_sequence_must_fit=False, reserved_blocks=0)`; the parameters
    /// are matched as Python does (`allocate_params`). The facade's class
    /// has the raw entry point in its place (`_raw_methods`).
    #[pyo3(signature = (*args, **kwargs))]
    fn allocate_slots(
        slf: &Bound<'_, Self>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<PyObject> {
        let _in_call = enter(slf, "allocate_slots")?;
        allocate_params::call_matched(slf, args.iter(), kwargs.into_iter().flat_map(|k| k.iter()))
    }

    /// Method descriptors of `cls` (a subclass of this class) for
    /// `allocate_slots` and `cache_blocks`: the raw entry points, which skip
    /// PyO3's argument matching and answer most scheduler calls from the
    /// request's hot line. None without the `raw-ffi` feature.
    #[staticmethod]
    fn _raw_methods(
        cls: &Bound<'_, pyo3::types::PyType>,
    ) -> PyResult<Option<(PyObject, PyObject)>> {
        if !cls.is_subclass_of::<NativeManager>()? {
            return Err(PyTypeError::new_err(format!(
                "_raw_methods: {} is not a NativeManager subclass",
                cls.name()?
            )));
        }
        #[cfg(feature = "raw-ffi")]
        return Ok(Some((
            crate::raw_ffi::allocate_call::allocate_slots_descriptor(cls)?,
            crate::raw_ffi::cache_call::cache_blocks_descriptor(cls)?,
        )));
        #[cfg(not(feature = "raw-ffi"))]
        return {
            let _ = cls;
            Ok(None)
        };
    }

    /// The decode `allocate_slots` of a whole step in one call: for each
    /// request in order, exactly `allocate_slots(request, num_new_tokens[i],
    /// num_lookahead_tokens=num_lookahead_tokens)`. Returns `(ok, offsets,
    /// ids)`: `ok[i]` is False where that call would return None; the new
    /// block ids of request i in group g are
    /// `ids[offsets[i*G + g] : offsets[i*G + g + 1]]`. A serving loop that
    /// tracks the counts itself passes `num_computed_tokens` / `num_tokens`
    /// lists, and the requests' attributes are then not read (their block
    /// hashes still are, when a block fills).
    #[pyo3(signature = (requests, num_new_tokens, num_lookahead_tokens=None, num_computed_tokens=None, num_tokens=None))]
    fn allocate_decode_batch<'py>(
        slf: &Bound<'py, Self>,
        requests: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_lookahead_tokens: Option<&Bound<'py, PyAny>>,
        num_computed_tokens: Option<&Bound<'py, PyAny>>,
        num_tokens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, Bound<'py, PyList>)> {
        let _in_call = enter(slf, "allocate_decode_batch")?;
        batch::decode_batch(
            slf,
            requests,
            num_new_tokens,
            num_lookahead_tokens,
            num_computed_tokens,
            num_tokens,
        )
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
        let _in_call = enter(slf, "allocate_decode_arrays")?;
        batch::decode_arrays(
            slf,
            handles,
            num_new_tokens,
            num_computed_tokens,
            num_tokens,
            num_lookahead_tokens,
            requests,
        )
    }

    /// vLLM's `get_blocks(request_id)`: the request's blocks per group (the
    /// shared empty `KVCacheBlocks` for a request without blocks).
    fn get_blocks(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<PyObject> {
        let ids = borrow(slf)?.inner.get_block_ids(request_id);
        Self::make_blocks(slf, &ids)
    }

    /// vLLM's `free(request)`: frees the request's blocks, tail first.
    /// ValueError (nothing freed) for a held request whose id changed.
    fn free(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let _in_call = enter(slf, "free")?;
        let rid_obj = request_id(request)?;
        let rid = rid_obj.to_str()?;
        let _held = {
            let mut this = borrow_mut(slf)?;
            this.check_free_identity(request, &rid_obj)?;
            let (slot, held) = this.forget_request_object(rid);
            #[cfg(feature = "raw-ffi")]
            if let Some(s) = slot {
                this.inner
                    .for_each_free_line_at(s, crate::raw_ffi::prefetch);
            }
            #[cfg(not(feature = "raw-ffi"))]
            let _ = slot;
            guard(|| {
                this.inner.free(rid);
                Ok(())
            })?;
            held
        };
        // The request objects let go of are dropped here, the manager
        // settled and not borrowed (a finalizer may run and call it: it is
        // refused, this call being in progress).
        Ok(())
    }

    /// vLLM's `cache_blocks(request, num_computed_tokens)`.
    fn cache_blocks(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _in_call = enter(slf, "cache_blocks")?;
        Self::cache_blocks_impl(slf, request, num_computed_tokens)
    }

    /// `num_prompt_tokens` (vLLM 0.33.0's, None: not passed) frees R-SWA gaps.
    #[pyo3(signature = (request_id, total_computed_tokens, num_prompt_tokens=None))]
    fn remove_skipped_blocks(
        slf: &Bound<'_, Self>,
        request_id: &str,
        total_computed_tokens: &Bound<'_, PyAny>,
        num_prompt_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let _in_call = enter(slf, "remove_skipped_blocks")?;
        let total = count_obj("total_computed_tokens", total_computed_tokens)?;
        let prompt = num_prompt_tokens
            .filter(|p| !p.is_none())
            .map(|p| count_obj("num_prompt_tokens", p))
            .transpose()?;
        let mut this = borrow_mut(slf)?;
        guard(|| {
            this.inner
                .remove_skipped_blocks_of_prompt(request_id, total, prompt);
            Ok(())
        })
    }

    /// Drops the given blocks (any iterable of ids) from the prefix cache.
    fn evict_blocks(slf: &Bound<'_, Self>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let _in_call = enter(slf, "evict_blocks")?;
        // Read (the caller's iterable and ints run its code), then change.
        let mut values = Vec::new();
        for b in block_ids.try_iter()? {
            let b = b?;
            let v = b.extract::<i64>().map_err(|e| {
                if convert::caller_raised(slf.py(), &e) {
                    return e;
                }
                PyTypeError::new_err(format!(
                    "evict_blocks: block_ids must be ints, got {}",
                    convert::type_name(&b)
                ))
            })?;
            values.push(v);
        }
        {
            let mut this = borrow_mut(slf)?;
            let ids = values
                .into_iter()
                .map(|v| this.block_id(v))
                .collect::<PyResult<Vec<u32>>>()?;
            guard(|| this.inner.evict_blocks(&ids))?;
        }
        Self::flush_events(slf, None)
    }

    fn reset_prefix_cache(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let _in_call = enter(slf, "reset_prefix_cache")?;
        let ok = {
            let mut this = borrow_mut(slf)?;
            guard(|| Ok(this.inner.reset_prefix_cache()))?
        };
        Self::flush_events(slf, None)?;
        Ok(ok)
    }

    fn get_num_common_prefix_blocks(
        slf: &Bound<'_, Self>,
        running_request_id: &str,
    ) -> PyResult<Vec<usize>> {
        let _in_call = enter(slf, "get_num_common_prefix_blocks")?;
        let mut this = borrow_mut(slf)?;
        guard(|| Ok(this.inner.get_num_common_prefix_blocks(running_request_id)))
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
                        total_computed_tokens, num_tokens_main_model, apply_admission_cap=false,
                        prefill_end=None))]
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
        prefill_end: Option<&Bound<'_, PyAny>>,
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
        let pe = prefill_end.map_or(Ok(0), |v| count_obj("prefill_end", v))?;
        guard(|| {
            self.inner.get_num_blocks_to_allocate(
                request_id,
                n,
                &nc,
                e,
                t,
                mm,
                apply_admission_cap,
                pe,
            )
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
        slf: &Bound<'py, Self>,
        request_ids: Vec<String>,
        num_accepted: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let py = slf.py();
        let _in_call = enter(slf, "mamba_pre_copy_plan")?;
        let num_accepted = int_list("num_accepted", num_accepted, false)?;
        let ids: Vec<&str> = request_ids.iter().map(String::as_str).collect();
        let mut this = borrow_mut(slf)?;
        let rows = guard(|| this.inner.mamba_pre_copy_plan(&ids, &num_accepted))?;
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

    fn take_new_block_ids(slf: &Bound<'_, Self>) -> PyResult<Vec<u32>> {
        let _in_call = enter(slf, "take_new_block_ids")?;
        Ok(borrow_mut(slf)?.inner.take_new_block_ids())
    }

    fn new_step_starts(slf: &Bound<'_, Self>) -> PyResult<()> {
        let _in_call = enter(slf, "new_step_starts")?;
        let mut this = borrow_mut(slf)?;
        this.inner.new_step_starts();
        this.step_waits.started = true;
        Ok(())
    }

    /// Mamba align boundary states cached since the last take: {request
    /// id: [(group, block id, boundary tokens), ...]}, oldest first.
    fn _take_boundary_state_offloads_033<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        self.boundary_state_offloads(py)
    }
}

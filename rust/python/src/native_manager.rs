//! `NativeManager`, the Python class the facade extends: its state and
//! its Python methods, each a conversion around one core call.

use hybridcache_core::{BatchScratch, HashUpdate, KvCacheManager, NewBlocks};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::convert::{self, block_ids, count_obj, guard, ids_tuple, int_list, to_py_err};
use crate::{allocate_params, batch, lookup, request_id};

/// Python-side collaborators the facade binds after construction.
pub(crate) struct PythonSide {
    /// The shared empty `KVCacheBlocks` (vLLM hands out one instance).
    pub(crate) empty: PyObject,
    /// `sink(raw_events, request)` turns raw events into event objects.
    pub(crate) event_sink: Option<PyObject>,
    /// `sink(raw_metrics)` makes the metrics collector's calls, from the
    /// pool's log of them: a list of (kind, block_id), kind 0 allocated,
    /// 1 accessed, 2 evicted, 3 reset (block_id 0).
    pub(crate) metrics_sink: Option<PyObject>,
}

/// The native manager; use `hybridcache.KVCacheManager`, which extends it.
#[pyclass(module = "hybridcache._native", name = "NativeManager", subclass)]
pub(crate) struct NativeManager {
    pub(crate) inner: KvCacheManager,
    pub(crate) py_side: Option<PythonSide>,
    // The last allocation's new blocks (reused: a call allocates nothing).
    pub(crate) scratch: NewBlocks,
    // A decode's new block hashes on their way to the core (reused too).
    pub(crate) hash_buf: HashUpdate,
    // What `allocate_decode_arrays` reuses across steps.
    pub(crate) batch: BatchScratch,
    pub(crate) ids: crate::id_cache::IdCache,
    pub(crate) watermark: crate::release_api::Watermark,
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
        })
    }

    /// The Python objects this manager holds, for the garbage collector
    /// (the event sink is a bound method of the manager: a cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(side) = &self.py_side {
            visit.call(&side.empty)?;
            for sink in [&side.event_sink, &side.metrics_sink].into_iter().flatten() {
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
    /// block-metrics sink (None without a metrics collector).
    #[pyo3(signature = (empty, event_sink, log_stats=false, metrics_sink=None))]
    fn _bind_python(
        &mut self,
        empty: PyObject,
        event_sink: Option<PyObject>,
        log_stats: bool,
        metrics_sink: Option<PyObject>,
    ) {
        self.inner.set_record_block_metrics(metrics_sink.is_some());
        self.py_side = Some(PythonSide {
            empty,
            event_sink,
            metrics_sink,
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
        let (blocks, hit, _) = lookup::computed_blocks(slf, request, max_cache_hit_length)?;
        Ok((blocks, hit))
    }

    /// 0.33.0's `get_computed_blocks`: (KVCacheBlocks, hit tokens,
    /// shared_prefix_boundary), the boundary where the longest hit one
    /// attention type found ends when it passes the hit, else 0.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn _get_computed_blocks_with_boundary<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(PyObject, usize, usize)> {
        lookup::computed_blocks(slf, request, max_cache_hit_length)
    }

    /// 0.33.0's `find_longest_cache_hit_per_group` (hybrid coordinators):
    /// (KVCacheBlocks, hit tokens per group).
    fn _find_longest_cache_hit_per_group<'py>(
        slf: &Bound<'py, Self>,
        block_hashes: &Bound<'py, PyAny>,
        max_cache_hit_length: &Bound<'py, PyAny>,
    ) -> PyResult<(PyObject, Vec<usize>)> {
        lookup::per_group_hits(slf, block_hashes, max_cache_hit_length)
    }

    /// 0.33.0's `get_computed_blocks_for_connector` core: (KVCacheBlocks,
    /// hit tokens, shared_prefix_boundary, hit_diverged), hit_diverged None
    /// where the reconciled lookup (`_get_computed_blocks_with_boundary`) answered.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn _get_computed_blocks_for_connector<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(PyObject, usize, usize, Option<bool>)> {
        lookup::lookup(slf, request, max_cache_hit_length, true)
    }

    /// The release whose semantics this manager follows ("0.23.0", ...).
    #[getter]
    fn release(&self) -> &'static str {
        self.inner.profile().release
    }

    /// 0.33.0's multi-module MTP: the last `n` computed tokens are not
    /// cached (set at construction).
    fn _set_reprefillable_tokens(&mut self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = count_obj("num_reprefillable_tokens", n)?;
        guard(|| self.inner.set_reprefillable_tokens(n))
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
    fn _pop_blocks_for_free(&mut self, request_id: &str) -> Vec<u32> {
        let _ = self.forget_request_object(request_id);
        self.pop_handed_out(request_id)
    }

    /// 0.33.0's `record_blocks_for_zeroing(request_id, start_token)`: the
    /// request's blocks from `start_token` on, recorded for zeroing again
    /// in the groups that record new block ids.
    fn _record_blocks_for_zeroing(
        &mut self,
        request_id: &str,
        start_token: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let start = count_obj("start_token", start_token)?;
        self.inner
            .record_blocks_for_zeroing(request_id, start)
            .map_err(to_py_err)
    }

    /// 0.28+'s `block_pool.free_blocks(blocks)` for blocks
    /// `_pop_blocks_for_free` handed out (objects with `block_id`, or ids),
    /// in eviction order; ValueError (nothing freed) for any other block.
    fn _free_handed_out(&mut self, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        self.free_handed_out(blocks)
    }

    /// Prefix-cache lookup counters since the last call, reset:
    /// (reset, requests, queries, hits, preempted_requests, preempted_queries, preempted_hits).
    #[pyo3(signature = (take=true))]
    fn _take_stats(&mut self, take: bool) -> (bool, u64, u64, u64, u64, u64, u64) {
        let s = if take {
            self.inner.take_stats()
        } else {
            self.inner.stats()
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
        let ids = slf.borrow().inner.get_block_ids(request_id);
        Self::make_blocks(slf, &ids)
    }

    /// vLLM's `free(request)`: frees the request's blocks, tail first.
    fn free(&mut self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let rid = request_id(request)?;
        let rid = rid.to_str()?;
        let slot = self.forget_request_object(rid);
        #[cfg(feature = "raw-ffi")]
        if let Some(s) = slot {
            self.inner
                .for_each_free_line_at(s, crate::raw_ffi::prefetch);
        }
        #[cfg(not(feature = "raw-ffi"))]
        let _ = slot;
        guard(|| {
            self.inner.free(rid);
            Ok(())
        })
    }

    /// vLLM's `cache_blocks(request, num_computed_tokens)`.
    pub(crate) fn cache_blocks(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let n = count_obj("num_computed_tokens", num_computed_tokens)?;
        let rid = request_id(request)?;
        {
            let mut this = slf.borrow_mut();
            if !this.inner.enable_caching() {
                return Ok(());
            }
            // A held request by its id object's address (0.33.0 caches
            // every running request every step): no str hashing.
            if let Some(slot) = this.lookup_id(&rid)? {
                crate::calls::cache_held(&mut this, request, slot, n)?;
            } else {
                let rid = rid.to_str()?;
                let update = this.pending_hashes(request, rid)?;
                crate::calls::note_shared_prefix_boundary(&mut this.inner, request, rid)?;
                guard(|| this.inner.cache_blocks(rid, n, update))?;
            }
        }
        Self::flush_events(slf, Some(request))
    }

    /// `num_prompt_tokens` (vLLM 0.33.0's, None: not passed) frees R-SWA gaps.
    #[pyo3(signature = (request_id, total_computed_tokens, num_prompt_tokens=None))]
    fn remove_skipped_blocks(
        &mut self,
        request_id: &str,
        total_computed_tokens: &Bound<'_, PyAny>,
        num_prompt_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let total = count_obj("total_computed_tokens", total_computed_tokens)?;
        let prompt = num_prompt_tokens
            .filter(|p| !p.is_none())
            .map(|p| count_obj("num_prompt_tokens", p))
            .transpose()?;
        guard(|| {
            self.inner
                .remove_skipped_blocks_of_prompt(request_id, total, prompt);
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

    /// Mamba align boundary states cached since the last take: {request
    /// id: [(group, block id, boundary tokens), ...]}, oldest first.
    fn _take_boundary_state_offloads<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        self.boundary_state_offloads(py)
    }
}

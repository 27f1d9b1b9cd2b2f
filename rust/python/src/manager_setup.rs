//! `NativeManager`'s construction, its tie to the Python side (the
//! facade's empty blocks, event and metrics sinks, the garbage collector's
//! view of what it holds), the settings the facade makes once, and the
//! reads of its size and counters.

use hybridcache_core::{BatchScratch, HashUpdate, KvCacheManager, NewBlocks};
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::call_guard::{borrow, borrow_mut, enter};
use crate::convert::{count_obj, guard};
use crate::id_cache::IdCache;
use crate::native_manager::{NativeManager, PythonSide, Watermark};

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
            ids: IdCache::default(),
            watermark: Default::default(),
            step_waits: Default::default(),
            read_gate: Default::default(),
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
        drop(self.ids.forget_requests());
    }

    /// Called once by the facade: the shared empty KVCacheBlocks, the event
    /// sink (None when events are off), whether lookups are counted and the
    /// block-metrics sink (None without a metrics collector), what reads a
    /// request for the event sink before a call changes anything, and
    /// whether an allocation whose hit waits for a step that never starts
    /// (`new_step_starts()` never called) raises rather than answering None.
    #[pyo3(signature = (empty, event_sink, log_stats=false, metrics_sink=None, event_read=None,
                        explain_step_waits=false))]
    fn _bind_python(
        slf: &Bound<'_, Self>,
        empty: PyObject,
        event_sink: Option<PyObject>,
        log_stats: bool,
        metrics_sink: Option<PyObject>,
        event_read: Option<PyObject>,
        explain_step_waits: bool,
    ) -> PyResult<()> {
        let _in_call = enter(slf, "_bind_python")?;
        let earlier = {
            let mut this = borrow_mut(slf)?;
            this.step_waits.explain = explain_step_waits;
            this.inner.set_record_block_metrics(metrics_sink.is_some());
            this.inner.set_log_stats(log_stats);
            this.py_side.replace(PythonSide {
                empty,
                event_sink,
                metrics_sink,
                event_read,
            })
        };
        // What it replaces is dropped with the manager settled.
        drop(earlier);
        Ok(())
    }

    #[getter]
    fn num_blocks(slf: &Bound<'_, Self>) -> PyResult<u32> {
        Ok(borrow(slf)?.inner.pool().num_blocks())
    }

    #[getter]
    fn num_free_blocks(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf)?.inner.pool().num_free_blocks())
    }

    #[getter]
    fn usage(slf: &Bound<'_, Self>) -> PyResult<f64> {
        Ok(borrow(slf)?.inner.usage())
    }

    #[getter]
    fn num_requests(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf)?.inner.num_requests())
    }

    #[getter]
    fn coordinator_kind(slf: &Bound<'_, Self>) -> PyResult<&'static str> {
        Ok(borrow(slf)?.inner.coordinator_kind())
    }

    fn num_known_hashes(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<usize> {
        Ok(borrow(slf)?.inner.num_known_hashes(request_id))
    }

    /// The behaviour profile this manager follows ("whole-block-hits", ...).
    #[getter]
    fn profile(slf: &Bound<'_, Self>) -> PyResult<&'static str> {
        Ok(borrow(slf)?.inner.profile().name)
    }

    /// vLLM's multi-module MTP: the last `n` computed tokens are not
    /// cached (set at construction).
    fn _set_reprefillable_tokens(slf: &Bound<'_, Self>, n: &Bound<'_, PyAny>) -> PyResult<()> {
        let _in_call = enter(slf, "_set_reprefillable_tokens")?;
        let n = count_obj("num_reprefillable_tokens", n)?;
        let mut this = borrow_mut(slf)?;
        guard(|| this.inner.set_reprefillable_tokens(n))
    }

    /// vLLM's watermark: `blocks` stay free when a request whose status
    /// equals one of `statuses` is admitted while others are scheduled.
    fn _set_watermark(
        slf: &Bound<'_, Self>,
        blocks: &Bound<'_, PyAny>,
        statuses: Vec<PyObject>,
    ) -> PyResult<()> {
        let _in_call = enter(slf, "_set_watermark")?;
        let blocks = count_obj("watermark_blocks", blocks)?;
        let earlier = std::mem::replace(
            &mut borrow_mut(slf)?.watermark,
            Watermark { blocks, statuses },
        );
        drop(earlier);
        Ok(())
    }

    /// Prefix-cache lookup counters since the last call, reset:
    /// (reset, requests, queries, hits, preempted_requests, preempted_queries, preempted_hits).
    #[pyo3(signature = (take=true))]
    fn _take_stats(
        slf: &Bound<'_, Self>,
        take: bool,
    ) -> PyResult<(bool, u64, u64, u64, u64, u64, u64)> {
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
}

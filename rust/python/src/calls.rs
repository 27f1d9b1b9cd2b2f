//! What the Python methods share: the allocation entry (both the PyO3
//! method and the raw builtin land in `allocate_slots_impl`), lazy reads of
//! request attributes, block-id conversion and the event hand-off.

use hybridcache_core::{AllocateArgs, BlockMetric, HashUpdate, KvCacheManager, PoolEvent};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::blocks::KVCacheBlocks;
use crate::convert::{
    self, block_ids, count_obj, fill_hash_update, guard, hash_update, req_attr, request_num_tokens,
};
use crate::native_manager::{NativeManager, PythonSide};
use crate::py_args::{opt_count, request_id, NUM_TOKENS_UNREAD};

/// The optional arguments of `allocate_slots` as given (None: left out;
/// the flags already converted, as PyO3 does first).
pub(crate) struct AllocateSlotsArgs<'a, 'py> {
    pub(crate) num_new_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    pub(crate) new_computed_blocks: Option<&'a Bound<'py, PyAny>>,
    pub(crate) num_lookahead_tokens: Option<&'a Bound<'py, PyAny>>,
    pub(crate) num_external_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    pub(crate) delay_cache_blocks: bool,
    pub(crate) num_encoder_tokens: Option<&'a Bound<'py, PyAny>>,
    pub(crate) full_sequence_must_fit: bool,
    pub(crate) reserved_blocks: Option<&'a Bound<'py, PyAny>>,
    /// Some request is already scheduled this step (the watermark applies
    /// only then); True when left out (a step argument: `PARAMS`).
    pub(crate) has_scheduled_reqs: bool,
    /// Groups whose external-token blocks an async load writes (a step
    /// argument).
    pub(crate) skip_zeroing_group_ids: Option<&'a Bound<'py, PyAny>>,
}

pub(crate) fn raw_events<'py>(
    py: Python<'py>,
    events: Vec<PoolEvent>,
) -> PyResult<Bound<'py, PyList>> {
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
            PoolEvent::RemovedSet { keys } => {
                let keys = keys.iter().map(|(h, g)| (bytes(h), *g));
                ("removed_set", PyList::new(py, keys)?).into_pyobject(py)
            }
            PoolEvent::AllCleared => ("cleared",).into_pyobject(py),
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// `request.num_prompt_tokens` when the core wants it (sparse retention,
/// and the request's prompt length is not known yet); None, unread, else.
#[inline]
pub(crate) fn prompt_len_if_wanted(
    inner: &KvCacheManager,
    slot: Option<u32>,
    request: &Bound<'_, PyAny>,
) -> PyResult<Option<usize>> {
    if !inner.wants_num_prompt_tokens(slot) {
        return Ok(None);
    }
    let n = req_attr(request, intern!(request.py(), "num_prompt_tokens"))?;
    count_obj("request.num_prompt_tokens", &n).map(Some)
}

/// The request fields the profile's rules read at an allocation, when the core
/// wants them: `shared_prefix_boundary` (sparse retention keeps it) and
/// `num_in_flight_tokens` (window frees lag them); unread otherwise.
#[inline]
pub(crate) fn read_in_flight_fields(
    inner: &KvCacheManager,
    request: &Bound<'_, PyAny>,
    args: &mut AllocateArgs,
) -> PyResult<()> {
    let py = request.py();
    if inner.wants_shared_prefix_boundary() {
        let n = req_attr(request, intern!(py, "shared_prefix_boundary"))?;
        args.shared_prefix_boundary = Some(count_obj("request.shared_prefix_boundary", &n)?);
    }
    if inner.wants_num_in_flight_tokens() {
        let n = req_attr(request, intern!(py, "num_in_flight_tokens"))?;
        args.num_in_flight_tokens = count_obj("request.num_in_flight_tokens", &n)?;
    }
    Ok(())
}

impl NativeManager {
    /// `allocate_slots` after argument matching (both entries land here).
    pub(crate) fn allocate_slots_impl(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_new_tokens: &Bound<'_, PyAny>,
        opt: AllocateSlotsArgs<'_, '_>,
    ) -> PyResult<PyObject> {
        let py = slf.py();
        let rid = request_id(request)?;
        let new_computed = Self::computed_ids(slf, opt.new_computed_blocks)?;
        let skip_zeroing_groups = match opt.skip_zeroing_group_ids {
            Some(groups) => {
                crate::call_guard::borrow(slf)?.group_mask("skip_zeroing_group_ids", groups)?
            }
            None => 0,
        };
        let watermark_blocks = if opt.has_scheduled_reqs {
            crate::call_guard::borrow(slf)?.watermark_for(request)?
        } else {
            0
        };
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
            watermark_blocks,
            skip_zeroing_groups,
            // Read in `allocate_general`, if the core wants them.
            num_prompt_tokens: None,
            shared_prefix_boundary: None,
            num_in_flight_tokens: 0,
        };
        Self::allocation_result(slf, request, |this| {
            let ok = this.allocate_one(request, &rid, args)?;
            if !ok {
                this.step_waits
                    .check(&this.inner, new_computed.as_deref())?;
            }
            Ok(ok)
        })
    }

    /// Runs one allocation (`allocate` answers vLLM's None with false) and
    /// returns its result, its events and block metrics handed to the sinks.
    pub(crate) fn allocation_result(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        allocate: impl FnOnce(&mut Self) -> PyResult<bool>,
    ) -> PyResult<PyObject> {
        let source = Self::event_source(slf, request)?;
        let (result, has_events) = {
            let mut this = crate::call_guard::borrow_mut(slf)?;
            let ok = allocate(&mut this)?;
            let result = if ok {
                this.scratch_blocks(slf)?
            } else {
                slf.py().None()
            };
            let pending = this.inner.has_events() || this.inner.has_block_metrics();
            (result, pending)
        };
        if has_events {
            Self::flush_events(slf, Some(source.as_ref().unwrap_or(request)))?;
        }
        Ok(result)
    }

    /// What the event sink reads of `request`, read now, before the call
    /// changes anything (the facade's `event_read`); None when events are
    /// off or the sink reads the request itself.
    pub(crate) fn event_source<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let read = {
            let this = crate::call_guard::borrow(slf)?;
            match this.py_side.as_ref() {
                Some(crate::native_manager::PythonSide {
                    event_sink: Some(_),
                    event_read: Some(read),
                    ..
                }) => read.clone_ref(slf.py()),
                _ => return Ok(None),
            }
        };
        read.bind(slf.py()).call1((request,)).map(Some)
    }
}

impl NativeManager {
    pub(crate) fn block_id(&self, b: i64) -> PyResult<u32> {
        let n = self.inner.pool().num_blocks();
        u32::try_from(b).ok().filter(|&b| b < n).ok_or_else(|| {
            PyValueError::new_err(format!(
                "block id {b} out of range: the pool has {n} blocks"
            ))
        })
    }

    pub(crate) fn py_side(&self) -> PyResult<&PythonSide> {
        self.py_side.as_ref().ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("NativeManager used before _bind_python")
        })
    }

    /// Whether `block_hashes` (the request's list) extends the `known`
    /// hashes the core holds for `slot`. Each hash chains all before it,
    /// so comparing the last known one compares them all.
    pub(crate) fn same_request_hashes(
        &self,
        slot: u32,
        block_hashes: &Bound<'_, PyAny>,
        known: usize,
    ) -> PyResult<bool> {
        let Ok(list) = block_hashes.downcast::<PyList>() else {
            return Ok(true); // the read that follows names the type error
        };
        if list.len() < known {
            return Ok(true); // a resend: the usual checks apply
        }
        let theirs = list.get_item(known - 1)?;
        let ours = self.inner.known_hash_at(slot, known - 1);
        Ok(theirs
            .downcast::<PyBytes>()
            .map_or(true, |b| Some(b.as_bytes()) == ours))
    }

    /// The hashes of `request` the core lacks (None when caching is off):
    /// those past the known ones, or all of them (replacing the old) when
    /// the request holds no blocks and its hashes do not extend what the
    /// core has (a new request reusing an id). Used by lookups and
    /// cache_blocks; allocation uses `allocate_one`.
    pub(crate) fn pending_hashes(
        &self,
        request: &Bound<'_, PyAny>,
        rid: &str,
    ) -> PyResult<Option<HashUpdate>> {
        self.pending_hashes_at(request, self.inner.lookup(rid))
    }

    /// `pending_hashes` for the request in `slot` (None: not held).
    pub(crate) fn pending_hashes_at(
        &self,
        request: &Bound<'_, PyAny>,
        slot: Option<u32>,
    ) -> PyResult<Option<HashUpdate>> {
        if !self.inner.enable_caching() {
            return Ok(None);
        }
        let hashes = req_attr(request, intern!(request.py(), "block_hashes"))?;
        let known = self.inner.known_hashes_at(slot);
        match slot {
            Some(s)
                if known > 0
                    && !self.inner.holds_blocks_at(s)
                    && !self.same_request_hashes(s, &hashes, known)? =>
            {
                Ok(Some(hash_update(&hashes, 0)?.unwrap_or_default()))
            }
            _ => hash_update(&hashes, known),
        }
    }

    /// One allocation into `self.scratch`; false for vLLM's None.
    /// `args.num_tokens` of `NUM_TOKENS_UNREAD` means not read yet: a
    /// decode that changes no block is done without it (it only bounds
    /// caching, so the no-op test with an upper bound is exact), otherwise
    /// it is read from `request`. The request's new hashes are read only if
    /// caching may need them (a block filled since they were last sent).
    pub(crate) fn allocate_one(
        &mut self,
        request: &Bound<'_, PyAny>,
        rid: &Bound<'_, PyString>,
        args: AllocateArgs,
    ) -> PyResult<bool> {
        let slot = self.checked_slot(request, rid)?;
        if let Some(s) = slot {
            let (inner, out) = (&mut self.inner, &mut self.scratch);
            if guard(|| Ok(inner.try_noop_decode(s, &args, out)))? {
                return Ok(true);
            }
        }
        self.allocate_general(slot, request, Some(rid), args)
    }

    /// `allocate_one` past the no-op decode test (which failed, or does
    /// not apply).
    pub(crate) fn allocate_general(
        &mut self,
        slot: Option<u32>,
        request: &Bound<'_, PyAny>,
        rid: Option<&Bound<'_, PyString>>,
        mut args: AllocateArgs,
    ) -> PyResult<bool> {
        if slot.is_none() && self.inner.enable_caching() {
            // A new request: its hashes are about to be used.
            crate::hash_size::check(request, self.inner.pool().hash_block_size())?;
        }
        if args.num_tokens == NUM_TOKENS_UNREAD {
            args.num_tokens = request_num_tokens(request)?;
        }
        args.num_prompt_tokens = prompt_len_if_wanted(&self.inner, slot, request)?;
        read_in_flight_fields(&self.inner, request, &mut args)?;
        let has_update = self.update_if_needed(slot, request, &args)?;
        let (inner, out) = (&mut self.inner, &mut self.scratch);
        let update = has_update.then_some(&self.hash_buf);
        match slot {
            // A held request's id is the core's own: no UTF-8 view of the str.
            Some(s) => {
                let ok = guard(|| inner.allocate_held_into(s, &args, update, out))?;
                if ok && self.held_object(s).is_none() {
                    // A slot its lookup made: known by its object from now on.
                    self.remember_new_request(request, s, rid);
                }
                Ok(ok)
            }
            None => {
                // A new request: callers with no slot pass the id they read.
                let rid = match rid {
                    Some(r) => r.clone(),
                    None => request_id(request)?,
                };
                let id = rid.to_str()?;
                let ok = guard(|| inner.allocate_general_into(None, id, &args, update, out))?;
                if let Some(s) = self.inner.lookup(id).filter(|_| ok) {
                    // Known by its object from now on (see `checked_slot`).
                    self.remember_new_request(request, s, Some(&rid));
                }
                Ok(ok)
            }
        }
    }

    /// The request's hashes the core lacks, read only when this allocation
    /// may cache a block they cover.
    /// True when `hash_buf` now holds them.
    pub(crate) fn update_if_needed(
        &mut self,
        slot: Option<u32>,
        request: &Bound<'_, PyAny>,
        args: &AllocateArgs,
    ) -> PyResult<bool> {
        let known = self.inner.known_hashes_at(slot);
        if let Some(s) = slot.filter(|&s| known > 0 && !self.inner.holds_blocks_at(s)) {
            let hashes = req_attr(request, intern!(request.py(), "block_hashes"))?;
            if !self.same_request_hashes(s, &hashes, known)? {
                // A new request reusing the id: its hashes replace the old.
                self.hash_buf.hashes.clear();
                fill_hash_update(&hashes, 0, &mut self.hash_buf)?;
                self.hash_buf.offset = 0;
                return Ok(true);
            }
        }
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
    pub(crate) fn scratch_blocks(&self, slf: &Bound<'_, Self>) -> PyResult<PyObject> {
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
    pub(crate) fn computed_ids(
        slf: &Bound<'_, Self>,
        blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Vec<Vec<u32>>>> {
        let Some(blocks) = blocks else {
            return Ok(None);
        };
        let this = crate::call_guard::borrow(slf)?;
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
        let groups = blocks.getattr(intern!(py, "blocks")).map_err(|e| {
            convert::or_caller(py, e, || {
                PyTypeError::new_err(format!(
                    "new_computed_blocks must be KVCacheBlocks, got {}",
                    convert::type_name(blocks)
                ))
            })
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

    /// Hands the pool's log of metrics-collector calls to the facade's sink
    /// (the log is kept only while a sink is bound).
    pub(crate) fn flush_block_metrics(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (sink, log) = {
            let mut this = crate::call_guard::borrow_mut(slf)?;
            if !this.inner.has_block_metrics() {
                return Ok(());
            }
            let log = this.inner.take_block_metrics();
            match this.py_side.as_ref().and_then(|s| s.metrics_sink.as_ref()) {
                Some(sink) => (sink.clone_ref(py), log),
                None => return Ok(()),
            }
        };
        let raw = log.into_iter().map(|m| match m {
            BlockMetric::Allocated(b) => (0u8, b),
            BlockMetric::Accessed(b) => (1, b),
            BlockMetric::Evicted(b) => (2, b),
            BlockMetric::Reset => (3, 0),
        });
        sink.call1(py, (PyList::new(py, raw)?,))?;
        Ok(())
    }

    /// Hands pending events to the facade's sink, with the request they
    /// came from, and the block metrics to theirs.
    pub(crate) fn flush_events(
        slf: &Bound<'_, Self>,
        request: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        Self::flush_block_metrics(slf)?;
        let py = slf.py();
        let (sink, events) = {
            let mut this = crate::call_guard::borrow_mut(slf)?;
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
    pub(crate) fn make_blocks(slf: &Bound<'_, Self>, ids: &[Vec<u32>]) -> PyResult<PyObject> {
        let py = slf.py();
        let this = crate::call_guard::borrow(slf)?;
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

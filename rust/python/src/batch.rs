//! The batched calls' conversion. `allocate_decode_arrays`: the core runs
//! the batch (`KvCacheManager::allocate_decode_batch`); this reads the
//! requests' `block_hashes` when the core asks for them.
//! `allocate_decode_batch`: one `allocate_slots` per request, in order,
//! the results laid out by the core's `BatchResult`.

use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};

use hybridcache_core::{AllocateArgs, BatchResult, DecodeBatch, HashUpdate, PoolEvent, ReqSlot};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::call_guard::{borrow, borrow_mut};
use crate::calls::{prompt_len_if_wanted, raw_events, read_in_flight_fields};
use crate::convert::{
    count, count_obj, fill_hash_update, guard, hash_update, req_attr, to_py_err, u32_bytes,
    uint_array,
};
use crate::native_manager::NativeManager;
use crate::py_args::{opt_count, request_id, NUM_TOKENS_UNREAD};

/// The per-request inputs of one step, as typed slices.
pub struct DecodeArrays<'a> {
    pub handles: Cow<'a, [u64]>,
    pub num_new_tokens: Cow<'a, [u32]>,
    pub num_computed_tokens: Cow<'a, [u32]>,
    pub num_tokens: Cow<'a, [u32]>,
    pub lookahead: usize,
}

/// `allocate_decode_arrays`' result: (ok, offsets, ids) as bytes.
type ArrayStep<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

/// A core error or the Python error of a hash read.
struct BatchErr(PyErr);

impl From<hybridcache_core::CoreError> for BatchErr {
    fn from(e: hybridcache_core::CoreError) -> Self {
        BatchErr(to_py_err(e))
    }
}

/// Runs one step. `requests[i]` is read only for `block_hashes`, and only
/// when request i fills a block.
pub fn run(
    state: &mut NativeManager,
    py: Python<'_>,
    a: &DecodeArrays<'_>,
    requests: Option<&Bound<'_, PyList>>,
    events_on: bool,
) -> PyResult<BatchResult> {
    let batch = DecodeBatch {
        handles: &a.handles,
        num_new_tokens: &a.num_new_tokens,
        num_computed_tokens: &a.num_computed_tokens,
        num_tokens: &a.num_tokens,
        lookahead: a.lookahead,
    };
    let (inner, scratch) = (&mut state.inner, &mut state.batch);
    let fill = |i: usize, known: usize, id: &str, out: &mut _| -> Result<bool, BatchErr> {
        let Some(reqs) = requests else {
            return Err(BatchErr(PyValueError::new_err(format!(
                "request {id:?} fills a block this step: pass requests= so its block_hashes can be read"
            ))));
        };
        let hashes = reqs
            .get_item(i)
            .and_then(|r| req_attr(&r, intern!(py, "block_hashes")))
            .map_err(BatchErr)?;
        fill_hash_update(&hashes, known, out).map_err(BatchErr)
    };
    match catch_unwind(AssertUnwindSafe(|| {
        inner.allocate_decode_batch(&batch, scratch, events_on, fill)
    })) {
        Ok(r) => r.map_err(|e| e.0),
        Err(_) => Err(PyRuntimeError::new_err(
            "hybridcache core panicked (bug); state may be inconsistent",
        )),
    }
}

pub(crate) fn decode_batch<'py>(
    slf: &Bound<'py, NativeManager>,
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
    let counts_arg = |name: &str, v: Option<&Bound<'py, PyAny>>| -> PyResult<Option<Vec<usize>>> {
        let Some(v) = v else { return Ok(None) };
        let vals: Vec<i64> = v.extract().map_err(|e| {
            crate::convert::or_caller(py, e, || {
                PyTypeError::new_err(format!("{name} must be a list of ints"))
            })
        })?;
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
    let lists = DecodeLists {
        num_new_tokens: counts_arg("num_new_tokens", Some(num_new_tokens))?.expect("given"),
        num_computed_tokens: counts_arg("num_computed_tokens", num_computed_tokens)?,
        num_tokens: counts_arg("num_tokens", num_tokens)?,
        lookahead,
    };
    let (result, pending_events) = {
        let mut this = borrow_mut(slf)?;
        let events_on = this
            .py_side
            .as_ref()
            .is_some_and(|s| s.event_sink.is_some());
        run_requests(&mut this, requests, &lists, events_on)?
    };
    if !pending_events.is_empty() {
        let sink = borrow(slf)?
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
    NativeManager::flush_block_metrics(slf)?;
    let ok = result.ok.iter().map(|&b| b != 0);
    Ok((
        PyList::new(py, ok)?,
        PyList::new(py, result.offsets)?,
        PyList::new(py, result.ids)?,
    ))
}

/// `event_read(request)` (what the event sink reads of a request) for
/// each request of an array step whose decode may make events (one that
/// changes blocks or caches them), read before the step changes anything;
/// None for the others, and all None without an event reader or requests.
fn event_sources<'py>(
    slf: &Bound<'py, NativeManager>,
    a: &DecodeArrays<'_>,
    requests: Option<&Bound<'py, PyList>>,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let py = slf.py();
    let read = match (requests, borrow(slf)?.py_side.as_ref()) {
        (
            Some(_),
            Some(crate::native_manager::PythonSide {
                event_sink: Some(_),
                event_read: Some(read),
                ..
            }),
        ) => read.clone_ref(py),
        _ => return Ok(Vec::new()),
    };
    let Some(list) = requests else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(a.handles.len());
    for (i, &handle) in a.handles.iter().enumerate() {
        let changes = {
            let this = borrow(slf)?;
            let inner = &this.inner;
            inner.slot_of_handle(handle).is_some_and(|s| {
                let args = AllocateArgs {
                    num_new_tokens: a.num_new_tokens[i] as usize,
                    num_computed_tokens: a.num_computed_tokens[i] as usize,
                    num_tokens: a.num_tokens[i] as usize,
                    num_lookahead_tokens: a.lookahead,
                    ..Default::default()
                };
                inner.may_need_hashes(inner.known_hashes_at(Some(s)), &args)
                    || !inner.is_noop_decode(s, &args)
            })
        };
        if !changes {
            out.push(None);
            continue;
        }
        let request = list.get_item(i)?;
        // A missing field says what is wrong, as the other reads of a
        // request do (any other error propagates unchanged).
        let source = read.bind(py).call1((&request,)).map_err(|e| {
            if !e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) {
                return e;
            }
            PyTypeError::new_err(format!(
                "requests[{i}] must be a vLLM Request ({}), got {}",
                e.value(py),
                crate::convert::type_name(&request)
            ))
        })?;
        out.push(Some(source));
    }
    Ok(out)
}

/// The per-request counts of `allocate_decode_batch` (None: read from the
/// request objects).
struct DecodeLists {
    num_new_tokens: Vec<usize>,
    num_computed_tokens: Option<Vec<usize>>,
    num_tokens: Option<Vec<usize>>,
    lookahead: usize,
}

/// One request of `allocate_decode_batch` as pass 1 read and checked it.
struct Checked<'py> {
    request: Bound<'py, PyAny>,
    /// What the event sink reads of the request (the facade's
    /// `event_read(request)`, read in pass 1), or the request.
    source: Bound<'py, PyAny>,
    rid: Bound<'py, PyString>,
    slot: Option<ReqSlot>,
    args: AllocateArgs<'static>,
    /// None: a decode that changes no block; else its hash update, if any.
    general: Option<Option<HashUpdate>>,
}

type RequestEvents<'py> = Vec<(Vec<PoolEvent>, Bound<'py, PyAny>)>;

/// `allocate_decode_batch`: every request is read and checked by the core
/// first (as the array step is), so an error leaves the manager as it was;
/// then each is allocated in order from what pass 1 read.
fn run_requests<'py>(
    state: &mut NativeManager,
    requests: &Bound<'py, PyList>,
    lists: &DecodeLists,
    events_on: bool,
) -> PyResult<(BatchResult, RequestEvents<'py>)> {
    let py = requests.py();
    let n = requests.len();
    let mut items = Vec::with_capacity(n);
    // Pass 1: read and check; only the id cache changes.
    state.batch.start(state.inner.slot_capacity());
    let mut new_ids: Vec<String> = Vec::new();
    let event_read = state
        .py_side
        .as_ref()
        .and_then(|s| s.event_read.as_ref())
        .filter(|_| events_on)
        .map(|r| r.clone_ref(py));
    for (i, request) in requests.iter().enumerate() {
        // The binding's own errors name the request; the caller's own
        // (raised by its code) propagate unchanged.
        let at = |e: PyErr| {
            if crate::convert::caller_raised(py, &e) {
                return e;
            }
            PyErr::from_type(e.get_type(py), format!("requests[{i}]: {}", e.value(py)))
        };
        let rid = request_id(&request).map_err(at)?;
        let num_computed = match &lists.num_computed_tokens {
            Some(c) => c[i],
            None => count_obj(
                "request.num_computed_tokens",
                &req_attr(&request, intern!(py, "num_computed_tokens")).map_err(at)?,
            )
            .map_err(at)?,
        };
        let mut args = AllocateArgs {
            num_new_tokens: lists.num_new_tokens[i],
            num_computed_tokens: num_computed,
            num_tokens: lists
                .num_tokens
                .as_ref()
                .map_or(NUM_TOKENS_UNREAD, |t| t[i]),
            num_lookahead_tokens: lists.lookahead,
            // As allocate_slots(request, n, num_lookahead_tokens=k) does.
            watermark_blocks: state.watermark_for(&request).map_err(at)?,
            ..Default::default()
        };
        let slot = state.checked_slot(&request, &rid).map_err(at)?;
        let twice = match slot {
            Some(s) => !state.batch.mark(s),
            None => {
                let id = rid.to_str()?;
                let seen = new_ids.iter().any(|x| x == id);
                new_ids.push(id.to_owned());
                seen
            }
        };
        if twice {
            return Err(PyValueError::new_err(format!(
                "requests[{i}]: request {rid} appears twice in one step"
            )));
        }
        let inner = &state.inner;
        let known = inner.known_hashes_at(slot);
        let noop = slot.is_some_and(|s| {
            !inner.may_need_hashes(known, &args) && inner.is_noop_decode(s, &args)
        });
        let general = if noop {
            None
        } else {
            if args.num_tokens == NUM_TOKENS_UNREAD {
                args.num_tokens = crate::convert::request_num_tokens(&request).map_err(at)?;
            }
            let update = if inner.may_need_hashes(known, &args) {
                hash_update(
                    &req_attr(&request, intern!(py, "block_hashes")).map_err(at)?,
                    known,
                )
                .map_err(at)?
            } else {
                None
            };
            args.num_prompt_tokens = prompt_len_if_wanted(inner, slot, &request).map_err(at)?;
            read_in_flight_fields(inner, &request, &mut args).map_err(at)?;
            let id = rid.to_str()?;
            guard(|| inner.check_allocate(slot, id, &args, update.as_ref())).map_err(at)?;
            Some(update)
        };
        let source = match (&event_read, &general) {
            (Some(read), Some(_)) => read.bind(py).call1((&request,))?,
            _ => request.clone(),
        };
        items.push(Checked {
            source,
            request,
            rid,
            slot,
            args,
            general,
        });
    }

    // Pass 2: allocate, in order, from what pass 1 read.
    let num_groups = state.inner.num_groups();
    let mut result = BatchResult::with_capacity(n, num_groups);
    let mut events = Vec::new();
    for item in items {
        let got = match (&item.general, item.slot) {
            (None, Some(s)) => {
                state.inner.record_noop_decode(s, &item.args);
                state.scratch.clear();
                state.scratch.push_empty_groups(num_groups);
                true
            }
            (Some(update), slot) => {
                let (inner, out) = (&mut state.inner, &mut state.scratch);
                let rid = item.rid.to_str()?;
                let ok = guard(|| match slot {
                    Some(s) => Ok(inner.allocate_checked(s, &item.args, update.as_ref(), out)),
                    None => {
                        inner.allocate_general_into(None, rid, &item.args, update.as_ref(), out)
                    }
                })?;
                if slot.is_none() && ok {
                    if let Some(s) = state.inner.lookup(rid) {
                        state.remember_new_request(&item.request, s, Some(&item.rid));
                    }
                }
                ok
            }
            (None, None) => unreachable!("a no-op decode has a slot"),
        };
        if events_on && state.inner.has_events() {
            events.push((state.inner.take_events(), item.source.clone()));
        }
        result.push(got, &state.scratch, num_groups);
    }
    Ok((result, events))
}

#[pymethods]
impl NativeManager {
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
        let _in_call = crate::call_guard::enter(slf, "allocate_decode_batch")?;
        decode_batch(
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
    fn request_handle(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<u64> {
        let handle = crate::call_guard::borrow(slf)?.inner.handle(request_id);
        handle.ok_or_else(|| {
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
    ) -> PyResult<ArrayStep<'py>> {
        let _in_call = crate::call_guard::enter(slf, "allocate_decode_arrays")?;
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
        let arrays = DecodeArrays {
            handles,
            num_new_tokens: new_tokens,
            num_computed_tokens: computed,
            num_tokens: totals,
            lookahead,
        };
        // What the event sink reads of each request that may make events,
        // read before anything changes (a read that raises changes nothing).
        let sources = event_sources(slf, &arrays, requests)?;
        let mut this = borrow_mut(slf)?;
        let events_on = this
            .py_side
            .as_ref()
            .is_some_and(|s| s.event_sink.is_some());
        let result = run(&mut this, py, &arrays, requests, events_on)?;
        let sink = this
            .py_side
            .as_ref()
            .and_then(|s| s.event_sink.as_ref())
            .map(|s| s.clone_ref(py));
        drop(this);
        if let Some(sink) = sink {
            for (events, i) in result.events {
                let request = match (sources.get(i).and_then(Option::as_ref), requests) {
                    (Some(source), _) => source.clone().unbind(),
                    (None, Some(r)) => r.get_item(i)?.unbind(),
                    (None, None) => py.None(),
                };
                sink.call1(py, (raw_events(py, events)?, request))?;
            }
        }
        NativeManager::flush_block_metrics(slf)?;
        Ok((
            PyBytes::new(py, &result.ok),
            u32_bytes(py, &result.offsets),
            u32_bytes(py, &result.ids),
        ))
    }
}

//! The batched decode step over arrays (`allocate_decode_arrays`): every
//! request is checked first (nothing changes, so an error leaves the
//! manager as it was), then allocated in order. A decode that changes no
//! block (most of them) is judged from its request's hot line alone and
//! costs a few compares in each pass.

use std::borrow::Cow;

use hybridcache_core::{AllocateArgs, HashUpdate, PoolEvent, ReqSlot};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use crate::convert::{fill_hash_update, guard, req_attr, to_py_err};
use crate::NativeManager;

/// Buffers a batch reuses across calls, so a step allocates nothing for them.
#[derive(Default)]
pub struct BatchScratch {
    /// Hash updates, one per request that fills a block this step.
    updates: Vec<HashUpdate>,
    /// `seen[slot] == epoch`: the slot is in this batch already.
    seen: Vec<u32>,
    epoch: u32,
}

impl BatchScratch {
    /// Starts a batch over slots below `capacity`: earlier marks lapse.
    fn start(&mut self, capacity: usize) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.seen.fill(0);
            self.epoch = 1;
        }
        if self.seen.len() < capacity {
            self.seen.resize(capacity, 0);
        }
    }

    /// Marks `slot`; false if this batch marked it already.
    fn mark(&mut self, slot: ReqSlot) -> bool {
        std::mem::replace(&mut self.seen[slot as usize], self.epoch) != self.epoch
    }
}

/// The per-request inputs of one step, as typed slices.
pub struct DecodeArrays<'a> {
    pub handles: Cow<'a, [u64]>,
    pub num_new_tokens: Cow<'a, [u32]>,
    pub num_computed_tokens: Cow<'a, [u32]>,
    pub num_tokens: Cow<'a, [u32]>,
    pub lookahead: usize,
}

impl DecodeArrays<'_> {
    fn args(&self, i: usize) -> AllocateArgs<'static> {
        AllocateArgs {
            num_new_tokens: self.num_new_tokens[i] as usize,
            num_computed_tokens: self.num_computed_tokens[i] as usize,
            num_tokens: self.num_tokens[i] as usize,
            num_lookahead_tokens: self.lookahead,
            ..Default::default()
        }
    }
}

/// What a step produced: `ok` one byte per request, the new blocks of
/// request i in group g at `ids[offsets[i*G+g]..offsets[i*G+g+1]]`, and the
/// events of each request that raised some.
pub struct BatchResult {
    pub ok: Vec<u8>,
    pub offsets: Vec<u32>,
    pub ids: Vec<u32>,
    pub events: Vec<(Vec<PoolEvent>, usize)>,
}

/// How pass 1 found a request: a decode that changes no block, or the
/// general path (with the index of its hash update, if it has one).
#[derive(Clone, Copy)]
enum Plan {
    Noop,
    General(Option<usize>),
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
    let n = a.handles.len();
    let mut plans = Vec::with_capacity(n);
    let mut slots = Vec::with_capacity(n);

    // Pass 1: resolve and check every request; nothing changes yet.
    {
        let (inner, scratch) = (&state.inner, &mut state.batch);
        scratch.start(inner.slot_capacity());
        let mut num_updates = 0;
        for i in 0..n {
            let handle = a.handles[i];
            let found = inner.plain_decode_by_handle(
                handle,
                a.num_new_tokens[i] as usize,
                a.num_computed_tokens[i] as usize,
                a.num_tokens[i] as usize,
                a.lookahead,
            );
            let Some((slot, noop)) = found else {
                return Err(to_py_err(inner.resolve_handle(handle).unwrap_err()));
            };
            if !scratch.mark(slot) {
                return Err(PyValueError::new_err(format!(
                    "handles[{i}]: request {:?} appears twice in one step",
                    inner.request_id_at(slot)
                )));
            }
            slots.push(slot);
            if noop {
                plans.push(Plan::Noop);
                continue;
            }
            let args = a.args(i);
            let known = inner.known_hashes_at(Some(slot));
            let may_need_hashes = inner.may_need_hashes(known, &args);
            let id = inner.request_id_at(slot);
            let mut update = None;
            if may_need_hashes {
                let Some(reqs) = requests else {
                    return Err(PyValueError::new_err(format!(
                        "request {id:?} fills a block this step: pass requests= so its block_hashes can be read"
                    )));
                };
                let hashes = req_attr(&reqs.get_item(i)?, intern!(py, "block_hashes"))?;
                if scratch.updates.len() == num_updates {
                    scratch.updates.push(HashUpdate::default());
                }
                if fill_hash_update(&hashes, known, &mut scratch.updates[num_updates])? {
                    update = Some(num_updates);
                    num_updates += 1;
                }
            }
            let u = update.map(|k| &scratch.updates[k]);
            guard(|| inner.check_allocate(Some(slot), id, &args, u)).map_err(|e| {
                let msg = format!("handles[{i}]: {}", e.value(py));
                PyErr::from_type(e.get_type(py), msg)
            })?;
            plans.push(Plan::General(update));
        }
    }

    // Pass 2: allocate, in order.
    let num_groups = state.inner.num_groups();
    let mut out = BatchResult {
        ok: Vec::with_capacity(n),
        offsets: Vec::with_capacity(n * num_groups + 1),
        // Most steps hand out fewer new blocks than there are requests.
        ids: Vec::with_capacity(n),
        events: Vec::new(),
    };
    out.offsets.push(0);
    for (i, (&slot, &plan)) in slots.iter().zip(&plans).enumerate() {
        match plan {
            Plan::Noop => {
                state.inner.record_plain_noop_decode(
                    slot,
                    a.num_computed_tokens[i] as usize,
                    a.num_new_tokens[i] as usize,
                );
                out.ok.push(1);
                let end = out.ids.len() as u32;
                out.offsets.extend(std::iter::repeat_n(end, num_groups));
            }
            Plan::General(update) => {
                let args = a.args(i);
                let (inner, scratch) = (&mut state.inner, &mut state.scratch);
                let update = update.map(|k| &state.batch.updates[k]);
                let got = guard(|| Ok(inner.allocate_checked(slot, &args, update, scratch)))?;
                if events_on && state.inner.has_events() {
                    out.events.push((state.inner.take_events(), i));
                }
                out.ok.push(u8::from(got));
                crate::push_result(
                    got,
                    &state.scratch,
                    num_groups,
                    &mut out.offsets,
                    &mut out.ids,
                );
            }
        }
    }
    Ok(out)
}

/// One request of `allocate_decode_batch` as pass 1 read and checked it.
struct Checked<'py> {
    request: Bound<'py, PyAny>,
    rid: Bound<'py, PyString>,
    slot: Option<ReqSlot>,
    args: AllocateArgs<'static>,
    /// None: a decode that changes no block; else its hash update, if any.
    general: Option<Option<HashUpdate>>,
}

/// The per-request counts of `allocate_decode_batch` (None: read from the
/// request objects).
pub struct DecodeLists {
    pub num_new_tokens: Vec<usize>,
    pub num_computed_tokens: Option<Vec<usize>>,
    pub num_tokens: Option<Vec<usize>>,
    pub lookahead: usize,
}

/// `allocate_decode_batch`: every request is read and checked first (as
/// `run` does for arrays), so an error leaves the manager as it was; then
/// each is allocated in order, from what pass 1 read. Returns (ok, offsets,
/// ids) and each request's events, as `run`.
pub fn run_requests<'py>(
    state: &mut NativeManager,
    requests: &Bound<'py, PyList>,
    lists: &DecodeLists,
    events_on: bool,
) -> PyResult<(
    Vec<bool>,
    Vec<u32>,
    Vec<u32>,
    Vec<(Vec<PoolEvent>, Bound<'py, PyAny>)>,
)> {
    let py = requests.py();
    let n = requests.len();
    let mut items = Vec::with_capacity(n);
    // Pass 1: read and check; only the id cache changes.
    state.batch.start(state.inner.slot_capacity());
    let mut new_ids: Vec<String> = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let at =
            |e: PyErr| PyErr::from_type(e.get_type(py), format!("requests[{i}]: {}", e.value(py)));
        let rid = crate::request_id(&request).map_err(at)?;
        let num_computed = match &lists.num_computed_tokens {
            Some(c) => c[i],
            None => crate::count_obj(
                "request.num_computed_tokens",
                &req_attr(&request, intern!(py, "num_computed_tokens"))?,
            )
            .map_err(at)?,
        };
        let mut args = AllocateArgs {
            num_new_tokens: lists.num_new_tokens[i],
            num_computed_tokens: num_computed,
            num_tokens: lists
                .num_tokens
                .as_ref()
                .map_or(crate::NUM_TOKENS_UNREAD, |t| t[i]),
            num_lookahead_tokens: lists.lookahead,
            ..Default::default()
        };
        let slot = state.lookup_id(&rid)?;
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
            if args.num_tokens == crate::NUM_TOKENS_UNREAD {
                args.num_tokens = crate::count_obj(
                    "request.num_tokens",
                    &req_attr(&request, intern!(py, "num_tokens"))?,
                )
                .map_err(at)?;
            }
            let update = if inner.may_need_hashes(known, &args) {
                crate::convert::hash_update(
                    &req_attr(&request, intern!(py, "block_hashes"))?,
                    known,
                )
                .map_err(at)?
            } else {
                None
            };
            let id = rid.to_str()?;
            guard(|| inner.check_allocate(slot, id, &args, update.as_ref())).map_err(at)?;
            Some(update)
        };
        items.push(Checked {
            request,
            rid,
            slot,
            args,
            general,
        });
    }

    // Pass 2: allocate, in order, from what pass 1 read.
    let num_groups = state.inner.num_groups();
    let mut ok = Vec::with_capacity(n);
    let mut offsets = Vec::with_capacity(n * num_groups + 1);
    offsets.push(0u32);
    let mut ids = Vec::new();
    let mut events = Vec::new();
    for item in items {
        let got = match (&item.general, item.slot) {
            (None, Some(s)) => {
                state.inner.record_noop_decode(s, &item.args);
                state.scratch.clear();
                false
            }
            (Some(update), slot) => {
                let (inner, out) = (&mut state.inner, &mut state.scratch);
                let rid = item.rid.to_str()?;
                guard(|| match slot {
                    Some(s) => Ok(inner.allocate_checked(s, &item.args, update.as_ref(), out)),
                    None => {
                        inner.allocate_general_into(None, rid, &item.args, update.as_ref(), out)
                    }
                })?
            }
            (None, None) => unreachable!("a no-op decode has a slot"),
        };
        if events_on && state.inner.has_events() {
            events.push((state.inner.take_events(), item.request.clone()));
        }
        ok.push(got || item.general.is_none());
        crate::push_result(got, &state.scratch, num_groups, &mut offsets, &mut ids);
    }
    Ok((ok, offsets, ids, events))
}

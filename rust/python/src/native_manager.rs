//! `NativeManager`, the Python class the facade extends: its state. Its
//! Python methods live in one module per job, each a `#[pymethods]` block
//! over this struct (`manager_setup`, `allocate_params`, `lookup`,
//! `batch`, `request_calls`, `mamba_calls`, `deferred_frees`,
//! `partial_hits`, `pool_reads`, `rebuild`, `raw_methods`).

use hybridcache_core::{BatchScratch, HashUpdate, KvCacheManager, NewBlocks};
use pyo3::prelude::*;

use crate::id_cache::IdCache;

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
    /// `read(request)`: what the event sink will read of a request, read
    /// before the call changes anything (handed to the sink in its place),
    /// so that a read that raises leaves the manager as it was. None: the
    /// sink gets the request.
    pub(crate) event_read: Option<PyObject>,
}

/// The scheduler's watermark: blocks an admission leaves free, and the
/// request statuses it applies to (`RequestStatus.WAITING` / `PREEMPTED`,
/// the facade's objects, compared by equality).
#[derive(Default)]
pub(crate) struct Watermark {
    pub(crate) blocks: usize,
    pub(crate) statuses: Vec<PyObject>,
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
    pub(crate) ids: IdCache,
    pub(crate) watermark: Watermark,
    pub(crate) step_waits: crate::step_waits::StepWaits,
    // Which request attribute gates and bounds lookups (the release's).
    pub(crate) read_gate: crate::read_gate::ReadGate,
}

//! A serving loop that never calls `new_step_starts()`: a prefix hit on a
//! Mamba state cached "this step" then waits forever, and `allocate_slots`
//! answers None (no room) with the pool nearly empty. vLLM's managers
//! answer so too, and the facades of vLLM releases keep that answer;
//! hybridcache's own `KVCacheManager` says what is wrong instead.

use hybridcache_core::KvCacheManager;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

#[derive(Default)]
pub(crate) struct StepWaits {
    /// Raise, not answer None (hybridcache's own API; set by the facade).
    pub(crate) explain: bool,
    /// `new_step_starts()` was called at least once.
    pub(crate) started: bool,
}

impl StepWaits {
    /// After an allocation answered None: RuntimeError when it did only
    /// because its hit waits for a step that, `new_step_starts()` never
    /// having been called, never starts.
    #[cold]
    pub(crate) fn check(
        &self,
        inner: &KvCacheManager,
        new_computed: Option<&[Vec<u32>]>,
    ) -> PyResult<()> {
        if !self.explain || self.started {
            return Ok(());
        }
        match new_computed {
            Some(nc) if inner.hit_waits_a_step(nc) => Err(PyRuntimeError::new_err(
                "allocate_slots: the prefix hit ends on a Mamba state cached in this step, which \
                 is usable from the next step on, and new_step_starts() was never called: call it \
                 once at the start of every scheduler step (nothing was allocated)",
            )),
            _ => Ok(()),
        }
    }
}

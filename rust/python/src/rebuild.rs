//! Adopting a freshly built core in place. vLLM's coordinator reads
//! some settings (`retention_interval`) at every call, and its own tests
//! assign them right after building the manager; hybridcache's core
//! settles them into each group at construction, so the facade builds a
//! second manager with the new setting and this object takes its core.
//! A `#[pymethods]` block of its own (PyO3's `multiple-pymethods`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::native_manager::NativeManager;

#[pymethods]
impl NativeManager {
    /// Swaps this manager's core (and the per-call scratch built with it)
    /// with `other`'s. The Python-side bindings (event and metrics sinks)
    /// stay this object's; the facade checks beforehand that neither core
    /// has served a request, so nothing observable is lost.
    fn _adopt_core(slf: &Bound<'_, Self>, other: &Bound<'_, NativeManager>) -> PyResult<()> {
        let _in_call = crate::call_guard::enter(slf, "_adopt_core")?;
        let mut this = crate::call_guard::borrow_mut(slf)?;
        let this = &mut *this;
        let mut other = other.try_borrow_mut().map_err(|_| {
            PyValueError::new_err("_adopt_core: the other manager is this one, or is in use")
        })?;
        std::mem::swap(&mut this.inner, &mut other.inner);
        std::mem::swap(&mut this.scratch, &mut other.scratch);
        std::mem::swap(&mut this.hash_buf, &mut other.hash_buf);
        std::mem::swap(&mut this.batch, &mut other.batch);
        std::mem::swap(&mut this.ids, &mut other.ids);
        std::mem::swap(&mut this.watermark, &mut other.watermark);
        // The adopted core records block metrics only if this side has a sink.
        let metrics = this
            .py_side
            .as_ref()
            .is_some_and(|s| s.metrics_sink.is_some());
        this.inner.set_record_block_metrics(metrics);
        Ok(())
    }
}

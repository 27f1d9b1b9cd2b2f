//! Adopting a freshly built core in place. vLLM 0.33.0's coordinator reads
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
    fn _adopt_core(&mut self, other: &Bound<'_, NativeManager>) -> PyResult<()> {
        let mut other = other.try_borrow_mut().map_err(|_| {
            PyValueError::new_err("_adopt_core: the other manager is this one, or is in use")
        })?;
        std::mem::swap(&mut self.inner, &mut other.inner);
        std::mem::swap(&mut self.scratch, &mut other.scratch);
        std::mem::swap(&mut self.hash_buf, &mut other.hash_buf);
        std::mem::swap(&mut self.batch, &mut other.batch);
        std::mem::swap(&mut self.ids, &mut other.ids);
        std::mem::swap(&mut self.watermark, &mut other.watermark);
        // The adopted core records block metrics only if this side has a sink.
        let metrics = self
            .py_side
            .as_ref()
            .is_some_and(|s| s.metrics_sink.is_some());
        self.inner.set_record_block_metrics(metrics);
        Ok(())
    }
}

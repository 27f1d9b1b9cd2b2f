//! `NativeManager._raw_methods`: the raw entry points of the facade's
//! class where the binding has them (`raw_ffi`), None where it does not.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::native_manager::NativeManager;

#[pymethods]
impl NativeManager {
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
        return crate::raw_ffi::manager_descriptors(cls).map(Some);
        #[cfg(not(feature = "raw-ffi"))]
        return {
            let _ = cls;
            Ok(None)
        };
    }
}

//! What the raw entry points share: static method definitions and the
//! builtins and descriptors made of them, the guarded body of a vectorcall
//! (`raw_call`), argument access, the request lookup of the hot calls and
//! the prefetch they issue.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

pub(crate) struct MethodDef(pub(crate) ffi::PyMethodDef);
// SAFETY: CPython only reads the definition, whose pointers are to statics.
unsafe impl Sync for MethodDef {}

/// A new builtin of `def` bound to `to` (its `self`).
pub(crate) fn bind(def: &'static MethodDef, to: &Bound<'_, PyAny>) -> PyResult<PyObject> {
    let def = std::ptr::addr_of!(def.0).cast_mut();
    // SAFETY: `def` is a static definition CPython never writes to; the
    // result is a new reference, or NULL with an exception set.
    unsafe {
        let f = ffi::PyCFunction_NewEx(def, to.as_ptr(), std::ptr::null_mut());
        Bound::from_owned_ptr_or_err(to.py(), f).map(Bound::unbind)
    }
}

/// A new method descriptor of `def` for class `cls`: CPython checks that
/// every `self` it passes is an instance of `cls`, and specializes calls on
/// instances of exactly `cls`.
pub(crate) fn method_descriptor(
    def: &'static MethodDef,
    cls: &Bound<'_, pyo3::types::PyType>,
) -> PyResult<PyObject> {
    let def = std::ptr::addr_of!(def.0).cast_mut();
    // SAFETY: `def` is a static definition CPython never writes to; `cls`
    // is a live type; the result is a new reference, or NULL with an
    // exception set.
    unsafe {
        let d = ffi::PyDescr_NewMethod(cls.as_type_ptr(), def);
        Bound::from_owned_ptr_or_err(cls.py(), d).map(Bound::unbind)
    }
}

/// The body of a raw (vectorcall) entry point: `f` runs with the GIL's
/// token; CPython gets the object, or NULL with the error set (a panic
/// becomes a RuntimeError).
///
/// # Safety
/// Called by CPython, with the GIL held.
pub(crate) unsafe fn raw_call(
    f: impl FnOnce(Python<'_>) -> PyResult<PyObject>,
) -> *mut ffi::PyObject {
    // SAFETY: as this function's.
    let py = unsafe { Python::assume_gil_acquired() };
    match catch_unwind(AssertUnwindSafe(|| f(py))) {
        Ok(Ok(obj)) => obj.into_ptr(),
        Ok(Err(e)) => {
            e.restore(py);
            std::ptr::null_mut()
        }
        Err(_) => {
            PyRuntimeError::new_err("hybridcache core panicked (bug); state may be inconsistent")
                .restore(py);
            std::ptr::null_mut()
        }
    }
}

/// Asks the CPU to bring the line at `p` into cache (no effect elsewhere
/// than x86-64): the hot calls prefetch what the next call will read.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A non-negative int, or None where it is not one (no exception left set).
///
/// # Safety
/// `obj` is a live object; the GIL is held.
pub(crate) unsafe fn plain_count(obj: *mut ffi::PyObject) -> Option<usize> {
    // SAFETY: as this function's.
    unsafe {
        if ffi::PyLong_Check(obj) == 0 {
            return None;
        }
        let v = ffi::PyLong_AsLong(obj);
        if v == -1 && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
        }
        usize::try_from(v).ok()
    }
}

/// The handle of a hot call's request: by the request object when this
/// object was seen before and its slot still holds it, else through
/// `request.request_id` and the id cache (`learn_request`). None: no such
/// attribute, or an id not seen before (no exception left set). The call
/// the scheduler made after this one last time has its entry and decode
/// data prefetched.
///
/// # Safety
/// `request` is a live object; the GIL is held.
#[inline]
pub(crate) unsafe fn held_request(
    py: Python<'_>,
    this: &mut crate::native_manager::NativeManager,
    request: *mut ffi::PyObject,
) -> Option<u64> {
    if let Some((handle, next)) = this.ids.get_hot_request(request as usize) {
        if let Some(n) = next {
            prefetch(n.entry);
            this.inner.for_each_decode_line(n.handle, prefetch);
        }
        if this.inner.slot_of_handle(handle).is_some() {
            return Some(handle);
        }
    }
    // SAFETY: as this function's.
    unsafe { learn_request(py, this, request) }
}

/// `held_request` for a request object not known (yet, or any more): its
/// handle by `request.request_id`, the object remembered for next time. Out
/// of line: the hot calls' code stays a few cache lines.
///
/// # Safety
/// As `held_request`'s.
#[cold]
#[inline(never)]
unsafe fn learn_request(
    py: Python<'_>,
    this: &mut crate::native_manager::NativeManager,
    request: *mut ffi::PyObject,
) -> Option<u64> {
    // SAFETY: as this function's; the attribute is a new reference, owned
    // by the Bound made of it.
    let rid = unsafe {
        let rid = ffi::PyObject_GetAttr(request, pyo3::intern!(py, "request_id").as_ptr());
        if rid.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Bound::from_owned_ptr(py, rid)
    };
    // Only str ids are cached (by address: the cache holds the str).
    let handle = this
        .ids
        .get(rid.downcast::<pyo3::types::PyString>().ok()?)?;
    this.inner.slot_of_handle(handle)?;
    // SAFETY: `request` is live (this function's contract).
    let request = unsafe { Borrowed::from_ptr(py, request) };
    this.ids.remember_request(&request, handle);
    Some(handle)
}

/// A vectorcall's arguments as objects: the positional values, then the
/// keyword (name, value) pairs.
pub(crate) struct CallArgs<'py> {
    pub positional: Vec<Bound<'py, PyAny>>,
    pub keywords: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
}

/// # Safety
/// `args`, `nargs` and `kwnames` follow the vectorcall contract and are
/// live for the call; the GIL is held.
pub(crate) unsafe fn call_args<'py>(
    py: Python<'py>,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<CallArgs<'py>> {
    let names = if kwnames.is_null() {
        None
    } else {
        // SAFETY: a non-NULL kwnames is a live tuple of str.
        Some(unsafe { Bound::from_borrowed_ptr(py, kwnames) }.downcast_into::<PyTuple>()?)
    };
    let nargs = usize::try_from(nargs).unwrap_or(0);
    let num_kw = names.as_ref().map_or(0, |n| n.len());
    // SAFETY: `args` holds `nargs + num_kw` live pointers for the call.
    let values = unsafe { std::slice::from_raw_parts(args, nargs + num_kw) };
    // SAFETY: as above.
    let value = |i: usize| unsafe { Bound::from_borrowed_ptr(py, values[i]) };
    let keywords = names.iter().flat_map(|n| n.iter()).enumerate();
    Ok(CallArgs {
        positional: (0..nargs).map(value).collect(),
        keywords: keywords.map(|(k, name)| (name, value(nargs + k))).collect(),
    })
}

/// `callable(*front, *args, **kwargs)` from a vectorcall's arguments (the
/// general spelling of a raw method: Python's own argument matching).
///
/// # Safety
/// As `call_args`.
pub(crate) unsafe fn call_with(
    callable: &Bound<'_, PyAny>,
    front: Option<&Bound<'_, PyAny>>,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<PyObject> {
    let py = callable.py();
    // SAFETY: as this function's.
    let CallArgs {
        positional,
        keywords,
    } = unsafe { call_args(py, args, nargs, kwnames) }?;
    let positional = front.into_iter().cloned().chain(positional);
    let kwargs = pyo3::types::PyDict::new(py);
    for (name, v) in keywords {
        kwargs.set_item(name, v)?;
    }
    Ok(callable
        .call(
            PyTuple::new(py, positional.collect::<Vec<_>>())?,
            Some(&kwargs),
        )?
        .unbind())
}

//! What the raw entry points share: static method definitions and the
//! builtins and descriptors made of them, the guarded body of a vectorcall
//! (`raw_call`), argument access, the request lookup of the hot calls and
//! the prefetch they issue.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

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
#[inline(always)]
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

/// Where a hot call reads a held request's computed count (`fields`).
pub(crate) enum Fields<'py> {
    /// The generic lookup.
    Generic,
    /// The request's `__dict__`.
    Dict(Bound<'py, PyDict>),
    /// Its type's slots.
    Members(super::fields::Members),
}

/// The handle of a hot call's request: by the request object when this
/// object was seen before and its slot still holds it (every allocation
/// remembers its request's object). None: an object the manager does not
/// know (the full path reads and judges it). An error: a read of the
/// request raised (it propagates unchanged), the request's id was changed
/// while the manager holds it, or another live request holds its id. With
/// the handle: where the caller reads the request's other fields. The call
/// the scheduler made after this one last time has its entry and decode
/// data prefetched.
///
/// # Safety
/// `request` is a live object; the GIL is held.
#[inline(always)]
pub(crate) unsafe fn held_request<'py>(
    py: Python<'py>,
    this: &mut crate::native_manager::NativeManager,
    request: *mut ffi::PyObject,
) -> PyResult<Option<(u64, Fields<'py>)>> {
    if let Some((handle, next)) = this.ids.get_hot_request(request as usize) {
        if let Some(n) = next {
            prefetch(n.entry);
            this.inner.for_each_decode_line(n.handle, prefetch);
        }
        if let Some(slot) = this.inner.slot_of_handle(handle) {
            // SAFETY: as this function's.
            let fields = unsafe { check_id(py, this, request, slot) }?;
            return Ok(Some((handle, fields)));
        }
    }
    // An object the manager does not know (or no longer holds): the full
    // path reads it and judges it (a second live request with a held id,
    // whatever it is, errors in the full path's order).
    Ok(None)
}

/// Whether the held request in `slot` (known by its object) still has the
/// id it was admitted with: its `request_id` (read where `fields` says) is
/// the very str the manager keeps, or reads equal to it. ValueError naming
/// both ids when it was renamed (or swapped). Returns where the request's
/// other fields are read.
///
/// # Safety
/// `request` is a live object; the GIL is held.
#[inline(always)]
unsafe fn check_id<'py>(
    py: Python<'py>,
    this: &mut crate::native_manager::NativeManager,
    request: *mut ffi::PyObject,
    slot: u32,
) -> PyResult<Fields<'py>> {
    let name = pyo3::intern!(py, "request_id");
    let access = this.ids.field_access(slot);
    if access != super::fields::IN_DICT {
        let members = this.ids.members.get(access).copied();
        // SAFETY: as this function's; the attribute is a new reference,
        // released here once compared by address (the manager keeps the
        // str it is compared with alive) or handed on.
        unsafe {
            let (v, fields) = match members.and_then(|m| Some((m.read(request, false)?, m))) {
                Some((v, m)) => (v, Fields::Members(m)),
                None => (
                    ffi::PyObject_GetAttr(request, name.as_ptr()),
                    Fields::Generic,
                ),
            };
            if this.ids.id_at(slot).is_some_and(|id| id.as_ptr() == v) {
                ffi::Py_DECREF(v);
                return Ok(fields);
            }
            if v.is_null() {
                return Err(read_error(py, request, name));
            }
            check_id_value(this, slot, Bound::from_owned_ptr(py, v))?;
            return Ok(fields);
        }
    }
    // SAFETY: `request` is live and the GIL is held; the dict is a new
    // reference (owned by the Bound), or NULL with an exception set; the
    // entry read is borrowed from the dict, compared by address only.
    unsafe {
        let d = ffi::PyObject_GenericGetDict(request, std::ptr::null_mut());
        let dict = Bound::from_owned_ptr_or_err(py, d)?.downcast_into_unchecked::<PyDict>();
        let v = ffi::PyDict_GetItemWithError(dict.as_ptr(), name.as_ptr());
        let same = this.ids.id_at(slot).is_some_and(|id| id.as_ptr() == v);
        if !same {
            check_id_other(py, this, request, slot, v)?;
        }
        Ok(Fields::Dict(dict))
    }
}

/// `check_id` where the request's `__dict__` entry `v` (borrowed; NULL:
/// none, or its lookup raised) is not the manager's str: the lookup's error
/// propagates; otherwise `request.request_id` is read and judged.
///
/// # Safety
/// `request` is a live object; the GIL is held.
#[cold]
#[inline(never)]
unsafe fn check_id_other(
    py: Python<'_>,
    this: &mut crate::native_manager::NativeManager,
    request: *mut ffi::PyObject,
    slot: u32,
    v: *mut ffi::PyObject,
) -> PyResult<()> {
    // SAFETY: as this function's.
    unsafe {
        if !v.is_null() {
            return check_id_value(this, slot, Bound::from_borrowed_ptr(py, v));
        }
        if !ffi::PyErr_Occurred().is_null() {
            return Err(PyErr::fetch(py));
        }
        let request = Borrowed::from_ptr(py, request);
        check_id_value(this, slot, crate::py_args::request_id(&request)?.into_any())
    }
}

/// `check_id` for a request whose `request_id` read `rid`, another object
/// than the str the manager keeps: TypeError where it is not a str; fine
/// (and remembered as the id's str) where it reads equal to the held id;
/// ValueError naming both where it differs (renamed or swapped).
#[cold]
#[inline(never)]
fn check_id_value(
    this: &mut crate::native_manager::NativeManager,
    slot: u32,
    rid: Bound<'_, PyAny>,
) -> PyResult<()> {
    let Ok(rid) = rid.downcast::<pyo3::types::PyString>() else {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "request.request_id must be str, got {}",
            crate::convert::type_name(&rid)
        )));
    };
    let held = this.inner.request_id_at(slot);
    if rid.to_str()? != held {
        return Err(crate::id_cache::renamed_error(held, rid.to_str()?));
    }
    let handle = this.inner.handle_at(slot);
    this.ids.remember(rid, handle);
    Ok(())
}

/// `request.<name>` from its `__dict__` (see `held_request`) as a plain
/// count; None where it is something else (the full path names it). A
/// missing entry is read the generic way (its error is the full path's).
///
/// # Safety
/// `request` is a live object; the GIL is held.
#[inline(always)]
pub(crate) unsafe fn dict_count(
    py: Python<'_>,
    dict: &Bound<'_, PyDict>,
    request: *mut ffi::PyObject,
    name: &Bound<'_, pyo3::types::PyString>,
) -> PyResult<Option<usize>> {
    // SAFETY: a live dict and a str; the entry is borrowed, read at once.
    unsafe {
        let v = ffi::PyDict_GetItemWithError(dict.as_ptr(), name.as_ptr());
        if !v.is_null() {
            return Ok(plain_count(v));
        }
        if !ffi::PyErr_Occurred().is_null() {
            return Err(PyErr::fetch(py));
        }
        attr_count(py, request, name)
    }
}

/// `request.<name>` through its type's slot (see `fields`) as a plain
/// count; None where it is something else (the full path names it). A
/// failed read is the error the full path gives.
///
/// # Safety
/// `request` is a live object; the GIL is held.
#[inline(always)]
pub(crate) unsafe fn member_count(
    py: Python<'_>,
    members: &super::fields::Members,
    request: *mut ffi::PyObject,
    name: &Bound<'_, pyo3::types::PyString>,
) -> PyResult<Option<usize>> {
    // SAFETY: as this function's; the value is a new reference (or null).
    unsafe {
        let Some(v) = members.read(request, true) else {
            return attr_count(py, request, name);
        };
        owned_count(py, v, request, name)
    }
}

/// `request.<name>` as a plain count; None where it is something else
/// (the full path names the problem). A read that failed is the error the
/// full path gives (never read again there: the caller's own error
/// propagates unchanged, the manager untouched).
///
/// # Safety
/// `request` is a live object; the GIL is held.
#[cold]
#[inline(never)]
pub(crate) unsafe fn attr_count(
    py: Python<'_>,
    request: *mut ffi::PyObject,
    name: &Bound<'_, pyo3::types::PyString>,
) -> PyResult<Option<usize>> {
    // SAFETY: as this function's; the attribute is a new reference (or null).
    unsafe {
        owned_count(
            py,
            ffi::PyObject_GetAttr(request, name.as_ptr()),
            request,
            name,
        )
    }
}

/// The count a read of `request.<name>` gave: `v` is that read's new
/// reference, released here, or null where it failed (then its error).
///
/// # Safety
/// `request` is a live object; the GIL is held; `v` is a new reference or
/// null with the error set.
#[inline(always)]
unsafe fn owned_count(
    py: Python<'_>,
    v: *mut ffi::PyObject,
    request: *mut ffi::PyObject,
    name: &Bound<'_, pyo3::types::PyString>,
) -> PyResult<Option<usize>> {
    if v.is_null() {
        // SAFETY: as this function's (the read's error is set).
        return Err(unsafe { read_error(py, request, name) });
    }
    // SAFETY: `v` is a live new reference, released once.
    unsafe {
        let n = plain_count(v);
        ffi::Py_DECREF(v);
        Ok(n)
    }
}

/// The error of a failed attribute read, as the full path gives it (a
/// missing attribute names what was expected; any other error unchanged).
///
/// # Safety
/// `request` is a live object; the GIL is held; the error is set.
#[cold]
#[inline(never)]
unsafe fn read_error(
    py: Python<'_>,
    request: *mut ffi::PyObject,
    name: &Bound<'_, pyo3::types::PyString>,
) -> PyErr {
    let e = PyErr::fetch(py);
    // SAFETY: as this function's.
    let request = unsafe { Borrowed::from_ptr(py, request) };
    crate::convert::not_a_request(&request, name, e)
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

//! `allocate_slots` as a builtin bound to one manager, called with
//! CPython's vectorcall convention (METH_FASTCALL | METH_KEYWORDS).
//!
//! vLLM's scheduler calls `allocate_slots` once per running request per
//! step, with keywords. PyO3's generic argument matching (ten parameters,
//! names compared as strings) is a fifth of a no-op decode's cost; here
//! keywords match interned names by address first. The facade stores the
//! builtin on the manager instance, where attribute lookup finds it before
//! the class's method; `NativeManager.allocate_slots` stays the same call.

use std::panic::{catch_unwind, AssertUnwindSafe};

use hybridcache_core::AllocateArgs;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyString, PyTuple};

use crate::{opt_flag, AllocateSlotsArgs, NativeManager};

/// vLLM 0.23.0's parameters of `allocate_slots`, in order.
const PARAMS: [&str; 10] = [
    "request",
    "num_new_tokens",
    "num_new_computed_tokens",
    "new_computed_blocks",
    "num_lookahead_tokens",
    "num_external_computed_tokens",
    "delay_cache_blocks",
    "num_encoder_tokens",
    "full_sequence_must_fit",
    "reserved_blocks",
];

pub(crate) struct MethodDef(pub(crate) ffi::PyMethodDef);
// SAFETY: CPython only reads the definition, whose pointers are to statics.
unsafe impl Sync for MethodDef {}

static ALLOCATE_SLOTS: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"allocate_slots".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: allocate_slots_fast,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"vLLM 0.23.0's KVCacheManager.allocate_slots, bound to this manager.".as_ptr(),
});

/// The interned parameter names (keyword names in call sites are interned
/// too, so a match is usually one pointer compare).
fn param_names(py: Python<'_>) -> &[Py<PyString>; 10] {
    static NAMES: GILOnceCell<[Py<PyString>; 10]> = GILOnceCell::new();
    NAMES.get_or_init(py, || PARAMS.map(|p| PyString::intern(py, p).unbind()))
}

fn param_index(py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<usize> {
    let names = param_names(py);
    if let Some(i) = names.iter().position(|n| n.as_ptr() == name.as_ptr()) {
        return Ok(i);
    }
    let text = name.downcast::<PyString>()?.to_str()?;
    PARAMS
        .iter()
        .position(|&p| p == text)
        .ok_or_else(|| arg_error(ArgError::Unknown(text)))
}

/// Python's own wording for bad call arguments.
enum ArgError<'a> {
    TooMany(usize),
    Twice(usize),
    Missing(usize),
    Unknown(&'a str),
}

#[cold]
#[inline(never)]
fn arg_error(e: ArgError<'_>) -> PyErr {
    PyTypeError::new_err(match e {
        ArgError::TooMany(n) => format!(
            "allocate_slots() takes at most {} arguments ({n} given)",
            PARAMS.len()
        ),
        ArgError::Twice(i) => format!(
            "allocate_slots() got multiple values for argument '{}'",
            PARAMS[i]
        ),
        ArgError::Missing(i) => format!(
            "allocate_slots() missing required argument '{}' (pos {})",
            PARAMS[i],
            i + 1
        ),
        ArgError::Unknown(name) => {
            format!("allocate_slots() got an unexpected keyword argument '{name}'")
        }
    })
}

/// A new builtin of `def` bound to `to` (its `self`).
fn bind(def: &'static MethodDef, to: &Bound<'_, PyAny>) -> PyResult<PyObject> {
    let def = std::ptr::addr_of!(def.0).cast_mut();
    // SAFETY: `def` is a static definition CPython never writes to; the
    // result is a new reference, or NULL with an exception set.
    unsafe {
        let f = ffi::PyCFunction_NewEx(def, to.as_ptr(), std::ptr::null_mut());
        Bound::from_owned_ptr_or_err(to.py(), f).map(Bound::unbind)
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

/// A new builtin calling `allocate_slots` of `manager`.
pub fn bound_allocate_slots(manager: &Bound<'_, NativeManager>) -> PyResult<PyObject> {
    bind(&ALLOCATE_SLOTS, manager.as_any())
}

unsafe extern "C" fn allocate_slots_fast(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls builtins with the GIL held; the vectorcall
    // contract: `args` holds `nargs` positional values then one value per
    // name in `kwnames` (a tuple, or NULL).
    unsafe { raw_call(|py| call(py, slf, args, nargs, kwnames)) }
}

/// # Safety
/// As `allocate_slots_fast`'s arguments, with the GIL held.
unsafe fn call(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<PyObject> {
    // SAFETY: as this function's.
    let fast = unsafe { decode_fast(py, slf, args, nargs, kwnames) };
    // SAFETY: `slf` is the manager the builtin was bound to (a live object;
    // `bound_allocate_slots` binds only managers).
    let manager = || unsafe { Bound::from_borrowed_ptr(py, slf).downcast_into_unchecked() };
    match fast {
        Fast::Done(result) => Ok(result),
        Fast::General { slot, args: a, rid } => {
            // The reads were done and checked: go on from there.
            // SAFETY: args[0] is the request, live for the call.
            let request = unsafe { Bound::from_borrowed_ptr(py, *args) };
            general(&manager(), &request, slot, &rid, a)
        }
        // SAFETY: as this function's.
        Fast::Other => unsafe { call_full(py, manager(), args, nargs, kwnames) },
    }
}

/// A decode in the scheduler's spelling that changes blocks. Out of line
/// (as is `call_full`): the no-op decode's code stays a few cache lines.
#[inline(never)]
fn general(
    manager: &Bound<'_, NativeManager>,
    request: &Bound<'_, PyAny>,
    slot: u32,
    rid: &Bound<'_, PyString>,
    a: AllocateArgs<'static>,
) -> PyResult<PyObject> {
    NativeManager::allocation_result(manager, request, |this| {
        this.allocate_general(Some(slot), request, rid, a)
    })
}

/// Every other spelling: Python's argument matching, then the full path.
///
/// # Safety
/// As `allocate_slots_fast`'s arguments, with the GIL held.
#[cold]
#[inline(never)]
unsafe fn call_full(
    py: Python<'_>,
    manager: Bound<'_, NativeManager>,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<PyObject> {
    // SAFETY: as this function's.
    let CallArgs {
        positional,
        keywords,
    } = unsafe { call_args(py, args, nargs, kwnames) }?;
    if positional.len() > PARAMS.len() {
        return Err(arg_error(ArgError::TooMany(positional.len())));
    }
    let mut given: [Option<Bound<'_, PyAny>>; 10] = Default::default();
    for (slot, v) in given.iter_mut().zip(positional) {
        *slot = Some(v);
    }
    for (name, v) in keywords {
        let i = param_index(py, &name)?;
        if given[i].is_some() {
            return Err(arg_error(ArgError::Twice(i)));
        }
        given[i] = Some(v);
    }
    let [request, num_new_tokens, rest @ ..] = given;
    let request = request.ok_or_else(|| arg_error(ArgError::Missing(0)))?;
    let num_new_tokens = num_new_tokens.ok_or_else(|| arg_error(ArgError::Missing(1)))?;
    // As PyO3 does for optional parameters: None is "left out".
    let rest = rest.map(|v| v.filter(|v| !v.is_none()));
    let [num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens, full_sequence_must_fit, reserved_blocks] =
        rest;
    NativeManager::allocate_slots_impl(
        &manager,
        &request,
        &num_new_tokens,
        AllocateSlotsArgs {
            num_new_computed_tokens: num_new_computed_tokens.as_ref(),
            new_computed_blocks: new_computed_blocks.as_ref(),
            num_lookahead_tokens: num_lookahead_tokens.as_ref(),
            num_external_computed_tokens: num_external_computed_tokens.as_ref(),
            delay_cache_blocks: opt_flag("delay_cache_blocks", delay_cache_blocks.as_ref())?,
            num_encoder_tokens: num_encoder_tokens.as_ref(),
            full_sequence_must_fit: opt_flag(
                "full_sequence_must_fit",
                full_sequence_must_fit.as_ref(),
            )?,
            reserved_blocks: reserved_blocks.as_ref(),
        },
    )
}

/// A non-negative int, or None where it is not one (no exception left set).
///
/// # Safety
/// `obj` is a live object; the GIL is held.
unsafe fn plain_count(obj: *mut ffi::PyObject) -> Option<usize> {
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

/// `request.<name>` as a plain count, or None (no exception left set).
///
/// # Safety
/// `request` is a live object; the GIL is held.
unsafe fn count_attr(request: *mut ffi::PyObject, name: &Bound<'_, PyString>) -> Option<usize> {
    // SAFETY: as this function's; the attribute is a new reference, released here.
    unsafe {
        let v = ffi::PyObject_GetAttr(request, name.as_ptr());
        if v.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        let n = plain_count(v);
        ffi::Py_DECREF(v);
        n
    }
}

/// What `decode_fast` made of a call.
enum Fast<'py> {
    /// A decode that changed no block: the shared empty result.
    Done(PyObject),
    /// The scheduler's spelling for a running request, its values read and
    /// valid, but the decode changes blocks: the general path goes on.
    General {
        slot: u32,
        args: AllocateArgs<'static>,
        rid: Bound<'py, PyString>,
    },
    /// Anything else (other spellings, odd values, unknown requests): the
    /// full path handles it, errors included (the reads here have no side
    /// effects, so repeating them changes nothing).
    Other,
}

/// The scheduler's call for a running request,
/// `(request, n, num_lookahead_tokens=k)`, in straight-line code with raw
/// calls and no error plumbing: under a Python scheduler a call's cost is
/// mostly instruction-cache misses. Most such calls change no block and end
/// here. No exception is left set.
///
/// # Safety
/// As `allocate_slots_fast`'s arguments, with the GIL held.
unsafe fn decode_fast<'py>(
    py: Python<'py>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> Fast<'py> {
    if nargs != 2 {
        return Fast::Other;
    }
    // SAFETY: the vectorcall contract: `args` holds 2 positional values and
    // one per keyword name; all are live for the call.
    unsafe {
        let mut lookahead = 0;
        if !kwnames.is_null() {
            let only_lookahead = ffi::PyTuple_Size(kwnames) == 1
                && ffi::PyTuple_GetItem(kwnames, 0) == param_names(py)[4].as_ptr();
            if !only_lookahead {
                return Fast::Other;
            }
            let v = *args.add(2);
            if v != ffi::Py_None() {
                match plain_count(v) {
                    Some(n) => lookahead = n,
                    None => return Fast::Other,
                }
            }
        }
        let Some(num_new_tokens) = plain_count(*args.add(1)).filter(|&n| n > 0) else {
            return Fast::Other;
        };
        // `slf` is a manager (see `call`).
        let obj = Borrowed::from_ptr(py, slf);
        let manager = obj.downcast_unchecked::<NativeManager>();
        let Ok(mut this) = manager.try_borrow_mut() else {
            return Fast::Other;
        };
        let request = *args;
        let rid = ffi::PyObject_GetAttr(request, intern!(py, "request_id").as_ptr());
        if rid.is_null() {
            ffi::PyErr_Clear();
            return Fast::Other;
        }
        let rid = Bound::from_owned_ptr(py, rid);
        // Only str ids are cached (by address: the cache holds the str).
        let Some(handle) = this.ids.get_addr(rid.as_ptr() as usize) else {
            return Fast::Other;
        };
        let Some(num_computed_tokens) = count_attr(request, intern!(py, "num_computed_tokens"))
        else {
            return Fast::Other;
        };
        let this = &mut *this;
        let Some(side) = &this.py_side else {
            return Fast::Other;
        };
        // Most decodes change no block: judged from the request's hot line.
        let unread = crate::NUM_TOKENS_UNREAD;
        let Some((slot, noop)) = this.inner.plain_decode_by_handle(
            handle,
            num_new_tokens,
            num_computed_tokens,
            unread,
            lookahead,
        ) else {
            return Fast::Other;
        };
        if noop {
            // A decode that changes no block makes no event.
            this.inner
                .record_plain_noop_decode(slot, num_computed_tokens, num_new_tokens);
            return Fast::Done(side.empty.clone_ref(py));
        }
        let args = AllocateArgs {
            num_new_tokens,
            num_computed_tokens,
            num_tokens: unread,
            num_lookahead_tokens: lookahead,
            ..Default::default()
        };
        match rid.downcast_into::<PyString>() {
            Ok(rid) => Fast::General { slot, args, rid },
            Err(_) => Fast::Other,
        }
    }
}

/// A vectorcall's arguments as objects: the positional values, then the
/// keyword (name, value) pairs.
struct CallArgs<'py> {
    positional: Vec<Bound<'py, PyAny>>,
    keywords: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
}

/// # Safety
/// `args`, `nargs` and `kwnames` follow the vectorcall contract and are
/// live for the call; the GIL is held.
unsafe fn call_args<'py>(
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

//! `allocate_slots` as a method of the facade's class, called with
//! CPython's vectorcall convention (METH_FASTCALL | METH_KEYWORDS).
//!
//! vLLM's scheduler calls `allocate_slots` once per running request per
//! step, with keywords. PyO3's generic argument matching (ten parameters,
//! names compared as strings) is a fifth of a no-op decode's cost; here
//! keywords match interned names by address first. The facade's class holds
//! it as its `allocate_slots` (a method descriptor of exactly that class,
//! so CPython specializes the scheduler's lookup and call);
//! `NativeManager.allocate_slots` stays the same call.

use hybridcache_core::AllocateArgs;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::vectorcall::{call_args, held_request, plain_count, raw_call, CallArgs, MethodDef};
use crate::allocate_params::{call_matched, param_name, Param};
use crate::native_manager::NativeManager;

static ALLOCATE_SLOTS: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"allocate_slots".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: allocate_slots_fast,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"vLLM's KVCacheManager.allocate_slots.".as_ptr(),
});

/// A method descriptor of `cls` (a `NativeManager` subclass: CPython
/// checks every `self` against it) calling `allocate_slots`.
pub fn allocate_slots_descriptor(cls: &Bound<'_, pyo3::types::PyType>) -> PyResult<PyObject> {
    super::vectorcall::method_descriptor(&ALLOCATE_SLOTS, cls)
}

unsafe extern "C" fn allocate_slots_fast(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls methods with the GIL held; the vectorcall
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
    // SAFETY: `slf` is a live manager: CPython checks it against the
    // descriptor's class, a `NativeManager` subclass (`_raw_methods`).
    let manager = || unsafe { Bound::from_borrowed_ptr(py, slf).downcast_into_unchecked() };
    match fast {
        Fast::Done(result) => Ok(result),
        Fast::General { slot, args: a } => {
            // The reads were done and checked: go on from there.
            // SAFETY: args[0] is the request, live for the call.
            let request = unsafe { Bound::from_borrowed_ptr(py, *args) };
            general(&manager(), &request, slot, a)
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
    a: AllocateArgs<'static>,
) -> PyResult<PyObject> {
    NativeManager::allocation_result(manager, request, |this| {
        this.allocate_general(Some(slot), request, None, a)
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
    call_matched(&manager, positional.into_iter(), keywords.into_iter())
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
enum Fast {
    /// A decode that changed no block: the shared empty result.
    Done(PyObject),
    /// The scheduler's spelling for a running request, its values read and
    /// valid, but the decode changes blocks: the general path goes on.
    General {
        slot: u32,
        args: AllocateArgs<'static>,
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
unsafe fn decode_fast(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> Fast {
    if nargs != 2 {
        return Fast::Other;
    }
    // SAFETY: the vectorcall contract: `args` holds 2 positional values and
    // one per keyword name; all are live for the call.
    unsafe {
        let mut lookahead = 0;
        if !kwnames.is_null() {
            let only_lookahead = ffi::PyTuple_Size(kwnames) == 1
                && ffi::PyTuple_GetItem(kwnames, 0)
                    == param_name(py, Param::NumLookaheadTokens).as_ptr();
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
        if this.watermark.blocks > 0 {
            // The watermark reads the request's status: the general path.
            return Fast::Other;
        }
        let request = *args;
        let Some(handle) = held_request(py, &mut this, request) else {
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
        let unread = crate::py_args::NUM_TOKENS_UNREAD;
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
        // The general path reads the tables and the free queue soon: fetch
        // their lines together now (they are cold under a Python scheduler).
        this.inner
            .for_each_general_decode_line(slot, super::vectorcall::prefetch);
        let args = AllocateArgs {
            num_new_tokens,
            num_computed_tokens,
            num_tokens: unread,
            num_lookahead_tokens: lookahead,
            ..Default::default()
        };
        Fast::General { slot, args }
    }
}

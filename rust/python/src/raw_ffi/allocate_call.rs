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

use super::vectorcall::{
    attr_count, call_args, dict_count, held_request, member_count, plain_count, raw_call, CallArgs,
    Fields, MethodDef,
};
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
    let _in_call = crate::call_guard::enter_addr(py, slf as usize, "allocate_slots")?;
    // SAFETY: as this function's.
    let fast = unsafe { decode_fast(py, slf, args, nargs, kwnames) }?;
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
        let result = this.allocate_general(Some(slot), request, None, a);
        // The next decode that takes a block starts at the new front of the
        // free queue: fetched now, while Python runs between the calls.
        this.inner
            .for_each_next_free_line(super::vectorcall::prefetch);
        result
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
    /// effects, so repeating them changes nothing; a read that raised is
    /// not repeated: `decode_fast` returns its error).
    Other,
}

/// The scheduler's call for a running request,
/// `(request, n, num_lookahead_tokens=k)`, in straight-line code with raw
/// calls and no error plumbing: under a Python scheduler a call's cost is
/// mostly instruction-cache misses. Most such calls change no block and end
/// here. An error: a read of the request raised, or the request's id
/// changed while held (nothing changed).
///
/// # Safety
/// As `allocate_slots_fast`'s arguments, with the GIL held.
unsafe fn decode_fast(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<Fast> {
    if nargs != 2 {
        return Ok(Fast::Other);
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
                return Ok(Fast::Other);
            }
            let v = *args.add(2);
            if v != ffi::Py_None() {
                match plain_count(v) {
                    Some(n) => lookahead = n,
                    None => return Ok(Fast::Other),
                }
            }
        }
        let Some(num_new_tokens) = plain_count(*args.add(1)).filter(|&n| n > 0) else {
            return Ok(Fast::Other);
        };
        // `slf` is a manager (see `call`).
        let obj = Borrowed::from_ptr(py, slf);
        let manager = obj.downcast_unchecked::<NativeManager>();
        let Ok(mut this) = manager.try_borrow_mut() else {
            return Ok(Fast::Other);
        };
        if this.watermark.blocks > 0 {
            // The watermark reads the request's status: the general path.
            return Ok(Fast::Other);
        }
        let request = *args;
        let Some((handle, fields)) = held_request(py, &mut this, request)? else {
            return Ok(Fast::Other);
        };
        let name = intern!(py, "num_computed_tokens");
        let computed = match &fields {
            Fields::Dict(d) => dict_count(py, d, request, name)?,
            Fields::Members(m) => member_count(py, m, request, name)?,
            Fields::Generic => attr_count(py, request, name)?,
        };
        drop(fields);
        let Some(num_computed_tokens) = computed else {
            return Ok(Fast::Other);
        };
        let this = &mut *this;
        let Some(side) = &this.py_side else {
            return Ok(Fast::Other);
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
            return Ok(Fast::Other);
        };
        if noop {
            // A decode that changes no block makes no event.
            this.inner
                .record_plain_noop_decode(slot, num_computed_tokens, num_new_tokens);
            return Ok(Fast::Done(side.empty.clone_ref(py)));
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
        Ok(Fast::General { slot, args })
    }
}

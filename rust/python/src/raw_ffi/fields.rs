//! Where the hot calls read a held request's `request_id` and
//! `num_computed_tokens`, judged once, when the request is remembered (at
//! its allocation), from its type:
//!
//! - `IN_DICT`: the type reads attributes the generic way and has no class
//!   attribute of either name: they are its `__dict__`'s entries;
//! - `MEMBERS + k`: the type reads attributes the generic way and both are
//!   its `__slots__` (member descriptors, which take precedence over any
//!   instance dict): read through those descriptors (entry `k` of the
//!   manager's `MemberReaders`), skipping the generic lookup's type walk;
//! - `GENERIC`: anything else (properties, `__getattr__`,
//!   `__getattribute__`): `PyObject_GetAttr`.
//!
//! Each is what the generic lookup would return, at a fraction of its
//! cost. A request whose class was swapped since is read the generic way.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyType;

pub(crate) const GENERIC: u8 = 0;
pub(crate) const IN_DICT: u8 = 1;
pub(crate) const MEMBERS: u8 = 2;

/// Distinct request types a manager reads through their slots (more are
/// read the generic way).
const MAX_TYPES: usize = (u8::MAX - MEMBERS) as usize;

/// One request type's member descriptors of `request_id` and
/// `num_computed_tokens`, and their `__get__`. The descriptors are held by
/// `MemberReaders` (and hold their type), so the pointers stay valid.
#[derive(Clone, Copy)]
pub(crate) struct Members {
    ty: *mut ffi::PyTypeObject,
    request_id: *mut ffi::PyObject,
    num_computed_tokens: *mut ffi::PyObject,
    get: DescrGet,
}

// SAFETY: the pointers are to objects `MemberReaders` holds alive, used
// only with the GIL held (as every Python object the manager holds).
unsafe impl Send for Members {}
unsafe impl Sync for Members {}

/// The member readers of the request types a manager has seen.
#[derive(Default)]
pub(crate) struct MemberReaders {
    entries: Vec<Members>,
    held: Vec<PyObject>,
}

impl MemberReaders {
    /// The readers of field access `access` (a `MEMBERS + k` value).
    #[inline(always)]
    pub(crate) fn get(&self, access: u8) -> Option<&Members> {
        self.entries.get(usize::from(access.wrapping_sub(MEMBERS)))
    }
}

impl Members {
    /// `request.request_id` (`which` false) or `request.num_computed_tokens`
    /// (true) through the slot: a new reference, or NULL with the error set
    /// (an unset slot's AttributeError, as the generic lookup raises); None
    /// where the request's type is not this entry's (read it generically).
    ///
    /// # Safety
    /// `request` is a live object; the GIL is held.
    #[inline(always)]
    pub(crate) unsafe fn read(
        &self,
        request: *mut ffi::PyObject,
        which: bool,
    ) -> Option<*mut ffi::PyObject> {
        // SAFETY: as this function's; the descriptors are live (held by
        // the manager), and a member descriptor's `__get__` checks the
        // object's type itself.
        unsafe {
            if ffi::Py_TYPE(request) != self.ty {
                return None;
            }
            let descr = if which {
                self.num_computed_tokens
            } else {
                self.request_id
            };
            Some((self.get)(descr, request, self.ty.cast()))
        }
    }
}

/// How the hot calls read `request`'s fields (`GENERIC`, `IN_DICT` or a
/// `MEMBERS` entry of `readers`, added there if new).
pub(crate) fn access_of(request: &Bound<'_, PyAny>, readers: &mut MemberReaders) -> u8 {
    let py = request.py();
    let ty = request.get_type();
    // SAFETY: a live type; the slot is read, not called.
    let getattro = unsafe { ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_getattro) };
    if getattro != ffi::PyObject_GenericGetAttr as *mut std::ffi::c_void {
        return GENERIC;
    }
    let names = [
        pyo3::intern!(py, "request_id"),
        pyo3::intern!(py, "num_computed_tokens"),
    ];
    if names
        .iter()
        .all(|name| matches!(ty.hasattr(*name), Ok(false)))
    {
        return IN_DICT;
    }
    let (Ok(rid), Ok(computed)) = (ty.getattr(names[0]), ty.getattr(names[1])) else {
        return GENERIC;
    };
    let Some(member_type) = member_descriptor_type(py) else {
        return GENERIC;
    };
    if !rid.get_type().is(member_type) || !computed.get_type().is(member_type) {
        return GENERIC;
    }
    let found = readers.entries.iter().position(|m| {
        m.ty == ty.as_type_ptr()
            && m.request_id == rid.as_ptr()
            && m.num_computed_tokens == computed.as_ptr()
    });
    let k = match found {
        Some(k) => k,
        None if readers.entries.len() < MAX_TYPES => {
            // SAFETY: a live type; the slot is read, not called.
            let get =
                unsafe { ffi::PyType_GetSlot(member_type.as_type_ptr(), ffi::Py_tp_descr_get) };
            if get.is_null() {
                return GENERIC;
            }
            readers.entries.push(Members {
                ty: ty.as_type_ptr(),
                request_id: rid.as_ptr(),
                num_computed_tokens: computed.as_ptr(),
                // SAFETY: the type's `tp_descr_get` slot is a descrgetfunc.
                get: unsafe { std::mem::transmute::<*mut std::ffi::c_void, DescrGet>(get) },
            });
            readers.held.extend([rid.unbind(), computed.unbind()]);
            readers.entries.len() - 1
        }
        None => return GENERIC,
    };
    MEMBERS + k as u8
}

type DescrGet = unsafe extern "C" fn(
    *mut ffi::PyObject,
    *mut ffi::PyObject,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;

/// `types.MemberDescriptorType` (a `__slots__` entry's descriptor type).
fn member_descriptor_type(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
    static TYPE: GILOnceCell<Py<PyType>> = GILOnceCell::new();
    TYPE.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        Ok(py
            .import("types")?
            .getattr("MemberDescriptorType")?
            .downcast_into::<PyType>()?
            .unbind())
    })
    .ok()
    .map(|t| t.bind(py))
}

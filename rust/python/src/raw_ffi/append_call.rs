//! vLLM's `Request.append_output_token_ids` as a raw method descriptor.
//!
//! vLLM's scheduler appends each sampled token with
//! `request.append_output_token_ids(token)`, which appends it to two token
//! containers (lists, or in newer releases `array('i')`-based
//! `TokenBuffer`s appended by their own C `append`) and calls
//! `update_block_hashes()`, which calls the request's block hasher: two
//! Python frames and a builtin call per token, for every running
//! request every step, where most calls find no new full block. With native
//! hashing installed, this descriptor does the same work in one call: the two
//! appends, then (for a request whose hasher is hybridcache's) the hasher's
//! own no-new-block test, hashing only when a block fills.
//!
//! It follows the body every supported release shares. Every other case runs
//! vLLM's own code: other spellings and non-int tokens its
//! `append_output_token_ids`, other hashers its `update_block_hashes` rule,
//! and subclasses their own methods. The class's `update_block_hashes` is
//! checked where the descriptor is put on (`hybridcache.vllm_tokens`), not
//! at every token: reading a class attribute from native code costs about
//! a third of what the descriptor saves. So is the class's lack of
//! attributes named like the four fields a token append reads: the fields
//! are then read from the request's own dict, which is what CPython's
//! generic lookup finds there, at a fraction of its cost (it first searches
//! the class for a descriptor of that name). A field missing from the dict
//! is looked up as vLLM's code would, errors included.

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyList, PyType};

use super::hasher_call::native_hasher;
use super::vectorcall::{call_with, raw_call, MethodDef};
use crate::hasher::BlockHasher;

static APPEND_OUTPUT_TOKEN_IDS: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"append_output_token_ids".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: append_fast,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"append_output_token_ids($self, token_ids)\n--\n\n\
vLLM's Request.append_output_token_ids, with hybridcache's native block \
hashing: appends the tokens, then hashes any new full block."
        .as_ptr(),
});

/// vLLM's `Request` class and the methods of its own the descriptor stands for.
struct Originals {
    class: Py<PyType>,
    /// `append_output_token_ids`: every spelling the descriptor does not take.
    append: PyObject,
    /// `update_block_hashes`: called for hashers other than hybridcache's.
    update: PyObject,
    /// The class has no attribute named like a field `append_token` reads:
    /// an instance's fields are its dict's entries.
    fields_in_dict: bool,
}

/// The request fields a token append reads.
const FIELDS: [&str; 4] = [
    "_output_token_ids",
    "_all_token_ids",
    "_block_hasher",
    "block_hashes",
];

/// Set by the first `token_append` (vLLM has one `Request` class per process).
static ORIGINALS: GILOnceCell<Originals> = GILOnceCell::new();

/// A method descriptor standing for `request_class.append_output_token_ids`
/// (`append`, vLLM's function) whose class's `update_block_hashes` is
/// `update`. ValueError for a class or methods other than the first call's.
pub fn token_append(
    request_class: &Bound<'_, PyType>,
    append: PyObject,
    update: PyObject,
) -> PyResult<PyObject> {
    let py = request_class.py();
    let mine = ORIGINALS.get_or_init(py, || Originals {
        class: request_class.clone().unbind(),
        append: append.clone_ref(py),
        update: update.clone_ref(py),
        // Checked once, with the class it stands for (later calls must name it).
        fields_in_dict: FIELDS
            .iter()
            .all(|name| matches!(request_class.hasattr(*name), Ok(false))),
    });
    if !mine.class.is(request_class) || !mine.append.is(&append) || !mine.update.is(&update) {
        return Err(PyValueError::new_err(format!(
            "the native token append stands for {} already; it was asked for {} \
             (or for other methods of it)",
            mine.class.bind(py).name()?,
            request_class.name()?
        )));
    }
    super::vectorcall::method_descriptor(&APPEND_OUTPUT_TOKEN_IDS, request_class)
}

unsafe extern "C" fn append_fast(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls method descriptors with the GIL held, `slf` an
    // instance of the class (checked by the descriptor) and the vectorcall
    // contract's arguments.
    unsafe {
        raw_call(|py| {
            // The descriptor exists only once ORIGINALS is set.
            let Some(mine) = ORIGINALS.get(py) else {
                return Err(PyValueError::new_err(
                    "native token append used before it was made",
                ));
            };
            if nargs == 1 && kwnames.is_null() && append_token(py, mine, slf, *args)? {
                return Ok(py.None());
            }
            let request = Bound::from_borrowed_ptr(py, slf);
            call_with(mine.append.bind(py), Some(&request), args, nargs, kwnames)
        })
    }
}

/// `request.append_output_token_ids(token)` for one int token of a request
/// of exactly vLLM's class. False: not taken, nothing done (vLLM's method
/// runs instead).
///
/// # Safety
/// `request` and `token` are live objects; the GIL is held.
unsafe fn append_token(
    py: Python<'_>,
    mine: &Originals,
    request: *mut ffi::PyObject,
    token: *mut ffi::PyObject,
) -> PyResult<bool> {
    // SAFETY: as this function's; attributes read are new references owned
    // by Bounds.
    unsafe {
        let class = mine.class.bind(py);
        if ffi::Py_TYPE(request) != class.as_type_ptr() || ffi::PyLong_Check(token) == 0 {
            return Ok(false);
        }
        let request = Bound::from_borrowed_ptr(py, request);
        let fields = Fields::of(mine, &request);
        // Both lists read before either is changed: anything odd (a missing
        // list, another type) is vLLM's code's to run, and to fail as it does.
        let (Ok(output), Ok(all)) = (
            fields.get(intern!(py, "_output_token_ids")),
            fields.get(intern!(py, "_all_token_ids")),
        ) else {
            return Ok(false);
        };
        // Exact lists (older releases) are appended to directly; other
        // containers (vLLM's `TokenBuffer`, an `array('i')`) by their own
        // `append`, as vLLM's method does: C calls, no Python frame.
        let lists = ffi::PyList_CheckExact(output.as_ptr()) != 0
            && ffi::PyList_CheckExact(all.as_ptr()) != 0;
        if lists {
            list_append(py, &output, token)?;
            list_append(py, &all, token)?;
        } else {
            let token = Borrowed::from_ptr(py, token);
            output.call_method1(intern!(py, "append"), (token,))?;
            all.call_method1(intern!(py, "append"), (token,))?;
        }
        // vLLM's update_block_hashes, for hybridcache's hasher.
        let hasher = fields.get(intern!(py, "_block_hasher"))?;
        if hasher.is_none() {
            return Ok(true);
        }
        let hashes = fields.get(intern!(py, "block_hashes"))?;
        if ffi::PyList_CheckExact(hashes.as_ptr()) == 0 {
            mine.update.bind(py).call1((request,))?;
            return Ok(true);
        }
        let Some(h) = native_hasher(py, hasher.as_ptr()) else {
            // Another hasher (vLLM's, for a hash function hybridcache does
            // not reproduce): called from here, a Python frame fewer.
            let new = ffi::PyObject_CallFunctionObjArgs(
                hasher.as_ptr(),
                request.as_ptr(),
                std::ptr::null_mut::<ffi::PyObject>(),
            );
            let new = Bound::from_owned_ptr_or_err(py, new)?;
            if ffi::PyList_CheckExact(new.as_ptr()) == 0 {
                hashes.call_method1(intern!(py, "extend"), (new,))?;
                return Ok(true);
            }
            return extend(py, &hashes, new.downcast_into_unchecked());
        };
        let h = Borrowed::from_ptr(py, h);
        let h = h.downcast_unchecked::<BlockHasher>().get();
        let have = usize::try_from(ffi::PyList_Size(hashes.as_ptr())).unwrap_or(0);
        let num_tokens = if lists {
            usize::try_from(ffi::PyList_Size(all.as_ptr())).unwrap_or(0)
        } else {
            all.len()?
        };
        if !h.has_new_block(have, num_tokens) {
            return Ok(true);
        }
        extend(py, &hashes, h.hash_new_blocks(py, &request)?)
    }
}

/// A request's fields as `request.<name>` finds them: from its dict where
/// the class defines none of them (`Originals::fields_in_dict`).
struct Fields<'a, 'py> {
    request: &'a Bound<'py, PyAny>,
    dict: Option<Bound<'py, PyAny>>,
}

impl<'a, 'py> Fields<'a, 'py> {
    fn of(mine: &Originals, request: &'a Bound<'py, PyAny>) -> Self {
        if !mine.fields_in_dict {
            return Fields {
                request,
                dict: None,
            };
        }
        // SAFETY: `request` is live and the GIL is held; the result is a
        // new reference, or NULL with an exception set (cleared here).
        let dict = unsafe {
            let d = ffi::PyObject_GenericGetDict(request.as_ptr(), std::ptr::null_mut());
            if d.is_null() {
                ffi::PyErr_Clear();
            }
            Bound::from_owned_ptr_or_opt(request.py(), d)
        };
        Fields { request, dict }
    }

    /// `request.<name>`: the dict's entry, else the generic lookup (which
    /// then finds nothing else and raises vLLM's AttributeError).
    fn get(&self, name: &Bound<'py, pyo3::types::PyString>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(d) = &self.dict {
            // SAFETY: `d` is a live dict and `name` a str; the result is
            // borrowed from the dict (made owned at once), or NULL with or
            // without an exception set (cleared: the lookup below decides).
            let found = unsafe {
                let v = ffi::PyDict_GetItemWithError(d.as_ptr(), name.as_ptr());
                if v.is_null() {
                    ffi::PyErr_Clear();
                }
                Bound::from_borrowed_ptr_or_opt(self.request.py(), v)
            };
            if let Some(v) = found {
                return Ok(v);
            }
        }
        self.request.getattr(name)
    }
}

/// `hashes.extend(new)` for two exact lists; Ok(true) as `append_token`.
fn extend(py: Python<'_>, hashes: &Bound<'_, PyAny>, new: Bound<'_, PyList>) -> PyResult<bool> {
    for h in new.iter() {
        // SAFETY: `hashes` is an exact list (checked by the caller).
        unsafe { list_append(py, hashes, h.as_ptr())? };
    }
    Ok(true)
}

/// `list.append(item)` on an exact list.
///
/// # Safety
/// `list` is an exact list, `item` a live object; the GIL is held.
unsafe fn list_append(
    py: Python<'_>,
    list: &Bound<'_, PyAny>,
    item: *mut ffi::PyObject,
) -> PyResult<()> {
    // SAFETY: as this function's.
    if unsafe { ffi::PyList_Append(list.as_ptr(), item) } < 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(())
}

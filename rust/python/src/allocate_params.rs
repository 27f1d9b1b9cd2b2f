//! vLLM's parameter list of `allocate_slots`, written once (ten, then the
//! two step arguments; a manager whose profile lacks `allocate_step_args`
//! takes only the first ten), and Python's argument matching over it. Both entries (the PyO3 method and,
//! with the `raw-ffi` feature, the vectorcall builtin) match through here.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::calls::AllocateSlotsArgs;
use crate::native_manager::NativeManager;
use crate::py_args::opt_flag;

impl NativeManager {
    /// How many `allocate_slots` parameters this manager's profile takes.
    pub(crate) fn num_allocate_params(&self) -> usize {
        if self.inner.profile().allocate_step_args {
            NUM_PARAMS
        } else {
            NUM_PARAMS_WITHOUT_STEP_ARGS
        }
    }
}

/// The parameters, in vLLM's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Param {
    Request,
    NumNewTokens,
    NumNewComputedTokens,
    NewComputedBlocks,
    NumLookaheadTokens,
    NumExternalComputedTokens,
    DelayCacheBlocks,
    NumEncoderTokens,
    FullSequenceMustFit,
    ReservedBlocks,
    HasScheduledReqs,
    SkipZeroingGroupIds,
}

pub(crate) const NUM_PARAMS: usize = 12;
/// The parameters before the step arguments (a prefix of PARAMS): all of
/// them without the profile's `allocate_step_args`.
pub(crate) const NUM_PARAMS_WITHOUT_STEP_ARGS: usize = 10;

/// Each parameter's name, indexed by `Param`.
pub(crate) const PARAMS: [&str; NUM_PARAMS] = [
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
    "has_scheduled_reqs",
    "skip_zeroing_group_ids",
];

/// The interned parameter names (keyword names in call sites are interned
/// too, so a match is usually one pointer compare).
pub(crate) fn param_names(py: Python<'_>) -> &[Py<PyString>; NUM_PARAMS] {
    static NAMES: GILOnceCell<[Py<PyString>; NUM_PARAMS]> = GILOnceCell::new();
    NAMES.get_or_init(py, || PARAMS.map(|p| PyString::intern(py, p).unbind()))
}

/// The interned name of `p`.
#[cfg(feature = "raw-ffi")]
pub(crate) fn param_name(py: Python<'_>, p: Param) -> &Py<PyString> {
    &param_names(py)[p as usize]
}

/// `name`'s index among the first `n` parameters (the manager's release's).
fn param_index(py: Python<'_>, name: &Bound<'_, PyAny>, n: usize) -> PyResult<usize> {
    let names = &param_names(py)[..n];
    if let Some(i) = names.iter().position(|p| p.as_ptr() == name.as_ptr()) {
        return Ok(i);
    }
    let text = name.downcast::<PyString>()?.to_str()?;
    PARAMS[..n]
        .iter()
        .position(|&p| p == text)
        .ok_or_else(|| arg_error(ArgError::Unknown(text)))
}

/// Python's own wording for bad call arguments.
enum ArgError<'a> {
    /// (given, the most taken)
    TooMany(usize, usize),
    Twice(usize),
    Missing(usize),
    Unknown(&'a str),
}

#[cold]
#[inline(never)]
fn arg_error(e: ArgError<'_>) -> PyErr {
    PyTypeError::new_err(match e {
        ArgError::TooMany(n, most) => {
            format!("allocate_slots() takes at most {most} arguments ({n} given)")
        }
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

/// Python's argument matching of a call, then the full `allocate_slots`.
pub(crate) fn call_matched<'py>(
    manager: &Bound<'py, NativeManager>,
    positional: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
    keywords: impl Iterator<Item = (Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<PyObject> {
    let py = manager.py();
    let n = crate::call_guard::borrow(manager)?.num_allocate_params();
    if positional.len() > n {
        return Err(arg_error(ArgError::TooMany(positional.len(), n)));
    }
    let mut given: [Option<Bound<'_, PyAny>>; NUM_PARAMS] = Default::default();
    for (slot, v) in given.iter_mut().zip(positional) {
        *slot = Some(v);
    }
    for (name, v) in keywords {
        let i = param_index(py, &name, n)?;
        if given[i].is_some() {
            return Err(arg_error(ArgError::Twice(i)));
        }
        given[i] = Some(v);
    }
    let take =
        |given: &mut [Option<Bound<'py, PyAny>>; NUM_PARAMS], p: Param| given[p as usize].take();
    let request = take(&mut given, Param::Request)
        .ok_or_else(|| arg_error(ArgError::Missing(Param::Request as usize)))?;
    let num_new_tokens = take(&mut given, Param::NumNewTokens)
        .ok_or_else(|| arg_error(ArgError::Missing(Param::NumNewTokens as usize)))?;
    // As PyO3 does for optional parameters: None is "left out".
    let opt = given.map(|v| v.filter(|v| !v.is_none()));
    let get = |p: Param| opt[p as usize].as_ref();
    NativeManager::allocate_slots_impl(
        manager,
        &request,
        &num_new_tokens,
        AllocateSlotsArgs {
            num_new_computed_tokens: get(Param::NumNewComputedTokens),
            new_computed_blocks: get(Param::NewComputedBlocks),
            num_lookahead_tokens: get(Param::NumLookaheadTokens),
            num_external_computed_tokens: get(Param::NumExternalComputedTokens),
            delay_cache_blocks: opt_flag(
                PARAMS[Param::DelayCacheBlocks as usize],
                get(Param::DelayCacheBlocks),
            )?,
            num_encoder_tokens: get(Param::NumEncoderTokens),
            full_sequence_must_fit: opt_flag(
                PARAMS[Param::FullSequenceMustFit as usize],
                get(Param::FullSequenceMustFit),
            )?,
            reserved_blocks: get(Param::ReservedBlocks),
            has_scheduled_reqs: match get(Param::HasScheduledReqs) {
                None => true,
                v => opt_flag(PARAMS[Param::HasScheduledReqs as usize], v)?,
            },
            skip_zeroing_group_ids: get(Param::SkipZeroingGroupIds),
        },
    )
}

#[pymethods]
impl NativeManager {
    /// vLLM's `KVCacheManager.allocate_slots(request, num_new_tokens,
    /// num_new_computed_tokens=0, new_computed_blocks=None,
    /// num_lookahead_tokens=0, num_external_computed_tokens=0,
    /// delay_cache_blocks=False, num_encoder_tokens=0,
    /// full_sequence_must_fit=False, reserved_blocks=0)`, then
    /// `has_scheduled_reqs=True, skip_zeroing_group_ids=None` where the
    /// profile has `allocate_step_args`; the parameters are matched as
    /// Python does (`PARAMS`). The facade's class
    /// has the raw entry point in its place (`_raw_methods`).
    #[pyo3(signature = (*args, **kwargs))]
    fn allocate_slots(
        slf: &Bound<'_, Self>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyObject> {
        let _in_call = crate::call_guard::enter(slf, "allocate_slots")?;
        call_matched(slf, args.iter(), kwargs.into_iter().flat_map(|k| k.iter()))
    }
}

//! vLLM's per-request calls past allocation and lookup: a request's
//! blocks, `free`, `cache_blocks`, window frees, evictions, the prefix
//! cache's reset and the coordinator's block count.

use hybridcache_core::KvCacheManager;
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::call_guard::{borrow, borrow_mut, enter};
use crate::convert::{self, block_ids, count_obj, guard, ids_tuple, req_attr};
use crate::native_manager::NativeManager;
use crate::py_args::request_id;

#[pymethods]
impl NativeManager {
    /// vLLM's `get_blocks(request_id)`: the request's blocks per group (the
    /// shared empty `KVCacheBlocks` for a request without blocks).
    fn get_blocks(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<PyObject> {
        let ids = borrow(slf)?.inner.get_block_ids(request_id);
        Self::make_blocks(slf, &ids)
    }

    /// vLLM's `free(request)`: frees the request's blocks, tail first.
    /// ValueError (nothing freed) for a held request whose id changed.
    fn free(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let _in_call = enter(slf, "free")?;
        let rid_obj = request_id(request)?;
        let rid = rid_obj.to_str()?;
        let _held = {
            let mut this = borrow_mut(slf)?;
            this.check_free_identity(request, &rid_obj)?;
            let (slot, held) = this.forget_request_object(rid);
            #[cfg(feature = "raw-ffi")]
            if let Some(s) = slot {
                this.inner
                    .for_each_free_line_at(s, crate::raw_ffi::vectorcall::prefetch);
            }
            #[cfg(not(feature = "raw-ffi"))]
            let _ = slot;
            guard(|| {
                this.inner.free(rid);
                Ok(())
            })?;
            held
        };
        // The request objects let go of are dropped here, the manager
        // settled and not borrowed (a finalizer may run and call it: it is
        // refused, this call being in progress).
        Ok(())
    }

    /// vLLM's `cache_blocks(request, num_computed_tokens)`.
    fn cache_blocks(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _in_call = enter(slf, "cache_blocks")?;
        Self::cache_blocks_impl(slf, request, num_computed_tokens)
    }

    /// `num_prompt_tokens` (vLLM's argument, None: not passed) frees R-SWA gaps.
    #[pyo3(signature = (request_id, total_computed_tokens, num_prompt_tokens=None))]
    fn remove_skipped_blocks(
        slf: &Bound<'_, Self>,
        request_id: &str,
        total_computed_tokens: &Bound<'_, PyAny>,
        num_prompt_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let _in_call = enter(slf, "remove_skipped_blocks")?;
        let total = count_obj("total_computed_tokens", total_computed_tokens)?;
        let prompt = num_prompt_tokens
            .filter(|p| !p.is_none())
            .map(|p| count_obj("num_prompt_tokens", p))
            .transpose()?;
        let mut this = borrow_mut(slf)?;
        guard(|| {
            this.inner
                .remove_skipped_blocks_of_prompt(request_id, total, prompt);
            Ok(())
        })
    }

    /// Drops the given blocks (any iterable of ids) from the prefix cache.
    fn evict_blocks(slf: &Bound<'_, Self>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let _in_call = enter(slf, "evict_blocks")?;
        // Read (the caller's iterable and ints run its code), then change.
        let mut values = Vec::new();
        for b in block_ids.try_iter()? {
            let b = b?;
            let v = b.extract::<i64>().map_err(|e| {
                if convert::caller_raised(slf.py(), &e) {
                    return e;
                }
                PyTypeError::new_err(format!(
                    "evict_blocks: block_ids must be ints, got {}",
                    convert::type_name(&b)
                ))
            })?;
            values.push(v);
        }
        {
            let mut this = borrow_mut(slf)?;
            let ids = values
                .into_iter()
                .map(|v| this.block_id(v))
                .collect::<PyResult<Vec<u32>>>()?;
            guard(|| this.inner.evict_blocks(&ids))?;
        }
        Self::flush_events(slf, None)
    }

    fn reset_prefix_cache(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let _in_call = enter(slf, "reset_prefix_cache")?;
        let ok = {
            let mut this = borrow_mut(slf)?;
            guard(|| Ok(this.inner.reset_prefix_cache()))?
        };
        Self::flush_events(slf, None)?;
        Ok(ok)
    }

    fn get_num_common_prefix_blocks(
        slf: &Bound<'_, Self>,
        running_request_id: &str,
    ) -> PyResult<Vec<usize>> {
        let _in_call = enter(slf, "get_num_common_prefix_blocks")?;
        let mut this = borrow_mut(slf)?;
        guard(|| Ok(this.inner.get_num_common_prefix_blocks(running_request_id)))
    }

    fn get_block_ids<'py>(
        slf: &Bound<'py, Self>,
        request_id: &str,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let ids = borrow(slf)?.inner.get_block_ids(request_id);
        ids_tuple(slf.py(), &ids)
    }

    /// vLLM's `coordinator.get_num_blocks_to_allocate` (reads only).
    #[pyo3(signature = (request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
                        total_computed_tokens, num_tokens_main_model, apply_admission_cap=false,
                        prefill_end=None))]
    #[allow(clippy::too_many_arguments)]
    fn get_num_blocks_to_allocate(
        slf: &Bound<'_, Self>,
        request_id: &str,
        num_tokens: &Bound<'_, PyAny>,
        new_computed_blocks: &Bound<'_, PyAny>,
        num_encoder_tokens: &Bound<'_, PyAny>,
        total_computed_tokens: &Bound<'_, PyAny>,
        num_tokens_main_model: &Bound<'_, PyAny>,
        apply_admission_cap: bool,
        prefill_end: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        // The arguments are read first (ints and lists of the caller's
        // types run its code), then the manager.
        let num_blocks = borrow(slf)?.inner.pool().num_blocks();
        let nc = block_ids(new_computed_blocks, num_blocks, "new_computed_blocks")?;
        let (n, e, t, mm) = (
            count_obj("num_tokens", num_tokens)?,
            count_obj("num_encoder_tokens", num_encoder_tokens)?,
            count_obj("total_computed_tokens", total_computed_tokens)?,
            count_obj("num_tokens_main_model", num_tokens_main_model)?,
        );
        let pe = prefill_end.map_or(Ok(0), |v| count_obj("prefill_end", v))?;
        let this = borrow(slf)?;
        guard(|| {
            this.inner.get_num_blocks_to_allocate(
                request_id,
                n,
                &nc,
                e,
                t,
                mm,
                apply_admission_cap,
                pe,
            )
        })
    }
}

/// The request fields the core keeps for a `cache_blocks` call, read
/// when it wants them: `shared_prefix_boundary` and `num_computed_tokens`.
/// Both are read before either is set (a read that raises changes nothing).
pub(crate) fn cache_fields(
    inner: &KvCacheManager,
    request: &Bound<'_, PyAny>,
) -> PyResult<(Option<usize>, Option<usize>)> {
    let py = request.py();
    let boundary = if inner.wants_shared_prefix_boundary() {
        let b = req_attr(request, intern!(py, "shared_prefix_boundary"))?;
        Some(count_obj("request.shared_prefix_boundary", &b)?)
    } else {
        None
    };
    let computed = if inner.wants_num_computed_tokens() {
        let n = req_attr(request, intern!(py, "num_computed_tokens"))?;
        Some(count_obj("request.num_computed_tokens", &n)?)
    } else {
        None
    };
    Ok((boundary, computed))
}

/// `cache_blocks` of a held request (`slot`): the hashes it lacks, its
/// shared-prefix boundary and computed count where the core keeps them
/// (all read first), then the core's call.
pub(crate) fn cache_held(
    this: &mut NativeManager,
    request: &Bound<'_, PyAny>,
    slot: u32,
    num_computed_tokens: usize,
) -> PyResult<()> {
    let update = this.pending_hashes_at(request, Some(slot))?;
    let (boundary, computed) = cache_fields(&this.inner, request)?;
    if let Some(b) = boundary {
        this.inner.set_shared_prefix_boundary_at(slot, b);
    }
    if let Some(n) = computed {
        this.inner.set_num_computed_tokens_at(slot, n);
    }
    guard(|| {
        this.inner
            .cache_blocks_held(slot, num_computed_tokens, update)
    })
}

impl NativeManager {
    /// `cache_blocks` of a request the caller found held in `slot` by its
    /// object, its id read and checked (the raw entry's hot call): the
    /// general path's effects, events included, without reading the id
    /// again.
    #[cfg_attr(not(feature = "raw-ffi"), allow(dead_code))]
    pub(crate) fn cache_blocks_of_slot(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        slot: u32,
        num_computed_tokens: usize,
    ) -> PyResult<()> {
        Self::caching(slf, request, |this| {
            cache_held(this, request, slot, num_computed_tokens)
        })
    }

    /// A `cache_blocks` call's change, `cache`, between reading what the
    /// event sink reads of `request` and flushing the events it made.
    fn caching(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        cache: impl FnOnce(&mut Self) -> PyResult<()>,
    ) -> PyResult<()> {
        let source = Self::event_source(slf, request)?;
        // The borrow ends with the statement, before the events go out.
        cache(&mut *crate::call_guard::borrow_mut(slf)?)?;
        Self::flush_events(slf, Some(source.as_ref().unwrap_or(request)))
    }

    /// `cache_blocks` after the call guard (the PyO3 method and the raw
    /// entry land here).
    pub(crate) fn cache_blocks_impl(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let n = count_obj("num_computed_tokens", num_computed_tokens)?;
        let rid = crate::py_args::request_id(request)?;
        if !crate::call_guard::borrow(slf)?.inner.enable_caching() {
            return Ok(());
        }
        Self::caching(slf, request, |this| {
            // A held request by its id object's address (vLLM caches
            // every running request every step): no str hashing.
            if let Some(slot) = this.checked_slot(request, &rid)? {
                return cache_held(this, request, slot, n);
            }
            let rid = rid.to_str()?;
            let update = this.pending_hashes(request, rid)?;
            let (boundary, computed) = cache_fields(&this.inner, request)?;
            if let Some(b) = boundary {
                this.inner.set_shared_prefix_boundary(rid, b);
            }
            if let Some(c) = computed {
                this.inner.set_num_computed_tokens(rid, c);
            }
            guard(|| this.inner.cache_blocks(rid, n, update))
        })
    }
}

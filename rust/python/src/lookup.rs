//! `get_computed_blocks`: the core decides whether to look up and what
//! counts; this reads the request's attributes it asks for.

use hybridcache_core::CoreError;
use pyo3::intern;
use pyo3::prelude::*;

use crate::call_guard::{borrow, borrow_mut};
use crate::convert::{count_obj, guard, hash_update, req_attr};
use crate::native_manager::NativeManager;
use crate::py_args::request_id;

pub(crate) fn computed_blocks<'py>(
    slf: &Bound<'py, NativeManager>,
    request: &Bound<'py, PyAny>,
    max_cache_hit_length: Option<&Bound<'py, PyAny>>,
) -> PyResult<(PyObject, usize, usize)> {
    let (blocks, hit, boundary, _) = lookup(slf, request, max_cache_hit_length, false)?;
    Ok((blocks, hit, boundary))
}

/// `computed_blocks`, or with `connector` vLLM's per-group lookup for
/// a KV connector where it applies: then the last item is `Some(hit_diverged)`
/// (None: the reconciled lookup answered).
pub(crate) fn lookup<'py>(
    slf: &Bound<'py, NativeManager>,
    request: &Bound<'py, PyAny>,
    max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    connector: bool,
) -> PyResult<(PyObject, usize, usize, Option<bool>)> {
    let py = slf.py();
    let max_hit = match max_cache_hit_length.filter(|m| !m.is_none()) {
        Some(_) if !borrow(slf)?.inner.profile().lookup_hit_cap_arg => {
            // Without the profile's hit cap, the call takes only the request.
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "get_computed_blocks() got an unexpected keyword argument 'max_cache_hit_length'",
            ));
        }
        Some(m) => Some(count_obj("max_cache_hit_length", m)?),
        None => None,
    };
    let empty = || -> PyResult<PyObject> { Ok(borrow(slf)?.py_side()?.empty.clone_ref(py)) };
    let gate = borrow(slf)?.read_gate;
    let Some(limit) = gate.read(&borrow(slf)?.inner, request)? else {
        return Ok((empty()?, 0, 0, connector.then_some(false)));
    };
    let rid_obj = request_id(request)?;
    let rid = rid_obj.to_str()?;
    let num_tokens = crate::convert::request_num_tokens(request)?;
    let max_hit = gate.bound(num_tokens, limit, max_hit);
    let (hit, boundary) = {
        let mut this = borrow_mut(slf)?;
        // A second live request with a held id, or a held one renamed:
        // refused before its hashes reach the core.
        this.checked_slot(request, &rid_obj)?;
        if this.inner.enable_caching() {
            crate::hash_size::check(request, this.inner.pool().hash_block_size())?;
        }
        let update = this.pending_hashes(request, rid)?;
        // Read before the core changes (its hashes are stored below).
        let preempted = if this.inner.counts_lookups() {
            count_obj(
                "request.num_preemptions",
                &req_attr(request, intern!(py, "num_preemptions"))?,
            )? > 0
        } else {
            false
        };
        let hit = guard(|| {
            if num_tokens == 0 {
                return Err(CoreError::InvalidArgument(format!(
                    "request {rid:?} has no tokens"
                )));
            }
            if let Some(u) = update {
                this.inner.sync_update(rid, u)?;
            }
            if connector {
                if let Some(per_group) = this
                    .inner
                    .find_cache_hit_for_connector(rid, num_tokens, max_hit)?
                {
                    return Ok((per_group.0, Some(per_group.1)));
                }
            }
            Ok((this.inner.find_cache_hit(rid, num_tokens, max_hit)?, None))
        })?;
        let (hit, diverged) = hit;
        if diverged.is_some() {
            // Per-group lookups report no uncached shared prefix.
            drop(this);
            return Ok((
                NativeManager::make_blocks(slf, &hit.blocks)?,
                hit.len,
                0,
                diverged,
            ));
        }
        if this.inner.counts_lookups() {
            this.inner.record_lookup(num_tokens, hit.len, preempted);
        }
        // vLLM's junction: where the longest single-type hit ends, when
        // it passes the hit (a sparse-retention group lags it); else 0.
        let boundary = if hit.longest > hit.len {
            hit.longest
        } else {
            0
        };
        (hit, boundary)
    };
    Ok((
        NativeManager::make_blocks(slf, &hit.blocks)?,
        hit.len,
        boundary,
        None,
    ))
}

/// vLLM's `coordinator.find_longest_cache_hit_per_group`: each
/// group's own hit over `block_hashes` (a list of bytes), not reconciled
/// with the others: (KVCacheBlocks, hit tokens per group).
pub(crate) fn per_group_hits<'py>(
    slf: &Bound<'py, NativeManager>,
    block_hashes: &Bound<'py, PyAny>,
    max_cache_hit_length: &Bound<'py, PyAny>,
) -> PyResult<(PyObject, Vec<usize>)> {
    let max_hit = count_obj("max_cache_hit_length", max_cache_hit_length)?;
    let hashes = hash_update(block_hashes, 0)?.unwrap_or_default().hashes;
    let (blocks, lens) = {
        let this = borrow(slf)?;
        guard(|| this.inner.find_cache_hit_per_group(&hashes, max_hit))?
    };
    Ok((NativeManager::make_blocks(slf, &blocks)?, lens))
}

#[pymethods]
impl NativeManager {
    /// vLLM's `get_computed_blocks(request)`: the longest prefix-cache hit
    /// as (KVCacheBlocks, hit tokens); the request's new hashes are stored
    /// first, and the lookup is counted for prefix-cache stats.
    /// `max_cache_hit_length` (profiles with `lookup_hit_cap_arg`): the
    /// most hit tokens; default
    /// `request.num_tokens - 1`.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn get_computed_blocks<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(PyObject, usize)> {
        let _in_call = crate::call_guard::enter(slf, "get_computed_blocks")?;
        let (blocks, hit, _) = computed_blocks(slf, request, max_cache_hit_length)?;
        Ok((blocks, hit))
    }

    /// vLLM's `get_computed_blocks`: (KVCacheBlocks, hit tokens,
    /// shared_prefix_boundary), the boundary where the longest hit one
    /// attention type found ends when it passes the hit, else 0.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn _get_computed_blocks_with_boundary<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(PyObject, usize, usize)> {
        let _in_call = crate::call_guard::enter(slf, "get_computed_blocks")?;
        computed_blocks(slf, request, max_cache_hit_length)
    }

    /// vLLM's `find_longest_cache_hit_per_group` (hybrid coordinators):
    /// (KVCacheBlocks, hit tokens per group).
    fn _find_longest_cache_hit_per_group<'py>(
        slf: &Bound<'py, Self>,
        block_hashes: &Bound<'py, PyAny>,
        max_cache_hit_length: &Bound<'py, PyAny>,
    ) -> PyResult<(PyObject, Vec<usize>)> {
        let _in_call = crate::call_guard::enter(slf, "find_longest_cache_hit_per_group")?;
        per_group_hits(slf, block_hashes, max_cache_hit_length)
    }

    /// vLLM's `get_computed_blocks_for_connector` core: (KVCacheBlocks,
    /// hit tokens, shared_prefix_boundary, hit_diverged), hit_diverged None
    /// where the reconciled lookup (`_get_computed_blocks_with_boundary`) answered.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn _get_computed_blocks_for_connector<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(PyObject, usize, usize, Option<bool>)> {
        let _in_call = crate::call_guard::enter(slf, "get_computed_blocks_for_connector")?;
        lookup(slf, request, max_cache_hit_length, true)
    }
}

//! Which request attribute decides whether a lookup reads the prefix cache
//! and how far a hit may reach, a release's choice made at construction
//! (the release table's `read_gate`), and the side-effect-free probe of the
//! prefix cache. A `#[pymethods]` block of its own.
//!
//! - `skip_reading_prefix_cache` (a bool; until vLLM 0.33.0): true skips
//!   the lookup; the bound is the caller's, else `num_tokens - 1`.
//! - `prefix_cache_hit_limit` (an int or None; vLLM 0.34.0): 0 skips the
//!   lookup; a hit reaches at most `min(num_tokens - 1, limit, caller's
//!   bound)`, None being no limit.

use hybridcache_core::KvCacheManager;
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;

use crate::convert::{count_obj, guard, hash_update, req_attr, request_num_tokens};
use crate::native_manager::NativeManager;

#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) enum ReadGate {
    /// `request.skip_reading_prefix_cache`.
    #[default]
    SkipFlag,
    /// `request.prefix_cache_hit_limit`.
    HitLimit,
}

impl ReadGate {
    /// The request attribute each gate reads.
    const NAMES: [(&'static str, ReadGate); 2] = [
        ("skip_reading_prefix_cache", ReadGate::SkipFlag),
        ("prefix_cache_hit_limit", ReadGate::HitLimit),
    ];

    /// None: no lookup (caching off, or the request skips it); else
    /// `Some(limit)`, the request's own hit limit (None: unbounded).
    pub(crate) fn read(
        self,
        inner: &KvCacheManager,
        request: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Option<usize>>> {
        let py = request.py();
        let mut limit = None;
        let reads = inner.reads_prefix_cache(|| -> PyResult<bool> {
            match self {
                ReadGate::SkipFlag => {
                    req_attr(request, intern!(py, "skip_reading_prefix_cache"))?.is_truthy()
                }
                ReadGate::HitLimit => {
                    let v = req_attr(request, intern!(py, "prefix_cache_hit_limit"))?;
                    if !v.is_none() {
                        limit = Some(count_obj("request.prefix_cache_hit_limit", &v)?);
                    }
                    Ok(limit == Some(0))
                }
            }
        })?;
        Ok(reads.then_some(limit))
    }

    /// The most hit tokens of a lookup of `num_tokens` tokens: the
    /// caller's bound `max_hit` as it is (None: the core's `num_tokens - 1`)
    /// under `SkipFlag`; under `HitLimit` the least of `num_tokens - 1`, the
    /// request's `limit` and `max_hit` (vLLM 0.34.0's
    /// `Request.get_max_cache_hit_length`).
    pub(crate) fn bound(
        self,
        num_tokens: usize,
        limit: Option<usize>,
        max_hit: Option<usize>,
    ) -> Option<usize> {
        match self {
            ReadGate::SkipFlag => max_hit,
            ReadGate::HitLimit => Some(
                [limit, max_hit]
                    .into_iter()
                    .flatten()
                    .fold(num_tokens.saturating_sub(1), usize::min),
            ),
        }
    }
}

#[pymethods]
impl NativeManager {
    /// Chooses the request attribute lookups read (`ReadGate::NAMES`):
    /// "skip_reading_prefix_cache" (the default) or "prefix_cache_hit_limit".
    fn _set_read_gate(&mut self, attribute: &str) -> PyResult<()> {
        let found = ReadGate::NAMES.iter().find(|(name, _)| *name == attribute);
        let Some((_, gate)) = found else {
            let names: Vec<_> = ReadGate::NAMES.iter().map(|(n, _)| *n).collect();
            return Err(PyValueError::new_err(format!(
                "unknown read gate {attribute:?}; choose from {}",
                names.join(", ")
            )));
        };
        self.read_gate = *gate;
        Ok(())
    }

    /// The request attribute lookups read.
    #[getter]
    fn _read_gate(&self) -> &'static str {
        ReadGate::NAMES
            .iter()
            .find(|(_, g)| *g == self.read_gate)
            .map_or("", |(n, _)| *n)
    }

    /// vLLM 0.34.0's `get_num_cached_tokens(request)`: how many of the
    /// request's tokens the prefix cache holds, bounded by
    /// `request.num_tokens - 1` (not by its hit limit); 0 where the lookup
    /// is off for it. Takes no reference, touches no block, emits no event,
    /// records no stat and does not register the request.
    fn _num_cached_tokens(&self, request: &Bound<'_, PyAny>) -> PyResult<usize> {
        if self.read_gate.read(&self.inner, request)?.is_none() {
            return Ok(0);
        }
        let num_tokens = request_num_tokens(request)?;
        let hashes = req_attr(request, intern!(request.py(), "block_hashes"))?;
        let hashes = hash_update(&hashes, 0)?.unwrap_or_default().hashes;
        guard(|| Ok(self.inner.probe_cache_hit(&hashes, num_tokens)))
    }
}

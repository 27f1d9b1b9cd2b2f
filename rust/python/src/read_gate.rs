//! Which request attribute decides whether a lookup reads the prefix cache
//! and how far a hit may reach, a release's choice made at construction
//! (the release table's `read_gate`; `read_gate_methods` sets it on a
//! manager).
//!
//! - `skip_reading_prefix_cache` (a bool; the table's default
//!   `read_gate`): true skips the lookup; the bound is the caller's, else
//!   `num_tokens - 1`.
//! - `prefix_cache_hit_limit` (an int or None; newer releases): 0 skips the
//!   lookup; a hit reaches at most `min(num_tokens - 1, limit, caller's
//!   bound)`, None being no limit.

use hybridcache_core::KvCacheManager;
use pyo3::intern;
use pyo3::prelude::*;

use crate::convert::{count_obj, req_attr};

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
    pub(crate) const NAMES: [(&'static str, ReadGate); 2] = [
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
    /// request's `limit` and `max_hit` (vLLM's
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

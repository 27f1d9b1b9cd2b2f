//! Prefix-cache stats: which lookups are counted (the profile's
//! `StatsPolicy`) and the counters vLLM's `PrefixCacheStats` reports.

use super::KvCacheManager;
use crate::profile::StatsPolicy;

/// Prefix-cache lookup counters (vLLM's `PrefixCacheStats` fields).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupStats {
    /// `reset_prefix_cache` succeeded since the last take.
    pub reset: bool,
    pub requests: u64,
    pub queries: u64,
    pub hits: u64,
    pub preempted_requests: u64,
    pub preempted_queries: u64,
    pub preempted_hits: u64,
}

impl LookupStats {
    pub fn record(&mut self, num_tokens: usize, num_hits: usize, preempted: bool) {
        let (requests, queries, hits) = if preempted {
            (
                &mut self.preempted_requests,
                &mut self.preempted_queries,
                &mut self.preempted_hits,
            )
        } else {
            (&mut self.requests, &mut self.queries, &mut self.hits)
        };
        *requests += 1;
        *queries += num_tokens as u64;
        *hits += num_hits as u64;
    }
}

impl KvCacheManager {
    /// Turns lookup counting on or off (vLLM's `log_stats`).
    pub fn set_log_stats(&mut self, on: bool) {
        self.log_stats = on;
    }

    /// Whether lookups are counted: callers read what `record_lookup`
    /// needs (the request's preemption count) only then.
    pub fn counts_lookups(&self) -> bool {
        self.log_stats
            && match self.profile.stats {
                StatsPolicy::CountedInLookup => true,
                StatsPolicy::RecordedByScheduler => false,
            }
    }

    /// Whether `get_computed_blocks` looks the request up at all: prefix
    /// caching is on and the request does not skip reading the cache
    /// (`skip_reading_prefix_cache` is asked only with caching on, as vLLM
    /// reads it). Otherwise the answer is no hit, and nothing is counted.
    pub fn reads_prefix_cache<E>(
        &self,
        skip_reading_prefix_cache: impl FnOnce() -> Result<bool, E>,
    ) -> Result<bool, E> {
        Ok(self.enable_caching && !skip_reading_prefix_cache()?)
    }

    /// Counts one lookup of `num_tokens` tokens that hit `num_hits`
    /// (a no-op unless `counts_lookups`).
    pub fn record_lookup(&mut self, num_tokens: usize, num_hits: usize, preempted: bool) {
        if self.counts_lookups() {
            self.stats.record(num_tokens, num_hits, preempted);
        }
    }

    /// The lookup counters so far (a snapshot).
    pub fn stats(&self) -> LookupStats {
        self.stats
    }

    pub fn reset_prefix_cache(&mut self) -> bool {
        let ok = self.coord.pool.reset_prefix_cache();
        self.stats.reset |= ok;
        ok
    }

    /// The lookup counters, reset to zero.
    pub fn take_stats(&mut self) -> LookupStats {
        std::mem::take(&mut self.stats)
    }
}

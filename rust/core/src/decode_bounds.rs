//! The token counts a plain decode is sized by, and the bounds within which
//! such a decode changes no block (a request's decode horizon).

/// Largest counts for which a plain decode of a request changes no block
/// (see `SingleTypeManager::decode_horizon`); `usize::MAX`: no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeHorizon {
    /// Computed tokens (after the max_model_len cap).
    pub max_total: usize,
    /// Tokens that need a slot (with lookahead, capped).
    pub max_need_slot: usize,
    /// Computed + new tokens (Mamba align sizes by this).
    pub max_main: usize,
    /// Tokens to cache (only bounds calls that cache).
    pub max_to_cache: usize,
    /// Fewest tokens to cache (only bounds calls that cache): below it a
    /// Mamba align group may key its prompt state without a full block.
    pub min_to_cache: usize,
}

impl DecodeHorizon {
    /// Not known (to be recomputed). As bounds it admits no decode: every
    /// decode needs a slot for at least one token.
    pub const UNKNOWN: DecodeHorizon = DecodeHorizon {
        max_total: 0,
        max_need_slot: 0,
        max_main: 0,
        max_to_cache: 0,
        min_to_cache: 0,
    };

    pub const UNBOUNDED: DecodeHorizon = DecodeHorizon {
        max_total: usize::MAX,
        max_need_slot: usize::MAX,
        max_main: usize::MAX,
        max_to_cache: usize::MAX,
        min_to_cache: 0,
    };

    pub fn min(self, o: DecodeHorizon) -> DecodeHorizon {
        DecodeHorizon {
            max_total: self.max_total.min(o.max_total),
            max_need_slot: self.max_need_slot.min(o.max_need_slot),
            max_main: self.max_main.min(o.max_main),
            max_to_cache: self.max_to_cache.min(o.max_to_cache),
            min_to_cache: self.min_to_cache.max(o.min_to_cache),
        }
    }

    /// The phases of a plain decode whose bound these counts cross: each
    /// bound stands for one phase in every group (`decode_horizon`), so a
    /// phase within its bound changes nothing and can be left out.
    pub fn crossed(&self, c: &DecodeCounts) -> DecodePhases {
        DecodePhases {
            frees: c.total_computed > self.max_total,
            allocation: c.need_slot > self.max_need_slot || c.main_model > self.max_main,
            caching: c
                .to_cache
                .is_some_and(|t| t > self.max_to_cache || t < self.min_to_cache),
        }
    }

    /// Whether a plain decode with these counts changes no block: it
    /// crosses no phase's bound.
    pub fn allows(&self, c: &DecodeCounts) -> bool {
        self.crossed(c) == DecodePhases::NONE
    }
}

/// Which phases of a plain decode run: the window and Mamba state frees,
/// the allocation, the caching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePhases {
    pub frees: bool,
    pub allocation: bool,
    pub caching: bool,
}

impl DecodePhases {
    /// No phase (a decode that changes no block).
    pub const NONE: DecodePhases = DecodePhases {
        frees: false,
        allocation: false,
        caching: false,
    };

    /// Every phase (a request without a known horizon).
    pub const ALL: DecodePhases = DecodePhases {
        frees: true,
        allocation: true,
        caching: true,
    };
}

/// The token counts a plain decode step is sized by (as `allocate_slots`
/// derives them from its arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeCounts {
    /// Computed tokens, capped at max_model_len.
    pub total_computed: usize,
    /// Tokens that need a slot: computed + new + lookahead, capped.
    pub need_slot: usize,
    /// Computed + new tokens (Mamba align sizes by this).
    pub main_model: usize,
    /// Tokens to cache; None when the call caches nothing.
    pub to_cache: Option<usize>,
}

/// The largest t with `tokens_to_cache(t) < limit` for an EAGLE group of a
/// hybrid coordinator (`coordinator::tokens_to_cache`), where that is `min(t, t / sbs * sbs + bs)` (0 below
/// one sbs). It is non-decreasing in t, so the bound is exact: every
/// sbs-segment whose start a has `a + bs < limit` is within it, and past
/// the last such segment the value is t itself.
pub(crate) fn eagle_max_to_cache(limit: usize, sbs: usize, bs: usize) -> usize {
    let last_whole = if limit > sbs + bs {
        (limit - bs - 1) / sbs
    } else {
        0
    };
    ((last_whole + 1) * sbs - 1).max(limit - 1)
}

#[cfg(test)]
mod tests {
    use super::{eagle_max_to_cache, DecodeCounts, DecodeHorizon, DecodePhases};

    /// A decode the horizon allows crosses no phase's bound, and one it does
    /// not allow crosses at least one (the phases split `allows` exactly).
    #[test]
    fn phases_split_allows() {
        let none = DecodePhases::NONE;
        let h = DecodeHorizon {
            max_total: 10,
            max_need_slot: 12,
            max_main: 11,
            max_to_cache: 9,
            min_to_cache: 4,
        };
        for total in 8..13 {
            for extra in 0..4 {
                for to_cache in [None, Some(2), Some(4), Some(9), Some(10)] {
                    let c = DecodeCounts {
                        total_computed: total,
                        need_slot: total + extra,
                        main_model: total + extra.min(1),
                        to_cache,
                    };
                    let p = h.crossed(&c);
                    assert_eq!(h.allows(&c), p == none, "{c:?}: {p:?}");
                    assert_eq!(p.frees, total > 10);
                    assert_eq!(p.allocation, c.need_slot > 12 || c.main_model > 11);
                    assert_eq!(p.caching, to_cache.is_some_and(|t| !(4..=9).contains(&t)));
                }
            }
        }
        assert_eq!(
            DecodeHorizon::UNKNOWN.crossed(&DecodeCounts {
                total_computed: 1,
                need_slot: 2,
                main_model: 2,
                to_cache: Some(1),
            }),
            DecodePhases::ALL
        );
    }

    /// The closed form against a scan of `min(t, t / sbs * sbs + bs)`.
    #[test]
    fn eagle_bound_is_the_last_t_below_the_limit() {
        for sbs in [1usize, 4, 16, 32] {
            for bs in [1usize, 4, 16, 32, 64] {
                for limit in 1..300usize {
                    let cached = |t: usize| {
                        let a = t / sbs * sbs;
                        if a > 0 {
                            t.min(a + bs)
                        } else {
                            0
                        }
                    };
                    let want = (0..2000).take_while(|&t| cached(t) < limit).last().unwrap();
                    assert!((want + 1..2000).all(|t| cached(t) >= limit), "not monotone");
                    assert_eq!(
                        eagle_max_to_cache(limit, sbs, bs),
                        want,
                        "sbs {sbs} bs {bs} limit {limit}"
                    );
                }
            }
        }
    }
}

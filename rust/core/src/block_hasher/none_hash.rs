//! The parent hash of a request's first block, vLLM's `NONE_HASH`: what a
//! release derives it from (`init_none_hash`). The facade computes the
//! bytes (`hybridcache.hashing.none_hash_for`); under vLLM the engine's own
//! value is read.

use super::HashFn;
use crate::profile::NoneHashMode;

/// vLLM's `DEFAULT_NONE_HASH_SEED`.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// What a release derives `NONE_HASH` from (`init_none_hash`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoneHashSeed<'a> {
    /// `NONE_HASH = hash_fn(seed)`.
    Seed(&'a str),
    /// `NONE_HASH = hash_fn(os.urandom(32).hex())`.
    RandomHexSeed,
    /// `NONE_HASH = os.urandom(32)` (no hashing).
    RandomBytes,
}

/// The seed rule of `mode` for `hash_fn`, given `$PYTHONHASHSEED`.
pub fn none_hash_seed(
    mode: NoneHashMode,
    hash_fn: HashFn,
    pythonhashseed: Option<&str>,
) -> NoneHashSeed<'_> {
    if let Some(seed) = pythonhashseed {
        return NoneHashSeed::Seed(seed);
    }
    match mode {
        NoneHashMode::SeededOrRandom => NoneHashSeed::RandomBytes,
        // A predictable seed would let an attacker precompute collisions of
        // a non-cryptographic hash; SHA-256's resistance does not need one.
        NoneHashMode::SeededOrDefault => match hash_fn {
            HashFn::Sha256 | HashFn::Sha256Cbor => NoneHashSeed::Seed(DEFAULT_NONE_HASH_SEED),
            HashFn::Xxhash | HashFn::XxhashCbor => NoneHashSeed::RandomHexSeed,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_hash_seeds_by_release() {
        use crate::profile::NoneHashMode::*;
        for f in [
            HashFn::Sha256,
            HashFn::Sha256Cbor,
            HashFn::Xxhash,
            HashFn::XxhashCbor,
        ] {
            assert_eq!(
                none_hash_seed(SeededOrRandom, f, Some("7")),
                NoneHashSeed::Seed("7")
            );
            assert_eq!(
                none_hash_seed(SeededOrDefault, f, Some("")),
                NoneHashSeed::Seed("")
            );
            assert_eq!(
                none_hash_seed(SeededOrRandom, f, None),
                NoneHashSeed::RandomBytes
            );
        }
        assert_eq!(
            none_hash_seed(SeededOrDefault, HashFn::Sha256Cbor, None),
            NoneHashSeed::Seed("vllm-none-hash")
        );
        assert_eq!(
            none_hash_seed(SeededOrDefault, HashFn::Xxhash, None),
            NoneHashSeed::RandomHexSeed
        );
    }
}

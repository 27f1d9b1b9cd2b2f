//! Request block hashing, bit-identical to vLLM's in each supported
//! release (the release's rules: `profile::Hashing`; what differs is the extra keys'
//! form, the NONE_HASH seed, lookahead hashes and where a resumed
//! multimodal scan starts, each in its own function below).
//!
//! vLLM hashes each full block of a request as
//! `hash_fn((parent_hash or NONE_HASH, tuple(block_token_ids), extra_keys))`
//! (`vllm/v1/core/kv_cache_utils.py: hash_block_tokens`), where `hash_fn` is
//! one of `vllm/utils/hashing.py`'s:
//!
//! | name          | serialization                         | digest                        |
//! |---------------|---------------------------------------|-------------------------------|
//! | `sha256_cbor` | `cbor2.dumps(x, canonical=True)`      | SHA-256, 32 bytes             |
//! | `xxhash_cbor` | `cbor2.dumps(x, canonical=True)`      | XXH3-128, 16 bytes big-endian |
//! | `sha256`      | `pickle.dumps(x, protocol=5)`         | SHA-256, 32 bytes             |
//! | `xxhash`      | `pickle.dumps(x, protocol=5)`         | XXH3-128, 16 bytes big-endian |
//!
//! This module serializes exactly the value shapes vLLM hashes — a bytes
//! parent, a tuple of ints, and extra keys that are `None` or a tuple of
//! str / bytes / int / bool / None / nested tuples — byte for byte as `cbor2`
//! (canonical) and CPython's C pickler (protocol 5) do, then digests them.
//!
//! Pickle is defined by object identity as well as value (an object seen
//! twice is written as a memo reference), and splits its output into frames
//! once a frame reaches 64 KiB. Keys carry values only, so the pickle
//! encoder assumes every str/bytes/tuple is a distinct object (the caller
//! checks that), and returns [`BlockHashError::PickleTooLarge`] for a block
//! whose pickle would not fit one frame; the caller then pickles in Python.
//! CBOR has neither caveat.

use std::fmt;

use sha2::{Digest as _, Sha256};
use xxhash_rust::xxh3::xxh3_128;

/// vLLM's hash functions, by their `--prefix-caching-hash-algo` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashFn {
    Sha256,
    Sha256Cbor,
    Xxhash,
    XxhashCbor,
}

/// How a hash function serializes its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// `cbor2.dumps(x, canonical=True)`
    Cbor,
    /// `pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)` (protocol 5)
    Pickle,
}

impl HashFn {
    /// Every supported name, as `get_hash_fn_by_name` spells it.
    pub const NAMES: [&'static str; 4] = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"];

    pub fn from_name(name: &str) -> Result<Self, BlockHashError> {
        match name {
            "sha256" => Ok(Self::Sha256),
            "sha256_cbor" => Ok(Self::Sha256Cbor),
            "xxhash" => Ok(Self::Xxhash),
            "xxhash_cbor" => Ok(Self::XxhashCbor),
            _ => Err(BlockHashError::UnknownHashFn(name.to_owned())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha256Cbor => "sha256_cbor",
            Self::Xxhash => "xxhash",
            Self::XxhashCbor => "xxhash_cbor",
        }
    }

    pub fn encoding(self) -> Encoding {
        match self {
            Self::Sha256Cbor | Self::XxhashCbor => Encoding::Cbor,
            Self::Sha256 | Self::Xxhash => Encoding::Pickle,
        }
    }

    /// Length of a digest in bytes: 32 (SHA-256) or 16 (XXH3-128).
    pub fn digest_len(self) -> usize {
        match self {
            Self::Sha256 | Self::Sha256Cbor => 32,
            Self::Xxhash | Self::XxhashCbor => 16,
        }
    }

    /// Digest of already serialized bytes: `hashlib.sha256(data).digest()`
    /// or `xxhash.xxh3_128_digest(data)` (canonical, big-endian).
    pub fn digest(self, data: &[u8]) -> Digest {
        let mut buf = [0u8; 32];
        match self {
            Self::Sha256 | Self::Sha256Cbor => {
                buf.copy_from_slice(&Sha256::digest(data));
                Digest { buf, len: 32 }
            }
            Self::Xxhash | Self::XxhashCbor => {
                buf[..16].copy_from_slice(&xxh3_128(data).to_be_bytes());
                Digest { buf, len: 16 }
            }
        }
    }

    /// Serializes `(parent, tuple(tokens), extra)` as this function does.
    /// `extra` of `None` is Python's `None`; `Some(keys)` is `tuple(keys)`.
    pub fn encode_block(
        self,
        out: &mut Vec<u8>,
        parent: &[u8],
        tokens: &[i64],
        extra: Option<&[Key]>,
    ) -> Result<(), BlockHashError> {
        match self.encoding() {
            Encoding::Cbor => {
                cbor::block(out, parent, tokens, extra);
                Ok(())
            }
            Encoding::Pickle => pickle::block(out, parent, tokens, extra),
        }
    }
}

/// A digest: 32 (SHA-256) or 16 (XXH3-128) bytes, without allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    buf: [u8; 32],
    len: u8,
}

impl Digest {
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

impl AsRef<[u8]> for Digest {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// One element of a block's extra keys (vLLM: LoRA name, `(mm identifier,
/// offset)`, cache salt, prompt-embeds digest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    None,
    Bool(bool),
    /// Python int; CBOR writes those outside ±2^64 as bignums (tags 2/3).
    Int(i128),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Key>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockHashError {
    /// Not one of [`HashFn::NAMES`].
    UnknownHashFn(String),
    ZeroBlockSize,
    /// The block's pickle would span more than one 64 KiB frame (size given).
    PickleTooLarge(usize),
    /// `extra_keys_per_block` does not have one entry per hashed block.
    ExtraKeysLength {
        expected: usize,
        got: usize,
    },
}

impl fmt::Display for BlockHashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownHashFn(name) => write!(
                f,
                "unsupported hash function {name:?}: expected one of {}",
                HashFn::NAMES.join(", ")
            ),
            Self::ZeroBlockSize => write!(f, "block_size must be > 0"),
            Self::PickleTooLarge(n) => {
                write!(
                    f,
                    "a block's pickle of {n} bytes spans several pickle frames"
                )
            }
            Self::ExtraKeysLength { expected, got } => write!(
                f,
                "extra_keys_per_block has {got} entries for {expected} blocks to hash"
            ),
        }
    }
}

impl std::error::Error for BlockHashError {}

/// Hashes the full blocks of a token sequence as vLLM's
/// `get_request_block_hasher(block_size, hash_fn)` does, given `NONE_HASH`.
#[derive(Clone, Debug)]
pub struct BlockHasher {
    hash_fn: HashFn,
    block_size: usize,
    none_hash: Vec<u8>,
}

impl BlockHasher {
    pub fn new(
        hash_fn: HashFn,
        block_size: usize,
        none_hash: &[u8],
    ) -> Result<Self, BlockHashError> {
        if block_size == 0 {
            return Err(BlockHashError::ZeroBlockSize);
        }
        Ok(Self {
            hash_fn,
            block_size,
            none_hash: none_hash.to_vec(),
        })
    }

    pub fn hash_fn(&self) -> HashFn {
        self.hash_fn
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn none_hash(&self) -> &[u8] {
        &self.none_hash
    }

    /// vLLM's `if not parent_block_hash: parent_block_hash = NONE_HASH`.
    pub fn resolve_parent<'a>(&'a self, parent: Option<&'a [u8]>) -> &'a [u8] {
        match parent {
            Some(p) if !p.is_empty() => p,
            _ => &self.none_hash,
        }
    }

    /// `hash_block_tokens(hash_fn, parent, tokens, extra)`; `buf` is scratch.
    pub fn hash_block_into(
        &self,
        buf: &mut Vec<u8>,
        parent: Option<&[u8]>,
        tokens: &[i64],
        extra: Option<&[Key]>,
    ) -> Result<Digest, BlockHashError> {
        buf.clear();
        self.hash_fn
            .encode_block(buf, self.resolve_parent(parent), tokens, extra)?;
        Ok(self.hash_fn.digest(buf))
    }

    pub fn hash_block(
        &self,
        parent: Option<&[u8]>,
        tokens: &[i64],
        extra: Option<&[Key]>,
    ) -> Result<Digest, BlockHashError> {
        self.hash_block_into(
            &mut Vec::with_capacity(64 + 5 * tokens.len()),
            parent,
            tokens,
            extra,
        )
    }

    /// Number of full blocks of `num_tokens` tokens from block `start_block` on.
    pub fn num_new_blocks(&self, num_tokens: usize, start_block: usize) -> usize {
        (num_tokens / self.block_size).saturating_sub(start_block)
    }

    /// Hashes of the full blocks of `tokens` from block `start_block` on,
    /// chained from `parent` (the hash of block `start_block - 1`, or None).
    /// `extra[i]` holds the extra keys of the i-th hashed block.
    pub fn hash_blocks(
        &self,
        tokens: &[i64],
        parent: Option<&[u8]>,
        start_block: usize,
        extra: Option<&[Option<Vec<Key>>]>,
    ) -> Result<Vec<Digest>, BlockHashError> {
        let n = self.num_new_blocks(tokens.len(), start_block);
        if let Some(e) = extra {
            if e.len() != n {
                return Err(BlockHashError::ExtraKeysLength {
                    expected: n,
                    got: e.len(),
                });
            }
        }
        let mut out: Vec<Digest> = Vec::with_capacity(n);
        let mut buf = Vec::with_capacity(64 + 5 * self.block_size);
        for i in 0..n {
            let start = (start_block + i) * self.block_size;
            let keys = extra.and_then(|e| e[i].as_deref());
            let prev = match out.last() {
                Some(d) => Some(d.as_bytes()),
                None => parent,
            };
            let d = self.hash_block_into(
                &mut buf,
                prev,
                &tokens[start..start + self.block_size],
                keys,
            )?;
            out.push(d);
        }
        Ok(out)
    }
}

pub mod cbor;
mod extra_keys;
mod mm_window;
mod none_hash;
pub mod pickle;

pub use extra_keys::{extra_keys, hashable_tokens, lookahead_key, KeyBuilder};
pub use mm_window::{lookahead_rewind, resume_index};
pub use none_hash::{none_hash_seed, NoneHashSeed, DEFAULT_NONE_HASH_SEED};

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn n32() -> Vec<u8> {
        (0u8..32).collect()
    }

    /// The third case of `expected` below, as Python values:
    /// tokens (0, 23, 24, 255, 256, 65535, 65536, 2**31-1, 2**31, 2**32,
    /// 2**63-1, -1, -24, -25, -256, -257, -2**31, -2**31-1, -2**63) and extra
    /// ("x"*300, ("mm", -3), b"\xff"*40, None, True, False, (), 2**64,
    /// -2**64, -2**64-1, 2**100, -2**100).
    fn edge_case() -> (Vec<i64>, Vec<Key>) {
        let tokens = vec![
            0,
            23,
            24,
            255,
            256,
            65535,
            65536,
            (1 << 31) - 1,
            1 << 31,
            1 << 32,
            i64::MAX,
            -1,
            -24,
            -25,
            -256,
            -257,
            -(1 << 31),
            -(1 << 31) - 1,
            i64::MIN,
        ];
        let extra = vec![
            Key::Str("x".repeat(300)),
            Key::Tuple(vec![Key::Str("mm".into()), Key::Int(-3)]),
            Key::Bytes(vec![0xff; 40]),
            Key::None,
            Key::Bool(true),
            Key::Bool(false),
            Key::Tuple(vec![]),
            Key::Int(1 << 64),
            Key::Int(-(1 << 64)),
            Key::Int(-(1 << 64) - 1),
            Key::Int(1 << 100),
            Key::Int(-(1 << 100)),
        ];
        (tokens, extra)
    }

    /// Digests printed by Python 3.11 with cbor2 6.3 and xxhash 4.1:
    /// sha256(cbor), xxh3_128(cbor), sha256(pickle), xxh3_128(pickle).
    #[test]
    fn known_answers_match_python() {
        let (edge_tokens, edge_extra) = edge_case();
        type Case = (Vec<i64>, Option<Vec<Key>>, [&'static str; 4]);
        let cases: Vec<Case> = vec![
            (
                vec![1, 2, 3],
                None,
                [
                    "fccdb4c6d4b7e81553546614b047df4a3d4172d78bc8a79941391c2dae5aeb0d",
                    "f27a876667648ab1d8b157d55e51724c",
                    "7d7faf41fed165be38697385219c20dff66ae76570ab46e5457904dcbd938768",
                    "835ad6409fb4422885f7fa0e0f8e3211",
                ],
            ),
            (
                (0..16).collect(),
                Some(vec![Key::Str("lora".into())]),
                [
                    "ebc55749854b061806a9389d7e12e988ce65b213389b6e233268884a12fb4a4c",
                    "3daaa6ce7ca4ececbf7e6b486812cc6d",
                    "9ec5afc05a31d66dfd875617c66ac0585feebcb525af509914b340fcb11e4e04",
                    "173f1a4fa5c9070a3e49ce2b7cc2119f",
                ],
            ),
            (
                edge_tokens,
                Some(edge_extra),
                [
                    "5ee188db1ea26920b43c2f47926f9f6f6895f9c98bb313168bd4065f4ebf1aac",
                    "926d7c95966116d7c2d11be8560a0cec",
                    "073ce56d855088f9b4020e86021610505a0d9a35c487df5799340d231b7c419f",
                    "f53c2985c02134ec481e350cb6da6daa",
                ],
            ),
        ];
        let fns = [
            HashFn::Sha256Cbor,
            HashFn::XxhashCbor,
            HashFn::Sha256,
            HashFn::Xxhash,
        ];
        for (tokens, extra, want) in &cases {
            for (f, w) in fns.iter().zip(want) {
                let h = BlockHasher::new(*f, 1, &[0xaa; 32]).unwrap();
                let d = h
                    .hash_block(Some(&n32()), tokens, extra.as_deref())
                    .unwrap();
                assert_eq!(hex(d.as_bytes()), *w, "{f:?} {tokens:?}");
            }
        }
    }

    #[test]
    fn encodings_match_python_bytes() {
        let mut out = Vec::new();
        cbor::block(&mut out, &n32(), &[1, 2, 3], None);
        assert_eq!(
            hex(&out),
            "835820000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f83010203f6"
        );
        out.clear();
        pickle::block(&mut out, &n32(), &[1, 2, 3], None).unwrap();
        assert_eq!(
            hex(&out),
            "8005952f000000000000004320000102030405060708090a0b0c0d0e0f101112131415161718\
             191a1b1c1d1e1f944b014b024b0387944e87942e"
        );
        // cbor2.dumps((b'', (), None), canonical=True)
        out.clear();
        cbor::block(&mut out, b"", &[], None);
        assert_eq!(hex(&out), "834080f6");
        // cbor2: 2**64 -> c2 49 01 00*8; -2**64-1 -> c3 49 01 00*8; -2**64 -> 3b ff*8
        for (v, want) in [
            (1i128 << 64, "c249010000000000000000"),
            (-(1i128 << 64) - 1, "c349010000000000000000"),
            (-(1i128 << 64), "3bffffffffffffffff"),
        ] {
            out.clear();
            cbor::int(&mut out, v);
            assert_eq!(hex(&out), want);
        }
    }

    #[test]
    fn pickle_long1_matches_encode_long() {
        // pickle.dumps(v, 5)[11:-1] per value (after PROTO+FRAME, before STOP).
        for (v, want) in [
            (1i128 << 31, "8a050000008000"),
            (1i128 << 40, "8a06000000000001"),
            (-(1i128 << 31) - 1, "8a05ffffff7fff"),
            (i64::MIN as i128, "8a080000000000000080"),
            (-(1i128 << 63) - 1, "8a09ffffffffffffff7fff"),
            (i128::MIN, "8a1000000000000000000000000000000080"),
            (i128::MAX, "8a10ffffffffffffffffffffffffffffff7f"),
        ] {
            let mut out = Vec::new();
            pickle::int(&mut out, v);
            assert_eq!(hex(&out), want, "{v}");
        }
    }

    #[test]
    fn parent_none_or_empty_uses_none_hash() {
        let h = BlockHasher::new(HashFn::Sha256Cbor, 2, &[7; 32]).unwrap();
        let a = h.hash_block(None, &[1, 2], None).unwrap();
        assert_eq!(a, h.hash_block(Some(b""), &[1, 2], None).unwrap());
        assert_eq!(a, h.hash_block(Some(&[7; 32]), &[1, 2], None).unwrap());
        assert_ne!(a, h.hash_block(Some(&[8; 32]), &[1, 2], None).unwrap());
    }

    #[test]
    fn hash_blocks_chains_and_checks_extra_len() {
        for f in [
            HashFn::Sha256Cbor,
            HashFn::XxhashCbor,
            HashFn::Sha256,
            HashFn::Xxhash,
        ] {
            let h = BlockHasher::new(f, 4, &[1; 32]).unwrap();
            let tokens: Vec<i64> = (0..18).collect(); // 4 full blocks, 2 left over
            let all = h.hash_blocks(&tokens, None, 0, None).unwrap();
            assert_eq!(all.len(), 4);
            assert!(all.iter().all(|d| d.as_bytes().len() == f.digest_len()));
            let mut parent: Option<&[u8]> = None;
            for (i, d) in all.iter().enumerate() {
                assert_eq!(
                    *d,
                    h.hash_block(parent, &tokens[4 * i..4 * i + 4], None)
                        .unwrap()
                );
                parent = Some(d.as_bytes());
            }
            let tail = h
                .hash_blocks(&tokens, Some(all[1].as_bytes()), 2, None)
                .unwrap();
            assert_eq!(tail, all[2..]);
            let extra = vec![None, Some(vec![Key::Str("s".into())])];
            let with = h
                .hash_blocks(&tokens, Some(all[1].as_bytes()), 2, Some(&extra))
                .unwrap();
            assert_eq!(with[0], all[2]);
            assert_ne!(with[1], all[3]);
            assert_eq!(
                h.hash_blocks(&tokens, None, 0, Some(&extra)),
                Err(BlockHashError::ExtraKeysLength {
                    expected: 4,
                    got: 2
                })
            );
            assert!(h.hash_blocks(&tokens, None, 9, None).unwrap().is_empty());
        }
    }

    #[test]
    fn names_and_errors() {
        for name in HashFn::NAMES {
            assert_eq!(HashFn::from_name(name).unwrap().name(), name);
        }
        let e = HashFn::from_name("md5").unwrap_err();
        assert!(e.to_string().contains("sha256_cbor"), "{e}");
        assert_eq!(
            BlockHasher::new(HashFn::Sha256, 0, b"").unwrap_err(),
            BlockHashError::ZeroBlockSize
        );
    }

    #[test]
    fn oversized_pickle_is_refused_not_misencoded() {
        let h = BlockHasher::new(HashFn::Sha256, 20_000, &[1; 32]).unwrap();
        let tokens = vec![70_000i64; 20_000]; // 5 bytes each: > 64 KiB
        assert!(matches!(
            h.hash_block(None, &tokens, None),
            Err(BlockHashError::PickleTooLarge(_))
        ));
        // CBOR has no frames.
        let h = BlockHasher::new(HashFn::Sha256Cbor, 20_000, &[1; 32]).unwrap();
        assert!(h.hash_block(None, &tokens, None).is_ok());
    }
}

//! CPython's C pickler, protocol 5, for the shapes above, with no object
//! seen twice and everything in one frame.
use super::{BlockHashError, Key};

const MARK: u8 = b'(';
const STOP: u8 = b'.';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const NONE: u8 = b'N';
const BINUNICODE: u8 = b'X';
const TUPLE: u8 = b't';
const EMPTY_TUPLE: u8 = b')';
const BINBYTES: u8 = b'B';
const SHORT_BINBYTES: u8 = b'C';
const PROTO: u8 = 0x80;
const TUPLE1: u8 = 0x85;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const LONG1: u8 = 0x8a;
const SHORT_BINUNICODE: u8 = 0x8c;
const MEMOIZE: u8 = 0x94;
const FRAME: u8 = 0x95;
/// The pickler closes a frame at an opcode boundary once it holds this much.
pub const FRAME_SIZE_TARGET: usize = 64 * 1024;
const HEADER: usize = 2 + 9; // PROTO 5, FRAME u64

#[inline]
pub fn int64(out: &mut Vec<u8>, v: i64) {
    if (0..=0xff).contains(&v) {
        out.extend_from_slice(&[BININT1, v as u8]);
    } else if (0..=0xffff).contains(&v) {
        out.push(BININT2);
        out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if (i32::MIN as i64..=i32::MAX as i64).contains(&v) {
        out.push(BININT);
        out.extend_from_slice(&(v as i32).to_le_bytes());
    } else {
        long1(out, v as i128);
    }
}

pub fn int(out: &mut Vec<u8>, v: i128) {
    match i64::try_from(v) {
        Ok(v) => int64(out, v),
        Err(_) => long1(out, v),
    }
}

/// LONG1 over `pickle.encode_long(v)`: little-endian two's complement in
/// `bit_length // 8 + 1` bytes, less a redundant 0xff sign byte.
fn long1(out: &mut Vec<u8>, v: i128) {
    let bit_length = 128 - v.unsigned_abs().leading_zeros() as usize;
    let mut n = (bit_length >> 3) + 1; // <= 17
    let mut le = [if v < 0 { 0xff } else { 0 }; 17];
    le[..16].copy_from_slice(&v.to_le_bytes());
    if v < 0 && n > 1 && le[n - 1] == 0xff && le[n - 2] & 0x80 != 0 {
        n -= 1;
    }
    out.extend_from_slice(&[LONG1, n as u8]);
    out.extend_from_slice(&le[..n]);
}

pub fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Longer ones (>= 64 KiB) never fit one frame: see `block`.
    if b.len() <= 0xff {
        out.extend_from_slice(&[SHORT_BINBYTES, b.len() as u8]);
    } else {
        out.push(BINBYTES);
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(b);
    out.push(MEMOIZE);
}

fn str_(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    if b.len() <= 0xff {
        out.extend_from_slice(&[SHORT_BINUNICODE, b.len() as u8]);
    } else {
        out.push(BINUNICODE);
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(b);
    out.push(MEMOIZE);
}

/// `save_tuple`: EMPTY_TUPLE (not memoized); TUPLE1..3 for up to three
/// items; MARK .. TUPLE beyond; then MEMOIZE.
fn tuple_with(out: &mut Vec<u8>, n: usize, items: impl FnOnce(&mut Vec<u8>)) {
    if n == 0 {
        out.push(EMPTY_TUPLE);
        return;
    }
    if n > 3 {
        out.push(MARK);
    }
    items(out);
    out.push(if n > 3 { TUPLE } else { TUPLE1 + (n as u8 - 1) });
    out.push(MEMOIZE);
}

pub fn key(out: &mut Vec<u8>, k: &Key) {
    match k {
        Key::None => out.push(NONE),
        Key::Bool(b) => out.push(if *b { NEWTRUE } else { NEWFALSE }),
        Key::Int(v) => int(out, *v),
        Key::Str(s) => str_(out, s),
        Key::Bytes(b) => bytes(out, b),
        Key::Tuple(items) => tuple_with(out, items.len(), |o| items.iter().for_each(|k| key(o, k))),
    }
}

pub fn block(
    out: &mut Vec<u8>,
    parent: &[u8],
    tokens: &[i64],
    extra: Option<&[Key]>,
) -> Result<(), BlockHashError> {
    let base = out.len();
    out.extend_from_slice(&[PROTO, 5, FRAME]);
    out.extend_from_slice(&[0; 8]);
    tuple_with(out, 3, |o| {
        bytes(o, parent);
        tuple_with(o, tokens.len(), |o| {
            tokens.iter().for_each(|&t| int64(o, t))
        });
        match extra {
            None => o.push(NONE),
            Some(keys) => tuple_with(o, keys.len(), |o| keys.iter().for_each(|k| key(o, k))),
        }
    });
    out.push(STOP);
    // Below the target at the end means below it at every boundary, so
    // the pickler never split the frame (frames under 4 bytes lose their
    // header, but ours hold at least 8).
    let frame_len = out.len() - base - HEADER;
    if frame_len >= FRAME_SIZE_TARGET {
        return Err(BlockHashError::PickleTooLarge(frame_len + HEADER));
    }
    out[base + 3..base + HEADER].copy_from_slice(&(frame_len as u64).to_le_bytes());
    Ok(())
}

//! `cbor2.dumps(x, canonical=True)` for the shapes above. Canonical only
//! changes maps, sets and floats, none of which occur here.
use super::Key;

fn head(out: &mut Vec<u8>, major: u8, v: u64) {
    let m = major << 5;
    if v < 24 {
        out.push(m | v as u8);
    } else if v <= 0xff {
        out.extend_from_slice(&[m | 24, v as u8]);
    } else if v <= 0xffff {
        out.push(m | 25);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= 0xffff_ffff {
        out.push(m | 26);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

#[inline]
pub fn int64(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        head(out, 0, v as u64);
    } else {
        head(out, 1, !v as u64); // -1 - v
    }
}

pub fn int(out: &mut Vec<u8>, v: i128) {
    // Major 0 holds 0..2^64, major 1 holds -2^64..0 as (-1 - v); beyond,
    // cbor2 writes tag 2 / 3 over the minimal big-endian bytes.
    let (major, tag, n) = if v >= 0 {
        (0, 0xc2, v as u128)
    } else {
        (1, 0xc3, !v as u128)
    };
    if n <= u64::MAX as u128 {
        head(out, major, n as u64);
    } else {
        let be = n.to_be_bytes();
        let skip = (n.leading_zeros() / 8) as usize;
        out.push(tag);
        bytes(out, &be[skip..]);
    }
}

pub fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    head(out, 2, b.len() as u64);
    out.extend_from_slice(b);
}

pub fn key(out: &mut Vec<u8>, k: &Key) {
    match k {
        Key::None => out.push(0xf6),
        Key::Bool(b) => out.push(if *b { 0xf5 } else { 0xf4 }),
        Key::Int(v) => int(out, *v),
        Key::Str(s) => {
            head(out, 3, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
        Key::Bytes(b) => bytes(out, b),
        Key::Tuple(items) => tuple(out, items),
    }
}

pub fn tuple(out: &mut Vec<u8>, items: &[Key]) {
    head(out, 4, items.len() as u64);
    for k in items {
        key(out, k);
    }
}

pub fn block(out: &mut Vec<u8>, parent: &[u8], tokens: &[i64], extra: Option<&[Key]>) {
    out.push(0x83);
    bytes(out, parent);
    head(out, 4, tokens.len() as u64);
    for &t in tokens {
        int64(out, t);
    }
    match extra {
        None => out.push(0xf6),
        Some(keys) => tuple(out, keys),
    }
}

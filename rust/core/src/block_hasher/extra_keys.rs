//! The extra keys of a block's hash: the one place that says which of a
//! request's properties enter a block's key, in which order, on which
//! blocks and in which form (vLLM's `generate_block_hash_extra_keys`; tagged
//! keys add lookahead keys, `get_request_block_hasher`). Callers read the
//! properties (the binding from a request object, the facade's own
//! `Request`) and pass them in; `K` is their value type (a Python object
//! in the binding, a [`super::Key`] in tests).

use crate::profile::ExtraKeyMode;

/// Builds the values keys are made of (`Key` is a Python object in the
/// binding, a [`super::Key`] in tests).
pub trait KeyBuilder {
    type Key;
    type Error;
    /// Python's `tuple(items)`.
    fn tuple(&self, items: Vec<Self::Key>) -> Result<Self::Key, Self::Error>;
    /// A tag, as vLLM's string literal (an interned str in Python: the same
    /// object as vLLM's, which pickle's memo sees).
    fn tag(&self, tag: &'static str) -> Self::Key;
    /// Python's `None`.
    fn none(&self) -> Self::Key;
}

/// Appends the extra keys of the block starting at token `start` to `out`
/// (nothing appended: the block has none, vLLM's `None`). `lora` (name,
/// path; the path is read only where `ExtraKeyMode::reads_lora_path`, else
/// any value) and `cache_salt` are given only where the request has them
/// (truthy); `mm` are the block's multimodal `(identifier, offset)` pairs
/// and `prompt_embeds` its prompt-embeds digest, if any.
#[allow(clippy::too_many_arguments)]
pub fn extra_keys<B: KeyBuilder>(
    b: &B,
    mode: ExtraKeyMode,
    start: usize,
    lora: Option<(B::Key, B::Key)>,
    mm: impl IntoIterator<Item = (B::Key, B::Key)>,
    cache_salt: Option<B::Key>,
    prompt_embeds: impl IntoIterator<Item = B::Key>,
    out: &mut Vec<B::Key>,
) -> Result<(), B::Error> {
    // The salt separates caches: on the first block, which every later
    // block's hash chains from.
    let cache_salt = if start == 0 { cache_salt } else { None };
    match mode {
        ExtraKeyMode::Plain => {
            out.extend(lora.map(|(name, _)| name));
            for (id, off) in mm {
                out.push(b.tuple(vec![id, off])?);
            }
            out.extend(cache_salt);
            out.extend(prompt_embeds);
        }
        ExtraKeyMode::Tagged => {
            let tagged = |tag, v: Vec<B::Key>| {
                let mut items = Vec::with_capacity(v.len() + 1);
                items.push(b.tag(tag));
                items.extend(v);
                b.tuple(items)
            };
            if let Some((name, path)) = lora {
                out.push(tagged("lora", vec![name, path])?);
            }
            for (id, off) in mm {
                out.push(tagged("mm", vec![id, off])?);
            }
            if let Some(s) = cache_salt {
                out.push(tagged("cache_salt", vec![s])?);
            }
            for d in prompt_embeds {
                out.push(tagged("prompt_embeds", vec![d])?);
            }
        }
    }
    Ok(())
}

/// A lookahead block's key (`num_hash_lookahead_tokens` L > 0):
/// `(E, *next_tokens)`, where `E` is the tuple of the keys of the block's
/// window (the block and its L next tokens), or None without keys, and
/// `next_tokens` the L tokens after the block. The block's own tokens stay
/// the hashed tokens.
pub fn lookahead_key<B: KeyBuilder>(
    b: &B,
    window_keys: Option<B::Key>,
    next_tokens: impl IntoIterator<Item = B::Key>,
) -> Result<B::Key, B::Error> {
    let mut items = vec![window_keys.unwrap_or_else(|| b.none())];
    items.extend(next_tokens);
    b.tuple(items)
}

/// Tokens whose full blocks may be hashed: a lookahead hash waits for its
/// L next tokens (vLLM: `request.num_tokens - num_hash_lookahead_tokens`).
pub fn hashable_tokens(num_tokens: usize, lookahead: usize) -> usize {
    num_tokens.saturating_sub(lookahead)
}

#[cfg(test)]
mod tests {
    use super::super::Key;
    use super::*;

    struct Keys;

    impl KeyBuilder for Keys {
        type Key = Key;
        type Error = ();
        fn tuple(&self, items: Vec<Key>) -> Result<Key, ()> {
            Ok(Key::Tuple(items))
        }
        fn tag(&self, tag: &'static str) -> Key {
            Key::Str(tag.into())
        }
        fn none(&self) -> Key {
            Key::None
        }
    }

    fn s(v: &str) -> Key {
        Key::Str(v.into())
    }

    fn keys(mode: ExtraKeyMode, start: usize) -> Vec<Key> {
        let mut out = Vec::new();
        extra_keys(
            &Keys,
            mode,
            start,
            Some((s("name"), s("/path"))),
            [(s("img"), Key::Int(-3))],
            Some(s("salt")),
            [Key::Bytes(vec![1])],
            &mut out,
        )
        .unwrap();
        out
    }

    #[test]
    fn plain_order_and_first_block_salt() {
        let mm = Key::Tuple(vec![s("img"), Key::Int(-3)]);
        let d = Key::Bytes(vec![1]);
        assert_eq!(
            keys(ExtraKeyMode::Plain, 0),
            [s("name"), mm.clone(), s("salt"), d.clone()]
        );
        assert_eq!(keys(ExtraKeyMode::Plain, 16), [s("name"), mm, d]);
        let mut none: Vec<Key> = Vec::new();
        extra_keys(&Keys, ExtraKeyMode::Plain, 0, None, [], None, [], &mut none).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn tagged_keys_name_their_source() {
        let t = |v: Vec<Key>| Key::Tuple(v);
        let lora = t(vec![s("lora"), s("name"), s("/path")]);
        let mm = t(vec![s("mm"), s("img"), Key::Int(-3)]);
        let d = t(vec![s("prompt_embeds"), Key::Bytes(vec![1])]);
        assert_eq!(
            keys(ExtraKeyMode::Tagged, 0),
            [
                lora.clone(),
                mm.clone(),
                t(vec![s("cache_salt"), s("salt")]),
                d.clone()
            ]
        );
        assert_eq!(keys(ExtraKeyMode::Tagged, 16), [lora, mm, d]);
    }

    #[test]
    fn lookahead_keys_wrap_the_window_keys() {
        assert_eq!(
            lookahead_key(&Keys, None, [Key::Int(7)]).unwrap(),
            Key::Tuple(vec![Key::None, Key::Int(7)])
        );
        let e = Key::Tuple(vec![s("x")]);
        assert_eq!(
            lookahead_key(&Keys, Some(e.clone()), [Key::Int(1), Key::Int(2)]).unwrap(),
            Key::Tuple(vec![e, Key::Int(1), Key::Int(2)])
        );
        assert_eq!(hashable_tokens(10, 3), 7);
        assert_eq!(hashable_tokens(2, 3), 0);
    }
}

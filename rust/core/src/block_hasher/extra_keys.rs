//! The extra keys of a block's hash: the one place that says which of a
//! request's properties enter a block's key, in which order, and on which
//! blocks (vLLM 0.23.0's `generate_block_hash_extra_keys`). Callers read
//! the properties (the binding from a request object, the facade's own
//! `Request`) and pass them in.

use crate::profile::ExtraKeyMode;

/// Appends the extra keys of the block starting at token `start` to `out`
/// (nothing appended: the block has none, vLLM's `None`). `lora_name` and
/// `cache_salt` are given only where the request has them (truthy);
/// `mm` are the block's multimodal `(identifier, offset)` keys and
/// `prompt_embeds` its prompt-embeds digest, if any.
pub fn extra_keys<K>(
    mode: ExtraKeyMode,
    start: usize,
    lora_name: Option<K>,
    mm: impl IntoIterator<Item = K>,
    cache_salt: Option<K>,
    prompt_embeds: impl IntoIterator<Item = K>,
    out: &mut Vec<K>,
) {
    match mode {
        ExtraKeyMode::Plain => {
            out.extend(lora_name);
            out.extend(mm);
            // The salt separates caches: on the first block, which every
            // later block's hash chains from.
            if start == 0 {
                out.extend(cache_salt);
            }
            out.extend(prompt_embeds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_first_block_salt() {
        let keys = |start| {
            let mut out = Vec::new();
            extra_keys(
                ExtraKeyMode::Plain,
                start,
                Some("lora"),
                ["mm"],
                Some("salt"),
                ["embeds"],
                &mut out,
            );
            out
        };
        assert_eq!(keys(0), ["lora", "mm", "salt", "embeds"]);
        assert_eq!(keys(16), ["lora", "mm", "embeds"]);
        let mut none: Vec<&str> = Vec::new();
        extra_keys(ExtraKeyMode::Plain, 0, None, [], None, [], &mut none);
        assert!(none.is_empty());
    }
}

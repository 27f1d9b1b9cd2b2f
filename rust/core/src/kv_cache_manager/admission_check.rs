//! The checks of an admission (`allocate_slots` with computed blocks,
//! external or encoder tokens, or any call off the no-op decode path) and
//! of the configuration: every count is bounded before anything is sized
//! from it, and computed blocks must be this request's own cache hits.
//! They read only: an `Err` leaves the manager exactly as it was. The
//! no-op decode (most decode steps) sizes nothing and never gets here.

use super::{AllocateArgs, KvCacheManager, ManagerConfig};
use crate::attention::Attention;
use crate::block_pool::NULL_BLOCK;
use crate::coordinator::Coordinator;
use crate::error::{invalid, CoreResult};
use crate::hashes::{HashList, HashUpdate};
use crate::profile::BlockHashView;
use crate::{BlockId, ReqSlot};

/// The most blocks a pool may have: its bookkeeping (about 24 bytes a
/// block) is sized from `num_blocks` up front, so a count no GPU holds
/// (a 141 GB GPU holds a few million blocks of the smallest models) must
/// be refused before it is allocated, not abort the process.
pub const MAX_NUM_BLOCKS: u32 = 1 << 27;

/// The configuration's counts that the constructor's other checks leave
/// open.
pub(crate) fn check_config(cfg: &ManagerConfig) -> CoreResult<()> {
    if cfg.num_blocks > MAX_NUM_BLOCKS {
        return invalid(format!(
            "num_blocks must be <= {MAX_NUM_BLOCKS}, got {}",
            cfg.num_blocks
        ));
    }
    Ok(())
}

/// The counts of one `allocate_slots` call, before anything is sized from
/// them. vLLM clamps `num_lookahead_tokens` (with the rest) to
/// `max_model_len` before it sizes anything, and so does the core: it is
/// not bounded here. The others vLLM sizes tables from unclamped (Mamba
/// align and sliding-window tables, where vLLM runs out of memory), or, for
/// a request longer than `max_model_len`, fails with an IndexError while
/// caching: each is at most `max_model_len`, which vLLM's scheduler never
/// exceeds (it caps `num_new_tokens` at `max_model_len - 1 -
/// num_computed_tokens` and stops a request at `max_model_len`).
#[inline]
pub(crate) fn check_counts(
    m: &KvCacheManager,
    slot: Option<ReqSlot>,
    request_id: &str,
    args: &AllocateArgs,
) -> CoreResult<()> {
    // One test on the decode path; the rest is worked out out of line.
    let worst = args
        .num_tokens
        .max(args.num_computed_tokens)
        .max(args.num_new_tokens)
        .max(args.num_new_computed_tokens)
        .max(args.num_external_computed_tokens);
    let no_tokens = no_tokens(m, args);
    if no_tokens || worst > m.max_model_len {
        return count_error(m, request_id, args);
    }
    if m.sizes_from_computed {
        return check_computed_held(m, slot, request_id, args);
    }
    Ok(())
}

/// A call that would compute and adopt nothing. `adopt_only_steps` also lets a step
/// adopt only prefix-cache hits (an async load, a chunk ending inside a
/// replayed hit).
#[inline]
fn no_tokens(m: &KvCacheManager, args: &AllocateArgs) -> bool {
    args.num_new_tokens == 0
        && args.num_external_computed_tokens == 0
        && (!m.profile.adopt_only_steps || args.num_new_computed_tokens == 0)
}

#[cold]
#[inline(never)]
fn count_error(m: &KvCacheManager, request_id: &str, args: &AllocateArgs) -> CoreResult<()> {
    let max = m.max_model_len;
    if no_tokens(m, args) {
        // vLLM's own checks and messages.
        return invalid(if !m.profile.adopt_only_steps {
            "num_new_tokens must be greater than 0 when there are no external computed tokens"
        } else {
            "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
        });
    }
    if args.num_tokens > max {
        return invalid(format!(
            "request {request_id:?}: request.num_tokens is {}, more than max_model_len ({max})",
            args.num_tokens
        ));
    }
    let bounded = [
        ("request.num_computed_tokens", args.num_computed_tokens),
        ("num_new_tokens", args.num_new_tokens),
        ("num_new_computed_tokens", args.num_new_computed_tokens),
        (
            "num_external_computed_tokens",
            args.num_external_computed_tokens,
        ),
    ];
    let (name, v) = bounded
        .into_iter()
        .find(|&(_, v)| v > max)
        .expect("one is past the bound");
    invalid(format!(
        "request {request_id:?}: {name} must be <= max_model_len ({max}), got {v}"
    ))
}

/// Groups whose block count skips the blocks before the computed tokens'
/// window (sliding window, chunked local, Mamba outside align mode):
/// `get_num_blocks_to_allocate` counts those as held, so a request whose
/// table does not reach its computed tokens is counted short (vLLM runs
/// out of pool blocks in mid-allocation then). Full attention and Mamba
/// align count what they allocate; cross-attention tables hold encoder
/// tokens.
fn skips_to_computed(attn: &Attention) -> bool {
    attn.has_window() && attn.align().is_none()
}

/// Whether any group of `coord` is one `skips_to_computed`.
pub(crate) fn sizes_from_computed(coord: &Coordinator) -> bool {
    coord.managers.iter().any(|m| skips_to_computed(&m.attn))
}

/// The request's computed tokens lie in its blocks, in every group that
/// `skips_to_computed` (null-padded tables cover skipped blocks), as for
/// any request vLLM's scheduler allocates.
#[inline(never)]
fn check_computed_held(
    m: &KvCacheManager,
    slot: Option<ReqSlot>,
    request_id: &str,
    args: &AllocateArgs,
) -> CoreResult<()> {
    if args.num_computed_tokens == 0 {
        return Ok(());
    }
    for sm in &m.coord.managers {
        if !skips_to_computed(&sm.attn) {
            continue;
        }
        let held = slot.map_or(0, |s| sm.blocks(s).len()) * sm.block_size as usize;
        if args.num_computed_tokens > held {
            return not_held(request_id, args.num_computed_tokens, sm.group_id, held);
        }
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn not_held(request_id: &str, computed: usize, group: u32, held: usize) -> CoreResult<()> {
    invalid(format!(
        "request {request_id:?}: request.num_computed_tokens is {computed}, but its blocks in group \
         {group} hold {held} tokens"
    ))
}

/// What an admission adds, against the request: the computed tokens stay
/// within its tokens, and `new_computed_blocks` (group count and ids
/// checked already) are its own cache hits: they cover
/// `num_new_computed_tokens` tokens, and each block is in the
/// prefix cache under this request's hash at its position and in its
/// group (a null block only where the group skips blocks: sliding window,
/// chunked local, Mamba). `update`: the request's hashes that arrive with
/// this call. (Encoder tokens are not bounded by `max_model_len`: an
/// encoder's input may be longer; they size nothing before the free-block
/// test.)
pub(crate) fn check_computed_blocks(
    m: &KvCacheManager,
    slot: Option<ReqSlot>,
    request_id: &str,
    args: &AllocateArgs,
    update: Option<&HashUpdate>,
) -> CoreResult<()> {
    if args.new_computed_blocks.is_none()
        && args.num_new_computed_tokens == 0
        && args.num_external_computed_tokens == 0
    {
        return Ok(()); // a decode adds nothing
    }
    let adds_computed = args.new_computed_blocks.is_some() || args.num_external_computed_tokens > 0;
    let computed =
        args.num_computed_tokens + args.num_new_computed_tokens + args.num_external_computed_tokens;
    if adds_computed && computed > args.num_tokens {
        return invalid(format!(
            "request {request_id:?}: num_computed_tokens ({}) + num_new_computed_tokens ({}) \
             + num_external_computed_tokens ({}) is {computed}, past the request's {} tokens",
            args.num_computed_tokens,
            args.num_new_computed_tokens,
            args.num_external_computed_tokens,
            args.num_tokens
        ));
    }
    let Some(nc) = args.new_computed_blocks else {
        if args.num_new_computed_tokens > 0 {
            return invalid(format!(
                "request {request_id:?}: num_new_computed_tokens is {} but new_computed_blocks holds no blocks",
                args.num_new_computed_tokens
            ));
        }
        return Ok(());
    };
    let empty = HashList::new();
    let known = slot.map_or(&empty, |s| m.reqs.hashes(s));
    let hashes = RequestHashes { known, update };
    let pool = &m.coord.pool;
    let hash_block_size = pool.hash_block_size() as usize;
    // A group's hit may be shorter than the hit (vLLM's EAGLE drop of the
    // last block), never longer nor off its block boundary, and some group
    // covers the whole hit.
    let mut covered = 0;
    let n = args.num_new_computed_tokens;
    for (g, (sm, blocks)) in m.coord.managers.iter().zip(nc).enumerate() {
        let bs = sm.block_size as usize;
        let tokens = blocks.len() * bs;
        // Partial hash hits (partial-block-hits) may end inside a group's last block.
        let inside = m.coord.partial_hash_hits() && n > 0 && tokens > n && tokens - n < bs;
        covered = covered.max(tokens.min(n));
        let unit = if m.coord.partial_hash_hits() {
            hash_block_size
        } else {
            bs
        };
        let off_boundary = !n.is_multiple_of(unit);
        if (tokens > n && !inside) || off_boundary {
            return invalid(format!(
                "request {request_id:?}: new_computed_blocks group {g} holds {} blocks of {bs} tokens, \
                 which does not fit num_new_computed_tokens ({})",
                blocks.len(),
                args.num_new_computed_tokens
            ));
        }
        // Null blocks stand for blocks outside a window.
        let may_skip = sm.attn.has_window();
        let scale = (bs / hash_block_size).max(1);
        for (i, &b) in blocks.iter().enumerate() {
            if b == NULL_BLOCK {
                if may_skip {
                    continue;
                }
                return invalid(format!(
                    "new_computed_blocks: block 0 (group {g}, position {i}) is the null block, \
                     not a cache hit of request {request_id:?}"
                ));
            }
            // Under partial hash hits a group's last block may be keyed at
            // any hash boundary inside it: the hit's own, a later one of its
            // chain, or a lagging group's lower one (the connector's
            // per-group lookup keeps each group's own hit).
            if m.coord.partial_hash_hits() && scale > 1 && i + 1 == blocks.len() {
                let first = i * scale;
                check_partial_hit(m, &hashes, request_id, g, b, (first, first + scale - 1))?;
            } else {
                check_hit(m, &hashes, request_id, g, i, b, scale)?;
            }
        }
    }
    if covered != args.num_new_computed_tokens {
        return invalid(format!(
            "request {request_id:?}: new_computed_blocks cover {covered} tokens, \
             but num_new_computed_tokens is {}",
            args.num_new_computed_tokens
        ));
    }
    Ok(())
}

/// Block `b`, the last of group `g`'s partial hit, spanning the request's
/// hash blocks `first..=end`, is cached (under any of its keys) under one
/// of the request's hashes there.
fn check_partial_hit(
    m: &KvCacheManager,
    hashes: &RequestHashes<'_>,
    request_id: &str,
    g: usize,
    b: BlockId,
    (first, end): (usize, usize),
) -> CoreResult<()> {
    let group_id = m.coord.managers[g].group_id;
    let end = end.min(hashes.len().saturating_sub(1));
    let keyed = m.coord.pool.block_keys(b).any(|(key, group)| {
        group == group_id && (first..=end).any(|j| hashes.matches(key, j, 1) == Some(true))
    });
    if keyed {
        return Ok(());
    }
    invalid(format!(
        "new_computed_blocks: block {b} (group {g}, the partial hit's last block) is not cached \
         under any of request {request_id:?}'s hashes ending inside it"
    ))
}

/// Block `b` at position `i` of group `g` is cached under the request's
/// hash of that position.
fn check_hit(
    m: &KvCacheManager,
    hashes: &RequestHashes<'_>,
    request_id: &str,
    g: usize,
    i: usize,
    b: BlockId,
    scale: usize,
) -> CoreResult<()> {
    let what = || format!("new_computed_blocks: block {b} (group {g}, position {i})");
    let Some((key, group)) = m.coord.pool.block_hash(b) else {
        return invalid(format!(
            "{} is not in the prefix cache (freed and reused, or never cached): \
             not a cache hit of request {request_id:?}",
            what()
        ));
    };
    let group_id = m.coord.managers[g].group_id;
    if group != group_id {
        return invalid(format!(
            "{} is cached for group {group}, not group {group_id}",
            what()
        ));
    }
    // The hashes a block's key is made of (see `profile::BlockHashView`).
    let (from, n) = match m.coord.hash_view {
        BlockHashView::Concatenated => (i * scale, scale),
        BlockHashView::LastHashBlock => ((i + 1) * scale - 1, 1),
    };
    match hashes.matches(key, from, n) {
        Some(true) => Ok(()),
        Some(false) => invalid(format!(
            "{} is cached under another hash than request {request_id:?}'s at that position \
             (another request's block, or a stale one)",
            what()
        )),
        None => invalid(format!(
            "{}: request {request_id:?} has {} block hashes, too few to check it",
            what(),
            hashes.len()
        )),
    }
}

/// The request's hashes as they will be once `update` is applied.
struct RequestHashes<'a> {
    known: &'a HashList,
    update: Option<&'a HashUpdate>,
}

impl RequestHashes<'_> {
    fn len(&self) -> usize {
        match self.update {
            Some(u) => u.offset + u.hashes.len(),
            None => self.known.len(),
        }
    }

    fn get(&self, j: usize) -> Option<&[u8]> {
        match self.update {
            Some(u) if j >= u.offset => {
                (j - u.offset < u.hashes.len()).then(|| u.hashes.get(j - u.offset))
            }
            _ => (j < self.known.len()).then(|| self.known.get(j)),
        }
    }

    /// Whether `key` is the concatenation of hashes `from..from + n`
    /// (None: the request has fewer hashes).
    fn matches(&self, key: &[u8], from: usize, n: usize) -> Option<bool> {
        let mut rest = key;
        for j in from..from + n {
            let part = self.get(j)?;
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return Some(false),
            }
        }
        Some(rest.is_empty())
    }
}

/// `get_num_common_prefix_blocks` for an id the manager holds no record
/// of: vLLM's answer (its defaultdict's new, empty entry shares no block)
/// without a record here; the entry vLLM keeps is counted as a holder in
/// later answers, until the id is freed or gets a record.
pub(crate) fn ghost_entry(m: &mut KvCacheManager, request_id: &str) -> Vec<usize> {
    let n = m.num_groups();
    // Only groups whose tables share a prefix note such an entry.
    let full = m.coord.managers.iter().any(|g| g.attn.shares_prefix());
    if full && !m.ghost_entries.iter().any(|g| g == request_id) {
        m.ghost_entries.push(request_id.to_owned());
    }
    vec![0; n]
}

/// A new record for `request_id` takes over the entry vLLM made for it.
pub(crate) fn adopt_ghost_entry(m: &mut KvCacheManager, request_id: &str, slot: ReqSlot) {
    if m.ghost_entries.is_empty() {
        return;
    }
    let Some(i) = m.ghost_entries.iter().position(|g| g == request_id) else {
        return;
    };
    m.ghost_entries.swap_remove(i);
    for g in m.coord.managers.iter_mut() {
        g.note_common_prefix_entry(slot);
    }
}

/// A resend of a request's hashes (a shorter or rebuilt `block_hashes`:
/// `update` starts before the known ones end) must keep the hashes its
/// cached blocks are cached under: a different list under the same id
/// (another request reusing a live id) would leave those blocks cached
/// under hashes the request no longer has.
#[cold]
#[inline(never)]
pub(crate) fn check_resend(
    m: &KvCacheManager,
    slot: Option<ReqSlot>,
    request_id: &str,
    update: &HashUpdate,
) -> CoreResult<()> {
    let Some(s) = slot else {
        return Ok(());
    };
    let hash_block_size = m.coord.pool.hash_block_size() as usize;
    let cached = m
        .coord
        .managers
        .iter()
        .filter(|g| g.spec.prefix_cacheable)
        .map(|g| g.num_cached_blocks(s) * (g.block_size as usize / hash_block_size).max(1))
        .max()
        .unwrap_or(0);
    let known = m.reqs.hashes(s);
    for j in update.offset..cached {
        let i = j - update.offset;
        if i >= update.hashes.len() || update.hashes.get(i) != known.get(j) {
            return invalid(format!(
                "request {request_id:?}: request.block_hashes[{j}] is not the hash its cached block \
                 {j} was cached under (another request under a live request's id?)"
            ));
        }
    }
    Ok(())
}

//! The full consistency check of pool, tables and ref counts (tests and
//! the fuzzers call it after every operation).

use super::KvCacheManager;
use crate::error::{CoreError, CoreResult};
use crate::{BlockId, ReqSlot};

impl KvCacheManager {
    /// Full consistency check of pool, tables and ref counts.
    pub fn check_invariants(&self) -> CoreResult<()> {
        use crate::block_pool::NULL_BLOCK;
        use crate::hashes::ScaledHashes;
        use crate::spec::{MambaMode, SpecKind};
        let fail = |m: String| Err(CoreError::Invariant(m));
        if let Err(m) = self.coord.pool.check_invariants() {
            return fail(m);
        }
        if let Err(m) = self.reqs.check_invariants() {
            return fail(m);
        }
        let live = |s: ReqSlot| self.reqs.is_live(s);
        let pool = &self.coord.pool;
        let n = pool.num_blocks() as usize;
        let num_groups = self.coord.managers.len() as u32;
        let hbs = pool.hash_block_size();
        let mut holders = vec![0i64; n];
        let mut owner_group = vec![u32::MAX; n];
        let mut in_table = vec![u32::MAX; n];
        let mut stamp = 0u32;
        for m in &self.coord.managers {
            let g = m.group_id;
            let (align, num_spec) = match m.spec.kind {
                SpecKind::Mamba {
                    mode,
                    num_speculative_blocks,
                } => (mode == MambaMode::Align, num_speculative_blocks as usize),
                _ => (false, 0),
            };
            for (slot, table) in m.tables() {
                if !live(slot) {
                    return fail(format!("group {g} holds a table for a dead request slot"));
                }
                let num_cached = m.num_cached_blocks(slot);
                if num_cached > table.len() {
                    return fail(format!(
                        "group {g}: slot {slot} counts {num_cached} cached blocks but holds {}",
                        table.len()
                    ));
                }
                // Without caching, hash_block_size may exceed a group's block
                // size (scale 0); no block is cached then, so no hash is read.
                let scale = ((m.block_size / hbs) as usize).max(1);
                let hashes = ScaledHashes::viewed(self.hashes(slot), scale, self.coord.hash_view);
                stamp += 1;
                for (i, &b) in table.iter().enumerate() {
                    if b == NULL_BLOCK {
                        continue;
                    }
                    if b as usize >= n {
                        return fail(format!("group {g}: block id {b} out of range"));
                    }
                    if std::mem::replace(&mut in_table[b as usize], stamp) == stamp {
                        return fail(format!("block {b} is twice in one table of group {g}"));
                    }
                    if owner_group[b as usize] != u32::MAX && owner_group[b as usize] != g {
                        return fail(format!("block {b} is in two groups"));
                    }
                    owner_group[b as usize] = g;
                    holders[b as usize] += 1;
                    if let Some((h, hg)) = pool.block_hash(b) {
                        if hg != g {
                            return fail(format!(
                                "block {b} of group {g} is cached for group {hg}"
                            ));
                        }
                        // A cached position holds the request's own hash (align
                        // mode moves speculative blocks, so it is exempt): the
                        // block's, or a partial entry's at the boundary it
                        // covers (partial-block entries: a prompt tail, also on a block whose
                        // full hash was evicted).
                        let bs = m.block_size as usize;
                        let covers = pool.block_hash_num_tokens(b).unwrap_or(0) as usize;
                        let raw = hashes.raw();
                        let own = if covers != (i + 1) * bs
                            && covers > i * bs
                            && covers % hbs as usize == 0
                        {
                            let k = covers / hbs as usize;
                            k > raw.len() || raw.get(k - 1) == h
                        } else {
                            !(i < num_cached && i < hashes.len()) || *hashes.get(i) == *h
                        };
                        if !align && !own {
                            return fail(format!(
                                "group {g}: block {b} at position {i} is cached under another hash"
                            ));
                        }
                        // `estimate_cached_tokens` reads only the last cached block.
                        if !align && !(covers > i * bs && covers <= (i + 1) * bs) {
                            return fail(format!(
                                "group {g}: block {b} at position {i} covers {covers} tokens, \
                                 outside its own block"
                            ));
                        }
                    }
                }
            }
            if let Err(e) = m.check_records() {
                return fail(format!("group {g}: {e}"));
            }
            for (slot, has_table) in m.running_slots() {
                if !live(slot) || !has_table {
                    return fail(format!(
                        "group {g} counts cached blocks of slot {slot} without a table"
                    ));
                }
            }
            for (slot, a) in m.align_states() {
                if !align || !live(slot) {
                    return fail(format!("group {g} keeps Mamba align state of slot {slot}"));
                }
                let len = m.blocks(slot).len();
                if a.last_state_block_idx.is_some_and(|i| i >= len) {
                    return fail(format!(
                        "group {g}: last_state_block_idx {:?} beyond the table ({len} blocks)",
                        a.last_state_block_idx
                    ));
                }
                if a.allocated && len < 1 + num_spec {
                    return fail(format!(
                        "group {g}: allocated align state with {len} blocks < 1 + {num_spec}"
                    ));
                }
            }
        }
        // A queued copy holds one reference on each end until its take.
        for m in &self.coord.managers {
            for &(src, dst) in m.pending_cow_copies() {
                holders[src as usize] += 1;
                holders[dst as usize] += 1;
            }
        }
        for b in 1..n {
            holders[b] += i64::from(self.handed_out_refs(b as BlockId));
            let rc = i64::from(pool.ref_cnt(b as BlockId));
            if rc != holders[b] {
                return fail(format!(
                    "block {b} has ref_cnt {rc} but {} holders",
                    holders[b]
                ));
            }
            if let Some((_, hg)) = pool.block_hash(b as BlockId) {
                if hg >= num_groups {
                    return fail(format!(
                        "block {b} is cached for group {hg} of {num_groups}"
                    ));
                }
            }
        }
        Ok(())
    }
}

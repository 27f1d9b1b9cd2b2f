//! vLLM's Mamba align caching beyond the full blocks
//! (`MambaManager.cache_blocks` / `_cache_partial_tail_block`, for blocks
//! of one hash block each; wider ones: `mamba_partial.rs`): the prefill checkpoint block is keyed at its
//! checkpoint position, or evicted when that state is transient; the
//! prompt's last reusable boundary is cached even where sparse retention
//! skipped it; every state cached is queued as a boundary-state offload
//! (`take_pending_boundary_state_offloads`).

use super::{entry_key, SingleTypeManager};
use crate::attention::mamba::checkpoint_position;
use crate::attention::{ReplayTails, RetentionMarks};
use crate::block_pool::{BlockPool, NULL_BLOCK};
use crate::hashes::ScaledHashes;
use crate::{cdiv, BlockId, MambaCheckpoints, ReqSlot};

impl SingleTypeManager {
    /// Whether this group follows the partial-block-hits align caching rules.
    pub(crate) fn caches_align_states(&self) -> bool {
        self.enable_caching
            && self.is_mamba_align()
            && self.mamba_rules.caches_prefill_states()
            && self.spec.mamba_checkpoints.is_some()
    }

    /// Whether a rule of this group uses the request's shared-prefix
    /// junction: a prefill checkpoint's reuse (`checkpoint_is_reusable`;
    /// only specs with an alignment reserve checkpoints) or the
    /// shared-prefix checkpoint (`keys_prompt_state_at`).
    pub(crate) fn reads_junction(&self) -> bool {
        self.spec.mamba_checkpoints.is_some_and(|c| c.alignment > 0)
            || self.shared_prefix_checkpoint
    }

    /// Records the checkpoint of this count (vLLM's `_checkpoints`, set
    /// by every count outside the admission check): `on` for a chunk ending
    /// at `query_end` that reserves one.
    pub fn note_align_checkpoint(&mut self, slot: ReqSlot, on: bool, query_end: usize) {
        let Some(c) = self.spec.mamba_checkpoints else {
            return;
        };
        // Caching keys the state there; the facade's `_checkpoints` view reads it.
        let sbs = self.alignment_tokens as usize;
        let ckpt = on.then(|| {
            let position = checkpoint_position(&c, query_end, sbs);
            (position, cdiv(query_end, self.bs()) - 2)
        });
        // A request gets its align state on its first allocation.
        if let Some(a) = self
            .records
            .reqs
            .get_mut(slot as usize)
            .and_then(|r| r.align.as_mut())
        {
            a.checkpoint = ckpt;
        }
    }

    /// The hash block index ending at `tokens`, if the request has its hash.
    fn hash_index(&self, hashes: &ScaledHashes<'_>, tokens: usize) -> Option<usize> {
        let hbs = self.spec.mamba_checkpoints?.hash_block_size as usize;
        let j = (tokens / hbs).checked_sub(1)?;
        (tokens % hbs == 0 && j < hashes.len()).then_some(j)
    }

    /// Whether block `b` is cached under the hash ending at `tokens`
    /// (vLLM's `block_hash_num_tokens == tokens`).
    fn keyed_at(
        &self,
        pool: &BlockPool,
        b: BlockId,
        hashes: &ScaledHashes<'_>,
        tokens: usize,
    ) -> bool {
        let Some(j) = self.hash_index(hashes, tokens) else {
            return false;
        };
        pool.block_hash(b)
            .is_some_and(|(h, g)| g == self.group_id && h == &*hashes.get(j))
    }

    /// Keys `b` at `tokens` (dropping its old hash) and marks it cached
    /// this step.
    fn key_at(
        &mut self,
        pool: &mut BlockPool,
        b: BlockId,
        hashes: &ScaledHashes<'_>,
        tokens: usize,
    ) {
        let Some(j) = self.hash_index(hashes, tokens) else {
            return;
        };
        let entry = pool.recache_block(b, j, self.group_id, |i| hashes.get(i));
        self.cached_this_step
            .insert(entry_key((entry, self.group_id)));
    }

    /// Whether the checkpoint state at `position` stays reusable once
    /// cached: the prompt's own checkpoint, a block boundary sparse
    /// retention keeps, or the shared-prefix junction. Any other is a
    /// transient state the next one overwrites in its slot.
    pub(super) fn checkpoint_is_reusable(
        &self,
        c: &MambaCheckpoints,
        position: usize,
        prompt: usize,
        marks: &RetentionMarks,
    ) -> bool {
        let bs = self.bs();
        let is_prompt = position == checkpoint_position(c, prompt, self.alignment_tokens as usize);
        let retained = position % bs == 0
            && self
                .reachable
                .is_none_or(|r| r.keeps(position / bs - 1, &ReplayTails::default()));
        is_prompt || retained || position == marks.shared_prefix_boundary
    }

    /// Whether caching `num_tokens` (a hash boundary, no checkpoint this
    /// call) keys the running state there: the prompt's last reusable
    /// boundary or, with the shared-prefix checkpoint, the junction a
    /// sibling resumes at, while the prompt chunk reaching it is computed
    /// (during decode the running block changes in place, so its key
    /// would promise a state it holds only after that step's forward).
    pub(super) fn keys_prompt_state_at(
        &self,
        c: &MambaCheckpoints,
        num_tokens: usize,
        hash_block_size: usize,
        marks: &RetentionMarks,
    ) -> bool {
        let prompt = marks.num_prompt_tokens.unwrap_or(0);
        num_tokens == checkpoint_position(c, prompt, hash_block_size)
            || self.shared_prefix_checkpoint
                && num_tokens == marks.shared_prefix_boundary
                && marks.num_computed_tokens < num_tokens
                && num_tokens <= prompt
    }

    /// The fewest tokens to cache from which `keys_prompt_state_at` holds
    /// for no count (0: it never holds): the decode paths keep below it to
    /// the general path, where caching may key the prompt's state without
    /// caching a full block.
    pub(super) fn prompt_state_keys_below(&self, marks: &RetentionMarks) -> usize {
        let Some(c) = self
            .spec
            .mamba_checkpoints
            .filter(|_| self.caches_align_states())
        else {
            return 0;
        };
        let prompt = marks.num_prompt_tokens.unwrap_or(0);
        let at = checkpoint_position(&c, prompt, c.hash_block_size as usize);
        // The junction counts only inside the prompt (`num_tokens <= prompt`).
        let junction = if self.shared_prefix_checkpoint {
            marks.shared_prefix_boundary.min(prompt)
        } else {
            0
        };
        at.max(junction) + 1
    }

    /// After the full blocks `before..after` of `num_tokens` are cached:
    /// the checkpoint or prompt-boundary state, then the offloads.
    pub(super) fn cache_align_states(
        &mut self,
        pool: &mut BlockPool,
        slot: ReqSlot,
        hashes: &ScaledHashes<'_>,
        num_tokens: usize,
        marks: RetentionMarks,
        before: usize,
    ) {
        if self.scale > 1 {
            // States keyed inside their blocks (`mamba_partial.rs`).
            return self.cache_align_states_fine(pool, slot, hashes, num_tokens, marks, before);
        }
        let Some(c) = self.spec.mamba_checkpoints else {
            return;
        };
        let bs = self.bs();
        let hbs = c.hash_block_size as usize;
        let prompt = marks.num_prompt_tokens.unwrap_or(0);
        let blocks_len = self.blocks(slot).len();
        let block_at = |m: &Self, i: usize| m.blocks(slot).get(i).copied().unwrap_or(NULL_BLOCK);
        let mut keyed: Option<(usize, usize)> = None;
        if let Some((position, idx)) = self.align_state(slot).and_then(|a| a.checkpoint) {
            let b = block_at(self, idx);
            if !self.checkpoint_is_reusable(&c, position, prompt, &marks) {
                // A transient state overwrites this slot: not reusable.
                pool.evict_cached_block(b);
            } else if b != NULL_BLOCK && !self.keyed_at(pool, b, hashes, position) {
                self.key_at(pool, b, hashes, position);
            }
            keyed = Some((idx, position));
        } else if num_tokens > 0 && num_tokens % hbs == 0 {
            let idx = cdiv(num_tokens, bs) - 1;
            if idx < blocks_len && self.keys_prompt_state_at(&c, num_tokens, hbs, &marks) {
                let b = block_at(self, idx);
                if b != NULL_BLOCK && !self.keyed_at(pool, b, hashes, num_tokens) {
                    self.key_at(pool, b, hashes, num_tokens);
                }
            }
        }
        let after = self.num_cached_blocks(slot).min(blocks_len);
        for i in before.min(after)..after {
            let b = block_at(self, i);
            let Some(e) = pool.block_entry(b).filter(|_| b != NULL_BLOCK) else {
                continue;
            };
            // Hits on it wait for the next step (with the key it holds now).
            self.cached_this_step.insert(entry_key(e));
            let tokens = match keyed {
                Some((idx, position)) if idx == i && self.keyed_at(pool, b, hashes, position) => {
                    position
                }
                _ => (i + 1) * bs,
            };
            self.pending_offloads.push((slot, b, tokens));
        }
    }

    /// Drops a freed request's queued offloads (its blocks go back now).
    pub(super) fn drop_offloads(&mut self, slot: ReqSlot) {
        if !self.pending_offloads.is_empty() {
            self.pending_offloads.retain(|&(s, _, _)| s != slot);
        }
    }

    /// This step's boundary-state offloads, oldest first: (slot, block,
    /// boundary tokens).
    pub fn take_offloads(&mut self, out: &mut Vec<(ReqSlot, u32, BlockId, usize)>) {
        let g = self.group_id;
        out.extend(
            self.pending_offloads
                .drain(..)
                .map(|(s, b, t)| (s, g, b, t)),
        );
    }
}

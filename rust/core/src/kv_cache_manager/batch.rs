//! The batched decode step (`allocate_decode_batch`): every request is
//! checked first (nothing changes, so an error leaves the manager as it
//! was), then allocated in order. A decode that changes no block (most of
//! them) is judged from its request's hot line alone and costs a few
//! compares in each pass. The caller supplies the new block hashes of the
//! requests that fill a block (read from wherever it keeps them).

use super::{AllocateArgs, KvCacheManager};
use crate::error::CoreError;
use crate::events::PoolEvent;
use crate::hashes::HashUpdate;
use crate::new_blocks::NewBlocks;
use crate::ReqSlot;

/// Buffers a batch reuses across calls, so a step allocates nothing for them.
#[derive(Debug, Default)]
pub struct BatchScratch {
    /// Hash updates, one per request that fills a block this step.
    updates: Vec<HashUpdate>,
    /// `seen[slot] == epoch`: the slot is in this batch already.
    seen: Vec<u32>,
    epoch: u32,
    /// The general path's new blocks of one request.
    blocks: NewBlocks,
}

impl BatchScratch {
    /// Starts a batch over slots below `capacity`: earlier marks lapse
    /// (the binding's request-object batch checks duplicates with it too).
    pub fn start(&mut self, capacity: usize) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.seen.fill(0);
            self.epoch = 1;
        }
        if self.seen.len() < capacity {
            self.seen.resize(capacity, 0);
        }
    }

    /// Marks `slot`; false if this batch marked it already.
    pub fn mark(&mut self, slot: ReqSlot) -> bool {
        std::mem::replace(&mut self.seen[slot as usize], self.epoch) != self.epoch
    }
}

/// The per-request inputs of one step: request `i` is `handles[i]` (see
/// `KvCacheManager::handle`) with its counts at index `i`.
#[derive(Debug, Clone, Copy)]
pub struct DecodeBatch<'a> {
    pub handles: &'a [u64],
    pub num_new_tokens: &'a [u32],
    pub num_computed_tokens: &'a [u32],
    pub num_tokens: &'a [u32],
    pub lookahead: usize,
}

impl DecodeBatch<'_> {
    fn args(&self, i: usize) -> AllocateArgs<'static> {
        AllocateArgs {
            num_new_tokens: self.num_new_tokens[i] as usize,
            num_computed_tokens: self.num_computed_tokens[i] as usize,
            num_tokens: self.num_tokens[i] as usize,
            num_lookahead_tokens: self.lookahead,
            ..Default::default()
        }
    }
}

/// What a step produced: `ok` one byte per request, the new blocks of
/// request i in group g at `ids[offsets[i*G+g]..offsets[i*G+g+1]]`, and the
/// events of each request that raised some (when asked for).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchResult {
    pub ok: Vec<u8>,
    pub offsets: Vec<u32>,
    pub ids: Vec<u32>,
    pub events: Vec<(Vec<PoolEvent>, usize)>,
}

impl BatchResult {
    /// An empty result for `n` requests (offsets start at 0).
    pub fn with_capacity(n: usize, num_groups: usize) -> Self {
        let mut offsets = Vec::with_capacity(n * num_groups + 1);
        offsets.push(0);
        BatchResult {
            ok: Vec::with_capacity(n),
            offsets,
            // Most steps hand out fewer new blocks than there are requests.
            ids: Vec::with_capacity(n),
            events: Vec::new(),
        }
    }

    /// Appends one request's result: its new blocks per group (from
    /// `blocks` when `got`), or an empty run per group.
    pub fn push(&mut self, got: bool, blocks: &NewBlocks, num_groups: usize) {
        if got {
            self.ok.push(1);
            for g in blocks.groups() {
                self.ids.extend_from_slice(g);
                self.offsets.push(self.ids.len() as u32);
            }
        } else {
            self.push_no_blocks(false, num_groups);
        }
    }

    /// Appends a result without new blocks (`ok`: allocated, none needed).
    pub fn push_no_blocks(&mut self, ok: bool, num_groups: usize) {
        self.ok.push(u8::from(ok));
        let end = self.ids.len() as u32;
        self.offsets.extend(std::iter::repeat_n(end, num_groups));
    }
}

/// How pass 1 found a request: a decode that changes no block, or the
/// general path (with the index of its hash update, if it has one).
#[derive(Clone, Copy)]
enum Plan {
    Noop,
    General(Option<usize>),
}

impl KvCacheManager {
    /// Runs one decode step over `batch`. `fill_hashes(i, known, id, out)`
    /// writes request i's hashes from index `known` on into `out` (true if
    /// there are any); it is called only for requests that fill a block.
    /// `events_on`: collect each request's events in the result.
    pub fn allocate_decode_batch<E: From<CoreError>>(
        &mut self,
        batch: &DecodeBatch<'_>,
        scratch: &mut BatchScratch,
        events_on: bool,
        mut fill_hashes: impl FnMut(usize, usize, &str, &mut HashUpdate) -> Result<bool, E>,
    ) -> Result<BatchResult, E> {
        let n = batch.handles.len();
        let mut plans = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);

        // Pass 1: resolve and check every request; nothing changes yet.
        scratch.start(self.slot_capacity());
        let mut num_updates = 0;
        for i in 0..n {
            let handle = batch.handles[i];
            let found = self.plain_decode_by_handle(
                handle,
                batch.num_new_tokens[i] as usize,
                batch.num_computed_tokens[i] as usize,
                batch.num_tokens[i] as usize,
                batch.lookahead,
            );
            let Some((slot, noop)) = found else {
                return Err(self.resolve_handle(handle).unwrap_err().into());
            };
            if !scratch.mark(slot) {
                return Err(CoreError::InvalidArgument(format!(
                    "handles[{i}]: request {:?} appears twice in one step",
                    self.request_id_at(slot)
                ))
                .into());
            }
            slots.push(slot);
            if noop {
                plans.push(Plan::Noop);
                continue;
            }
            let args = batch.args(i);
            let known = self.known_hashes_at(Some(slot));
            let id = self.request_id_at(slot);
            let mut update = None;
            if self.may_need_hashes(known, &args) {
                if scratch.updates.len() == num_updates {
                    scratch.updates.push(HashUpdate::default());
                }
                if fill_hashes(i, known, id, &mut scratch.updates[num_updates])? {
                    update = Some(num_updates);
                    num_updates += 1;
                }
            }
            let u = update.map(|k| &scratch.updates[k]);
            self.check_allocate(Some(slot), id, &args, u)
                .map_err(|e| e.prefixed(&format!("handles[{i}]")))?;
            plans.push(Plan::General(update));
        }

        // Pass 2: allocate, in order.
        let num_groups = self.num_groups();
        let mut out = BatchResult::with_capacity(n, num_groups);
        for (i, (&slot, &plan)) in slots.iter().zip(&plans).enumerate() {
            match plan {
                Plan::Noop => {
                    self.record_plain_noop_decode(
                        slot,
                        batch.num_computed_tokens[i] as usize,
                        batch.num_new_tokens[i] as usize,
                    );
                    out.push_no_blocks(true, num_groups);
                }
                Plan::General(update) => {
                    let args = batch.args(i);
                    let update = update.map(|k| &scratch.updates[k]);
                    let got = self.allocate_checked(slot, &args, update, &mut scratch.blocks);
                    if events_on && self.has_events() {
                        out.events.push((self.take_events(), i));
                    }
                    out.push(got, &scratch.blocks, num_groups);
                }
            }
        }
        Ok(out)
    }
}

//! The manager's requests: id -> dense slot, each slot's block hashes, and
//! the few numbers a decode reads kept together in one cache line per
//! request. A decode that changes no block (most of them) and a handle
//! check touch that line only: under a Python scheduler the core's data is
//! cold at every call, so lines touched, not instructions, set its cost.

use std::collections::HashMap;
use std::sync::Arc;

use crate::decode_bounds::DecodeHorizon;
use crate::fast_hash::FxBuild;
use crate::hashes::{HashList, HashUpdate};
use crate::ReqSlot;

/// What a decode of one request reads and writes, in one cache line.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct HotState {
    /// Odd while the slot holds a request: bumped when the slot is taken
    /// and when it is released, so a handle (slot + generation) of a freed
    /// request never names the slot's next tenant.
    generation: u32,
    /// `hashes.len()` of the slot's `ColdState`.
    known_hashes: u32,
    /// Bounds within which a plain decode changes no block;
    /// `DecodeHorizon::UNKNOWN` when they must be recomputed.
    horizon: DecodeHorizon,
    /// (computed tokens, scheduled tokens) of the last allocation, for the
    /// Mamba copy planner; `NO_STEP` for none (no Option tag: the line
    /// holds the horizon's five bounds).
    last_step: (usize, usize),
}

/// `last_step` of a slot without an allocation (no real step: the two
/// counts sum past usize::MAX).
const NO_STEP: (usize, usize) = (usize::MAX, usize::MAX);

const _: () = assert!(std::mem::size_of::<HotState>() == 64);

impl HotState {
    const FREE: HotState = HotState {
        generation: 0,
        known_hashes: 0,
        horizon: DecodeHorizon::UNKNOWN,
        last_step: NO_STEP,
    };

    fn is_live(&self) -> bool {
        self.generation % 2 == 1
    }
}

#[derive(Debug, Clone)]
struct ColdState {
    // Shared with `slots`' key: cloning it for a call allocates nothing.
    id: Arc<str>,
    // Block hashes at hash_block_size, as the request computed them.
    hashes: HashList,
    // `request.num_prompt_tokens`, when an allocation passed it (only
    // sparse retention reads it).
    num_prompt_tokens: Option<usize>,
    // `request.shared_prefix_boundary` as last passed (replay-boundary retention).
    shared_prefix_boundary: usize,
    // `request.num_computed_tokens` as last passed (only the Mamba
    // shared-prefix checkpoint reads it).
    num_computed_tokens: usize,
}

#[derive(Debug, Clone, Default)]
pub struct RequestRegistry {
    slots: HashMap<Arc<str>, ReqSlot, FxBuild>,
    hot: Vec<HotState>,
    cold: Vec<Option<ColdState>>,
    free_slots: Vec<ReqSlot>,
}

impl RequestRegistry {
    pub fn slot(&self, request_id: &str) -> Option<ReqSlot> {
        self.slots.get(request_id).copied()
    }

    pub fn slot_or_insert(&mut self, request_id: &str) -> ReqSlot {
        if let Some(s) = self.slot(request_id) {
            return s;
        }
        let id: Arc<str> = Arc::from(request_id);
        let state = ColdState {
            id: id.clone(),
            hashes: HashList::new(),
            num_prompt_tokens: None,
            shared_prefix_boundary: 0,
            num_computed_tokens: 0,
        };
        let s = match self.free_slots.pop() {
            Some(s) => {
                self.cold[s as usize] = Some(state);
                s
            }
            None => {
                self.cold.push(Some(state));
                self.hot.push(HotState::FREE);
                (self.cold.len() - 1) as ReqSlot
            }
        };
        let hot = &mut self.hot[s as usize];
        *hot = HotState {
            generation: hot.generation.wrapping_add(1),
            ..HotState::FREE
        };
        self.slots.insert(id, s);
        s
    }

    /// Forgets the request of a live slot; the slot is reused later.
    pub fn release(&mut self, slot: ReqSlot) {
        if let Some(state) = self.cold[slot as usize].take() {
            self.slots.remove(&state.id);
            let hot = &mut self.hot[slot as usize];
            *hot = HotState {
                generation: hot.generation.wrapping_add(1),
                ..HotState::FREE
            };
            self.free_slots.push(slot);
        }
    }

    fn cold(&self, slot: ReqSlot) -> &ColdState {
        self.cold[slot as usize].as_ref().expect("live slot")
    }

    pub fn id_at(&self, slot: ReqSlot) -> &str {
        &self.cold(slot).id
    }

    pub fn hashes(&self, slot: ReqSlot) -> &HashList {
        &self.cold(slot).hashes
    }

    pub fn num_prompt_tokens(&self, slot: ReqSlot) -> Option<usize> {
        self.cold(slot).num_prompt_tokens
    }

    pub fn set_num_prompt_tokens(&mut self, slot: ReqSlot, n: usize) {
        self.cold[slot as usize]
            .as_mut()
            .expect("live slot")
            .num_prompt_tokens = Some(n);
    }

    pub fn shared_prefix_boundary(&self, slot: ReqSlot) -> usize {
        self.cold(slot).shared_prefix_boundary
    }

    pub fn set_shared_prefix_boundary(&mut self, slot: ReqSlot, n: usize) {
        self.cold[slot as usize]
            .as_mut()
            .expect("live slot")
            .shared_prefix_boundary = n;
    }

    pub fn num_computed_tokens(&self, slot: ReqSlot) -> usize {
        self.cold(slot).num_computed_tokens
    }

    pub fn set_num_computed_tokens(&mut self, slot: ReqSlot, n: usize) {
        self.cold[slot as usize]
            .as_mut()
            .expect("live slot")
            .num_computed_tokens = n;
    }

    /// `hashes(slot).len()`, from the hot line.
    pub fn known_hashes(&self, slot: ReqSlot) -> usize {
        self.hot[slot as usize].known_hashes as usize
    }

    /// Stores the request's hashes from `update.offset` on.
    pub fn apply_hashes(&mut self, slot: ReqSlot, update: &HashUpdate) {
        let hashes = &mut self.cold[slot as usize].as_mut().expect("live slot").hashes;
        if update.hashes.is_empty() && update.offset == hashes.len() {
            return;
        }
        hashes.truncate(update.offset);
        hashes.extend(&update.hashes);
        // HashList ends are u32 byte offsets: its length fits too.
        self.hot[slot as usize].known_hashes = hashes.len() as u32;
    }

    /// `apply_hashes` taking the update: a new request's hashes (or all of
    /// them again) move in without a copy.
    pub fn take_hashes(&mut self, slot: ReqSlot, update: HashUpdate) {
        if update.offset != 0 {
            return self.apply_hashes(slot, &update);
        }
        let hashes = &mut self.cold[slot as usize].as_mut().expect("live slot").hashes;
        *hashes = update.hashes;
        self.hot[slot as usize].known_hashes = hashes.len() as u32;
    }

    pub fn horizon(&self, slot: ReqSlot) -> Option<DecodeHorizon> {
        let h = self.hot[slot as usize].horizon;
        (h != DecodeHorizon::UNKNOWN).then_some(h)
    }

    pub fn set_horizon(&mut self, slot: ReqSlot, horizon: Option<DecodeHorizon>) {
        let hot = &mut self.hot[slot as usize];
        if hot.is_live() {
            hot.horizon = horizon.unwrap_or(DecodeHorizon::UNKNOWN);
        }
    }

    pub fn last_step(&self, slot: ReqSlot) -> Option<(usize, usize)> {
        let step = self.hot[slot as usize].last_step;
        (step != NO_STEP).then_some(step)
    }

    pub fn set_last_step(&mut self, slot: ReqSlot, step: (usize, usize)) {
        let hot = &mut self.hot[slot as usize];
        if hot.is_live() {
            hot.last_step = step;
        }
    }

    /// Slot + generation of a live slot.
    pub fn handle(&self, slot: ReqSlot) -> u64 {
        u64::from(self.hot[slot as usize].generation) << 32 | u64::from(slot)
    }

    /// The live slot a handle names with its decode horizon (all zeros,
    /// `DecodeHorizon::UNKNOWN`, when unknown) and hash count: what a
    /// batched decode reads, one line.
    #[inline]
    pub fn resolve_for_decode(&self, handle: u64) -> Option<(ReqSlot, &DecodeHorizon, usize)> {
        let slot = handle as u32;
        let hot = self.hot.get(slot as usize)?;
        (hot.generation == (handle >> 32) as u32 && hot.is_live()).then_some((
            slot,
            &hot.horizon,
            hot.known_hashes as usize,
        ))
    }

    /// Where the hot line of the handle's slot lives, for a caller to
    /// prefetch before that request's next call (None: no such slot).
    pub fn hot_line_addr(&self, handle: u64) -> Option<*const u8> {
        self.hot
            .get(handle as u32 as usize)
            .map(|h| std::ptr::from_ref(h).cast())
    }

    /// The live slot a handle names, if it still names one.
    pub fn resolve_handle(&self, handle: u64) -> Option<ReqSlot> {
        self.resolve_for_decode(handle).map(|(slot, ..)| slot)
    }

    pub fn ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.slots.keys().map(|id| &**id)
    }

    pub fn contains(&self, request_id: &str) -> bool {
        self.slots.contains_key(request_id)
    }

    /// One more than the highest slot ever used (slots index dense tables).
    pub fn capacity(&self) -> usize {
        self.cold.len()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_live(&self, slot: ReqSlot) -> bool {
        self.hot.get(slot as usize).is_some_and(HotState::is_live)
    }

    /// id -> slot -> state agree, free slots are free, the hot line
    /// mirrors the hashes and liveness.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.cold.iter().flatten().count() != self.slots.len() {
            return Err("live request states and request ids disagree".into());
        }
        for (id, &s) in &self.slots {
            match self.cold.get(s as usize).and_then(|r| r.as_ref()) {
                Some(r) if r.id == *id => {}
                _ => {
                    return Err(format!(
                        "request {id:?} maps to slot {s}, which holds another request"
                    ))
                }
            }
        }
        for (s, (hot, cold)) in self.hot.iter().zip(&self.cold).enumerate() {
            if hot.is_live() != cold.is_some() {
                return Err(format!(
                    "slot {s}: generation parity disagrees with liveness"
                ));
            }
            let known = cold.as_ref().map_or(0, |c| c.hashes.len());
            if hot.known_hashes as usize != known {
                return Err(format!(
                    "slot {s}: hot line says {} hashes, the request holds {known}",
                    hot.known_hashes
                ));
            }
        }
        let mut free_slot = vec![false; self.cold.len()];
        for &s in &self.free_slots {
            if self.is_live(s) || std::mem::replace(&mut free_slot[s as usize], true) {
                return Err(format!("free slot {s} is live or listed twice"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_of_released_slots_never_resolve() {
        let mut r = RequestRegistry::default();
        let a = r.slot_or_insert("a");
        let ha = r.handle(a);
        assert_eq!(r.resolve_handle(ha), Some(a));
        r.release(a);
        assert_eq!(r.resolve_handle(ha), None);
        let b = r.slot_or_insert("b");
        assert_eq!(b, a, "slots are reused");
        assert_ne!(r.handle(b), ha);
        assert_eq!(r.resolve_handle(ha), None);
        assert!(r.check_invariants().is_ok());
    }

    #[test]
    fn hot_line_mirrors_hashes_and_resets_on_release() {
        let mut r = RequestRegistry::default();
        let s = r.slot_or_insert("x");
        let hashes: HashList = [b"ab".as_slice(), b"cd"].into_iter().collect();
        r.take_hashes(s, HashUpdate { offset: 0, hashes });
        r.set_last_step(s, (3, 1));
        assert_eq!((r.known_hashes(s), r.last_step(s)), (2, Some((3, 1))));
        r.release(s);
        assert_eq!(
            (r.known_hashes(s), r.last_step(s), r.horizon(s)),
            (0, None, None)
        );
        r.set_last_step(s, (1, 1));
        assert_eq!(r.last_step(s), None, "a released slot keeps no state");
        assert!(r.check_invariants().is_ok());
    }
}

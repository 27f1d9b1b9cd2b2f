//! A request's block hashes as the core knows them: the caller's hashes
//! arrive as updates (the new tail, checked against what is known), read
//! only when an allocation may cache a block they cover.

use super::{admission_check, KvCacheManager};
use crate::error::{invalid, CoreResult};
use crate::hashes::HashUpdate;
use crate::ReqSlot;

impl KvCacheManager {
    /// How many of the request's block hashes the core holds.
    pub fn num_known_hashes(&self, request_id: &str) -> usize {
        self.known_hashes_at(self.slot(request_id))
    }

    /// Stores the request's hashes from index `offset` on (the facade sends
    /// each hash once). Creates the request's entry if needed.
    pub fn sync_hashes(
        &mut self,
        request_id: &str,
        offset: usize,
        new: Vec<Box<[u8]>>,
    ) -> CoreResult<()> {
        let update = HashUpdate {
            offset,
            hashes: new.iter().collect(),
        };
        self.hashes_after(request_id, Some(&update))?;
        self.apply_hashes(request_id, update);
        Ok(())
    }

    /// `sync_hashes` for an update already in the core's form.
    pub fn sync_update(&mut self, request_id: &str, update: HashUpdate) -> CoreResult<()> {
        self.hashes_after(request_id, Some(&update))?;
        self.apply_hashes(request_id, update);
        Ok(())
    }

    /// How many hashes the request will hold once `update` is applied;
    /// refuses an update that leaves a gap.
    pub(super) fn hashes_after(
        &self,
        request_id: &str,
        update: Option<&HashUpdate>,
    ) -> CoreResult<usize> {
        self.hashes_after_at(self.slot(request_id), request_id, update)
    }

    pub(super) fn hashes_after_at(
        &self,
        slot: Option<ReqSlot>,
        request_id: &str,
        update: Option<&HashUpdate>,
    ) -> CoreResult<usize> {
        let known = self.known_hashes_at(slot);
        match update {
            None => Ok(known),
            Some(u) if u.offset > known => invalid(format!(
                "request {request_id:?}: hashes sent from index {}, but only {known} are known",
                u.offset
            )),
            Some(u) if u.offset < known => {
                admission_check::check_resend(self, slot, request_id, u)?;
                Ok(u.offset + u.hashes.len())
            }
            Some(u) => Ok(u.offset + u.hashes.len()),
        }
    }

    pub(super) fn apply_hashes_at(&mut self, slot: ReqSlot, update: HashUpdate) {
        self.reqs.take_hashes(slot, update);
    }

    pub(super) fn apply_hashes(&mut self, request_id: &str, update: HashUpdate) {
        if update.hashes.is_empty() && update.offset == self.num_known_hashes(request_id) {
            return;
        }
        let s = self.slot_or_insert(request_id);
        self.apply_hashes_at(s, update);
    }
}

//! Request ids seen before, by object address: the scheduler passes the
//! same `request.request_id` str object at every call, so a request's slot
//! is found without hashing or comparing the id's characters (under a
//! Python scheduler that is a cold cache line or two per call saved).
//!
//! Each entry keeps its str alive, so its address cannot be taken by
//! another object while the entry exists; the entry's handle (slot +
//! generation) says whether the slot still holds that request.

use std::collections::HashMap;

use hybridcache_core::fast_hash::FxBuild;
use pyo3::prelude::*;
use pyo3::types::PyString;

#[derive(Default)]
pub struct IdCache {
    by_addr: HashMap<usize, u64, FxBuild>,
    // Per slot: the str its entry holds (at most one entry per slot).
    held: Vec<Option<Py<PyString>>>,
}

impl IdCache {
    /// The handle last seen for this very str object.
    pub fn get(&self, id: &Bound<'_, PyString>) -> Option<u64> {
        self.get_addr(id.as_ptr() as usize)
    }

    /// `get` by the object's address.
    pub fn get_addr(&self, addr: usize) -> Option<u64> {
        self.by_addr.get(&addr).copied()
    }

    /// Remembers that `id` names the request of `handle` (slot in the low
    /// 32 bits), replacing the slot's previous entry.
    pub fn remember(&mut self, id: &Bound<'_, PyString>, handle: u64) {
        let slot = handle as u32 as usize;
        if slot >= self.held.len() {
            self.held.resize_with(slot + 1, || None);
        }
        if let Some(old) = self.held[slot].take() {
            self.by_addr.remove(&(old.as_ptr() as usize));
        }
        self.by_addr.insert(id.as_ptr() as usize, handle);
        self.held[slot] = Some(id.clone().unbind());
    }
}

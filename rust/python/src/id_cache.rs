//! Request ids seen before, by object address: the scheduler passes the
//! same `request.request_id` str object at every call, so a request's slot
//! is found without hashing or comparing the id's characters (under a
//! Python scheduler that is a cold cache line or two per call saved).
//!
//! Each entry keeps its str alive, so its address cannot be taken by
//! another object while the entry exists; the entry's handle (slot +
//! generation) says whether the slot still holds that request. The table
//! (`AddrTable`) learns the order of the hot calls, for them to prefetch
//! the next one's data.

use hybridcache_core::addr_table::{AddrTable, NextCall};
use pyo3::prelude::*;
use pyo3::types::PyString;

#[derive(Default)]
pub struct IdCache {
    table: AddrTable,
    // Per slot: the str its entry holds (at most one entry per slot).
    held: Vec<Option<Py<PyString>>>,
}

impl IdCache {
    /// The handle last seen for this very str object.
    pub fn get(&self, id: &Bound<'_, PyString>) -> Option<u64> {
        self.table.get_addr(id.as_ptr() as usize)
    }

    /// `get` for a hot call, by the str's address; also where the call
    /// after it was last time (`AddrTable::get_hot`). Only the raw entry
    /// points make hot calls.
    #[cfg_attr(not(feature = "raw-ffi"), allow(dead_code))]
    pub fn get_hot(&mut self, addr: usize) -> Option<(u64, Option<NextCall>)> {
        self.table.get_hot(addr)
    }

    /// Remembers that `id` names the request of `handle` (slot in the low
    /// 32 bits), replacing the slot's previous entry.
    pub fn remember(&mut self, id: &Bound<'_, PyString>, handle: u64) {
        let slot = handle as u32 as usize;
        if slot >= self.held.len() {
            self.held.resize_with(slot + 1, || None);
        }
        if let Some(old) = self.held[slot].take() {
            self.table.remove(old.as_ptr() as usize);
        }
        self.table.insert(id.as_ptr() as usize, handle);
        self.held[slot] = Some(id.clone().unbind());
    }
}

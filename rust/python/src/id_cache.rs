//! Request ids seen before, by object address: the scheduler passes the
//! same `request.request_id` str object at every call, so a request's slot
//! is found without hashing or comparing the id's characters (under a
//! Python scheduler that is a cold cache line or two per call saved).
//!
//! Each entry keeps its str alive, so its address cannot be taken by
//! another object while the entry exists; the entry's handle (slot +
//! generation) says whether the slot still holds that request.
//!
//! The hot calls (a running request's decode and its `cache_blocks`) key
//! a second table by the request object itself, kept alive the same way
//! until the slot is freed or taken by another request: found there, a
//! call skips reading `request.request_id` (a generic attribute lookup, a
//! few hundred instructions of interpreter code it would otherwise run
//! cold). vLLM never changes a live request's id. That table
//! (`AddrTable`) also learns the order of the hot calls, for them to
//! prefetch the next one's data.

use hybridcache_core::addr_table::{AddrTable, NextCall};
use pyo3::prelude::*;
use pyo3::types::PyString;

#[derive(Default)]
pub struct IdCache {
    table: AddrTable,
    // Per slot: the str its entry holds (at most one entry per slot).
    held: Vec<Option<Py<PyString>>>,
    // The hot calls' table, by request object, and per slot the request
    // its entry holds.
    requests: AddrTable,
    held_requests: Vec<Option<PyObject>>,
}

impl IdCache {
    /// The handle last seen for this very str object.
    pub fn get(&self, id: &Bound<'_, PyString>) -> Option<u64> {
        self.table.get_addr(id.as_ptr() as usize)
    }

    /// The handle of the request object at `addr`, for a hot call; also
    /// where the call after it was last time (`AddrTable::get_hot`). Only
    /// the raw entry points make hot calls.
    #[cfg_attr(not(feature = "raw-ffi"), allow(dead_code))]
    pub fn get_hot_request(&mut self, addr: usize) -> Option<(u64, Option<NextCall>)> {
        self.requests.get_hot(addr)
    }

    /// Remembers that `request` is the request of `handle`, replacing the
    /// slot's previous entry.
    #[cfg_attr(not(feature = "raw-ffi"), allow(dead_code))]
    pub fn remember_request(&mut self, request: &Bound<'_, PyAny>, handle: u64) {
        let slot = handle as u32 as usize;
        if slot >= self.held_requests.len() {
            self.held_requests.resize_with(slot + 1, || None);
        }
        if let Some(old) = self.held_requests[slot].take() {
            self.requests.remove(old.as_ptr() as usize);
        }
        let addr = request.as_ptr() as usize;
        // One slot per object: an entry left by an earlier tenure (a slot
        // the manager dropped on its own) lets go of it.
        if let Some(earlier) = self.requests.get_addr(addr) {
            if let Some(held) = self.held_requests.get_mut(earlier as u32 as usize) {
                *held = None;
            }
        }
        self.requests.insert(addr, handle);
        self.held_requests[slot] = Some(request.clone().unbind());
    }

    /// The request objects held (for the garbage collector: a request may
    /// reach its manager, through an event sink or a hasher).
    pub fn held_requests(&self) -> impl Iterator<Item = &PyObject> {
        self.held_requests.iter().flatten()
    }

    /// Lets go of every request object (the garbage collector's clear).
    pub fn forget_requests(&mut self) {
        self.requests = AddrTable::default();
        self.held_requests.clear();
    }

    /// Lets go of the request object of a slot the manager freed (its
    /// token lists are large; the str of its id is not).
    pub fn forget_request(&mut self, slot: u32) {
        if let Some(old) = self
            .held_requests
            .get_mut(slot as usize)
            .and_then(Option::take)
        {
            self.requests.remove(old.as_ptr() as usize);
        }
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

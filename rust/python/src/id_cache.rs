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

/// Objects by address, each kept alive by its entry (so no other object
/// can take the address while it stands), at most one entry per slot and
/// one slot per object.
struct Pinned<T> {
    table: AddrTable,
    // Per slot: the object its entry holds.
    held: Vec<Option<Py<T>>>,
}

impl<T> Default for Pinned<T> {
    fn default() -> Self {
        Pinned {
            table: AddrTable::default(),
            held: Vec::new(),
        }
    }
}

impl<T> Pinned<T> {
    /// Remembers that `obj` stands for the request of `handle` (slot in
    /// the low 32 bits), replacing the slot's previous entry.
    fn remember(&mut self, obj: &Bound<'_, T>, handle: u64) {
        let slot = handle as u32 as usize;
        if slot >= self.held.len() {
            self.held.resize_with(slot + 1, || None);
        }
        self.forget(slot);
        let addr = obj.as_ptr() as usize;
        // An entry left by an earlier tenure of the object (a slot the
        // manager dropped on its own) lets go of it.
        if let Some(earlier) = self.table.get_addr(addr) {
            if let Some(held) = self.held.get_mut(earlier as u32 as usize) {
                *held = None;
            }
        }
        self.table.insert(addr, handle);
        self.held[slot] = Some(obj.clone().unbind());
    }

    /// Lets go of the slot's object.
    fn forget(&mut self, slot: usize) {
        drop(self.take(slot));
    }

    /// Lets go of the slot's object, handed to the caller.
    fn take(&mut self, slot: usize) -> Option<Py<T>> {
        let old = self.held.get_mut(slot).and_then(Option::take)?;
        self.table.remove(old.as_ptr() as usize);
        Some(old)
    }
}

#[derive(Default)]
pub struct IdCache {
    ids: Pinned<PyString>,
    // The hot calls' table, by request object.
    requests: Pinned<PyAny>,
    // Per slot: where the hot calls read the request object's `request_id`
    // and `num_computed_tokens` (`raw_ffi::fields`; 0: the generic lookup).
    field_access: Vec<u8>,
    /// The request types whose fields the hot calls read through their slots.
    #[cfg(feature = "raw-ffi")]
    pub(crate) members: crate::raw_ffi::fields::MemberReaders,
}

impl IdCache {
    /// The handle last seen for this very str object.
    pub fn get(&self, id: &Bound<'_, PyString>) -> Option<u64> {
        self.ids.table.get_addr(id.as_ptr() as usize)
    }

    /// The handle of the request object at `addr`, for a hot call; also
    /// where the call after it was last time (`AddrTable::get_hot`). Only
    /// the raw entry points make hot calls.
    #[cfg_attr(not(feature = "raw-ffi"), allow(dead_code))]
    pub fn get_hot_request(&mut self, addr: usize) -> Option<(u64, Option<NextCall>)> {
        self.requests.table.get_hot(addr)
    }

    /// Remembers that `request` is the request of `handle` (every
    /// allocation of a request remembers it: a held request is known by
    /// its object until it is freed). `field_access`: where the hot calls
    /// read its `request_id` and `num_computed_tokens` (`raw_ffi::fields`).
    pub fn remember_request(&mut self, request: &Bound<'_, PyAny>, handle: u64, field_access: u8) {
        self.requests.remember(request, handle);
        let slot = handle as u32 as usize;
        if slot >= self.field_access.len() {
            self.field_access.resize(slot + 1, 0);
        }
        self.field_access[slot] = field_access;
    }

    /// The request object held for `slot`, if any.
    pub fn request_at(&self, slot: u32) -> Option<&PyObject> {
        self.requests
            .held
            .get(slot as usize)
            .and_then(Option::as_ref)
    }

    /// The handle the request object at `addr` was remembered with (the
    /// slot may have changed hands since: check it).
    pub fn handle_of_request(&self, addr: usize) -> Option<u64> {
        self.requests.table.get_addr(addr)
    }

    /// The id str remembered for `slot`, if any.
    #[cfg_attr(not(feature = "raw-ffi"), allow(dead_code))]
    pub fn id_at(&self, slot: u32) -> Option<&Py<PyString>> {
        self.ids.held.get(slot as usize).and_then(Option::as_ref)
    }

    /// Where the hot calls read the fields of the request of `slot`.
    #[cfg_attr(not(feature = "raw-ffi"), allow(dead_code))]
    pub fn field_access(&self, slot: u32) -> u8 {
        self.field_access.get(slot as usize).copied().unwrap_or(0)
    }

    /// The request objects held (for the garbage collector: a request may
    /// reach its manager, through an event sink or a hasher).
    pub fn held_requests(&self) -> impl Iterator<Item = &PyObject> {
        self.requests.held.iter().flatten()
    }

    /// Lets go of every request object (the garbage collector's clear);
    /// returned, for the caller to drop.
    pub fn forget_requests(&mut self) -> Vec<PyObject> {
        let out = std::mem::take(&mut self.requests.held)
            .into_iter()
            .flatten()
            .collect();
        self.requests = Pinned::default();
        out
    }

    /// Lets go of the request object of a slot the manager freed (its
    /// token lists are large; the str of its id is not). Returns what was
    /// held, for the caller to drop once the manager's state is settled
    /// (dropping a request can run its finalizer, which is Python code).
    #[must_use]
    pub fn forget_request(&mut self, slot: u32) -> Option<PyObject> {
        self.requests.take(slot as usize)
    }

    /// Remembers that `id` names the request of `handle`.
    pub fn remember(&mut self, id: &Bound<'_, PyString>, handle: u64) {
        self.ids.remember(id, handle);
    }
}

/// The error for a held request whose `request_id` changed.
#[cold]
#[inline(never)]
pub(crate) fn renamed_error(held: &str, now: &str) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(format!(
        "request {held:?}: its request_id was changed to {now:?} while the manager holds it \
         (a request's id must stay the same until free(); vLLM never changes it)"
    ))
}

/// The error for a second live request object with a held request's id.
#[cold]
#[inline(never)]
pub(crate) fn second_request_error(id: &str) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(format!(
        "request_id {id:?} is held by another live request: free() it before a new request \
         takes its id (request ids are unique among the requests the manager holds)"
    ))
}

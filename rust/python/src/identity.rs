//! Which request a call is about, checked: a held request is known by its
//! object (remembered at its allocation) and by its id; a call whose
//! request object and id disagree (the id was changed while held, or a
//! second live request object has a held id) is refused before anything
//! changes. The objects the manager lets go of are handed back, to be
//! dropped once its state is settled.

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::id_cache::{renamed_error, second_request_error};
use crate::native_manager::NativeManager;

/// Request objects the manager let go of: dropped by the caller once the
/// manager's state is settled and no longer borrowed.
#[allow(dead_code)] // held only to be dropped later
pub(crate) struct HeldObjects(pub(crate) PyObject);

impl NativeManager {
    /// The slot of the request `request` whose `request_id` read `rid`
    /// (None: not held), after checking that the id still names this
    /// request: ValueError, nothing changed, when the request object the
    /// manager holds was renamed or its id swapped with another held
    /// request's, or when another live request object holds the id.
    pub(crate) fn checked_slot(
        &mut self,
        request: &Bound<'_, PyAny>,
        rid: &Bound<'_, PyString>,
    ) -> PyResult<Option<u32>> {
        let by_id = self.lookup_id(rid)?;
        let by_object = self
            .ids
            .handle_of_request(request.as_ptr() as usize)
            .and_then(|h| self.inner.slot_of_handle(h));
        match (by_object, by_id) {
            (Some(o), Some(i)) if o == i => Ok(Some(i)),
            (Some(o), _) => Err(renamed_error(self.inner.request_id_at(o), rid.to_str()?)),
            (None, Some(i)) => {
                if self.held_object(i).is_some_and(|held| !held.is(request)) {
                    return Err(second_request_error(rid.to_str()?));
                }
                Ok(Some(i))
            }
            (None, None) => Ok(None),
        }
    }

    /// The request object remembered for the request now in `slot` (not
    /// one left from an earlier tenant of the slot).
    pub(crate) fn held_object(&self, slot: u32) -> Option<&PyObject> {
        let held = self.ids.request_at(slot)?;
        let handle = self.ids.handle_of_request(held.as_ptr() as usize)?;
        (handle == self.inner.handle_at(slot)).then_some(held)
    }

    /// Remembers `request` as the object of the request just allocated in
    /// `slot` (no live object holds it), and `rid`, the id it read, as the
    /// str its id is (the hot calls' identity check compares it by address).
    pub(crate) fn remember_new_request(
        &mut self,
        request: &Bound<'_, PyAny>,
        slot: u32,
        rid: Option<&Bound<'_, PyString>>,
    ) {
        #[cfg(feature = "raw-ffi")]
        let access = crate::raw_ffi::fields::access_of(request, &mut self.ids.members);
        #[cfg(not(feature = "raw-ffi"))]
        let access = 0;
        let handle = self.inner.handle_at(slot);
        self.ids.remember_request(request, handle, access);
        if let Some(rid) = rid {
            self.ids.remember(rid, handle);
        }
    }

    /// The slot of the request whose id is `rid`: by the str object's
    /// address when this object was seen before (see `id_cache`).
    pub(crate) fn lookup_id(&mut self, rid: &Bound<'_, PyString>) -> PyResult<Option<u32>> {
        if let Some(slot) = self.ids.get(rid).and_then(|h| self.inner.slot_of_handle(h)) {
            return Ok(Some(slot));
        }
        let slot = self.inner.lookup(rid.to_str()?);
        if let Some(s) = slot {
            self.ids.remember(rid, self.inner.handle_at(s));
        }
        Ok(slot)
    }

    /// Lets go of the request object the hot calls know a request by
    /// (`IdCache::remember_request`) when the manager lets go of the request;
    /// the request's slot, if it holds one, and the objects let go of: the
    /// caller drops them once the manager's state is settled (a finalizer
    /// is Python code, which may call the manager).
    pub(crate) fn forget_request_object(
        &mut self,
        request_id: &str,
    ) -> (Option<u32>, Option<HeldObjects>) {
        let Some(slot) = self.inner.lookup(request_id) else {
            return (None, None);
        };
        (Some(slot), self.ids.forget_request(slot).map(HeldObjects))
    }

    /// `free`'s identity check: ValueError when `request` is the object of
    /// a held request whose id no longer reads as it did (renamed, or
    /// swapped with another held request's).
    pub(crate) fn check_free_identity(
        &self,
        request: &Bound<'_, PyAny>,
        rid: &Bound<'_, PyString>,
    ) -> PyResult<()> {
        let Some(slot) = self
            .ids
            .handle_of_request(request.as_ptr() as usize)
            .and_then(|h| self.inner.slot_of_handle(h))
        else {
            return Ok(());
        };
        let held = self.inner.request_id_at(slot);
        if rid.to_str()? != held {
            return Err(renamed_error(held, rid.to_str()?));
        }
        Ok(())
    }
}

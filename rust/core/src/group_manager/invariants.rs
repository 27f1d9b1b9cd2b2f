//! What `KvCacheManager::check_invariants` reads of a group manager: its
//! running slots, tables, Mamba align states and the records' own
//! consistency. Reads only; kept apart from the allocation steps.

use super::SingleTypeManager;
use crate::attention::mamba::AlignState;
use crate::{BlockId, ReqSlot};

impl SingleTypeManager {
    /// Running slots and whether each has a table, for invariant checks.
    pub fn running_slots(&self) -> impl Iterator<Item = (ReqSlot, bool)> + '_ {
        self.records
            .reqs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.num_cached.is_some())
            .map(|(s, r)| (s as ReqSlot, r.has_blocks))
    }

    /// Slots with Mamba align state, for invariant checks.
    pub fn align_states(&self) -> impl Iterator<Item = (ReqSlot, AlignState)> + '_ {
        self.records
            .reqs
            .iter()
            .enumerate()
            .filter_map(|(s, r)| r.align.map(|a| (s as ReqSlot, a)))
    }

    /// The records agree with the entry count, and a slot without a table
    /// keeps no ids.
    pub fn check_records(&self) -> Result<(), String> {
        let reqs = &self.records.reqs;
        let with_tables = reqs.iter().filter(|r| r.has_blocks).count();
        if with_tables != self.records.num_block_entries {
            return Err(format!(
                "{with_tables} tables but {} counted",
                self.records.num_block_entries
            ));
        }
        match reqs
            .iter()
            .position(|r| !r.has_blocks && !r.blocks.is_empty())
        {
            Some(s) => Err(format!("slot {s} keeps block ids without a table")),
            None => Ok(()),
        }
    }

    /// Slots and tables, for invariant checks.
    pub fn tables(&self) -> impl Iterator<Item = (ReqSlot, &[BlockId])> + '_ {
        self.records
            .reqs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.has_blocks)
            .map(|(s, r)| (s as ReqSlot, r.blocks.as_slice()))
    }
}

//! The blocks one `allocate_slots` call appended, per group, in one flat
//! buffer the caller reuses: a decode step allocates nothing to report them.

use smallvec::SmallVec;

use crate::BlockId;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewBlocks {
    pub(crate) ids: Vec<BlockId>,
    // End of each group's run in `ids`.
    pub(crate) ends: SmallVec<[u32; 8]>,
}

impl NewBlocks {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn clear(&mut self) {
        self.ids.clear();
        self.ends.clear();
    }

    /// `n` groups that got no block.
    pub fn push_empty_groups(&mut self, n: usize) {
        let end = self.ids.len() as u32;
        if self.ends.is_empty() && n <= 8 {
            // The no-op decode's whole result: one inline copy, where the
            // generic extend costs more than the rest of that decode.
            self.ends = SmallVec::from_buf_and_len([end; 8], n);
        } else {
            self.ends.extend(std::iter::repeat_n(end, n));
        }
    }

    pub fn num_groups(&self) -> usize {
        self.ends.len()
    }

    /// The new blocks of group `g`.
    pub fn group(&self, g: usize) -> &[BlockId] {
        let start = if g == 0 { 0 } else { self.ends[g - 1] as usize };
        &self.ids[start..self.ends[g] as usize]
    }

    pub fn groups(&self) -> impl ExactSizeIterator<Item = &[BlockId]> + '_ {
        (0..self.num_groups()).map(|g| self.group(g))
    }

    /// True when no group got a block.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn to_vecs(&self) -> Vec<Vec<BlockId>> {
        self.groups().map(<[BlockId]>::to_vec).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_runs_of_the_flat_buffer() {
        let mut n = NewBlocks::new();
        n.ids.extend([4, 5]);
        n.ends.push(2);
        n.ends.push(2);
        n.ids.push(9);
        n.ends.push(3);
        assert_eq!(n.to_vecs(), vec![vec![4, 5], vec![], vec![9]]);
        assert!(!n.is_empty());
        n.clear();
        assert!(n.is_empty() && n.num_groups() == 0);
    }
}

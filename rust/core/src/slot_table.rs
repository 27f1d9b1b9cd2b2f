//! Per-request tables indexed by dense request slots: O(1) without hashing,
//! and an entry count that mirrors the length of vLLM's per-request dicts.

#[derive(Debug, Clone)]
pub struct SlotTable<T> {
    items: Vec<Option<T>>,
    len: usize,
}

impl<T> Default for SlotTable<T> {
    fn default() -> Self {
        SlotTable {
            items: Vec::new(),
            len: 0,
        }
    }
}

impl<T> SlotTable<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, slot: u32) -> Option<&T> {
        self.items.get(slot as usize).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
        self.items.get_mut(slot as usize).and_then(Option::as_mut)
    }

    pub fn contains(&self, slot: u32) -> bool {
        self.get(slot).is_some()
    }

    pub fn insert(&mut self, slot: u32, value: T) -> Option<T> {
        let i = slot as usize;
        if i >= self.items.len() {
            self.items.resize_with(i + 1, || None);
        }
        let old = self.items[i].replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, slot: u32) -> Option<T> {
        let old = self.items.get_mut(slot as usize).and_then(Option::take);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> + '_ {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (i as u32, v)))
    }
}

impl<T: Default> SlotTable<T> {
    /// The entry, created empty if absent (vLLM's defaultdict access).
    pub fn entry(&mut self, slot: u32) -> &mut T {
        if !self.contains(slot) {
            self.insert(slot, T::default());
        }
        self.get_mut(slot).expect("just inserted")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_entries_like_a_dict() {
        let mut t: SlotTable<Vec<u32>> = SlotTable::default();
        t.entry(5).push(1);
        t.entry(5).push(2);
        t.entry(0);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(5), Some(&vec![1, 2]));
        assert_eq!(t.remove(5), Some(vec![1, 2]));
        assert_eq!(t.remove(5), None);
        assert_eq!(t.len(), 1);
        assert_eq!(t.iter().map(|(s, _)| s).collect::<Vec<_>>(), vec![0]);
    }
}

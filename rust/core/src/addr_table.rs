//! A table keyed by object address (the binding's ids seen before) that
//! also learns, for each key, which key the hot calls reached right after
//! it last time. Open-addressed, so that key's entry can be named by
//! address: the binding prefetches it, with that request's hot line,
//! while Python runs between the calls.

/// One key (an address; 0: empty), its handle, and the key (address and
/// handle) the hot calls reached right after it last time (0: none).
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Entry {
    addr: usize,
    handle: u64,
    next_addr: usize,
    next_handle: u64,
}

#[derive(Default)]
pub struct AddrTable {
    /// Linear probing; a power of two long, at most half full.
    entries: Vec<Entry>,
    len: usize,
    /// The entry of the last hot call, to learn what follows it.
    last: Option<usize>,
}

/// Where the next hot call is predicted to look: the first probe of its
/// key's entry and its handle.
#[derive(Clone, Copy)]
pub struct NextCall {
    pub entry: *const u8,
    pub handle: u64,
}

impl AddrTable {
    fn home(&self, addr: usize) -> usize {
        // Objects are 16-byte aligned: mix the bits above those.
        let h = ((addr >> 4) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 32) as usize & (self.entries.len() - 1)
    }

    fn find(&self, addr: usize) -> Option<usize> {
        if self.entries.is_empty() || addr == 0 {
            return None;
        }
        let mask = self.entries.len() - 1;
        let mut i = self.home(addr);
        loop {
            match self.entries[i].addr {
                0 => return None,
                a if a == addr => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The handle stored for `addr`.
    pub fn get_addr(&self, addr: usize) -> Option<u64> {
        self.find(addr).map(|i| self.entries[i].handle)
    }

    /// `get_addr` for a hot call: also notes that this id followed the
    /// last hot call's, and returns where the call after this one was
    /// last time (for the caller to prefetch).
    pub fn get_hot(&mut self, addr: usize) -> Option<(u64, Option<NextCall>)> {
        let i = self.find(addr)?;
        if let Some(p) = self.last.replace(i).filter(|&p| p != i) {
            let handle = self.entries[i].handle;
            let prev = &mut self.entries[p];
            prev.next_addr = addr;
            prev.next_handle = handle;
        }
        let e = self.entries[i];
        let next = (e.next_addr != 0).then(|| NextCall {
            entry: std::ptr::from_ref(&self.entries[self.home(e.next_addr)]).cast(),
            handle: e.next_handle,
        });
        Some((e.handle, next))
    }

    /// Stores `handle` for `addr` (nonzero), replacing any it had.
    pub fn insert(&mut self, addr: usize, handle: u64) {
        if let Some(i) = self.find(addr) {
            self.entries[i].handle = handle;
            return;
        }
        if (self.len + 1) * 2 > self.entries.len() {
            self.grow();
        }
        let mask = self.entries.len() - 1;
        let mut i = self.home(addr);
        while self.entries[i].addr != 0 {
            i = (i + 1) & mask;
        }
        self.entries[i] = Entry {
            addr,
            handle,
            ..Entry::default()
        };
        self.len += 1;
    }

    fn grow(&mut self) {
        let size = (self.entries.len() * 2).max(64);
        let old = std::mem::replace(&mut self.entries, vec![Entry::default(); size]);
        self.len = 0;
        self.last = None;
        for e in old.into_iter().filter(|e| e.addr != 0) {
            self.insert(e.addr, e.handle);
        }
    }

    /// Linear probing's deletion: later entries of the run move back so
    /// every probe still finds them.
    pub fn remove(&mut self, addr: usize) {
        let Some(mut hole) = self.find(addr) else {
            return;
        };
        self.last = None;
        let mask = self.entries.len() - 1;
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let e = self.entries[i];
            if e.addr == 0 {
                break;
            }
            // Move `e` back unless its home lies cyclically in (hole, i].
            let home = self.home(e.addr);
            let stays = if hole <= i {
                hole < home && home <= i
            } else {
                hole < home || home <= i
            };
            if !stays {
                self.entries[hole] = e;
                hole = i;
            }
        }
        self.entries[hole] = Entry::default();
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table against a map, through inserts and removes that collide.
    #[test]
    fn finds_what_was_inserted_after_removals() {
        let mut c = AddrTable::default();
        let mut want = std::collections::HashMap::new();
        let mut x: u64 = 7;
        for step in 0..20_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let addr = (((x >> 33) % 300) as usize + 1) * 16;
            if step % 3 == 0 {
                c.remove(addr);
                want.remove(&addr);
            } else {
                c.insert(addr, step);
                want.insert(addr, step);
            }
            assert_eq!(c.len, want.len());
        }
        for a in (1..=301).map(|k| k * 16) {
            assert_eq!(c.get_addr(a), want.get(&a).copied(), "addr {a}");
        }
    }

    /// Each hot call learns its successor; the prediction names it.
    #[test]
    fn a_hot_call_predicts_the_one_after_it_last_time() {
        let mut c = AddrTable::default();
        for (k, a) in [16usize, 32, 48].into_iter().enumerate() {
            c.insert(a, k as u64);
        }
        for a in [16, 32, 48] {
            c.get_hot(a);
        }
        let (h, next) = c.get_hot(16).unwrap();
        assert_eq!((h, next.map(|n| n.handle)), (0, Some(1)));
        let (_, next) = c.get_hot(32).unwrap();
        assert_eq!(next.map(|n| n.handle), Some(2));
    }
}

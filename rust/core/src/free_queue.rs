//! The free-block queue: an intrusive doubly linked list over block indices,
//! in vLLM's eviction order (front = evicted first). Removal from the middle
//! is O(1) and nothing is allocated on any operation.

use crate::BlockId;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct FreeQueue {
    // [prev, next] of block i side by side (one cache line per block
    // touched); the head sentinel is index n, the tail n + 1.
    links: Vec<[u32; 2]>,
    len: usize,
}

const PREV: usize = 0;
const NEXT: usize = 1;

impl FreeQueue {
    /// A queue holding blocks 0..n in ID order, as vLLM starts.
    pub fn new(n: u32) -> Self {
        let head = n;
        let tail = n + 1;
        let mut links = vec![[NIL, NIL]; n as usize + 2];
        let mut last = head;
        for b in 0..n {
            links[last as usize][NEXT] = b;
            links[b as usize][PREV] = last;
            last = b;
        }
        links[last as usize][NEXT] = tail;
        links[tail as usize][PREV] = last;
        FreeQueue {
            links,
            len: n as usize,
        }
    }

    fn head(&self) -> u32 {
        (self.links.len() - 2) as u32
    }

    fn tail(&self) -> u32 {
        (self.links.len() - 1) as u32
    }

    /// Up to `n` blocks from the front, in queue order.
    pub fn first(&self, n: usize) -> impl Iterator<Item = BlockId> + '_ {
        let mut at = self.head();
        let tail = self.tail();
        (0..n).map_while(move |_| {
            at = self.links[at as usize][NEXT];
            (at != tail).then_some(at)
        })
    }

    /// Where block `b`'s links live.
    pub fn link_addr(&self, b: BlockId) -> *const u8 {
        std::ptr::from_ref(&self.links[b as usize]).cast()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn contains(&self, b: BlockId) -> bool {
        self.links[b as usize][PREV] != NIL
    }

    fn unlink(&mut self, b: u32) {
        let [p, n] = self.links[b as usize];
        self.links[p as usize][NEXT] = n;
        self.links[n as usize][PREV] = p;
        self.links[b as usize] = [NIL, NIL];
        self.len -= 1;
    }

    fn link_after(&mut self, at: u32, b: u32) {
        let n = self.links[at as usize][NEXT];
        self.links[at as usize][NEXT] = b;
        self.links[b as usize] = [at, n];
        self.links[n as usize][PREV] = b;
        self.len += 1;
    }

    /// The front block, removed. `None` when empty.
    pub fn popleft(&mut self) -> Option<BlockId> {
        if self.len == 0 {
            return None;
        }
        let b = self.links[self.head() as usize][NEXT];
        self.unlink(b);
        Some(b)
    }

    /// Removes a block known to be in the queue. Returns false if it is not.
    pub fn remove(&mut self, b: BlockId) -> bool {
        if !self.contains(b) {
            return false;
        }
        self.unlink(b);
        true
    }

    /// Appends blocks at the back, in the order given.
    pub fn append(&mut self, b: BlockId) {
        let last = self.links[self.tail() as usize][PREV];
        self.link_after(last, b);
    }

    /// Puts blocks at the front, keeping their given order.
    pub fn prepend_n(&mut self, blocks: &[BlockId]) {
        let mut at = self.head();
        for &b in blocks {
            self.link_after(at, b);
            at = b;
        }
    }

    /// The front and back blocks (`None` when empty); reads only.
    pub fn ends(&self) -> Option<(BlockId, BlockId)> {
        if self.len == 0 {
            return None;
        }
        Some((
            self.links[self.head() as usize][NEXT],
            self.links[self.tail() as usize][PREV],
        ))
    }

    /// A queued block's (previous, next) neighbours, `None` standing for the
    /// head / tail sentinel; `None` overall if `b` is not queued. Reads only.
    pub fn neighbors(&self, b: BlockId) -> Option<(Option<BlockId>, Option<BlockId>)> {
        if (b as usize) >= self.links.len() - 2 || !self.contains(b) {
            return None;
        }
        let [p, n] = self.links[b as usize];
        Some((
            (p != self.head()).then_some(p),
            (n != self.tail()).then_some(n),
        ))
    }

    /// Iterates the queue front to back.
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let tail = self.tail();
        let mut cur = self.links[self.head() as usize][NEXT];
        std::iter::from_fn(move || {
            if cur == tail {
                None
            } else {
                let b = cur;
                cur = self.links[cur as usize][NEXT];
                Some(b)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(q: &FreeQueue) -> Vec<u32> {
        q.iter().collect()
    }

    #[test]
    fn starts_in_id_order_and_pops_front() {
        let mut q = FreeQueue::new(4);
        assert_eq!(order(&q), vec![0, 1, 2, 3]);
        assert_eq!(q.popleft(), Some(0));
        assert_eq!(q.len(), 3);
        assert!(!q.contains(0));
    }

    #[test]
    fn remove_from_middle_append_and_prepend() {
        let mut q = FreeQueue::new(5);
        assert!(q.remove(2));
        assert!(!q.remove(2));
        q.append(2);
        assert_eq!(order(&q), vec![0, 1, 3, 4, 2]);
        q.remove(0);
        q.remove(4);
        q.prepend_n(&[4, 0]);
        assert_eq!(order(&q), vec![4, 0, 1, 3, 2]);
        assert_eq!(q.len(), 5);
    }

    #[test]
    fn ends_and_neighbors() {
        let mut q = FreeQueue::new(3);
        assert_eq!(q.ends(), Some((0, 2)));
        assert_eq!(q.neighbors(0), Some((None, Some(1))));
        assert_eq!(q.neighbors(1), Some((Some(0), Some(2))));
        assert_eq!(q.neighbors(2), Some((Some(1), None)));
        q.remove(1);
        assert_eq!(q.neighbors(1), None);
        assert_eq!(q.neighbors(0), Some((None, Some(2))));
        assert_eq!(q.neighbors(7), None);
        q.remove(0);
        q.remove(2);
        assert_eq!(q.ends(), None);
    }

    #[test]
    fn empty_queue_pops_none() {
        let mut q = FreeQueue::new(1);
        assert_eq!(q.popleft(), Some(0));
        assert_eq!(q.popleft(), None);
        assert_eq!(q.len(), 0);
        q.append(0);
        assert_eq!(order(&q), vec![0]);
    }
}

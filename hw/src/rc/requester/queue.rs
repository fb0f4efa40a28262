//! The requester's send queue: a ring of entries that stay in place from post to
//! completion. A request is written straight into its entry ([`Requester::post_with`](super::Requester::post_with)) and
//! read there by the transmit path; nothing moves the (large) entries, and an entry's
//! buffers are reused, not cleared, by the next request that lands in it.
//!
//! Entries are created on first use, so a deep queue that is never filled costs only its
//! reserved capacity. The ring has a power-of-two number of positions (at least the
//! queue's capacity, which the model's SQ sizes always are), so a position is a mask.

use super::SendWqe;

/// A fixed-capacity FIFO of [`SendWqe`]s with in-place posting.
pub(super) struct SendQueue {
    /// The entries, `mask + 1` once every position has been used (fewer before).
    slots: Vec<SendWqe>,
    /// Ring positions minus 1 (a power of two minus 1).
    mask: usize,
    /// Most entries queued.
    cap: usize,
    /// Position of the oldest entry.
    head: usize,
    /// Entries queued.
    len: usize,
}

impl SendQueue {
    /// An empty queue of `cap` entries (at least 1).
    pub(super) fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        let ring = cap.next_power_of_two();
        Self {
            slots: Vec::with_capacity(ring),
            mask: ring - 1,
            cap,
            head: 0,
            len: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn is_full(&self) -> bool {
        self.len == self.cap
    }

    /// The ring position of the `i`-th entry from the front.
    fn pos(&self, i: usize) -> usize {
        (self.head + i) & self.mask
    }

    /// The entry after the last one, to be filled in place; it joins the queue only on
    /// [`push`](Self::push). `None` when the queue is full.
    pub(super) fn next_free(&mut self) -> Option<&mut SendWqe> {
        if self.is_full() {
            return None;
        }
        let p = self.pos(self.len);
        if p == self.slots.len() {
            // First use of this position (positions are first used in order).
            self.slots.push(SendWqe::new());
        }
        Some(&mut self.slots[p])
    }

    /// Appends the entry [`next_free`](Self::next_free) lent.
    pub(super) fn push(&mut self) {
        debug_assert!(!self.is_full() && self.pos(self.len) < self.slots.len());
        self.len += 1;
    }

    /// The oldest entry.
    pub(super) fn front(&self) -> Option<&SendWqe> {
        self.get(0)
    }

    /// Removes the oldest entry (its buffers stay for reuse).
    pub(super) fn pop_front(&mut self) {
        if self.len > 0 {
            self.head = self.pos(1);
            self.len -= 1;
        }
    }

    /// The `i`-th entry from the front.
    pub(super) fn get(&self, i: usize) -> Option<&SendWqe> {
        (i < self.len).then(|| &self.slots[self.pos(i)])
    }

    /// The `i`-th entry from the front, mutably.
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut SendWqe> {
        if i < self.len {
            let p = self.pos(i);
            Some(&mut self.slots[p])
        } else {
            None
        }
    }

    /// The entries, front first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &SendWqe> {
        let end = self.head + self.len;
        let ring = self.mask + 1;
        let (a, b) = if end > ring {
            (&self.slots[self.head..], &self.slots[..end - ring])
        } else {
            (&self.slots[self.head..end], &self.slots[..0])
        };
        a.iter().chain(b)
    }
}

impl std::ops::Index<usize> for SendQueue {
    type Output = SendWqe;
    fn index(&self, i: usize) -> &SendWqe {
        self.get(i).expect("send queue index in range")
    }
}

impl std::ops::IndexMut<usize> for SendQueue {
    fn index_mut(&mut self, i: usize) -> &mut SendWqe {
        self.get_mut(i).expect("send queue index in range")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(q: &SendQueue) -> Vec<u64> {
        q.iter().map(|w| w.wr.wr_id).collect()
    }

    fn post(q: &mut SendQueue, id: u64) -> bool {
        let Some(w) = q.next_free() else {
            return false;
        };
        w.wr.reset();
        w.wr.wr_id = id;
        q.push();
        true
    }

    #[test]
    fn ring_keeps_order_across_wraps_and_refuses_when_full() {
        let mut q = SendQueue::new(3);
        assert!(q.is_empty() && q.front().is_none());
        for id in 1..=3 {
            assert!(post(&mut q, id));
        }
        assert!(!post(&mut q, 4), "full");
        assert_eq!(ids(&q), [1, 2, 3]);
        q.pop_front();
        q.pop_front();
        assert!(post(&mut q, 4) && post(&mut q, 5));
        assert_eq!(ids(&q), [3, 4, 5]);
        assert_eq!(q[1].wr.wr_id, 4);
        assert_eq!(q.get(2).map(|w| w.wr.wr_id), Some(5));
        assert!(q.get(3).is_none());
        q.get_mut(2).unwrap().wr.wr_id = 6;
        assert_eq!(ids(&q), [3, 4, 6]);
        assert_eq!(q.slots.len(), 4, "entries are made once and reused");
        while !q.is_empty() {
            q.pop_front();
        }
        q.pop_front(); // nothing to pop: no effect
        assert_eq!(q.len(), 0);
        assert!(post(&mut q, 7));
        assert_eq!(ids(&q), [7]);
    }

    #[test]
    fn a_posted_slot_reuses_its_buffers_without_stale_data() {
        let mut q = SendQueue::new(1);
        let w = q.next_free().unwrap();
        w.wr.reset();
        w.wr.push_inline(b"abcdef").unwrap();
        q.push();
        q.pop_front();
        let w = q.next_free().unwrap();
        w.wr.reset();
        w.wr.push_inline(b"xy").unwrap();
        assert_eq!(w.wr.len(), 2);
        assert!(matches!(
            w.wr.local(),
            crate::rc::types::LocalRef::Inline(b"xy")
        ));
    }
}

//! A table of model objects indexed directly by their number (QPN, CQN), and the allocator
//! of those numbers.
//!
//! The model hands out QPNs and CQNs lowest-free first ([`IdAlloc`]), so the numbers
//! in use are small and dense: a slot per number finds an object with one bounds check
//! and one load, where a map walks a tree on every doorbell and every received frame.
//! Slots past the highest number in use are dropped, so a walk over the table visits at
//! most as many slots as the highest number in use.

use std::collections::BTreeSet;

/// Objects by number; slot `n` holds the object numbered `n`.
pub(crate) struct Table<T> {
    slots: Vec<Option<T>>,
    len: usize,
}

impl<T> Default for Table<T> {
    fn default() -> Table<T> {
        Table {
            slots: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Table<T> {
    /// The object numbered `n`.
    #[inline]
    pub(crate) fn get(&self, n: u32) -> Option<&T> {
        self.slots.get(n as usize)?.as_ref()
    }

    /// The object numbered `n`, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, n: u32) -> Option<&mut T> {
        self.slots.get_mut(n as usize)?.as_mut()
    }

    /// Whether an object is numbered `n`.
    pub(crate) fn contains(&self, n: u32) -> bool {
        self.get(n).is_some()
    }

    /// Puts `v` at `n`, returning the object it replaces.
    pub(crate) fn insert(&mut self, n: u32, v: T) -> Option<T> {
        let i = n as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        let old = self.slots[i].replace(v);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Takes the object numbered `n` out.
    pub(crate) fn remove(&mut self, n: u32) -> Option<T> {
        let old = self.slots.get_mut(n as usize)?.take();
        if old.is_some() {
            self.len -= 1;
            while matches!(self.slots.last(), Some(None)) {
                self.slots.pop();
            }
        }
        old
    }

    /// Number of objects.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The objects, by increasing number.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(Option::as_ref)
    }

    /// The objects, mutably, by increasing number.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(Option::as_mut)
    }
}

/// Allocator of small resource numbers: the lowest free number in `[min, end)`.
#[derive(Debug)]
pub(crate) struct IdAlloc {
    min: u32,
    end: u32,
    used: BTreeSet<u32>,
}

impl IdAlloc {
    pub(crate) fn new(min: u32, end: u32) -> IdAlloc {
        IdAlloc {
            min,
            end,
            used: BTreeSet::new(),
        }
    }

    /// Takes the lowest free number, or `None` when all are used.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let mut want = self.min;
        for &u in self.used.range(self.min..) {
            if u != want {
                break;
            }
            want += 1;
        }
        (want < self.end).then(|| {
            self.used.insert(want);
            want
        })
    }

    /// Frees `id`; false if it was not allocated.
    pub(crate) fn free(&mut self, id: u32) -> bool {
        self.used.remove(&id)
    }

    /// Whether `id` is allocated.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.used.contains(&id)
    }

    /// Number allocated.
    pub(crate) fn len(&self) -> usize {
        self.used.len()
    }

    /// The allocated numbers.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.used.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::{IdAlloc, Table};

    #[test]
    fn id_alloc_reuses_the_lowest_free() {
        let mut a = IdAlloc::new(3, 6);
        assert_eq!(
            (a.alloc(), a.alloc(), a.alloc(), a.alloc()),
            (Some(3), Some(4), Some(5), None)
        );
        assert!(a.free(4));
        assert!(!a.free(4));
        assert_eq!(a.alloc(), Some(4));
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn holes_are_skipped_and_the_tail_is_trimmed() {
        let mut t = Table::default();
        assert!(t.is_empty());
        for n in [1, 2, 3, 5] {
            assert!(t.insert(n, n * 10).is_none());
        }
        assert_eq!(t.insert(3, 31), Some(30));
        assert_eq!(t.len(), 4);
        assert_eq!(t.remove(2), Some(20));
        assert_eq!(t.remove(2), None);
        assert_eq!(t.remove(9), None);
        assert_eq!((t.get(2), t.get(3), t.get(5)), (None, Some(&31), Some(&50)));
        assert!(!t.contains(0) && t.contains(1));
        assert_eq!(t.values().copied().collect::<Vec<_>>(), [10, 31, 50]);
        assert_eq!(t.remove(5), Some(50));
        // The slots past the highest number in use are gone.
        assert_eq!(t.slots.len(), 4);
        for v in t.values_mut() {
            *v += 1;
        }
        assert_eq!(t.values().copied().collect::<Vec<_>>(), [11, 32]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(u32::MAX), None);
    }
}

//! A table of model objects indexed directly by their number (QPN, CQN), and the allocator
//! of those numbers.
//!
//! A slot per number finds an object with two bounds checks and two loads (its place, then
//! the object), where a map walks a tree on every doorbell and every received frame. The
//! objects themselves are kept together, by increasing number, so a walk over the table
//! (every device pass walks the QPs) visits only the objects: numbers need not be small.
//! A port on a real network starts its QPNs anywhere up to 2^15 (`run_first_qpn`), and a
//! walk over a slot per number then read up to 32,768 empty slots of a large `Qp`, twice a
//! pass: tens of µs to milliseconds per pass, the whole of a write_lat half round trip
//! over the port (docs/performance.md, "Where a write_lat round trip's time goes").

use std::collections::BTreeSet;

/// `Table::pos` of a number with no object.
const NONE: u32 = u32::MAX;

/// Objects by number.
pub(crate) struct Table<T> {
    /// The objects, by increasing number.
    items: Vec<T>,
    /// The number of each of `items`.
    nums: Vec<u32>,
    /// Where the object numbered `n` is in `items` (`NONE`: none); no entries past the
    /// highest number in use.
    pos: Vec<u32>,
}

impl<T> Default for Table<T> {
    fn default() -> Table<T> {
        Table {
            items: Vec::new(),
            nums: Vec::new(),
            pos: Vec::new(),
        }
    }
}

impl<T> Table<T> {
    /// The object numbered `n`.
    #[inline]
    pub(crate) fn get(&self, n: u32) -> Option<&T> {
        self.items.get(*self.pos.get(n as usize)? as usize)
    }

    /// The object numbered `n`, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, n: u32) -> Option<&mut T> {
        self.items.get_mut(*self.pos.get(n as usize)? as usize)
    }

    /// Whether an object is numbered `n`.
    pub(crate) fn contains(&self, n: u32) -> bool {
        self.get(n).is_some()
    }

    /// Points `pos` at `items[from..]` again (after an insertion or removal there).
    fn reindex(&mut self, from: usize) {
        for (i, &n) in self.nums.iter().enumerate().skip(from) {
            self.pos[n as usize] = i as u32;
        }
    }

    /// Puts `v` at `n`, returning the object it replaces.
    pub(crate) fn insert(&mut self, n: u32, v: T) -> Option<T> {
        if let Some(old) = self.get_mut(n) {
            return Some(std::mem::replace(old, v));
        }
        let i = n as usize;
        if self.pos.len() <= i {
            self.pos.resize(i + 1, NONE);
        }
        let at = self.nums.partition_point(|&m| m < n);
        self.items.insert(at, v);
        self.nums.insert(at, n);
        self.reindex(at);
        None
    }

    /// Takes the object numbered `n` out.
    pub(crate) fn remove(&mut self, n: u32) -> Option<T> {
        let at = *self.pos.get(n as usize)?;
        if at == NONE {
            return None;
        }
        let old = self.items.remove(at as usize);
        self.nums.remove(at as usize);
        self.pos[n as usize] = NONE;
        self.reindex(at as usize);
        while self.pos.last() == Some(&NONE) {
            self.pos.pop();
        }
        Some(old)
    }

    /// Number of objects.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the table holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The objects, by increasing number.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    /// The objects, mutably, by increasing number.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.items.iter_mut()
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
        // The places past the highest number in use are gone.
        assert_eq!(t.pos.len(), 4);
        for v in t.values_mut() {
            *v += 1;
        }
        assert_eq!(t.values().copied().collect::<Vec<_>>(), [11, 32]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(u32::MAX), None);
    }

    #[test]
    fn a_walk_visits_the_objects_only_in_number_order_however_high_the_numbers() {
        let mut t = Table::default();
        for n in [30_000u32, 7, 19_999, 8] {
            assert!(t.insert(n, n).is_none());
        }
        assert_eq!(
            t.values().copied().collect::<Vec<_>>(),
            [7, 8, 19_999, 30_000]
        );
        assert_eq!(t.items.len(), 4, "one entry per object, not per number");
        assert_eq!(t.remove(8), Some(8));
        assert_eq!(t.insert(5, 5), None);
        assert_eq!(
            t.values().copied().collect::<Vec<_>>(),
            [5, 7, 19_999, 30_000]
        );
        for n in [5, 7, 19_999, 30_000] {
            assert_eq!(t.get(n), Some(&n));
        }
        assert_eq!((t.get(8), t.get(6), t.get(29_999)), (None, None, None));
        assert_eq!(t.remove(30_000), Some(30_000));
        assert_eq!(t.pos.len(), 20_000);
        assert_eq!(
            t.get_mut(19_999).map(|v| std::mem::replace(v, 1)),
            Some(19_999)
        );
        assert_eq!(t.values().copied().collect::<Vec<_>>(), [5, 7, 1]);
    }
}

//! IOVA allocation inside the ranges the IOMMU accepts.

use std::collections::BTreeMap;

use super::DmaError;
use crate::pci::{Iova, IovaRange};

/// First-fit allocator of device addresses, with coalescing frees.
///
/// Address 0 is never handed out (a zero IOVA reads as "no mailbox" in command entries).
/// Free ranges are kept by their inclusive last address, as the kernel reports ranges: a
/// range may end at `u64::MAX` (an aperture with no top), whose exclusive end does not fit
/// a u64.
#[derive(Debug, Default)]
pub struct IovaAllocator {
    /// Free ranges: start -> last address (inclusive).
    free: BTreeMap<u64, u64>,
    in_use: u64,
}

impl IovaAllocator {
    /// An allocator over `ranges` (inclusive bounds, as the kernel reports them).
    pub fn new(ranges: &[IovaRange]) -> IovaAllocator {
        let mut a = IovaAllocator::default();
        for r in ranges {
            // Page 0 stays unused although IOMMUs (and the model) map it: a null IOVA is
            // then always a bug that faults, never a buffer. (rdma-core's mlx5_vfio does
            // hand out IOVA 0; firmware-behaviour.md §DMA.)
            let start = r.start.max(0x1000);
            if r.end >= start {
                a.insert(start, r.end);
            }
        }
        a
    }

    /// Allocates `len` bytes aligned to `align` (power of two).
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<Iova, DmaError> {
        let align = align.max(1);
        assert!(
            align.is_power_of_two(),
            "IOVA alignment {align:#x} is not a power of two"
        );
        if len == 0 {
            return Err(DmaError::Empty);
        }
        let found = self.free.iter().find_map(|(&start, &last)| {
            let a = start.checked_add(align - 1)? & !(align - 1);
            let a_last = a.checked_add(len - 1)?;
            (a_last <= last).then_some((start, last, a, a_last))
        });
        let Some((start, last, a, a_last)) = found else {
            return Err(DmaError::IovaExhausted { len, align });
        };
        self.free.remove(&start);
        if a > start {
            self.free.insert(start, a - 1);
        }
        if a_last < last {
            self.free.insert(a_last + 1, last);
        }
        self.in_use += len;
        Ok(Iova(a))
    }

    /// Returns `[iova, iova + len)` to the free space.
    pub fn free(&mut self, iova: Iova, len: u64) {
        if len == 0 {
            return;
        }
        self.in_use = self.in_use.saturating_sub(len);
        self.insert(iova.0, iova.0.saturating_add(len - 1));
    }

    /// Bytes currently allocated.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Adds `[start, last]` to the free ranges, merged with its neighbours.
    fn insert(&mut self, mut start: u64, mut last: u64) {
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            debug_assert!(pl < start, "IOVA range freed twice");
            if pl + 1 == start {
                self.free.remove(&ps);
                start = ps;
            }
        }
        if last < u64::MAX
            && let Some(nl) = self.free.remove(&(last + 1))
        {
            last = nl;
        }
        self.free.insert(start, last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_aligned_and_coalesces() {
        let mut a = IovaAllocator::new(&[IovaRange {
            start: 0,
            end: (1 << 32) - 1,
        }]);
        let x = a.alloc(0x3000, 0x1000).unwrap();
        assert_eq!(x, Iova(0x1000));
        let y = a.alloc(0x1000, 0x10_0000).unwrap();
        assert_eq!(y.0 % 0x10_0000, 0);
        assert_eq!(a.in_use(), 0x4000);
        a.free(x, 0x3000);
        a.free(y, 0x1000);
        assert_eq!(a.in_use(), 0);
        assert_eq!(a.free.len(), 1, "everything coalesced back into one range");
    }

    #[test]
    fn respects_holes_and_exhaustion() {
        let mut a = IovaAllocator::new(&[
            IovaRange {
                start: 0x1000,
                end: 0x1fff,
            },
            IovaRange {
                start: 0x10000,
                end: 0x1ffff,
            },
        ]);
        assert!(matches!(a.alloc(0x2000, 0x1000), Ok(Iova(0x10000))));
        assert!(matches!(a.alloc(0x1000, 0x1000), Ok(Iova(0x1000))));
        assert!(matches!(
            a.alloc(0x10000, 0x1000),
            Err(DmaError::IovaExhausted { .. })
        ));
        assert!(matches!(a.alloc(0, 1), Err(DmaError::Empty)));
    }
}

#[cfg(test)]
mod random {
    use super::*;

    /// Random allocations (sizes up to 1 GiB, alignments up to 1 GiB) and frees over ranges
    /// that include one ending at the top of the address space: allocations never overlap,
    /// stay in the ranges, keep their alignment and never start at 0; freeing everything
    /// leaves the ranges as they were. Fixed-seed xorshift.
    #[test]
    fn random_allocations_stay_apart_in_range_and_aligned() {
        let ranges = [
            IovaRange {
                start: 0,
                end: 0xFEDF_FFFF,
            },
            IovaRange {
                start: 0xFEF0_0000,
                end: u64::MAX,
            },
        ];
        let mut a = IovaAllocator::new(&ranges);
        let before = a.free.clone();
        let mut rng = uhca_hw::rng::XorShift64::new(0x10A_5EED_u64);
        let mut next = move || rng.next();
        let mut live: Vec<(u64, u64)> = Vec::new();
        for _ in 0..20_000 {
            if live.len() < 64 && next() % 3 != 0 {
                let len = 1 + next() % (1 << (next() % 31));
                let align = 1u64 << (next() % 31);
                let Ok(Iova(at)) = a.alloc(len, align) else {
                    continue;
                };
                assert!(at != 0 && at.is_multiple_of(align), "{at:#x} {align:#x}");
                let end = at.checked_add(len - 1).expect("in the address space");
                assert!(
                    ranges.iter().any(|r| r.start <= at && end <= r.end),
                    "{at:#x}+{len:#x} outside the ranges"
                );
                assert!(
                    live.iter().all(|&(s, l)| end < s || at >= s + l),
                    "{at:#x}+{len:#x} overlaps"
                );
                live.push((at, len));
            } else if !live.is_empty() {
                let (s, l) = live.swap_remove((next() % live.len() as u64) as usize);
                a.free(Iova(s), l);
            }
        }
        for (s, l) in live.drain(..) {
            a.free(Iova(s), l);
        }
        assert_eq!(a.in_use(), 0);
        assert_eq!(a.free, before, "everything coalesced back");
    }
}

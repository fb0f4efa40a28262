//! IOVA allocation inside the ranges the IOMMU accepts.

use std::collections::BTreeMap;

use super::DmaError;
use crate::pci::{Iova, IovaRange};

/// First-fit allocator of device addresses, with coalescing frees.
///
/// Address 0 is never handed out (a zero IOVA reads as "no mailbox" in command entries).
#[derive(Debug, Default)]
pub struct IovaAllocator {
    /// Free ranges: start -> length.
    free: BTreeMap<u64, u64>,
    in_use: u64,
}

impl IovaAllocator {
    /// An allocator over `ranges` (inclusive bounds, as the kernel reports them).
    pub fn new(ranges: &[IovaRange]) -> IovaAllocator {
        let mut a = IovaAllocator::default();
        for r in ranges {
            let start = r.start.max(0x1000);
            if r.end >= start {
                let len = (r.end - start).saturating_add(1);
                a.insert(start, len);
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
        let found = self.free.iter().find_map(|(&start, &flen)| {
            let a = start.checked_add(align - 1)? & !(align - 1);
            let end = a.checked_add(len)?;
            (end <= start + flen).then_some((start, flen, a))
        });
        let Some((start, flen, a)) = found else {
            return Err(DmaError::IovaExhausted { len, align });
        };
        self.free.remove(&start);
        if a > start {
            self.free.insert(start, a - start);
        }
        let tail = start + flen - (a + len);
        if tail > 0 {
            self.free.insert(a + len, tail);
        }
        self.in_use += len;
        Ok(Iova(a))
    }

    /// Returns `[iova, iova + len)` to the free space.
    pub fn free(&mut self, iova: Iova, len: u64) {
        self.in_use = self.in_use.saturating_sub(len);
        self.insert(iova.0, len);
    }

    /// Bytes currently allocated.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    fn insert(&mut self, mut start: u64, mut len: u64) {
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "IOVA range freed twice");
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nl;
        }
        self.free.insert(start, len);
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

//! On-device memory (MEMIC, prm-subset.md §8.3, §11): allocations inside the MEMIC window
//! of BAR0.
//!
//! The window is `[MEMIC_OFFSET, MEMIC_OFFSET + memic_size)` of BAR0, reported as
//! `memic_bar_start_addr` / `memic_bar_size` / `max_memic_size`. ALLOC_MEMIC picks the
//! lowest address inside the requested range that is aligned to
//! `64 << log_memic_addr_alignment` and free for `memic_size` bytes (a multiple of 64);
//! addresses are BAR0 offsets. Freshly allocated device memory reads as zeros. Host
//! loads/stores reach it through the BAR mapping; the data path through MEMIC MKeys
//! (`mkey.rs`).

use std::collections::BTreeMap;

/// Allocation granularity (`MLX5_MEMIC_BASE_SIZE`, §11).
pub(crate) const MEMIC_BASE: u64 = 64;

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocError {
    /// `memic_size` is 0 or not a multiple of 64.
    BadSize,
    /// `log_memic_addr_alignment` above the capability.
    BadAlignment,
    /// The range is not inside the window, or smaller than the size.
    BadRange,
    /// No free, aligned space in the range.
    NoSpace,
}

/// The MEMIC window's allocations.
pub(crate) struct Memic {
    base: u64,
    size: u64,
    max_log_align: u32,
    /// start -> size.
    allocs: BTreeMap<u64, u64>,
}

impl Memic {
    pub(crate) fn new(base: u64, size: u64, max_log_align: u32) -> Memic {
        Memic {
            base,
            size,
            max_log_align,
            allocs: BTreeMap::new(),
        }
    }

    /// Bytes allocated.
    pub(crate) fn allocated(&self) -> u64 {
        self.allocs.values().sum()
    }

    /// ALLOC_MEMIC: `size` bytes inside `[range_start, range_start + range_size)`, aligned
    /// to `64 << log_align`. Returns the BAR0 offset.
    pub(crate) fn alloc(
        &mut self,
        range_start: u64,
        range_size: u64,
        size: u64,
        log_align: u32,
    ) -> Result<u64, AllocError> {
        if size == 0 || !size.is_multiple_of(MEMIC_BASE) {
            return Err(AllocError::BadSize);
        }
        if log_align > self.max_log_align {
            return Err(AllocError::BadAlignment);
        }
        let range_end = range_start
            .checked_add(range_size)
            .ok_or(AllocError::BadRange)?;
        if range_start < self.base || range_end > self.base + self.size || range_size < size {
            return Err(AllocError::BadRange);
        }
        let align = MEMIC_BASE << log_align;
        let mut cand = range_start.next_multiple_of(align);
        // Allocations are sorted: step past each one that overlaps the candidate.
        for (&s, &l) in self.allocs.range(..range_end) {
            if s + l <= cand {
                continue;
            }
            if cand + size <= s {
                break;
            }
            cand = (s + l).next_multiple_of(align);
        }
        if cand + size > range_end {
            return Err(AllocError::NoSpace);
        }
        self.allocs.insert(cand, size);
        Ok(cand)
    }

    /// DEALLOC_MEMIC of exactly an allocation; false if `(start, size)` is not one.
    pub(crate) fn free(&mut self, start: u64, size: u64) -> bool {
        if self.allocs.get(&start) != Some(&size) {
            return false;
        }
        self.allocs.remove(&start);
        true
    }

    /// Whether `[start, start + len)` lies inside one allocation.
    pub(crate) fn covers(&self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        self.allocs
            .range(..=start)
            .next_back()
            .is_some_and(|(&s, &l)| start >= s && end <= s + l)
    }

    /// Whether the allocation at `start` exists.
    pub(crate) fn contains(&self, start: u64) -> bool {
        self.allocs.contains_key(&start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x100_0000;

    #[test]
    fn allocates_aligned_first_fit_and_frees() {
        let mut m = Memic::new(BASE, 0x4000, 12);
        assert_eq!(m.alloc(BASE, 0x4000, 64, 0), Ok(BASE));
        assert_eq!(m.alloc(BASE, 0x4000, 128, 0), Ok(BASE + 64));
        // 4 KiB alignment (64 << 6) skips past the two small allocations.
        assert_eq!(m.alloc(BASE, 0x4000, 64, 6), Ok(BASE + 0x1000));
        assert_eq!(m.allocated(), 256);
        assert!(m.covers(BASE + 64, 128));
        assert!(!m.covers(BASE + 64, 129));
        assert!(!m.free(BASE + 64, 64), "size must match");
        assert!(m.free(BASE + 64, 128));
        assert_eq!(m.alloc(BASE, 0x4000, 64, 0), Ok(BASE + 64), "hole reused");
    }

    #[test]
    fn refuses_bad_requests_and_exhausts() {
        let mut m = Memic::new(BASE, 0x1000, 12);
        assert_eq!(m.alloc(BASE, 0x1000, 0, 0), Err(AllocError::BadSize));
        assert_eq!(m.alloc(BASE, 0x1000, 100, 0), Err(AllocError::BadSize));
        assert_eq!(m.alloc(BASE, 0x1000, 64, 13), Err(AllocError::BadAlignment));
        assert_eq!(m.alloc(BASE - 64, 0x1000, 64, 0), Err(AllocError::BadRange));
        assert_eq!(m.alloc(BASE, 0x2000, 64, 0), Err(AllocError::BadRange));
        assert_eq!(m.alloc(BASE, 0x1000, 0x1000, 0), Ok(BASE));
        assert_eq!(m.alloc(BASE, 0x1000, 64, 0), Err(AllocError::NoSpace));
    }
}

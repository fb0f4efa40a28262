//! IOVA bookkeeping shared by every VFIO mode: the usable ranges the kernel reported, the
//! mappings made, the checks a new mapping must pass, and the memlock budget.
//!
//! All of it is plain logic on numbers, tested with synthetic ranges.

use std::collections::BTreeMap;

use crate::pci::IovaRange;

use super::VfioError;

/// Lowest page size in a page-size bitmap (`iova_pgsizes`), 4 KiB if the bitmap is empty.
pub fn min_page(pgsizes: u64) -> u64 {
    if pgsizes == 0 {
        4096
    } else {
        1 << pgsizes.trailing_zeros()
    }
}

/// The DMA mappings of one function: IOVA → (length, host address).
#[derive(Debug, Default)]
pub struct MapTable {
    maps: BTreeMap<u64, (u64, usize)>,
    bytes: u64,
}

impl MapTable {
    /// Bytes mapped in total.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// Number of mappings.
    pub fn len(&self) -> usize {
        self.maps.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Why `[iova, iova + len)` cannot be mapped, if it cannot: alignment to `page`, inside
    /// one usable range, no overlap with an existing mapping, `limit` mappings at most.
    pub fn check(
        &self,
        ranges: &[IovaRange],
        page: u64,
        iova: u64,
        len: u64,
        vaddr: usize,
        limit: Option<u32>,
    ) -> Result<(), &'static str> {
        if len == 0 {
            return Err("empty mapping");
        }
        if !iova.is_multiple_of(page)
            || !len.is_multiple_of(page)
            || !(vaddr as u64).is_multiple_of(page)
        {
            return Err("IOVA, length and address must be multiples of the IOMMU page size");
        }
        let last = iova.checked_add(len - 1).ok_or("IOVA range wraps around")?;
        if !ranges.iter().any(|r| r.start <= iova && last <= r.end) {
            return Err("outside the usable IOVA ranges the kernel reported");
        }
        if let Some((&s, &(l, _))) = self.maps.range(..=last).next_back()
            && s + l > iova
        {
            return Err("overlaps an existing mapping");
        }
        if limit.is_some_and(|n| self.maps.len() as u64 >= n as u64) {
            return Err(
                "the type1 DMA mapping limit (vfio_iommu_type1 dma_entry_limit) is reached",
            );
        }
        Ok(())
    }

    /// Records a mapping (after [`check`](Self::check) and the kernel accepted it).
    pub fn insert(&mut self, iova: u64, len: u64, vaddr: usize) {
        self.maps.insert(iova, (len, vaddr));
        self.bytes += len;
    }

    /// Whether exactly `[iova, iova + len)` is one recorded mapping.
    pub fn contains_exact(&self, iova: u64, len: u64) -> bool {
        self.maps.get(&iova).is_some_and(|&(l, _)| l == len)
    }

    /// Forgets the mapping at `iova`.
    pub fn remove(&mut self, iova: u64) {
        if let Some((l, _)) = self.maps.remove(&iova) {
            self.bytes -= l;
        }
    }

    /// All mappings, `(iova, len)`.
    pub fn all(&self) -> Vec<(u64, u64)> {
        self.maps.iter().map(|(&i, &(l, _))| (i, l)).collect()
    }
}

/// Turns kernel `(start, last)` pairs into sorted [`IovaRange`]s, refusing overlaps.
pub fn to_ranges(pairs: &[(u64, u64)]) -> Result<Vec<IovaRange>, VfioError> {
    let mut v: Vec<IovaRange> = pairs
        .iter()
        .map(|&(start, end)| IovaRange { start, end })
        .collect();
    v.sort_by_key(|r| r.start);
    if v.windows(2).any(|w| w[1].start <= w[0].end) || v.iter().any(|r| r.end < r.start) {
        return Err(VfioError::Malformed {
            what: "IOVA ranges",
            why: "ranges overlap or are inverted",
        });
    }
    Ok(v)
}

/// Checks that pinning `more` bytes on top of `pinned` stays within the memlock `limit`
/// (`None` = unlimited). With CAP_IPC_LOCK the kernel does not count pinned pages.
pub fn check_memlock(
    pinned: u64,
    more: u64,
    limit: Option<u64>,
    cap_ipc_lock: bool,
) -> Result<(), VfioError> {
    let need = pinned.saturating_add(more);
    match limit {
        Some(limit) if !cap_ipc_lock && need > limit => Err(VfioError::Memlock {
            need,
            limit,
            short: need - limit,
            kib: need.div_ceil(1024),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges() -> Vec<IovaRange> {
        to_ranges(&[(0xfef0_0000, (1 << 48) - 1), (0, 0xfedf_ffff)]).unwrap()
    }

    #[test]
    fn ranges_sorted_and_overlaps_refused() {
        let r = ranges();
        assert_eq!(
            r[0],
            IovaRange {
                start: 0,
                end: 0xfedf_ffff
            }
        );
        assert!(to_ranges(&[(0, 0x2000), (0x1000, 0x3000)]).is_err());
        assert!(to_ranges(&[(5, 4)]).is_err());
    }

    #[test]
    fn map_checks() {
        let r = ranges();
        let mut t = MapTable::default();
        assert_eq!(
            t.check(&r, 4096, 0x10_0000, 0x20_0000, 0x7f00_0000_0000, None),
            Ok(())
        );
        t.insert(0x10_0000, 0x20_0000, 0x7f00_0000_0000);
        // Overlap from below, inside, and above.
        assert!(t.check(&r, 4096, 0x0, 0x10_1000, 0, None).is_err());
        assert!(t.check(&r, 4096, 0x20_0000, 0x1000, 0, None).is_err());
        assert_eq!(t.check(&r, 4096, 0x30_0000, 0x1000, 0, None), Ok(()));
        // Misaligned.
        assert!(t.check(&r, 4096, 0x30_0800, 0x1000, 0, None).is_err());
        assert!(t.check(&r, 0x20_0000, 0x40_0000, 0x1000, 0, None).is_err());
        // The MSI window hole and beyond the address width.
        assert!(t.check(&r, 4096, 0xfee0_0000, 0x1000, 0, None).is_err());
        assert!(t.check(&r, 4096, 0xfedf_f000, 0x2000, 0, None).is_err());
        assert!(t.check(&r, 4096, 1 << 48, 0x1000, 0, None).is_err());
        assert!(
            t.check(&r, 4096, u64::MAX - 0xfff, 0x2000, 0, None)
                .is_err()
        );
        assert!(t.check(&r, 4096, 0x30_0000, 0, 0, None).is_err());
        // Mapping limit.
        assert!(t.check(&r, 4096, 0x30_0000, 0x1000, 0, Some(1)).is_err());
        assert!(t.contains_exact(0x10_0000, 0x20_0000));
        assert!(!t.contains_exact(0x10_0000, 0x1000));
        assert_eq!(t.bytes(), 0x20_0000);
        t.remove(0x10_0000);
        assert_eq!((t.bytes(), t.len()), (0, 0));
    }

    #[test]
    fn memlock_message_says_how_much() {
        assert!(check_memlock(0, 8 << 20, Some(8 << 20), false).is_ok());
        assert!(check_memlock(4 << 20, 1 << 30, None, false).is_ok());
        assert!(check_memlock(4 << 20, 1 << 30, Some(8 << 20), true).is_ok());
        let e = check_memlock(4 << 20, 8 << 20, Some(8 << 20), false).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("raise the memlock limit by 4194304 bytes"),
            "{msg}"
        );
        assert!(msg.contains("ulimit -l 12288"), "{msg}");
    }

    #[test]
    fn min_page_of_bitmap() {
        assert_eq!(min_page(0x4020_1000), 4096);
        assert_eq!(min_page(0x20_0000), 0x20_0000);
        assert_eq!(min_page(0), 4096);
    }
}

//! A ring of fixed-size entries inside a [`DmaRegion`], accessed by whole 8-byte words: the
//! data path's send queue, receive queue and CQE ring.
//!
//! Bounds and alignment are checked once, at construction; afterwards an access names an
//! entry by a free-running counter (masked to the ring) and a word inside the entry, so it
//! is in bounds by construction and costs one AND, one shift and the volatile load or
//! store. (A [`DmaSlice`](super::DmaSlice) access checks its range on every call.)

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::DmaRegion;

/// `2^log` entries of `WORDS` 8-byte words at an 8-byte aligned offset of a region. The
/// ring keeps its region alive.
pub struct DmaRing<const WORDS: usize> {
    base: NonNull<u64>,
    mask: u32,
    region: Arc<DmaRegion>,
}

// SAFETY: the ring only holds a pointer into its own region (kept alive by the `Arc`) and
// accesses it with volatile loads and stores, never through Rust references, like
// `DmaRegion` itself.
unsafe impl<const WORDS: usize> Send for DmaRing<WORDS> {}
// SAFETY: as for Send.
unsafe impl<const WORDS: usize> Sync for DmaRing<WORDS> {}

impl<const WORDS: usize> std::fmt::Debug for DmaRing<WORDS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaRing")
            .field("iova", &self.region.iova())
            .field("entries", &(self.mask + 1))
            .field("entry_bytes", &(WORDS * 8))
            .finish()
    }
}

impl<const WORDS: usize> DmaRing<WORDS> {
    /// Bytes per entry.
    pub const ENTRY_BYTES: usize = WORDS * 8;

    /// The ring of `2^log` entries at byte `off` of `region`, or `None` if it does not fit
    /// in the region, `off` is not 8-byte aligned, or `WORDS` is not a power of two.
    pub fn new(region: Arc<DmaRegion>, off: usize, log: u32) -> Option<DmaRing<WORDS>> {
        let addr = (region.as_ptr() as usize).checked_add(off)?;
        if !WORDS.is_power_of_two() || log >= 32 || !addr.is_multiple_of(8) {
            return None;
        }
        let bytes = Self::ENTRY_BYTES.checked_mul(1usize.checked_shl(log)?)?;
        if off.checked_add(bytes)? > region.len() {
            return None;
        }
        let base = NonNull::new(region.as_ptr().wrapping_add(off).cast::<u64>())?;
        Some(DmaRing {
            base,
            mask: (1u32 << log) - 1,
            region,
        })
    }

    /// The region the ring lives in.
    pub fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }

    /// Number of entries.
    pub fn entries(&self) -> u32 {
        self.mask + 1
    }

    /// Entry `counter mod entries`: compute its address once, then access its words.
    #[inline(always)]
    pub fn entry(&self, counter: u32) -> DmaEntry<'_, WORDS> {
        // SAFETY: (counter & mask) < entries, and `new` checked that entries × WORDS words
        // from `base` lie in the region.
        let ptr = unsafe { self.base.add((counter & self.mask) as usize * WORDS) };
        DmaEntry {
            ptr,
            _ring: PhantomData,
        }
    }

    /// Stores `v` (bytes in memory order) into word `word` of entry `counter mod entries`.
    #[inline(always)]
    pub fn store(&self, counter: u32, word: usize, v: u64) {
        self.entry(counter).store(word, v)
    }

    /// Loads word `word` of entry `counter mod entries` (bytes in memory order).
    #[inline(always)]
    pub fn load(&self, counter: u32, word: usize) -> u64 {
        self.entry(counter).load(word)
    }

    /// The ring's address and size by value, for a loop that should keep them in
    /// registers while it stores to memory.
    #[inline(always)]
    pub fn view(&self) -> DmaRingView<'_, WORDS> {
        DmaRingView {
            base: self.base,
            mask: self.mask,
            _ring: PhantomData,
        }
    }
}

/// A borrowed copy of a [`DmaRing`]'s address and size.
#[derive(Clone, Copy, Debug)]
pub struct DmaRingView<'a, const WORDS: usize> {
    base: NonNull<u64>,
    mask: u32,
    _ring: PhantomData<&'a DmaRing<WORDS>>,
}

impl<'a, const WORDS: usize> DmaRingView<'a, WORDS> {
    /// The slot (entry number) of free-running counter `counter`.
    #[inline(always)]
    pub fn slot(self, counter: u32) -> u32 {
        counter & self.mask
    }

    /// The parity (0 or 1) of the pass around the ring that counter `counter` is on:
    /// `counter / entries` modulo 2 (what a CQE's owner bit is compared with).
    #[inline(always)]
    pub fn pass_parity(self, counter: u32) -> u32 {
        u32::from(counter & self.mask.wrapping_add(1) != 0)
    }

    /// Entry `counter mod entries` (as [`DmaRing::entry`]).
    #[inline(always)]
    pub fn entry(self, counter: u32) -> DmaEntry<'a, WORDS> {
        // SAFETY: as in `DmaRing::entry`; the view borrows the ring, so the region lives.
        let ptr = unsafe { self.base.add((counter & self.mask) as usize * WORDS) };
        DmaEntry {
            ptr,
            _ring: PhantomData,
        }
    }
}

/// One entry of a [`DmaRing`]: `WORDS` 8-byte words of device-shared memory.
#[derive(Clone, Copy, Debug)]
pub struct DmaEntry<'a, const WORDS: usize> {
    ptr: NonNull<u64>,
    _ring: PhantomData<&'a DmaRing<WORDS>>,
}

impl<const WORDS: usize> DmaEntry<'_, WORDS> {
    #[inline(always)]
    fn word_ptr(self, word: usize) -> *mut u64 {
        // A constant `word` (every data-path caller) folds this away.
        assert!(word < WORDS, "word index past the ring entry");
        // SAFETY: the entry holds WORDS words (`DmaRing::entry`), and word < WORDS.
        unsafe { self.ptr.as_ptr().add(word) }
    }

    /// Stores `v` (bytes in memory order) into word `word`.
    #[inline(always)]
    pub fn store(self, word: usize, v: u64) {
        // SAFETY: in bounds and 8-byte aligned (`word_ptr`, `DmaRing::new`); volatile, so
        // no reference to device-shared memory is created.
        unsafe { self.word_ptr(word).write_volatile(v) }
    }

    /// Loads word `word` (bytes in memory order).
    #[inline(always)]
    pub fn load(self, word: usize) -> u64 {
        // SAFETY: in bounds and 8-byte aligned (`word_ptr`, `DmaRing::new`); a volatile
        // load of device-shared memory.
        unsafe { self.word_ptr(word).read_volatile() }
    }
}

/// A 32-bit doorbell record (prm-subset.md §9.2, §9.7) at a 4-byte aligned offset of a
/// region, range checked once at construction; a store is then one release store (a plain
/// `mov` on x86-64). The record keeps its region alive.
pub struct DmaRecord {
    ptr: NonNull<AtomicU32>,
    _region: Arc<DmaRegion>,
}

// SAFETY: the record only points into its own region (kept alive by the `Arc`) and accesses
// it as an `AtomicU32`, which may be shared between threads.
unsafe impl Send for DmaRecord {}
// SAFETY: as for Send.
unsafe impl Sync for DmaRecord {}

impl std::fmt::Debug for DmaRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaRecord")
            .field(
                "at",
                &(self.ptr.as_ptr() as usize - self._region.as_ptr() as usize),
            )
            .finish()
    }
}

impl DmaRecord {
    /// The record at byte `off` of `region`, or `None` if it is not 4-byte aligned or does
    /// not lie in the region.
    pub fn new(region: Arc<DmaRegion>, off: usize) -> Option<DmaRecord> {
        let addr = (region.as_ptr() as usize).checked_add(off)?;
        if off.checked_add(4)? > region.len() || !addr.is_multiple_of(4) {
            return None;
        }
        let ptr = NonNull::new(region.as_ptr().wrapping_add(off).cast::<AtomicU32>())?;
        Some(DmaRecord {
            ptr,
            _region: region,
        })
    }

    /// Stores `v` big-endian with release ordering (what the device reads after it).
    #[inline(always)]
    pub fn store_be32(&self, v: u32) {
        // SAFETY: in bounds and aligned (`new`), and the region lives as long as `self`; an
        // `AtomicU32` permits concurrent access by the device.
        unsafe { self.ptr.as_ref() }.store(v.to_be(), Ordering::Release)
    }

    /// Loads the record (big-endian) with acquire ordering.
    #[inline]
    pub fn load_be32(&self) -> u32 {
        // SAFETY: as in `store_be32`.
        u32::from_be(unsafe { self.ptr.as_ref() }.load(Ordering::Acquire))
    }
}

/// `2^n` host-memory slots indexed by a free-running counter, as the driver's shadow rings
/// are (`wr_id`s and WQE extents). The power-of-two length is checked once, at
/// construction; afterwards a lookup is one AND and the load, with no bounds check.
pub struct MaskedSlots<T> {
    slots: Box<[T]>,
    /// `len - 1`.
    mask: u32,
}

impl<T: std::fmt::Debug> std::fmt::Debug for MaskedSlots<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaskedSlots")
            .field("entries", &self.slots.len())
            .finish()
    }
}

impl<T> MaskedSlots<T> {
    /// `entries` slots made by `make`, or `None` unless `entries` is a power of two.
    pub fn new(entries: u32, make: impl FnMut() -> T) -> Option<MaskedSlots<T>> {
        if !entries.is_power_of_two() {
            return None;
        }
        let slots: Box<[T]> = std::iter::repeat_with(make)
            .take(entries as usize)
            .collect();
        Some(MaskedSlots {
            slots,
            mask: entries - 1,
        })
    }

    /// Number of slots.
    pub fn entries(&self) -> u32 {
        self.mask + 1
    }

    /// The slot of free-running counter `counter` (`counter mod entries`).
    #[inline(always)]
    pub fn get(&self, counter: u32) -> &T {
        self.view().get(counter)
    }

    /// The slots' address and size by value, for a loop that should keep them in
    /// registers.
    #[inline(always)]
    pub fn view(&self) -> SlotsView<'_, T> {
        SlotsView {
            base: NonNull::from(&*self.slots).cast(),
            mask: self.mask,
            _slots: PhantomData,
        }
    }
}

/// A borrowed copy of a [`MaskedSlots`]' address and size.
#[derive(Debug)]
pub struct SlotsView<'a, T> {
    base: NonNull<T>,
    mask: u32,
    _slots: PhantomData<&'a [T]>,
}

impl<T> Clone for SlotsView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SlotsView<'_, T> {}

impl<'a, T> SlotsView<'a, T> {
    /// The slot of free-running counter `counter` (as [`MaskedSlots::get`]).
    #[inline(always)]
    pub fn get(self, counter: u32) -> &'a T {
        let i = (counter & self.mask) as usize;
        // SAFETY: the view borrows a `MaskedSlots`, which holds exactly `mask + 1` slots
        // from `base` (a power of two, so `mask` is all ones below it): `i <= mask < len`,
        // and the slots live for 'a.
        unsafe { self.base.add(i).as_ref() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::DmaSpace;
    use crate::pci::null::NullFunction;

    #[test]
    fn entries_wrap_and_bad_geometry_is_refused() {
        let space = DmaSpace::new(Arc::new(NullFunction::default()));
        let region = Arc::new(space.alloc(4096).unwrap());
        let r = DmaRing::<8>::new(region.clone(), 1024, 2).unwrap();
        assert_eq!(r.entries(), 4);
        r.store(5, 7, 0x0102_0304_0506_0708); // entry 1, last word
        assert_eq!(r.load(1, 7), 0x0102_0304_0506_0708);
        let mut b = [0u8; 8];
        region.slice().read(1024 + 64 + 56, &mut b);
        assert_eq!(u64::from_ne_bytes(b), 0x0102_0304_0506_0708);
        assert!(DmaRing::<8>::new(region.clone(), 4096 - 64 * 4 + 8, 2).is_none());
        assert!(DmaRing::<8>::new(region.clone(), 4, 2).is_none());
        assert!(DmaRing::<3>::new(region.clone(), 0, 2).is_none());
        assert!(DmaRing::<2>::new(region, 0, 40).is_none());
    }

    #[test]
    fn views_give_slots_and_pass_parity() {
        let space = DmaSpace::new(Arc::new(NullFunction::default()));
        let region = Arc::new(space.alloc(4096).unwrap());
        let v = DmaRing::<8>::new(region, 0, 2).unwrap();
        let v = v.view();
        assert_eq!((v.slot(0), v.slot(5), v.slot(u32::MAX)), (0, 1, 3));
        let passes: Vec<u32> = (0..10).map(|c| v.pass_parity(c)).collect();
        assert_eq!(passes, [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]);
        assert_eq!(v.pass_parity(u32::MAX), 1);
    }

    #[test]
    fn records_are_checked_once_and_stored_big_endian() {
        let space = DmaSpace::new(Arc::new(NullFunction::default()));
        let region = Arc::new(space.alloc(4096).unwrap());
        let r = DmaRecord::new(region.clone(), 4092).unwrap();
        r.store_be32(0x0102_0304);
        assert_eq!(r.load_be32(), 0x0102_0304);
        assert_eq!(region.slice().load_be32(4092), 0x0102_0304);
        assert!(DmaRecord::new(region.clone(), 4093).is_none());
        assert!(DmaRecord::new(region.clone(), 4094).is_none());
        assert!(DmaRecord::new(region, usize::MAX).is_none());
    }

    #[test]
    fn masked_slots_wrap_and_need_a_power_of_two() {
        let mut n = 0u32;
        let s = MaskedSlots::new(4, || {
            n += 1;
            n
        })
        .unwrap();
        assert_eq!(s.entries(), 4);
        assert_eq!(
            (*s.get(0), *s.get(3), *s.get(4), *s.get(u32::MAX)),
            (1, 4, 1, 4)
        );
        assert!(MaskedSlots::new(6, || 0u8).is_none());
        assert!(MaskedSlots::new(0, || 0u8).is_none());
    }
}

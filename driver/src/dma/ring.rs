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
}

//! The one type through which BAR memory is touched (style.md §11).

use std::sync::Arc;

use uhca_layout::{Buf, BufMut};

use super::{BarRegion, PciFunction};

/// A mapped BAR: volatile, bounds-checked, big-endian register access.
///
/// Every access is a single volatile load or store of the stated width, as MMIO requires
/// (a 32-bit register is never touched with byte accesses). Holding a `Bar` keeps its
/// [`PciFunction`] alive, which keeps the mapping valid.
#[derive(Clone)]
pub struct Bar {
    ptr: *mut u8,
    len: usize,
    /// The device's wake, for a device that sleeps ([`PciFunction::doorbell_wake`]).
    #[cfg(feature = "model")]
    wake: Option<uhca_hw::model::DoorbellWake>,
    _owner: Arc<dyn PciFunction>,
}

// SAFETY: a Bar is a pointer into an MMIO (or model) mapping that stays valid while `_owner`
// lives; all accesses are volatile loads/stores of naturally aligned words, which any thread
// may issue, like any device register access.
unsafe impl Send for Bar {}
// SAFETY: as for Send; no method hands out references into the mapping.
unsafe impl Sync for Bar {}

impl std::fmt::Debug for Bar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bar({:p}, {:#x})", self.ptr, self.len)
    }
}

impl Bar {
    /// Maps BAR `index` of `function`.
    pub fn map(function: &Arc<dyn PciFunction>, index: u8) -> Result<Bar, super::PciError> {
        let BarRegion { ptr, len } = function.map_bar(index)?;
        Ok(Bar {
            ptr,
            len,
            #[cfg(feature = "model")]
            wake: function.doorbell_wake(),
            _owner: function.clone(),
        })
    }

    /// Called after each doorbell store: wakes a device that sleeps and asked for it
    /// (the in-process model: one relaxed load while it is awake); nothing for a real
    /// device (one test of an empty option).
    #[inline(always)]
    pub fn doorbell_rung(&self) {
        #[cfg(feature = "model")]
        if let Some(w) = &self.wake {
            w.rung();
        }
    }

    /// Run to completion: one pass of the device's work on this thread, for a device that
    /// is software in this process ([`PciFunction::drive`]); true if it did anything.
    pub fn drive(&self) -> bool {
        self._owner.drive()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn check(&self, off: usize, width: usize) {
        assert!(
            off.is_multiple_of(width) && off + width <= self.len,
            "BAR access of {width} bytes at {off:#x} outside {:#x} or misaligned",
            self.len
        );
    }

    /// Reads the big-endian 32-bit register at `off`.
    #[inline]
    pub fn read32_be(&self, off: usize) -> u32 {
        self.check(off, 4);
        // SAFETY: `check` keeps the aligned 4-byte access inside the mapping, which the
        // PciFunction contract keeps valid while `_owner` lives.
        u32::from_be(unsafe { self.ptr.add(off).cast::<u32>().read_volatile() })
    }

    /// Writes the big-endian 32-bit register at `off`.
    #[inline]
    pub fn write32_be(&self, off: usize, v: u32) {
        self.check(off, 4);
        // SAFETY: as in `read32_be`.
        unsafe { self.ptr.add(off).cast::<u32>().write_volatile(v.to_be()) }
    }

    /// Writes 8 bytes, as they sit in memory, with one 64-bit store (doorbells: the device
    /// must see both halves in one write, prm-subset.md §9.2-9.3).
    #[inline]
    pub fn write64_raw(&self, off: usize, bytes: [u8; 8]) {
        self.check(off, 8);
        // SAFETY: as in `read32_be`, for an aligned 8-byte access.
        unsafe {
            self.ptr
                .add(off)
                .cast::<u64>()
                .write_volatile(u64::from_ne_bytes(bytes))
        }
    }

    /// Reads 8 bytes with one 64-bit load.
    #[inline]
    pub fn read64_raw(&self, off: usize) -> [u8; 8] {
        self.check(off, 8);
        // SAFETY: as in `read32_be`, for an aligned 8-byte access.
        unsafe { self.ptr.add(off).cast::<u64>().read_volatile() }.to_ne_bytes()
    }

    /// Copies `src` (a multiple of 8 bytes) to `off` with 64-bit stores, in order
    /// (BlueFlame, device-memory writes).
    #[inline]
    pub fn copy_to_u64(&self, off: usize, src: &[u64]) {
        self.check(off, 8);
        self.check(off + (src.len().max(1) - 1) * 8, 8);
        for (i, w) in src.iter().enumerate() {
            // SAFETY: every word lies inside the mapping (checked above: first and last).
            unsafe { self.ptr.add(off + i * 8).cast::<u64>().write_volatile(*w) }
        }
    }

    /// Copies 32-bit words from `src` into the BAR at `off` (native byte order, i.e. the
    /// bytes as they sit in `src`), one 32-bit store each (device memory, prm-subset.md §11).
    #[inline]
    pub fn write_u32s(&self, off: usize, src: &[u32]) {
        if src.is_empty() {
            return;
        }
        self.check(off, 4);
        self.check(off + (src.len() - 1) * 4, 4);
        for (i, w) in src.iter().enumerate() {
            // SAFETY: every word lies inside the mapping (checked above: first and last).
            unsafe { self.ptr.add(off + i * 4).cast::<u32>().write_volatile(*w) }
        }
    }

    /// Copies 32-bit words from the BAR at `off` into `dst`, one 32-bit load each.
    #[inline]
    pub fn read_u32s(&self, off: usize, dst: &mut [u32]) {
        if dst.is_empty() {
            return;
        }
        self.check(off, 4);
        self.check(off + (dst.len() - 1) * 4, 4);
        for (i, w) in dst.iter_mut().enumerate() {
            // SAFETY: every word lies inside the mapping (checked above: first and last).
            *w = unsafe { self.ptr.add(off + i * 4).cast::<u32>().read_volatile() };
        }
    }
}

impl Buf for Bar {
    fn buf_len(&self) -> usize {
        self.len
    }
    fn read_be32(&self, off: usize) -> u32 {
        self.read32_be(off)
    }
    fn read_bytes(&self, off: usize, out: &mut [u8]) {
        assert!(
            off.is_multiple_of(4) && out.len().is_multiple_of(4),
            "BAR byte reads are whole words"
        );
        for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
            chunk.copy_from_slice(&self.read32_be(off + 4 * i).to_be_bytes());
        }
    }
}

impl BufMut for Bar {
    fn write_be32(&mut self, off: usize, v: u32) {
        self.write32_be(off, v)
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        assert!(
            off.is_multiple_of(4) && src.len().is_multiple_of(4),
            "BAR byte writes are whole words"
        );
        for (i, chunk) in src.chunks_exact(4).enumerate() {
            self.write32_be(
                off + 4 * i,
                u32::from_be_bytes(chunk.try_into().expect("4")),
            );
        }
    }
}

/// `sfence`: every earlier store, write-combined MMIO stores included, is globally visible
/// before any later store (the doorbell barriers of `crate::barrier` on x86-64).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn sfence() {
    // SAFETY: `sfence` only orders stores; SSE, which it needs, is part of the x86-64
    // baseline, so the instruction exists on every CPU this code runs on.
    unsafe { std::arch::x86_64::_mm_sfence() }
}

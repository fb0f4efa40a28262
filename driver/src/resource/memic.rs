//! Device memory (MEMIC, prm-subset.md §8.3, §11): what `ibv_alloc_dm` gives.
//!
//! - Capabilities come from the device's DEV_MEM page ([`DmCaps`]).
//! - [`Device::alloc_dm`] rounds the length up to 64 bytes and, like Linux, asks ALLOC_MEMIC
//!   for it page range by page range of the window (`range_start_addr` = window + k * 4 KiB,
//!   `range_size` = the length rounded up to pages), moving on when the device answers
//!   NO_RES / NOT_READY; when no range has room the error says so ([`MemError::DmExhausted`]).
//! - The host reaches device memory through the BAR0 mapping with 32-bit loads and stores
//!   only (§11: never wider, never bytes). [`Dm::copy_to`] and [`Dm::copy_from`] accept
//!   any offset and length: an unaligned head or tail is a read-modify-write of its whole
//!   32-bit word (never a partial store). That read-modify-write is not atomic against
//!   the *device* writing other bytes of the same word at the same moment (a remote RDMA
//!   WRITE into the neighbouring bytes); callers that share words with the device should
//!   copy 4-byte aligned ranges.
//! - Freeing is DEALLOC_MEMIC when the last handle goes ([`Dm`] and the [`Mr`]s over it);
//!   [`Dm::free`] refuses while MRs exist.
//!
//! [`Mr`]: super::Mr

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use uhca_layout::caps::DeviceMemCap;
use uhca_layout::cmd::CmdStatus;

use super::mem_error::MemError;
use crate::cmd::ops;
use crate::device::{DeviceInner, is_status};
use crate::handle::Device;

/// Allocation granularity (`MLX5_MEMIC_BASE_SIZE`, §11).
const MEMIC_BASE: usize = 64;
/// The page size of Linux's range search (§11).
const RANGE_PAGE: u64 = 4096;

/// The device-memory capabilities (`device_mem_cap`, §8.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmCaps {
    /// `memic_bar_start_addr`: offset of the MEMIC window in BAR0.
    pub bar_start: u64,
    /// `memic_bar_size`.
    pub bar_size: u64,
    /// `max_memic_size`: the most that may be allocated.
    pub max_size: u64,
    /// Largest alignment in bytes (`64 << log_max_memic_addr_alignment`).
    pub max_align: u64,
    /// `log_min_memic_alloc_size` (Linux does not use it; allocations are 64-byte units).
    pub log_min_alloc: u32,
}

impl DmCaps {
    /// Reads the capabilities of `dev`; `None` when it has no device memory.
    pub fn of(dev: &Device) -> Option<DmCaps> {
        let page = &dev.caps().dev_mem;
        if page.len() < DeviceMemCap::<()>::SIZE {
            return None;
        }
        let c = DeviceMemCap::new_unchecked(&page[..]);
        (c.memic() == 1 && c.max_memic_size() > 0).then(|| DmCaps {
            bar_start: c.memic_bar_start_addr(),
            bar_size: u64::from(c.memic_bar_size()),
            max_size: u64::from(c.max_memic_size()),
            max_align: 64u64 << c.log_max_memic_addr_alignment(),
            log_min_alloc: c.log_min_memic_alloc_size(),
        })
    }
}

/// One allocation, shared by its [`Dm`] handle and the MRs over it.
#[derive(Debug)]
pub(crate) struct DmInner {
    dev: Arc<DeviceInner>,
    /// BAR0 offset (`memic_start_addr`).
    addr: u64,
    /// The user-visible length.
    len: usize,
    /// The allocated size (a multiple of 64).
    alloc_len: u32,
    mrs: AtomicUsize,
    freed: AtomicBool,
}

impl DmInner {
    fn dealloc(&self) -> Result<(), MemError> {
        if self.freed.swap(true, Ordering::AcqRel) || !self.dev.is_open() {
            return Ok(());
        }
        ops::dealloc_memic(&*self.dev, self.addr, self.alloc_len)?;
        Ok(())
    }

    fn check(&self, offset: usize, n: usize) -> Result<(), MemError> {
        if offset.checked_add(n).is_some_and(|e| e <= self.len) {
            Ok(())
        } else {
            Err(MemError::Range {
                offset,
                len: n,
                size: self.len,
            })
        }
    }

    /// See [`Dm::copy_to`].
    fn copy_to(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.check(offset, src.len())?;
        let bar = &self.dev.bar;
        let mut at = self.addr as usize + offset;
        let mut rest = src;
        // Head and tail words: read-modify-write of the whole word (the allocation covers
        // whole 64-byte units, so the word is ours).
        let rmw = |word: usize, skip: usize, bytes: &[u8]| {
            let mut w = [0u32];
            bar.read_u32s(word, &mut w);
            let mut b = w[0].to_ne_bytes();
            b[skip..skip + bytes.len()].copy_from_slice(bytes);
            bar.write_u32s(word, &[u32::from_ne_bytes(b)]);
        };
        if !at.is_multiple_of(4) && !rest.is_empty() {
            let skip = at % 4;
            let n = (4 - skip).min(rest.len());
            rmw(at - skip, skip, &rest[..n]);
            at += n;
            rest = &rest[n..];
        }
        let mut words = [0u32; 64];
        while rest.len() >= 4 {
            let n = (rest.len() / 4).min(words.len());
            for (w, c) in words.iter_mut().zip(rest.chunks_exact(4)).take(n) {
                *w = u32::from_ne_bytes(c.try_into().expect("4 bytes"));
            }
            bar.write_u32s(at, &words[..n]);
            at += 4 * n;
            rest = &rest[4 * n..];
        }
        if !rest.is_empty() {
            rmw(at, 0, rest);
        }
        Ok(())
    }

    /// See [`Dm::copy_from`].
    fn copy_from(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, dst.len())?;
        let bar = &self.dev.bar;
        let start = self.addr as usize + offset;
        let first = start & !3;
        let end = start + dst.len();
        let mut words = [0u32; 64];
        let mut word = first;
        while word < end {
            let n = ((end - word).div_ceil(4)).min(words.len());
            bar.read_u32s(word, &mut words[..n]);
            for (k, w) in words[..n].iter().enumerate() {
                for (j, b) in w.to_ne_bytes().iter().enumerate() {
                    let a = word + 4 * k + j;
                    if a >= start && a < end {
                        dst[a - start] = *b;
                    }
                }
            }
            word += 4 * n;
        }
        Ok(())
    }
}

impl Drop for DmInner {
    fn drop(&mut self) {
        if let Err(e) = self.dealloc() {
            tracing::warn!(addr = self.addr, error = %e, "DEALLOC_MEMIC failed");
        }
    }
}

/// An MR's hold on device memory: counts as a registration until dropped.
#[derive(Debug)]
pub(crate) struct DmRef {
    inner: Arc<DmInner>,
    /// Offset of the MR inside the allocation.
    pub(crate) offset: usize,
}

impl DmRef {
    pub(crate) fn copy_to(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.inner.copy_to(offset, src)
    }

    pub(crate) fn copy_from(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.inner.copy_from(offset, dst)
    }
}

impl Drop for DmRef {
    fn drop(&mut self) {
        self.inner.mrs.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Device memory: `len` bytes in the HCA's MEMIC window, freed when this handle and every
/// MR over it are gone.
#[derive(Debug)]
pub struct Dm {
    inner: Arc<DmInner>,
}

impl Dm {
    /// Length in bytes (as requested).
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always false (empty allocations are refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The allocation's BAR0 offset (`memic_start_addr`).
    pub fn bar_offset(&self) -> u64 {
        self.inner.addr
    }

    /// Bytes the device allocated (the length rounded up to 64).
    pub fn allocated_len(&self) -> usize {
        self.inner.alloc_len as usize
    }

    /// Memory regions registered over this memory.
    pub fn registrations(&self) -> usize {
        self.inner.mrs.load(Ordering::Acquire)
    }

    /// Copies `src` to byte `offset` through the BAR mapping with 32-bit stores; an
    /// unaligned head or tail is a read-modify-write of its whole word (module docs).
    pub fn copy_to(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.inner.copy_to(offset, src)
    }

    /// Copies bytes at `offset` into `dst` with 32-bit loads.
    pub fn copy_from(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.inner.copy_from(offset, dst)
    }

    /// Frees the memory now. Refused while MRs use it: the handle comes back with
    /// [`MemError::DmInUse`].
    pub fn free(self) -> Result<(), (Dm, MemError)> {
        let mrs = self.registrations();
        if mrs > 0 {
            return Err((self, MemError::DmInUse { mrs }));
        }
        match self.inner.dealloc() {
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }

    pub(crate) fn register(&self, offset: usize) -> DmRef {
        self.inner.mrs.fetch_add(1, Ordering::AcqRel);
        DmRef {
            inner: self.inner.clone(),
            offset,
        }
    }
}

impl Device {
    /// The device-memory capabilities, `None` when the device has none.
    pub fn dm_caps(&self) -> Option<DmCaps> {
        DmCaps::of(self)
    }

    /// Allocates `len` bytes of device memory (64-byte aligned).
    pub fn alloc_dm(&self, len: usize) -> Result<Dm, MemError> {
        self.alloc_dm_aligned(len, MEMIC_BASE as u64)
    }

    /// Allocates `len` bytes of device memory aligned to `align` bytes (a power of two, at
    /// most [`DmCaps::max_align`]).
    pub fn alloc_dm_aligned(&self, len: usize, align: u64) -> Result<Dm, MemError> {
        if !self.inner.is_open() {
            return Err(MemError::gone(&self.inner));
        }
        let caps = DmCaps::of(self).ok_or(MemError::NoDeviceMemory)?;
        if len == 0 {
            return Err(MemError::Empty);
        }
        let align = align.max(MEMIC_BASE as u64);
        if !align.is_power_of_two() || align > caps.max_align {
            return Err(MemError::DmAlignment {
                align,
                max: caps.max_align,
            });
        }
        // log_memic_addr_alignment = max(log2(align) - 6, 0) (§11).
        let log_align = align.trailing_zeros().saturating_sub(6);
        let size = len.next_multiple_of(MEMIC_BASE) as u64;
        let exhausted = || MemError::DmExhausted {
            len,
            max: caps.max_size,
        };
        if size > caps.max_size.min(caps.bar_size) {
            return Err(MemError::DmTooLarge {
                len,
                max: caps.max_size.min(caps.bar_size),
            });
        }
        let range_size = size.next_multiple_of(RANGE_PAGE);
        let window_end = caps.bar_start + caps.bar_size;
        let mut start = caps.bar_start;
        while start + range_size <= window_end {
            match ops::alloc_memic(
                &*self.inner,
                start,
                range_size as u32,
                size as u32,
                log_align,
            ) {
                Ok(addr) => {
                    return Ok(Dm {
                        inner: Arc::new(DmInner {
                            dev: self.inner.clone(),
                            addr,
                            len,
                            alloc_len: size as u32,
                            mrs: AtomicUsize::new(0),
                            freed: AtomicBool::new(false),
                        }),
                    });
                }
                // Linux moves to the next page on -EAGAIN (NO_RES, NOT_READY).
                Err(e)
                    if is_status(&e, CmdStatus::NoResErr) || is_status(&e, CmdStatus::NotReady) =>
                {
                    start += RANGE_PAGE;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(exhausted())
    }
}

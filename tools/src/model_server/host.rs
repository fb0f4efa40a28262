//! The server's raw memory: the only part of the vfio-user server with `unsafe`.
//!
//! - [`ClientMemory`]: the client's DMA regions (memfds or other shareable files it sent
//!   with DMA_MAP), mapped into this process and into the model IOMMU.
//! - [`bar_read`] / [`bar_write`]: socket-borne accesses to the model's BAR0
//!   (REGION_READ/REGION_WRITE of region 0: what a client does for the pages it did not
//!   mmap, such as QEMU for the page holding the MSI-X table), done with single atomic
//!   accesses like the model's own.
//! - [`eventfd_from_file`]: an interrupt eventfd the client sent with SET_IRQS.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

use vmm_sys_util::eventfd::EventFd;

use uhca::hw::model::{BarMemory, Hca};

/// A client's DMA region mapped into this process; unmapped on drop.
struct FdMapping {
    ptr: NonNull<u8>,
    len: usize,
    /// The device may only read the region (mapped PROT_READ here and read-only in the
    /// model IOMMU, so a device write faults instead of reaching the client's memory).
    read_only: bool,
}

impl FdMapping {
    /// Maps `len` bytes of `file` from `offset`, shared with the client; `writable` = false
    /// maps it read-only (the client gave the device read access only).
    fn new(file: &File, offset: u64, len: usize, writable: bool) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "zero-length mapping",
            ));
        }
        // The device would fault (SIGBUS, the whole server down) on the first access past
        // the end of a regular file (memfd, shm, hugetlbfs): a client's wrong size is refused.
        let meta = file.metadata()?;
        if meta.file_type().is_file() && meta.len() < offset.saturating_add(len as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "mapping {len:#x} bytes at file offset {offset:#x} runs past the file's end ({:#x})",
                    meta.len()
                ),
            ));
        }
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping at an address the kernel chooses, of a descriptor we hold
        // open for the call; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned a non-null pointer");
        Ok(FdMapping {
            ptr,
            len,
            read_only: !writable,
        })
    }
}

impl Drop for FdMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, created in `new`; `ClientMemory` drops it only after
        // removing it from the model IOMMU (which waits for in-flight accesses).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Checks `[off, off + len)` against BAR0 and returns its start.
fn bar_range(bar: &BarMemory, off: u64, len: usize) -> io::Result<usize> {
    let off = usize::try_from(off).map_err(|_| range_err())?;
    match off.checked_add(len) {
        Some(end) if end <= bar.len && len > 0 => Ok(off),
        _ => Err(range_err()),
    }
}

/// Reads `dst.len()` bytes of `hca`'s BAR0 at `off`: one access of that width when it is
/// 1, 2, 4 or 8 bytes and naturally aligned (a register read), else byte by byte.
pub(crate) fn bar_read(hca: &Hca, off: u64, dst: &mut [u8]) -> io::Result<()> {
    let bar = hca.bar0();
    let off = bar_range(&bar, off, dst.len())?;
    // SAFETY: `off..off + len` is inside BAR0 (checked above), which stays mapped while
    // `hca` (borrowed for the call) lives; atomics of each width have the layout of the
    // plain integer and the address is aligned to it where one is used.
    unsafe {
        let p = bar.ptr.add(off);
        match dst.len() {
            8 if off.is_multiple_of(8) => dst.copy_from_slice(
                &AtomicU64::from_ptr(p.cast())
                    .load(Ordering::Acquire)
                    .to_ne_bytes(),
            ),
            4 if off.is_multiple_of(4) => dst.copy_from_slice(
                &AtomicU32::from_ptr(p.cast())
                    .load(Ordering::Acquire)
                    .to_ne_bytes(),
            ),
            2 if off.is_multiple_of(2) => dst.copy_from_slice(
                &AtomicU16::from_ptr(p.cast())
                    .load(Ordering::Acquire)
                    .to_ne_bytes(),
            ),
            _ => {
                for (i, b) in dst.iter_mut().enumerate() {
                    *b = AtomicU8::from_ptr(p.add(i)).load(Ordering::Acquire);
                }
            }
        }
    }
    Ok(())
}

/// Writes `src` to `hca`'s BAR0 at `off`, with the access widths of [`bar_read`].
pub(crate) fn bar_write(hca: &Hca, off: u64, src: &[u8]) -> io::Result<()> {
    let bar = hca.bar0();
    let off = bar_range(&bar, off, src.len())?;
    // SAFETY: as in `bar_read`.
    unsafe {
        let p = bar.ptr.add(off);
        match src.len() {
            8 if off.is_multiple_of(8) => AtomicU64::from_ptr(p.cast()).store(
                u64::from_ne_bytes(src.try_into().expect("8 bytes")),
                Ordering::Release,
            ),
            4 if off.is_multiple_of(4) => AtomicU32::from_ptr(p.cast()).store(
                u32::from_ne_bytes(src.try_into().expect("4 bytes")),
                Ordering::Release,
            ),
            2 if off.is_multiple_of(2) => AtomicU16::from_ptr(p.cast()).store(
                u16::from_ne_bytes(src.try_into().expect("2 bytes")),
                Ordering::Release,
            ),
            _ => {
                for (i, b) in src.iter().enumerate() {
                    AtomicU8::from_ptr(p.add(i)).store(*b, Ordering::Release);
                }
            }
        }
    }
    Ok(())
}

/// The client's DMA regions, mapped here and in a model's IOMMU, by IOVA.
///
/// Every region leaves the IOMMU before it is unmapped. Dropping a `ClientMemory` that
/// still holds regions leaks them (never unmaps memory the model may still reach): call
/// [`unmap`](Self::unmap) with the same model first.
#[derive(Default)]
pub(crate) struct ClientMemory {
    maps: BTreeMap<u64, FdMapping>,
}

impl ClientMemory {
    /// Maps `len` bytes of `file` from `offset` and makes them the model's IOVA
    /// `[iova, iova + len)`, read-only for the device unless `writable`. Returns whether it
    /// is read-only.
    pub(crate) fn map(
        &mut self,
        hca: &Hca,
        file: &File,
        offset: u64,
        iova: u64,
        len: usize,
        writable: bool,
    ) -> io::Result<bool> {
        let m = FdMapping::new(file, offset, len, writable)?;
        let r = if m.read_only {
            // SAFETY: `m` stays mapped until `unmap` has removed it from this model's IOMMU
            // (which waits for in-flight device accesses); a `ClientMemory` dropped with it
            // still inside leaks it instead (see Drop). The model never writes through a
            // read-only mapping (the pages are PROT_READ here).
            unsafe { hca.dma_map_read_only(iova, m.ptr.as_ptr(), m.len) }
        } else {
            // SAFETY: as above.
            unsafe { hca.dma_map(iova, m.ptr.as_ptr(), m.len) }
        };
        r.map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let read_only = m.read_only;
        self.maps.insert(iova, m);
        Ok(read_only)
    }

    /// Removes from `hca`'s IOMMU and unmaps every region that starts in `[start, end)`.
    /// A region that starts there but runs past `end` is an error and nothing is changed.
    pub(crate) fn unmap(&mut self, hca: &Hca, start: u64, end: u64) -> io::Result<usize> {
        let hit: Vec<(u64, usize)> = self
            .maps
            .range(start..end)
            .map(|(k, m)| (*k, m.len))
            .collect();
        if let Some((k, len)) = hit.iter().find(|(k, len)| k + *len as u64 > end) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unmap of [{start:#x}, {end:#x}) cuts the mapping at {k:#x}+{len:#x}"),
            ));
        }
        for (k, len) in &hit {
            let m = self.maps.remove(k).expect("listed above");
            if let Err(e) = hca.dma_unmap(*k, *len) {
                // The model still reaches it: never unmap it.
                tracing::error!(iova = k, error = %e, "model IOMMU kept a mapping; leaking it");
                std::mem::forget(m);
            }
        }
        Ok(hit.len())
    }

    /// Number of regions held.
    pub(crate) fn len(&self) -> usize {
        self.maps.len()
    }
}

impl Drop for ClientMemory {
    fn drop(&mut self) {
        if !self.maps.is_empty() {
            tracing::error!(
                regions = self.maps.len(),
                "client DMA regions dropped while mapped; leaking them"
            );
            for (_, m) in std::mem::take(&mut self.maps) {
                std::mem::forget(m);
            }
        }
    }
}

fn range_err() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "BAR0 access out of range")
}

/// Adopts an eventfd the client sent over the socket.
pub(crate) fn eventfd_from_file(file: File) -> EventFd {
    // SAFETY: we own the descriptor (it arrived with SCM_RIGHTS and `into_raw_fd` gives up
    // the File's ownership); EventFd takes it over. If the client sent a descriptor that is
    // not an eventfd, writes to it fail or go to that file, which is the client's own.
    unsafe { EventFd::from_raw_fd(file.into_raw_fd()) }
}

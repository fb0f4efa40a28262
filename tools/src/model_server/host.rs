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

/// The identity of a client file and the access it is mapped with: every DMA region of
/// one file shares one mapping of the whole file.
type FileKey = (u64, u64, bool);

/// A whole client file mapped here, with the number of DMA regions that use it.
struct FileMap {
    map: FdMapping,
    users: usize,
}

/// One DMA region: its file and length.
struct Region {
    file: FileKey,
    len: usize,
}

/// The client's DMA regions, mapped here and in a model's IOMMU, by IOVA.
///
/// QEMU behind a guest IOMMU sends a DMA_MAP per guest mapping, often one page of guest
/// RAM (one memfd) each; one mmap per region ran into the process's mapping limit
/// (ENOMEM on thousands of DMA_MAPs under pyverbs). So each file is mapped once, whole,
/// when its first region arrives, and unmapped when its last region goes; a region is a
/// slice of it.
///
/// Every region leaves the IOMMU before its file can be unmapped. Dropping a
/// `ClientMemory` that still holds regions leaks them (never unmaps memory the model may
/// still reach): call [`unmap`](Self::unmap) with the same model first.
#[derive(Default)]
pub(crate) struct ClientMemory {
    maps: BTreeMap<u64, Region>,
    files: BTreeMap<FileKey, FileMap>,
}

/// `file`'s device, inode and size.
fn file_id(file: &File) -> io::Result<(u64, u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `fstat` fills the buffer on success (checked) for a descriptor we hold.
    let st = unsafe {
        if libc::fstat(file.as_raw_fd(), st.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        st.assume_init()
    };
    Ok((st.st_dev, st.st_ino, u64::try_from(st.st_size).unwrap_or(0)))
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
        let invalid = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, m.to_string());
        if len == 0 {
            return Err(invalid("zero-length mapping"));
        }
        if self.maps.contains_key(&iova) {
            return Err(invalid("a region is already mapped at this IOVA"));
        }
        let (dev, ino, size) = file_id(file)?;
        // A region past the end of its file would fault (SIGBUS) when the model reaches it.
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(invalid("the region runs past the end of its file"));
        }
        let key = (dev, ino, writable);
        let f = match self.files.entry(key) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let whole = usize::try_from(size).map_err(|_| invalid("file too large"))?;
                let map = FdMapping::new(file, 0, whole, writable)?;
                v.insert(FileMap { map, users: 0 })
            }
        };
        // SAFETY: `offset + len <= size`, the length of the file's mapping (checked above).
        let ptr = unsafe { NonNull::new_unchecked(f.map.ptr.as_ptr().add(offset as usize)) };
        let read_only = f.map.read_only;
        let r = if read_only {
            // SAFETY: the file's mapping stays until its last region has left this model's
            // IOMMU (`unmap`, which waits for in-flight device accesses); a `ClientMemory`
            // dropped with regions inside leaks it instead (see Drop). The model never
            // writes through a read-only mapping (the pages are PROT_READ here).
            unsafe { hca.dma_map_read_only(iova, ptr.as_ptr(), len) }
        } else {
            // SAFETY: as above.
            unsafe { hca.dma_map(iova, ptr.as_ptr(), len) }
        };
        if let Err(e) = r {
            if f.users == 0 {
                self.files.remove(&key);
            }
            return Err(invalid(&e.to_string()));
        }
        f.users += 1;
        self.maps.insert(iova, Region { file: key, len });
        Ok(read_only)
    }

    /// Removes from `hca`'s IOMMU every region that starts in `[start, end)`, and unmaps the
    /// files no region uses any more. A region that starts there but runs past `end` is an
    /// error and nothing is changed.
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
            let r = self.maps.remove(k).expect("listed above");
            if let Err(e) = hca.dma_unmap(*k, *len) {
                // The model still reaches it: its file is never unmapped.
                tracing::error!(iova = k, error = %e, "model IOMMU kept a mapping; leaking its file");
                continue;
            }
            if let Some(f) = self.files.get_mut(&r.file) {
                f.users -= 1;
                if f.users == 0 {
                    self.files.remove(&r.file);
                }
            }
        }
        Ok(hit.len())
    }

    /// Number of regions held.
    pub(crate) fn len(&self) -> usize {
        self.maps.len()
    }

    /// Number of client files mapped here.
    #[cfg(test)]
    pub(crate) fn files(&self) -> usize {
        self.files.len()
    }
}

impl Drop for ClientMemory {
    fn drop(&mut self) {
        if !self.maps.is_empty() {
            tracing::error!(
                regions = self.maps.len(),
                "client DMA regions dropped while mapped; leaking them"
            );
            for (_, f) in std::mem::take(&mut self.files) {
                std::mem::forget(f.map);
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

//! A model peer device: a "GPU" PCI function whose BAR1 is device memory, exporting
//! dma-bufs of BAR ranges the way vfio-pci's `VFIO_DEVICE_FEATURE_DMA_BUF` does, and the
//! model HCA's side of importing them (`IOMMU_IOAS_MAP_FILE` of a dma-buf fd).
//!
//! This is a model of the kernel contract in docs/spec/vfio-kernel.md §2, run in one
//! process so that P2P registration and revocation can be tested end to end:
//!
//! - [`ModelGpu`]: config space (vendor 0x1b36 "model", class 0x030200 3D controller, a
//!   64-bit prefetchable BAR1), BAR1 backed by a memfd the test can read and write directly
//!   ([`ModelGpu::read`], [`ModelGpu::write`], [`ModelGpu::fill`]).
//! - [`ModelGpu::export_dmabuf`] checks what `vfio_pci_dmabuf.c` checks (§2.1: at least one
//!   range, BAR0-5 only, page-aligned non-empty ranges inside the BAR) and returns a
//!   [`ModelDmaBuf`]: a real file descriptor (an empty memfd, its identity) that the
//!   in-process HCA resolves back to the BAR slice. A buffer exported while memory decoding
//!   is off is born revoked.
//! - Revocation (§2.3): clearing `PCI_COMMAND_MEMORY`, [`ModelGpu::reset`] and
//!   [`ModelGpu::close`] (or drop) revoke every buffer of the GPU. As iommufd does, the
//!   revoke removes the buffer's mappings from every importing HCA's IOMMU (waiting for
//!   in-flight accesses) and **never remaps them**: after the exporter comes back, the
//!   importer must unmap and map again. Memory decoding on again (or the end of a reset)
//!   un-revokes the buffer for new imports; close is permanent.
//! - [`Hca::dma_map_dmabuf`](crate::model::Hca::dma_map_dmabuf) is the importer: it accepts only single-range model dma-bufs
//!   (as iommufd accepts only single-range VFIO dma-bufs, §2.2); any other fd is
//!   [`GpuError::NotADmaBuf`], a revoked one [`GpuError::Revoked`] (the kernel's `ENODEV`).

mod dmabuf;

pub use dmabuf::ModelDmaBuf;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::mem::BarMem;
use super::{BarMemory, ModelError};
use dmabuf::DmaBufInner;

/// Vendor id of the model GPU (0x1b36: the id QEMU uses for its emulated devices; this is
/// a model, not a real GPU).
pub const GPU_VENDOR_ID: u16 = 0x1b36;
/// Device id of the model GPU.
pub const GPU_DEVICE_ID: u16 = 0x00ff;
/// Class code: display controller, 3D controller (0x030200), as data-center GPUs report.
pub const GPU_CLASS_CODE: u32 = 0x03_0200;
/// The BAR that holds device memory (BAR1, like a GPU's VRAM aperture).
pub const GPU_MEM_BAR: u8 = 1;
/// Config-space offset of BAR1 (PCI: BAR n at 0x10 + 4n; 64-bit, so 0x14 low, 0x18 high).
const BAR1: usize = 0x14;
/// Command register offset and bits (PCI Local Bus spec).
const COMMAND: usize = 0x04;
const COMMAND_MEMORY: u16 = 1 << 1;
const COMMAND_MASTER: u16 = 1 << 2;
/// Page size of dma-buf ranges (the kernel's PAGE_SIZE on x86-64).
pub const DMABUF_PAGE: u64 = 4096;

/// Errors of the model GPU and of dma-buf export and import.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// An OS call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was attempted.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is unusable.
    #[error("bad model GPU configuration: {0}")]
    Config(&'static str),
    /// The BAR does not exist (only BAR1 holds memory).
    #[error("BAR {0} does not exist on the model GPU (device memory is BAR1)")]
    NoBar(u32),
    /// A BAR access or a dma-buf range outside the BAR, empty, or not page aligned.
    #[error(
        "range of {len:#x} bytes at {offset:#x} is not a page-aligned, non-empty range inside the {size:#x}-byte BAR"
    )]
    Range {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// BAR (or buffer) size.
        size: u64,
    },
    /// A dma-buf export with no ranges (`nr_ranges` = 0, the kernel's `EINVAL`).
    #[error("a dma-buf needs at least one range")]
    NoRanges,
    /// A config-space access outside the 4 KiB space.
    #[error("config space access of {len} bytes at {offset:#x} is out of range")]
    ConfigRange {
        /// Offset.
        offset: u16,
        /// Length.
        len: usize,
    },
    /// The fd is not a dma-buf the model HCA can import (the kernel's `EOPNOTSUPP` from
    /// `IOMMU_IOAS_MAP_FILE`: iommufd takes only single-range VFIO dma-bufs).
    #[error(
        "fd is not a model dma-buf: the importer accepts only single-range dma-bufs exported by a (model) vfio-pci function"
    )]
    NotADmaBuf,
    /// A multi-range dma-buf (the kernel's `EOPNOTSUPP`).
    #[error("dma-buf has {0} ranges; the importer accepts single-range dma-bufs only")]
    MultiRange(usize),
    /// The dma-buf is revoked: memory decoding off, reset in progress, or exporter closed
    /// (the kernel's `ENODEV`).
    #[error("dma-buf is revoked (exporter memory decoding off, reset, or closed)")]
    Revoked,
    /// The HCA's IOMMU refused the mapping.
    #[error(transparent)]
    Map(#[from] ModelError),
}

/// Configuration of a [`ModelGpu`].
#[derive(Clone, Debug)]
pub struct GpuConfig {
    /// Name (memfd name, logs).
    pub name: String,
    /// BAR1 size in bytes (a power of two, at least 64 KiB).
    pub bar_size: usize,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            name: "gpu0".to_string(),
            bar_size: 64 << 20,
        }
    }
}

/// Counters of the model GPU (a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Dma-bufs exported so far.
    pub exports: u64,
    /// Revocation events (memory decoding off, reset, close), each over all buffers.
    pub revocations: u64,
    /// Importer IOMMU mappings the exporter had to remove itself on revocation (the
    /// importer had not unmapped them first).
    pub forced_unmaps: u64,
    /// Resets.
    pub resets: u64,
}

pub(crate) struct GpuInner {
    name: String,
    pub(crate) bar: Arc<BarMem>,
    config: Mutex<[u8; 4096]>,
    bufs: Mutex<Vec<Weak<DmaBufInner>>>,
    closed: std::sync::atomic::AtomicBool,
    pub(crate) exports: AtomicU64,
    revocations: AtomicU64,
    pub(crate) forced_unmaps: AtomicU64,
    resets: AtomicU64,
}

/// A model GPU: a PCI function with device memory in BAR1 that exports dma-bufs (see the
/// module docs). Dropping it closes it (revokes every buffer permanently).
pub struct ModelGpu {
    inner: Arc<GpuInner>,
}

impl std::fmt::Debug for ModelGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGpu")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

fn put16(c: &mut [u8; 4096], off: usize, v: u16) {
    c[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

fn get16(c: &[u8; 4096], off: usize) -> u16 {
    u16::from_le_bytes([c[off], c[off + 1]])
}

impl ModelGpu {
    /// Creates a model GPU with zeroed device memory and memory decoding on.
    pub fn new(cfg: GpuConfig) -> Result<ModelGpu, GpuError> {
        if cfg.bar_size < (64 << 10) || !cfg.bar_size.is_power_of_two() {
            return Err(GpuError::Config(
                "bar_size must be a power of two of at least 64 KiB",
            ));
        }
        let bar =
            BarMem::new(&format!("uhca-{}-bar1", cfg.name), cfg.bar_size).map_err(|source| {
                GpuError::Os {
                    what: "model GPU BAR1 memfd",
                    source,
                }
            })?;
        let mut c = [0u8; 4096];
        put16(&mut c, 0x00, GPU_VENDOR_ID);
        put16(&mut c, 0x02, GPU_DEVICE_ID);
        c[0x09] = GPU_CLASS_CODE as u8;
        c[0x0a] = (GPU_CLASS_CODE >> 8) as u8;
        c[0x0b] = (GPU_CLASS_CODE >> 16) as u8;
        // BAR1: memory, 64-bit, prefetchable.
        c[BAR1] = 0b1100;
        put16(&mut c, COMMAND, COMMAND_MEMORY);
        Ok(ModelGpu {
            inner: Arc::new(GpuInner {
                name: cfg.name,
                bar: Arc::new(bar),
                config: Mutex::new(c),
                bufs: Mutex::new(Vec::new()),
                closed: std::sync::atomic::AtomicBool::new(false),
                exports: AtomicU64::new(0),
                revocations: AtomicU64::new(0),
                forced_unmaps: AtomicU64::new(0),
                resets: AtomicU64::new(0),
            }),
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// BAR1 size in bytes.
    pub fn bar_len(&self) -> usize {
        self.inner.bar.len()
    }

    /// The memfd behind BAR1 (to share device memory with another process, as the
    /// vfio-user server does with its client); owned by the `ModelGpu`.
    pub fn bar_fd(&self) -> std::os::fd::RawFd {
        self.inner.bar.raw_fd()
    }

    /// BAR `index` as mapped in this process (only [`GPU_MEM_BAR`] exists); valid while the
    /// `ModelGpu` lives.
    pub fn bar(&self, index: u8) -> Result<BarMemory, GpuError> {
        if index != GPU_MEM_BAR {
            return Err(GpuError::NoBar(index.into()));
        }
        Ok(BarMemory {
            ptr: self.inner.bar.ptr(),
            len: self.inner.bar.len(),
        })
    }

    fn check(&self, off: u64, len: usize) -> Result<(), GpuError> {
        let size = self.inner.bar.len() as u64;
        if off.checked_add(len as u64).is_some_and(|e| e <= size) {
            Ok(())
        } else {
            Err(GpuError::Range {
                offset: off,
                len: len as u64,
                size,
            })
        }
    }

    /// Reads device memory at BAR1 offset `off` (a CPU access through the BAR; tests verify
    /// what the HCA wrote with it).
    pub fn read(&self, off: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        self.check(off, dst.len())?;
        self.inner.bar.read_bytes(off as usize, dst);
        Ok(())
    }

    /// Writes device memory at BAR1 offset `off`.
    pub fn write(&self, off: u64, src: &[u8]) -> Result<(), GpuError> {
        self.check(off, src.len())?;
        self.inner.bar.write_bytes(off as usize, src);
        Ok(())
    }

    /// Fills `len` bytes of device memory at `off` with `byte`.
    pub fn fill(&self, off: u64, len: usize, byte: u8) -> Result<(), GpuError> {
        self.check(off, len)?;
        let chunk = vec![byte; len.min(1 << 20)];
        let mut done = 0;
        while done < len {
            let n = chunk.len().min(len - done);
            self.inner.bar.write_bytes(off as usize + done, &chunk[..n]);
            done += n;
        }
        Ok(())
    }

    /// Reads config space.
    pub fn config_read(&self, off: u16, buf: &mut [u8]) -> Result<(), GpuError> {
        let o = off as usize;
        if buf.is_empty() || o + buf.len() > 4096 {
            return Err(GpuError::ConfigRange {
                offset: off,
                len: buf.len(),
            });
        }
        let c = self.inner.config.lock().unwrap_or_else(|e| e.into_inner());
        buf.copy_from_slice(&c[o..o + buf.len()]);
        Ok(())
    }

    /// Writes config space: only the command register's memory and bus-master bits and the
    /// BAR1 address bits are writable. Clearing memory decoding revokes every dma-buf;
    /// setting it again un-revokes them for new imports (vfio-kernel.md §2.3).
    pub fn config_write(&self, off: u16, data: &[u8]) -> Result<(), GpuError> {
        let o = off as usize;
        if data.is_empty() || o + data.len() > 4096 {
            return Err(GpuError::ConfigRange {
                offset: off,
                len: data.len(),
            });
        }
        let (before, after) = {
            let mut c = self.inner.config.lock().unwrap_or_else(|e| e.into_inner());
            let before = get16(&c, COMMAND);
            let size_mask = !((self.inner.bar.len() as u64) - 1);
            for (i, &b) in data.iter().enumerate() {
                let at = o + i;
                let mask: u8 = match at {
                    0x04 => (COMMAND_MEMORY | COMMAND_MASTER) as u8,
                    0x14..=0x17 => ((size_mask as u32 & !0xF) >> (8 * (at - 0x14))) as u8,
                    0x18..=0x1b => ((size_mask >> 32) as u32 >> (8 * (at - 0x18))) as u8,
                    _ => 0,
                };
                c[at] = (c[at] & !mask) | (b & mask);
            }
            (before, get16(&c, COMMAND))
        };
        let was = before & COMMAND_MEMORY != 0;
        let now = after & COMMAND_MEMORY != 0;
        if was && !now {
            self.inner.revoke_all(false);
        } else if !was && now {
            self.inner.unrevoke_all();
        }
        Ok(())
    }

    /// Whether memory decoding (`PCI_COMMAND_MEMORY`) is on.
    pub fn memory_enabled(&self) -> bool {
        self.inner.memory_enabled()
    }

    /// Sets or clears memory decoding through the command register (clearing it revokes
    /// every dma-buf).
    pub fn set_memory_enabled(&self, on: bool) -> Result<(), GpuError> {
        let mut b = [0u8; 2];
        self.config_read(COMMAND as u16, &mut b)?;
        let cmd = u16::from_le_bytes(b);
        let cmd = if on {
            cmd | COMMAND_MEMORY
        } else {
            cmd & !COMMAND_MEMORY
        };
        self.config_write(COMMAND as u16, &cmd.to_le_bytes())
    }

    /// Function-level reset: revokes every dma-buf, resets the command register's
    /// bus-master bit, then un-revokes the buffers if memory decoding is still on (as
    /// `VFIO_DEVICE_RESET` does, §2.3). Device memory keeps its contents. Importers are not
    /// remapped.
    pub fn reset(&self) {
        self.inner.revoke_all(false);
        {
            let mut c = self.inner.config.lock().unwrap_or_else(|e| e.into_inner());
            let cmd = get16(&c, COMMAND) & !COMMAND_MASTER;
            put16(&mut c, COMMAND, cmd);
        }
        self.inner.resets.fetch_add(1, Ordering::Relaxed);
        if self.inner.memory_enabled() {
            self.inner.unrevoke_all();
        }
    }

    /// Closes the function (as closing the exporter's VFIO device fd): every dma-buf is
    /// revoked for good and new exports fail with [`GpuError::Revoked`]. Idempotent.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.revoke_all(true);
    }

    /// Exports `ranges` (`(offset, length)` pairs) of BAR `region_index` as a dma-buf, with
    /// the checks of `VFIO_DEVICE_FEATURE_DMA_BUF` (module docs). Born revoked when memory
    /// decoding is off.
    pub fn export_dmabuf(
        &self,
        region_index: u32,
        ranges: &[(u64, u64)],
    ) -> Result<ModelDmaBuf, GpuError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(GpuError::Revoked);
        }
        if ranges.is_empty() {
            return Err(GpuError::NoRanges);
        }
        if region_index != u32::from(GPU_MEM_BAR) {
            return Err(GpuError::NoBar(region_index));
        }
        let size = self.inner.bar.len() as u64;
        for &(offset, len) in ranges {
            let ok = len > 0
                && offset.is_multiple_of(DMABUF_PAGE)
                && len.is_multiple_of(DMABUF_PAGE)
                && offset.checked_add(len).is_some_and(|e| e <= size);
            if !ok {
                return Err(GpuError::Range { offset, len, size });
            }
        }
        let buf = ModelDmaBuf::new(&self.inner, ranges, !self.inner.memory_enabled())?;
        let mut bufs = self.inner.bufs.lock().unwrap_or_else(|e| e.into_inner());
        bufs.retain(|w| w.strong_count() > 0);
        bufs.push(Arc::downgrade(&buf.inner));
        self.inner.exports.fetch_add(1, Ordering::Relaxed);
        Ok(buf)
    }

    /// Counters.
    pub fn stats(&self) -> GpuStats {
        let i = &self.inner;
        GpuStats {
            exports: i.exports.load(Ordering::Relaxed),
            revocations: i.revocations.load(Ordering::Relaxed),
            forced_unmaps: i.forced_unmaps.load(Ordering::Relaxed),
            resets: i.resets.load(Ordering::Relaxed),
        }
    }
}

impl GpuInner {
    fn memory_enabled(&self) -> bool {
        let c = self.config.lock().unwrap_or_else(|e| e.into_inner());
        get16(&c, COMMAND) & COMMAND_MEMORY != 0
    }

    fn live_bufs(&self) -> Vec<Arc<DmaBufInner>> {
        let bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        bufs.iter().filter_map(Weak::upgrade).collect()
    }

    fn revoke_all(&self, permanent: bool) {
        self.revocations.fetch_add(1, Ordering::Relaxed);
        for b in self.live_bufs() {
            let forced = b.revoke(permanent);
            self.forced_unmaps.fetch_add(forced, Ordering::Relaxed);
        }
    }

    fn unrevoke_all(&self) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        for b in self.live_bufs() {
            b.unrevoke();
        }
    }
}

impl Drop for ModelGpu {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests;

//! An exporting peer device the driver owns (a GPU or other function bound to vfio-pci, or
//! the model GPU): it exports BAR ranges as dma-bufs and, before anything that revokes
//! them (reset, memory decoding off, close), invalidates every MR over them, so the MKeys
//! die before the memory goes (vfio-kernel.md §2.3, §7.B step 9).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::client::FdMemory;
use super::{DmaBlock, Invalidation, PeerError, PeerMemory, PeerMemoryClient, PeerTarget};
use crate::pci::{self, Iova, PciError, PciFunction};

/// Invalidation handles of the MRs over one device's buffers, by claim id.
#[derive(Default)]
struct Registry {
    next: AtomicU64,
    handles: Mutex<Vec<(u64, Invalidation)>>,
}

impl Registry {
    fn add(&self, inv: Invalidation) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().push((id, inv));
        id
    }

    fn remove(&self, id: u64) {
        self.lock().retain(|(i, _)| *i != id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Invalidation)>> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A peer PCI function that exports dma-bufs, with revocation that invalidates first.
pub struct PeerDevice {
    func: Arc<dyn PciFunction>,
    registry: Arc<Registry>,
    closed: AtomicBool,
}

impl std::fmt::Debug for PeerDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerDevice")
            .field("function", &self.func.name())
            .field("registrations", &self.registrations())
            .finish()
    }
}

impl PeerDevice {
    /// Wraps the exporter `func` (it must implement
    /// [`PciFunction::export_dmabuf`]: vfio-pci on 6.19+, or the model GPU).
    pub fn new(func: Arc<dyn PciFunction>) -> PeerDevice {
        PeerDevice {
            func,
            registry: Arc::default(),
            closed: AtomicBool::new(false),
        }
    }

    /// The exporter.
    pub fn function(&self) -> &Arc<dyn PciFunction> {
        &self.func
    }

    /// Live registrations over this device's buffers.
    pub fn registrations(&self) -> usize {
        self.registry.lock().len()
    }

    /// Exports `len` bytes at `offset` of BAR `bar` as a dma-buf (page aligned).
    pub fn export(&self, bar: u8, offset: u64, len: u64) -> Result<PeerBuffer, PeerError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PeerError::ExporterClosed);
        }
        let fd = self.func.export_dmabuf(bar, offset, len)?;
        Ok(PeerBuffer {
            fd,
            len,
            name: format!("{} BAR{bar}+{offset:#x}", self.func.name()),
            registry: self.registry.clone(),
        })
    }

    /// Invalidates every MR over this device's buffers (the handles are collected under
    /// the registry lock, which is released before any is called). Returns how many MKeys
    /// were live.
    pub fn invalidate_all(&self) -> usize {
        let handles: Vec<Invalidation> = self.registry.lock().iter().map(|h| h.1.clone()).collect();
        let mut n = 0;
        for h in handles {
            match h.invalidate() {
                Ok(true) => n += 1,
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "invalidating a peer MR failed"),
            }
        }
        n
    }

    /// Resets the exporter (FLR) after invalidating every MR over it. Re-register
    /// afterwards: nothing is remapped.
    pub fn reset(&self) -> Result<(), PeerError> {
        self.invalidate_all();
        Ok(self.func.reset()?)
    }

    /// Turns the exporter's memory decoding on or off; off revokes its buffers, so every
    /// MR over them is invalidated first.
    pub fn set_memory_enabled(&self, on: bool) -> Result<(), PeerError> {
        if !on {
            self.invalidate_all();
        }
        let f = &*self.func;
        let cmd = pci::config_read_u16(f, pci::config::COMMAND)?;
        let cmd = if on {
            cmd | pci::config::COMMAND_MEMORY
        } else {
            cmd & !pci::config::COMMAND_MEMORY
        };
        Ok(pci::config_write_u16(f, pci::config::COMMAND, cmd)?)
    }

    /// Closes the device for exports after invalidating every MR over it (the exporter's
    /// buffers are revoked for good when the function itself is closed or dropped).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.invalidate_all();
    }
}

/// A dma-buf of a [`PeerDevice`]'s BAR range, and the peer-memory client over it:
/// [`PeerTarget::Range`] `addr` is an offset in the buffer (page aligned).
pub struct PeerBuffer {
    fd: OwnedFd,
    len: u64,
    name: String,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for PeerBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerBuffer")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish()
    }
}

impl PeerBuffer {
    /// The dma-buf fd (to hand to another process, or to [`Pd::reg_dmabuf_mr`](crate::resource::Pd::reg_dmabuf_mr)).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false (empty exports are refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The whole buffer as a registration target.
    pub fn whole(&self) -> PeerTarget<'static> {
        PeerTarget::Range {
            addr: 0,
            len: self.len,
        }
    }
}

impl PeerMemoryClient for PeerBuffer {
    fn name(&self) -> &str {
        &self.name
    }

    fn acquire(&self, target: &PeerTarget<'_>) -> Result<Option<Box<dyn PeerMemory>>, PeerError> {
        let (addr, len) = match *target {
            PeerTarget::Range { addr, len } => (addr, len),
            PeerTarget::DmaBuf { .. } => return Ok(None),
        };
        if len == 0 {
            return Err(PeerError::Empty);
        }
        if !addr.is_multiple_of(4096) || addr.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(PeerError::Range {
                offset: addr,
                len,
                size: self.len,
            });
        }
        let fd = self.fd.try_clone().map_err(|source| PciError::Os {
            what: "dup dma-buf fd",
            source,
        })?;
        Ok(Some(Box::new(BufferMemory {
            inner: FdMemory::new(fd, addr, len)?,
            registry: self.registry.clone(),
            id: None,
        })))
    }
}

/// A claim on a [`PeerBuffer`]: a dma-buf claim whose invalidation handle the exporter
/// holds while pages are held.
struct BufferMemory {
    inner: FdMemory,
    registry: Arc<Registry>,
    id: Option<u64>,
}

impl PeerMemory for BufferMemory {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn get_pages(&mut self, invalidation: Invalidation) -> Result<(), PeerError> {
        self.id = Some(self.registry.add(invalidation.clone()));
        self.inner.get_pages(invalidation)
    }

    fn dma_map(&mut self, func: &dyn PciFunction, iova: Iova) -> Result<Vec<DmaBlock>, PeerError> {
        self.inner.dma_map(func, iova)
    }

    fn dma_unmap(&mut self, func: &dyn PciFunction, blocks: &[DmaBlock]) -> Result<(), PeerError> {
        self.inner.dma_unmap(func, blocks)
    }

    fn put_pages(&mut self) {
        if let Some(id) = self.id.take() {
            self.registry.remove(id);
        }
        self.inner.put_pages();
    }
}

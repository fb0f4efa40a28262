//! The model HCA behind the vfio-user server ([`ModelDevice`], a [`ServerBackend`]): what each
//! message of a session does to the model (config space, BAR0, interrupts, DMA mappings, reset),
//! and what a client leaves behind, dropped when it goes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_BAR0_REGION_INDEX,
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, ServerBackend};

use super::host::ClientMemory;
use super::{doorman, host, vfu};
use uhca::hw::model::{Hca, IOVA_END, ModelError};

/// The vfio-user device: the model plus what the current client gave it.
pub(super) struct ModelDevice {
    pub(super) hca: Hca,
    /// Client regions mapped here and in the model IOMMU.
    mem: ClientMemory,
    /// DMA_MAPs without a file, by IOVA: length and whether the model IOMMU maps it to
    /// the client by messages (else it is accepted but not DMA-able).
    unbacked: BTreeMap<u64, (u64, bool)>,
    /// The current session's sender of DMA_READ/DMA_WRITE (own loop only).
    pub(super) port: Option<std::sync::Arc<vfu::DmaPort>>,
    /// The current session's doorman, told when the client first touches the device.
    pub(super) session: Option<doorman::Opener>,
    /// Whether the current session touched the device.
    pub(super) touched: bool,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn model_err(e: ModelError) -> io::Error {
    invalid(e.to_string())
}

impl ModelDevice {
    pub(super) fn new(hca: Hca) -> ModelDevice {
        ModelDevice {
            hca,
            mem: ClientMemory::default(),
            unbacked: BTreeMap::new(),
            port: None,
            session: None,
            touched: false,
        }
    }

    /// Records that the client used the device (each backend call): it is now served, and
    /// the doorman tells newcomers so.
    fn touch(&mut self) {
        if !self.touched {
            self.touched = true;
            if let Some(o) = &self.session {
                o.serving();
            }
        }
    }

    /// A DMA_MAP without a file: the model reaches `[address, address + size)` by
    /// DMA_READ/DMA_WRITE messages to the client at the same addresses (the session's
    /// port), read-only unless the client gave write access; without a port, or where the
    /// model IOMMU cannot map the range, it is accepted but not DMA-able.
    fn map_unbacked(&mut self, flags: DmaMapFlags, address: u64, size: u64) -> io::Result<()> {
        if self.unbacked.contains_key(&address) {
            return Err(invalid(format!(
                "DMA_MAP at {address:#x}: a range is already mapped there"
            )));
        }
        let writable = flags.contains(DmaMapFlags::WRITE);
        let remote = match (&self.port, usize::try_from(size)) {
            (Some(port), Ok(len)) => {
                let mem: std::sync::Arc<dyn uhca::hw::model::RemoteMemory> = port.clone();
                match self
                    .hca
                    .dma_map_remote(address, len, mem, address, writable)
                {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(iova = address, size, error = %e,
                            "DMA_MAP without a file: accepted but not DMA-able");
                        false
                    }
                }
            }
            _ => {
                tracing::warn!(
                    iova = address,
                    size,
                    "DMA_MAP without a file: accepted but not DMA-able (no DMA_READ/DMA_WRITE port)"
                );
                false
            }
        };
        if remote {
            tracing::debug!(
                iova = address,
                size,
                ?flags,
                "DMA_MAP without a file: reached by DMA_READ/DMA_WRITE"
            );
        }
        self.unbacked.insert(address, (size, remote));
        Ok(())
    }

    /// Unmaps the regions that start inside `[iova, iova + len)`; `len` = 0: all of them.
    fn unmap_range(&mut self, iova: u64, len: u64) -> io::Result<()> {
        let (start, end) = if len == 0 {
            (0, u64::MAX)
        } else {
            (iova, iova.saturating_add(len))
        };
        let n = self.mem.unmap(&self.hca, start, end)?;
        tracing::debug!(iova, len, regions = n, "DMA unmapped");
        let gone: Vec<(u64, u64, bool)> = self
            .unbacked
            .range(start..end)
            .map(|(k, (len, remote))| (*k, *len, *remote))
            .collect();
        for (k, len, remote) in gone {
            self.unbacked.remove(&k);
            if remote {
                // Waits for in-flight device accesses (their messages are bounded).
                if let Err(e) = self.hca.dma_unmap(k, len as usize) {
                    tracing::error!(iova = k, error = %e, "unmapping a range reached by messages");
                }
            }
        }
        Ok(())
    }

    /// Forgets the client: DMA mappings, interrupt routes; resets the model.
    pub(super) fn release_client(&mut self) {
        if let Err(e) = self.unmap_range(0, 0) {
            tracing::error!(error = %e, "dropping the client's DMA mappings");
        }
        for v in 0..self.hca.num_irqs() {
            let _ = self.hca.set_irq(v, None);
        }
        self.hca.reset();
    }
}

impl Drop for ModelDevice {
    fn drop(&mut self) {
        // The IOMMU must forget the client's memory before it is unmapped.
        let _ = self.unmap_range(0, 0);
    }
}

impl ServerBackend for ModelDevice {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> io::Result<()> {
        self.touch();
        match region {
            VFIO_PCI_CONFIG_REGION_INDEX => {
                let off = u16::try_from(offset)
                    .map_err(|_| invalid(format!("config read at {offset:#x}")))?;
                self.hca.config_read(off, data).map_err(model_err)
            }
            VFIO_PCI_BAR0_REGION_INDEX => host::bar_read(&self.hca, offset, data),
            _ => Err(invalid(format!("region {region} does not exist"))),
        }
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        self.touch();
        match region {
            VFIO_PCI_CONFIG_REGION_INDEX => {
                let off = u16::try_from(offset)
                    .map_err(|_| invalid(format!("config write at {offset:#x}")))?;
                tracing::trace!(offset = off, len = data.len(), "config write");
                self.hca.config_write(off, data).map_err(model_err)
            }
            VFIO_PCI_BAR0_REGION_INDEX => {
                // One access: an EQ doorbell is applied as it comes (trapped UAR pages).
                if usize::try_from(offset).is_ok_and(|o| self.hca.doorbell_write(o, data)) {
                    return Ok(());
                }
                host::bar_write(&self.hca, offset, data)
            }
            _ => Err(invalid(format!("region {region} does not exist"))),
        }
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> io::Result<()> {
        self.touch();
        // The range must fit the model's IOVA space (48 bits, as its IOMMU), mapped or not:
        // a wrapping or absurd size (~2^64 bytes) is refused, not accepted with a warning.
        let end = address.checked_add(size);
        if size == 0 || end.is_none_or(|e| e > IOVA_END + 1) {
            return Err(invalid(format!(
                "DMA_MAP of {size:#x} bytes at {address:#x}: outside the IOVA space \
                 (0..={IOVA_END:#x})"
            )));
        }
        let Some(file) = fd else {
            return self.map_unbacked(flags, address, size);
        };
        // Every IOVA is DMA-able, page 0 included (QEMU maps guest RAM at its physical
        // addresses from 0; a guest IOMMU may hand out IOVA 0).
        let len = usize::try_from(size).map_err(|_| invalid(format!("size {size:#x}")))?;
        let writable = flags.contains(DmaMapFlags::WRITE);
        let read_only = self
            .mem
            .map(&self.hca, &file, offset, address, len, writable)?;
        tracing::debug!(
            iova = address,
            size,
            offset,
            ?flags,
            read_only,
            regions = self.mem.len(),
            "DMA region mapped"
        );
        Ok(())
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> io::Result<()> {
        self.touch();
        if flags.contains(DmaUnmapFlags::UNMAP_ALL) {
            tracing::debug!("DMA_UNMAP all");
            return self.unmap_range(0, 0);
        }
        if size == 0 {
            return Err(invalid("DMA_UNMAP of zero bytes".into()));
        }
        self.unmap_range(address, size)
    }

    fn reset(&mut self) -> io::Result<()> {
        self.touch();
        tracing::info!("device reset");
        self.hca.reset();
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> io::Result<()> {
        self.touch();
        tracing::debug!(index, flags, start, count, fds = fds.len(), "SET_IRQS");
        if index != VFIO_PCI_MSIX_IRQ_INDEX {
            return if count == 0 {
                Ok(())
            } else {
                Err(invalid(format!("interrupt index {index} has no vectors")))
            };
        }
        if flags & (VFIO_IRQ_SET_ACTION_MASK | VFIO_IRQ_SET_ACTION_UNMASK) != 0 {
            return Ok(()); // MSI-X masking is the client's (QEMU emulates the table)
        }
        if flags & VFIO_IRQ_SET_ACTION_TRIGGER == 0 {
            return Err(invalid(format!("SET_IRQS flags {flags:#x}")));
        }
        let n = self.hca.num_irqs();
        let end = start
            .checked_add(count)
            .filter(|e| *e <= n)
            .ok_or_else(|| invalid(format!("vectors {start}+{count} of {n}")))?;
        if flags & VFIO_IRQ_SET_DATA_NONE != 0 {
            // count 0: disable every vector (VFIO semantics); else a software trigger,
            // which the model does not offer.
            if count == 0 {
                for v in 0..n {
                    let _ = self.hca.set_irq(v, None);
                }
                return Ok(());
            }
            return Err(invalid("software-triggered MSI-X is not supported".into()));
        }
        if flags & VFIO_IRQ_SET_DATA_EVENTFD == 0 {
            return Err(invalid(format!("SET_IRQS data type {flags:#x}")));
        }
        if fds.is_empty() && count > 0 {
            // A vfio-user client cannot send fd -1 ("disconnect") over SCM_RIGHTS: an
            // eventfd SET_IRQS with none attached disconnects the vectors (uhca's client).
            for v in start..end {
                self.hca.set_irq(v, None).map_err(model_err)?;
            }
            return Ok(());
        }
        if fds.len() != count as usize {
            return Err(invalid(format!(
                "SET_IRQS: {count} vectors but {} eventfds",
                fds.len()
            )));
        }
        for (v, f) in (start..end).zip(fds) {
            self.hca
                .set_irq(v, Some(host::eventfd_from_file(f)))
                .map_err(model_err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

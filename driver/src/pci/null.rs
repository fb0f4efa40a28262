//! A PCI function with no device behind it: BAR0 is plain memory that nobody reads, DMA
//! mappings are accepted and counted, there are no interrupts and no device thread. The
//! data path's stand-in rig (`datapath::rig`) and tests that must not share the process with
//! a device thread (allocation counting) run on it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use vmm_sys_util::eventfd::EventFd;

use super::{BarRegion, DmaMapping, Iova, IovaRange, PciError, PciFunction};

/// Bytes of the fake BAR0 (UAR pages 0..7).
const BAR_LEN: usize = 8 * 4096;

/// A device-less PCI function.
#[derive(Debug)]
pub struct NullFunction {
    bar: Box<[AtomicU64]>,
    mappings: AtomicUsize,
}

impl Default for NullFunction {
    fn default() -> Self {
        NullFunction {
            bar: (0..BAR_LEN / 8).map(|_| AtomicU64::new(0)).collect(),
            mappings: AtomicUsize::new(0),
        }
    }
}

impl NullFunction {
    /// DMA mappings currently in place.
    pub fn mappings(&self) -> usize {
        self.mappings.load(Ordering::Relaxed)
    }
}

// SAFETY: BAR0 is `bar`, owned by the function and never reallocated, so the region stays
// valid until the function is dropped; its words are atomics, so writes through the raw
// pointer mutate memory behind interior mutability. No device exists, so nothing reaches
// DMA memory before or after `dma_unmap`.
unsafe impl PciFunction for NullFunction {
    fn name(&self) -> String {
        "null".into()
    }
    fn config_read(&self, _offset: u16, buf: &mut [u8]) -> Result<(), PciError> {
        buf.fill(0);
        Ok(())
    }
    fn config_write(&self, _offset: u16, _data: &[u8]) -> Result<(), PciError> {
        Ok(())
    }
    fn map_bar(&self, index: u8) -> Result<BarRegion, PciError> {
        if index != 0 {
            return Err(PciError::NoBar(index));
        }
        Ok(BarRegion {
            ptr: self.bar.as_ptr() as *mut u8,
            len: BAR_LEN,
        })
    }
    fn iova_ranges(&self) -> Vec<IovaRange> {
        vec![IovaRange {
            start: 1 << 32,
            end: (1 << 40) - 1,
        }]
    }
    unsafe fn dma_map(&self, _m: &DmaMapping) -> Result<(), PciError> {
        self.mappings.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn dma_unmap(&self, _iova: Iova, _len: usize) -> Result<(), PciError> {
        self.mappings.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
    fn reset(&self) -> Result<(), PciError> {
        Ok(())
    }
    fn num_irqs(&self) -> u32 {
        0
    }
    fn set_irq(&self, vector: u32, _fd: Option<&EventFd>) -> Result<(), PciError> {
        Err(PciError::NoVector(vector))
    }
}

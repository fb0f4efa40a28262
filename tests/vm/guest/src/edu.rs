//! QEMU's `edu` teaching device (hw/misc/edu.c, docs/specs/edu.rst), reached through a
//! [`Bar`] of uhca's VFIO backend.
//!
//! Registers are little-endian; 32-bit below 0x80, 32- or 64-bit from 0x80. The DMA engine
//! copies between guest memory (an IOVA, translated by the IOMMU) and a 4 KiB buffer at
//! [`DMA_BUF`] inside the device; it is timer-driven (about 100 ms per transfer under TCG).

use std::time::{Duration, Instant};

use uhca::pci::Bar;

/// PCI vendor ID of QEMU's test devices.
pub const VENDOR: u16 = 0x1234;
/// PCI device ID of `edu`.
pub const DEVICE: u16 = 0x11e8;
/// Identification register: `0xRRrr00ed` (major, minor version, then 0xed).
pub const ID: usize = 0x00;
/// Liveness check: reads back the bitwise complement of what was written.
pub const LIVENESS: usize = 0x04;
/// Factorial: write n, read n! once [`STATUS_COMPUTING`] clears.
pub const FACTORIAL: usize = 0x08;
/// Status register.
pub const STATUS: usize = 0x20;
/// Status: a factorial is being computed.
pub const STATUS_COMPUTING: u32 = 0x01;
/// Status: raise interrupt 0x1 when the factorial is done.
pub const STATUS_IRQ_FACT: u32 = 0x80;
/// Interrupt status (the raised bits).
pub const IRQ_STATUS: usize = 0x24;
/// Interrupt raise: ORs the written value into the status and interrupts.
pub const IRQ_RAISE: usize = 0x60;
/// Interrupt acknowledge: clears the written bits.
pub const IRQ_ACK: usize = 0x64;
/// DMA source address (64-bit).
pub const DMA_SRC: usize = 0x80;
/// DMA destination address (64-bit).
pub const DMA_DST: usize = 0x88;
/// DMA byte count (64-bit).
pub const DMA_CNT: usize = 0x90;
/// DMA command (64-bit).
pub const DMA_CMD: usize = 0x98;
/// DMA command: start (cleared by the device when the transfer is done).
pub const DMA_START: u64 = 1;
/// DMA command: device buffer to RAM (otherwise RAM to device buffer).
pub const DMA_TO_RAM: u64 = 2;
/// DMA command: raise interrupt 0x100 when done.
pub const DMA_IRQ: u64 = 4;
/// Interrupt status bit of a finished DMA.
pub const IRQ_DMA: u32 = 0x100;
/// Device address of the device's internal DMA buffer.
pub const DMA_BUF: u64 = 0x40000;

/// The edu device's BAR0.
pub struct Edu {
    bar: Bar,
}

impl Edu {
    /// Wraps a mapped BAR0.
    pub fn new(bar: Bar) -> Edu {
        Edu { bar }
    }

    /// Reads the 32-bit register at `off`.
    pub fn r32(&self, off: usize) -> u32 {
        let mut v = [0u32];
        self.bar.read_u32s(off, &mut v);
        u32::from_le(v[0])
    }

    /// Writes the 32-bit register at `off`.
    pub fn w32(&self, off: usize, v: u32) {
        self.bar.write_u32s(off, &[v.to_le()]);
    }

    /// Reads the 64-bit register at `off`.
    pub fn r64(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.bar.read64_raw(off))
    }

    /// Writes the 64-bit register at `off` with one 64-bit store.
    pub fn w64(&self, off: usize, v: u64) {
        self.bar.write64_raw(off, v.to_le_bytes());
    }

    /// Computes `n!` on the device; `None` if it is still busy after `timeout`.
    pub fn factorial(&self, n: u32, timeout: Duration) -> Option<u32> {
        self.w32(FACTORIAL, n);
        let t0 = Instant::now();
        while self.r32(STATUS) & STATUS_COMPUTING != 0 {
            if t0.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Some(self.r32(FACTORIAL))
    }

    /// Starts a DMA of `len` bytes from `src` to `dst` (`cmd`: [`DMA_TO_RAM`], [`DMA_IRQ`]).
    pub fn start_dma(&self, src: u64, dst: u64, len: u64, cmd: u64) {
        self.w64(DMA_SRC, src);
        self.w64(DMA_DST, dst);
        self.w64(DMA_CNT, len);
        self.w64(DMA_CMD, cmd | DMA_START);
    }

    /// Waits until the DMA engine is idle; returns how long it took, or `None` on timeout.
    pub fn wait_dma(&self, timeout: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        while self.r64(DMA_CMD) & DMA_START != 0 {
            if t0.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Some(t0.elapsed())
    }

    /// One DMA, started and waited for.
    pub fn dma(&self, src: u64, dst: u64, len: u64, cmd: u64) -> Option<Duration> {
        self.start_dma(src, dst, len, cmd);
        self.wait_dma(Duration::from_secs(10))
    }
}

//! Peer memory: memory regions over another device's memory (a GPU's BAR, any dma-buf),
//! so the HCA reads and writes it directly (PCIe peer-to-peer), and their revocation.
//!
//! # The client interface
//!
//! This is the Rust form of PeerDirect's `peer_memory_client` (MLNX_OFED; nvidia-peermem
//! implements it for GPUs) and of the kernel RDMA dma-buf importer (dynamic attachment with
//! `move_notify`), vfio-kernel.md §3:
//!
//! | PeerDirect | here |
//! |---|---|
//! | `acquire(addr, size)`: is this range yours? | [`PeerMemoryClient::acquire`] of a [`PeerTarget`] (an address range or a dma-buf fd) → a claim, `Box<dyn PeerMemory>` |
//! | `get_pages` (+ the invalidation callback) | [`PeerMemory::get_pages`], given the MR's [`Invalidation`] handle |
//! | `dma_map` → sg table | [`PeerMemory::dma_map`] into our [`PciFunction`] at an IOVA the driver picks → [`DmaBlock`]s (page by page or as ranges) |
//! | `dma_unmap`, `put_pages`, `release` | [`PeerMemory::dma_unmap`], [`PeerMemory::put_pages`], [`PeerMemory::release`] |
//! | invalidate callback / `move_notify` | [`Invalidation::invalidate`], called by the client or exporter |
//!
//! Built-in clients: [`DmaBufClient`] (any dma-buf fd the application hands in, e.g. a
//! CUDA allocation exported with `cuMemGetHandleForAddressRange`: it plugs in here as a
//! plain fd) and [`PeerBuffer`] (a BAR range that a [`PeerDevice`] exported, which also
//! knows when its exporter revokes).
//!
//! # Registration
//!
//! [`Pd::reg_peer_mr`](crate::resource::Pd::reg_peer_mr) acquires the range, calls `get_pages`, allocates an IOVA window,
//! calls `dma_map`, builds the MTT from the returned blocks (the largest page size every
//! block boundary lines up with, prm-subset.md §7.5, §12 "pinned flow") and creates the
//! MKey (CREATE_MKEY, MTT mode). The MR's [`addr`](PeerMr::addr) is the IOVA of its first
//! byte; it works as a local SGE ([`PeerMr::sge`]) and as an RDMA target
//! ([`PeerMr::remote`]).
//!
//! # Revocation
//!
//! When the range goes away (the exporter resets, turns memory decoding off or closes; or
//! the client says so through [`Invalidation::invalidate`]; or the application calls
//! [`PeerMr::revoke`]), the driver, in this order:
//! 1. makes the MKey unusable: DESTROY_MKEY (prm-subset.md §12 lists it next to the UMR
//!    that sets `free`/zaps the MTTs, which needs a UMR QP this driver does not have). When
//!    the command completes the device has stopped using the key: every later access
//!    through it fails. The variant byte (`mkey_7_0`) changes on every registration, so a
//!    stale key does not match a new MKey at the same index;
//! 2. then unmaps the range from the device's IOMMU (`dma_unmap`) and returns the pages
//!    (`put_pages`), and frees the IOVA window.
//!
//! What the application sees: work requests that use the lkey complete with a local
//! protection error, requests from a peer that use the rkey are NAKed (remote access
//! error on the peer's CQE); either QP goes to the error state, as for any access error.
//! No byte reaches the old range. [`PeerMr::is_revoked`] is then true; the application
//! drops the MR, resets or recreates its QPs, and registers again once the exporter is
//! back (a new export if the exporter was closed). The driver never remaps by itself: the
//! kernel does not either (iommufd removes a revoked dma-buf's IOMMU mapping and never
//! restores it, vfio-kernel.md §2.3).
//!
//! An exporter that revokes *without* telling the driver first (a reset through another
//! path) is still safe on iommufd and the model: the kernel (model) removes the IOMMU
//! mapping, so the MKey's accesses fault instead of reaching the memory. Revoke through
//! [`PeerDevice`] so the MKeys die first, as the dma-buf revoke contract asks ("the
//! importer is not permitted to touch the memory" once revoke completes).
//!
//! # Locking rule
//!
//! The driver never calls into a client while holding a lock that the client's
//! invalidation path needs. [`Invalidation::invalidate`] takes only the MR's own state
//! lock, and only for the MKey command; every client callback (`get_pages`, `dma_map`,
//! `dma_unmap`, `put_pages`, `release`) runs with no driver lock held. The mapping is taken
//! out of the MR by whichever thread tears it down (the invalidating one or the one
//! dropping the MR) and only that thread calls `dma_unmap`/`put_pages`/`release`, once.
//! Consequence for clients: `invalidate()` calls back `dma_unmap` and `put_pages` on the
//! calling thread before it returns (as the kernel importer unmaps inside `move_notify`),
//! so a client must not hold, while it calls `invalidate()`, a lock that its own
//! `dma_unmap` or `put_pages` take. [`PeerDevice`] collects the handles under its lock,
//! releases it, then invalidates.

mod client;
mod exporter;
mod mr;

pub use client::DmaBufClient;
pub use exporter::{PeerBuffer, PeerDevice};
#[cfg(feature = "fuzzing")]
pub(crate) use mr::fuzz_reset_variant;
pub use mr::{Invalidation, PeerMr};

use std::os::fd::BorrowedFd;

use crate::cmd::CmdError;
use crate::dma::DmaError;
use crate::pci::{Iova, PciError, PciFunction};

/// What a client is asked to claim.
#[derive(Clone, Copy, Debug)]
pub enum PeerTarget<'a> {
    /// `len` bytes at `addr` in the client's own address space (a GPU virtual address, an
    /// offset in an exported buffer). Page aligned for the built-in clients.
    Range {
        /// First byte.
        addr: u64,
        /// Length in bytes.
        len: u64,
    },
    /// `len` bytes at `offset` of a dma-buf.
    DmaBuf {
        /// The dma-buf (the client keeps its own duplicate).
        fd: BorrowedFd<'a>,
        /// Offset in the buffer (page aligned).
        offset: u64,
        /// Length in bytes (page multiple).
        len: u64,
    },
}

/// A contiguous run of device addresses a client mapped (one page or a whole range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaBlock {
    /// Device address of the first byte.
    pub iova: Iova,
    /// Length in bytes.
    pub len: u64,
}

/// A peer-memory client (PeerDirect's `peer_memory_client`): decides whether it owns a
/// range and hands out claims on it.
pub trait PeerMemoryClient: Send + Sync {
    /// A name for logs and errors.
    fn name(&self) -> &str;
    /// Claims `target` if it is this client's memory (`Ok(None)`: not mine).
    fn acquire(&self, target: &PeerTarget<'_>) -> Result<Option<Box<dyn PeerMemory>>, PeerError>;
}

/// One claimed range (PeerDirect's client context). The driver calls `get_pages`,
/// `dma_map`, later `dma_unmap`, `put_pages` and `release`, each at most once and in this
/// order, never with a driver lock held (module docs, "Locking rule").
pub trait PeerMemory: Send {
    /// Length of the claimed range in bytes.
    fn len(&self) -> u64;
    /// Whether the claim is empty (never for the built-in clients).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Pins the range. `invalidation` is the MR's handle: call
    /// [`Invalidation::invalidate`] when the range goes away.
    fn get_pages(&mut self, invalidation: Invalidation) -> Result<(), PeerError>;
    /// Maps the range for `func` starting at `iova` (aligned as the driver chose, with
    /// room for `len()` rounded up to the page size) and returns the device addresses in
    /// order.
    fn dma_map(&mut self, func: &dyn PciFunction, iova: Iova) -> Result<Vec<DmaBlock>, PeerError>;
    /// Undoes `dma_map`. Runs after the MKey is gone.
    fn dma_unmap(&mut self, func: &dyn PciFunction, blocks: &[DmaBlock]) -> Result<(), PeerError>;
    /// Undoes `get_pages`.
    fn put_pages(&mut self);
    /// Drops the claim.
    fn release(self: Box<Self>) {}
}

/// Errors of peer-memory registration.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// No client claimed the target.
    #[error("peer memory client {client} does not own this range")]
    NotClaimed {
        /// The client asked.
        client: String,
    },
    /// A zero-length range.
    #[error("zero-length peer memory range")]
    Empty,
    /// A range that is not page aligned or lies outside the buffer.
    #[error(
        "range of {len:#x} bytes at {offset:#x} is not page aligned or outside the {size:#x}-byte buffer"
    )]
    Range {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Size of the buffer.
        size: u64,
    },
    /// The access flags are not a valid combination.
    #[error("invalid access flags: remote write and remote atomic need local write")]
    InvalidAccess,
    /// The client's device addresses cannot be described by one MTT.
    #[error("the client's DMA blocks cannot form an MTT: {0}")]
    Blocks(&'static str),
    /// The range (or the MR) was revoked.
    #[error("peer memory was revoked; register again once the exporter is back")]
    Revoked,
    /// The exporter was closed.
    #[error("the peer device is closed")]
    ExporterClosed,
    /// The device is closed.
    #[error("device is closed")]
    Closed,
    /// A PCI-layer error (dma-buf import or export refusals carry the kernel limit).
    #[error(transparent)]
    Pci(#[from] PciError),
    /// IOVA allocation failed.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// A command failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
}

#[cfg(test)]
mod tests;

//! Memory the device reaches only by messages: a range the host's side of the bus serves on
//! request instead of handing over as shared memory.
//!
//! A vfio-user client (QEMU) maps some guest IOVAs for the device without a file behind
//! them: an IOVA the guest mapped to another function's BAR (a peer's dma-buf imported
//! through the guest IOMMU). The only way to reach such memory is to ask the client, which
//! reads or writes it on the device's behalf (vfio-user DMA_READ/DMA_WRITE). The model does
//! not know the transport: whoever maps such a range ([`Hca::dma_map_remote`]) hands it a
//! [`RemoteMemory`], and the IOMMU routes every device access that lands in the range to it.
//! Each access waits for its answer, bounded by the implementation; a failed one is a
//! [`RemoteError`], which the model turns into the hardware's error (an error completion),
//! never a panic or a hang.
//!
//! Such memory has no atomics: an 8-byte atomic there fails ([`RemoteFailure::NoAtomics`]),
//! as a PCIe AtomicOp to a completer without atomics support does.
//!
//! [`Hca::dma_map_remote`]: super::Hca::dma_map_remote

/// Memory accessed by messages: reads and writes of bus addresses, each answered or failed
/// within a bounded wait. Called from the device thread (and from command handlers) while
/// the IOMMU table's read lock is held, so a call must not wait for a change of that table.
pub trait RemoteMemory: Send + Sync {
    /// Reads `dst.len()` bytes at bus address `addr`.
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), RemoteError>;
    /// Writes `src` at bus address `addr`.
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), RemoteError>;
}

/// Why an access to remote memory failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteFailure {
    /// No answer within the bounded wait.
    NoReply,
    /// The other side refused the access, with an errno.
    Refused(u32),
    /// The answer did not match the request.
    Malformed,
    /// The channel to the other side is closed.
    Closed,
    /// An 8-byte atomic: remote memory has none.
    NoAtomics,
}

impl std::fmt::Display for RemoteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteFailure::NoReply => write!(f, "no reply"),
            RemoteFailure::Refused(e) => write!(f, "refused (errno {e})"),
            RemoteFailure::Malformed => write!(f, "malformed reply"),
            RemoteFailure::Closed => write!(f, "channel closed"),
            RemoteFailure::NoAtomics => write!(f, "no atomics on memory reached by messages"),
        }
    }
}

/// A failed access to remote memory at bus address `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("remote memory access at {addr:#x}: {failure}")]
pub struct RemoteError {
    /// The bus address of the access (or of the part that failed).
    pub addr: u64,
    /// What went wrong.
    pub failure: RemoteFailure,
}

//! The memory seam of the RC engine: the keyed, checked memory it reads and writes
//! ([`Memory`]), the access each operation needs and how one fails.

/// The access a memory operation needs (IBA Vol. 1 §10.6.3 access rights).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessKind {
    /// Local read through an L_Key (gather for SEND/WRITE).
    LocalRead,
    /// Local write through an L_Key (receive buffers, READ and atomic results).
    LocalWrite,
    /// Remote read through an R_Key.
    RemoteRead,
    /// Remote write through an R_Key.
    RemoteWrite,
    /// Remote atomic through an R_Key.
    RemoteAtomic,
}

/// Why a memory access failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum AccessError {
    /// No such key (or the key's tag does not match).
    #[error("invalid key {key:#x}")]
    InvalidKey {
        /// The key.
        key: u32,
    },
    /// The range is outside the region the key covers.
    #[error("range outside the memory region")]
    OutOfRange,
    /// The key does not grant the access.
    #[error("access not permitted by the key")]
    Denied,
    /// An atomic target is not 8-byte aligned.
    #[error("misaligned atomic address")]
    Misaligned,
    /// The translation behind the key failed (IOMMU fault, revoked memory).
    #[error("translation fault")]
    Fault,
}

/// A 64-bit atomic operation on remote memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Store `swap` if the value equals `compare`.
    CompareSwap {
        /// Compared with.
        compare: u64,
        /// Stored when equal.
        swap: u64,
    },
    /// Add `add`.
    FetchAdd {
        /// Added.
        add: u64,
    },
}

/// Memory as the engine sees it: keyed, checked, byte-addressed. Implemented by the model
/// over its MKeys, MTTs and IOMMU. `key` is an L_Key for local and an R_Key for remote
/// accesses. Ranges never wrap.
pub trait Memory {
    /// Whether `len` bytes at `va` may be accessed with `access` (checked before a
    /// READ or WRITE is accepted, so a bad R_Key is NAKed before any data moves).
    fn check(&self, key: u32, va: u64, len: u64, access: AccessKind) -> Result<(), AccessError>;
    /// Reads `buf.len()` bytes at `va`.
    fn read(
        &self,
        key: u32,
        va: u64,
        buf: &mut [u8],
        access: AccessKind,
    ) -> Result<(), AccessError>;
    /// Writes `data` at `va`.
    fn write(&self, key: u32, va: u64, data: &[u8], access: AccessKind) -> Result<(), AccessError>;
    /// Performs `op` on the 8 bytes at `va` atomically with respect to other atomics of
    /// the device ([`AccessKind::RemoteAtomic`] required) and returns the original value. The
    /// byte order of the target is the model's choice.
    fn atomic(&self, key: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError>;
    /// The protection domain this memory checks keys in, as a [`Burst`](super::Burst) names it for the
    /// receiving side's [`copy_in`](Self::copy_in). Opaque to the engine; 0 where there is
    /// only one.
    fn domain(&self) -> u32 {
        0
    }
    /// Whether `len` bytes at `va` may be read through local key `key` in protection domain
    /// `domain` ([`AccessKind::LocalRead`]): the receiving end's look at a [`Burst`](super::Burst)'s payload
    /// before it commits anything to it. The provided version, for a memory with one
    /// domain, is [`check`](Self::check).
    fn check_in(&self, domain: u32, key: u32, va: u64, len: u64) -> Result<(), AccessError> {
        let _ = domain;
        self.check(key, va, len, AccessKind::LocalRead)
    }
    /// Copies `len` bytes at `src_va` of local key `src_key`, checked in protection domain
    /// `src_domain` with [`AccessKind::LocalRead`], to `dst_va` through `dst_key` with
    /// `access`: the receiving end of a [`Burst`](super::Burst), whose payload never left the sender's
    /// memory. The provided version, for a memory with one domain, moves the bytes through
    /// a small buffer with [`read`](Self::read) and [`write`](Self::write), after checking
    /// the target; the model copies memory to memory.
    #[allow(clippy::too_many_arguments)]
    fn copy_in(
        &self,
        dst_key: u32,
        dst_va: u64,
        access: AccessKind,
        src_domain: u32,
        src_key: u32,
        src_va: u64,
        len: u64,
    ) -> Result<(), CopyFault> {
        let _ = src_domain;
        self.check(dst_key, dst_va, len, access)
            .map_err(CopyFault::Target)?;
        let mut buf = [0u8; 1024];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            self.read(src_key, src_va + done, &mut buf[..n], AccessKind::LocalRead)
                .map_err(CopyFault::Source)?;
            self.write(dst_key, dst_va + done, &buf[..n], access)
                .map_err(CopyFault::Target)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Makes the copies of `reqs` in order, as [`copy_in`](Self::copy_in) would one after
    /// another, up to the first that a check of either end would refuse, and returns how
    /// many it made. That one and those after it are not attempted: nothing of theirs is
    /// touched or counted, and the caller takes them the usual way. The provided version
    /// checks both ends of each before copying it; the model checks every copy first and
    /// then moves the bytes back to back.
    fn copy_in_batch(&self, reqs: &[CopyIn]) -> usize {
        for (i, r) in reqs.iter().enumerate() {
            let passes = self
                .check_in(r.src_domain, r.src_key, r.src_va, r.len)
                .is_ok()
                && self.check(r.dst_key, r.dst_va, r.len, r.access).is_ok();
            let copied = passes
                && self
                    .copy_in(
                        r.dst_key,
                        r.dst_va,
                        r.access,
                        r.src_domain,
                        r.src_key,
                        r.src_va,
                        r.len,
                    )
                    .is_ok();
            if !copied {
                return i;
            }
        }
        reqs.len()
    }
}

/// One copy of a [`Memory::copy_in_batch`]: the arguments of [`Memory::copy_in`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyIn {
    /// The target's key.
    pub dst_key: u32,
    /// The target's address.
    pub dst_va: u64,
    /// The access the target needs.
    pub access: AccessKind,
    /// The protection domain the source is read in.
    pub src_domain: u32,
    /// The source's local key.
    pub src_key: u32,
    /// The source's address.
    pub src_va: u64,
    /// Bytes.
    pub len: u64,
}

/// Which end of a [`Memory::copy_in`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CopyFault {
    /// The sender's memory (its key no longer holds, say).
    #[error("source: {0}")]
    Source(AccessError),
    /// The receiver's memory.
    #[error("target: {0}")]
    Target(AccessError),
}

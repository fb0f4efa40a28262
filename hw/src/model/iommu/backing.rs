//! What a mapping of the model IOMMU reaches ([`Backing`]): host memory, accessed
//! directly, or memory reached by messages (`remote.rs`), and the copy between two of them.

use std::sync::Arc;

use super::super::mem::HostRegion;
use super::super::remote::{RemoteError, RemoteMemory};

/// What a mapping reaches: host memory, or memory accessed by messages.
pub(crate) enum Backing {
    /// Host memory, accessed directly.
    Host(HostRegion),
    /// Memory served by `mem`; the mapping's first byte is its bus address `addr`.
    Remote {
        /// The memory.
        mem: Arc<dyn RemoteMemory>,
        /// Bus address of the mapping's first byte.
        addr: u64,
    },
}

impl Backing {
    /// Copies `dst.len()` bytes at `off` into `dst`.
    #[inline]
    pub(super) fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), RemoteError> {
        match self {
            Backing::Host(r) => {
                r.read(off, dst);
                Ok(())
            }
            Backing::Remote { mem, addr } => mem.read(addr + off as u64, dst),
        }
    }

    /// Copies `src` to `off`.
    #[inline]
    pub(super) fn write(&self, off: usize, src: &[u8]) -> Result<(), RemoteError> {
        match self {
            Backing::Host(r) => {
                r.write(off, src);
                Ok(())
            }
            Backing::Remote { mem, addr } => mem.write(addr + off as u64, src),
        }
    }

    /// Stores one byte with release ordering (a plain one-byte write when remote: the
    /// message is sent after every earlier access of this thread was answered).
    #[inline]
    pub(super) fn store_u8_release(&self, off: usize, v: u8) -> Result<(), RemoteError> {
        match self {
            Backing::Host(r) => {
                r.store_u8_release(off, v);
                Ok(())
            }
            Backing::Remote { .. } => self.write(off, &[v]),
        }
    }

    /// Loads one byte with acquire ordering (a one-byte read when remote).
    #[inline]
    pub(super) fn load_u8_acquire(&self, off: usize) -> Result<u8, RemoteError> {
        match self {
            Backing::Host(r) => Ok(r.load_u8_acquire(off)),
            Backing::Remote { .. } => {
                let mut b = [0u8];
                self.read(off, &mut b)?;
                Ok(b[0])
            }
        }
    }
}

/// Copies `n` bytes from `off` of `src` to `dst_off` of `dst`: directly between host
/// memory, else through a bounce buffer (remote memory on either side). The error says
/// which side failed: `(true, e)` for the source.
pub(super) fn copy_chunk(
    src: &Backing,
    off: usize,
    dst: &Backing,
    dst_off: usize,
    n: usize,
) -> Result<(), (bool, RemoteError)> {
    if let (Backing::Host(s), Backing::Host(d)) = (src, dst) {
        s.copy_to(off, d, dst_off, n);
        return Ok(());
    }
    let mut bounce = vec![0u8; n];
    src.read(off, &mut bounce).map_err(|e| (true, e))?;
    dst.write(dst_off, &bounce).map_err(|e| (false, e))
}

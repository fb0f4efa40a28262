//! Scatter/gather lists and the copies between them and packet payloads.

use super::error::RcPostError;
use super::memory::{AccessError, AccessKind, CopyFault, Memory};

/// Most SGEs in one list (a send WQE of 16 data segments; the model may advertise fewer).
pub const MAX_SGE: usize = 16;
/// Most inline bytes in one work request.
pub const MAX_INLINE: usize = 512;

/// One scatter/gather entry: `len` bytes at `addr` under `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RcSge {
    /// Local key.
    pub lkey: u32,
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// A fixed-capacity list of up to [`MAX_SGE`] entries (no allocation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SgeList {
    len: u8,
    sges: [RcSge; MAX_SGE],
}

impl SgeList {
    /// An empty list.
    pub const fn new() -> Self {
        Self {
            len: 0,
            sges: [RcSge {
                lkey: 0,
                addr: 0,
                len: 0,
            }; MAX_SGE],
        }
    }
    /// A list of the given entries.
    pub fn from_slice(sges: &[RcSge]) -> Result<Self, RcPostError> {
        let mut l = Self::new();
        for s in sges {
            l.push(*s)?;
        }
        Ok(l)
    }
    /// Appends an entry.
    pub fn push(&mut self, sge: RcSge) -> Result<(), RcPostError> {
        let slot = self
            .sges
            .get_mut(usize::from(self.len))
            .ok_or(RcPostError::TooManySges { max: MAX_SGE })?;
        *slot = sge;
        self.len += 1;
        Ok(())
    }
    /// Removes every entry (the storage is kept, not cleared).
    pub fn clear(&mut self) {
        self.len = 0;
    }
    /// The entries.
    pub fn as_slice(&self) -> &[RcSge] {
        &self.sges[..usize::from(self.len)]
    }
    /// Total bytes.
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| u64::from(s.len)).sum()
    }
}

/// Why a copy between an SGE list and a payload failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CopyError {
    /// The list is shorter than `offset + len`.
    Length,
    /// A key check failed.
    AccessKind(AccessError),
}

/// Visits the pieces of `sges` that cover `len` bytes from byte `offset` of the list, as
/// (entry, address, piece offset in the span, piece length).
fn pieces(
    sges: &SgeList,
    offset: u64,
    len: usize,
    mut f: impl FnMut(&RcSge, u64, usize, usize) -> Result<(), AccessError>,
) -> Result<(), CopyError> {
    let mut skip = offset;
    let mut done = 0usize;
    for s in sges.as_slice() {
        if done == len {
            break;
        }
        let sl = u64::from(s.len);
        if skip >= sl {
            skip -= sl;
            continue;
        }
        let n = ((sl - skip) as usize).min(len - done);
        f(s, s.addr + skip, done, n).map_err(CopyError::AccessKind)?;
        done += n;
        skip = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(CopyError::Length)
    }
}

/// Copies `buf.len()` bytes from byte `offset` of the list into `buf`.
pub(super) fn gather(
    mem: &dyn Memory,
    sges: &SgeList,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), CopyError> {
    let len = buf.len();
    pieces(sges, offset, len, |s, va, at, n| {
        mem.read(s.lkey, va, &mut buf[at..at + n], AccessKind::LocalRead)
    })
}

/// Copies `data` to byte `offset` of the list.
pub(super) fn scatter(
    mem: &dyn Memory,
    sges: &SgeList,
    offset: u64,
    data: &[u8],
) -> Result<(), CopyError> {
    pieces(sges, offset, data.len(), |s, va, at, n| {
        mem.write(s.lkey, va, &data[at..at + n], AccessKind::LocalWrite)
    })
}

/// Checks that `len` bytes from byte `offset` of the list may be read ([`AccessKind::LocalRead`])
/// without reading them: the sender's side of a [`Burst`](super::Burst), whose payload the
/// receiver copies in later.
pub(super) fn check_gather(
    mem: &dyn Memory,
    sges: &SgeList,
    offset: u64,
    len: usize,
) -> Result<(), CopyError> {
    pieces(sges, offset, len, |s, va, _, n| {
        mem.check(s.lkey, va, n as u64, AccessKind::LocalRead)
    })
}

/// Copies `len` bytes from byte `offset` of `sges` (read in protection domain `domain`)
/// to `dst_va` through `dst_key` with `access` ([`Memory::copy_in`] piece by piece).
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_in(
    mem: &dyn Memory,
    dst_key: u32,
    dst_va: u64,
    access: AccessKind,
    domain: u32,
    sges: &SgeList,
    offset: u64,
    len: usize,
) -> Result<(), CopyFault> {
    // A list shorter than the sender checked changed under the frame: the source's fault.
    copy_pieces(
        sges,
        offset,
        len,
        CopyFault::Source,
        |s, va, at| (dst_key, dst_va + at, access, s.lkey, va),
        mem,
        domain,
    )
}

/// Copies `len` bytes at `src_va` through `src_key` (read in protection domain `domain`)
/// to byte `offset` of the list ([`AccessKind::LocalWrite`]): the requester's end of a READ
/// response [`Burst`](super::Burst). A list shorter than `offset + len` is a target fault.
#[allow(clippy::too_many_arguments)]
pub(super) fn scatter_from(
    mem: &dyn Memory,
    sges: &SgeList,
    offset: u64,
    len: usize,
    domain: u32,
    src_key: u32,
    src_va: u64,
) -> Result<(), CopyFault> {
    copy_pieces(
        sges,
        offset,
        len,
        CopyFault::Target,
        |s, va, at| (s.lkey, va, AccessKind::LocalWrite, src_key, src_va + at),
        mem,
        domain,
    )
}

/// [`Memory::copy_in`] for each piece of `len` bytes from byte `offset` of `sges`: `ends`
/// maps a piece (entry, address, offset in the span) to (target key, target address,
/// access, source key, source address). A list too short is `short`'s fault.
fn copy_pieces(
    sges: &SgeList,
    offset: u64,
    len: usize,
    short: fn(AccessError) -> CopyFault,
    ends: impl Fn(&RcSge, u64, u64) -> (u32, u64, AccessKind, u32, u64),
    mem: &dyn Memory,
    domain: u32,
) -> Result<(), CopyFault> {
    let mut fault = None;
    let res = pieces(sges, offset, len, |s, va, at, n| {
        let (dk, dva, access, sk, sva) = ends(s, va, at as u64);
        mem.copy_in(dk, dva, access, domain, sk, sva, n as u64)
            .map_err(|f| {
                fault = Some(f);
                AccessError::Fault
            })
    });
    match (res, fault) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(f)) => Err(f),
        (Err(_), None) => Err(short(AccessError::OutOfRange)),
    }
}

/// Checks that `len` bytes from byte `offset` of the list may be read in protection domain
/// `domain` ([`Memory::check_in`]): a receiver's look at a [`Burst`](super::Burst)'s
/// payload before it spends a receive WR on it.
pub(super) fn check_gather_in(
    mem: &dyn Memory,
    domain: u32,
    sges: &SgeList,
    offset: u64,
    len: usize,
) -> Result<(), CopyError> {
    pieces(sges, offset, len, |s, va, _, n| {
        mem.check_in(domain, s.lkey, va, n as u64)
    })
}

/// Why [`copy_between`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SendFault {
    /// The target list is shorter than its offset and the length.
    Short,
    /// A write to the target was refused.
    Target(AccessError),
    /// A read of the source was refused.
    Source(AccessError),
}

/// Copies `len` bytes from byte `src_off` of `src` (read in protection domain `domain`) to
/// byte `dst_off` of `dst` ([`AccessKind::LocalWrite`]), in order: the receiving end of a SEND
/// [`Burst`](super::Burst). On a fault, the bytes before it are placed and the error says
/// how many (of the `len`) and why.
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_between(
    mem: &dyn Memory,
    dst: &SgeList,
    dst_off: u64,
    domain: u32,
    src: &SgeList,
    src_off: u64,
    len: usize,
) -> Result<(), (usize, SendFault)> {
    let mut fault = None;
    let res = pieces(dst, dst_off, len, |d, dva, at, n| {
        let inner = pieces(src, src_off + at as u64, n, |s, sva, at2, n2| {
            let to = dva + at2 as u64;
            mem.copy_in(
                d.lkey,
                to,
                AccessKind::LocalWrite,
                domain,
                s.lkey,
                sva,
                n2 as u64,
            )
            .map_err(|f| {
                fault = Some(match f {
                    CopyFault::Target(e) => (at + at2, SendFault::Target(e)),
                    CopyFault::Source(e) => (at + at2, SendFault::Source(e)),
                });
                AccessError::Fault
            })
        });
        match inner {
            Ok(()) => Ok(()),
            Err(CopyError::Length) => {
                // The source list is shorter than the sender checked.
                fault = Some((at, SendFault::Source(AccessError::OutOfRange)));
                Err(AccessError::Fault)
            }
            Err(CopyError::AccessKind(e)) => Err(e),
        }
    });
    match (res, fault) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(f)) => Err(f),
        // The target list ran out: everything it holds from `dst_off` on was placed.
        (Err(_), None) => {
            let room = dst.total_len().saturating_sub(dst_off) as usize;
            Err((room.min(len), SendFault::Short))
        }
    }
}

//! Queue buffers in host memory (CQ rings, QP buffers) described by a `pas` list, a
//! `log_page_size` and a `page_offset` (prm-subset.md §6.5, §6.6, §7.2, §7.3, §9.4).
//!
//! The buffer is validated once at create time (alignment, `inlen`, every page reachable
//! through the IOMMU); the data path then reads and writes it through the IOMMU at byte
//! offsets, splitting accesses at page boundaries, without allocating.

use crate::layout::Buf;

use super::Shared;
use super::iommu::{Dma, DmaFault};

/// Why a `pas` description was refused at create time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BufError {
    /// `log_page_size` too large or `page_offset` beyond the page.
    Geometry,
    /// The message is too short for the `pas` entries the buffer needs.
    Inlen,
    /// A `pas` entry is not aligned to the page size.
    Misaligned,
    /// A page is not reachable through the IOMMU.
    Unreachable,
}

/// Largest `log_page_size` accepted (relative to 4 KiB: 1 GiB pages).
const MAX_LOG_PAGE_SIZE: u32 = 18;

/// A buffer of `len` bytes starting `offset` bytes into the first of `pas`.
#[derive(Debug)]
pub(crate) struct QueueBuf {
    pas: Vec<u64>,
    page_shift: u32,
    offset: u64,
    len: u64,
}

impl QueueBuf {
    /// Reads and checks the description: `len` bytes, pages of `4096 << log_page_size`
    /// bytes, `page_offset` in units of page size / 64, `pas` entries at byte `pas_off`
    /// of `input`.
    pub(crate) fn parse(
        sh: &Shared,
        input: &[u8],
        pas_off: usize,
        log_page_size: u32,
        page_offset: u32,
        len: u64,
    ) -> Result<QueueBuf, BufError> {
        if log_page_size > MAX_LOG_PAGE_SIZE {
            return Err(BufError::Geometry);
        }
        let page_shift = 12 + log_page_size;
        let page_size = 1u64 << page_shift;
        let offset = u64::from(page_offset) * (page_size / 64);
        if offset >= page_size {
            return Err(BufError::Geometry);
        }
        let npages = (offset + len).div_ceil(page_size) as usize;
        if input.len() < pas_off + 8 * npages {
            return Err(BufError::Inlen);
        }
        let pas: Vec<u64> = (0..npages)
            .map(|k| input.read_be64(pas_off + 8 * k))
            .collect();
        if pas.iter().any(|p| p & (page_size - 1) != 0) {
            return Err(BufError::Misaligned);
        }
        if !used_bytes_reachable(sh, &pas, page_size, offset, len) {
            return Err(BufError::Unreachable);
        }
        Ok(QueueBuf {
            pas,
            page_shift,
            offset,
            len,
        })
    }

    /// Runs `f(iova, range)` over the page pieces of `[off, off + n)`.
    fn pieces(
        &self,
        off: u64,
        n: usize,
        mut f: impl FnMut(u64, std::ops::Range<usize>) -> Result<(), DmaFault>,
    ) -> Result<(), DmaFault> {
        debug_assert!(
            off + n as u64 <= self.len,
            "queue buffer access past the end"
        );
        let page = 1u64 << self.page_shift;
        let mut done = 0usize;
        while done < n {
            let at = self.offset + off + done as u64;
            let in_page = at & (page - 1);
            let chunk = ((page - in_page) as usize).min(n - done);
            let base = self.pas[(at >> self.page_shift) as usize];
            f(base + in_page, done..done + chunk)?;
            done += chunk;
        }
        Ok(())
    }

    /// The page of byte `off` (an index into `pas`) and the offset in that page.
    fn locate(&self, off: u64) -> (usize, u64) {
        let at = self.offset + off;
        (
            (at >> self.page_shift) as usize,
            at & ((1u64 << self.page_shift) - 1),
        )
    }

    /// Device read of `dst.len()` bytes at byte `off`.
    pub(crate) fn read(&self, dma: &Dma<'_>, off: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        let n = dst.len();
        self.pieces(off, n, |iova, r| dma.read(iova, &mut dst[r]))
    }

    /// Device write of `src` at byte `off`.
    pub(crate) fn write(&self, dma: &Dma<'_>, off: u64, src: &[u8]) -> Result<(), DmaFault> {
        self.pieces(off, src.len(), |iova, r| dma.write(iova, &src[r]))
    }

    /// Writes one byte with release ordering (ownership bytes, written last).
    pub(crate) fn write_u8_release(&self, dma: &Dma<'_>, off: u64, v: u8) -> Result<(), DmaFault> {
        self.pieces(off, 1, |iova, _| dma.write_u8_release(iova, v))
    }
}

/// Whether the `len` bytes `offset` bytes into the pages `pas` (of `page_size` bytes each)
/// are reachable through the IOMMU: the first and the last byte of them in each page. Only
/// the bytes the queue uses: a driver that describes a buffer with pages larger than it
/// (Linux's mlx5_ib picks the largest page size the buffer's DMA addresses allow,
/// `page_offset` saying where it starts) maps the buffer alone, not the rest of its first
/// and last pages.
pub(crate) fn used_bytes_reachable(
    sh: &Shared,
    pas: &[u64],
    page_size: u64,
    offset: u64,
    len: u64,
) -> bool {
    let mut b = [0u8; 1];
    let end = offset + len;
    pas.iter().zip(0u64..).all(|(p, k)| {
        let page = k * page_size;
        let (lo, hi) = (offset.max(page), end.min(page + page_size));
        hi <= lo
            || (sh.iommu.read(p + (lo - page), &mut b).is_ok()
                && sh.iommu.read(p + (hi - 1 - page), &mut b).is_ok())
    })
}

/// Prefetch hints for a queue buffer and one more address (its doorbell record): the host
/// addresses of its pages, translated once per IOMMU generation
/// ([`Dma::host_hints`]). Only ever prefetched, never
/// read through: the reads that follow go through the IOMMU as always, so an unmap keeps
/// its exact semantics and a stale hint only wastes a prefetch.
#[derive(Debug, Default)]
pub(crate) struct Hints {
    /// Generation of `hosts`; `None` before the first translation.
    generation: Option<u64>,
    /// The IOVAs translated: the buffer's pages, then the extra address.
    iovas: Vec<u64>,
    /// Host address and bytes to the end of its mapping, per entry of `iovas`.
    hosts: Vec<(usize, usize)>,
}

impl Hints {
    /// Starts loading the cache lines of byte `off` of `buf` and of IOVA `extra` (the
    /// doorbell record), so that the device reads of both that follow overlap their
    /// misses. Translates again first if the IOMMU table changed.
    pub(crate) fn prefetch(&mut self, dma: &Dma<'_>, buf: &QueueBuf, off: u64, extra: u64) {
        let g = dma.generation();
        let n = buf.pas.len();
        if self.generation != Some(g) || self.iovas.len() != n + 1 || self.iovas[n] != extra {
            self.iovas.clear();
            self.iovas.extend_from_slice(&buf.pas);
            self.iovas.push(extra);
            self.generation = Some(dma.host_hints(&self.iovas, &mut self.hosts));
        }
        let (page, in_page) = buf.locate(off);
        let at = |i: usize, off: u64| {
            if let Some(&(host, len)) = self.hosts.get(i)
                && host != 0
                && off < len as u64
            {
                super::mem::prefetch(host + off as usize);
            }
        };
        at(page, in_page);
        at(n, 0);
    }

    /// Starts loading the cache line of byte `off` of `buf`, with the translation of the
    /// last [`prefetch`](Self::prefetch) (nothing before the first).
    pub(crate) fn prefetch_line(&self, buf: &QueueBuf, off: u64) {
        let (page, in_page) = buf.locate(off);
        if let Some(&(host, len)) = self.hosts.get(page)
            && host != 0
            && in_page < len as u64
        {
            super::mem::prefetch(host + in_page as usize);
        }
    }
}

/// Reads the big-endian dword at `iova` (doorbell records, prm-subset.md §9.3).
pub(crate) fn read_dbr(dma: &Dma<'_>, iova: u64) -> Result<u32, DmaFault> {
    let mut b = [0u8; 4];
    dma.read(iova, &mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// Extends a `bits`-wide counter `low` read from memory to the full counter nearest to
/// (and not more than half the range away from) `near`.
pub(crate) fn extend_counter(near: u32, low: u32, bits: u32) -> u32 {
    let mask = (1u32 << bits) - 1;
    let mut full = (near & !mask) | (low & mask);
    let half = 1u32 << (bits - 1);
    if full.wrapping_sub(near) as i32 > half as i32 {
        full = full.wrapping_sub(mask + 1);
    } else if near.wrapping_sub(full) as i32 > half as i32 {
        full = full.wrapping_add(mask + 1);
    }
    full
}

#[cfg(test)]
mod tests {
    use super::extend_counter;

    #[test]
    fn counters_extend_to_the_nearest_value() {
        assert_eq!(extend_counter(0x1_0005, 0x0003, 16), 0x1_0003);
        assert_eq!(extend_counter(0x1_0005, 0x0009, 16), 0x1_0009);
        assert_eq!(extend_counter(0x1_fffe, 0x0001, 16), 0x2_0001);
        assert_eq!(extend_counter(0x2_0001, 0xfffe, 16), 0x1_fffe);
        assert_eq!(extend_counter(0, 0xFF_FFFF, 24), 0xFFFF_FFFF);
    }
}

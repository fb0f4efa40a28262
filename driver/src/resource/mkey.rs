//! Memory regions: MKeys the driver builds itself, with their MTTs (prm-subset.md §6.7,
//! §7.5), over host memory and over device memory (MEMIC, §11).
//!
//! Registration of host memory, in order:
//! 1. check the access flags (remote write and remote atomic need local write, as verbs);
//! 2. charge the pinned bytes against RLIMIT_MEMLOCK ([`MemlockPolicy`](crate::dma::MemlockPolicy)) before pinning;
//! 3. pick the MKey page size `P` (by default the smallest power of two covering the MR,
//!    at most `max_mkey_log_entity_size_mtt`, so the MTT has one or two entries), map the
//!    buffer's pages into one `P`-aligned IOVA window ([`UserMapping`]);
//! 4. CREATE_MKEY in MTT mode with the entries inline (`window + k * P | rd_en | wr_en`);
//!    a long list travels in a mailbox chain (a 1 GiB MR of 4 KiB pages is 2 MiB of MTTs).
//!
//! Deregistration ([`Mr`]'s `Drop`) runs it backwards: DESTROY_MKEY first, then unmap the
//! IOVA window, then release the buffer and the pin charge. If DESTROY_MKEY fails on a live
//! device, the MKey may still point at the memory, so the mapping and the buffer are leaked
//! (and logged) rather than freed under the device.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use uhca_layout::cmd::CapType;
use uhca_layout::mkc::{AccessMode, MTT_PRESENT};

use super::mem_error::validate_access;
pub use super::mem_error::{Access, MemError};
use super::memic::DmRef;
use crate::cmd::CmdError;
use crate::cmd::ops::{self, CreateMkey, MkeyInfo};
use crate::datapath::{Remote, Sge};
use crate::device::DeviceInner;
use crate::dma::{DmaError, DmaRegion, MrBuffer, PinCharge, UserMapping};
use crate::resource::Pd;
use crate::resource::pd::MrUse;

/// Options of [`Pd::reg_mr_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MrOptions {
    /// Force the MKey page size (log2 bytes, 12..=`max_mkey_log_entity_size_mtt`); `None`
    /// picks the smallest MTT.
    pub log_page_size: Option<u32>,
}

/// Variant bytes (`mkey_7_0`): a fresh one per MKey, so a key of a destroyed MKey does not
/// match a new MKey at the same index.
static VARIANT: AtomicU8 = AtomicU8::new(0);

fn next_variant() -> u8 {
    VARIANT.fetch_add(1, Ordering::Relaxed)
}

/// Fuzzing (feature `fuzzing`): the variant bytes start again from their initial value
/// (and so do those of peer-memory MRs), so that a fuzz target that runs many inputs in
/// one process gives each the keys it would get alone.
#[cfg(feature = "fuzzing")]
pub fn fuzz_reset_variants() {
    VARIANT.store(0, Ordering::Relaxed);
    crate::peer::fuzz_reset_variant();
}

/// What an MR keeps alive until its MKey is destroyed.
#[derive(Debug)]
enum Backing {
    /// User memory in its own IOVA window.
    User(UserMapping),
    /// Driver-allocated DMA memory.
    Region(DmaRegion),
    /// Device memory.
    Dm(DmRef),
}

/// A memory region: an MKey over host or device memory in one PD.
///
/// `lkey()` goes into local scatter/gather entries, `rkey()` to the peer; `addr()` is the
/// address of the first byte in the MKey's address space (what SGEs and RDMA addresses
/// use). Dropping it destroys the MKey, then unmaps and releases the memory.
#[derive(Debug)]
pub struct Mr {
    dev: Arc<DeviceInner>,
    index: u32,
    key: u32,
    pd: u32,
    addr: u64,
    len: usize,
    access: Access,
    backing: Option<Backing>,
    charge: Option<PinCharge>,
    /// Its use of the PD, released after the MKey is destroyed.
    _pd: MrUse,
}

impl MemError {
    /// [`MemError::DeviceLost`] or [`MemError::Closed`], for a device that is not open.
    pub(crate) fn gone(dev: &DeviceInner) -> MemError {
        if dev.is_lost() {
            MemError::DeviceLost
        } else {
            MemError::Closed
        }
    }
}

impl Mr {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The remote key (the same MKey).
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// Address of the first byte in the MKey's address space: the host address for
    /// [`Pd::reg_mr`], the DMA address for [`Pd::alloc_mr`], 0 for device memory
    /// ([`Pd::reg_dm`] is zero-based, prm-subset.md §11).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (empty regions are refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The access rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The PD number.
    pub fn pdn(&self) -> u32 {
        self.pd
    }

    /// Host pointer of the first byte (host memory only; null for device memory, which is
    /// reached with [`Mr::read`]/[`Mr::write`] or [`Dm`](super::Dm) copies). The device may
    /// write the memory at any time: use volatile or atomic accesses, never references.
    pub fn as_ptr(&self) -> *mut u8 {
        match self.backing.as_ref() {
            Some(Backing::User(m)) => m.addr() as *mut u8,
            Some(Backing::Region(r)) => r.as_ptr(),
            Some(Backing::Dm(_)) | None => std::ptr::null_mut(),
        }
    }

    fn check(&self, off: usize, n: usize) -> Result<(), MemError> {
        if off.checked_add(n).is_some_and(|e| e <= self.len) {
            Ok(())
        } else {
            Err(MemError::Range {
                offset: off,
                len: n,
                size: self.len,
            })
        }
    }

    /// Copies `src` into the region at byte `off` (volatile; device memory follows the
    /// 4-byte rules of [`Dm::copy_to`](super::Dm::copy_to)).
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), MemError> {
        self.check(off, src.len())?;
        match self.backing.as_ref() {
            Some(Backing::User(m)) => m.write(off, src),
            Some(Backing::Region(r)) => r.slice().write(off, src),
            Some(Backing::Dm(d)) => d.copy_to(d.offset + off, src)?,
            None => return Err(MemError::Closed),
        }
        Ok(())
    }

    /// Copies bytes at `off` into `dst` (volatile).
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(off, dst.len())?;
        match self.backing.as_ref() {
            Some(Backing::User(m)) => m.read(off, dst),
            Some(Backing::Region(r)) => r.slice().read(off, dst),
            Some(Backing::Dm(d)) => d.copy_from(d.offset + off, dst)?,
            None => return Err(MemError::Closed),
        }
        Ok(())
    }

    /// QUERY_MKEY: the context and first translation entries as the device holds them.
    pub fn query(&self) -> Result<MkeyInfo, MemError> {
        Ok(ops::query_mkey(&*self.dev, self.index)?)
    }

    /// Deregisters and gives the buffer of a [`Pd::reg_mr`] registration back (`None` for
    /// other registrations or another buffer type).
    pub fn into_buffer<B: MrBuffer>(mut self) -> Result<Option<B>, MemError> {
        self.destroy()?;
        match self.backing.take() {
            Some(Backing::User(m)) => Ok(m.into_buffer::<B>()?),
            _ => Ok(None),
        }
    }

    /// DESTROY_MKEY (once); on failure with the device still open, the memory is leaked.
    fn destroy(&mut self) -> Result<(), MemError> {
        if self.index == u32::MAX {
            return Ok(());
        }
        if self.dev.is_open()
            && let Err(e) = ops::destroy_mkey(&*self.dev, self.index)
        {
            tracing::error!(key = self.key, error = %e, "DESTROY_MKEY failed; leaking the MR's memory");
            std::mem::forget(self.backing.take());
            std::mem::forget(self.charge.take());
            self.index = u32::MAX;
            return Err(e.into());
        }
        // A closed device was torn down: its MKeys are gone with it.
        self.index = u32::MAX;
        Ok(())
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let _ = self.destroy();
        // Then the fields: the mapping is removed (UserMapping/DmaRegion drop) and the pin
        // charge released.
    }
}

/// The smallest power of two of at least `span` bytes, within `[4 KiB, 2^max_log]`.
fn pick_page(span: u64, max_log: u32, forced: Option<u32>) -> Result<u64, MemError> {
    if let Some(log) = forced {
        if !(12..=max_log).contains(&log) {
            return Err(MemError::PageSize { log, max: max_log });
        }
        return Ok(1 << log);
    }
    Ok(span.next_power_of_two().clamp(4096, 1 << max_log))
}

/// Default `max_mkey_log_entity_size_mtt` when the device reports 0 (Linux, §7.5).
const DEFAULT_MAX_LOG_PAGE: u32 = 31;

impl Pd {
    /// The largest MKey page size the device accepts (CAP_2 `max_mkey_log_entity_size_mtt`,
    /// queried once per PD).
    pub(crate) fn max_log_page(&self) -> u32 {
        let cell: &OnceLock<u32> = &self.max_log_page;
        *cell.get_or_init(|| {
            ops::query_hca_cap(&*self.dev, CapType::General2, true)
                .ok()
                .map(|p| {
                    uhca_layout::caps::CmdHcaCap2::new_unchecked(&p[..])
                        .max_mkey_log_entity_size_mtt()
                })
                .filter(|&v| v != 0)
                .unwrap_or(DEFAULT_MAX_LOG_PAGE)
                .min(DEFAULT_MAX_LOG_PAGE)
        })
    }

    /// Registers `buf` (any [`MrBuffer`]: `Vec<u8>`, `Box<[u8]>`,
    /// [`HostBuffer`](crate::dma::HostBuffer), or caller-managed memory through the
    /// `unsafe` [`RawBuffer::new`](crate::dma::RawBuffer::new)) with `access`. The MR owns
    /// the buffer until it is dropped ([`Mr::into_buffer`] gives it back).
    pub fn reg_mr<B: MrBuffer>(&self, buf: B, access: Access) -> Result<Mr, MemError> {
        self.reg_mr_with(buf, access, &MrOptions::default())
    }

    /// [`reg_mr`](Self::reg_mr) with options (e.g. a forced MKey page size).
    pub fn reg_mr_with<B: MrBuffer>(
        &self,
        mut buf: B,
        access: Access,
        opts: &MrOptions,
    ) -> Result<Mr, MemError> {
        validate_access(access)?;
        let dev = &self.dev;
        if !dev.is_open() {
            return Err(MemError::gone(dev));
        }
        let (addr, len) = (buf.as_mut_ptr() as u64, buf.len());
        if len == 0 {
            return Err(MemError::Empty);
        }
        let sys = crate::dma::system_page_size() as u64;
        let span = (addr + len as u64).next_multiple_of(sys) - (addr & !(sys - 1));
        let page = pick_page(span, self.max_log_page(), opts.log_page_size)?;
        let charge = dev.dma.charge(span)?;
        let map = UserMapping::new(&dev.dma, buf, page)?;
        let mtts: Vec<u64> = map.mtt_addrs().map(|a| a | MTT_PRESENT).collect();
        self.create(
            Backing::User(map),
            Some(charge),
            access,
            addr,
            len,
            page.trailing_zeros(),
            &mtts,
        )
    }

    /// Allocates `len` bytes of zeroed DMA memory (hugepages when available) and registers
    /// them. `addr()` is the memory's DMA address; the host reaches it through
    /// [`Mr::read`]/[`Mr::write`] or [`Mr::as_ptr`].
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<Mr, MemError> {
        validate_access(access)?;
        let dev = &self.dev;
        if !dev.is_open() {
            return Err(MemError::gone(dev));
        }
        if len == 0 {
            return Err(MemError::Empty);
        }
        // The region charges its pages against RLIMIT_MEMLOCK itself (`DmaSpace::charge`).
        let region = dev.dma.alloc(len).map_err(|e| match e {
            DmaError::Memlock(e) => MemError::Memlock(e),
            DmaError::MemlockCheck(e) => MemError::MemlockCheck(e),
            e => MemError::Dma(e),
        })?;
        // The MKey's addresses are the region's IOVAs, so any page size lines up (§7.5):
        // take one about the size of the region, for one or two MTT entries.
        let iova = region.iova().0;
        let page = pick_page(len as u64, self.max_log_page(), None)?;
        let first = iova & !(page - 1);
        let end = (iova + len as u64).next_multiple_of(page);
        let mtts: Vec<u64> = (first..end)
            .step_by(page as usize)
            .map(|a| a | MTT_PRESENT)
            .collect();
        self.create(
            Backing::Region(region),
            None,
            access,
            iova,
            len,
            page.trailing_zeros(),
            &mtts,
        )
    }

    /// Registers `len` bytes of device memory at `offset` of `dm` (MEMIC access mode,
    /// zero-based: `addr()` is 0, prm-subset.md §11). The device memory cannot be freed
    /// while the MR lives.
    pub fn reg_dm(
        &self,
        dm: &super::Dm,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Mr, MemError> {
        validate_access(access)?;
        if len == 0 {
            return Err(MemError::Empty);
        }
        if offset.checked_add(len).is_none_or(|e| e > dm.len()) {
            return Err(MemError::Range {
                offset,
                len,
                size: dm.len(),
            });
        }
        let r = dm.register(offset);
        let variant = next_variant();
        let index = ops::create_mkey(
            &*self.dev,
            &CreateMkey {
                access_mode: AccessMode::Memic,
                pd: self.pdn(),
                variant,
                rights: access.mkc_rights(),
                start_addr: dm.bar_offset() + offset as u64,
                len: len as u64,
                log_page_size: 0,
                mtts: &[],
            },
        )
        .map(|i| (i, variant));
        self.finish(index, Backing::Dm(r), None, access, 0, len)
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        backing: Backing,
        charge: Option<PinCharge>,
        access: Access,
        addr: u64,
        len: usize,
        log_page_size: u32,
        mtts: &[u64],
    ) -> Result<Mr, MemError> {
        let variant = next_variant();
        let index = ops::create_mkey(
            &*self.dev,
            &CreateMkey {
                access_mode: AccessMode::Mtt,
                pd: self.pdn(),
                variant,
                rights: access.mkc_rights(),
                start_addr: addr,
                len: len as u64,
                log_page_size,
                mtts,
            },
        )
        .map(|i| (i, variant));
        self.finish(index, backing, charge, access, addr, len)
    }

    fn finish(
        &self,
        created: Result<(u32, u8), CmdError>,
        backing: Backing,
        charge: Option<PinCharge>,
        access: Access,
        addr: u64,
        len: usize,
    ) -> Result<Mr, MemError> {
        // On failure the backing drops here: no MKey points at it.
        let (index, variant) = created?;
        Ok(Mr {
            dev: self.dev.clone(),
            index,
            key: (index << 8) | u32::from(variant),
            pd: self.pdn(),
            addr,
            len,
            access,
            backing: Some(backing),
            charge,
            _pd: self.track(),
        })
    }
}

// The data path's descriptors of an MR (`Sge::of`, `Remote::of`) are defined here, beside
// `Mr`, so that the data path (a lower layer) does not import the resources.
impl Sge {
    /// `len` bytes at `offset` of `mr`, or `None` if that leaves the region.
    pub fn of(mr: &Mr, offset: usize, len: usize) -> Option<Sge> {
        let end = offset.checked_add(len)?;
        (end <= mr.len() && u32::try_from(len).is_ok()).then(|| Sge {
            addr: mr.addr() + offset as u64,
            len: len as u32,
            lkey: mr.lkey(),
        })
    }
}

impl Remote {
    /// `offset` bytes into the peer's region `mr` (for loopback and tests; a real peer sends
    /// its address and rkey out of band).
    pub fn of(mr: &Mr, offset: u64) -> Remote {
        Remote {
            addr: mr.addr() + offset,
            rkey: mr.rkey(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Mr>();
        check::<super::super::Dm>();
        check::<Access>();
    }

    #[test]
    fn access_rules_and_page_choice() {
        assert!(validate_access(Access::LOCAL_WRITE).is_ok());
        assert!(validate_access(Access::REMOTE_READ).is_ok());
        assert!(matches!(
            validate_access(Access::REMOTE_WRITE),
            Err(MemError::InvalidAccess { .. })
        ));
        assert!(validate_access(Access::LOCAL_WRITE | Access::REMOTE_ATOMIC).is_ok());
        assert_eq!(
            format!("{:?}", Access::LOCAL_WRITE | Access::REMOTE_READ),
            "Access(LOCAL_WRITE | REMOTE_READ)"
        );
        assert_eq!(pick_page(1, 30, None).unwrap(), 4096);
        assert_eq!(pick_page(5 << 20, 30, None).unwrap(), 8 << 20);
        assert_eq!(pick_page(3 << 30, 30, None).unwrap(), 1 << 30);
        assert_eq!(pick_page(1 << 30, 30, Some(12)).unwrap(), 4096);
        assert!(matches!(
            pick_page(1, 30, Some(31)),
            Err(MemError::PageSize { log: 31, max: 30 })
        ));
    }
}

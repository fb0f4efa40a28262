//! Peer BARs as dma-bufs on kernel VFIO (vfio-kernel.md §2, §7.B step 9):
//! - export: `VFIO_DEVICE_FEATURE(GET | DMA_BUF)` on the *peer's* device fd returns a dma-buf
//!   fd for a page-aligned BAR range (6.19+, `CONFIG_PCI_P2PDMA`);
//! - import: `IOMMU_IOAS_MAP_FILE` of that fd into the HCA's IOAS (iommufd mode only; it
//!   takes single-range VFIO dma-bufs and nothing else, §2.2);
//! - the kernel's refusals become [`DmaBufRefusal`]s that name the limit.
//!
//! On the legacy container (type1) path there is no dma-buf import. The only way to reach a
//! peer BAR there is to mmap the BAR and `VFIO_IOMMU_MAP_DMA` the VA (type1 follows
//! `VM_PFNMAP`). That mapping has **no lifetime protection**: nothing revokes it when the
//! peer is reset, loses memory decoding or is closed, so the HCA can keep writing to
//! whatever the BAR address means afterwards (upstream calls this a use-after-free). It is
//! offered only as the `unsafe` [`VfioFunction::map_peer_bar_unrevocable`].

use std::os::fd::{BorrowedFd, OwnedFd};

use super::{Domain, VfioError, VfioFunction, sys, uapi};
use crate::pci::{DmaBufRefusal, DmaMapping, Iova, PciError, PciFunction};

/// The refusal class of an errno from `IOMMU_IOAS_MAP_FILE` of `fd` (§1.3); `dmabuf`: whether
/// the fd is a dma-buf at all ([`is_dmabuf`]).
pub(crate) fn import_refusal(errno: i32, dmabuf: bool) -> Option<DmaBufRefusal> {
    match errno {
        libc::EOPNOTSUPP => Some(DmaBufRefusal::NotVfioDmaBuf),
        libc::ENODEV => Some(DmaBufRefusal::Revoked),
        // < 6.13: no MAP_FILE at all.
        libc::ENOTTY => Some(DmaBufRefusal::KernelTooOld),
        // 6.13-6.18: a dma-buf is not a shmem/hugetlb file. A file that is no dma-buf gets
        // the same errno on every kernel (7.3 in the P2P guest test: EINVAL for /dev/null).
        libc::EINVAL | libc::EBADF if dmabuf => Some(DmaBufRefusal::KernelTooOld),
        libc::EINVAL | libc::EBADF => Some(DmaBufRefusal::NotVfioDmaBuf),
        _ => None,
    }
}

/// Whether `fd` is a dma-buf: only dma-bufs have `exp_name` in their fdinfo
/// (`dma_buf_show_fdinfo`).
pub(crate) fn is_dmabuf(fd: BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .is_ok_and(|t| t.lines().any(|l| l.starts_with("exp_name:")))
}

/// The refusal class of an errno from `VFIO_DEVICE_FEATURE(GET | DMA_BUF)` (§2.1).
pub(crate) fn export_refusal(errno: i32) -> Option<DmaBufRefusal> {
    match errno {
        // No such feature (< 6.19, P2PDMA off), not a BAR, no P2PDMA provider.
        libc::ENOTTY | libc::ENODEV | libc::EOPNOTSUPP => Some(DmaBufRefusal::ExportUnsupported),
        libc::EINVAL | libc::EOVERFLOW => Some(DmaBufRefusal::BadRange),
        _ => None,
    }
}

fn refused(op: &'static str, refusal: DmaBufRefusal, errno: Option<i32>) -> PciError {
    PciError::DmaBuf { op, refusal, errno }
}

/// `VFIO_DEVICE_FEATURE(GET | DMA_BUF)` on `device` for `len` bytes at `offset` of BAR
/// `bar`: the new dma-buf fd (`O_RDWR | O_CLOEXEC`).
pub(crate) fn export(
    device: BorrowedFd<'_>,
    bar: u8,
    offset: u64,
    len: u64,
) -> Result<OwnedFd, PciError> {
    let page = sys::page_size() as u64;
    if bar > 5 || len == 0 || !offset.is_multiple_of(page) || !len.is_multiple_of(page) {
        return Err(refused("dma-buf export", DmaBufRefusal::BadRange, None));
    }
    let ranges = [uapi::VfioRegionDmaRange {
        offset,
        length: len,
    }];
    let mut arg =
        uapi::dma_buf_feature(bar.into(), (libc::O_RDWR | libc::O_CLOEXEC) as u32, &ranges)?;
    // SAFETY: `arg` is a live, 8-byte aligned buffer of exactly `argsz` bytes laid out as
    // vfio_device_feature + vfio_device_feature_dma_buf + one vfio_region_dma_range.
    match unsafe { sys::ioctl_ptr(device, uapi::VFIO_DEVICE_FEATURE, arg.as_mut_ptr()) } {
        // SAFETY: DMA_BUF's return value is a new fd that nothing else owns.
        Ok(fd) => Ok(unsafe { sys::adopt_fd(fd) }),
        Err(e) => match e.raw_os_error().and_then(export_refusal) {
            Some(r) => Err(refused("dma-buf export", r, e.raw_os_error())),
            None => Err(VfioError::Ioctl {
                what: "VFIO_DEVICE_FEATURE(DMA_BUF)",
                source: e,
            }
            .into()),
        },
    }
}

/// `IOMMU_IOAS_MAP_FILE` of a dma-buf into `f`'s IOAS, with the refusals classified.
pub(crate) fn import(
    f: &VfioFunction,
    fd: BorrowedFd<'_>,
    offset: u64,
    len: u64,
    iova: Iova,
) -> Result<(), PciError> {
    if !matches!(f.domain, Domain::Iommufd(_)) {
        return Err(refused(
            "dma-buf import",
            DmaBufRefusal::LegacyContainer,
            None,
        ));
    }
    f.map_dmabuf(fd, offset, len, iova)
        .map_err(|e| classify_import(e, is_dmabuf(fd)))
}

/// Turns a failed `IOMMU_IOAS_MAP_FILE` of a dma-buf into its refusal class (others pass);
/// `dmabuf`: whether the fd was a dma-buf.
fn classify_import(e: PciError, dmabuf: bool) -> PciError {
    match e {
        PciError::Vfio(v) => match *v {
            VfioError::Ioctl { source, what } => {
                match source
                    .raw_os_error()
                    .and_then(|errno| import_refusal(errno, dmabuf))
                {
                    Some(r) => refused("dma-buf import", r, source.raw_os_error()),
                    None => VfioError::Ioctl { what, source }.into(),
                }
            }
            v => PciError::Vfio(Box::new(v)),
        },
        e => e,
    }
}

impl VfioFunction {
    /// Legacy container path only: maps `len` bytes of a peer's BAR, mmap'ed into this
    /// process at `bar_vaddr`, at `iova` with `VFIO_IOMMU_MAP_DMA` (type1 follows
    /// `VM_PFNMAP`; vfio-kernel.md §2.5 option matrix). iommufd refuses this (GUP cannot pin
    /// a BAR mapping); use [`PciFunction::dma_map_dmabuf`] there.
    ///
    /// # Safety
    /// Nothing revokes this mapping. The caller must keep the peer's BAR mapped, its memory
    /// decoding on, and the peer neither reset nor closed, until
    /// [`PciFunction::dma_unmap`] of this range returns, and must destroy every MKey over
    /// the range before any of those events; otherwise the HCA may write to whatever the
    /// bus address means afterwards.
    pub unsafe fn map_peer_bar_unrevocable(
        &self,
        bar_vaddr: *mut u8,
        len: usize,
        iova: Iova,
    ) -> Result<(), PciError> {
        if matches!(self.domain, Domain::Iommufd(_)) {
            return Err(refused(
                "peer BAR map by address",
                DmaBufRefusal::NotVfioDmaBuf,
                None,
            ));
        }
        let m = DmaMapping {
            vaddr: bar_vaddr,
            len,
            iova,
            backing: None,
        };
        // SAFETY: the caller keeps the BAR mapping valid until dma_unmap (contract above).
        unsafe { self.dma_map(&m) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn errno_classes() {
        for dmabuf in [true, false] {
            assert_eq!(
                import_refusal(libc::EOPNOTSUPP, dmabuf),
                Some(DmaBufRefusal::NotVfioDmaBuf)
            );
            assert_eq!(
                import_refusal(libc::ENODEV, dmabuf),
                Some(DmaBufRefusal::Revoked)
            );
            assert_eq!(
                import_refusal(libc::ENOTTY, dmabuf),
                Some(DmaBufRefusal::KernelTooOld)
            );
            assert_eq!(import_refusal(libc::ENOMEM, dmabuf), None);
        }
        // EINVAL: a dma-buf on 6.13-6.18, or a file that is no dma-buf on any kernel.
        assert_eq!(
            import_refusal(libc::EINVAL, true),
            Some(DmaBufRefusal::KernelTooOld)
        );
        assert_eq!(
            import_refusal(libc::EINVAL, false),
            Some(DmaBufRefusal::NotVfioDmaBuf)
        );
        let f = tempfile::tempfile().unwrap();
        assert!(!is_dmabuf(f.as_fd()));
        assert_eq!(
            export_refusal(libc::ENOTTY),
            Some(DmaBufRefusal::ExportUnsupported)
        );
        assert_eq!(export_refusal(libc::EINVAL), Some(DmaBufRefusal::BadRange));
        assert_eq!(export_refusal(libc::EIO), None);
        let e = refused("dma-buf import", DmaBufRefusal::NotVfioDmaBuf, Some(95)).to_string();
        assert!(e.contains("6.19") && e.contains("EOPNOTSUPP"), "{e}");
    }

    #[test]
    fn map_file_on_a_kernel_without_it_is_refused_as_too_old() {
        let fake = super::super::iommufd::Iommufd::fake(tempfile::tempfile().unwrap().into());
        let buf = tempfile::tempfile().unwrap();
        let e = fake
            .map_file(buf.as_fd(), 0, 4096, 0x10_0000)
            .map_err(PciError::from)
            .map_err(|e| classify_import(e, true))
            .unwrap_err();
        match &e {
            PciError::DmaBuf {
                refusal: DmaBufRefusal::KernelTooOld,
                errno: Some(libc::ENOTTY),
                ..
            } => {}
            e => panic!("{e:?}"),
        }
        assert!(e.to_string().contains("6.13"), "{e}");
        // Errors that are not refusals pass through.
        let other = PciError::NoBar(3);
        assert!(matches!(classify_import(other, true), PciError::NoBar(3)));
    }

    #[test]
    fn export_on_a_file_that_is_no_vfio_device_is_refused_with_the_kernel_limit() {
        // A regular file answers every ioctl with ENOTTY, as a kernel without the feature.
        let f = tempfile::tempfile().unwrap();
        match export(f.as_fd(), 1, 0, 4096) {
            Err(PciError::DmaBuf {
                refusal: DmaBufRefusal::ExportUnsupported,
                errno: Some(libc::ENOTTY),
                ..
            }) => {}
            r => panic!("{r:?}"),
        }
        for (bar, off, len) in [(6, 0, 4096), (1, 1, 4096), (1, 0, 0), (1, 0, 100)] {
            assert!(
                matches!(
                    export(f.as_fd(), bar, off, len),
                    Err(PciError::DmaBuf {
                        refusal: DmaBufRefusal::BadRange,
                        errno: None,
                        ..
                    })
                ),
                "{bar} {off} {len}"
            );
        }
    }
}

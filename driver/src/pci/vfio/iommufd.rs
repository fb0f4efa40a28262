//! The iommufd + VFIO device cdev front end (vfio-kernel.md §1.3, §7.B).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use crate::pci::IovaRange;

use super::open_rw;
use super::uapi::{
    self, IommuDestroy, IommuIoasAlloc, IommuIoasIovaRanges, IommuIoasMap, IommuIoasMapFile,
    IommuIoasUnmap, IommuIovaRange, VfioDeviceAttachIommufdPt, VfioDeviceBindIommufd,
    VfioDeviceDetachIommufdPt,
};
use super::{VfioError, iova, sys};

/// An iommufd context with one IOAS the device is attached to.
#[derive(Debug)]
pub struct Iommufd {
    fd: Option<OwnedFd>,
    ioas: u32,
    /// Usable IOVA ranges (queried after attach).
    pub ranges: Vec<IovaRange>,
    /// Required IOVA alignment.
    pub alignment: u64,
    attached: bool,
}

impl Iommufd {
    /// Opens `/dev/iommu` and the cdev, binds, allocates an IOAS and attaches the device
    /// (§7.B steps 2-5). Returns the context and the device fd.
    pub fn open(cdev: &Path, dev_root: &Path) -> Result<(Iommufd, OwnedFd), VfioError> {
        let fd = open_rw(
            &dev_root.join("iommu"),
            "is iommufd available (CONFIG_IOMMUFD) and may this user open it?",
        )?;
        let dev = open_rw(
            cdev,
            "chown the VFIO device cdev to this user (or run as root)",
        )?;
        let mut bind = VfioDeviceBindIommufd {
            argsz: size_of::<VfioDeviceBindIommufd>() as u32,
            flags: 0,
            iommufd: fd.as_raw_fd(),
            out_devid: 0,
        };
        // SAFETY: `bind` is a complete 16-byte bind struct.
        unsafe { sys::ioctl_ptr(dev.as_fd(), uapi::VFIO_DEVICE_BIND_IOMMUFD, &mut bind) }
            .map_err(VfioError::ioctl("VFIO_DEVICE_BIND_IOMMUFD"))?;
        let mut alloc = IommuIoasAlloc {
            size: size_of::<IommuIoasAlloc>() as u32,
            ..Default::default()
        };
        // SAFETY: `alloc` is a complete ioas_alloc struct.
        unsafe { sys::ioctl_ptr(fd.as_fd(), uapi::IOMMU_IOAS_ALLOC, &mut alloc) }
            .map_err(VfioError::ioctl("IOMMU_IOAS_ALLOC"))?;
        let mut me = Iommufd {
            fd: Some(fd),
            ioas: alloc.out_ioas_id,
            ranges: Vec::new(),
            alignment: 4096,
            attached: false,
        };
        let mut attach = VfioDeviceAttachIommufdPt {
            argsz: size_of::<VfioDeviceAttachIommufdPt>() as u32,
            flags: 0,
            pt_id: me.ioas,
            pasid: 0,
        };
        // SAFETY: `attach` is a complete attach struct.
        unsafe {
            sys::ioctl_ptr(
                dev.as_fd(),
                uapi::VFIO_DEVICE_ATTACH_IOMMUFD_PT,
                &mut attach,
            )
        }
        .map_err(VfioError::ioctl("VFIO_DEVICE_ATTACH_IOMMUFD_PT"))?;
        me.attached = true;
        me.query_ranges()?;
        Ok((me, dev))
    }

    fn ifd(&self) -> Result<std::os::fd::BorrowedFd<'_>, VfioError> {
        self.fd.as_ref().map(|f| f.as_fd()).ok_or(VfioError::Closed)
    }

    /// `IOMMU_IOAS_IOVA_RANGES`, growing the array on `EMSGSIZE`.
    fn query_ranges(&mut self) -> Result<(), VfioError> {
        let mut n = 8u32;
        for _ in 0..4 {
            let mut arr = vec![IommuIovaRange::default(); n as usize];
            let mut q = IommuIoasIovaRanges {
                size: size_of::<IommuIoasIovaRanges>() as u32,
                ioas_id: self.ioas,
                num_iovas: n,
                reserved: 0,
                allowed_iovas: arr.as_mut_ptr() as u64,
                out_iova_alignment: 0,
            };
            // SAFETY: `q` is complete and `allowed_iovas` points at `n` writable ranges.
            match unsafe { sys::ioctl_ptr(self.ifd()?, uapi::IOMMU_IOAS_IOVA_RANGES, &mut q) } {
                Ok(_) => {
                    let pairs: Vec<(u64, u64)> = arr[..q.num_iovas.min(n) as usize]
                        .iter()
                        .map(|r| (r.start, r.last))
                        .collect();
                    self.ranges = iova::to_ranges(&pairs)?;
                    self.alignment = q.out_iova_alignment.max(1);
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) && q.num_iovas > n => {
                    n = q.num_iovas
                }
                Err(e) => {
                    return Err(VfioError::Ioctl {
                        what: "IOMMU_IOAS_IOVA_RANGES",
                        source: e,
                    });
                }
            }
        }
        Err(VfioError::Malformed {
            what: "IOVA ranges",
            why: "the range count keeps growing",
        })
    }

    /// `IOMMU_IOAS_MAP` at a fixed IOVA, readable and writable.
    ///
    /// # Safety
    /// `[vaddr, vaddr + len)` must stay allocated until it is unmapped.
    pub unsafe fn map(&self, vaddr: usize, len: u64, iova: u64) -> Result<(), VfioError> {
        let mut m = IommuIoasMap {
            size: size_of::<IommuIoasMap>() as u32,
            flags: uapi::IOMMU_IOAS_MAP_FIXED_IOVA
                | uapi::IOMMU_IOAS_MAP_READABLE
                | uapi::IOMMU_IOAS_MAP_WRITEABLE,
            ioas_id: self.ioas,
            reserved: 0,
            user_va: vaddr as u64,
            length: len,
            iova,
        };
        // SAFETY: `m` is complete; the caller keeps the memory alive while mapped.
        unsafe { sys::ioctl_ptr(self.ifd()?, uapi::IOMMU_IOAS_MAP, &mut m) }
            .map_err(VfioError::ioctl("IOMMU_IOAS_MAP"))?;
        Ok(())
    }

    /// `IOMMU_IOAS_MAP_FILE` at a fixed IOVA, readable and writable: `len` bytes of the memfd
    /// or VFIO dma-buf `fd` from file offset `start` (vfio-kernel.md §1.3). The kernel holds
    /// its own reference to the file's pages, so no host mapping has to stay alive. Kernels
    /// before 6.13 answer `ENOTTY`; a dma-buf on a kernel before 6.19, or one that is not a
    /// single-range VFIO dma-buf, `EOPNOTSUPP`/`EINVAL`; a revoked dma-buf `ENODEV`.
    pub fn map_file(
        &self,
        fd: BorrowedFd<'_>,
        start: u64,
        len: u64,
        iova: u64,
    ) -> Result<(), VfioError> {
        let mut m = IommuIoasMapFile {
            size: size_of::<IommuIoasMapFile>() as u32,
            flags: uapi::IOMMU_IOAS_MAP_FIXED_IOVA
                | uapi::IOMMU_IOAS_MAP_READABLE
                | uapi::IOMMU_IOAS_MAP_WRITEABLE,
            ioas_id: self.ioas,
            fd: fd.as_raw_fd(),
            start,
            length: len,
            iova,
        };
        // SAFETY: `m` is a complete map_file struct; the kernel takes its own reference on
        // the file, so nothing of ours has to outlive the call.
        unsafe { sys::ioctl_ptr(self.ifd()?, uapi::IOMMU_IOAS_MAP_FILE, &mut m) }
            .map_err(VfioError::ioctl("IOMMU_IOAS_MAP_FILE"))?;
        Ok(())
    }

    /// `IOMMU_IOAS_UNMAP`, checking the length unmapped.
    pub fn unmap(&self, iova: u64, len: u64) -> Result<(), VfioError> {
        let mut u = IommuIoasUnmap {
            size: size_of::<IommuIoasUnmap>() as u32,
            ioas_id: self.ioas,
            iova,
            length: len,
        };
        // SAFETY: `u` is a complete ioas_unmap struct.
        unsafe { sys::ioctl_ptr(self.ifd()?, uapi::IOMMU_IOAS_UNMAP, &mut u) }
            .map_err(VfioError::ioctl("IOMMU_IOAS_UNMAP"))?;
        if u.length != len {
            return Err(VfioError::PartialUnmap {
                iova,
                len,
                done: u.length,
            });
        }
        Ok(())
    }

    /// Detaches the device (before its fd is closed; §7.B step 10).
    pub fn detach(&mut self, dev: std::os::fd::BorrowedFd<'_>) -> Result<(), VfioError> {
        if !std::mem::take(&mut self.attached) {
            return Ok(());
        }
        let mut d = VfioDeviceDetachIommufdPt {
            argsz: size_of::<VfioDeviceDetachIommufdPt>() as u32,
            flags: 0,
        };
        // SAFETY: `d` is a complete detach struct.
        unsafe { sys::ioctl_ptr(dev, uapi::VFIO_DEVICE_DETACH_IOMMUFD_PT, &mut d) }
            .map_err(VfioError::ioctl("VFIO_DEVICE_DETACH_IOMMUFD_PT"))?;
        Ok(())
    }

    /// A context over any fd, attached to nothing (tests of the ioctl error paths: a
    /// regular file answers every ioctl with `ENOTTY`, as a kernel without the call does).
    #[cfg(test)]
    pub(super) fn fake(fd: OwnedFd) -> Iommufd {
        Iommufd {
            fd: Some(fd),
            ioas: 1,
            ranges: Vec::new(),
            alignment: 4096,
            attached: false,
        }
    }

    /// Destroys the IOAS and closes iommufd (after the device fd is closed).
    pub fn close(&mut self) -> Vec<VfioError> {
        let mut errs = Vec::new();
        if let Some(fd) = self.fd.take() {
            let mut d = IommuDestroy {
                size: size_of::<IommuDestroy>() as u32,
                id: self.ioas,
            };
            // SAFETY: `d` is a complete destroy struct.
            if let Err(e) = unsafe { sys::ioctl_ptr(fd.as_fd(), uapi::IOMMU_DESTROY, &mut d) } {
                errs.push(VfioError::Ioctl {
                    what: "IOMMU_DESTROY",
                    source: e,
                });
            }
        }
        errs
    }
}

//! The legacy container/group front end: type1v2, or no-IOMMU (vfio-kernel.md §1.1, §1.5,
//! §7.A).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use crate::pci::IovaRange;

use super::open_rw;
use super::uapi::{self, VfioDmaMap, VfioDmaUnmap, VfioGroupStatus, VfioIommuType1Info};
use super::{VfioError, iova, sys};

/// What `VFIO_IOMMU_GET_INFO` reported.
#[derive(Debug, Clone, Default)]
pub struct Type1Info {
    /// Supported IOMMU page sizes (bitmap).
    pub pgsizes: u64,
    /// Usable IOVA ranges.
    pub ranges: Vec<IovaRange>,
    /// DMA mappings still available (`DMA_AVAIL`), when reported.
    pub dma_avail: Option<u32>,
}

/// Parses a whole `VFIO_IOMMU_GET_INFO` buffer (head + capability chain).
pub fn parse_type1_info(buf: &[u8]) -> Result<Type1Info, VfioError> {
    if buf.len() < size_of::<VfioIommuType1Info>() {
        return Err(VfioError::Malformed {
            what: "type1 info",
            why: "shorter than its head",
        });
    }
    let word = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().expect("4 bytes"));
    let flags = word(4);
    let pgsizes = u64::from_ne_bytes(buf[8..16].try_into().expect("8 bytes"));
    let mut out = Type1Info {
        pgsizes: if flags & uapi::VFIO_IOMMU_INFO_PGSIZES != 0 {
            pgsizes
        } else {
            0
        },
        ..Default::default()
    };
    if flags & uapi::VFIO_IOMMU_INFO_CAPS != 0 {
        for cap in uapi::cap_chain(buf, word(16))? {
            match cap.id {
                uapi::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE => {
                    out.ranges = iova::to_ranges(&uapi::parse_iova_range_cap(&cap)?)?
                }
                uapi::VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL => {
                    out.dma_avail = Some(uapi::parse_dma_avail_cap(&cap)?)
                }
                _ => {}
            }
        }
    }
    if out.ranges.is_empty() {
        // Kernels before the IOVA-range capability (~5.4): assume a 48-bit space minus the
        // x86 MSI window, which type1 always reserves.
        tracing::warn!(
            "type1 reported no IOVA ranges; assuming 48-bit IOVAs without the MSI window"
        );
        out.ranges = vec![
            IovaRange {
                start: 0,
                end: 0xfedf_ffff,
            },
            IovaRange {
                start: 0xfef0_0000,
                end: (1 << 48) - 1,
            },
        ];
    }
    Ok(out)
}

/// An open container with one group attached.
#[derive(Debug)]
pub struct Container {
    container: Option<OwnedFd>,
    group: Option<OwnedFd>,
    /// Whether this is a no-IOMMU container.
    pub noiommu: bool,
    /// What the IOMMU reported (empty for no-IOMMU).
    pub info: Type1Info,
}

impl Container {
    /// Opens `dev_root/vfio/vfio` and the group node `group_path`, checks viability, attaches
    /// the group and sets the IOMMU model (§7.A steps 2-5), and returns the device fd of `bdf`.
    pub fn open(
        group_path: &Path,
        dev_root: &Path,
        bdf: &str,
        noiommu: bool,
    ) -> Result<(Container, OwnedFd), VfioError> {
        let container = open_rw(
            &dev_root.join("vfio/vfio"),
            "is the vfio module loaded (modprobe vfio-pci)?",
        )?;
        // SAFETY: GET_API_VERSION takes no argument.
        let v = unsafe { sys::ioctl_val(container.as_fd(), uapi::VFIO_GET_API_VERSION, 0) }
            .map_err(VfioError::ioctl("VFIO_GET_API_VERSION"))?;
        if v != uapi::VFIO_API_VERSION {
            return Err(VfioError::Unsupported("unknown VFIO API version"));
        }
        let model = if noiommu {
            uapi::VFIO_NOIOMMU_IOMMU
        } else {
            uapi::VFIO_TYPE1V2_IOMMU
        };
        // SAFETY: CHECK_EXTENSION takes an integer by value.
        let ok =
            unsafe { sys::ioctl_val(container.as_fd(), uapi::VFIO_CHECK_EXTENSION, model as _) }
                .map_err(VfioError::ioctl("VFIO_CHECK_EXTENSION"))?;
        if ok == 0 {
            return Err(VfioError::Unsupported(if noiommu {
                "the kernel offers no no-IOMMU containers (enable_unsafe_noiommu_mode is off?)"
            } else {
                "the kernel offers no type1v2 IOMMU (vfio_iommu_type1 not loaded?)"
            }));
        }
        let group = open_rw(
            group_path,
            "bind every function of the group to vfio-pci (uhca-bind bind) and give this user the group node (chown)",
        )?;
        let mut status = VfioGroupStatus {
            argsz: size_of::<VfioGroupStatus>() as u32,
            flags: 0,
        };
        // SAFETY: `status` is a vfio_group_status with argsz = its size.
        unsafe { sys::ioctl_ptr(group.as_fd(), uapi::VFIO_GROUP_GET_STATUS, &mut status) }
            .map_err(VfioError::ioctl("VFIO_GROUP_GET_STATUS"))?;
        if status.flags & uapi::VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::NotViable {
                group: group_path.display().to_string(),
            });
        }
        let mut cfd = container.as_raw_fd();
        // SAFETY: SET_CONTAINER reads one int (the container fd) through the pointer.
        unsafe { sys::ioctl_ptr(group.as_fd(), uapi::VFIO_GROUP_SET_CONTAINER, &mut cfd) }
            .map_err(VfioError::ioctl("VFIO_GROUP_SET_CONTAINER"))?;
        let mut c = Container {
            container: Some(container),
            group: Some(group),
            noiommu,
            info: Type1Info::default(),
        };
        let cont = c.container.as_ref().expect("just set").as_fd();
        // SAFETY: SET_IOMMU takes an integer by value.
        unsafe { sys::ioctl_val(cont, uapi::VFIO_SET_IOMMU, model as _) }
            .map_err(VfioError::ioctl("VFIO_SET_IOMMU"))?;
        if !noiommu {
            c.info = parse_type1_info(&c.get_info_raw()?)?;
        }
        let name =
            CString::new(bdf).map_err(|_| VfioError::Unsupported("PCI address contains NUL"))?;
        let grp = c.group.as_ref().expect("just set").as_fd();
        // SAFETY: GET_DEVICE_FD reads a NUL-terminated string; `name` outlives the call.
        let fd = unsafe {
            sys::ioctl_ptr(
                grp,
                uapi::VFIO_GROUP_GET_DEVICE_FD,
                name.as_ptr().cast_mut(),
            )
        }
        .map_err(VfioError::ioctl("VFIO_GROUP_GET_DEVICE_FD"))?;
        // SAFETY: the ioctl returned a new fd that only we hold.
        let dev = unsafe { sys::adopt_fd(fd) };
        Ok((c, dev))
    }

    fn cfd(&self) -> Result<std::os::fd::BorrowedFd<'_>, VfioError> {
        self.container
            .as_ref()
            .map(|f| f.as_fd())
            .ok_or(VfioError::Closed)
    }

    fn get_info_raw(&self) -> Result<Vec<u8>, VfioError> {
        let mut argsz = size_of::<VfioIommuType1Info>() as u32;
        for _ in 0..3 {
            let mut buf = vec![0u64; (argsz as usize).div_ceil(8)];
            // SAFETY: `buf` is 8-byte aligned and at least argsz >= 24 bytes long.
            unsafe { buf.as_mut_ptr().cast::<u32>().write(argsz) };
            // SAFETY: the buffer holds a vfio_iommu_type1_info announcing `argsz` bytes.
            unsafe { sys::ioctl_ptr(self.cfd()?, uapi::VFIO_IOMMU_GET_INFO, buf.as_mut_ptr()) }
                .map_err(VfioError::ioctl("VFIO_IOMMU_GET_INFO"))?;
            let bytes: Vec<u8> = buf
                .iter()
                .flat_map(|w| w.to_ne_bytes())
                .take(argsz as usize)
                .collect();
            let want = u32::from_ne_bytes(bytes[0..4].try_into().expect("4 bytes"));
            if want <= argsz {
                return Ok(bytes);
            }
            argsz = want;
        }
        Err(VfioError::Malformed {
            what: "type1 info",
            why: "the kernel keeps asking for a larger buffer",
        })
    }

    /// `VFIO_IOMMU_MAP_DMA` (read + write).
    ///
    /// # Safety
    /// `[vaddr, vaddr + len)` must stay allocated until it is unmapped.
    pub unsafe fn map(&self, vaddr: usize, len: u64, iova: u64) -> Result<(), VfioError> {
        let mut m = VfioDmaMap {
            argsz: size_of::<VfioDmaMap>() as u32,
            flags: uapi::VFIO_DMA_MAP_FLAG_READ | uapi::VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: vaddr as u64,
            iova,
            size: len,
        };
        // SAFETY: `m` is a complete dma_map struct; the caller keeps the memory alive.
        unsafe { sys::ioctl_ptr(self.cfd()?, uapi::VFIO_IOMMU_MAP_DMA, &mut m) }
            .map_err(VfioError::ioctl("VFIO_IOMMU_MAP_DMA"))?;
        Ok(())
    }

    /// `VFIO_IOMMU_UNMAP_DMA`, checking that the kernel unmapped exactly `len` bytes.
    pub fn unmap(&self, iova: u64, len: u64) -> Result<(), VfioError> {
        let mut u = VfioDmaUnmap {
            argsz: size_of::<VfioDmaUnmap>() as u32,
            flags: 0,
            iova,
            size: len,
        };
        // SAFETY: `u` is a complete dma_unmap struct without a bitmap.
        unsafe { sys::ioctl_ptr(self.cfd()?, uapi::VFIO_IOMMU_UNMAP_DMA, &mut u) }
            .map_err(VfioError::ioctl("VFIO_IOMMU_UNMAP_DMA"))?;
        if u.size != len {
            return Err(VfioError::PartialUnmap {
                iova,
                len,
                done: u.size,
            });
        }
        Ok(())
    }

    /// Detaches the group and closes group and container (§7.A step 14, after the device fd
    /// is closed). Returns every error met; goes on after each.
    pub fn close(&mut self) -> Vec<VfioError> {
        let mut errs = Vec::new();
        if let Some(g) = self.group.take() {
            // SAFETY: UNSET_CONTAINER takes no argument.
            let r = unsafe { sys::ioctl_val(g.as_fd(), uapi::VFIO_GROUP_UNSET_CONTAINER, 0) };
            if let Err(source) = r {
                errs.push(VfioError::Ioctl {
                    what: "VFIO_GROUP_UNSET_CONTAINER",
                    source,
                });
            }
            drop(g);
        }
        self.container.take();
        errs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type1_info_without_caps_falls_back() {
        let mut b = vec![0u8; 24];
        b[0..4].copy_from_slice(&24u32.to_ne_bytes());
        b[4..8].copy_from_slice(&uapi::VFIO_IOMMU_INFO_PGSIZES.to_ne_bytes());
        b[8..16].copy_from_slice(&0x4020_1000u64.to_ne_bytes());
        let i = parse_type1_info(&b).unwrap();
        assert_eq!(i.pgsizes, 0x4020_1000);
        assert_eq!(i.ranges.len(), 2);
        assert_eq!(i.dma_avail, None);
        assert!(parse_type1_info(&b[..10]).is_err());
    }

    #[test]
    fn type1_info_with_caps() {
        let mut b = Vec::new();
        for w in [0u32, 3] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        b.extend_from_slice(&0x1000u64.to_ne_bytes());
        b.extend_from_slice(&24u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        // IOVA range cap: one range [0x1000, 0xffff_ffff]; next = DMA_AVAIL at 56
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&56u32.to_ne_bytes());
        b.extend_from_slice(&1u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&0x1000u64.to_ne_bytes());
        b.extend_from_slice(&0xffff_ffffu64.to_ne_bytes());
        b.extend_from_slice(&3u16.to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&100u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        let i = parse_type1_info(&b).unwrap();
        assert_eq!(
            i.ranges,
            vec![IovaRange {
                start: 0x1000,
                end: 0xffff_ffff
            }]
        );
        assert_eq!(i.dma_avail, Some(100));
    }
}

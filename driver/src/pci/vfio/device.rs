//! The VFIO device fd, the same for every mode: region info with capabilities, config space
//! through pread/pwrite, BAR mmap honouring sparse areas, reset and interrupts (vfio-kernel.md
//! §1.2, §5, §6).

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use vmm_sys_util::eventfd::EventFd;

use super::uapi::{self, SparseArea, VfioDeviceInfo, VfioIrqInfo, VfioIrqSetHead, VfioRegionInfo};
use super::{VfioError, sys};

/// Which parts of a region to mmap: everything if the MSI-X table is mappable or no sparse
/// capability exists, else the sparse areas; `None` if the region cannot be mmap'd at all.
pub fn plan_mmap(
    info: &VfioRegionInfo,
    buf: &[u8],
    page: u64,
) -> Result<Option<Vec<SparseArea>>, VfioError> {
    if info.size == 0 || info.flags & uapi::VFIO_REGION_INFO_FLAG_MMAP == 0 {
        return Ok(None);
    }
    let whole = vec![SparseArea {
        offset: 0,
        size: info.size,
    }];
    if info.flags & uapi::VFIO_REGION_INFO_FLAG_CAPS == 0 {
        return Ok(Some(whole));
    }
    let caps = uapi::cap_chain(buf, info.cap_offset)?;
    if caps
        .iter()
        .any(|c| c.id == uapi::VFIO_REGION_INFO_CAP_MSIX_MAPPABLE)
    {
        return Ok(Some(whole));
    }
    match caps
        .iter()
        .find(|c| c.id == uapi::VFIO_REGION_INFO_CAP_SPARSE_MMAP)
    {
        None => Ok(Some(whole)),
        Some(c) => {
            let areas = uapi::parse_sparse_mmap_cap(c, info.size)?;
            if areas
                .iter()
                .any(|a| a.offset % page != 0 || a.size % page != 0)
            {
                return Err(VfioError::Malformed {
                    what: "sparse mmap capability",
                    why: "area not page aligned",
                });
            }
            Ok(Some(areas))
        }
    }
}

/// A BAR mapping: a reservation of the whole BAR with the mmap-able areas mapped into it
/// (holes stay `PROT_NONE`).
#[derive(Debug, Clone, Copy)]
pub struct MappedBar {
    /// Start address.
    pub addr: usize,
    /// Length (the BAR size).
    pub len: usize,
}

/// MSI / MSI-X state: the eventfds handed to the kernel (our own duplicates) and how many
/// vectors are enabled.
#[derive(Debug, Default)]
struct IrqState {
    fds: Vec<Option<EventFd>>,
    enabled: u32,
}

/// An open VFIO device.
#[derive(Debug)]
pub struct VfioDevice {
    file: File,
    /// `VFIO_DEVICE_GET_INFO`.
    pub info: VfioDeviceInfo,
    config: VfioRegionInfo,
    msix: VfioIrqInfo,
    bars: Mutex<[Option<MappedBar>; 6]>,
    irqs: Mutex<[IrqState; 3]>,
}

impl VfioDevice {
    /// Wraps a device fd and reads its info, config region and MSI-X info.
    pub fn new(fd: OwnedFd) -> Result<VfioDevice, VfioError> {
        let file = File::from(fd);
        let mut info = VfioDeviceInfo {
            argsz: size_of::<VfioDeviceInfo>() as u32,
            ..Default::default()
        };
        // SAFETY: `info` is a VfioDeviceInfo with argsz = its size, as GET_INFO expects.
        unsafe { sys::ioctl_ptr(file.as_fd(), uapi::VFIO_DEVICE_GET_INFO, &mut info) }
            .map_err(VfioError::ioctl("VFIO_DEVICE_GET_INFO"))?;
        if info.flags & uapi::VFIO_DEVICE_FLAGS_PCI == 0 {
            return Err(VfioError::Unsupported(
                "the VFIO device is not a PCI device",
            ));
        }
        let mut dev = VfioDevice {
            file,
            info,
            config: VfioRegionInfo::default(),
            msix: VfioIrqInfo::default(),
            bars: Mutex::new([None; 6]),
            irqs: Mutex::new(Default::default()),
        };
        dev.config = dev.region_raw(uapi::VFIO_PCI_CONFIG_REGION_INDEX)?.0;
        dev.msix = dev.irq_info(uapi::VFIO_PCI_MSIX_IRQ_INDEX)?;
        Ok(dev)
    }

    /// `VFIO_DEVICE_GET_REGION_INFO` for `index`: the head and the whole buffer (with the
    /// capability chain).
    fn region_raw(&self, index: u32) -> Result<(VfioRegionInfo, Vec<u8>), VfioError> {
        let mut argsz = size_of::<VfioRegionInfo>() as u32;
        for _ in 0..3 {
            // u64 words keep the buffer aligned for the struct head.
            let mut buf = vec![0u64; (argsz as usize).div_ceil(8)];
            let head = VfioRegionInfo {
                argsz,
                index,
                ..Default::default()
            };
            // SAFETY: `buf` is at least `argsz` bytes and 8-byte aligned; the head fits.
            unsafe { buf.as_mut_ptr().cast::<VfioRegionInfo>().write(head) };
            // SAFETY: `buf` holds a VfioRegionInfo announcing `argsz` bytes, all writable.
            unsafe {
                sys::ioctl_ptr(
                    self.file.as_fd(),
                    uapi::VFIO_DEVICE_GET_REGION_INFO,
                    buf.as_mut_ptr(),
                )
            }
            .map_err(VfioError::ioctl("VFIO_DEVICE_GET_REGION_INFO"))?;
            // SAFETY: the buffer starts with an initialised VfioRegionInfo (plain integers).
            let info = unsafe { buf.as_ptr().cast::<VfioRegionInfo>().read() };
            if info.argsz <= argsz {
                let bytes: Vec<u8> = buf
                    .iter()
                    .flat_map(|w| w.to_ne_bytes())
                    .take(argsz as usize)
                    .collect();
                return Ok((info, bytes));
            }
            argsz = info.argsz; // the capability chain needs a larger buffer
        }
        Err(VfioError::Malformed {
            what: "region info",
            why: "the kernel keeps asking for a larger buffer",
        })
    }

    fn irq_info(&self, index: u32) -> Result<VfioIrqInfo, VfioError> {
        let mut info = VfioIrqInfo {
            argsz: size_of::<VfioIrqInfo>() as u32,
            index,
            ..Default::default()
        };
        // SAFETY: `info` is a VfioIrqInfo with argsz = its size.
        unsafe { sys::ioctl_ptr(self.file.as_fd(), uapi::VFIO_DEVICE_GET_IRQ_INFO, &mut info) }
            .map_err(VfioError::ioctl("VFIO_DEVICE_GET_IRQ_INFO"))?;
        Ok(info)
    }

    fn config_check(&self, offset: u16, len: usize) -> Result<u64, crate::pci::PciError> {
        if len == 0 || offset as u64 + len as u64 > self.config.size.min(4096) {
            return Err(crate::pci::PciError::ConfigRange { offset, len });
        }
        Ok(self.config.offset + offset as u64)
    }

    /// Reads config space (pread on the config region).
    pub fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), crate::pci::PciError> {
        let at = self.config_check(offset, buf.len())?;
        self.file
            .read_exact_at(buf, at)
            .map_err(|source| crate::pci::PciError::Os {
                what: "config space read",
                source,
            })
    }

    /// Writes config space (pwrite on the config region).
    pub fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), crate::pci::PciError> {
        let at = self.config_check(offset, data.len())?;
        self.file
            .write_all_at(data, at)
            .map_err(|source| crate::pci::PciError::Os {
                what: "config space write",
                source,
            })
    }

    /// Maps BAR `index` (once; later calls return the same mapping).
    pub fn map_bar(&self, index: u8) -> Result<MappedBar, VfioError> {
        let mut bars = self.bars.lock().unwrap_or_else(|e| e.into_inner());
        let slot = bars
            .get_mut(index as usize)
            .ok_or(VfioError::NoBar(index))?;
        if let Some(m) = slot {
            return Ok(*m);
        }
        let (info, buf) = self.region_raw(index as u32)?;
        let areas =
            plan_mmap(&info, &buf, sys::page_size() as u64)?.ok_or(VfioError::NoBar(index))?;
        let len = info.size as usize;
        let base = sys::reserve(len).map_err(VfioError::os("reserve address space for a BAR"))?;
        let mut prot = 0;
        if info.flags & uapi::VFIO_REGION_INFO_FLAG_READ != 0 {
            prot |= libc::PROT_READ;
        }
        if info.flags & uapi::VFIO_REGION_INFO_FLAG_WRITE != 0 {
            prot |= libc::PROT_WRITE;
        }
        for a in &areas {
            // SAFETY: the area lies inside the BAR (checked by the sparse parser), hence
            // inside the reservation we just made and own.
            let r = unsafe {
                sys::map_fixed(
                    base + a.offset as usize,
                    a.size as usize,
                    prot,
                    self.file.as_fd(),
                    info.offset + a.offset,
                )
            };
            if let Err(e) = r {
                // SAFETY: the reservation is ours and was never handed out.
                let _ = unsafe { sys::unmap(base, len) };
                return Err(VfioError::Os {
                    what: "mmap a BAR area",
                    source: e,
                });
            }
        }
        let m = MappedBar { addr: base, len };
        *slot = Some(m);
        Ok(m)
    }

    /// `VFIO_DEVICE_RESET`.
    pub fn reset(&self) -> Result<(), VfioError> {
        if self.info.flags & uapi::VFIO_DEVICE_FLAGS_RESET == 0 {
            return Err(VfioError::Unsupported(
                "the device offers no function reset (no FLR / PM reset; see its reset_method in sysfs)",
            ));
        }
        // SAFETY: VFIO_DEVICE_RESET takes no argument.
        unsafe { sys::ioctl_val(self.file.as_fd(), uapi::VFIO_DEVICE_RESET, 0) }
            .map_err(VfioError::ioctl("VFIO_DEVICE_RESET"))?;
        Ok(())
    }

    /// Number of MSI-X vectors.
    pub fn num_msix(&self) -> u32 {
        self.msix.count
    }

    fn set_irqs_raw(&self, bytes: &mut [u8]) -> Result<(), VfioError> {
        // SAFETY: `bytes` is a complete vfio_irq_set (head + data) whose argsz is its length.
        unsafe {
            sys::ioctl_ptr(
                self.file.as_fd(),
                uapi::VFIO_DEVICE_SET_IRQS,
                bytes.as_mut_ptr(),
            )
        }
        .map_err(VfioError::ioctl("VFIO_DEVICE_SET_IRQS"))?;
        Ok(())
    }

    fn disable_index(&self, index: u32) -> Result<(), VfioError> {
        let mut head = VfioIrqSetHead {
            argsz: size_of::<VfioIrqSetHead>() as u32,
            flags: uapi::VFIO_IRQ_SET_DATA_NONE | uapi::VFIO_IRQ_SET_ACTION_TRIGGER,
            index,
            start: 0,
            count: 0,
        };
        // SAFETY: a data-less vfio_irq_set with argsz = its size.
        unsafe { sys::ioctl_ptr(self.file.as_fd(), uapi::VFIO_DEVICE_SET_IRQS, &mut head) }
            .map_err(VfioError::ioctl("VFIO_DEVICE_SET_IRQS (disable)"))?;
        Ok(())
    }

    /// Routes vector `vector` of IRQ index `index` (MSI = 1, MSI-X = 2) to `fd`, or removes it.
    /// With static MSI-X (`NORESIZE`) growing the enabled block means disabling and
    /// re-enabling the index with every vector's eventfd.
    pub fn set_irq(&self, index: u32, vector: u32, fd: Option<&EventFd>) -> Result<(), VfioError> {
        let info = if index == uapi::VFIO_PCI_MSIX_IRQ_INDEX {
            self.msix
        } else {
            self.irq_info(index)?
        };
        if vector >= info.count {
            return Err(VfioError::NoVector(vector));
        }
        let dynamic = info.flags & uapi::VFIO_IRQ_INFO_NORESIZE == 0;
        let mut all = self.irqs.lock().unwrap_or_else(|e| e.into_inner());
        let st = all
            .get_mut(index as usize)
            .ok_or(VfioError::Unsupported("IRQ index"))?;
        if st.fds.len() < info.count as usize {
            st.fds.resize_with(info.count as usize, || None);
        }
        let dup = fd
            .map(|f| f.try_clone())
            .transpose()
            .map_err(VfioError::os("dup eventfd"))?;
        let raw = dup.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd);
        let highest = (0..info.count as usize).rev().find(|&i| {
            if i == vector as usize {
                dup.is_some()
            } else {
                st.fds[i].is_some()
            }
        });
        match highest {
            None => {
                if st.enabled > 0 {
                    self.disable_index(index)?;
                }
                st.enabled = 0;
            }
            Some(_) if st.enabled > 0 && (vector < st.enabled || dynamic) => {
                self.set_irqs_raw(&mut uapi::irq_set_bytes(index, vector, &[raw]))?;
                st.enabled = st.enabled.max(vector + 1);
            }
            Some(h) => {
                if st.enabled > 0 {
                    self.disable_index(index)?;
                    st.enabled = 0;
                }
                let fds: Vec<i32> = (0..=h)
                    .map(|i| {
                        if i == vector as usize {
                            raw
                        } else {
                            st.fds[i]
                                .as_ref()
                                .map_or(-1, std::os::fd::AsRawFd::as_raw_fd)
                        }
                    })
                    .collect();
                self.set_irqs_raw(&mut uapi::irq_set_bytes(index, 0, &fds))?;
                st.enabled = h as u32 + 1;
            }
        }
        st.fds[vector as usize] = dup;
        Ok(())
    }

    /// Disables MSI and MSI-X if enabled (teardown).
    pub fn disable_irqs(&self) -> Result<(), VfioError> {
        let mut all = self.irqs.lock().unwrap_or_else(|e| e.into_inner());
        let mut first_err = None;
        for (index, st) in all.iter_mut().enumerate() {
            if st.enabled > 0 {
                if let Err(e) = self.disable_index(index as u32) {
                    first_err.get_or_insert(e);
                }
                st.enabled = 0;
            }
            st.fds.clear();
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Unmaps every BAR.
    ///
    /// # Safety
    /// No pointer into a BAR mapping may be used afterwards.
    pub unsafe fn unmap_bars(&self) -> Result<(), VfioError> {
        let mut bars = self.bars.lock().unwrap_or_else(|e| e.into_inner());
        let mut res = Ok(());
        for m in bars.iter_mut().filter_map(Option::take) {
            // SAFETY: the mapping is ours and the caller guarantees it is no longer used.
            if let Err(e) = unsafe { sys::unmap(m.addr, m.len) } {
                res = Err(VfioError::Os {
                    what: "munmap a BAR",
                    source: e,
                });
            }
        }
        res
    }

    /// The device fd.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmap_plan() {
        let mut info = VfioRegionInfo {
            size: 0x10000,
            flags: 0x7,
            ..Default::default()
        };
        assert_eq!(
            plan_mmap(&info, &[], 4096).unwrap().unwrap(),
            vec![SparseArea {
                offset: 0,
                size: 0x10000
            }]
        );
        info.flags = 0x3; // no MMAP flag
        assert_eq!(plan_mmap(&info, &[], 4096).unwrap(), None);
        info.flags = 0x7;
        info.size = 0;
        assert_eq!(plan_mmap(&info, &[], 4096).unwrap(), None);

        // Sparse areas, with and without MSIX_MAPPABLE.
        let mut buf = vec![0u8; 32];
        let push = |b: &mut Vec<u8>, v: &[u8]| b.extend_from_slice(v);
        push(&mut buf, &1u16.to_le_bytes());
        push(&mut buf, &1u16.to_le_bytes());
        push(&mut buf, &0u32.to_le_bytes());
        push(&mut buf, &1u32.to_le_bytes());
        push(&mut buf, &0u32.to_le_bytes());
        push(&mut buf, &0x1000u64.to_le_bytes());
        push(&mut buf, &0xf000u64.to_le_bytes());
        let info = VfioRegionInfo {
            size: 0x10000,
            flags: 0xf,
            cap_offset: 32,
            ..Default::default()
        };
        assert_eq!(
            plan_mmap(&info, &buf, 4096).unwrap().unwrap(),
            vec![SparseArea {
                offset: 0x1000,
                size: 0xf000
            }]
        );
        // An unaligned area is refused.
        buf[40..48].copy_from_slice(&0x800u64.to_le_bytes());
        assert!(plan_mmap(&info, &buf, 4096).is_err());
        // MSIX_MAPPABLE (id 3) ahead of it: map everything.
        let mut b2 = vec![0u8; 32];
        push(&mut b2, &3u16.to_le_bytes());
        push(&mut b2, &1u16.to_le_bytes());
        push(&mut b2, &40u32.to_le_bytes());
        b2.extend_from_slice(&buf[32..]);
        assert_eq!(
            plan_mmap(&info, &b2, 4096).unwrap().unwrap(),
            vec![SparseArea {
                offset: 0,
                size: 0x10000
            }]
        );
    }
}

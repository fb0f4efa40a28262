//! The VFIO and iommufd uAPI as far as uhca uses it: `#[repr(C)]` structs, constants, ioctl
//! numbers, and safe parsers for the capability chains the kernel returns.
//!
//! Everything here is plain data (no `unsafe`); the calls that hand these structs to the
//! kernel live in `sys`. Values are from `include/uapi/linux/vfio.h` and
//! `include/uapi/linux/iommufd.h` (torvalds/linux), as tabled in vfio-kernel.md §1.1-§1.3
//! and §5. Struct sizes are const-asserted here, and a test (`uapi_check`) compares every
//! struct's size, field offsets, ioctl number and constant with the bindgen output of
//! vfio-bindings 0.7.0 and iommufd-bindings 0.2.0 (dev-dependencies only).

use super::VfioError;

/// `_IO(';', nr)`: VFIO and iommufd ioctls encode no size or direction (vfio-kernel.md §1).
const fn io(nr: u32) -> u64 {
    (0x3B << 8) | nr as u64
}

/// Container: `VFIO_GET_API_VERSION`.
pub const VFIO_GET_API_VERSION: u64 = io(100);
/// Container: `VFIO_CHECK_EXTENSION`.
pub const VFIO_CHECK_EXTENSION: u64 = io(101);
/// Container: `VFIO_SET_IOMMU`.
pub const VFIO_SET_IOMMU: u64 = io(102);
/// Group: `VFIO_GROUP_GET_STATUS`.
pub const VFIO_GROUP_GET_STATUS: u64 = io(103);
/// Group: `VFIO_GROUP_SET_CONTAINER`.
pub const VFIO_GROUP_SET_CONTAINER: u64 = io(104);
/// Group: `VFIO_GROUP_UNSET_CONTAINER`.
pub const VFIO_GROUP_UNSET_CONTAINER: u64 = io(105);
/// Group: `VFIO_GROUP_GET_DEVICE_FD`.
pub const VFIO_GROUP_GET_DEVICE_FD: u64 = io(106);
/// Device: `VFIO_DEVICE_GET_INFO`.
pub const VFIO_DEVICE_GET_INFO: u64 = io(107);
/// Device: `VFIO_DEVICE_GET_REGION_INFO`.
pub const VFIO_DEVICE_GET_REGION_INFO: u64 = io(108);
/// Device: `VFIO_DEVICE_GET_IRQ_INFO`.
pub const VFIO_DEVICE_GET_IRQ_INFO: u64 = io(109);
/// Device: `VFIO_DEVICE_SET_IRQS`.
pub const VFIO_DEVICE_SET_IRQS: u64 = io(110);
/// Device: `VFIO_DEVICE_RESET`.
pub const VFIO_DEVICE_RESET: u64 = io(111);
/// Container: `VFIO_IOMMU_GET_INFO`.
pub const VFIO_IOMMU_GET_INFO: u64 = io(112);
/// Container: `VFIO_IOMMU_MAP_DMA`.
pub const VFIO_IOMMU_MAP_DMA: u64 = io(113);
/// Container: `VFIO_IOMMU_UNMAP_DMA`.
pub const VFIO_IOMMU_UNMAP_DMA: u64 = io(114);
/// Device cdev: `VFIO_DEVICE_BIND_IOMMUFD`.
pub const VFIO_DEVICE_BIND_IOMMUFD: u64 = io(118);
/// Device cdev: `VFIO_DEVICE_ATTACH_IOMMUFD_PT`.
pub const VFIO_DEVICE_ATTACH_IOMMUFD_PT: u64 = io(119);
/// Device cdev: `VFIO_DEVICE_DETACH_IOMMUFD_PT`.
pub const VFIO_DEVICE_DETACH_IOMMUFD_PT: u64 = io(120);
/// Device: `VFIO_DEVICE_FEATURE` (5.7+; vfio-kernel.md §2.1, §8).
pub const VFIO_DEVICE_FEATURE: u64 = io(117);
/// iommufd: `IOMMU_DESTROY`.
pub const IOMMU_DESTROY: u64 = io(0x80);
/// iommufd: `IOMMU_IOAS_ALLOC`.
pub const IOMMU_IOAS_ALLOC: u64 = io(0x81);
/// iommufd: `IOMMU_IOAS_IOVA_RANGES`.
pub const IOMMU_IOAS_IOVA_RANGES: u64 = io(0x84);
/// iommufd: `IOMMU_IOAS_MAP`.
pub const IOMMU_IOAS_MAP: u64 = io(0x85);
/// iommufd: `IOMMU_IOAS_UNMAP`.
pub const IOMMU_IOAS_UNMAP: u64 = io(0x86);
/// iommufd: `IOMMU_IOAS_MAP_FILE` (6.13+: memfd; 6.19+: VFIO dma-buf, vfio-kernel.md §8).
pub const IOMMU_IOAS_MAP_FILE: u64 = io(0x8f);

/// `VFIO_API_VERSION`.
pub const VFIO_API_VERSION: i32 = 0;
/// IOMMU model: type1 v2.
pub const VFIO_TYPE1V2_IOMMU: u64 = 3;
/// IOMMU model: no-IOMMU (vfio-kernel.md §1.5).
pub const VFIO_NOIOMMU_IOMMU: u64 = 8;
/// Group status: viable.
pub const VFIO_GROUP_FLAGS_VIABLE: u32 = 1 << 0;
/// Device info flag: `VFIO_DEVICE_RESET` is supported.
pub const VFIO_DEVICE_FLAGS_RESET: u32 = 1 << 0;
/// Device info flag: a PCI device.
pub const VFIO_DEVICE_FLAGS_PCI: u32 = 1 << 1;
/// Region flag: readable.
pub const VFIO_REGION_INFO_FLAG_READ: u32 = 1 << 0;
/// Region flag: writable.
pub const VFIO_REGION_INFO_FLAG_WRITE: u32 = 1 << 1;
/// Region flag: mmap-able.
pub const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
/// Region flag: has a capability chain.
pub const VFIO_REGION_INFO_FLAG_CAPS: u32 = 1 << 3;
/// Region capability: sparse mmap areas.
pub const VFIO_REGION_INFO_CAP_SPARSE_MMAP: u16 = 1;
/// Region capability: the MSI-X table may be mapped.
pub const VFIO_REGION_INFO_CAP_MSIX_MAPPABLE: u16 = 3;
/// vfio-pci region index of config space.
pub const VFIO_PCI_CONFIG_REGION_INDEX: u32 = 7;
/// vfio-pci IRQ index of MSI-X.
pub const VFIO_PCI_MSIX_IRQ_INDEX: u32 = 2;
/// IRQ info flag: vectors cannot be added while enabled (no dynamic MSI-X).
pub const VFIO_IRQ_INFO_NORESIZE: u32 = 1 << 3;
/// `SET_IRQS` data: none.
pub const VFIO_IRQ_SET_DATA_NONE: u32 = 1 << 0;
/// `SET_IRQS` data: an array of eventfds.
pub const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
/// `SET_IRQS` action: trigger.
pub const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
/// type1 info flag: `iova_pgsizes` is valid.
pub const VFIO_IOMMU_INFO_PGSIZES: u32 = 1 << 0;
/// type1 info flag: a capability chain follows.
pub const VFIO_IOMMU_INFO_CAPS: u32 = 1 << 1;
/// type1 info capability: usable IOVA ranges.
pub const VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE: u16 = 1;
/// type1 info capability: DMA mappings left.
pub const VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL: u16 = 3;
/// DMA map flag: device may read.
pub const VFIO_DMA_MAP_FLAG_READ: u32 = 1 << 0;
/// DMA map flag: device may write.
pub const VFIO_DMA_MAP_FLAG_WRITE: u32 = 1 << 1;
/// iommufd map flag: use the given IOVA.
pub const IOMMU_IOAS_MAP_FIXED_IOVA: u32 = 1 << 0;
/// iommufd map flag: device may write.
pub const IOMMU_IOAS_MAP_WRITEABLE: u32 = 1 << 1;
/// iommufd map flag: device may read.
pub const IOMMU_IOAS_MAP_READABLE: u32 = 1 << 2;
/// `vfio_device_feature.flags`: the feature number's bits.
pub const VFIO_DEVICE_FEATURE_MASK: u32 = 0xffff;
/// `vfio_device_feature.flags`: get the feature.
pub const VFIO_DEVICE_FEATURE_GET: u32 = 1 << 16;
/// `vfio_device_feature.flags`: only probe whether the feature exists.
pub const VFIO_DEVICE_FEATURE_PROBE: u32 = 1 << 18;
/// Feature: export BAR ranges as a dma-buf (6.19+; the ioctl returns the new fd, §2.1).
pub const VFIO_DEVICE_FEATURE_DMA_BUF: u32 = 11;

/// `struct vfio_group_status`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct VfioGroupStatus {
    /// Size of this struct.
    pub argsz: u32,
    /// `VFIO_GROUP_FLAGS_*`.
    pub flags: u32,
}

/// `struct vfio_device_info`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct VfioDeviceInfo {
    /// Size of this struct.
    pub argsz: u32,
    /// `VFIO_DEVICE_FLAGS_*`.
    pub flags: u32,
    /// Number of regions.
    pub num_regions: u32,
    /// Number of IRQ indexes.
    pub num_irqs: u32,
    /// Offset of the first capability.
    pub cap_offset: u32,
    /// Padding.
    pub pad: u32,
}

/// `struct vfio_region_info` (the fixed head; capabilities follow in a larger buffer).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct VfioRegionInfo {
    /// Size of the buffer (in), size needed (out).
    pub argsz: u32,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Region index.
    pub index: u32,
    /// Offset of the first capability from the start of this struct.
    pub cap_offset: u32,
    /// Region size in bytes.
    pub size: u64,
    /// Offset of the region in the device fd.
    pub offset: u64,
}

/// `struct vfio_irq_info`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct VfioIrqInfo {
    /// Size of this struct.
    pub argsz: u32,
    /// `VFIO_IRQ_INFO_*`.
    pub flags: u32,
    /// IRQ index.
    pub index: u32,
    /// Number of vectors.
    pub count: u32,
}

/// `struct vfio_irq_set` with room for one eventfd (the only shape uhca sends with data;
/// larger sets go through [`irq_set_bytes`]).
#[repr(C)]
#[derive(Debug, Default)]
pub struct VfioIrqSetHead {
    /// Size of the struct plus data.
    pub argsz: u32,
    /// `VFIO_IRQ_SET_*`.
    pub flags: u32,
    /// IRQ index.
    pub index: u32,
    /// First vector.
    pub start: u32,
    /// Number of vectors.
    pub count: u32,
}

/// `struct vfio_iommu_type1_info` (head).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct VfioIommuType1Info {
    /// Buffer size in, size needed out.
    pub argsz: u32,
    /// `VFIO_IOMMU_INFO_*`.
    pub flags: u32,
    /// Bitmap of supported IOMMU page sizes.
    pub iova_pgsizes: u64,
    /// Offset of the first capability.
    pub cap_offset: u32,
    /// Padding.
    pub pad: u32,
}

/// `struct vfio_iommu_type1_dma_map`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct VfioDmaMap {
    /// Size of this struct.
    pub argsz: u32,
    /// `VFIO_DMA_MAP_FLAG_*`.
    pub flags: u32,
    /// Host virtual address.
    pub vaddr: u64,
    /// Device address.
    pub iova: u64,
    /// Length.
    pub size: u64,
}

/// `struct vfio_iommu_type1_dma_unmap` (no bitmap).
#[repr(C)]
#[derive(Debug, Default)]
pub struct VfioDmaUnmap {
    /// Size of this struct.
    pub argsz: u32,
    /// Flags (0).
    pub flags: u32,
    /// Device address.
    pub iova: u64,
    /// Length in, bytes unmapped out.
    pub size: u64,
}

/// `struct vfio_device_bind_iommufd` in its original 16-byte form (6.6+; the token pointer
/// that newer kernels accept is optional).
#[repr(C)]
#[derive(Debug, Default)]
pub struct VfioDeviceBindIommufd {
    /// Size of this struct.
    pub argsz: u32,
    /// Flags (0).
    pub flags: u32,
    /// The iommufd.
    pub iommufd: i32,
    /// Device id in the iommufd context (out).
    pub out_devid: u32,
}

/// `struct vfio_device_attach_iommufd_pt`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct VfioDeviceAttachIommufdPt {
    /// Size of this struct.
    pub argsz: u32,
    /// Flags (0: no PASID).
    pub flags: u32,
    /// IOAS or HWPT id in, attached HWPT out.
    pub pt_id: u32,
    /// PASID (unused).
    pub pasid: u32,
}

/// `struct vfio_device_detach_iommufd_pt` in its original 8-byte form (the `pasid` word
/// newer kernels accept is only read with a PASID flag).
#[repr(C)]
#[derive(Debug, Default)]
pub struct VfioDeviceDetachIommufdPt {
    /// Size of this struct.
    pub argsz: u32,
    /// Flags (0).
    pub flags: u32,
}

/// `struct iommu_destroy`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct IommuDestroy {
    /// Size of this struct.
    pub size: u32,
    /// Object id.
    pub id: u32,
}

/// `struct iommu_ioas_alloc`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct IommuIoasAlloc {
    /// Size of this struct.
    pub size: u32,
    /// Flags (0).
    pub flags: u32,
    /// New IOAS id (out).
    pub out_ioas_id: u32,
}

/// `struct iommu_iova_range`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct IommuIovaRange {
    /// First address.
    pub start: u64,
    /// Last address (inclusive).
    pub last: u64,
}

/// `struct iommu_ioas_iova_ranges`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct IommuIoasIovaRanges {
    /// Size of this struct.
    pub size: u32,
    /// IOAS id.
    pub ioas_id: u32,
    /// Array length in, ranges available out.
    pub num_iovas: u32,
    /// Reserved.
    pub reserved: u32,
    /// Pointer to an `IommuIovaRange` array.
    pub allowed_iovas: u64,
    /// Required IOVA alignment (out).
    pub out_iova_alignment: u64,
}

/// `struct iommu_ioas_map`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct IommuIoasMap {
    /// Size of this struct.
    pub size: u32,
    /// `IOMMU_IOAS_MAP_*`.
    pub flags: u32,
    /// IOAS id.
    pub ioas_id: u32,
    /// Reserved.
    pub reserved: u32,
    /// Host virtual address.
    pub user_va: u64,
    /// Length.
    pub length: u64,
    /// Device address (in with FIXED_IOVA, out otherwise).
    pub iova: u64,
}

/// `struct iommu_ioas_map_file`: map `length` bytes of a memfd or dma-buf starting at
/// file offset `start`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct IommuIoasMapFile {
    /// Size of this struct.
    pub size: u32,
    /// `IOMMU_IOAS_MAP_*`.
    pub flags: u32,
    /// IOAS id.
    pub ioas_id: u32,
    /// The file (memfd, hugetlbfs file, VFIO dma-buf).
    pub fd: i32,
    /// Offset in the file.
    pub start: u64,
    /// Length.
    pub length: u64,
    /// Device address (in with FIXED_IOVA, out otherwise).
    pub iova: u64,
}

/// `struct iommu_ioas_unmap`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct IommuIoasUnmap {
    /// Size of this struct.
    pub size: u32,
    /// IOAS id.
    pub ioas_id: u32,
    /// First address.
    pub iova: u64,
    /// Length in, bytes unmapped out.
    pub length: u64,
}

// Sizes fixed by the uAPI (vfio-kernel.md §1.1-§1.3).
/// `struct vfio_device_feature` header: `argsz`, `flags`, then the feature's data.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct VfioDeviceFeature {
    /// Size of the header plus the data.
    pub argsz: u32,
    /// `VFIO_DEVICE_FEATURE_GET | feature` (or `SET`, `PROBE`).
    pub flags: u32,
}

/// `struct vfio_device_feature_dma_buf` (without its flexible `dma_ranges[]`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct VfioDeviceFeatureDmaBuf {
    /// BAR index (0-5; the kernel refuses the ROM and config regions with `ENODEV`).
    pub region_index: u32,
    /// open(2) flags of the new fd (`O_RDWR | O_CLOEXEC`).
    pub open_flags: u32,
    /// Must be 0.
    pub flags: u32,
    /// Number of `dma_ranges` that follow (at least 1).
    pub nr_ranges: u32,
}

/// `struct vfio_region_dma_range`: one page-aligned slice of the BAR.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VfioRegionDmaRange {
    /// Offset in the BAR.
    pub offset: u64,
    /// Length.
    pub length: u64,
}

/// The argument of `VFIO_DEVICE_FEATURE(GET | DMA_BUF)` for `ranges` of BAR
/// `region_index`: header, dma-buf struct, ranges (argsz = 8 + 16 + 16 n), as u64 words so
/// the buffer is 8-byte aligned for the kernel. Refuses no ranges or too many to count.
pub fn dma_buf_feature(
    region_index: u32,
    open_flags: u32,
    ranges: &[VfioRegionDmaRange],
) -> Result<Vec<u64>, VfioError> {
    let n = u32::try_from(ranges.len())
        .ok()
        .filter(|&n| n > 0 && n < 1 << 16)
        .ok_or(VfioError::Unsupported(
            "a VFIO dma-buf needs between 1 and 65535 ranges",
        ))?;
    let argsz =
        size_of::<VfioDeviceFeature>() + size_of::<VfioDeviceFeatureDmaBuf>() + 16 * ranges.len();
    let lo = |a: u32, b: u32| u64::from(a) | (u64::from(b) << 32);
    let lo = |a: u32, b: u32| {
        if cfg!(target_endian = "little") {
            lo(a, b)
        } else {
            lo(b, a)
        }
    };
    let mut w = Vec::with_capacity(argsz / 8);
    w.push(lo(
        argsz as u32,
        VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_DMA_BUF,
    ));
    w.push(lo(region_index, open_flags));
    w.push(lo(0, n));
    for r in ranges {
        w.push(r.offset);
        w.push(r.length);
    }
    Ok(w)
}

const _: () = assert!(size_of::<VfioDeviceFeature>() == 8);
const _: () = assert!(size_of::<VfioDeviceFeatureDmaBuf>() == 16);
const _: () = assert!(size_of::<VfioRegionDmaRange>() == 16);
const _: () = assert!(size_of::<VfioDeviceInfo>() == 24);
const _: () = assert!(size_of::<VfioRegionInfo>() == 32);
const _: () = assert!(size_of::<VfioIrqSetHead>() == 20);
const _: () = assert!(size_of::<VfioIommuType1Info>() == 24);
const _: () = assert!(size_of::<VfioDmaMap>() == 32);
const _: () = assert!(size_of::<VfioDmaUnmap>() == 24);
const _: () = assert!(size_of::<VfioDeviceBindIommufd>() == 16);
const _: () = assert!(size_of::<IommuIoasIovaRanges>() == 32);
const _: () = assert!(size_of::<IommuIoasMap>() == 40);
const _: () = assert!(size_of::<IommuIoasUnmap>() == 24);
const _: () = assert!(size_of::<IommuIoasMapFile>() == 40);

/// One capability in a VFIO capability chain: its id, version and bytes (header included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap<'a> {
    /// Capability id.
    pub id: u16,
    /// Capability version.
    pub version: u16,
    /// The capability's bytes, from its header to the next capability (or the buffer end).
    pub bytes: &'a [u8],
}

fn ne_u16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn ne_u32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn ne_u64(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// Walks the capability chain in `buf` (the whole info buffer the kernel filled), starting
/// at `first` (`cap_offset`; 0 = none). Each header is `{u16 id; u16 version; u32 next}`
/// with `next` an offset from the start of `buf`. A chain that points outside the buffer,
/// backwards, or into a header is reported as malformed rather than followed.
pub fn cap_chain(buf: &[u8], first: u32) -> Result<Vec<Cap<'_>>, VfioError> {
    let mut caps = Vec::new();
    let mut off = first as usize;
    let mut floor = 0usize;
    while off != 0 {
        let bad = |why: &'static str| VfioError::Malformed {
            what: "capability chain",
            why,
        };
        if off < floor || off < 8 {
            return Err(bad("capability offset points backwards"));
        }
        let id = ne_u16(buf, off).ok_or(bad("capability header outside the buffer"))?;
        let version = ne_u16(buf, off + 2).ok_or(bad("capability header outside the buffer"))?;
        let next = ne_u32(buf, off + 4).ok_or(bad("capability header outside the buffer"))?;
        let end = if next == 0 { buf.len() } else { next as usize };
        if end < off + 8 || end > buf.len() {
            return Err(bad("next capability offset out of range"));
        }
        caps.push(Cap {
            id,
            version,
            bytes: &buf[off..end],
        });
        floor = off + 8;
        off = next as usize;
    }
    Ok(caps)
}

/// Parses a `vfio_iommu_type1_info_cap_iova_range` body: `u32 nr_iovas; u32 reserved;`
/// then `{u64 start; u64 end}` pairs (inclusive ends).
pub fn parse_iova_range_cap(cap: &Cap<'_>) -> Result<Vec<(u64, u64)>, VfioError> {
    let bad = |why| VfioError::Malformed {
        what: "IOVA range capability",
        why,
    };
    let n = ne_u32(cap.bytes, 8).ok_or(bad("truncated header"))? as usize;
    let mut out = Vec::with_capacity(n.min(64));
    for i in 0..n {
        let at = 16 + 16 * i;
        let start = ne_u64(cap.bytes, at).ok_or(bad("range list is truncated"))?;
        let end = ne_u64(cap.bytes, at + 8).ok_or(bad("range list is truncated"))?;
        if end < start {
            return Err(bad("range ends before it starts"));
        }
        out.push((start, end));
    }
    Ok(out)
}

/// Parses a `vfio_iommu_type1_info_dma_avail` body: the number of mappings left.
pub fn parse_dma_avail_cap(cap: &Cap<'_>) -> Result<u32, VfioError> {
    ne_u32(cap.bytes, 8).ok_or(VfioError::Malformed {
        what: "DMA_AVAIL capability",
        why: "truncated",
    })
}

/// An mmap-able area of a region: `[offset, offset + size)` relative to the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseArea {
    /// Offset inside the region.
    pub offset: u64,
    /// Length.
    pub size: u64,
}

/// Parses a `vfio_region_info_cap_sparse_mmap` body: `u32 nr_areas; u32 reserved;` then
/// `{u64 offset; u64 size}` areas. Areas are checked to lie inside a region of `region_size`.
pub fn parse_sparse_mmap_cap(
    cap: &Cap<'_>,
    region_size: u64,
) -> Result<Vec<SparseArea>, VfioError> {
    let bad = |why| VfioError::Malformed {
        what: "sparse mmap capability",
        why,
    };
    let n = ne_u32(cap.bytes, 8).ok_or(bad("truncated header"))? as usize;
    let mut out = Vec::with_capacity(n.min(64));
    for i in 0..n {
        let at = 16 + 16 * i;
        let offset = ne_u64(cap.bytes, at).ok_or(bad("area list is truncated"))?;
        let size = ne_u64(cap.bytes, at + 8).ok_or(bad("area list is truncated"))?;
        if offset.checked_add(size).is_none_or(|e| e > region_size) {
            return Err(bad("area lies outside the region"));
        }
        if size > 0 {
            out.push(SparseArea { offset, size });
        }
    }
    Ok(out)
}

/// The bytes of a `vfio_irq_set` with `DATA_EVENTFD | ACTION_TRIGGER` for `fds` (-1 = no
/// eventfd for that vector), starting at vector `start` of `index` (vfio-kernel.md §5).
pub fn irq_set_bytes(index: u32, start: u32, fds: &[i32]) -> Vec<u8> {
    let argsz = (size_of::<VfioIrqSetHead>() + 4 * fds.len()) as u32;
    let mut v = Vec::with_capacity(argsz as usize);
    for w in [
        argsz,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        index,
        start,
        fds.len() as u32,
    ] {
        v.extend_from_slice(&w.to_ne_bytes());
    }
    for fd in fds {
        v.extend_from_slice(&fd.to_ne_bytes());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put16(b: &mut Vec<u8>, v: u16) {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    fn put32(b: &mut Vec<u8>, v: u32) {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    fn put64(b: &mut Vec<u8>, v: u64) {
        b.extend_from_slice(&v.to_ne_bytes());
    }

    /// A type1 info buffer as the kernel lays it out: head, IOVA_RANGE cap, DMA_AVAIL cap.
    fn type1_info_buffer() -> Vec<u8> {
        let mut b = Vec::new();
        // head: argsz, flags, pgsizes, cap_offset, pad
        put32(&mut b, 0);
        put32(&mut b, VFIO_IOMMU_INFO_PGSIZES | VFIO_IOMMU_INFO_CAPS);
        put64(&mut b, 0x4020_1000);
        put32(&mut b, 24);
        put32(&mut b, 0);
        // IOVA range cap at 24: hdr, nr=2, reserved, 2 ranges -> 16 + 32 = 48 bytes
        put16(&mut b, VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE);
        put16(&mut b, 1);
        put32(&mut b, 24 + 48);
        put32(&mut b, 2);
        put32(&mut b, 0);
        put64(&mut b, 0);
        put64(&mut b, 0xfedf_ffff);
        put64(&mut b, 0xfef0_0000);
        put64(&mut b, (1 << 48) - 1);
        // DMA avail cap at 72
        put16(&mut b, VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL);
        put16(&mut b, 1);
        put32(&mut b, 0);
        put32(&mut b, 65535);
        put32(&mut b, 0);
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b
    }

    #[test]
    fn type1_cap_chain_parses() {
        let b = type1_info_buffer();
        let caps = cap_chain(&b, 24).unwrap();
        assert_eq!(caps.len(), 2);
        assert_eq!(caps[0].id, VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE);
        assert_eq!(
            parse_iova_range_cap(&caps[0]).unwrap(),
            vec![(0, 0xfedf_ffff), (0xfef0_0000, (1 << 48) - 1)]
        );
        assert_eq!(caps[1].id, VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL);
        assert_eq!(parse_dma_avail_cap(&caps[1]).unwrap(), 65535);
        assert!(cap_chain(&b, 0).unwrap().is_empty());
    }

    #[test]
    fn malformed_chains_are_refused() {
        let mut b = type1_info_buffer();
        // Offset past the end.
        assert!(cap_chain(&b, 4096).is_err());
        // A loop: the second cap points back at the first.
        b[76..80].copy_from_slice(&24u32.to_ne_bytes());
        assert!(matches!(
            cap_chain(&b, 24),
            Err(VfioError::Malformed { .. })
        ));
        // Self loop.
        b[28..32].copy_from_slice(&24u32.to_ne_bytes());
        assert!(cap_chain(&b, 24).is_err());
        // A range list that claims more entries than fit.
        let mut b = type1_info_buffer();
        b[32..36].copy_from_slice(&9u32.to_ne_bytes());
        let caps = cap_chain(&b, 24).unwrap();
        assert!(parse_iova_range_cap(&caps[0]).is_err());
    }

    #[test]
    fn sparse_areas_parse_and_are_bounded() {
        let mut b = vec![0u8; 32]; // region info head
        put16(&mut b, VFIO_REGION_INFO_CAP_SPARSE_MMAP);
        put16(&mut b, 1);
        put32(&mut b, 0);
        put32(&mut b, 3);
        put32(&mut b, 0);
        put64(&mut b, 0);
        put64(&mut b, 0x2000);
        put64(&mut b, 0x3000);
        put64(&mut b, 0);
        put64(&mut b, 0x4000);
        put64(&mut b, 0xc000);
        let caps = cap_chain(&b, 32).unwrap();
        let areas = parse_sparse_mmap_cap(&caps[0], 0x10000).unwrap();
        assert_eq!(
            areas,
            vec![
                SparseArea {
                    offset: 0,
                    size: 0x2000
                },
                SparseArea {
                    offset: 0x4000,
                    size: 0xc000
                }
            ]
        );
        assert!(parse_sparse_mmap_cap(&caps[0], 0x8000).is_err());
    }

    #[test]
    fn irq_set_layout() {
        let b = irq_set_bytes(VFIO_PCI_MSIX_IRQ_INDEX, 3, &[7, -1]);
        assert_eq!(b.len(), 28);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 28);
        assert_eq!(u32::from_ne_bytes(b[4..8].try_into().unwrap()), 0x24);
        assert_eq!(u32::from_ne_bytes(b[8..12].try_into().unwrap()), 2);
        assert_eq!(u32::from_ne_bytes(b[12..16].try_into().unwrap()), 3);
        assert_eq!(u32::from_ne_bytes(b[16..20].try_into().unwrap()), 2);
        assert_eq!(i32::from_ne_bytes(b[24..28].try_into().unwrap()), -1);
    }

    #[test]
    fn ioctl_numbers_match_the_table() {
        // vfio-kernel.md §1.1-§1.3 codes.
        assert_eq!(VFIO_GET_API_VERSION, 0x3B64);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3B6A);
        assert_eq!(VFIO_DEVICE_RESET, 0x3B6F);
        assert_eq!(VFIO_IOMMU_GET_INFO, 0x3B70);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3B72);
        assert_eq!(VFIO_DEVICE_BIND_IOMMUFD, 0x3B76);
        assert_eq!(VFIO_DEVICE_DETACH_IOMMUFD_PT, 0x3B78);
        assert_eq!(IOMMU_IOAS_IOVA_RANGES, 0x3B84);
        assert_eq!(IOMMU_IOAS_UNMAP, 0x3B86);
        assert_eq!(IOMMU_IOAS_MAP_FILE, 0x3B8F);
        assert_eq!(VFIO_DEVICE_FEATURE, 0x3B75);
    }

    #[test]
    fn dma_buf_feature_bytes() {
        let r = [
            VfioRegionDmaRange {
                offset: 0x10_0000,
                length: 0x20_0000,
            },
            VfioRegionDmaRange {
                offset: 0x80_0000,
                length: 0x1000,
            },
        ];
        let w = dma_buf_feature(1, 0o2000002, &r).unwrap();
        let b: Vec<u8> = w.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        assert_eq!(b.len(), 8 + 16 + 32);
        assert_eq!(u32_at(0) as usize, b.len()); // argsz
        assert_eq!(u32_at(4), (1 << 16) | 11); // GET | DMA_BUF
        assert_eq!(u32_at(8), 1); // region_index
        assert_eq!(u32_at(12), 0o2000002); // O_RDWR | O_CLOEXEC
        assert_eq!(u32_at(16), 0); // flags
        assert_eq!(u32_at(20), 2); // nr_ranges
        assert_eq!((u64_at(24), u64_at(32)), (0x10_0000, 0x20_0000));
        assert_eq!((u64_at(40), u64_at(48)), (0x80_0000, 0x1000));
        assert!(dma_buf_feature(1, 0, &[]).is_err());
    }
}

//! vfio-user wire format (the protocol of QEMU's `docs/interop/vfio-user.rst`, version
//! 0.1): every message is a 16-byte header followed by a command-specific payload, all
//! little-endian; file descriptors travel as `SCM_RIGHTS` with the header. Only the
//! messages a client driving a PCI function needs are here. Safe code only: encoders
//! build byte vectors, decoders check lengths and return errors.

#![deny(unsafe_code)]

use super::VfioUserError;

/// Length of the message header.
pub const HEADER_LEN: usize = 16;

/// Command codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Command {
    /// Version and capability negotiation.
    Version = 1,
    /// Share a memory region with the server.
    DmaMap = 2,
    /// Stop sharing a memory region.
    DmaUnmap = 3,
    /// Device flags and region/IRQ counts.
    DeviceGetInfo = 4,
    /// One region's size, flags, capabilities and mmap fd.
    DeviceGetRegionInfo = 5,
    /// One interrupt index's vector count.
    GetIrqInfo = 7,
    /// Route interrupts to eventfds.
    SetIrqs = 8,
    /// Read from a region.
    RegionRead = 9,
    /// Write to a region.
    RegionWrite = 10,
    /// Function reset.
    DeviceReset = 13,
}

/// Header flag: message type "reply" (bits 0-3).
pub const FLAG_REPLY: u32 = 1;
/// Header flag: the reply reports an error (`error` holds an errno).
pub const FLAG_ERROR: u32 = 1 << 5;

/// `DEVICE_GET_INFO` flag: the device can be reset.
pub const DEVICE_FLAGS_RESET: u32 = 1 << 0;
/// `DEVICE_GET_INFO` flag: a PCI device.
pub const DEVICE_FLAGS_PCI: u32 = 1 << 1;
/// Region flag: the region may be mmapped.
pub const REGION_FLAG_MMAP: u32 = 1 << 2;
/// Region flag: capabilities follow the region info.
pub const REGION_FLAG_CAPS: u32 = 1 << 3;
/// Region capability id: sparse mmap areas.
pub const REGION_CAP_SPARSE_MMAP: u16 = 1;
/// DMA_MAP flags: readable and writable by the device.
pub const DMA_READ_WRITE: u32 = 0b11;
/// SET_IRQS flags: data is eventfds; action trigger.
pub const IRQ_SET_EVENTFD_TRIGGER: u32 = (1 << 2) | (1 << 5);
/// PCI region index of BAR0.
pub const BAR0_REGION: u32 = 0;
/// PCI region index of config space.
pub const CONFIG_REGION: u32 = 7;
/// PCI interrupt index of MSI-X.
pub const MSIX_IRQ_INDEX: u32 = 2;
/// Size of `vfio_region_info` (the region info payload without capabilities).
pub const REGION_INFO_LEN: usize = 32;

/// A message header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Message id; a reply carries its command's.
    pub id: u16,
    /// Command code.
    pub command: u16,
    /// Whole message size, header included.
    pub size: u32,
    /// Type and flag bits.
    pub flags: u32,
    /// errno of an error reply.
    pub error: u32,
}

impl Header {
    /// The 16 wire bytes.
    pub fn emit(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&self.id.to_le_bytes());
        b[2..4].copy_from_slice(&self.command.to_le_bytes());
        b[4..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.error.to_le_bytes());
        b
    }

    /// Parses 16 wire bytes.
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        Header {
            id: u16::from_le_bytes([b[0], b[1]]),
            command: u16::from_le_bytes([b[2], b[3]]),
            size: le32(b, 4),
            flags: le32(b, 8),
            error: le32(b, 12),
        }
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Little-endian payload builder.
#[derive(Default)]
pub struct Payload(pub Vec<u8>);

impl Payload {
    /// Appends a u16.
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u32.
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u64.
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends bytes.
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
}

/// The client's VERSION payload: 0.1 and a JSON capability object (NUL-terminated).
pub fn version_request() -> Vec<u8> {
    let caps = br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576}}"#;
    Payload::default().u16(0).u16(1).bytes(caps).bytes(&[0]).0
}

/// `DEVICE_GET_INFO` reply: (flags, regions, irqs).
pub fn parse_device_info(p: &[u8]) -> Result<(u32, u32, u32), VfioUserError> {
    need(p, 16, "DEVICE_GET_INFO")?;
    Ok((le32(p, 4), le32(p, 8), le32(p, 12)))
}

/// One region as the server describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionInfo {
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Size in bytes.
    pub size: u64,
    /// Offset of the region in the mmap fd.
    pub offset: u64,
    /// Sparse mmap areas `(offset, size)` within the region.
    pub sparse: Vec<(u64, u64)>,
}

/// `DEVICE_GET_REGION_INFO` request for `index`, with room for `cap_room` capability bytes.
pub fn region_info_request(index: u32, cap_room: u32) -> Vec<u8> {
    Payload::default()
        .u32(REGION_INFO_LEN as u32 + cap_room)
        .u32(0)
        .u32(index)
        .u32(0)
        .u64(0)
        .u64(0)
        .0
}

/// Parses a `DEVICE_GET_REGION_INFO` reply payload (region info, then capabilities whose
/// offsets count from the start of the region info).
pub fn parse_region_info(p: &[u8]) -> Result<RegionInfo, VfioUserError> {
    need(p, REGION_INFO_LEN, "DEVICE_GET_REGION_INFO")?;
    let mut r = RegionInfo {
        flags: le32(p, 4),
        size: le64(p, 16),
        offset: le64(p, 24),
        sparse: Vec::new(),
    };
    if r.flags & REGION_FLAG_CAPS == 0 {
        return Ok(r);
    }
    let mut next = le32(p, 12) as usize;
    let mut hops = 0;
    while next != 0 {
        hops += 1;
        if hops > 16 || next < REGION_INFO_LEN {
            return Err(VfioUserError::Protocol(
                "region capability chain is malformed",
            ));
        }
        need(&p[next.min(p.len())..], 8, "region capability header")?;
        let id = u16::from_le_bytes([p[next], p[next + 1]]);
        let following = le32(p, next + 4) as usize;
        if id == REGION_CAP_SPARSE_MMAP {
            need(&p[next..], 16, "sparse mmap capability")?;
            let n = le32(p, next + 8) as usize;
            let areas = next + 16;
            if n > 64 || p.len() < areas + 16 * n {
                return Err(VfioUserError::Protocol(
                    "sparse mmap areas do not fit the reply",
                ));
            }
            for i in 0..n {
                let a = areas + 16 * i;
                r.sparse.push((le64(p, a), le64(p, a + 8)));
            }
        }
        if following != 0 && following <= next {
            return Err(VfioUserError::Protocol("region capability chain loops"));
        }
        next = following;
    }
    Ok(r)
}

/// `GET_IRQ_INFO` request for `index`.
pub fn irq_info_request(index: u32) -> Vec<u8> {
    Payload::default().u32(16).u32(0).u32(index).u32(0).0
}

/// `GET_IRQ_INFO` reply: the vector count.
pub fn parse_irq_count(p: &[u8]) -> Result<u32, VfioUserError> {
    need(p, 16, "GET_IRQ_INFO")?;
    Ok(le32(p, 12))
}

/// `REGION_READ`/`REGION_WRITE` request header part: offset, region, count.
pub fn region_access(region: u32, offset: u64, count: u32) -> Payload {
    Payload::default().u64(offset).u32(region).u32(count)
}

/// Length of the `REGION_READ`/`REGION_WRITE` fields before the data.
pub const REGION_ACCESS_LEN: usize = 16;

/// `DMA_MAP`: `size` bytes of the attached file from `offset`, at device address `iova`.
pub fn dma_map(offset: u64, iova: u64, size: u64) -> Vec<u8> {
    Payload::default()
        .u32(32)
        .u32(DMA_READ_WRITE)
        .u64(offset)
        .u64(iova)
        .u64(size)
        .0
}

/// `DMA_UNMAP` of `[iova, iova + size)`.
pub fn dma_unmap(iova: u64, size: u64) -> Vec<u8> {
    Payload::default().u32(24).u32(0).u64(iova).u64(size).0
}

/// `SET_IRQS` of `count` vectors from `start` of `index` (eventfds attached: one per
/// vector to route them, none to disconnect them).
pub fn set_irqs(index: u32, start: u32, count: u32) -> Vec<u8> {
    Payload::default()
        .u32(20)
        .u32(IRQ_SET_EVENTFD_TRIGGER)
        .u32(index)
        .u32(start)
        .u32(count)
        .0
}

fn need(p: &[u8], n: usize, what: &'static str) -> Result<(), VfioUserError> {
    if p.len() < n {
        return Err(VfioUserError::Short {
            what,
            len: p.len(),
            need: n,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            id: 0x1234,
            command: Command::DmaMap as u16,
            size: 48,
            flags: FLAG_REPLY | FLAG_ERROR,
            error: 22,
        };
        let b = h.emit();
        assert_eq!(&b[..4], &[0x34, 0x12, 2, 0]);
        assert_eq!(Header::parse(&b), h);
    }

    #[test]
    fn region_info_with_sparse_areas() {
        let mut p = Payload::default()
            .u32(32 + 32)
            .u32(REGION_FLAG_MMAP | REGION_FLAG_CAPS | 3)
            .u32(0)
            .u32(32)
            .u64(1 << 25)
            .u64(0x1000)
            .0;
        p.extend(
            Payload::default()
                .u16(REGION_CAP_SPARSE_MMAP)
                .u16(1)
                .u32(0)
                .u32(1)
                .u32(0)
                .u64(0)
                .u64(1 << 25)
                .0,
        );
        let r = parse_region_info(&p).unwrap();
        assert_eq!(r.size, 1 << 25);
        assert_eq!(r.offset, 0x1000);
        assert_eq!(r.sparse, vec![(0, 1 << 25)]);
        // Truncated areas, a short reply and a looping chain are errors, not panics.
        assert!(parse_region_info(&p[..p.len() - 4]).is_err());
        assert!(parse_region_info(&p[..20]).is_err());
        let mut looped = p.clone();
        looped[32 + 4..32 + 8].copy_from_slice(&32u32.to_le_bytes());
        assert!(parse_region_info(&looped).is_err());
        let mut bad = p.clone();
        bad[12..16].copy_from_slice(&4000u32.to_le_bytes());
        assert!(parse_region_info(&bad).is_err());
    }

    #[test]
    fn fixed_payloads() {
        assert_eq!(dma_map(1, 2, 3).len(), 32);
        assert_eq!(dma_unmap(2, 3).len(), 24);
        assert_eq!(set_irqs(2, 0, 1).len(), 20);
        assert_eq!(region_info_request(0, 0).len(), REGION_INFO_LEN);
        assert_eq!(
            parse_device_info(&Payload::default().u32(16).u32(3).u32(9).u32(5).0).unwrap(),
            (3, 9, 5)
        );
        assert!(parse_irq_count(&[0; 8]).is_err());
        assert!(version_request().ends_with(b"}\0"));
    }
}

//! PCI config space of the model function (PCI Local Bus spec type 0 header, 4 KiB).
//!
//! Read-only identity (vendor 0x15b3, device 0x1017 ConnectX-5, class 0x020000), a 64-bit
//! prefetchable memory BAR0 with the standard sizing behaviour, a capability list holding
//! one MSI-X capability, and a command register whose memory-space and bus-master bits are
//! writable. Writes to read-only bytes are ignored, as on hardware; accesses outside the
//! 4 KiB space are errors.

/// Config space size.
pub const CONFIG_SIZE: usize = 4096;
/// Mellanox vendor id.
pub const VENDOR_ID: u16 = 0x15b3;
/// ConnectX-5 device id.
pub const DEVICE_ID: u16 = 0x1017;
/// Class code: network controller, Ethernet (0x020000).
pub const CLASS_CODE: u32 = 0x02_0000;
/// Command register offset.
pub const COMMAND: usize = 0x04;
/// Command: memory space enable.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command: bus master enable.
pub const COMMAND_MASTER: u16 = 1 << 2;
/// Command: INTx disable.
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// BAR0 offset (64-bit BAR: 0x10 low, 0x14 high).
pub const BAR0: usize = 0x10;
/// Offset of the MSI-X capability.
pub const MSIX_CAP: usize = 0x60;
/// MSI-X capability id.
pub const MSIX_CAP_ID: u8 = 0x11;
/// Capabilities pointer offset.
pub const CAP_PTR: usize = 0x34;
/// BAR0 flags: memory, 64-bit (type 0b10), prefetchable.
const BAR0_FLAGS: u32 = 0b1100;

/// The config space bytes plus the write masks of the writable fields.
pub(crate) struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE],
    bar0_len: u64,
}

impl ConfigSpace {
    /// A fresh config space for a function with a `bar0_len`-byte BAR0, `irqs` MSI-X
    /// vectors, and the MSI-X table/PBA at the given BAR0 offsets.
    pub(crate) fn new(bar0_len: u64, irqs: u32, msix_table: u32, msix_pba: u32) -> ConfigSpace {
        let mut c = ConfigSpace {
            bytes: [0; CONFIG_SIZE],
            bar0_len,
        };
        c.put16(0x00, VENDOR_ID);
        c.put16(0x02, DEVICE_ID);
        c.put16(0x06, 1 << 4); // status: capabilities list present
        c.bytes[0x08] = 0x00; // revision
        c.bytes[0x09] = CLASS_CODE as u8; // prog-if
        c.bytes[0x0a] = (CLASS_CODE >> 8) as u8; // subclass
        c.bytes[0x0b] = (CLASS_CODE >> 16) as u8; // class
        c.put32(BAR0, BAR0_FLAGS);
        c.put16(0x2c, VENDOR_ID); // subsystem vendor
        c.put16(0x2e, 0x0008); // subsystem id
        c.bytes[CAP_PTR] = MSIX_CAP as u8;
        // MSI-X: id, next = 0, message control (table size - 1), table and PBA in BAR0.
        c.bytes[MSIX_CAP] = MSIX_CAP_ID;
        c.bytes[MSIX_CAP + 1] = 0;
        c.put16(MSIX_CAP + 2, (irqs - 1) as u16);
        c.put32(MSIX_CAP + 4, msix_table); // BIR 0
        c.put32(MSIX_CAP + 8, msix_pba); // BIR 0
        c
    }

    fn put16(&mut self, off: usize, v: u16) {
        self.bytes[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put32(&mut self, off: usize, v: u32) {
        self.bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn get16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.bytes[off], self.bytes[off + 1]])
    }

    /// The command register.
    pub(crate) fn command(&self) -> u16 {
        self.get16(COMMAND)
    }

    /// Whether `[off, off + len)` is inside config space.
    pub(crate) fn in_range(off: u16, len: usize) -> bool {
        len > 0
            && (off as usize)
                .checked_add(len)
                .is_some_and(|e| e <= CONFIG_SIZE)
    }

    /// Reads `buf.len()` bytes at `off` (range checked by the caller).
    pub(crate) fn read(&self, off: u16, buf: &mut [u8]) {
        let off = off as usize;
        buf.copy_from_slice(&self.bytes[off..off + buf.len()]);
    }

    /// Writes `data` at `off` byte by byte through the per-byte write masks.
    pub(crate) fn write(&mut self, off: u16, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            let at = off as usize + i;
            let m = self.write_mask(at);
            self.bytes[at] = (self.bytes[at] & !m) | (b & m);
        }
    }

    /// Which bits of byte `at` software may write.
    fn write_mask(&self, at: usize) -> u8 {
        let cmd_mask = COMMAND_MEMORY | COMMAND_MASTER | COMMAND_INTX_DISABLE;
        let bar_lo_mask = !((self.bar0_len.min(1 << 32) - 1) as u32) & !0xF;
        let bar_hi_mask = if self.bar0_len > (1 << 32) {
            !(((self.bar0_len - 1) >> 32) as u32)
        } else {
            u32::MAX
        };
        match at {
            0x04 | 0x05 => (cmd_mask >> (8 * (at - 0x04))) as u8,
            0x10..=0x13 => (bar_lo_mask >> (8 * (at - 0x10))) as u8,
            0x14..=0x17 => (bar_hi_mask >> (8 * (at - 0x14))) as u8,
            0x3c => 0xFF, // interrupt line
            // MSI-X message control: enable (15) and function mask (14).
            x if x == MSIX_CAP + 3 => 0xC0,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_and_sizing() {
        let mut c = ConfigSpace::new(32 << 20, 32, 0x1f0_0000, 0x1f0_1000);
        let mut b = [0u8; 4];
        c.read(0, &mut b);
        assert_eq!(b, [0xb3, 0x15, 0x17, 0x10]);
        c.read(0x08, &mut b);
        assert_eq!(u32::from_le_bytes(b) >> 8, CLASS_CODE);
        // BAR sizing: write all-ones, read back the size mask with the flags.
        c.write(BAR0 as u16, &[0xff; 4]);
        c.read(BAR0 as u16, &mut b);
        assert_eq!(u32::from_le_bytes(b), !((32u32 << 20) - 1) | 0xC);
        // Vendor id is read-only.
        c.write(0, &[0, 0]);
        c.read(0, &mut b);
        assert_eq!(&b[..2], &[0xb3, 0x15]);
        // Command: only memory/master/intx-disable stick.
        c.write(COMMAND as u16, &[0xff, 0xff]);
        assert_eq!(
            c.command(),
            COMMAND_MEMORY | COMMAND_MASTER | COMMAND_INTX_DISABLE
        );
        assert!(!ConfigSpace::in_range(4095, 2));
        assert!(!ConfigSpace::in_range(0, 0));
        assert!(ConfigSpace::in_range(4092, 4));
        // MSI-X capability reachable from the capability pointer.
        let mut p = [0u8; 1];
        c.read(CAP_PTR as u16, &mut p);
        let mut cap = [0u8; 4];
        c.read(p[0] as u16, &mut cap);
        assert_eq!(cap[0], MSIX_CAP_ID);
        assert_eq!(u16::from_le_bytes([cap[2], cap[3]]) & 0x7ff, 31);
    }
}

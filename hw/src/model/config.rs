//! PCI config space of the model function (PCI Local Bus spec type 0 header, 4 KiB).
//!
//! Read-only identity (vendor 0x15b3, device 0x1017 ConnectX-5, class 0x020000), a 64-bit
//! prefetchable memory BAR0 with the standard sizing behaviour, a command register whose
//! memory-space, bus-master and INTx-disable bits are writable, and a capability list as a
//! ConnectX PF has one (firmware-behaviour.md §PCIe function):
//! - power management (0x40): D0 and D3hot, `No_Soft_Reset` set (D3hot to D0 keeps the
//!   function's state);
//! - PCI Express (0x60): an endpoint with Function Level Reset, an 8 GT/s x16 link; writing
//!   `Initiate FLR` resets the function (what vfio-pci does between two opens);
//! - MSI-X (0x9c), its table and PBA in BAR0;
//! - vendor-specific (0xc0): the gateway mlx5_core looks for (semaphore and counter; it
//!   offers no address space, so gateway reads are refused as unsupported).
//!
//! Writes to read-only bytes are ignored, as on hardware; accesses outside the 4 KiB space
//! are errors. Nothing follows at 0x100 (no extended capabilities).

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
/// Capabilities pointer offset.
pub const CAP_PTR: usize = 0x34;
/// Offset of the power management capability.
pub const PM_CAP: usize = 0x40;
/// Power management capability id.
pub const PM_CAP_ID: u8 = 0x01;
/// Offset of the PCI Express capability.
pub const PCIE_CAP: usize = 0x60;
/// PCI Express capability id.
pub const PCIE_CAP_ID: u8 = 0x10;
/// Offset of the MSI-X capability.
pub const MSIX_CAP: usize = 0x9c;
/// MSI-X capability id.
pub const MSIX_CAP_ID: u8 = 0x11;
/// Offset of the vendor-specific capability.
pub const VSC_CAP: usize = 0xc0;
/// Vendor-specific capability id.
pub const VSC_CAP_ID: u8 = 0x09;
/// Device Capabilities (PCIe cap + 4): Function Level Reset capable.
pub const DEVCAP_FLR: u32 = 1 << 28;
/// Device Control (PCIe cap + 8): Initiate Function Level Reset (reads 0).
pub const DEVCTL_BCR_FLR: u16 = 1 << 15;
/// BAR0 flags: memory, 64-bit (type 0b10), prefetchable.
const BAR0_FLAGS: u32 = 0b1100;
/// Device Control at reset: relaxed ordering, no snoop, 512-byte read requests.
const DEVCTL_DEFAULT: u16 = 0x2810;
/// Device Control bits software may write (error reporting, relaxed ordering, payload and
/// read request sizes, extended tags, phantom functions, aux power, no snoop).
const DEVCTL_WRITABLE: u16 = 0x7fff;
/// Link Capabilities / Status: 8 GT/s (3), x16.
const LINK_SPEED: u16 = 3;
const LINK_WIDTH: u16 = 16;
/// VSC registers (offsets in the capability; Linux `lib/pci_vsc.c`).
const VSC_CTRL: usize = 0x4;
const VSC_COUNTER: usize = 0x8;
const VSC_SEMAPHORE: usize = 0xc;
/// VSC capability length (through the data register).
const VSC_LEN: u8 = 0x18;

/// The config space bytes plus the write masks of the writable fields.
pub(crate) struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE],
    bar0_len: u64,
    /// The VSC gateway's counter: each read returns the next value, so two readers
    /// racing for the semaphore write different tickets.
    vsc_counter: u32,
}

impl ConfigSpace {
    /// A fresh config space for a function with a `bar0_len`-byte BAR0, `irqs` MSI-X
    /// vectors, and the MSI-X table/PBA at the given BAR0 offsets.
    pub(crate) fn new(bar0_len: u64, irqs: u32, msix_table: u32, msix_pba: u32) -> ConfigSpace {
        let mut c = ConfigSpace {
            bytes: [0; CONFIG_SIZE],
            bar0_len,
            vsc_counter: 1,
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
        c.bytes[CAP_PTR] = PM_CAP as u8;
        // Power management: version 3, D0/D3hot only; PMCSR No_Soft_Reset (bit 3).
        c.cap(PM_CAP, PM_CAP_ID, PCIE_CAP);
        c.put16(PM_CAP + 2, 0x0003);
        c.put16(PM_CAP + 4, 1 << 3);
        // PCI Express v2, endpoint.
        c.cap(PCIE_CAP, PCIE_CAP_ID, MSIX_CAP);
        c.put16(PCIE_CAP + 2, 0x0002);
        // DevCap: FLR, role-based error reporting, extended tags, 512-byte payloads.
        c.put32(PCIE_CAP + 4, DEVCAP_FLR | 1 << 15 | 1 << 5 | 2);
        c.put16(PCIE_CAP + 8, DEVCTL_DEFAULT);
        c.put32(PCIE_CAP + 0x0c, u32::from(LINK_WIDTH << 4 | LINK_SPEED));
        // LnkSta: negotiated speed and width, slot clock.
        c.put16(PCIE_CAP + 0x12, 1 << 12 | LINK_WIDTH << 4 | LINK_SPEED);
        // DevCap2: completion timeout ranges A-D, 32/64-bit AtomicOp completer.
        c.put32(PCIE_CAP + 0x24, 0xf | 1 << 7 | 1 << 8);
        // LnkCap2: 2.5, 5 and 8 GT/s; LnkCtl2: target 8 GT/s.
        c.put32(PCIE_CAP + 0x2c, 0b1110);
        c.put16(PCIE_CAP + 0x30, LINK_SPEED);
        // MSI-X: message control (table size - 1), table and PBA in BAR0 (BIR 0).
        c.cap(MSIX_CAP, MSIX_CAP_ID, VSC_CAP);
        c.put16(MSIX_CAP + 2, (irqs - 1) as u16);
        c.put32(MSIX_CAP + 4, msix_table);
        c.put32(MSIX_CAP + 8, msix_pba);
        // Vendor-specific: the capability length byte, then the gateway registers.
        c.cap(VSC_CAP, VSC_CAP_ID, 0);
        c.bytes[VSC_CAP + 2] = VSC_LEN;
        c
    }

    fn cap(&mut self, at: usize, id: u8, next: usize) {
        self.bytes[at] = id;
        self.bytes[at + 1] = next as u8;
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
    fn get32(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.bytes[off..off + 4].try_into().expect("4 bytes"))
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
    pub(crate) fn read(&mut self, off: u16, buf: &mut [u8]) {
        let off = off as usize;
        let counter = VSC_CAP + VSC_COUNTER;
        if off <= counter && counter < off + buf.len() {
            // Each read of the gateway counter hands out the next ticket.
            self.vsc_counter = self.vsc_counter.wrapping_add(1).max(1);
            let v = self.vsc_counter;
            self.put32(counter, v);
        }
        buf.copy_from_slice(&self.bytes[off..off + buf.len()]);
    }

    /// Writes `data` at `off` byte by byte through the per-byte write masks. Returns true
    /// when the write initiated a Function Level Reset: the caller resets the function
    /// ([`flr`](Self::flr) for config space).
    pub(crate) fn write(&mut self, off: u16, data: &[u8]) -> bool {
        let sem = VSC_CAP + VSC_SEMAPHORE;
        let devctl = PCIE_CAP + 8;
        let start = off as usize;
        let mut flr = false;
        // The gateway semaphore: a ticket is taken only while it is free (0); 0 frees it.
        if start == sem && data.len() == 4 {
            let v = u32::from_le_bytes(data.try_into().expect("4 bytes"));
            if v == 0 || self.get32(sem) == 0 {
                self.put32(sem, v);
            }
            return false;
        }
        for (i, &b) in data.iter().enumerate() {
            let at = start + i;
            if at == devctl + 1 && b & (DEVCTL_BCR_FLR >> 8) as u8 != 0 {
                flr = true;
            }
            let m = self.write_mask(at);
            self.bytes[at] = (self.bytes[at] & !m) | (b & m);
        }
        flr
    }

    /// What a Function Level Reset does to config space (PCIe base spec §6.6.2): the
    /// command register (no memory decoding, no bus mastering), Device Control, MSI-X
    /// enable and mask, the power state and the VSC semaphore go back to their reset
    /// values; identity, BAR addresses and the capability structure stay.
    pub(crate) fn flr(&mut self) {
        self.put16(COMMAND, 0);
        self.put16(PCIE_CAP + 8, DEVCTL_DEFAULT);
        self.put16(PCIE_CAP + 0x10, 0); // LnkCtl
        self.put16(PCIE_CAP + 0x28, 0); // DevCtl2
        let mc = self.get16(MSIX_CAP + 2) & 0x07ff;
        self.put16(MSIX_CAP + 2, mc);
        self.put16(PM_CAP + 4, 1 << 3);
        self.put32(VSC_CAP + VSC_SEMAPHORE, 0);
        self.put32(VSC_CAP + VSC_CTRL, 0);
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
        let byte = |v: u32, base: usize| (v >> (8 * (at - base))) as u8;
        match at {
            0x04 | 0x05 => byte(cmd_mask.into(), 0x04),
            0x10..=0x13 => byte(bar_lo_mask, 0x10),
            0x14..=0x17 => byte(bar_hi_mask, 0x14),
            0x3c => 0xFF, // interrupt line
            // PMCSR: PowerState (D0 = 0, D3hot = 3; D1/D2 are not supported).
            x if x == PM_CAP + 4 => 0x03,
            // Device Control (Initiate FLR is a command, never stored).
            x if x == PCIE_CAP + 8 || x == PCIE_CAP + 9 => {
                byte(DEVCTL_WRITABLE.into(), PCIE_CAP + 8)
            }
            // Link Control: ASPM, RCB, common clock, extended sync.
            x if x == PCIE_CAP + 0x10 => 0xcb,
            // Device Control 2: completion timeout, ARI, AtomicOp requester, IDO, LTR.
            x if x == PCIE_CAP + 0x28 => 0xff,
            x if x == PCIE_CAP + 0x29 => 0x07,
            // Link Control 2: target link speed.
            x if x == PCIE_CAP + 0x30 => 0x0f,
            // MSI-X message control: enable (15) and function mask (14).
            x if x == MSIX_CAP + 3 => 0xC0,
            // VSC control (address space select) and address / data.
            x if (VSC_CAP + VSC_CTRL..VSC_CAP + VSC_CTRL + 2).contains(&x) => 0xff,
            x if (VSC_CAP + 0x10..VSC_CAP + 0x18).contains(&x) => 0xff,
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
        // The capability chain from the pointer: PM, PCI Express, MSI-X, vendor-specific.
        let mut ids = Vec::new();
        let mut p = [0u8; 1];
        c.read(CAP_PTR as u16, &mut p);
        let mut at = p[0];
        while at != 0 {
            let mut cap = [0u8; 4];
            c.read(at.into(), &mut cap);
            ids.push((at as usize, cap[0]));
            if cap[0] == MSIX_CAP_ID {
                assert_eq!(u16::from_le_bytes([cap[2], cap[3]]) & 0x7ff, 31);
            }
            at = cap[1];
        }
        assert_eq!(
            ids,
            vec![
                (PM_CAP, PM_CAP_ID),
                (PCIE_CAP, PCIE_CAP_ID),
                (MSIX_CAP, MSIX_CAP_ID),
                (VSC_CAP, VSC_CAP_ID)
            ]
        );
    }

    fn r32(c: &mut ConfigSpace, off: usize) -> u32 {
        let mut b = [0u8; 4];
        c.read(off as u16, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn initiate_flr_is_reported_and_resets_what_an_flr_resets() {
        let mut c = ConfigSpace::new(32 << 20, 32, 0x2800, 0x2c00);
        assert_ne!(r32(&mut c, PCIE_CAP + 4) & DEVCAP_FLR, 0, "FLR capable");
        c.write(
            COMMAND as u16,
            &(COMMAND_MEMORY | COMMAND_MASTER).to_le_bytes(),
        );
        c.write((MSIX_CAP + 2) as u16, &0x801fu16.to_le_bytes()); // MSI-X enable
        c.write(BAR0 as u16, &0xfe00_0000u32.to_le_bytes());
        // An ordinary Device Control write is no reset and keeps its bits.
        assert!(!c.write((PCIE_CAP + 8) as u16, &0x2830u16.to_le_bytes()));
        assert_eq!(r32(&mut c, PCIE_CAP + 8) & 0xffff, 0x2830);
        // Linux pcie_flr: read-modify-write of Device Control with BCR_FLR.
        let flr = c.write(
            (PCIE_CAP + 8) as u16,
            &(0x2830 | DEVCTL_BCR_FLR).to_le_bytes(),
        );
        assert!(flr);
        c.flr();
        assert_eq!(c.command(), 0, "bus mastering and decoding off");
        assert_eq!(
            r32(&mut c, PCIE_CAP + 8) & 0xffff,
            u32::from(DEVCTL_DEFAULT)
        );
        assert_eq!(r32(&mut c, MSIX_CAP) >> 16, 31, "MSI-X disabled, size kept");
        assert_eq!(r32(&mut c, BAR0), 0xfe00_000c, "BAR address kept");
    }

    #[test]
    fn power_state_takes_d0_and_d3hot_and_keeps_no_soft_reset() {
        let mut c = ConfigSpace::new(32 << 20, 32, 0x2800, 0x2c00);
        c.write((PM_CAP + 4) as u16, &[3, 0]);
        assert_eq!(r32(&mut c, PM_CAP + 4) & 0xf, 0b1011);
        c.write((PM_CAP + 4) as u16, &[0, 0]);
        assert_eq!(r32(&mut c, PM_CAP + 4) & 0xf, 0b1000);
        // Link status: 8 GT/s x16.
        assert_eq!(r32(&mut c, PCIE_CAP + 0x10) >> 16 & 0x3ff, 16 << 4 | 3);
    }

    #[test]
    fn vsc_semaphore_is_taken_with_a_counter_ticket_and_freed_with_zero() {
        let mut c = ConfigSpace::new(32 << 20, 32, 0x2800, 0x2c00);
        let sem = VSC_CAP + VSC_SEMAPHORE;
        // Linux mlx5_vsc_gw_lock: semaphore free, read the counter, write it, read back.
        assert_eq!(r32(&mut c, sem), 0);
        let t1 = r32(&mut c, VSC_CAP + VSC_COUNTER);
        c.write(sem as u16, &t1.to_le_bytes());
        assert_eq!(r32(&mut c, sem), t1);
        // A second taker's ticket does not replace the holder's.
        let t2 = r32(&mut c, VSC_CAP + VSC_COUNTER);
        assert_ne!(t1, t2);
        c.write(sem as u16, &t2.to_le_bytes());
        assert_eq!(r32(&mut c, sem), t1);
        c.write(sem as u16, &0u32.to_le_bytes());
        assert_eq!(r32(&mut c, sem), 0);
        // No address space is supported: the status bits stay 0 after a space select.
        c.write((VSC_CAP + VSC_CTRL) as u16, &2u32.to_le_bytes());
        assert_eq!(r32(&mut c, VSC_CAP + VSC_CTRL) >> 29, 0);
    }
}

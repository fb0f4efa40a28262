//! Send WQE building (prm-subset.md §9.5): a cursor over a 64-byte aligned stack buffer with
//! one method per segment, copied into the send ring once it is complete.
//!
//! This is the general path (several SGEs, inline data, READ, atomics). The common
//! one-SGE WRITE/SEND skips the buffer and writes its three segments straight into the
//! ring as 8-byte words (`SendRing::post_one_sge` in `sq`).
//! Both use the shared layouts of `uhca_layout::wqe`: the setters here, the
//! `wqe::fast` word positions (derived from the same tables) there.

use uhca_layout::BufMut;
use uhca_layout::ud::{DATAGRAM_SEG, DatagramSeg};
use uhca_layout::wqe::{
    AtomicSeg, CtrlSeg, DS_UNIT, DataSeg, INLINE_SEG, RaddrSeg, SEND_WQE_BB, WqeOpcode,
};

/// The largest send WQE this driver builds: 4 basic blocks (256 bytes, `ds` = 16).
pub const MAX_WQE_BYTES: usize = 4 * SEND_WQE_BB;
/// Most inline bytes a WRITE can carry (ctrl + raddr + inline header take 36 bytes).
pub const MAX_INLINE: usize = MAX_WQE_BYTES - 2 * DS_UNIT - 4;
/// Most data segments in one send WQE (an RDMA WRITE/READ: ctrl + raddr + 14).
pub const MAX_SEND_SGES: usize = MAX_WQE_BYTES / DS_UNIT - 2;

/// A local scatter/gather element: `len` bytes at `addr` of the memory key `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Address in the MKey's address space (`Mr::addr() + offset`).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key.
    pub lkey: u32,
}

/// A remote buffer: address in the peer's MKey space and its rkey.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Remote {
    /// Remote address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// Why a work request was not posted. Nothing was written to the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The queue has no room: poll completions first (a signaled WQE frees the ones before it).
    #[error("queue full")]
    QueueFull,
    /// More scatter/gather elements than the queue was created for (or a WQE holds).
    #[error("too many scatter/gather elements")]
    TooManySges,
    /// More inline data than the queue's `max_inline` (or a WQE holds).
    #[error("inline data too long")]
    InlineTooLong,
    /// An atomic needs exactly one 8-byte local element, 8-byte aligned remote address.
    #[error("atomic operands must be 8 bytes, 8-byte aligned")]
    BadAtomic,
    /// The QP is not in a state that accepts this queue's work requests (RST, or RTR for sends).
    #[error("QP state does not accept work requests")]
    BadState,
    /// The device is lost ([`Device::is_lost`](crate::Device::is_lost)): nothing is posted.
    #[error("device lost")]
    DeviceLost,
    /// A datagram longer than the UD QP's path MTU (one packet carries a UD message,
    /// IBA Vol. 1 §9.8.2; docs/spec/mlx5-ib-objects.md §4).
    #[error("datagram of {len} bytes is longer than the path MTU ({mtu} bytes)")]
    MessageTooLong {
        /// Bytes asked for.
        len: u64,
        /// The QP's path MTU in bytes.
        mtu: u32,
    },
}

/// A send WQE being built in a stack buffer (a cursor: each segment goes after the last).
#[repr(C, align(64))]
pub struct WqeBuf {
    bytes: [u8; MAX_WQE_BYTES],
    len: usize,
    /// Bytes the device reads (`ds` × 16), set by `finish`.
    used: usize,
}

impl Default for WqeBuf {
    fn default() -> Self {
        WqeBuf {
            bytes: [0; MAX_WQE_BYTES],
            len: 0,
            used: 0,
        }
    }
}

impl std::fmt::Debug for WqeBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WqeBuf({:02x?})", self.as_bytes())
    }
}

impl WqeBuf {
    /// Starts a WQE with its control segment (§9.5): `wqe_index` is the producer counter in
    /// WQEBBs (mod 2^16), `fm_ce_se` the fence/completion/solicited bits, `imm` the immediate
    /// (written big-endian, as the PRM carries it). `ds` is set by [`finish`](Self::finish).
    #[inline(always)]
    pub fn ctrl(&mut self, opcode: WqeOpcode, wqe_index: u16, qpn: u32, fm_ce_se: u8, imm: u32) {
        // Zero the first basic block at once (fixed size: a few vector stores), so the
        // field setters and `finish` need no further clearing for one-block WQEs.
        self.bytes[..SEND_WQE_BB].copy_from_slice(&[0; SEND_WQE_BB]);
        let mut c = CtrlSeg::new_unchecked(&mut self.bytes[..DS_UNIT]);
        c.set_opcode(u8::from(opcode).into());
        c.set_wqe_index(wqe_index.into());
        c.set_qpn(qpn & 0xFF_FFFF);
        c.set_fm_ce_se(fm_ce_se.into());
        c.set_imm(imm);
        self.len = DS_UNIT;
    }

    #[inline(always)]
    fn seg(&mut self, n: usize) -> &mut [u8] {
        let s = &mut self.bytes[self.len..self.len + n];
        self.len += n;
        s
    }

    /// Appends a remote address segment.
    #[inline(always)]
    pub fn raddr(&mut self, r: Remote) {
        let mut s = RaddrSeg::new_unchecked(self.seg(DS_UNIT));
        s.set_raddr(r.addr);
        s.set_rkey(r.rkey);
        s.buf_mut().write_be32(12, 0);
    }

    /// Appends the datagram segment of a UD send (`mlx5_wqe_datagram_seg`, 48 bytes,
    /// `uhca_layout::ud`): the address handle's address vector `av`, with the remote
    /// QPN and Q_Key of this work request written into it.
    #[inline(always)]
    pub fn datagram(&mut self, av: &[u8; DATAGRAM_SEG], remote_qpn: u32, qkey: u32) {
        let s = self.seg(DATAGRAM_SEG);
        s.copy_from_slice(av);
        let mut d = DatagramSeg::new_unchecked(s);
        d.set_qkey(qkey);
        // `MLX5_EXTENDED_UD_AV`: the 48-byte address vector (rdma-core and Linux set it
        // on every UD send, `set_datagram_seg`).
        d.set_ext(1);
        d.set_dqp_dct(remote_qpn & 0xFF_FFFF);
    }

    /// Appends an atomic segment (`swap_add`, `compare`).
    #[inline(always)]
    pub fn atomic(&mut self, swap_add: u64, compare: u64) {
        let mut s = AtomicSeg::new_unchecked(self.seg(DS_UNIT));
        s.set_swap_add(swap_add);
        s.set_compare(compare);
    }

    /// Appends data segments; zero-length elements are skipped, as rdma-core does (§9.5).
    #[inline(always)]
    pub fn data(&mut self, sges: &[Sge]) -> Result<(), PostError> {
        for sge in sges.iter().filter(|s| s.len != 0) {
            if self.len + DS_UNIT > MAX_WQE_BYTES {
                return Err(PostError::TooManySges);
            }
            let mut s = DataSeg::new_unchecked(self.seg(DS_UNIT));
            s.set_byte_count(sge.len);
            s.set_lkey(sge.lkey);
            s.set_addr(sge.addr);
        }
        Ok(())
    }

    /// Appends an inline data segment: `byte_count | INLINE_SEG`, the data, zero padding to
    /// 16 bytes (§9.5).
    #[inline(always)]
    pub fn inline(&mut self, data: &[u8]) -> Result<(), PostError> {
        let padded = (4 + data.len()).next_multiple_of(DS_UNIT);
        if self.len + padded > MAX_WQE_BYTES {
            return Err(PostError::InlineTooLong);
        }
        let s = self.seg(padded);
        s.write_be32(0, data.len() as u32 | INLINE_SEG);
        s[4..4 + data.len()].copy_from_slice(data);
        s[4 + data.len()..].fill(0);
        Ok(())
    }

    /// Sets `ds` and zero-pads to the end of the last basic block. Returns the WQE size in
    /// basic blocks.
    #[inline(always)]
    pub fn finish(&mut self) -> usize {
        let ds = self.len / DS_UNIT;
        CtrlSeg::new_unchecked(&mut self.bytes[..DS_UNIT]).set_ds(ds as u32);
        self.used = self.len;
        let end = self.len.next_multiple_of(SEND_WQE_BB);
        if end > SEND_WQE_BB {
            // The first block was zeroed by `ctrl`; clear the tail of a later last block.
            self.bytes[self.len..end].fill(0);
        }
        self.len = end;
        end / SEND_WQE_BB
    }

    /// The bytes built so far (whole basic blocks after [`finish`](Self::finish)).
    #[inline(always)]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The bytes the device reads (`ds` × 16, a multiple of 16) after
    /// [`finish`](Self::finish); the rest of the last basic block is padding.
    #[inline(always)]
    pub fn used_bytes(&self) -> &[u8] {
        &self.bytes[..self.used]
    }

    /// The first 8 bytes of the control segment as they sit in memory: the doorbell value
    /// (§9.2 step 3).
    #[inline(always)]
    pub fn doorbell_bytes(&self) -> [u8; 8] {
        self.bytes[..8].try_into().expect("8 bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uhca_layout::wqe::fm_ce_se;

    #[test]
    fn rdma_write_golden_bytes() {
        let mut w = WqeBuf::default();
        w.ctrl(
            WqeOpcode::RdmaWrite,
            0x1234,
            0xAB_CDEF,
            fm_ce_se::CQ_UPDATE,
            0,
        );
        w.raddr(Remote {
            addr: 0x1122_3344_5566_7788,
            rkey: 0xDEAD_BEEF,
        });
        w.data(&[Sge {
            addr: 0x0102_0304_0506_0708,
            len: 0x40,
            lkey: 0x55,
        }])
        .unwrap();
        assert_eq!(w.finish(), 1);
        #[rustfmt::skip]
        let want: [u8; 64] = [
            // ctrl: opmod 0, index 0x1234, opcode 0x08 | qpn 0xabcdef, ds 3 | sig, rsvd, fm_ce_se | imm
            0x00, 0x12, 0x34, 0x08, 0xab, 0xcd, 0xef, 0x03, 0, 0, 0, 0x08, 0, 0, 0, 0,
            // raddr
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0,
            // data: byte_count, lkey, addr
            0, 0, 0, 0x40, 0, 0, 0, 0x55, 1, 2, 3, 4, 5, 6, 7, 8,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(w.as_bytes(), &want[..]);
        assert_eq!(w.doorbell_bytes(), want[..8]);
    }

    #[test]
    fn send_imm_and_inline_golden_bytes() {
        let mut w = WqeBuf::default();
        w.ctrl(WqeOpcode::SendImm, 7, 5, fm_ce_se::SOLICITED, 0xA1B2_C3D4);
        w.inline(b"hello").unwrap();
        assert_eq!(w.finish(), 1);
        let b = w.as_bytes();
        assert_eq!(
            &b[..16],
            &[
                0, 0, 7, 0x0B, 0, 0, 5, 2, 0, 0, 0, 2, 0xA1, 0xB2, 0xC3, 0xD4
            ]
        );
        assert_eq!(&b[16..32], b"\x80\0\0\x05hello\0\0\0\0\0\0\0");
        assert!(b[32..].iter().all(|&x| x == 0));
    }

    #[test]
    fn atomic_golden_bytes_and_multi_block_inline() {
        let mut w = WqeBuf::default();
        w.ctrl(
            WqeOpcode::AtomicCs,
            0xFFFF,
            1,
            fm_ce_se::CQ_UPDATE | fm_ce_se::FENCE,
            0,
        );
        w.raddr(Remote {
            addr: 0x1000,
            rkey: 2,
        });
        w.atomic(0x0A0B, 0x0C0D);
        w.data(&[Sge {
            addr: 0x2000,
            len: 8,
            lkey: 3,
        }])
        .unwrap();
        assert_eq!(w.finish(), 1);
        let b = w.as_bytes();
        assert_eq!(&b[..8], &[0, 0xFF, 0xFF, 0x11, 0, 0, 1, 4]);
        assert_eq!(b[11], 0x48);
        assert_eq!(
            &b[32..48],
            &[0, 0, 0, 0, 0, 0, 0x0A, 0x0B, 0, 0, 0, 0, 0, 0, 0x0C, 0x0D]
        );

        let mut w = WqeBuf::default();
        w.ctrl(WqeOpcode::RdmaWrite, 0, 1, 0, 0);
        w.raddr(Remote::default());
        let data: Vec<u8> = (0..MAX_INLINE as u8).collect();
        w.inline(&data).unwrap();
        assert_eq!(w.finish(), 4);
        assert_eq!(w.as_bytes()[7] & 0x3F, 16);
        assert_eq!(&w.as_bytes()[36..36 + MAX_INLINE], &data[..]);
    }

    #[test]
    fn ud_send_golden_bytes() {
        let mut av = [0u8; DATAGRAM_SEG];
        av[0x14..0x1a].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        av[0x20..0x30].copy_from_slice(&[0x77; 16]);
        let mut w = WqeBuf::default();
        w.ctrl(
            WqeOpcode::SendImm,
            3,
            0x12,
            fm_ce_se::CQ_UPDATE,
            0x0A0B_0C0D,
        );
        w.datagram(&av, 0xAB_CDEF, 0x8001_0000);
        w.data(&[Sge {
            addr: 0x1000,
            len: 256,
            lkey: 9,
        }])
        .unwrap();
        assert_eq!(w.finish(), 2, "80 bytes: two basic blocks");
        let b = w.as_bytes();
        // ctrl: index 3, SEND_IMM (0x0b), QPN 0x12, ds 5 (ctrl + 3 datagram + 1 data).
        assert_eq!(&b[..8], &[0, 0, 3, 0x0B, 0, 0, 0x12, 5]);
        assert_eq!(&b[12..16], &[0x0A, 0x0B, 0x0C, 0x0D]);
        // datagram: qkey, then dqp_dct with MLX5_EXTENDED_UD_AV (bit 31), the rest the AV.
        assert_eq!(&b[16..20], &[0x80, 0x01, 0, 0]);
        assert_eq!(&b[24..28], &[0x80, 0xAB, 0xCD, 0xEF]);
        assert_eq!(&b[16 + 0x14..16 + 0x1a], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(&b[16 + 0x20..16 + 0x30], &[0x77; 16]);
        // data segment at 64.
        assert_eq!(&b[64..72], &[0, 0, 1, 0, 0, 0, 0, 9]);
        assert_eq!(w.used_bytes().len(), 80);
    }

    #[test]
    fn limits_are_errors_and_empty_sges_are_skipped() {
        let mut w = WqeBuf::default();
        w.ctrl(WqeOpcode::RdmaWrite, 0, 1, 0, 0);
        w.raddr(Remote::default());
        assert_eq!(
            w.inline(&[0; MAX_INLINE + 1]),
            Err(PostError::InlineTooLong)
        );
        let mut w = WqeBuf::default();
        w.ctrl(WqeOpcode::Send, 0, 1, 0, 0);
        let sge = Sge {
            addr: 1,
            len: 1,
            lkey: 1,
        };
        assert_eq!(
            w.data(&[sge; MAX_SEND_SGES + 2]),
            Err(PostError::TooManySges)
        );
        let mut w = WqeBuf::default();
        w.ctrl(WqeOpcode::Send, 0, 1, 0, 0);
        w.data(&[Sge::default(), sge]).unwrap();
        w.finish();
        assert_eq!(w.as_bytes()[7], 2);
    }
}

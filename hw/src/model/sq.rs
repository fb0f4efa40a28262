//! Send WQEs (prm-subset.md §9.2, §9.5): reading a WQE from the SQ ring (it may wrap) and
//! decoding it straight into the RC engine's send-queue entry ([`SendSlot`]): only the
//! inline bytes and SGEs the WQE holds are copied, nothing is cleared or moved.
//!
//! The work request's `wr_id` carries what the CQE needs back: the WQE index (low 16 bits
//! of the WQEBB counter at the WQE's start) and the WQE opcode ([`wr_id`]).

use crate::layout::wqe::{
    AtomicSeg, CtrlSeg, DS_UNIT, DataSeg, INLINE_SEG, RaddrSeg, SEND_WQE_BB, WqeOpcode, fm_ce_se,
    inline_ds,
};
#[cfg(test)]
use crate::rc::LocalRef;
use crate::rc::{RcPostError, RcSge, RemoteAddr, SendSlot, WrOp};

/// Largest WQE: 63 16-byte units (the `ds` field is 6 bits).
pub(crate) const MAX_WQE: usize = 63 * DS_UNIT;

/// `wr_id` of the WQE at index `idx` with opcode `opcode`.
pub(crate) const fn wr_id(idx: u16, opcode: u8) -> u64 {
    (idx as u64) | ((opcode as u64) << 16)
}

/// The WQE index and opcode packed by [`wr_id`].
pub(crate) const fn unpack_wr_id(id: u64) -> (u16, u8) {
    (id as u16, (id >> 16) as u8)
}

/// Why a WQE cannot be executed now (reported as a LOCAL_QP_OP or LOCAL_LENGTH error CQE,
/// or retried).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeError {
    /// Unknown or unsupported opcode, a `ds` too small for it, a bad segment, data the
    /// opcode cannot take.
    QpOp,
    /// Inline data beyond the model's limit, a bad atomic or message length.
    Length,
    /// The engine's send queue is full: not an error, the WQE is taken on a later pass.
    QueueFull,
    /// The QP has no engine to run it: it completes as flushed.
    NoEngine,
}

/// The engine's refusals of a decoded WQE.
impl From<RcPostError> for WqeError {
    fn from(e: RcPostError) -> Self {
        match e {
            RcPostError::QueueFull => WqeError::QueueFull,
            RcPostError::BadAtomicLength { .. }
            | RcPostError::TooLong { .. }
            | RcPostError::InlineTooLong { .. } => WqeError::Length,
            RcPostError::InlineNotAllowed
            | RcPostError::MixedLocalData
            | RcPostError::TooManySges { .. } => WqeError::QpOp,
        }
    }
}

/// What the control segment says about a WQE.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctrl {
    pub(crate) opcode: u8,
    pub(crate) qpn: u32,
    pub(crate) ds: usize,
    pub(crate) fm_ce_se: u8,
    pub(crate) imm: u32,
}

impl Ctrl {
    /// Reads the control segment (the first 16 bytes of a WQE).
    pub(crate) fn parse(b: &[u8]) -> Ctrl {
        let c = CtrlSeg::new_unchecked(b);
        Ctrl {
            opcode: c.opcode() as u8,
            qpn: c.qpn(),
            ds: c.ds() as usize,
            fm_ce_se: c.fm_ce_se() as u8,
            imm: c.imm(),
        }
    }

    /// WQEBBs the WQE occupies (at least 1).
    pub(crate) fn wqebbs(&self) -> u32 {
        (self.ds * DS_UNIT).div_ceil(SEND_WQE_BB).max(1) as u32
    }

    /// Completion mode asks for a CQE on success (modes 2 and 3, §9.5).
    pub(crate) fn signaled(&self) -> bool {
        self.fm_ce_se & fm_ce_se::CQ_UPDATE != 0
    }
}

/// Decodes the WQE in `w` (`ctrl.ds` 16-byte units) into `slot` (an empty engine send-queue
/// entry) with `wr_id` `id`. On error the slot holds part of the WQE and must not be posted.
pub(crate) fn decode_into(
    w: &[u8],
    ctrl: &Ctrl,
    id: u64,
    slot: &mut SendSlot,
) -> Result<(), WqeError> {
    let op = WqeOpcode::from(ctrl.opcode);
    let end = ctrl.ds * DS_UNIT;
    if ctrl.ds == 0 || end > w.len() {
        return Err(WqeError::QpOp);
    }
    let mut at = DS_UNIT;
    let mut raddr = || -> Result<RemoteAddr, WqeError> {
        if at + DS_UNIT > end {
            return Err(WqeError::QpOp);
        }
        let r = RaddrSeg::new_unchecked(&w[at..at + DS_UNIT]);
        at += DS_UNIT;
        Ok(RemoteAddr {
            addr: r.raddr(),
            rkey: r.rkey(),
        })
    };
    let wr_op = match op {
        WqeOpcode::Send => WrOp::Send,
        WqeOpcode::SendImm => WrOp::SendImm { imm: ctrl.imm },
        WqeOpcode::RdmaWrite => WrOp::Write { remote: raddr()? },
        WqeOpcode::RdmaWriteImm => WrOp::WriteImm {
            remote: raddr()?,
            imm: ctrl.imm,
        },
        WqeOpcode::RdmaRead => WrOp::Read { remote: raddr()? },
        WqeOpcode::AtomicCs | WqeOpcode::AtomicFa => {
            let remote = raddr()?;
            if at + DS_UNIT > end {
                return Err(WqeError::QpOp);
            }
            let a = AtomicSeg::new_unchecked(&w[at..at + DS_UNIT]);
            at += DS_UNIT;
            if op == WqeOpcode::AtomicCs {
                WrOp::CompareSwap {
                    remote,
                    compare: a.compare(),
                    swap: a.swap_add(),
                }
            } else {
                WrOp::FetchAdd {
                    remote,
                    add: a.swap_add(),
                }
            }
        }
        _ => return Err(WqeError::QpOp),
    };
    slot.wr_id = id;
    slot.op = wr_op;
    slot.signaled = ctrl.signaled();
    slot.solicited = ctrl.fm_ce_se & fm_ce_se::SOLICITED != 0;
    // Fence modes 2 (fence), 3 (strong ordering) and 4 (small and fence) wait for
    // earlier READs and atomics; mode 1 (initiator small fence) is for UMR (§9.5).
    slot.fence = (ctrl.fm_ce_se & fm_ce_se::FENCE_MASK) >> 5 >= 2;
    local_data(&w[at..end], slot)
}

/// The data segments of a WQE into `slot`: a list of SGEs, or inline segments
/// (concatenated).
pub(crate) fn local_data(segs: &[u8], slot: &mut SendSlot) -> Result<(), WqeError> {
    let mut at = 0;
    while let Some(&head) = segs.get(at..).and_then(|r| r.first_chunk::<4>()) {
        let head = u32::from_be_bytes(head);
        if head & INLINE_SEG != 0 {
            let n = (head & !INLINE_SEG) as usize;
            let data = segs.get(at + 4..at + 4 + n).ok_or(WqeError::QpOp)?;
            if n != 0 {
                slot.push_inline(data).map_err(|_| WqeError::Length)?;
            }
            at += inline_ds(n) * DS_UNIT;
            continue;
        }
        if at + DS_UNIT > segs.len() {
            return Err(WqeError::QpOp);
        }
        let d = DataSeg::new_unchecked(&segs[at..at + DS_UNIT]);
        at += DS_UNIT;
        if d.byte_count() == 0 {
            continue; // zero-length entries move nothing
        }
        slot.push_sge(RcSge {
            lkey: d.lkey(),
            addr: d.addr(),
            len: d.byte_count(),
        })
        .map_err(|_| WqeError::QpOp)?;
    }
    if slot.is_mixed() {
        // Inline data and pointers in one WQE: not something a driver builds.
        return Err(WqeError::QpOp);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::BufMut;

    fn ctrl(op: WqeOpcode, ds: usize) -> Ctrl {
        Ctrl {
            opcode: op.into(),
            qpn: 5,
            ds,
            fm_ce_se: fm_ce_se::CQ_UPDATE,
            imm: 0x1234_5678,
        }
    }

    fn decode(w: &[u8], ctrl: &Ctrl, id: u64) -> Result<SendSlot, WqeError> {
        let mut slot = SendSlot::new();
        decode_into(w, ctrl, id, &mut slot).map(|()| slot)
    }

    #[test]
    fn write_with_two_sges_decodes() {
        let mut w = [0u8; 64];
        {
            let mut r = RaddrSeg::new_unchecked(&mut w[16..32]);
            r.set_raddr(0x1000);
            r.set_rkey(0x77);
        }
        for (k, len) in [(2usize, 10u32), (3, 20)] {
            let mut d = DataSeg::new_unchecked(&mut w[16 * k..16 * k + 16]);
            d.set_byte_count(len);
            d.set_lkey(0x42);
            d.set_addr(0x2000 + u64::from(len));
        }
        let wr = decode(&w, &ctrl(WqeOpcode::RdmaWriteImm, 4), wr_id(9, 0x09)).unwrap();
        assert_eq!(
            wr.op,
            WrOp::WriteImm {
                remote: RemoteAddr {
                    addr: 0x1000,
                    rkey: 0x77
                },
                imm: 0x1234_5678
            }
        );
        assert_eq!(wr.len(), 30);
        assert!(!wr.is_inline());
        match wr.local() {
            LocalRef::Sges(l) => assert_eq!(
                l.as_slice()[1],
                RcSge {
                    lkey: 0x42,
                    addr: 0x2014,
                    len: 20
                }
            ),
            other => panic!("{other:?}"),
        }
        assert!(wr.signaled && !wr.solicited && !wr.fence);
        assert_eq!(unpack_wr_id(wr.wr_id), (9, 0x09));
    }

    #[test]
    fn inline_send_decodes_and_bad_input_is_refused() {
        let mut w = [0u8; 64];
        w.write_be32(16, INLINE_SEG | 5);
        w[20..25].copy_from_slice(b"hello");
        let wr = decode(&w, &ctrl(WqeOpcode::Send, 2), 0).unwrap();
        match wr.local() {
            LocalRef::Inline(data) => assert_eq!(data, b"hello"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decode(&w, &ctrl(WqeOpcode::Lso, 2), 0).unwrap_err(),
            WqeError::QpOp
        );
        assert_eq!(
            decode(&w, &ctrl(WqeOpcode::RdmaWrite, 1), 0).unwrap_err(),
            WqeError::QpOp
        );
        w.write_be32(16, INLINE_SEG | 600);
        assert_eq!(
            decode(&w, &ctrl(WqeOpcode::Send, 2), 0).unwrap_err(),
            WqeError::QpOp,
            "inline bytes past the WQE's end"
        );
    }

    #[test]
    fn inline_beyond_the_limit_mixed_data_and_extra_sges_are_refused() {
        // 63 units: 9 inline segments of 56 bytes (4 units each) exceed 512 bytes.
        let mut w = vec![0u8; MAX_WQE];
        for k in 0..9 {
            w.write_be32(16 + 64 * k, INLINE_SEG | 56);
        }
        let c = ctrl(WqeOpcode::Send, 1 + 9 * 4);
        // 9 * 56 = 504 bytes fit; a tenth segment does not.
        assert_eq!(decode(&w, &c, 0).unwrap().len(), 504);
        w.write_be32(16 + 64 * 9, INLINE_SEG | 56);
        let c = ctrl(WqeOpcode::Send, 1 + 10 * 4);
        assert_eq!(decode(&w, &c, 0).unwrap_err(), WqeError::Length);

        // An inline segment, then a pointer.
        let mut w = [0u8; 64];
        w.write_be32(16, INLINE_SEG | 4);
        let mut d = DataSeg::new_unchecked(&mut w[32..48]);
        d.set_byte_count(8);
        assert_eq!(
            decode(&w, &ctrl(WqeOpcode::Send, 3), 0).unwrap_err(),
            WqeError::QpOp
        );
        // A zero-byte inline segment is no inline data: the pointer alone is used.
        w.write_be32(16, INLINE_SEG);
        let wr = decode(&w, &ctrl(WqeOpcode::Send, 3), 0).unwrap();
        assert!(!wr.is_inline() && wr.len() == 8);

        // 17 pointers.
        let mut w = vec![0u8; 16 * 18];
        for k in 1..18 {
            w.write_be32(16 * k, 1);
        }
        assert_eq!(
            decode(&w, &ctrl(WqeOpcode::Send, 18), 0).unwrap_err(),
            WqeError::QpOp
        );
    }

    #[test]
    fn engine_refusals_map_to_wqe_errors() {
        assert_eq!(WqeError::from(RcPostError::QueueFull), WqeError::QueueFull);
        assert_eq!(
            WqeError::from(RcPostError::BadAtomicLength { len: 4 }),
            WqeError::Length
        );
        assert_eq!(
            WqeError::from(RcPostError::InlineNotAllowed),
            WqeError::QpOp
        );
    }
}

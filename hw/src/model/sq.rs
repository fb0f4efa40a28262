//! Send WQEs (prm-subset.md §9.2, §9.5): reading a WQE from the SQ ring (it may wrap) and
//! decoding it into the RC engine's work request.
//!
//! The work request's `wr_id` carries what the CQE needs back: the WQE index (low 16 bits
//! of the WQEBB counter at the WQE's start) and the WQE opcode ([`wr_id`]).

use crate::layout::wqe::{
    AtomicSeg, CtrlSeg, DS_UNIT, DataSeg, INLINE_SEG, RaddrSeg, SEND_WQE_BB, WqeOpcode, fm_ce_se,
    inline_ds,
};
use crate::rc::{LocalData, MAX_INLINE, RemoteAddr, Sge, SgeList, WorkRequest, WrOp};

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

/// Why a WQE cannot be executed (reported as a LOCAL_QP_OP or LOCAL_LENGTH error CQE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeError {
    /// Unknown or unsupported opcode, a `ds` too small for it, a bad segment.
    QpOp,
    /// Inline data beyond the model's limit.
    Length,
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

/// Decodes the WQE in `w` (`ctrl.ds` 16-byte units) into a work request with `wr_id`.
pub(crate) fn decode(w: &[u8], ctrl: &Ctrl, id: u64) -> Result<WorkRequest, WqeError> {
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
    let local = local_data(&w[at..end])?;
    Ok(WorkRequest {
        wr_id: id,
        op: wr_op,
        local,
        signaled: ctrl.signaled(),
        solicited: ctrl.fm_ce_se & fm_ce_se::SOLICITED != 0,
        // Fence modes 2 (fence), 3 (strong ordering) and 4 (small and fence) wait for
        // earlier READs and atomics; mode 1 (initiator small fence) is for UMR (§9.5).
        fence: (ctrl.fm_ce_se & fm_ce_se::FENCE_MASK) >> 5 >= 2,
    })
}

/// The data segments of a WQE: a list of SGEs, or inline segments (concatenated).
fn local_data(segs: &[u8]) -> Result<LocalData, WqeError> {
    let mut sges = SgeList::new();
    let mut inline = [0u8; MAX_INLINE];
    let mut inline_len = 0usize;
    let mut at = 0;
    while at + 4 <= segs.len() {
        let head = u32::from_be_bytes(segs[at..at + 4].try_into().expect("4 bytes"));
        if head & INLINE_SEG != 0 {
            let n = (head & !INLINE_SEG) as usize;
            let data = segs.get(at + 4..at + 4 + n).ok_or(WqeError::QpOp)?;
            inline
                .get_mut(inline_len..inline_len + n)
                .ok_or(WqeError::Length)?
                .copy_from_slice(data);
            inline_len += n;
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
        sges.push(Sge {
            lkey: d.lkey(),
            addr: d.addr(),
            len: d.byte_count(),
        })
        .map_err(|_| WqeError::QpOp)?;
    }
    match (inline_len, sges.as_slice().is_empty()) {
        (0, _) => Ok(LocalData::Sges(sges)),
        (_, true) => Ok(LocalData::Inline {
            len: inline_len as u16,
            data: inline,
        }),
        // Inline data and pointers in one WQE: not something a driver builds.
        _ => Err(WqeError::QpOp),
    }
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
        assert_eq!(wr.local.len(), 30);
        assert!(wr.signaled);
        assert_eq!(unpack_wr_id(wr.wr_id), (9, 0x09));
    }

    #[test]
    fn inline_send_decodes_and_bad_input_is_refused() {
        let mut w = [0u8; 64];
        w.write_be32(16, INLINE_SEG | 5);
        w[20..25].copy_from_slice(b"hello");
        let wr = decode(&w, &ctrl(WqeOpcode::Send, 2), 0).unwrap();
        match wr.local {
            LocalData::Inline { len, data } => assert_eq!(&data[..len as usize], b"hello"),
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
        assert!(decode(&w, &ctrl(WqeOpcode::Send, 2), 0).is_err());
    }
}

//! UD and GSI queue pairs (IBA Vol. 1 §9.8, §10.2.5; mlx5: docs/spec/mlx5-ib-objects.md §4
//! and §8).
//!
//! A [`UdQp`] is a QP of service type UD (`st` 0x2) or the port's GSI QP (QP1, `st` 0x8).
//! It has the rings, doorbells and completion shadows of an RC [`Qp`] (it is one inside),
//! but no connection: RST→INIT sets the Q_Key, P_Key index and port, INIT→RTR the path MTU,
//! RTR→RTS the first send PSN ([`UdQp::activate`] runs all three, [`UdParams`]). Each
//! send names its destination ([`UdDest`]: an address handle [`Ah`], the remote QPN and the
//! Q_Key), in the datagram segment between the control segment and the data
//! (`uhca_layout::ud`).
//!
//! - A send is one packet: at most the QP's path MTU ([`UdQp::mtu`]), or the post is refused
//!   with [`PostError::MessageTooLong`]. SEND and SEND with immediate, from data segments or
//!   inline data ([`Local`]).
//! - A receive buffer starts with 40 bytes for the GRH ([`GRH_SIZE`]): every UD message
//!   lands behind it, and its completion's byte count includes it. The completion's
//!   [`DatagramInfo`](crate::datapath::DatagramInfo) tells the sender's QPN, that a GRH is
//!   present and what it holds ([`NetHeader`](crate::datapath::NetHeader)); the GRH itself
//!   is read with [`Grh::parse`](crate::resource::Grh::parse). A message longer than its
//!   buffer completes with LOCAL_LENGTH and writes nothing.
//! - Q_Keys (IBA §10.2.5): a send whose Q_Key has the high bit set ([`QKEY_USE_QP`]) sends
//!   with the QP's own Q_Key; a datagram is received only if its Q_Key is the QP's, and is
//!   otherwise dropped silently (so is one that finds no receive posted).
//! - The GSI QP ([`Device::create_gsi_qp`]) answers to QPN 1 on the wire ([`UdQp::wire_qpn`])
//!   whatever number the device gave it, has the Q_Key [`GSI_QKEY`] and an MTU of 256 (the
//!   MAD size, as Linux's mlx5_ib sets it). [`Gsi`](crate::resource::Gsi) runs it with its
//!   own buffers for a MAD layer.

#![deny(unsafe_code)]

use uhca_layout::caps::CmdHcaCap;
use uhca_layout::cmd::Opcode;
use uhca_layout::qpc::{Ads, Qpc};
use uhca_layout::wqe::WqeOpcode;

use super::ah::Ah;
use super::cq::Cq;
use super::qp::{Mtu, Qp, QpConfig, QpState, QpType};
use super::queue_error::QueueError;
use crate::cmd::ops::{self, roce_mtu};
use crate::cmd::queue_ops;
use crate::datapath::wqe::{PostError, Sge};
use crate::datapath::wr::{Local, SendFlags};
use crate::handle::Device;
use crate::resource::Pd;

// The GSI's Q_Key and QPN are the layout's (`uhca_layout::mad`), defined once.
pub use uhca_layout::mad::{GSI_QKEY, GSI_QPN};
pub use uhca_layout::ud::{GRH_SIZE, QKEY_USE_QP};

/// `opt_param_mask` bits of datagram transitions (Linux `MLX5_QP_OPTPAR_*`; qp.c
/// `opt_mask`, docs/spec/mlx5-ib-objects.md §4).
const OPTPAR_PKEY_INDEX: u32 = 1 << 4;
const OPTPAR_Q_KEY: u32 = 1 << 5;

/// Attributes of a UD or GSI QP's RST→INIT→RTR→RTS ([`UdQp::activate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdParams {
    /// The QP's Q_Key (ignored for the GSI QP, whose Q_Key is [`GSI_QKEY`]).
    pub qkey: u32,
    /// Index into port 1's P_Key table (0: the default partition).
    pub pkey_index: u16,
    /// The first send PSN.
    pub sq_psn: u32,
    /// The path MTU: the largest message a send may carry. `None`: the port's active MTU
    /// (a RoCE port's: the largest IB MTU within its Ethernet MTU, as `ibv_query_port`
    /// reports it); always 256 for the GSI QP.
    pub mtu: Option<Mtu>,
}

impl UdParams {
    /// Q_Key `qkey`, P_Key index 0, PSN 0, the port's active MTU.
    pub fn new(qkey: u32) -> UdParams {
        UdParams {
            qkey,
            pkey_index: 0,
            sq_psn: 0,
            mtu: None,
        }
    }
}

/// Where a datagram goes: an address handle, the remote QPN, the Q_Key.
#[derive(Clone, Copy, Debug)]
pub struct UdDest<'a> {
    /// The destination's address.
    pub ah: &'a Ah,
    /// The remote QP ([`GSI_QPN`] for a peer's GSI QP).
    pub remote_qpn: u32,
    /// The Q_Key the datagram carries; with the high bit set ([`QKEY_USE_QP`]) the
    /// sending QP's own.
    pub qkey: u32,
}

/// A UD send work request.
#[derive(Clone, Copy, Debug)]
pub struct UdSendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The destination.
    pub dest: UdDest<'a>,
    /// The message: data segments or inline bytes (at most the QP's `max_inline`).
    pub local: Local<'a>,
    /// Immediate data (SEND with immediate).
    pub imm: Option<u32>,
    /// Signaled, solicited (fence means nothing on UD and is not sent).
    pub flags: SendFlags,
}

/// A UD QP or the GSI QP (see the module docs).
#[derive(Debug)]
pub struct UdQp {
    qp: Qp,
    ty: QpType,
    qkey: u32,
    mtu_bytes: u32,
}

impl Device {
    /// Creates a UD QP in RESET on `pd` (`ibv_create_qp` with `IBV_QPT_UD`). `cfg` sizes
    /// the queues; a send WQE holds the 48-byte datagram segment, so `max_send_sge` is at
    /// most 12 and `max_inline` at most 188.
    pub fn create_ud_qp(
        &self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
    ) -> Result<UdQp, QueueError> {
        self.create_datagram(QpType::Ud, pd, send_cq, recv_cq, cfg)
    }

    /// Creates port 1's GSI QP (QP1) in RESET, as the special QP of type QP1
    /// (docs/spec/mlx5-ib-objects.md §4). It sends with source QPN 1 and receives what is
    /// sent to QPN 1. Make one per device (the device hands datagrams for QPN 1 to one
    /// GSI QP only).
    pub fn create_gsi_qp(
        &self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
    ) -> Result<UdQp, QueueError> {
        self.create_datagram(QpType::Gsi, pd, send_cq, recv_cq, cfg)
    }

    fn create_datagram(
        &self,
        ty: QpType,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
    ) -> Result<UdQp, QueueError> {
        let qp = self.create_qp_of(ty, pd, send_cq, recv_cq, cfg)?;
        Ok(UdQp {
            qp,
            ty,
            qkey: 0,
            mtu_bytes: 0,
        })
    }

    /// The active MTU of port 1 in bytes: the largest IB MTU within the port's Ethernet
    /// MTU (`ibv_query_port`'s `active_mtu`).
    pub fn active_mtu(&self) -> Result<u32, QueueError> {
        let v = ops::query_nic_vport_context(self.cmd())?;
        Ok(roce_mtu(v.mtu))
    }
}

fn mtu_of_bytes(b: u32) -> Mtu {
    match b {
        0..=256 => Mtu::M256,
        257..=512 => Mtu::M512,
        513..=1024 => Mtu::M1024,
        1025..=2048 => Mtu::M2048,
        _ => Mtu::M4096,
    }
}

impl UdQp {
    /// The QP number the device gave it.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn
    }

    /// The QPN peers send to and see as the source: [`GSI_QPN`] for the GSI QP, else
    /// [`qpn`](Self::qpn).
    pub fn wire_qpn(&self) -> u32 {
        if self.ty == QpType::Gsi {
            GSI_QPN
        } else {
            self.qp.qpn
        }
    }

    /// Whether this is the GSI QP.
    pub fn is_gsi(&self) -> bool {
        self.ty == QpType::Gsi
    }

    /// The state as the driver last drove it.
    pub fn state(&self) -> QpState {
        self.qp.state
    }

    /// QUERY_QP: the state the device reports.
    pub fn query_state(&self) -> Result<QpState, QueueError> {
        self.qp.query_state()
    }

    /// The QP's Q_Key (0 before INIT).
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// The path MTU in bytes: the largest message a send may carry (0 before RTR).
    pub fn mtu(&self) -> u32 {
        self.mtu_bytes
    }

    /// `st` and the CQs, written in every transition as Linux does.
    fn common(q: &mut Qpc<&mut [u8]>, ty: QpType, pdn: u32, scqn: u32, rcqn: u32) {
        q.set_st(ty.st());
        q.set_pm_state(3);
        q.set_pd(pdn);
        q.set_cqn_snd(scqn);
        q.set_cqn_rcv(rcqn);
    }

    fn ids(&self) -> (QpType, u32, u32, u32) {
        (self.ty, self.qp.pdn, self.qp.scq.cqn, self.qp.rcq.cqn)
    }

    fn check(&self, op: &'static str, from: QpState) -> Result<(), QueueError> {
        if self.qp.state == from {
            Ok(())
        } else {
            Err(QueueError::State {
                op,
                state: self.qp.state,
            })
        }
    }

    /// RST2INIT: Q_Key (the GSI QP's is always [`GSI_QKEY`]), P_Key index, port 1.
    pub fn to_init(&mut self, qkey: u32, pkey_index: u16) -> Result<(), QueueError> {
        self.check("RST2INIT", QpState::Reset)?;
        let qkey = if self.is_gsi() { GSI_QKEY } else { qkey };
        let (ty, pdn, s, r) = self.ids();
        let dbr = self.qp.buf.iova().add(self.qp.dbr as u64).0;
        queue_ops::modify_qp(&*self.qp.dev, Opcode::Rst2InitQp, self.qp.qpn, 0, |q| {
            Self::common(q, ty, pdn, s, r);
            q.set_dbr_addr(dbr);
            q.set_q_key(qkey);
            let mut a = ads(q);
            a.set_pkey_index(pkey_index.into());
            a.set_vhca_port_num(1);
        })?;
        self.qp.state = QpState::Init;
        self.qkey = qkey;
        Ok(())
    }

    /// INIT2RTR: the path MTU (`None`: the port's active MTU; the GSI QP's is 256) and the
    /// largest message (one packet).
    pub fn to_rtr(&mut self, mtu: Option<Mtu>) -> Result<(), QueueError> {
        self.check("INIT2RTR", QpState::Init)?;
        let mtu = match (self.is_gsi(), mtu) {
            (true, _) => Mtu::M256,
            (false, Some(m)) => m,
            (false, None) => {
                let v = ops::query_nic_vport_context(&*self.qp.dev)?;
                mtu_of_bytes(roce_mtu(v.mtu))
            }
        };
        let caps = CmdHcaCap::new_unchecked(
            &self.qp.dev.caps.get().ok_or(QueueError::Closed)?.general[..],
        );
        let log_msg = caps.log_max_msg().min(mtu as u32 + 7);
        let (ty, pdn, s, r) = self.ids();
        queue_ops::modify_qp(&*self.qp.dev, Opcode::Init2RtrQp, self.qp.qpn, 0, |q| {
            Self::common(q, ty, pdn, s, r);
            q.set_mtu(mtu as u32);
            q.set_log_msg_max(log_msg);
        })?;
        self.qp.state = QpState::Rtr;
        self.mtu_bytes = mtu.bytes();
        Ok(())
    }

    /// RTR2RTS: the first send PSN.
    pub fn to_rts(&mut self, sq_psn: u32) -> Result<(), QueueError> {
        self.check("RTR2RTS", QpState::Rtr)?;
        let (ty, pdn, s, r) = self.ids();
        queue_ops::modify_qp(&*self.qp.dev, Opcode::Rtr2RtsQp, self.qp.qpn, 0, |q| {
            Self::common(q, ty, pdn, s, r);
            q.set_next_send_psn(sq_psn & 0xFF_FFFF);
        })?;
        self.qp.state = QpState::Rts;
        Ok(())
    }

    /// RST→INIT→RTR→RTS in one call.
    pub fn activate(&mut self, p: &UdParams) -> Result<(), QueueError> {
        self.to_init(p.qkey, p.pkey_index)?;
        self.to_rtr(p.mtu)?;
        self.to_rts(p.sq_psn)
    }

    /// RTS2RTS with `Q_KEY`: changes the Q_Key of a UD QP that is ready to send (Linux
    /// `opt_mask[RTS][RTS][UD]`). The GSI QP's Q_Key does not change.
    pub fn set_qkey(&mut self, qkey: u32) -> Result<(), QueueError> {
        self.check("RTS2RTS", QpState::Rts)?;
        if self.is_gsi() {
            return Err(QueueError::Config("the GSI QP's Q_Key is 0x80010000"));
        }
        let (ty, pdn, s, r) = self.ids();
        queue_ops::modify_qp(
            &*self.qp.dev,
            Opcode::Rts2RtsQp,
            self.qp.qpn,
            OPTPAR_Q_KEY,
            |q| {
                Self::common(q, ty, pdn, s, r);
                q.set_q_key(qkey);
            },
        )?;
        self.qkey = qkey;
        Ok(())
    }

    /// INIT2INIT with `PKEY_INDEX`: moves a QP in INIT to another P_Key table entry.
    pub fn set_pkey_index(&mut self, pkey_index: u16) -> Result<(), QueueError> {
        self.check("INIT2INIT", QpState::Init)?;
        let (ty, pdn, s, r) = self.ids();
        queue_ops::modify_qp(
            &*self.qp.dev,
            Opcode::Init2InitQp,
            self.qp.qpn,
            OPTPAR_PKEY_INDEX,
            |q| {
                Self::common(q, ty, pdn, s, r);
                let mut a = ads(q);
                a.set_pkey_index(pkey_index.into());
                a.set_vhca_port_num(1);
            },
        )?;
        Ok(())
    }

    /// 2ERR: outstanding work requests complete with flush errors.
    pub fn to_err(&mut self) -> Result<(), QueueError> {
        self.qp.to_err()
    }

    /// 2RST: as [`Qp::reset`]; the Q_Key and MTU are set again by the next activation.
    pub fn reset(&mut self) -> Result<(), QueueError> {
        self.qp.reset()?;
        self.qkey = 0;
        self.mtu_bytes = 0;
        Ok(())
    }

    /// Posts a UD send (see the module docs); visible to the device at the next
    /// [`ring_doorbell`](Self::ring_doorbell). Refused, with nothing written, in a state
    /// other than RTS or ERR, above the path MTU, or with more SGEs or inline bytes than
    /// the QP was made for.
    #[inline]
    pub fn post_send(&mut self, wr: &UdSendWr<'_>) -> Result<(), PostError> {
        let q = &mut self.qp;
        if !matches!(q.state, QpState::Rts | QpState::Err) {
            return Err(PostError::BadState);
        }
        if q.dev.is_lost() {
            return Err(PostError::DeviceLost);
        }
        let len: u64 = match wr.local {
            Local::Sges(s) => s.iter().map(|s| u64::from(s.len)).sum(),
            Local::Inline(d) => d.len() as u64,
        };
        if len > u64::from(self.mtu_bytes) {
            return Err(PostError::MessageTooLong {
                len,
                mtu: self.mtu_bytes,
            });
        }
        let lim = q.limits;
        let (opcode, imm) = match wr.imm {
            Some(i) => (WqeOpcode::SendImm, i),
            None => (WqeOpcode::Send, 0),
        };
        let flags = wr.flags.bits() & !SendFlags::FENCE.bits();
        let d = wr.dest;
        q.sq.post(&q.shadow, wr.wr_id, opcode, flags, imm, |w| {
            w.datagram(d.ah.av(), d.remote_qpn, d.qkey);
            match wr.local {
                Local::Sges(s) if s.len() > lim.max_sge => Err(PostError::TooManySges),
                Local::Sges(s) => w.data(s),
                Local::Inline(b) if b.len() > lim.max_inline => Err(PostError::InlineTooLong),
                Local::Inline(b) => w.inline(b),
            }
        })
    }

    /// Publishes the sends posted since the last call (one doorbell, or BlueFlame for one
    /// small WQE). Also runs on drop.
    #[inline]
    pub fn ring_doorbell(&mut self) {
        self.qp.ring_doorbell();
    }

    /// Posts a receive: `sges` must hold the 40-byte GRH area and the message
    /// ([`GRH_SIZE`] + up to [`mtu`](Self::mtu) bytes).
    #[inline]
    pub fn post_recv(&mut self, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        self.qp.post_recv(wr_id, sges)
    }

    /// Free send basic blocks (64 bytes each; a UD send takes two or more).
    pub fn send_room(&self) -> u32 {
        self.qp.send_room()
    }

    /// Receive WQEs posted so far.
    pub fn recv_posted(&self) -> u32 {
        self.qp.recv_posted()
    }
}

fn ads<'a>(q: &'a mut Qpc<&mut [u8]>) -> Ads<&'a mut [u8]> {
    let o = Qpc::<()>::PRIMARY_ADDRESS_PATH;
    Ads::new_unchecked(&mut q.buf_mut()[o..o + Ads::<()>::SIZE])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_and_bytes() {
        for (b, m) in [
            (256, Mtu::M256),
            (512, Mtu::M512),
            (1024, Mtu::M1024),
            (2048, Mtu::M2048),
            (4096, Mtu::M4096),
        ] {
            assert_eq!(mtu_of_bytes(b), m);
            assert_eq!(m.bytes(), b);
        }
    }
}

//! RC queue pairs (prm-subset.md §6.6 commands, §7.3 `qpc`, §7.4 `ads`, §9.2-9.6 rings).
//!
//! A [`Qp`] owns its buffer (receive ring at offset 0, send ring after it, doorbell record
//! last, §9.4), a UAR page of its own for doorbells and BlueFlame, and the shadows its CQs
//! read. Posting is `&mut self`: one thread posts on a QP at a time, with no lock,
//! syscall or allocation; `Qp` is `Send`, so each thread can own its QPs.
//!
//! Connection: [`Qp::connect`] runs RST2INIT, INIT2RTR and RTR2RTS with the attributes of
//! [`ConnectParams`], writing what Linux writes per transition (§7.3).

#![deny(unsafe_code)]

use std::sync::Arc;

use uhca_layout::caps::CmdHcaCap;
use uhca_layout::cmd::Opcode;
pub use uhca_layout::qpc::Mtu;
use uhca_layout::qpc::{Ads, Qpc};
use uhca_layout::uar::{QP_DBR_RCV, QP_DBR_SND, bf_reg_offset};
use uhca_layout::wqe::{DS_UNIT, SEND_WQE_BB};

use super::cq::{Cq, CqObj};
pub use super::qp_state::QpState;
use super::queue_error::QueueError;
use crate::cmd::ops::{self, RoceAddress};
use crate::cmd::{CmdError, queue_ops};
pub(crate) use crate::datapath::post::{SendLimits, post_wr};
use crate::datapath::ring::RingSize;
use crate::datapath::shadow::{WqKind, WqShadow};
use crate::datapath::sq::{Doorbell, MAX_RECV_SGES, RecvRing, RqMem, SendRing, SqMem};
use crate::datapath::wqe::{MAX_INLINE, MAX_WQE_BYTES, PostError, Sge};
// The work-request vocabulary's home is `datapath` (with `Sge`, `Remote` and `PostError`); this
// path is kept, out of the docs, for the tools and fuzz targets that still import it here.
#[doc(hidden)]
pub use crate::datapath::wr::{Local, SendFlags, SendOp, SendWr};
use crate::device::DeviceInner;
use crate::dma::{DmaRecord, DmaRegion};
use crate::handle::Device;
use crate::resource::{Access, Pd, Uar};

/// BlueFlame register used in each QP's own UAR page (Linux's first "fast path" register,
/// §9.1; the page is not shared, so no lock is needed).
const BF_REG: usize = 2;

/// Sizes of a QP (see [`Device::create_qp`]).
#[derive(Clone, Copy, Debug)]
pub struct QpConfig {
    /// Send work requests the send queue must hold (of the largest size below).
    pub max_send_wr: u32,
    /// Receive work requests the receive queue holds (rounded up to a power of two).
    pub max_recv_wr: u32,
    /// Most data segments per send work request.
    pub max_send_sge: u32,
    /// Most data segments per receive work request.
    pub max_recv_sge: u32,
    /// Most inline bytes per send work request (up to [`MAX_INLINE`]).
    pub max_inline: u32,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 64,
        }
    }
}

/// Attributes of the RST→INIT→RTR→RTS sequence (the verbs attributes users set).
#[derive(Clone, Copy, Debug)]
pub struct ConnectParams {
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// Our first send PSN (`next_send_psn`).
    pub sq_psn: u32,
    /// The peer's first send PSN (our `next_rcv_psn`).
    pub rq_psn: u32,
    /// The peer's GID (IPv4-mapped for RoCEv2 over IPv4).
    pub remote_gid: [u8; 16],
    /// The peer's MAC.
    pub remote_mac: [u8; 6],
    /// Our GID table index.
    pub sgid_index: u8,
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout (4.096 µs × 2^value; 0 waits forever).
    pub timeout: u8,
    /// Transport retries (0-7).
    pub retry_cnt: u8,
    /// RNR retries (0-7; 7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer (IB encoding, 0-31).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READ/atomics as requester.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// What the peer may do to our memory through this QP (remote read/write/atomic).
    pub access: Access,
    /// RoCEv2 UDP source port.
    pub udp_sport: u16,
    /// IP hop limit.
    pub hop_limit: u8,
}

impl ConnectParams {
    /// Defaults for a peer at `remote_qpn` reachable at `gid`/`mac`: MTU 1024, timeout 14,
    /// 7 retries, 7 RNR retries, 16 outstanding reads/atomics, every remote right.
    pub fn new(remote_qpn: u32, gid: [u8; 16], mac: [u8; 6]) -> ConnectParams {
        ConnectParams {
            remote_qpn,
            sq_psn: 0,
            rq_psn: 0,
            remote_gid: gid,
            remote_mac: mac,
            sgid_index: 0,
            mtu: Mtu::M1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            access: Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            udp_sport: 0xC000,
            hop_limit: 64,
        }
    }
}

/// Attributes [`Qp::modify_rts`] changes (RTS2RTS); `None` keeps the current value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RtsAttrs {
    /// Local ACK timeout exponent (4.096 us * 2^timeout; 0 = infinite), 5 bits.
    pub timeout: Option<u8>,
    /// Transport retries, 3 bits.
    pub retry_cnt: Option<u8>,
    /// RNR retries, 3 bits (7 = infinite).
    pub rnr_retry: Option<u8>,
    /// Minimum RNR NAK timer code sent by our responder, 5 bits.
    pub min_rnr_timer: Option<u8>,
}

/// `opt_param_mask` bits of RTS2RTS (Linux `enum mlx5_qp_optpar`, prm-subset.md §6.6).
const OPTPAR_RNR_TIMEOUT: u32 = 1 << 6;
const OPTPAR_RETRY_COUNT: u32 = 1 << 12;
const OPTPAR_RNR_RETRY: u32 = 1 << 13;
const OPTPAR_ACK_TIMEOUT: u32 = 1 << 14;

/// The firmware QP plus what must outlive it.
pub struct Qp {
    pub(super) qpn: u32,
    pub(super) state: QpState,
    /// RQ, SQ and doorbell record; an `Arc` so a failed destroy can leak it (see `Drop`).
    pub(super) buf: Arc<DmaRegion>,
    pub(super) dbr: usize,
    pub(super) sq: SendRing,
    pub(super) rq: RecvRing,
    pub(super) db: Doorbell,
    pub(super) shadow: Arc<WqShadow>,
    pub(super) limits: SendLimits,
    pub(super) max_recv_sge: usize,
    pub(super) pdn: u32,
    pub(super) scq: Arc<CqObj>,
    pub(super) rcq: Arc<CqObj>,
    pub(super) dev: Arc<DeviceInner>,
    _uar: Uar,
    /// Its use of the PD, released after the firmware QP is destroyed.
    _pd: crate::resource::pd::QpUse,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("state", &self.state)
            .finish()
    }
}

fn ceil_log2(v: u32) -> u32 {
    v.max(1).next_power_of_two().trailing_zeros()
}

/// Refuses more outstanding RDMA READs/atomics (`what`, `requested`) than the device
/// allows (`2^log_max`, from capability `cap`, at most 128: the QP context's 3-bit
/// `log_sra_max` / `log_rra_max`, [`Device::rd_atomic_limits`]). The context holds the log2 rounded up,
/// as Linux's mlx5_ib writes it (`fls(n - 1)` in `__mlx5_ib_modify_qp`), so a value up to
/// the limit never rounds past it. mlx5_ib refuses a larger value with EINVAL
/// (`mlx5_ib_modify_qp`); it compares `max_rd_atomic` with `log_max_ra_res_qp` and
/// `max_dest_rd_atomic` with `log_max_ra_req_qp`, crossed. We compare each with its own
/// side (a requester's reads with `log_max_ra_req_qp`, a responder's with
/// `log_max_ra_res_qp`), as `ibv_query_device` reports them (`max_qp_init_rd_atom`,
/// `max_qp_rd_atom`); ConnectX devices report the same value for both.
fn read_atomic_cap(
    what: &'static str,
    requested: u8,
    log_max: u32,
    cap: &'static str,
) -> Result<(), QueueError> {
    let max = 1u32 << log_max.min(7);
    if u32::from(requested) > max {
        return Err(QueueError::AboveCap {
            what,
            requested: requested.into(),
            max,
            cap,
        });
    }
    Ok(())
}

/// The service type of a QP the driver creates (qpc `st`, Linux qp.h `MLX5_QP_ST_*`;
/// docs/spec/mlx5-ib-objects.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram.
    Ud,
    /// The GSI QP (QP1) of port 1.
    Gsi,
}

impl QpType {
    /// The `st` value.
    pub(crate) fn st(self) -> u32 {
        match self {
            QpType::Rc => 0x0,
            QpType::Ud => 0x2,
            QpType::Gsi => 0x8,
        }
    }

    fn wq_kind(self) -> WqKind {
        match self {
            QpType::Rc => WqKind::Connected,
            QpType::Ud => WqKind::Ud,
            QpType::Gsi => WqKind::Gsi,
        }
    }
}

impl Device {
    /// Creates an RC QP in RESET on `pd`, completing sends to `send_cq` and receives to
    /// `recv_cq` (which may be the same CQ), prm-subset.md §6.6.
    pub fn create_qp(
        &self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
    ) -> Result<Qp, QueueError> {
        self.create_qp_of(QpType::Rc, pd, send_cq, recv_cq, cfg)
    }

    /// [`create_qp`](Self::create_qp) for a QP of service type `ty`: the rings hold the
    /// largest WQE of that type (RC: control, remote address and data or inline, or an
    /// atomic; UD and GSI: control, the 48-byte datagram segment and data or inline).
    pub(crate) fn create_qp_of(
        &self,
        ty: QpType,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
    ) -> Result<Qp, QueueError> {
        let dev = &self.inner;
        if dev.is_lost() {
            return Err(QueueError::DeviceLost);
        }
        if !dev.is_open() {
            return Err(QueueError::Closed);
        }
        let cap = CmdHcaCap::new_unchecked(&self.caps().general[..]);
        let log_max = cap.log_max_qp_sz();
        if cfg.max_inline as usize > MAX_INLINE {
            return Err(QueueError::Config("max_inline exceeds the largest WQE"));
        }
        if cfg.max_send_sge as usize > crate::datapath::wqe::MAX_SEND_SGES
            || cfg.max_recv_sge as usize > MAX_RECV_SGES
            || cfg.max_recv_sge == 0
        {
            return Err(QueueError::Config("too many scatter/gather elements"));
        }
        // Largest WQE: RC: ctrl + raddr + max(data segments, inline, atomic + 1 data
        // segment); UD: ctrl + datagram + max(data segments, inline).
        let data = (cfg.max_send_sge as usize * DS_UNIT)
            .max((4 + cfg.max_inline as usize).next_multiple_of(DS_UNIT));
        let head_and_body = match ty {
            QpType::Rc => 2 * DS_UNIT + data.max(2 * DS_UNIT),
            QpType::Ud | QpType::Gsi => DS_UNIT + uhca_layout::ud::DATAGRAM_SEG + data.max(DS_UNIT),
        };
        if head_and_body > MAX_WQE_BYTES {
            return Err(QueueError::Config(
                "max_send_sge or max_inline do not fit the largest WQE",
            ));
        }
        let wqe_bbs = head_and_body
            .div_ceil(SEND_WQE_BB)
            .min(MAX_WQE_BYTES / SEND_WQE_BB);
        let sq_bbs = cfg.max_send_wr.max(1).saturating_mul(wqe_bbs as u32);
        let sq = RingSize::new(sq_bbs.checked_next_power_of_two().unwrap_or(0), log_max).ok_or(
            QueueError::Size {
                what: "send queue WQEBBs",
                requested: sq_bbs,
                log_max,
            },
        )?;
        let stride_log = ceil_log2(cfg.max_recv_sge * DS_UNIT as u32);
        // The receive ring is at least one basic block so the send ring stays aligned.
        let min_rq = (SEND_WQE_BB >> stride_log).max(1) as u32;
        let rq_want = cfg.max_recv_wr.max(min_rq);
        let rq = RingSize::new(rq_want.checked_next_power_of_two().unwrap_or(0), log_max).ok_or(
            QueueError::Size {
                what: "receive queue",
                requested: cfg.max_recv_wr,
                log_max,
            },
        )?;
        let rq_bytes = (rq.entries() as usize) << stride_log;
        let sq_off = rq_bytes;
        let dbr = sq_off + sq.entries() as usize * SEND_WQE_BB;
        let buf = Arc::new(dev.dma.alloc(dbr + 64)?);
        // The rings in the buffer (receive WQEs counted in data segments); they always fit.
        let geometry = || QueueError::Config("queue rings do not fit their buffer");
        let sq_mem = SqMem::new(buf.clone(), sq_off, sq.log()).ok_or_else(geometry)?;
        let rq_log = rq.log() + stride_log - DS_UNIT.trailing_zeros();
        let rq_mem = RqMem::new(buf.clone(), 0, rq_log).ok_or_else(geometry)?;
        let sq_dbr = DmaRecord::new(buf.clone(), dbr + QP_DBR_SND).ok_or_else(geometry)?;
        let rq_dbr = DmaRecord::new(buf.clone(), dbr + QP_DBR_RCV).ok_or_else(geometry)?;
        let uar = Uar::alloc(dev).map_err(|e| match e {
            crate::DeviceError::Cmd(c) => QueueError::Cmd(c),
            _ => QueueError::Closed,
        })?;
        let pages: Vec<_> = (0..buf.len().div_ceil(4096))
            .map(|i| buf.iova().add(i as u64 * 4096))
            .collect();
        let dbr_iova = buf.iova().add(dbr as u64).0;
        let (scqn, rcqn) = (send_cq.cqn(), recv_cq.cqn());
        let qpn = queue_ops::create_qp(&**dev, &pages, |q| {
            q.set_st(ty.st());
            q.set_pm_state(3); // migrated, as Linux creates
            q.set_pd(pd.pdn());
            q.set_uar_page(uar.index());
            q.set_log_rq_size(rq.log());
            q.set_log_rq_stride(stride_log - 4);
            q.set_log_sq_size(sq.log());
            q.set_no_sq(0);
            q.set_rq_type(0);
            q.set_log_page_size(0);
            q.set_page_offset(0);
            q.set_cqn_snd(scqn);
            q.set_cqn_rcv(rcqn);
            q.set_dbr_addr(dbr_iova);
        })?;
        let log_bf = cap.log_bf_reg_size();
        let bf_half = if cap.bf() == 1 && log_bf > 0 {
            (1usize << log_bf) / 2
        } else {
            0
        };
        let shadow = Arc::new(WqShadow::new(qpn, sq, rq).with_kind(ty.wq_kind()));
        send_cq.obj().registry.add(&shadow);
        recv_cq.obj().registry.add(&shadow);
        Ok(Qp {
            qpn,
            state: QpState::Reset,
            sq: SendRing::new(sq_mem, sq_dbr, qpn),
            rq: RecvRing::new(rq_mem, rq_dbr, rq, stride_log),
            db: Doorbell {
                bar: dev.bar.clone(),
                bf_reg: uar.bar_offset() + bf_reg_offset(BF_REG, log_bf),
                bf_half,
                bf_off: 0,
            },
            buf,
            dbr,
            shadow,
            limits: SendLimits {
                max_sge: cfg.max_send_sge as usize,
                max_inline: cfg.max_inline as usize,
            },
            max_recv_sge: cfg.max_recv_sge as usize,
            pdn: pd.pdn(),
            scq: send_cq.obj().clone(),
            rcq: recv_cq.obj().clone(),
            dev: dev.clone(),
            _uar: uar,
            _pd: pd.track(),
        })
    }

    /// GID table entry `index` of port 1 with its MAC (what a peer needs to reach us).
    pub fn roce_address(&self, index: u32) -> Result<RoceAddress, CmdError> {
        ops::query_roce_address(&*self.inner, index)
    }
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The state as the driver last drove it (the device may have moved it to ERR since;
    /// [`query_state`](Self::query_state) asks the device).
    pub fn state(&self) -> QpState {
        self.state
    }

    /// QUERY_QP: the state the device reports.
    pub fn query_state(&self) -> Result<QpState, QueueError> {
        let qpc = queue_ops::query_qp(&*self.dev, self.qpn)?;
        Ok(QpState::from_raw(Qpc::new_unchecked(&qpc[..]).state()))
    }

    fn common(q: &mut Qpc<&mut [u8]>, pdn: u32, scqn: u32, rcqn: u32) {
        q.set_st(0);
        q.set_pm_state(3);
        q.set_pd(pdn);
        q.set_cqn_snd(scqn);
        q.set_cqn_rcv(rcqn);
        q.set_log_ack_req_freq(8);
    }

    fn rights(q: &mut Qpc<&mut [u8]>, access: Access) {
        q.set_rre(access.contains(Access::REMOTE_READ).into());
        q.set_rwe(access.contains(Access::REMOTE_WRITE).into());
        let a = access.contains(Access::REMOTE_ATOMIC);
        q.set_rae(a.into());
        q.set_atomic_mode(if a { 1 } else { 0 }); // IB_COMP 8-byte atomics
    }

    fn ads<'a>(q: &'a mut Qpc<&mut [u8]>) -> Ads<&'a mut [u8]> {
        let o = Qpc::<()>::PRIMARY_ADDRESS_PATH;
        Ads::new_unchecked(&mut q.buf_mut()[o..o + Ads::<()>::SIZE])
    }

    fn check(&self, op: &'static str, from: &[QpState]) -> Result<(), QueueError> {
        if from.contains(&self.state) {
            Ok(())
        } else {
            Err(QueueError::State {
                op,
                state: self.state,
            })
        }
    }

    /// RST2INIT with the remote rights `access` (§7.3).
    pub fn to_init(&mut self, access: Access) -> Result<(), QueueError> {
        self.check("RST2INIT", &[QpState::Reset])?;
        let (pdn, s, r, dbr) = (
            self.pdn,
            self.scq.cqn,
            self.rcq.cqn,
            self.buf.iova().add(self.dbr as u64).0,
        );
        queue_ops::modify_qp(&*self.dev, Opcode::Rst2InitQp, self.qpn, 0, |q| {
            Self::common(q, pdn, s, r);
            Self::rights(q, access);
            q.set_dbr_addr(dbr);
            let mut a = Self::ads(q);
            a.set_pkey_index(0);
            a.set_vhca_port_num(1);
        })?;
        self.state = QpState::Init;
        Ok(())
    }

    /// INIT2RTR: the path to the peer, its QPN and PSN (§7.3, §7.4).
    pub fn to_rtr(&mut self, p: &ConnectParams) -> Result<(), QueueError> {
        self.check("INIT2RTR", &[QpState::Init])?;
        if p.min_rnr_timer > 31 {
            return Err(QueueError::Config("min_rnr_timer is 5 bits"));
        }
        let caps =
            CmdHcaCap::new_unchecked(&self.dev.caps.get().ok_or(QueueError::Closed)?.general[..]);
        let log_msg = caps.log_max_msg();
        read_atomic_cap(
            "max_dest_rd_atomic",
            p.max_dest_rd_atomic,
            caps.log_max_ra_res_qp(),
            "log_max_ra_res_qp",
        )?;
        let (pdn, s, r) = (self.pdn, self.scq.cqn, self.rcq.cqn);
        queue_ops::modify_qp(&*self.dev, Opcode::Init2RtrQp, self.qpn, 0, |q| {
            Self::common(q, pdn, s, r);
            Self::rights(q, p.access);
            q.set_mtu(p.mtu as u32);
            q.set_log_msg_max(log_msg);
            q.set_remote_qpn(p.remote_qpn & 0xFF_FFFF);
            q.set_next_rcv_psn(p.rq_psn & 0xFF_FFFF);
            q.set_log_rra_max(ceil_log2(p.max_dest_rd_atomic.into()).min(7));
            q.set_min_rnr_nak(p.min_rnr_timer.into());
            let mut a = Self::ads(q);
            a.set_vhca_port_num(1);
            a.set_rgid_rip(&p.remote_gid);
            a.set_rmac_47_32(u32::from(u16::from_be_bytes([
                p.remote_mac[0],
                p.remote_mac[1],
            ])));
            a.set_rmac_31_0(u32::from_be_bytes(p.remote_mac[2..].try_into().expect("4")));
            a.set_src_addr_index(p.sgid_index.into());
            a.set_hop_limit(p.hop_limit.into());
            a.set_udp_sport(p.udp_sport.into());
        })?;
        self.state = QpState::Rtr;
        Ok(())
    }

    /// RTR2RTS: timeouts, retries, our first PSN (§7.3).
    pub fn to_rts(&mut self, p: &ConnectParams) -> Result<(), QueueError> {
        self.check("RTR2RTS", &[QpState::Rtr])?;
        if p.retry_cnt > 7 || p.rnr_retry > 7 || p.timeout > 31 {
            return Err(QueueError::Config(
                "retry_cnt/rnr_retry are 3 bits, timeout 5",
            ));
        }
        let caps =
            CmdHcaCap::new_unchecked(&self.dev.caps.get().ok_or(QueueError::Closed)?.general[..]);
        read_atomic_cap(
            "max_rd_atomic",
            p.max_rd_atomic,
            caps.log_max_ra_req_qp(),
            "log_max_ra_req_qp",
        )?;
        let (pdn, s, r) = (self.pdn, self.scq.cqn, self.rcq.cqn);
        queue_ops::modify_qp(&*self.dev, Opcode::Rtr2RtsQp, self.qpn, 0, |q| {
            Self::common(q, pdn, s, r);
            q.set_retry_count(p.retry_cnt.into());
            q.set_rnr_retry(p.rnr_retry.into());
            q.set_log_sra_max(ceil_log2(p.max_rd_atomic.into()).min(7));
            q.set_next_send_psn(p.sq_psn & 0xFF_FFFF);
            Self::ads(q).set_ack_timeout(p.timeout.into());
        })?;
        self.state = QpState::Rts;
        Ok(())
    }

    /// RTS2RTS: changes the timer and retry attributes of a connected QP (§6.6; the
    /// `opt_param_mask` bits of Linux `enum mlx5_qp_optpar`). `None` leaves an attribute
    /// as it is. The new retry counts apply from the next acknowledged progress.
    pub fn modify_rts(&mut self, m: &RtsAttrs) -> Result<(), QueueError> {
        self.check("RTS2RTS", &[QpState::Rts])?;
        if m.retry_cnt.is_some_and(|v| v > 7)
            || m.rnr_retry.is_some_and(|v| v > 7)
            || m.timeout.is_some_and(|v| v > 31)
            || m.min_rnr_timer.is_some_and(|v| v > 31)
        {
            return Err(QueueError::Config(
                "retry_cnt/rnr_retry are 3 bits, timeout and min_rnr_timer 5",
            ));
        }
        let mask = m.min_rnr_timer.map_or(0, |_| OPTPAR_RNR_TIMEOUT)
            | m.retry_cnt.map_or(0, |_| OPTPAR_RETRY_COUNT)
            | m.rnr_retry.map_or(0, |_| OPTPAR_RNR_RETRY)
            | m.timeout.map_or(0, |_| OPTPAR_ACK_TIMEOUT);
        let (pdn, s, r) = (self.pdn, self.scq.cqn, self.rcq.cqn);
        queue_ops::modify_qp(&*self.dev, Opcode::Rts2RtsQp, self.qpn, mask, |q| {
            Self::common(q, pdn, s, r);
            q.set_min_rnr_nak(m.min_rnr_timer.unwrap_or(0).into());
            q.set_retry_count(m.retry_cnt.unwrap_or(0).into());
            q.set_rnr_retry(m.rnr_retry.unwrap_or(0).into());
            Self::ads(q).set_ack_timeout(m.timeout.unwrap_or(0).into());
        })?;
        Ok(())
    }

    /// RST→INIT→RTR→RTS in one call.
    pub fn connect(&mut self, p: &ConnectParams) -> Result<(), QueueError> {
        self.to_init(p.access)?;
        self.to_rtr(p)?;
        self.to_rts(p)
    }

    /// 2ERR: outstanding work requests complete with flush errors.
    pub fn to_err(&mut self) -> Result<(), QueueError> {
        self.ring_doorbell();
        queue_ops::qp_simple(&*self.dev, Opcode::ToErrQp, self.qpn)?;
        self.state = QpState::Err;
        Ok(())
    }

    /// 2RST: the QP forgets its connection and its rings start over, so it can be connected
    /// again ([`to_init`](Self::to_init) or [`connect`](Self::connect)). The device resets
    /// its ring counters; the driver does the same for its producer and consumer counters
    /// and zeroes the doorbell record (prm-subset.md §9.3), as a fresh QP has them.
    ///
    /// Work requests still outstanding (or posted without a doorbell) are dropped without
    /// completions. Completions of this
    /// QP still unpolled in its CQs no longer match a posted request: poll the CQs empty
    /// before resetting, or such completions come back from [`Cq::poll`](crate::resource::Cq::poll)
    /// as errors.
    pub fn reset(&mut self) -> Result<(), QueueError> {
        queue_ops::qp_simple(&*self.dev, Opcode::ToRstQp, self.qpn)?;
        self.state = QpState::Reset;
        self.sq.reset();
        self.rq.reset();
        let s = self.buf.slice();
        s.store_be32(self.dbr + QP_DBR_RCV, 0);
        s.store_be32(self.dbr + QP_DBR_SND, 0);
        // A fresh shadow: the pollers drop their cached copy of the old one.
        let fresh = Arc::new(
            WqShadow::new(self.qpn, self.shadow.sq_size(), self.shadow.rq_size())
                .with_kind(self.shadow.kind),
        );
        for cq in [&self.scq, &self.rcq] {
            cq.registry.remove(&self.shadow);
            cq.registry.add(&fresh);
        }
        self.shadow = fresh;
        Ok(())
    }

    /// Posts a send work request: writes its WQE, not yet visible to the device until
    /// [`ring_doorbell`](Self::ring_doorbell) (or drop). No syscall, lock or allocation.
    #[inline]
    pub fn post_send(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        if !matches!(self.state, QpState::Rts | QpState::Err) {
            return Err(PostError::BadState);
        }
        if self.dev.is_lost() {
            return Err(PostError::DeviceLost);
        }
        post_wr(&mut self.sq, &self.shadow, self.limits, wr)
    }

    /// Publishes the send WQEs posted since the last call with one doorbell (or BlueFlame
    /// for a single small WQE), prm-subset.md §9.2. Also runs on drop.
    #[inline]
    pub fn ring_doorbell(&mut self) {
        self.sq.ring_doorbell(&self.shadow, &mut self.db);
    }

    /// Posts a receive work request and publishes it in the doorbell record (§9.6).
    #[inline]
    pub fn post_recv(&mut self, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        if self.state == QpState::Reset {
            return Err(PostError::BadState);
        }
        if self.dev.is_lost() {
            return Err(PostError::DeviceLost);
        }
        if sges.len() > self.max_recv_sge {
            return Err(PostError::TooManySges);
        }
        self.rq.post(&self.shadow, wr_id, sges)
    }

    /// Free send basic blocks (64 bytes each), as of the completions polled so far.
    pub fn send_room(&self) -> u32 {
        self.sq.room(&self.shadow)
    }

    /// Send basic blocks posted so far, and WQEs waiting for a doorbell.
    pub fn send_counters(&self) -> (u32, u32) {
        (self.sq.head(), self.sq.pending(&self.shadow))
    }

    /// Receive WQEs posted so far.
    pub fn recv_posted(&self) -> u32 {
        self.rq.head()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.ring_doorbell();
        if self.dev.is_open()
            && let Err(e) = queue_ops::qp_simple(&*self.dev, Opcode::DestroyQp, self.qpn)
        {
            // The device may still write through the QP: keep its memory (leak) rather
            // than free it under the device.
            tracing::warn!(qpn = self.qpn, error = %e, "DESTROY_QP failed; leaking its buffer");
            std::mem::forget(self.buf.clone());
        }
        self.scq.registry.remove(&self.shadow);
        self.rcq.registry.remove(&self.shadow);
    }
}

//! RC queue pairs (prm-subset.md §6.6, §7.3, §7.4, §9.4, §9.6): the QP context the commands
//! keep, the state machine's states, the receive queue the transport takes WQEs from, and
//! the translation of the context into the RC engine's attributes at RTR2RTS.
//!
//! The context is kept as the 232 qpc bytes the commands wrote (each transition copies the
//! fields Linux sets in it, §7.3), so QUERY_QP returns what the driver set.

use crate::layout::qpc::{Ads, Qpc};
use crate::layout::roce::{EthRepr, EtherType, IpRepr, Ipv4Repr, Ipv6Repr};
use crate::layout::wqe::{DataSeg, INVALID_LKEY, SEND_WQE_BB};
use crate::rc::{
    AtomicEndianness, MAX_SGE, Mtu, PathConfig, RcQp, RcQpConfig, RcSge, RecvQueue, RecvWqe,
    RemoteAccess, SgeList,
};

use super::iommu::Dma;
use super::sq::{Ctrl, MAX_WQE};
use super::srq::Srq;
use super::table::Table;
use super::vport::{DEFAULT_PKEY, GidEntry, L3_IPV4};
use super::wq::{Hints, QueueBuf, extend_counter, read_dbr};

/// Bytes of a whole send WQE as `Qp::read_sq_wqe` reads it: the largest the model takes,
/// rounded up to whole WQEBBs.
pub(crate) const SQ_WQE_BUF: usize = MAX_WQE + SEND_WQE_BB;

/// QP states as a QP context holds them (qpc `state`, §7.3). SQD, SQER and the drain states
/// are not modelled. Named apart from the driver's `uhca::QpState` (the verbs view) and the
/// RC engine's `rc::RcQpState` (RTS or error) (#23: one name per concept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpcState {
    /// Reset.
    Rst = 0,
    /// Initialized.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Error.
    Err = 6,
}

/// The transport of a QP (qpc `st`, Linux `include/linux/mlx5/qp.h` `MLX5_QP_ST_*`;
/// docs/spec/mlx5-ib-objects.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpKind {
    /// Reliable connected (0x0): the RC engine.
    Rc,
    /// Unreliable datagram (0x2).
    Ud,
    /// The GSI QP (QP1, 0x8): a UD QP that answers to QPN 1 on its port.
    Gsi,
    /// The UMR QP (REG_UMR, 0xc): runs UMR and NOP WQEs, nothing goes on the wire.
    RegUmr,
}

impl QpKind {
    /// The kind of `st`, if the model has it.
    pub(crate) fn from_st(st: u32) -> Option<QpKind> {
        match st {
            0x0 => Some(QpKind::Rc),
            0x2 => Some(QpKind::Ud),
            0x8 => Some(QpKind::Gsi),
            0xc => Some(QpKind::RegUmr),
            _ => None,
        }
    }

    /// UD or GSI: datagrams with a Q_Key.
    pub(crate) fn is_datagram(self) -> bool {
        matches!(self, QpKind::Ud | QpKind::Gsi)
    }
}

/// Packets the requester sends ahead of the oldest unacknowledged one (the model's own
/// bound: RC has no such window but for READs and atomics). It keeps two 64 KiB messages in
/// flight at MTU 1024 and the link between two HCAs busy, halves the ACKs of a stream
/// against 128 (AckReq every half window) and lets a loopback frame carry eight 64 KiB
/// WRITEs at MTU 4096 (`rc::Burst::more`); the measurements behind the number are in
/// docs/performance.md ("Instruction counts"). It bounds a loopback burst to 1 MiB at MTU
/// 4096.
const MAX_INFLIGHT: u32 = 256;
/// Hop limit / TTL when the path leaves it 0.
pub(crate) const DEFAULT_HOP_LIMIT: u8 = 64;

/// One QP.
pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) state: QpcState,
    /// The context as written by the commands (state field kept at 0; see `state`).
    pub(crate) qpc: [u8; 232],
    pub(crate) pd: u32,
    pub(crate) cqn_snd: u32,
    pub(crate) cqn_rcv: u32,
    pub(crate) uar: u32,
    pub(crate) user_index: u32,
    /// log2 of SQ WQEBBs.
    pub(crate) log_sq_size: u32,
    /// log2 of RQ WQEs and of RQ WQE bytes.
    pub(crate) log_rq_size: u32,
    pub(crate) log_rq_stride: u32,
    pub(crate) has_rq: bool,
    /// The SRQ (or RMP) the QP takes its receives from (`rq_type` 1).
    pub(crate) srqn: Option<u32>,
    /// The transport (`st`) and what the QP carries.
    pub(crate) kind: QpKind,
    /// The queue key (`q_key`) of a UD or QP1 QP, checked against received datagrams.
    pub(crate) qkey: u32,
    /// The QP buffer: RQ at 0, SQ at `sq_off` (§9.4).
    pub(crate) buf: QueueBuf,
    pub(crate) sq_off: u64,
    /// Doorbell record: RQ counter at 0, SQ counter at 4 (§9.3).
    pub(crate) dbr: u64,
    /// SQ consumer counter in WQEBBs.
    pub(crate) sq_ci: u32,
    /// RQ consumer counter in WQEs.
    pub(crate) rq_ci: u32,
    /// RQ producer counter last read from the DBR.
    pub(crate) rq_pi: u32,
    /// The RC engine, from RTR2RTS until 2RST.
    pub(crate) engine: Option<RcQp>,
    /// Polled by the device thread on every pass.
    pub(crate) active: bool,
    /// Took a WQE or a frame, or transmitted, since its last poll: polled again on the
    /// pass's later inner passes (the first polls every active QP).
    pub(crate) moved: bool,
    /// The SQ DBR must be read on the next pass (RTR2RTS: WQEs posted earlier).
    pub(crate) kick: bool,
    /// A non-RC QP rang its doorbell: its WQEs run after the pass (`umr::run_local`).
    pub(crate) local_work: bool,
    /// Host addresses of the QP buffer and the SQ DBR, for prefetching at a doorbell.
    pub(crate) hints: Hints,
}

impl Qp {
    /// Moves the QP to ERR (its engine flushes what it holds, on its next poll).
    pub(crate) fn move_to_error(&mut self) {
        self.state = QpcState::Err;
        self.active = true;
        self.moved = true;
        if let Some(e) = self.engine.as_mut() {
            e.set_error();
        }
    }

    /// A view of the stored context.
    pub(crate) fn ctx(&self) -> Qpc<&[u8]> {
        Qpc::new_unchecked(&self.qpc[..])
    }

    /// The primary address path.
    pub(crate) fn path(&self) -> Ads<&[u8]> {
        Ads::new_unchecked(&self.qpc[Qpc::<()>::PRIMARY_ADDRESS_PATH..])
    }

    /// The SQ size in WQEBBs.
    pub(crate) fn sq_size(&self) -> u32 {
        1 << self.log_sq_size
    }

    /// Byte offset in the QP buffer of WQEBB `counter`.
    pub(crate) fn sq_wqebb_off(&self, counter: u32) -> u64 {
        self.sq_off + u64::from(counter & (self.sq_size() - 1)) * 64
    }

    /// The whole send WQE at the SQ consumer counter, read for the QPs whose WQEs run
    /// outside the RC engine (UD, GSI, UMR): its control segment and its WQEBBs, up to the
    /// largest WQE the model takes. `None` when the queue buffer cannot be read.
    pub(crate) fn read_sq_wqe(&self, dma: &Dma<'_>) -> Option<(Ctrl, [u8; SQ_WQE_BUF])> {
        let mut w = [0u8; SQ_WQE_BUF];
        let first = self.sq_wqebb_off(self.sq_ci);
        self.buf.read(dma, first, &mut w[..SEND_WQE_BB]).ok()?;
        let ctrl = Ctrl::parse(&w[..16]);
        for b in 1..ctrl.wqebbs().min((SQ_WQE_BUF / SEND_WQE_BB) as u32) {
            let at = b as usize * SEND_WQE_BB;
            let off = self.sq_wqebb_off(self.sq_ci.wrapping_add(b));
            self.buf.read(dma, off, &mut w[at..at + SEND_WQE_BB]).ok()?;
        }
        Some((ctrl, w))
    }

    /// The SQ producer counter from the DBR (16 bits used, §9.2), extended.
    pub(crate) fn sq_pi(&self, dma: &Dma<'_>) -> Option<u32> {
        let w = read_dbr(dma, self.dbr + 4).ok()?;
        Some(extend_counter(self.sq_ci, w & 0xFFFF, 16))
    }

    /// Starts loading the SQ DBR and the WQE at the SQ consumer counter into the cache
    /// (a doorbell was seen: both are read next, and their misses then overlap).
    pub(crate) fn prefetch_sq(&mut self, dma: &Dma<'_>) {
        let off = self.sq_wqebb_off(self.sq_ci);
        self.hints.prefetch(dma, &self.buf, off, self.dbr + 4);
    }

    /// Back to the state after CREATE_QP (2RST).
    pub(crate) fn reset(&mut self) {
        self.state = QpcState::Rst;
        self.engine = None;
        self.sq_ci = 0;
        self.rq_ci = 0;
        self.rq_pi = 0;
        self.active = false;
        self.moved = false;
        self.kick = false;
        self.local_work = false;
    }

    /// The receive queue seen by the engine: the QP's own, or its SRQ in `srqs`.
    pub(crate) fn rq<'a, 'd>(
        &'a mut self,
        dma: &'a Dma<'d>,
        srqs: &'a mut Table<Srq>,
    ) -> (Option<&'a mut RcQp>, Rq<'a, 'd>) {
        let rq = Rq {
            srq: self.srqn.and_then(|n| srqs.get_mut(n)),
            dma,
            buf: &self.buf,
            dbr: self.dbr,
            has_rq: self.has_rq,
            log_size: self.log_rq_size,
            log_stride: self.log_rq_stride,
            ci: &mut self.rq_ci,
            pi: &mut self.rq_pi,
        };
        (self.engine.as_mut(), rq)
    }

    /// The engine's attributes from the context (INIT2RTR and RTR2RTS fields, §7.3, §7.4).
    pub(crate) fn engine_config(
        &self,
        src: &GidEntry,
        endianness: AtomicEndianness,
    ) -> Option<RcQpConfig> {
        let c = self.ctx();
        let p = self.path();
        let mtu = Mtu::from_ib(c.mtu() as u8)?;
        let rgid = p.rgid_rip();
        let hop = match p.hop_limit() as u8 {
            0 => DEFAULT_HOP_LIMIT,
            h => h,
        };
        let ip = path_ip(
            src,
            &rgid,
            (p.dscp() as u8, p.ecn() as u8),
            p.tclass() as u8,
            p.flow_label(),
            hop,
        )?;
        let rmac = ((u64::from(p.rmac_47_32()) << 32) | u64::from(p.rmac_31_0())).to_be_bytes();
        let eth = EthRepr {
            dst_addr: rmac[2..].try_into().ok()?,
            src_addr: src.mac,
            ethertype: match ip {
                IpRepr::V4(_) => EtherType::Ipv4,
                IpRepr::V6(_) => EtherType::Ipv6,
            },
        };
        Some(RcQpConfig {
            qpn: self.qpn,
            dest_qpn: c.remote_qpn(),
            p_key: DEFAULT_PKEY,
            path: PathConfig {
                eth,
                ip,
                udp_src_port: p.udp_sport() as u16,
            },
            mtu,
            sq_psn: c.next_send_psn(),
            rq_psn: c.next_rcv_psn(),
            ack_timeout: p.ack_timeout() as u8,
            retry_cnt: c.retry_count() as u8,
            rnr_retry: c.rnr_retry() as u8,
            min_rnr_timer: c.min_rnr_nak() as u8,
            max_rd_atomic: 1 << c.log_sra_max(),
            max_dest_rd_atomic: 1 << c.log_rra_max(),
            max_inflight: MAX_INFLIGHT,
            sq_depth: self.sq_size(),
            log_max_msg: c.log_msg_max() as u8,
            remote_access: RemoteAccess {
                read: c.rre() == 1,
                write: c.rwe() == 1,
                atomic: c.rae() == 1,
            },
            atomic_endianness: endianness,
        })
    }
}

/// The IP header toward `rgid` from the GID entry `src`: IPv4 with `dscp_ecn` when `src`
/// is an IPv4 GID (the last 4 bytes of each GID are the addresses), else IPv6 with
/// `tclass` and `flow_label`; `hop` is the TTL / hop limit. `None` if a GID is malformed.
pub(crate) fn path_ip(
    src: &GidEntry,
    rgid: &[u8; 16],
    dscp_ecn: (u8, u8),
    tclass: u8,
    flow_label: u32,
    hop: u8,
) -> Option<IpRepr> {
    Some(if src.l3_type == L3_IPV4 {
        IpRepr::V4(Ipv4Repr {
            src_addr: src.gid[12..].try_into().ok()?,
            dst_addr: rgid[12..].try_into().ok()?,
            dscp: dscp_ecn.0,
            ecn: dscp_ecn.1,
            identification: 0,
            dont_fragment: true,
            ttl: hop,
            protocol: 17,
            payload_len: 0,
        })
    } else {
        IpRepr::V6(Ipv6Repr {
            src_addr: src.gid,
            dst_addr: *rgid,
            traffic_class: tclass,
            flow_label,
            next_header: 17,
            hop_limit: hop,
            payload_len: 0,
        })
    })
}

/// The receive queue of one QP as the engine takes from it (§9.6): the producer counter
/// is DBR dword 0 (16 bits), read only when the cached value says the queue is empty.
pub(crate) struct Rq<'a, 'd> {
    /// The SRQ the QP takes its receives from, if it has one (then the rest is unused).
    srq: Option<&'a mut Srq>,
    dma: &'a Dma<'d>,
    buf: &'a QueueBuf,
    dbr: u64,
    has_rq: bool,
    log_size: u32,
    log_stride: u32,
    ci: &'a mut u32,
    pi: &'a mut u32,
}

impl Rq<'_, '_> {
    /// Reads the RQ WQE at counter `n`: data segments up to the stride, ended early by a
    /// segment with `lkey` = `MLX5_INVALID_LKEY` (§9.6). Zero-length entries are skipped.
    fn read_wqe(&self, n: u32) -> SgeList {
        let stride = 16usize << self.log_stride;
        let at = u64::from(n & ((1 << self.log_size) - 1)) * stride as u64;
        let mut sges = SgeList::new();
        let mut seg = [0u8; 16];
        for k in 0..(stride / 16).min(MAX_SGE) {
            if self
                .buf
                .read(self.dma, at + 16 * k as u64, &mut seg)
                .is_err()
            {
                // An unreachable WQE scatters nothing: the message fails its length check.
                return SgeList::new();
            }
            let d = DataSeg::new_unchecked(&seg[..]);
            if d.lkey() == INVALID_LKEY && d.byte_count() == 0 {
                break;
            }
            if d.byte_count() == 0 {
                continue;
            }
            // At most MAX_SGE entries are read, so the push cannot fail.
            let _ = sges.push(RcSge {
                lkey: d.lkey(),
                addr: d.addr(),
                len: d.byte_count(),
            });
        }
        sges
    }

    /// Posted and not yet taken.
    pub(crate) fn pending(&mut self) -> bool {
        if let Some(srq) = self.srq.as_deref_mut() {
            return srq.pending(self.dma) > 0;
        }
        if !self.has_rq {
            return false;
        }
        if *self.pi == *self.ci {
            let Ok(w) = read_dbr(self.dma, self.dbr) else {
                return false;
            };
            *self.pi = extend_counter(*self.ci, w & 0xFFFF, 16);
        }
        (*self.pi).wrapping_sub(*self.ci) as i32 > 0
    }
}

impl RecvQueue for Rq<'_, '_> {
    fn take(&mut self) -> Option<RecvWqe> {
        if let Some(srq) = self.srq.as_deref_mut() {
            return srq.take(self.dma);
        }
        if !self.pending() {
            return None;
        }
        let n = *self.ci;
        let sges = self.read_wqe(n);
        *self.ci = n.wrapping_add(1);
        Some(RecvWqe {
            wr_id: u64::from(n),
            sges,
        })
    }

    fn shared(&self) -> bool {
        self.srq.is_some()
    }
}

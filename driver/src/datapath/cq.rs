//! Completion polling (prm-subset.md §9.7): the CQE ring, the ownership rule, shadow copies
//! of each CQE, index checks against the work queues' shadows, and typed completions.
//!
//! The poller owns its consumer index (`&mut`): one thread polls a CQ at a time, with no
//! lock. It finds the work queue of a CQE in a per-CQ table of `WqShadow`s that it caches
//! locally; the shared table is locked only when a QP is created or destroyed, or the first
//! time a new QPN is seen.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use uhca_layout::cqe::fast::{OP_OWN, QPN, SOP, TAIL_WORD, WQE_COUNTER};
use uhca_layout::cqe::{CQE_SIZE, Cqe, CqeOpcode, CqeSyndrome, ErrCqe, OP_OWN_OFFSET};
use uhca_layout::uar::CQ_DBR_SET_CI;
use uhca_layout::wqe::WqeOpcode;

use super::ring::RingSize;
use super::shadow::{SendSlots, WqKind, WqShadow};
use crate::barrier;
use crate::dma::{DmaEntry, DmaRecord, DmaRegion, DmaRing, DmaRingView};

/// The half of a CQE the driver reads.
const CQE_HALF: usize = CQE_SIZE / 2;

/// How a work request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// It completed successfully.
    Success,
    /// It failed (or was flushed: [`CqeSyndrome::WrFlush`]).
    Error {
        /// The PRM syndrome (§9.7).
        syndrome: CqeSyndrome,
        /// The vendor syndrome.
        vendor_err: u8,
    },
}

impl WcStatus {
    /// Whether the status is `Success`.
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

/// What libibverbs' `ibv_wc_status_str` prints for the status a CQE syndrome stands for
/// (rdma-core `libibverbs/enum_strs.c`; the syndrome-to-status mapping of
/// `providers/mlx5/cq.c` `mlx5_handle_error_cqe`), so errors read as users of other RDMA
/// tools know them.
pub fn wc_status_str(s: CqeSyndrome) -> &'static str {
    match s {
        CqeSyndrome::LocalLength => "local length error",
        CqeSyndrome::LocalQpOp => "local QP operation error",
        CqeSyndrome::LocalProt => "local protection error",
        CqeSyndrome::WrFlush => "Work Request Flushed Error",
        CqeSyndrome::MwBind => "memory management operation error",
        CqeSyndrome::BadResp => "bad response error",
        CqeSyndrome::LocalAccess => "local access error",
        CqeSyndrome::RemoteInvalReq => "remote invalid request error",
        CqeSyndrome::RemoteAccess => "remote access error",
        CqeSyndrome::RemoteOp => "remote operation error",
        CqeSyndrome::TransportRetryExc => "transport retry counter exceeded",
        CqeSyndrome::RnrRetryExc => "RNR retry counter exceeded",
        CqeSyndrome::RemoteAborted => "aborted error",
        CqeSyndrome::Unknown(_) => "general error",
    }
}

impl std::fmt::Display for WcStatus {
    /// `ibv_wc_status_str`'s words ([`wc_status_str`]), with an unknown syndrome's or a
    /// vendor syndrome's value after them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            WcStatus::Success => f.write_str("success"),
            WcStatus::Error {
                syndrome,
                vendor_err,
            } => {
                f.write_str(wc_status_str(syndrome))?;
                if let CqeSyndrome::Unknown(v) = syndrome {
                    write!(f, " (syndrome {v:#04x})")?;
                }
                if vendor_err != 0 {
                    write!(f, " (vendor error {vendor_err:#04x})")?;
                }
                Ok(())
            }
        }
    }
}

/// What kind of work request completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// SEND (with or without immediate).
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// Atomic compare-and-swap.
    CompSwap,
    /// Atomic fetch-and-add.
    FetchAdd,
    /// A receive consumed by a SEND.
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// Another send opcode (NOP, ...), raw.
    Other(u8),
}

impl WcOpcode {
    /// The completion opcode of a send WQE opcode: one load from a table of all 256.
    #[inline(always)]
    fn of_wqe(op: u8) -> WcOpcode {
        const TABLE: [WcOpcode; 256] = {
            let mut t = [WcOpcode::Other(0); 256];
            let mut i = 0;
            while i < 256 {
                t[i] = WcOpcode::classify(i as u8);
                i += 1;
            }
            t
        };
        TABLE[op as usize]
    }

    const fn classify(op: u8) -> WcOpcode {
        const SEND: u8 = WqeOpcode::Send.raw();
        const SEND_IMM: u8 = WqeOpcode::SendImm.raw();
        const SEND_INVAL: u8 = WqeOpcode::SendInval.raw();
        const WRITE: u8 = WqeOpcode::RdmaWrite.raw();
        const WRITE_IMM: u8 = WqeOpcode::RdmaWriteImm.raw();
        const READ: u8 = WqeOpcode::RdmaRead.raw();
        const CS: u8 = WqeOpcode::AtomicCs.raw();
        const MCS: u8 = WqeOpcode::AtomicMaskedCs.raw();
        const FA: u8 = WqeOpcode::AtomicFa.raw();
        const MFA: u8 = WqeOpcode::AtomicMaskedFa.raw();
        match op {
            SEND | SEND_IMM | SEND_INVAL => WcOpcode::Send,
            WRITE | WRITE_IMM => WcOpcode::RdmaWrite,
            READ => WcOpcode::RdmaRead,
            CS | MCS => WcOpcode::CompSwap,
            FA | MFA => WcOpcode::FetchAdd,
            other => WcOpcode::Other(other),
        }
    }
}

/// One work completion, copied out of the CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The `wr_id` the work request was posted with.
    pub wr_id: u64,
    /// Success or the error syndrome.
    pub status: WcStatus,
    /// The kind of work request.
    pub opcode: WcOpcode,
    /// Bytes received (receives), read (RDMA READ) or 8 (atomics); 0 for the other send
    /// completions, which libibverbs leaves it undefined for (rdma-core
    /// `providers/mlx5/cq.c` `handle_good_req` sets it for RDMA READ and atomics only).
    pub byte_len: u32,
    /// Immediate data of a SEND/WRITE with immediate.
    pub imm: Option<u32>,
    /// The local QP.
    pub qpn: u32,
    /// The sender's solicited-event bit (receives).
    pub solicited: bool,
    /// What a successful receive on a UD or GSI QP tells of its datagram; `None` for
    /// every other completion.
    pub datagram: Option<DatagramInfo>,
}

/// The network header in front of a received datagram (`cqe64.flags_rqpn[25:24]` on
/// Ethernet, Linux `MLX5_CQE_ROCE_L3_HEADER_TYPE_*`; docs/spec/mlx5-ib-objects.md §4).
/// It says how to read the 40-byte GRH area that starts the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetHeader {
    /// An IB GRH (RoCE v1): the whole 40 bytes.
    Grh,
    /// RoCE v2 over IPv6: the 40 bytes are the IPv6 header.
    Ipv6,
    /// RoCE v2 over IPv4: 20 bytes of zeros, then the IPv4 header.
    Ipv4,
}

impl NetHeader {
    fn from_raw(v: u32) -> NetHeader {
        match v & 3 {
            1 => NetHeader::Ipv6,
            2 => NetHeader::Ipv4,
            _ => NetHeader::Grh,
        }
    }
}

/// The sender of a datagram received on a UD or GSI QP (what `ibv_wc` has in `src_qp`,
/// `wc_flags & IBV_WC_GRH`, `pkey_index`, and its network header type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramInfo {
    /// The sender's QP number (1 for a peer's GSI QP).
    pub src_qp: u32,
    /// Whether the buffer starts with a valid GRH (always on RoCE).
    pub grh: bool,
    /// What the 40 GRH bytes hold.
    pub net: NetHeader,
    /// The packet's P_Key (GSI QP only, and only without immediate data: the CQE carries
    /// either in the same word).
    pub pkey: Option<u16>,
}

/// A CQE the driver cannot accept (device memory is untrusted). It is consumed and reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PollError {
    /// The CQE names a QP that is not attached to this CQ.
    #[error("CQE for unknown QP {qpn:#x}")]
    UnknownQp {
        /// The QPN in the CQE.
        qpn: u32,
    },
    /// The CQE's WQE counter is not an outstanding work request.
    #[error("CQE for QP {qpn:#x} names WQE {wqe_counter:#x}, which is not outstanding")]
    BadIndex {
        /// The QPN.
        qpn: u32,
        /// The WQE counter in the CQE.
        wqe_counter: u16,
    },
    /// A CQE opcode this driver never asks for (resize, compression, signature error).
    #[error("unexpected CQE opcode {0:?}")]
    BadOpcode(CqeOpcode),
}

/// The QPs whose completions go to one CQ; shared between the QPs (which register and
/// deregister) and the poller (which caches it).
#[derive(Debug, Default)]
pub(crate) struct QpRegistry {
    qps: Mutex<Vec<Arc<WqShadow>>>,
    generation: AtomicU64,
}

impl QpRegistry {
    pub(crate) fn add(&self, s: &Arc<WqShadow>) {
        let mut q = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        if !q.iter().any(|x| Arc::ptr_eq(x, s)) {
            q.push(s.clone());
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn remove(&self, s: &Arc<WqShadow>) {
        self.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|x| !Arc::ptr_eq(x, s));
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// The CQE ring and its consumer state.
#[derive(Debug)]
pub(crate) struct CqRing {
    /// The CQEs: the pass of `ci` round it (`DmaRingView::pass_parity`) is what the owner
    /// bit is compared with.
    ring: CqMem,
    /// Byte offset of the doorbell record in the ring's region.
    dbr: usize,
    /// The doorbell record's consumer index word (`CQ_DBR_SET_CI`).
    set_ci: DmaRecord,
    ci: u32,
    qps: QpCache,
}

/// The poller's copy of the CQ's QP registry.
#[derive(Debug)]
struct QpCache {
    registry: Arc<QpRegistry>,
    /// The registry's shadows after a stand-in at index 0 for "no QP yet" (QPN
    /// `u32::MAX`, which no CQE can name): never empty.
    qps: Vec<Arc<WqShadow>>,
    /// The QP that the last CQE named. The poller borrows `qps` shared for a whole batch,
    /// so it keeps the hot QP's shadow and slots at hand; switching QPs changes an index,
    /// and no reference count.
    hot: HotQp,
    generation: u64,
}

/// The poller's record of the QP that the last CQE named, kept apart from [`Poll`] (which
/// holds a `&mut` to it), so that the slow path updates it through that pointer while the
/// fast path's copies of these values stay in registers.
#[derive(Debug)]
struct HotQp {
    /// Its index in [`QpCache::qps`] (below `qps.len()`).
    index: usize,
    /// What its next requester CQE has under [`FAST_MASK`] but its WQE counter:
    /// [`fast_key`] of its QPN and the pass of the consumer index, or [`NO_KEY`] with
    /// that pass's owner bit. Either way its [`OWNER`] bit is the one a CQE written on
    /// the consumer index's pass has, so a mismatch there tells an empty entry.
    key: u64,
    /// Its send completion counter, as read after the slow path.
    tail: u32,
    /// Its send producer counter as last read.
    head: u32,
}

impl HotQp {
    /// No hot QP, the consumer index on a pass of parity `owner`.
    fn none(owner: u32) -> HotQp {
        HotQp {
            index: 0,
            key: NO_KEY | OP_OWN.put(owner.into()),
            tail: 0,
            head: 0,
        }
    }
}

/// The CQE ring memory: 64-byte entries.
pub(crate) type CqMem = DmaRing<{ CQE_SIZE / 8 }>;

/// The shadow standing in for "no QP yet" at [`QpCache::qps`]`[0]`.
fn no_qp() -> Arc<WqShadow> {
    let one = RingSize::new(1, 0).expect("1 is a power of two");
    Arc::new(WqShadow::new(u32::MAX, one, one))
}

impl CqRing {
    /// A ring over `buf`: `size` CQEs, then the doorbell record at `dbr`. Every entry starts
    /// as `op_own` = 0xF0 (§9.4). `None` if `buf` is too small for `size` CQEs.
    pub(crate) fn new(
        buf: Arc<DmaRegion>,
        size: RingSize,
        dbr: usize,
        registry: Arc<QpRegistry>,
    ) -> Option<CqRing> {
        let s = buf.slice();
        for i in 0..size.entries() as usize {
            s.write_u8(i * CQE_SIZE + OP_OWN_OFFSET, uhca_layout::cqe::OP_OWN_INIT);
        }
        let set_ci = DmaRecord::new(buf.clone(), dbr.checked_add(CQ_DBR_SET_CI)?)?;
        set_ci.store_be32(0);
        Some(CqRing {
            ring: CqMem::new(buf, 0, size.log())?,
            dbr,
            set_ci,
            ci: 0,
            qps: QpCache {
                registry,
                qps: vec![no_qp()],
                hot: HotQp::none(0),
                generation: u64::MAX,
            },
        })
    }

    pub(crate) fn region(&self) -> &Arc<DmaRegion> {
        self.ring.region()
    }

    pub(crate) fn ci(&self) -> u32 {
        self.ci
    }

    pub(crate) fn dbr_offset(&self) -> usize {
        self.dbr
    }

    /// Refreshes the QP cache if QPs were added or removed (one atomic load per poll).
    #[cfg(any(test, feature = "testing"))]
    #[inline]
    pub(crate) fn refresh(&mut self) {
        self.qps.refresh(self.ring.view(), self.ci);
    }
}

impl QpCache {
    /// As [`CqRing::refresh`], with the ring's `view` and consumer index `ci`.
    #[inline]
    fn refresh(&mut self, view: DmaRingView<'_, { CQE_SIZE / 8 }>, ci: u32) {
        let g = self.registry.generation.load(Ordering::Acquire);
        if g != self.generation {
            self.reload(g, view.pass_parity(ci));
        }
    }

    /// Copies the registry (at generation `g`); no QP is hot, the consumer index on a
    /// pass of parity `owner`.
    #[cold]
    fn reload(&mut self, g: u64, owner: u32) {
        let reg = self.registry.qps.lock().unwrap_or_else(|e| e.into_inner());
        self.qps = std::iter::once(no_qp())
            .chain(reg.iter().cloned())
            .collect();
        drop(reg);
        self.generation = g;
        self.hot = HotQp::none(owner);
    }
}

/// Every CQE but the fast path's (entry `e`, whose `op_own` is `op_own` and whose owner bit
/// is right), with `qps[hot]` the hot QP: copied out, then parsed and checked. Returns
/// the hot QP afterwards (the CQE's, if it named one of `qps`), and `None` (not consumed)
/// for a never-written entry.
///
/// `extern "C"`, so that the compiler knows a call cannot unwind (a panic here would
/// abort; nothing in it panics on any CQE): the iterator then needs no copy of its state
/// in memory for an unwinding `Drop`, and the fast path keeps it in registers.
#[cold]
#[inline(never)]
#[allow(improper_ctypes_definitions)] // called from Rust only
extern "C" fn poll_other(
    qps: &[Arc<WqShadow>],
    hot: usize,
    e: DmaEntry<'_, { CQE_SIZE / 8 }>,
    op_own: u8,
) -> (usize, Option<Result<Completion, PollError>>) {
    if op_own >> 4 == CqeOpcode::Invalid.raw() {
        return (hot, None); // never written (first pass)
    }
    // Everything a completion needs lies in 0x18..0x40 (§9.7; `flags_rqpn` at 0x18 for a
    // datagram's sender): copy only that; the rest of the shadow stays zero.
    let mut cqe = [0u8; CQE_SIZE];
    for (w, b) in cqe.chunks_exact_mut(8).enumerate().skip(CQE_HALF / 8 - 1) {
        b.copy_from_slice(&e.load(w).to_ne_bytes());
    }
    let mut hot = hot;
    let r = parse(qps, &mut hot, &cqe);
    (hot, Some(r))
}

/// The shadow of `qpn` in `qps`, made the hot one (`*hot`).
#[inline]
fn shadow<'s>(qps: &'s [Arc<WqShadow>], hot: &mut usize, qpn: u32) -> Option<&'s WqShadow> {
    match qps.get(*hot) {
        Some(s) if s.qpn == qpn => Some(s),
        _ => {
            let i = qps.iter().position(|s| s.qpn == qpn)?;
            *hot = i;
            qps.get(i).map(|s| &**s)
        }
    }
}

/// Turns a shadow CQE into a completion, checking its indices (style.md §10); `qps[*hot]`
/// is the hot QP, and becomes the CQE's.
fn parse(
    qps: &[Arc<WqShadow>],
    hot: &mut usize,
    cqe: &[u8; CQE_SIZE],
) -> Result<Completion, PollError> {
    let c = Cqe::new_unchecked(&cqe[..]);
    let op_own = c.op_own() as u8;
    let raw = op_own >> 4;
    let qpn = c.qpn();
    let counter = c.wqe_counter() as u16;
    let sh = shadow(qps, hot, qpn).ok_or(PollError::UnknownQp { qpn })?;
    let bad = PollError::BadIndex {
        qpn,
        wqe_counter: counter,
    };
    // Matched on the raw value (one compare chain, no enum conversion).
    const REQ: u8 = CqeOpcode::Req.raw();
    const REQ_ERR: u8 = CqeOpcode::ReqErr.raw();
    const RESP_WR_IMM: u8 = CqeOpcode::RespWrImm.raw();
    const RESP_SEND: u8 = CqeOpcode::RespSend.raw();
    const RESP_SEND_IMM: u8 = CqeOpcode::RespSendImm.raw();
    const RESP_SEND_INV: u8 = CqeOpcode::RespSendInv.raw();
    const RESP_ERR: u8 = CqeOpcode::RespErr.raw();
    match raw {
        REQ | REQ_ERR => {
            let wr_id = sh.complete_send(counter).ok_or(bad)?;
            let (status, wqe_op) = if raw == REQ {
                (WcStatus::Success, c.sop() as u8)
            } else {
                let e = ErrCqe::new_unchecked(&cqe[..]);
                (error_status(&e), e.s_wqe_opcode() as u8)
            };
            let op = WcOpcode::of_wqe(wqe_op);
            let byte_len = match op {
                WcOpcode::CompSwap | WcOpcode::FetchAdd => uhca_layout::wqe::ATOMIC_SIZE,
                WcOpcode::RdmaRead => c.byte_cnt(),
                _ => 0,
            };
            Ok(Completion {
                wr_id,
                status,
                opcode: op,
                byte_len,
                imm: None,
                qpn,
                solicited: false,
                datagram: None,
            })
        }
        RESP_SEND | RESP_SEND_IMM | RESP_SEND_INV | RESP_WR_IMM | RESP_ERR => {
            let wr_id = sh.complete_recv(counter).ok_or(bad)?;
            let (status, opcode, imm) = match raw {
                RESP_ERR => (
                    error_status(&ErrCqe::new_unchecked(&cqe[..])),
                    WcOpcode::Recv,
                    None,
                ),
                RESP_WR_IMM => (
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    Some(c.imm_inval_pkey()),
                ),
                RESP_SEND_IMM => (WcStatus::Success, WcOpcode::Recv, Some(c.imm_inval_pkey())),
                _ => (WcStatus::Success, WcOpcode::Recv, None),
            };
            let datagram = (status.is_ok() && sh.kind != WqKind::Connected).then(|| DatagramInfo {
                src_qp: c.rqpn(),
                grh: c.g() != 0,
                net: NetHeader::from_raw(c.sl()),
                pkey: (sh.kind == WqKind::Gsi && imm.is_none())
                    .then_some(c.imm_inval_pkey() as u16),
            });
            Ok(Completion {
                wr_id,
                status,
                opcode,
                byte_len: if status.is_ok() { c.byte_cnt() } else { 0 },
                imm,
                qpn,
                solicited: op_own & 0x02 != 0,
                datagram,
            })
        }
        other => Err(PollError::BadOpcode(CqeOpcode::from(other))),
    }
}

/// Publishes consumer index `ci` to the CQ doorbell record's `set_ci` word (§9.7).
#[inline]
fn update_ci(set_ci: &DmaRecord, ci: u32) {
    barrier::mb_before_ci_update(); // consumed CQEs read before their slots are handed back
    set_ci.store_be32(ci & 0xFF_FFFF);
}

fn error_status(e: &ErrCqe<&[u8]>) -> WcStatus {
    WcStatus::Error {
        syndrome: CqeSyndrome::from(e.syndrome() as u8),
        vendor_err: e.vendor_err_synd() as u8,
    }
}

/// The bits of a CQE's tail word (`cqe::fast::TAIL_WORD`) that decide the fast path: the
/// QPN, the WQE counter, the opcode, the owner bit, and [`SOP_READ_ATOMIC`] of the send
/// opcode (which the key has clear).
const FAST_MASK: u64 = QPN.put(u64::MAX)
    | WQE_COUNTER.put(u64::MAX)
    | OP_OWN.put(0xF1)
    | SOP.put(SOP_READ_ATOMIC as u64);

/// The send opcode bit that RDMA READ (0x10) and the atomics (0x11, 0x12, 0x14, 0x15) have
/// and WRITE, SEND and their variants (0x01, 0x08..0x0b) lack: the completions with a byte
/// count (rdma-core `providers/mlx5/cq.c` `handle_good_req` sets `byte_len` for these only)
/// go the slow way, so the fast path reads no byte count.
const SOP_READ_ATOMIC: u8 = 0x10;
const _: () = {
    let with = [
        WqeOpcode::RdmaRead,
        WqeOpcode::AtomicCs,
        WqeOpcode::AtomicFa,
        WqeOpcode::AtomicMaskedCs,
        WqeOpcode::AtomicMaskedFa,
    ];
    let without = [
        WqeOpcode::Send,
        WqeOpcode::SendImm,
        WqeOpcode::SendInval,
        WqeOpcode::RdmaWrite,
        WqeOpcode::RdmaWriteImm,
    ];
    let mut i = 0;
    while i < with.len() {
        assert!(with[i].raw() & SOP_READ_ATOMIC != 0);
        assert!(without[i].raw() & SOP_READ_ATOMIC == 0);
        i += 1;
    }
};

/// A key no CQE matches: a bit outside [`FAST_MASK`] (with the pass's owner bit, see
/// [`HotQp::key`]).
const NO_KEY: u64 = 1 << 8;
const _: () = assert!(NO_KEY & FAST_MASK == 0);

/// The owner bit of the tail word.
const OWNER: u64 = OP_OWN.put(1);

/// The tail word of a successful requester CQE of QP `qpn` written on the pass whose owner
/// bit is `owner`, under [`FAST_MASK`] and without the WQE counter.
#[inline(always)]
fn fast_key(qpn: u32, owner: u32) -> u64 {
    QPN.put(qpn.into()) | OP_OWN.put(u64::from(CqeOpcode::Req.raw() << 4) | u64::from(owner & 1))
}

/// The next pass has the other owner bit: the key flips it (rare: once per pass, so a
/// call on a branch rather than a select in the fast path). `extern "C"`, so that the
/// compiler knows it cannot unwind (see [`poll_other`]).
#[cold]
#[inline(never)]
extern "C" fn flip_owner(key: u64) -> u64 {
    key ^ OWNER
}

/// An iterator over the completions available now. Dropping it publishes the consumer
/// index once for the whole batch. Each completed WQE is handed back to the poster (the
/// shadow's send completion counter) at once.
///
/// What the fast path reads (the ring's address and size, the consumer index, the hot
/// QP's send counters, slots and CQE key) it holds by value, and nothing takes its
/// address, so a polling loop keeps it in registers even when each completion goes to
/// code that may touch any memory; the slow path gets it as scalars and leaves its
/// results in the CQ's `HotQp` record.
#[derive(Debug)]
pub struct Poll<'a> {
    view: DmaRingView<'a, { CQE_SIZE / 8 }>,
    ci: u32,
    /// The hot QP's send completion counter (as its shadow has it; the poller is its
    /// only writer): the first block of its oldest outstanding WQE.
    tail: u32,
    /// The hot QP's send producer counter, read when the batch begins and after the slow
    /// path (it only grows; a CQE for a WQE posted since goes the slow way).
    head: u32,
    /// [`HotQp::key`] as this batch advanced it.
    key: u64,
    /// [`FAST_MASK`], as a value the compiler does not know (see [`Poll::new`]).
    mask: u64,
    /// The hot QP's send slots.
    slots: SendSlots<'a>,
    /// The hot QP's shadow.
    sh: &'a WqShadow,
    set_ci: &'a DmaRecord,
    /// The ring's consumer index (as of when polling began, until the batch ends).
    ring_ci: &'a mut u32,
    /// The CQ's QPs ([`QpCache::qps`]) and the record of the hot one.
    qps: &'a [Arc<WqShadow>],
    hot: &'a mut HotQp,
}

impl<'a> Poll<'a> {
    #[inline]
    pub(crate) fn new(ring: &'a mut CqRing) -> Poll<'a> {
        let CqRing {
            ring: mem,
            set_ci,
            ci,
            qps,
            ..
        } = ring;
        let view = mem.view();
        qps.refresh(view, *ci);
        let QpCache { qps: list, hot, .. } = qps;
        let sh: &WqShadow = &list[hot.index];
        let tail = sh.send_tail();
        Poll {
            view,
            ci: *ci,
            tail,
            head: sh.send_head(),
            key: hot.key,
            // Hidden from the optimizer (`black_box`): as an unknown value it stays in one
            // register instead of being copied on every CQE (docs/performance.md,
            // "Instruction counts").
            mask: std::hint::black_box(FAST_MASK),
            slots: sh.send_slots(),
            sh,
            set_ci,
            ring_ci: ci,
            qps: list,
            hot,
        }
    }
}

/// The slow path of [`Poll::next`] for the entry at consumer index `ci` of the ring
/// `view`, `hot` the hot QP: the owner check, then the copy, parse and full index check of
/// `poll_other`. If that consumed the CQE (it may have switched QPs and completed WQEs),
/// `hot` holds the hot QP's counters and key afresh. Given the fast path's state as
/// scalars, so that it stays in registers; the copy and parse are out of line.
#[inline(always)]
fn next_other(
    qps: &[Arc<WqShadow>],
    hot: &mut HotQp,
    ci: u32,
    view: DmaRingView<'_, { CQE_SIZE / 8 }>,
) -> Option<Result<Completion, PollError>> {
    // The tail word again (the fast path's copy need not live this long); if the device
    // wrote the entry since, this is the newer value, checked the same way. The owner bit
    // must match the pass (§9.7); the INVALID opcode of a never-written entry is caught
    // by `poll_other`, with the other opcodes.
    let e = view.entry(ci);
    let word = u64::from_be(e.load(TAIL_WORD));
    if (word ^ u64::from(view.pass_parity(ci))) & 1 != 0 {
        return None;
    }
    barrier::rmb_after_owner(); // CQE body after its op_own byte
    let (i, r) = poll_other(qps, hot.index, e, OP_OWN.get(word) as u8);
    hot.index = i;
    let r = r?;
    if let Some(sh) = qps.get(i) {
        hot.tail = sh.send_tail();
        hot.head = sh.send_head();
        hot.key = fast_key(sh.qpn, view.pass_parity(ci.wrapping_add(1)));
    }
    Some(r)
}

impl Iterator for Poll<'_> {
    type Item = Result<Completion, PollError>;

    /// The fast path is a successful requester CQE of the hot QP naming its oldest
    /// outstanding WQE: one 8-byte load gives the owner bit, opcode, QPN, WQE counter and
    /// send opcode (`cqe::fast::TAIL_WORD`), one masked compare checks the first four
    /// and that the send opcode is a WRITE or SEND (no byte count to read) against what
    /// the batch expects, one compare that something is outstanding; then the shadow slot
    /// gives `wr_id` and the next WQE. Everything else (an entry not yet written,
    /// responder CQEs, RDMA READ and atomics, errors, another QP, unsignaled WQEs
    /// completed in passing, bad CQEs) goes through `poll_other`, which copies the CQE
    /// out first. An entry not yet written on this pass fails the same compare in the
    /// owner bit (the key always has the pass's), and ends the batch without more loads.
    ///
    /// Its cost per CQE and per batch: docs/performance.md, "Instruction counts".
    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        let ci = self.ci;
        let e = self.view.entry(ci);
        let word = u64::from_be(e.load(TAIL_WORD));
        let tail = self.tail;
        let diff = (word & self.mask) ^ self.key;
        if diff == WQE_COUNTER.put(tail.into()) && tail != self.head {
            barrier::rmb_after_owner(); // CQE body after its op_own byte
            let (wr_id, next) = self.slots.oldest(tail);
            self.sh.publish_send_tail(next); // at once: the poster may be waiting for room
            self.tail = next;
            let ci = ci.wrapping_add(1);
            self.ci = ci;
            if self.view.slot(ci) == 0 {
                self.key = flip_owner(self.key);
            }
            return Some(Ok(Completion {
                wr_id,
                status: WcStatus::Success,
                // WRITE or SEND (the key excludes the others): no byte count.
                opcode: WcOpcode::of_wqe(SOP.get(word) as u8),
                byte_len: 0,
                imm: None,
                qpn: QPN.get(word) as u32,
                solicited: false,
                datagram: None,
            }));
        }
        if diff & OWNER != 0 {
            return None; // not written on this pass yet (the key has the pass's owner bit)
        }
        let r = next_other(self.qps, self.hot, ci, self.view);
        if r.is_some() {
            self.ci = ci.wrapping_add(1);
            let qps: &[Arc<WqShadow>] = self.qps;
            if let Some(sh) = qps.get(self.hot.index) {
                self.slots = sh.send_slots();
                self.sh = sh;
            }
            self.tail = self.hot.tail;
            self.head = self.hot.head;
            self.key = self.hot.key;
        }
        r
    }
}

impl Drop for Poll<'_> {
    #[inline]
    fn drop(&mut self) {
        self.hot.key = self.key;
        if self.ci != *self.ring_ci {
            *self.ring_ci = self.ci;
            update_ci(self.set_ci, self.ci);
        }
    }
}

#[cfg(all(test, feature = "model"))]
mod tests;

//! The RC engine's public vocabulary: QP attributes, work requests, completions, the
//! memory/receive-queue/completion/clock seams and their errors.

use std::sync::atomic::{AtomicU64, Ordering};

use super::error::RcPostError;
use super::sge::{MAX_INLINE, RcSge, SgeList};
pub use crate::layout::qpc::Mtu;
use crate::layout::roce::{EthRepr, IpRepr, Psn};

/// Byte order in which the original remote value of an atomic is written to the
/// requester's local buffer (prm-subset.md §8.4 `atomic_req_8B_endianness_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtomicEndianness {
    /// Big-endian, as on the wire (IB mode 0).
    #[default]
    Big,
    /// The host's byte order (mode 1; little-endian on the hosts we run on).
    Host,
}

/// The addressing of the path: fixed header fields of every packet the QP sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathConfig {
    /// Ethernet source and destination MACs (the EtherType is derived).
    pub eth: EthRepr,
    /// IP source/destination, TTL or hop limit, DSCP/ECN or traffic class and flow label
    /// (lengths, protocol and checksum are derived).
    pub ip: IpRepr,
    /// RoCEv2 UDP source port (prm-subset.md §7.4 `udp_sport`; used for ECMP entropy).
    pub udp_src_port: u16,
}

/// Attributes of a connected RC QP: what INIT2RTR and RTR2RTS set (prm-subset.md §7.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcQpConfig {
    /// This QP's number (24 bits).
    pub qpn: u32,
    /// The peer QP's number (24 bits).
    pub dest_qpn: u32,
    /// Partition key sent in every BTH and required of every packet received.
    pub p_key: u16,
    /// Path addressing.
    pub path: PathConfig,
    /// Path MTU.
    pub mtu: Mtu,
    /// First PSN the requester sends (`next_send_psn`).
    pub sq_psn: u32,
    /// First PSN the responder expects (`next_rcv_psn`).
    pub rq_psn: u32,
    /// Local ACK timeout exponent: 4.096 us * 2^`ack_timeout`; 0 waits forever
    /// (IBA Vol. 1 §9.7.6.1.3, prm-subset.md §7.4 `ack_timeout`). 5 bits.
    pub ack_timeout: u8,
    /// Retries after a timeout or a NAK sequence error before the WR fails (0..=7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK before the WR fails (0..=7; 7 retries forever).
    pub rnr_retry: u8,
    /// RNR NAK timer this responder asks for (5-bit IBA encoding, Table 45).
    pub min_rnr_timer: u8,
    /// RDMA READ and atomic requests the requester keeps outstanding (at least 1;
    /// `2^log_sra_max`). Should not exceed the peer's `max_dest_rd_atomic`.
    pub max_rd_atomic: u8,
    /// READ/atomic requests the responder remembers for duplicates (at least 1;
    /// `2^log_rra_max`).
    pub max_dest_rd_atomic: u8,
    /// Packets (PSNs) the requester sends ahead of the oldest unacknowledged one.
    pub max_inflight: u32,
    /// Send work requests that can be outstanding.
    pub sq_depth: u32,
    /// Longest message the requester sends, `2^log_max_msg` bytes (qpc `log_msg_max`,
    /// at most 31: IBA's 2^31); a longer one completes with a local length error.
    pub log_max_msg: u8,
    /// Remote operations this responder allows (qpc `rre`, `rwe`, `rae`).
    pub remote_access: RemoteAccess,
    /// Byte order of atomic results written locally.
    pub atomic_endianness: AtomicEndianness,
}

/// Remote operations a responder QP allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAccess {
    /// RDMA READ.
    pub read: bool,
    /// RDMA WRITE.
    pub write: bool,
    /// Atomics.
    pub atomic: bool,
}

impl RemoteAccess {
    /// Everything allowed.
    pub const ALL: Self = Self {
        read: true,
        write: true,
        atomic: true,
    };
}

/// A QP attribute out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A field is outside its range.
    #[error("QP attribute {field} = {value} is out of range")]
    OutOfRange {
        /// The attribute.
        field: &'static str,
        /// Its value.
        value: u32,
    },
}

impl RcQpConfig {
    /// Checks every attribute against its range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |field, value: u32, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::OutOfRange { field, value })
            }
        };
        check("qpn", self.qpn, self.qpn <= Psn::MASK)?;
        check("dest_qpn", self.dest_qpn, self.dest_qpn <= Psn::MASK)?;
        check("sq_psn", self.sq_psn, self.sq_psn <= Psn::MASK)?;
        check("rq_psn", self.rq_psn, self.rq_psn <= Psn::MASK)?;
        check(
            "ack_timeout",
            self.ack_timeout.into(),
            self.ack_timeout < 32,
        )?;
        check("retry_cnt", self.retry_cnt.into(), self.retry_cnt < 8)?;
        check("rnr_retry", self.rnr_retry.into(), self.rnr_retry < 8)?;
        check(
            "min_rnr_timer",
            self.min_rnr_timer.into(),
            self.min_rnr_timer < 32,
        )?;
        check(
            "max_rd_atomic",
            self.max_rd_atomic.into(),
            self.max_rd_atomic > 0,
        )?;
        let v = self.max_dest_rd_atomic;
        check("max_dest_rd_atomic", v.into(), v > 0)?;
        let v = self.max_inflight;
        check("max_inflight", v, v > 0 && v < Psn::HALF)?;
        let v = self.log_max_msg;
        check("log_max_msg", v.into(), v <= 31)?;
        check(
            "sq_depth",
            self.sq_depth,
            self.sq_depth > 0 && self.sq_depth <= 1 << 16,
        )?;
        Ok(())
    }

    /// The local ACK timeout in nanoseconds, `None` for "forever".
    pub fn ack_timeout_ns(&self) -> Option<u64> {
        (self.ack_timeout != 0).then(|| 4096u64 << self.ack_timeout)
    }
}

/// The RNR NAK timer of a 5-bit encoding, in nanoseconds (IBA Vol. 1 §9.7.5.2.8,
/// Table 45 "Encoding for RNR NAK Timer Field": 0 = 655.36 ms, 1 = 0.01 ms ... 31 = 491.52 ms).
pub const fn rnr_timer_ns(code: u8) -> u64 {
    // The table in units of 10 us.
    const UNITS: [u32; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    UNITS[(code & 0x1F) as usize] as u64 * 10_000
}

/// The remote side of an RDMA or atomic operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// What a send work request does (IBA Vol. 1 §10.8.3, verbs `ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOp {
    /// RDMA WRITE of the local data to `remote`.
    Write {
        /// Target.
        remote: RemoteAddr,
    },
    /// RDMA WRITE with immediate: also consumes a receive WR at the peer.
    WriteImm {
        /// Target.
        remote: RemoteAddr,
        /// Immediate data (delivered in the peer's receive completion).
        imm: u32,
    },
    /// SEND of the local data into the peer's next receive buffer.
    Send,
    /// SEND with immediate.
    SendImm {
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ of `remote` into the local SGEs.
    Read {
        /// Source.
        remote: RemoteAddr,
    },
    /// 64-bit compare and swap at `remote`; the original value lands in the local SGE.
    CompareSwap {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Value compared with.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// 64-bit fetch and add at `remote`; the original value lands in the local SGE.
    FetchAdd {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Value added.
        add: u64,
    },
}

impl WrOp {
    /// The completion opcode of this request.
    pub const fn wc_opcode(&self) -> RcWcOpcode {
        match self {
            WrOp::Write { .. } | WrOp::WriteImm { .. } => RcWcOpcode::RdmaWrite,
            WrOp::Send | WrOp::SendImm { .. } => RcWcOpcode::Send,
            WrOp::Read { .. } => RcWcOpcode::RdmaRead,
            WrOp::CompareSwap { .. } => RcWcOpcode::CompareSwap,
            WrOp::FetchAdd { .. } => RcWcOpcode::FetchAdd,
        }
    }
    /// READ and atomics: completed by response data rather than an ACK.
    pub const fn needs_response(&self) -> bool {
        matches!(
            self,
            WrOp::Read { .. } | WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. }
        )
    }
}

/// The local data of a work request: a gather/scatter list or inline bytes.
// Stored in place in the preallocated send queue: boxing would allocate per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalData {
    /// Data in registered memory.
    Sges(SgeList),
    /// Data carried in the request itself (SEND and WRITE only).
    Inline {
        /// Bytes used.
        len: u16,
        /// The bytes (`..len`).
        data: [u8; MAX_INLINE],
    },
}

impl LocalData {
    /// Inline data from a slice, or `None` if longer than [`MAX_INLINE`].
    pub fn inline(bytes: &[u8]) -> Option<Self> {
        let mut data = [0u8; MAX_INLINE];
        data.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(LocalData::Inline {
            len: bytes.len() as u16,
            data,
        })
    }
    /// Total bytes.
    pub fn len(&self) -> u64 {
        match self {
            LocalData::Sges(s) => s.total_len(),
            LocalData::Inline { len, .. } => u64::from(*len),
        }
    }
    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A send work request, as the QP layer decodes it from a send WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// The caller's identifier (WQE index or `wr_id`), returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// Local data: the source of SEND/WRITE, the destination of READ/atomic results.
    pub local: LocalData,
    /// Generate a completion on success (failures always complete).
    pub signaled: bool,
    /// Set the BTH SE bit on the last packet of a SEND (solicited event).
    pub solicited: bool,
    /// Start only after every earlier READ and atomic has completed (IBA §10.8.3.3 fence).
    pub fence: bool,
}

/// A send work request written in place into its send-queue entry by
/// [`RcQp::post_send_with`](super::RcQp::post_send_with): a decoder fills the queue
/// directly instead of building a [`WorkRequest`] (with its inline buffer and SGE array) and
/// moving it in. Each post starts from an empty slot (`wr_id` 0, a SEND without flags or
/// local data); [`push_sge`](Self::push_sge) and [`push_inline`](Self::push_inline) copy
/// only what they are given, so the entry's buffers are reused without being cleared.
#[derive(Clone, Debug)]
pub struct SendSlot {
    /// The caller's identifier (WQE index or `wr_id`), returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// Generate a completion on success (failures always complete).
    pub signaled: bool,
    /// Set the BTH SE bit on the last packet of a SEND (solicited event).
    pub solicited: bool,
    /// Start only after every earlier READ and atomic has completed (IBA §10.8.3.3 fence).
    pub fence: bool,
    /// Total bytes of the local data.
    len: u64,
    /// Some inline data was given (even zero bytes).
    is_inline: bool,
    sges: SgeList,
    inline_len: u16,
    inline: [u8; MAX_INLINE],
}

/// The local data of a [`SendSlot`], borrowed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LocalRef<'a> {
    /// Data in registered memory.
    Sges(&'a SgeList),
    /// The inline bytes.
    Inline(&'a [u8]),
}

impl SendSlot {
    /// An empty slot.
    pub(crate) const fn new() -> Self {
        Self {
            wr_id: 0,
            op: WrOp::Send,
            signaled: false,
            solicited: false,
            fence: false,
            len: 0,
            is_inline: false,
            sges: SgeList::new(),
            inline_len: 0,
            inline: [0; MAX_INLINE],
        }
    }

    /// Empties the slot for the next request: a few stores, the buffers are kept.
    pub(crate) fn reset(&mut self) {
        self.wr_id = 0;
        self.op = WrOp::Send;
        (self.signaled, self.solicited, self.fence) = (false, false, false);
        (self.len, self.is_inline, self.inline_len) = (0, false, 0);
        self.sges.clear();
    }

    /// Appends a scatter/gather entry to the local data.
    pub fn push_sge(&mut self, sge: RcSge) -> Result<(), RcPostError> {
        self.sges.push(sge)?;
        self.len += u64::from(sge.len);
        Ok(())
    }

    /// Appends inline bytes to the local data (copied now; the slot then holds inline data,
    /// even if `bytes` is empty). Refused beyond [`MAX_INLINE`] bytes in all.
    pub fn push_inline(&mut self, bytes: &[u8]) -> Result<(), RcPostError> {
        let at = usize::from(self.inline_len);
        self.inline
            .get_mut(at..at + bytes.len())
            .ok_or(RcPostError::InlineTooLong { max: MAX_INLINE })?
            .copy_from_slice(bytes);
        self.inline_len += bytes.len() as u16;
        self.len += bytes.len() as u64;
        self.is_inline = true;
        Ok(())
    }

    /// Copies a whole work request in (the [`RcQp::post_send`](super::RcQp::post_send) path).
    pub fn fill_from(&mut self, wr: &WorkRequest) -> Result<(), RcPostError> {
        self.wr_id = wr.wr_id;
        self.op = wr.op;
        (self.signaled, self.solicited, self.fence) = (wr.signaled, wr.solicited, wr.fence);
        match &wr.local {
            LocalData::Sges(l) => l.as_slice().iter().try_for_each(|s| self.push_sge(*s)),
            LocalData::Inline { len, data } => {
                let bytes = data.get(..usize::from(*len));
                self.push_inline(bytes.ok_or(RcPostError::InlineTooLong { max: MAX_INLINE })?)
            }
        }
    }

    /// Total bytes of the local data.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the local data has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the local data is inline.
    pub fn is_inline(&self) -> bool {
        self.is_inline
    }

    /// Whether both inline data and SGEs were given (never valid).
    pub(crate) fn is_mixed(&self) -> bool {
        self.is_inline && !self.sges.as_slice().is_empty()
    }

    /// The local data (inline wins over SGEs; [`is_mixed`](Self::is_mixed) slots are
    /// refused at post).
    pub(crate) fn local(&self) -> LocalRef<'_> {
        if self.is_inline {
            LocalRef::Inline(&self.inline[..usize::from(self.inline_len)])
        } else {
            LocalRef::Sges(&self.sges)
        }
    }
}

/// What a completion reports (verbs `ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RcWcOpcode {
    /// SEND or SEND with immediate.
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// Compare and swap.
    CompareSwap,
    /// Fetch and add.
    FetchAdd,
    /// A SEND received.
    Recv,
    /// An RDMA WRITE with immediate received.
    RecvRdmaWithImm,
}

impl RcWcOpcode {
    /// A receive-side completion.
    pub const fn is_recv(self) -> bool {
        matches!(self, RcWcOpcode::Recv | RcWcOpcode::RecvRdmaWithImm)
    }
}

/// The outcome of a work request (IBA Vol. 1 §10.10.2.2 completion status, verbs names in
/// parentheses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RcWcStatus {
    /// Completed (`IBV_WC_SUCCESS`).
    Success,
    /// A received message did not fit the receive buffers (`LOC_LEN_ERR`).
    LocalLength,
    /// A local buffer failed its L_Key check (`LOC_PROT_ERR`).
    LocalProtection,
    /// The responder sent a response that does not fit the request (`BAD_RESP_ERR`).
    BadResponse,
    /// NAK Invalid Request (`REM_INV_REQ_ERR`).
    RemoteInvalidRequest,
    /// NAK Remote Access Error (`REM_ACCESS_ERR`).
    RemoteAccess,
    /// NAK Remote Operational Error (`REM_OP_ERR`).
    RemoteOperational,
    /// Transport retries (timeouts, sequence errors) exhausted (`RETRY_EXC_ERR`).
    RetryExceeded,
    /// RNR retries exhausted (`RNR_RETRY_EXC_ERR`).
    RnrRetryExceeded,
    /// Flushed: the QP was in the error state (`WR_FLUSH_ERR`).
    Flushed,
}

/// One completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcCompletion {
    /// The QP.
    pub qpn: u32,
    /// The work request's identifier.
    pub wr_id: u64,
    /// What completed.
    pub opcode: RcWcOpcode,
    /// How.
    pub status: RcWcStatus,
    /// Bytes transferred: the message length (receives: bytes placed; WRITE with
    /// immediate: the RETH length).
    pub byte_len: u32,
    /// Immediate data of a received SEND/WRITE with immediate.
    pub imm: Option<u32>,
    /// The SE bit of a received SEND (request a solicited event).
    pub solicited: bool,
}

/// QP states the engine distinguishes (IBA Vol. 1 §10.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RcQpState {
    /// Ready to send (and receive).
    Rts,
    /// Error: all work requests complete as flushed.
    Error,
}

/// Counters of one QP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RcStats {
    /// Packets handed to the link.
    pub tx_packets: u64,
    /// Packets lost to a link error or an unsendable packet.
    pub tx_errors: u64,
    /// Packets given to `receive`.
    pub rx_packets: u64,
    /// Received packets dropped (wrong QP or P_Key, error state, stale or unexpected).
    pub rx_dropped: u64,
    /// Request packets retransmitted.
    pub retransmits: u64,
    /// Local ACK timeouts.
    pub timeouts: u64,
    /// Duplicate requests the responder saw.
    pub duplicates: u64,
    /// NAK PSN sequence errors sent.
    pub seq_naks_sent: u64,
    /// NAK PSN sequence errors received.
    pub seq_naks_received: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// ACKs (including coalesced) sent.
    pub acks_sent: u64,
    /// Received packets dropped because their IP addresses are not the path's (source not
    /// the peer's, destination not this QP's own): rxe's `check_addr`. Also in `rx_dropped`.
    pub rx_bad_addr: u64,
}

/// A posted receive work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWqe {
    /// The caller's identifier.
    pub wr_id: u64,
    /// Where the message goes.
    pub sges: SgeList,
}

/// The receive queue of a QP (or its SRQ).
pub trait RecvQueue {
    /// Takes the next posted receive WR, or `None` when none is posted (the responder
    /// then answers with an RNR NAK).
    fn take(&mut self) -> Option<RecvWqe>;

    /// Whether the queue is shared with other QPs (an SRQ): a QP that fails then flushes
    /// none of its WRs, which belong to every QP on it.
    fn shared(&self) -> bool {
        false
    }
}

/// Where completions go (the model writes CQEs).
pub trait CompletionSink {
    /// One completion, in the order the QP completes work requests.
    fn complete(&mut self, c: RcCompletion);
}

/// Time in nanoseconds from an arbitrary origin, never going back.
pub trait Clock {
    /// Now.
    fn now_ns(&self) -> u64;
    /// A time at most as old as the clock allows for timer starts, when it can be had
    /// without reading the clock (a reading cached for this pass, a manual clock); `None`
    /// when only [`now_ns`](Self::now_ns) would tell. The engine then starts its ACK
    /// timer at the next reading instead (its next `poll`), so a message that is answered
    /// within a pass or two costs no clock read for the timer (a read costs about as much
    /// as handling a small packet).
    fn cached_ns(&self) -> Option<u64> {
        None
    }
}

/// A clock that moves only when told: deterministic tests, scaled time.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock at `ns`.
    pub const fn new(ns: u64) -> Self {
        Self(AtomicU64::new(ns))
    }
    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    /// Always known: reading a manual clock costs nothing.
    fn cached_ns(&self) -> Option<u64> {
        Some(self.now_ns())
    }
}

/// The host's monotonic clock.
#[derive(Debug)]
pub struct MonotonicClock(std::time::Instant);

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

//! The GSI endpoint of port 1: QP1 with its own CQ and buffers, the transport of a MAD
//! layer (IBA Vol. 1 §13.5; docs/spec/mlx5-ib-objects.md §8).
//!
//! # API (stable)
//! - [`Device::open_gsi`]`(&pd, &GsiConfig) -> Result<Gsi, GsiError>`: creates the GSI QP
//!   (QP1, Q_Key [`GSI_QKEY`], MTU 256, P_Key index [`GsiConfig::pkey_index`]), one CQ for
//!   its sends and receives, and one memory region for its buffers; posts
//!   [`GsiConfig::recv_depth`] receive buffers of [`GRH_SIZE`] + [`MAD_SIZE`] bytes and
//!   moves the QP to RTS.
//! - [`Gsi::send`]`(&ah, mad, tag)`: sends a MAD (at most [`MAD_SIZE`] bytes) to the GSI
//!   QP (QPN [`GSI_QPN`], Q_Key [`GSI_QKEY`]) at [`Ah`]; [`Gsi::send_to`] to any QPN and
//!   Q_Key (a reply to a UD QP that is not QP1). The MAD is copied at once: the caller
//!   keeps its buffer. `tag` comes back in [`GsiEvent::Sent`]. [`GsiError::Busy`] when
//!   [`GsiConfig::send_depth`] sends are still outstanding: poll, then try again.
//! - [`Gsi::poll`]`() -> Result<Option<GsiEvent>, GsiError>`: the next event, without
//!   waiting; [`Gsi::wait`]`(timeout)` polls until one comes or `timeout` passes (spins
//!   briefly, then yields and sleeps; it never busy-waits a core for long). An event is
//!   [`GsiEvent::Received`] ([`GsiMad`]: the MAD bytes, who sent it ([`Grh`] with the
//!   source GID, source QPN, P_Key and its index), [`GsiEvent::Sent`] (a send's tag and
//!   status) or [`GsiEvent::RecvFailed`] (a receive completed in error; its buffer is
//!   posted again). Each receive buffer goes back to the QP as soon as its MAD is copied
//!   out (a flushed one waits for [`Gsi::restart`]).
//! - [`Gsi::counters`]: MADs sent, send errors, MADs received, receive errors.
//! - Replies: [`AhAttr::reply_to`](crate::resource::AhAttr::reply_to)`(&mad.grh, ...)`
//!   builds the handle back to a sender (its MAC: see `resource::ah`).
//!
//! Not here (the MAD layer's): MAD headers, transaction IDs, timeouts and retries; the
//! GSI QP is unreliable, so a lost MAD is the layer above's to send again. A send that
//! fails moves the QP to ERR (as on the device), after which every send and receive
//! completes flushed: [`Gsi::restart`] brings it back (or drop the `Gsi` and open it again).

#![deny(unsafe_code)]

use std::time::{Duration, Instant};

use super::ah::{Ah, Grh};
use super::cq::{Cq, CqConfig};
use super::mkey::{Access, MemError, Mr};
use super::qp::QpConfig;
use super::queue_error::QueueError;
use super::ud::{GRH_SIZE, GSI_QKEY, GSI_QPN, UdDest, UdQp, UdSendWr};
use crate::datapath::wr::{Local, SendFlags};
use uhca_layout::cqe::CqeSyndrome;

use crate::datapath::{NetHeader, PollError, PostError, Sge, WcOpcode, WcStatus};
use crate::device::DeviceError;
use crate::handle::Device;
use crate::resource::Pd;

// Bytes of a MAD, the most a GSI send carries: the layout's (`uhca_layout::mad`).
pub use uhca_layout::mad::MAD_SIZE;
/// Bytes of one receive buffer: the GRH area, then the MAD.
pub const GSI_RECV_SIZE: usize = GRH_SIZE + MAD_SIZE;

/// Sizes and the partition of a [`Gsi`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GsiConfig {
    /// Sends outstanding at most (each has a buffer of [`MAD_SIZE`] bytes).
    pub send_depth: u32,
    /// Receive buffers kept posted.
    pub recv_depth: u32,
    /// Index into port 1's P_Key table (0: the default partition).
    pub pkey_index: u16,
}

impl Default for GsiConfig {
    fn default() -> Self {
        GsiConfig {
            send_depth: 64,
            recv_depth: 64,
            pkey_index: 0,
        }
    }
}

/// Why a GSI operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GsiError {
    /// Creating or driving the QP or CQ failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The buffer region failed.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// Reading the port (P_Key table) failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Posting failed (device lost, QP in error).
    #[error(transparent)]
    Post(#[from] PostError),
    /// A malformed CQE (consumed and reported).
    #[error(transparent)]
    Poll(#[from] PollError),
    /// The MAD is longer than [`MAD_SIZE`].
    #[error("a MAD is at most 256 bytes, not {0}")]
    TooLong(usize),
    /// Every send buffer is in flight: poll for [`GsiEvent::Sent`] first.
    #[error("all {0} send buffers are in flight")]
    Busy(u32),
    /// A configuration value is out of range.
    #[error("invalid GSI configuration: {0}")]
    Config(&'static str),
    /// [`Gsi::restart`]: the device did not flush the outstanding work requests in time.
    #[error("the GSI QP's outstanding work requests were not flushed within {0:?}")]
    Stalled(Duration),
    /// A completion names a work request this endpoint never posted (device memory is
    /// untrusted); it was consumed and changed nothing.
    #[error("completion for a work request this GSI never posted (wr_id {0:#x})")]
    ForeignCompletion(u64),
}

/// A MAD received on the GSI QP, with who sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GsiMad {
    /// The MAD (the bytes after the GRH; [`len`](Self::len) of them are valid).
    pub data: Box<[u8; MAD_SIZE]>,
    /// Bytes received after the GRH.
    pub len: usize,
    /// The network header: the sender's GID (`grh.sgid`), ours (`grh.dgid`), traffic
    /// class, flow label, hop limit.
    pub grh: Grh,
    /// What the GRH area held.
    pub net: NetHeader,
    /// The sender's QPN (1 for a peer's GSI QP).
    pub src_qp: u32,
    /// The P_Key the datagram carried (BTH).
    pub pkey: u16,
    /// That P_Key's index in port 1's P_Key table (`ibv_wc.pkey_index`), `None` if it is
    /// not in the table.
    pub pkey_index: Option<u16>,
}

impl GsiMad {
    /// The MAD's bytes.
    pub fn mad(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

/// What [`Gsi::poll`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GsiEvent {
    /// A MAD arrived.
    Received(GsiMad),
    /// A send finished (on UD: left the port) or failed.
    Sent {
        /// The tag it was posted with.
        tag: u64,
        /// Its status.
        status: WcStatus,
    },
    /// A receive completed in error (a flush, or a datagram larger than its buffer); the
    /// buffer was posted again where the QP still takes receives.
    RecvFailed {
        /// Its status.
        status: WcStatus,
    },
}

/// Counters of one [`Gsi`] (since it was opened).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GsiCounters {
    /// MADs posted.
    pub sent: u64,
    /// Sends that completed in error.
    pub send_errors: u64,
    /// MADs received.
    pub received: u64,
    /// Receives that completed in error, or whose GRH could not be read.
    pub recv_errors: u64,
}

/// Port 1's GSI QP with its CQ and buffers (see the module docs).
#[derive(Debug)]
pub struct Gsi {
    qp: UdQp,
    cq: Cq,
    /// Receive buffers first (`recv_depth` × [`GSI_RECV_SIZE`]), then send buffers
    /// (`send_depth` × [`MAD_SIZE`]).
    mem: Mr,
    recv_depth: u32,
    send_depth: u32,
    /// Free send slots.
    free: Vec<u32>,
    /// The tag of each send slot in flight.
    tags: Vec<u64>,
    pkeys: Vec<u16>,
    pkey_index: u16,
    /// Receives posted and not yet completed.
    recv_out: u32,
    counters: GsiCounters,
}

/// How long [`Gsi::restart`] waits for the device to flush the outstanding work.
pub const RESTART_WAIT: Duration = Duration::from_secs(10);

/// `wr_id` of send slot `i` (receive slots are their index).
const SEND_BIT: u64 = 1 << 63;

impl Device {
    /// Opens port 1's GSI endpoint (see the module docs).
    pub fn open_gsi(&self, pd: &Pd, cfg: &GsiConfig) -> Result<Gsi, GsiError> {
        if cfg.send_depth == 0 || cfg.recv_depth == 0 {
            return Err(GsiError::Config(
                "send_depth and recv_depth must be at least 1",
            ));
        }
        if cfg.send_depth > 4096 || cfg.recv_depth > 4096 {
            return Err(GsiError::Config(
                "send_depth and recv_depth are at most 4096",
            ));
        }
        let pkeys = self.pkey_table()?;
        if pkeys.get(cfg.pkey_index as usize).copied().unwrap_or(0) & 0x7FFF == 0 {
            return Err(GsiError::Config("pkey_index names no valid P_Key"));
        }
        let cq = self.create_cq(&CqConfig {
            entries: cfg.send_depth + cfg.recv_depth,
            events: false,
        })?;
        let mut qp = self.create_gsi_qp(
            pd,
            &cq,
            &cq,
            &QpConfig {
                max_send_wr: cfg.send_depth,
                max_recv_wr: cfg.recv_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
            },
        )?;
        let bytes = cfg.recv_depth as usize * GSI_RECV_SIZE + cfg.send_depth as usize * MAD_SIZE;
        let mem = pd.alloc_mr(bytes, Access::LOCAL_WRITE)?;
        // Receives are posted in INIT, so none is missed once the QP is in RTR.
        qp.to_init(GSI_QKEY, cfg.pkey_index)?;
        for i in 0..cfg.recv_depth {
            let sge = recv_sge(&mem, i);
            qp.post_recv(u64::from(i), &[sge])?;
        }
        qp.to_rtr(None)?;
        qp.to_rts(0)?;
        Ok(Gsi {
            qp,
            cq,
            mem,
            recv_depth: cfg.recv_depth,
            send_depth: cfg.send_depth,
            free: (0..cfg.send_depth).rev().collect(),
            tags: vec![0; cfg.send_depth as usize],
            pkeys,
            pkey_index: cfg.pkey_index,
            recv_out: cfg.recv_depth,
            counters: GsiCounters::default(),
        })
    }
}

fn recv_sge(mem: &Mr, i: u32) -> Sge {
    Sge {
        addr: mem.addr() + (i as usize * GSI_RECV_SIZE) as u64,
        len: GSI_RECV_SIZE as u32,
        lkey: mem.lkey(),
    }
}

impl Gsi {
    /// The device's number of the GSI QP (on the wire it is [`GSI_QPN`]).
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// The GSI QP.
    pub fn qp(&self) -> &UdQp {
        &self.qp
    }

    /// Counters since the endpoint was opened.
    pub fn counters(&self) -> GsiCounters {
        self.counters
    }

    /// Port 1's P_Key table as read when the endpoint was opened.
    pub fn pkeys(&self) -> &[u16] {
        &self.pkeys
    }

    /// Sends `mad` to the GSI QP of the port at `ah` (QPN 1, Q_Key 0x80010000).
    pub fn send(&mut self, ah: &Ah, mad: &[u8], tag: u64) -> Result<(), GsiError> {
        self.send_to(ah, GSI_QPN, GSI_QKEY, mad, tag)
    }

    /// Sends `mad` to QP `remote_qpn` with Q_Key `qkey` at `ah`.
    pub fn send_to(
        &mut self,
        ah: &Ah,
        remote_qpn: u32,
        qkey: u32,
        mad: &[u8],
        tag: u64,
    ) -> Result<(), GsiError> {
        if mad.len() > MAD_SIZE {
            return Err(GsiError::TooLong(mad.len()));
        }
        let Some(&slot) = self.free.last() else {
            return Err(GsiError::Busy(self.send_depth));
        };
        let off = self.recv_depth as usize * GSI_RECV_SIZE + slot as usize * MAD_SIZE;
        self.mem.write(off, mad)?;
        let sge = Sge {
            addr: self.mem.addr() + off as u64,
            len: mad.len() as u32,
            lkey: self.mem.lkey(),
        };
        self.qp.post_send(&UdSendWr {
            wr_id: SEND_BIT | u64::from(slot),
            dest: UdDest {
                ah,
                remote_qpn,
                qkey,
            },
            local: Local::Sges(&[sge]),
            imm: None,
            flags: SendFlags::SIGNALED,
        })?;
        self.qp.ring_doorbell();
        self.free.pop();
        self.tags[slot as usize] = tag;
        self.counters.sent += 1;
        Ok(())
    }

    /// The next event, if one is there (see the module docs).
    pub fn poll(&mut self) -> Result<Option<GsiEvent>, GsiError> {
        let c = {
            let mut p = self.cq.poll();
            match p.next() {
                None => return Ok(None),
                Some(c) => c?,
            }
        };
        if c.opcode != WcOpcode::Recv {
            let slot = (c.wr_id & !SEND_BIT) as u32;
            if c.wr_id & SEND_BIT == 0 || slot >= self.send_depth {
                // Our own wr_ids only; the shadow checked the index already.
                return Err(GsiError::ForeignCompletion(c.wr_id));
            }
            self.free.push(slot);
            if !c.status.is_ok() {
                self.counters.send_errors += 1;
            }
            return Ok(Some(GsiEvent::Sent {
                tag: self.tags[slot as usize],
                status: c.status,
            }));
        }
        let slot = c.wr_id as u32;
        if c.wr_id >= u64::from(self.recv_depth) {
            return Err(GsiError::ForeignCompletion(c.wr_id));
        }
        self.recv_out = self.recv_out.saturating_sub(1);
        let event = self.take_mad(slot, &c);
        // The buffer goes back at once, unless the QP is in error: a flushed receive
        // posted again would only be flushed again ([`restart`](Self::restart) posts them).
        let flushed = matches!(
            c.status,
            WcStatus::Error {
                syndrome: CqeSyndrome::WrFlush,
                ..
            }
        );
        if !flushed {
            match self
                .qp
                .post_recv(u64::from(slot), &[recv_sge(&self.mem, slot)])
            {
                Ok(()) => self.recv_out += 1,
                Err(PostError::BadState) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Some(event))
    }

    /// Copies the MAD of receive slot `slot` out, as its completion `c` describes it.
    fn take_mad(&mut self, slot: u32, c: &crate::datapath::Completion) -> GsiEvent {
        let failed = |me: &mut Gsi, status| {
            me.counters.recv_errors += 1;
            GsiEvent::RecvFailed { status }
        };
        let (true, Some(d)) = (c.status.is_ok(), c.datagram) else {
            return failed(self, c.status);
        };
        let len = (c.byte_len as usize).saturating_sub(GRH_SIZE).min(MAD_SIZE);
        let mut buf = [0u8; GSI_RECV_SIZE];
        let base = slot as usize * GSI_RECV_SIZE;
        if self.mem.read(base, &mut buf).is_err() {
            return failed(self, c.status);
        }
        let Some(grh) = Grh::parse(&buf, d.net) else {
            return failed(self, c.status);
        };
        let mut data = Box::new([0u8; MAD_SIZE]);
        data[..len].copy_from_slice(&buf[GRH_SIZE..GRH_SIZE + len]);
        let pkey = d.pkey.unwrap_or(0xFFFF);
        let pkey_index = self
            .pkeys
            .iter()
            .position(|&k| k != 0 && k & 0x7FFF == pkey & 0x7FFF)
            .map(|i| i as u16);
        self.counters.received += 1;
        GsiEvent::Received(GsiMad {
            data,
            len,
            grh,
            net: d.net,
            src_qp: d.src_qp,
            pkey,
            pkey_index,
        })
    }

    /// Brings the endpoint back after its QP went to ERR (a failed send), or at any time:
    /// 2ERR flushes what is outstanding, the flushed completions are taken (waiting at
    /// most [`RESTART_WAIT`]), then 2RST and RST→INIT (receive buffers posted)→RTR→RTS as
    /// at [`Device::open_gsi`]. Returns the tags of the sends that were still in flight
    /// (they may or may not have left the port); events not yet polled are dropped.
    pub fn restart(&mut self) -> Result<Vec<u64>, GsiError> {
        self.qp.to_err()?;
        let deadline = Instant::now() + RESTART_WAIT;
        let mut lost = Vec::new();
        while (self.free.len() as u32) < self.send_depth || self.recv_out > 0 {
            let next = self.cq.poll().next();
            let Some(c) = next else {
                if Instant::now() > deadline {
                    return Err(GsiError::Stalled(RESTART_WAIT));
                }
                std::thread::yield_now();
                continue;
            };
            let c = c?;
            if c.opcode == WcOpcode::Recv {
                self.recv_out = self.recv_out.saturating_sub(1);
                continue;
            }
            let slot = (c.wr_id & !SEND_BIT) as u32;
            if c.wr_id & SEND_BIT == 0 || slot >= self.send_depth {
                return Err(GsiError::ForeignCompletion(c.wr_id));
            }
            if !self.free.contains(&slot) {
                self.free.push(slot);
                lost.push(self.tags[slot as usize]);
            }
        }
        self.qp.reset()?;
        self.qp.to_init(GSI_QKEY, self.pkey_index)?;
        for i in 0..self.recv_depth {
            self.qp.post_recv(u64::from(i), &[recv_sge(&self.mem, i)])?;
            self.recv_out += 1;
        }
        self.qp.to_rtr(None)?;
        self.qp.to_rts(0)?;
        Ok(lost)
    }

    /// Polls until an event comes or `timeout` passes (`Ok(None)`): spins a little, then
    /// yields, then sleeps in short steps.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<GsiEvent>, GsiError> {
        let deadline = Instant::now() + timeout;
        let mut round = 0u32;
        loop {
            if let Some(e) = self.poll()? {
                return Ok(Some(e));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            round += 1;
            match round {
                0..=64 => std::hint::spin_loop(),
                65..=256 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }
}

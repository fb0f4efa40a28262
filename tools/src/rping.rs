//! rping's protocol on a connected RC QP (`uhca-rping`): what rdma-core's `rping` client and
//! server do once RDMA CM has connected them (`docs/spec/rdma-cm-wire.md` §5, as captured
//! between two real soft-RoCE ends), so either end can be the real `rping`.
//!
//! Per ping the client SENDs an advertisement {address, rkey, size} of its source buffer
//! (`struct rping_rdma_info`: a big-endian u64 and two u32, 16 bytes); the server RDMA READs
//! that many bytes into its own buffer and SENDs a 16-byte "go ahead"; the client advertises
//! its sink buffer; the server RDMA WRITEs the text it read (up to its NUL) there and sends
//! "go ahead" again; the client compares source and sink (`-V`). The client disconnects after
//! `-C` pings; the server serves until the client is gone.
//!
//! Every wait here is bounded ([`Options::idle`]): a peer that stops answering ends the run
//! with an error, never a hang. A message of the wrong size, an advertisement larger than this
//! end's buffer, a failed work request or a mismatch ends it with a clear error.

use std::io::Write;
use std::time::{Duration, Instant};

use uhca::Device;
use uhca::datapath::{Completion, Remote, Sge, WcOpcode, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::resource::{Access, Cq, Local, Mr, Pd, Qp, SendFlags, SendOp, SendWr};

/// Bytes of rping's advertisement, `struct rping_rdma_info { __be64 buf; __be32 rkey; __be32
/// size; }`.
pub const INFO_LEN: usize = 16;

/// rping's smallest `-S`: `sizeof(stringify(INT_MAX)) + sizeof("rdma-ping-%d: ")` = 11 + 15.
pub const MIN_SIZE: usize = 26;

/// rping's largest `-S`: `RPING_BUFSIZE - 1`.
pub const MAX_SIZE: usize = 64 * 1024 - 1;

/// rping's default `-S`.
pub const DEFAULT_SIZE: usize = 64;

/// rping's default port (`-p`).
pub const DEFAULT_PORT: u16 = 7174;

/// Receives kept posted (rping posts one and reposts it; two leave room for a peer that
/// answers before this end has reposted).
const RECVS: u64 = 2;

/// What went wrong in a ping exchange.
#[derive(Debug, thiserror::Error)]
pub enum RpingError {
    /// Setting up memory failed.
    #[error("setup: {0}")]
    Setup(String),
    /// A work request could not be posted.
    #[error("posting {what}: {source}")]
    Post {
        /// What.
        what: &'static str,
        /// Why.
        #[source]
        source: uhca::datapath::PostError,
    },
    /// A work request completed in error (other than flushed by a disconnect).
    #[error("{what} failed: {status:?}")]
    Completion {
        /// Which request.
        what: &'static str,
        /// Its status.
        status: WcStatus,
    },
    /// A malformed CQE.
    #[error("bad CQE: {0}")]
    Poll(#[from] uhca::datapath::PollError),
    /// The peer sent a message that is not rping's 16-byte advertisement.
    #[error("received bogus data, size {0} (rping's messages are {INFO_LEN} bytes)")]
    Bogus(u32),
    /// The peer advertised more than this end's buffer holds.
    #[error(
        "the peer advertised {advertised} bytes, this end's buffer holds {ours} (give both ends the same -S)"
    )]
    TooLarge {
        /// The peer's size.
        advertised: u32,
        /// This end's `-S`.
        ours: usize,
    },
    /// `-V`: what came back differs from what was sent.
    #[error("data mismatch in ping {ping} at byte {at}")]
    Mismatch {
        /// The ping.
        ping: u64,
        /// The first byte that differs.
        at: usize,
    },
    /// The peer did not answer within [`Options::idle`].
    #[error("the peer sent nothing for {0:?} (waiting for {1})")]
    Timeout(Duration, &'static str),
    /// The connection went away (the peer disconnected) in the middle of a ping.
    #[error("disconnected while waiting for {0}")]
    Disconnected(&'static str),
    /// The device is lost.
    #[error("{0}")]
    Device(#[from] uhca::DeviceError),
    /// Printing failed.
    #[error("output: {0}")]
    Output(#[from] std::io::Error),
}

/// One end's settings (rping's flags).
#[derive(Clone, Debug)]
pub struct Options {
    /// Ping data size (`-S`), [`MIN_SIZE`]..=[`MAX_SIZE`].
    pub size: usize,
    /// Pings (`-C`); `None`: until stopped (client) or until the client leaves (server).
    pub count: Option<u64>,
    /// Print the ping data (`-v`).
    pub verbose: bool,
    /// Compare what came back with what was sent (`-V`, client).
    pub validate: bool,
    /// The longest wait for the peer's next message.
    pub idle: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            size: DEFAULT_SIZE,
            count: None,
            verbose: false,
            validate: false,
            idle: Duration::from_secs(60),
        }
    }
}

/// rping's advertisement of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    /// Its address.
    pub addr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its size.
    pub size: u32,
}

impl Info {
    /// The 16 bytes on the wire (network byte order).
    pub fn emit(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// From the 16 bytes on the wire.
    pub fn parse(b: &[u8; INFO_LEN]) -> Info {
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        Info {
            addr: u64::from_be_bytes(a),
            rkey: u32_at(8),
            size: u32_at(12),
        }
    }
}

/// The text of ping `ping` in a buffer of `size` bytes, as rping's client writes it:
/// `rdma-ping-N: ` then the letters from `A` + N mod 58 on, each the next byte from 65 to
/// 122 and around, the last byte 0.
pub fn ping_text(ping: u64, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{ping}: ").into_bytes();
    b.truncate(size.saturating_sub(1));
    let mut c = 65 + (ping % 58) as u8;
    while b.len() < size {
        b.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// The C string at the start of `b` (up to its first NUL), for printing.
fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

// Work request ids.
const WR_SEND: u64 = 1;
const WR_RDMA: u64 = 2;
const WR_RECV: u64 = 0x100;

/// One connected end: its QP and CQ (sends and receives), its memory.
pub struct Pinger<'a> {
    qp: &'a mut Qp,
    cq: &'a mut Cq,
    dev: &'a Device,
    opts: Options,
    /// Receive buffers, [`INFO_LEN`] bytes each.
    recv: Mr,
    /// The message this end sends.
    send: Mr,
    /// The sink: what the server READs into, what the server WRITEs to on the client.
    rdma: Mr,
    /// The client's source of each ping.
    start: Option<Mr>,
    /// Completions polled but not yet taken.
    queued: std::collections::VecDeque<Completion>,
    /// Receive completions taken but not yet handled.
    received: std::collections::VecDeque<Completion>,
}

/// What one end did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Pings completed.
    pub pings: u64,
    /// Bytes compared (`-V`, client).
    pub validated: u64,
}

impl<'a> Pinger<'a> {
    /// An end on the connected `qp` whose sends and receives complete on `cq`, with its
    /// buffers on `pd`; posts its receives. The client also gets its source buffer.
    pub fn new(
        dev: &'a Device,
        pd: &Pd,
        qp: &'a mut Qp,
        cq: &'a mut Cq,
        opts: Options,
        client: bool,
    ) -> Result<Pinger<'a>, RpingError> {
        if !(MIN_SIZE..=MAX_SIZE).contains(&opts.size) {
            return Err(RpingError::Setup(format!(
                "invalid size {} (valid range is {MIN_SIZE} to {MAX_SIZE})",
                opts.size
            )));
        }
        let rights = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let alloc = |len: usize, access, what: &str| {
            pd.alloc_mr(len, access)
                .map_err(|e| RpingError::Setup(format!("{what}: {e}")))
        };
        let mut p = Pinger {
            recv: alloc(
                INFO_LEN * RECVS as usize,
                Access::LOCAL_WRITE,
                "receive buffer",
            )?,
            send: alloc(INFO_LEN, Access::NONE, "send buffer")?,
            rdma: alloc(opts.size, rights, "RDMA buffer")?,
            start: if client {
                Some(alloc(opts.size, rights, "start buffer")?)
            } else {
                None
            },
            qp,
            cq,
            dev,
            opts,
            queued: Default::default(),
            received: Default::default(),
        };
        for k in 0..RECVS {
            p.post_recv(k)?;
        }
        Ok(p)
    }

    fn post_recv(&mut self, k: u64) -> Result<(), RpingError> {
        let sge = Sge::of(&self.recv, k as usize * INFO_LEN, INFO_LEN).expect("in the buffer");
        self.qp
            .post_recv(WR_RECV + k, &[sge])
            .map_err(|source| RpingError::Post {
                what: "a receive",
                source,
            })
    }

    fn post(&mut self, wr: &SendWr<'_>, what: &'static str) -> Result<(), RpingError> {
        self.qp
            .post_send(wr)
            .map_err(|source| RpingError::Post { what, source })?;
        self.qp.ring_doorbell();
        Ok(())
    }

    /// SENDs `msg` (16 bytes) and waits for its completion.
    fn send_msg(&mut self, msg: &[u8; INFO_LEN]) -> Result<(), RpingError> {
        self.send
            .write(0, msg)
            .map_err(|e| RpingError::Setup(format!("send buffer: {e}")))?;
        let sge = [Sge::of(&self.send, 0, INFO_LEN).expect("in the buffer")];
        self.post(
            &SendWr {
                wr_id: WR_SEND,
                op: SendOp::Send {
                    local: Local::Sges(&sge),
                },
                flags: SendFlags::SIGNALED,
            },
            "a SEND",
        )?;
        self.wait_send(WR_SEND, "the completion of a SEND")
            .map(drop)
    }

    /// The next completion, polled within [`Options::idle`]; a flushed request means the
    /// connection is gone.
    fn next(&mut self, what: &'static str) -> Result<Completion, RpingError> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(c) = self.queued.pop_front() {
                return match c.status {
                    WcStatus::Success => Ok(c),
                    WcStatus::Error {
                        syndrome: CqeSyndrome::WrFlush,
                        ..
                    } => Err(RpingError::Disconnected(what)),
                    status => Err(RpingError::Completion { what, status }),
                };
            }
            for c in self.cq.poll() {
                self.queued.push_back(c?);
            }
            if !self.queued.is_empty() {
                continue;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
                self.dev.check_health()?;
                if start.elapsed() > self.opts.idle {
                    return Err(RpingError::Timeout(self.opts.idle, what));
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Waits for the send request `wr_id`, keeping receives that come first.
    fn wait_send(&mut self, wr_id: u64, what: &'static str) -> Result<Completion, RpingError> {
        loop {
            let c = self.next(what)?;
            if c.wr_id == wr_id && !matches!(c.opcode, WcOpcode::Recv) {
                return Ok(c);
            }
            if c.opcode == WcOpcode::Recv {
                self.received.push_back(c);
            }
        }
    }

    /// Waits for the peer's next message (16 bytes), reposts its receive and returns it.
    fn recv_msg(&mut self, what: &'static str) -> Result<[u8; INFO_LEN], RpingError> {
        let c = match self.received.pop_front() {
            Some(c) => c,
            None => loop {
                let c = self.next(what)?;
                if c.opcode == WcOpcode::Recv {
                    break c;
                }
            },
        };
        if c.byte_len as usize != INFO_LEN {
            return Err(RpingError::Bogus(c.byte_len));
        }
        let k = c.wr_id.wrapping_sub(WR_RECV);
        if k >= RECVS {
            return Err(RpingError::Setup(format!(
                "a receive completion with an unknown id {:#x}",
                c.wr_id
            )));
        }
        let mut b = [0u8; INFO_LEN];
        self.recv
            .read(k as usize * INFO_LEN, &mut b)
            .map_err(|e| RpingError::Setup(format!("receive buffer: {e}")))?;
        self.post_recv(k)?;
        Ok(b)
    }

    /// The server's side: serves pings until the client disconnects (the connection's
    /// requests are flushed, or `gone` says so while this end waits), or after `-C` pings.
    /// Prints `server ping data: ...` per ping with `-v`.
    pub fn serve(
        &mut self,
        out: &mut dyn Write,
        gone: &mut dyn FnMut() -> bool,
    ) -> Result<Summary, RpingError> {
        let mut sum = Summary::default();
        loop {
            if self.opts.count.is_some_and(|c| sum.pings >= c) {
                return Ok(sum);
            }
            // The client's source advertisement, or its departure.
            let adv = match self.recv_or_gone("the client's next ping", gone)? {
                Some(b) => Info::parse(&b),
                None => return Ok(sum),
            };
            let len = self.fits(adv)?;
            let sge = [Sge::of(&self.rdma, 0, len).expect("fits")];
            self.post(
                &SendWr {
                    wr_id: WR_RDMA,
                    op: SendOp::Read {
                        local: &sge,
                        remote: Remote {
                            addr: adv.addr,
                            rkey: adv.rkey,
                        },
                    },
                    flags: SendFlags::SIGNALED,
                },
                "an RDMA READ",
            )?;
            self.wait_send(WR_RDMA, "the RDMA READ of the ping data")?;
            let mut data = vec![0u8; len];
            self.rdma
                .read(0, &mut data)
                .map_err(|e| RpingError::Setup(format!("RDMA buffer: {e}")))?;
            if self.opts.verbose {
                writeln!(out, "server ping data: {}", c_str(&data))?;
            }
            // rping's go-ahead is its never-filled send buffer: 16 zero bytes.
            self.send_msg(&[0; INFO_LEN])?;
            let sink = Info::parse(&self.recv_msg("the client's sink advertisement")?);
            // rping writes back `strlen + 1` bytes of what it read.
            let text = data.iter().position(|&c| c == 0).map_or(len, |n| n + 1);
            let back = text.min(sink.size as usize);
            let sge = [Sge::of(&self.rdma, 0, back).expect("fits")];
            self.post(
                &SendWr {
                    wr_id: WR_RDMA,
                    op: SendOp::Write {
                        local: Local::Sges(&sge),
                        remote: Remote {
                            addr: sink.addr,
                            rkey: sink.rkey,
                        },
                    },
                    flags: SendFlags::SIGNALED,
                },
                "an RDMA WRITE",
            )?;
            self.wait_send(WR_RDMA, "the RDMA WRITE of the echo")?;
            self.send_msg(&[0; INFO_LEN])?;
            sum.pings += 1;
        }
    }

    /// The next message, or `None` when the peer disconnected first.
    fn recv_or_gone(
        &mut self,
        what: &'static str,
        gone: &mut dyn FnMut() -> bool,
    ) -> Result<Option<[u8; INFO_LEN]>, RpingError> {
        let start = Instant::now();
        loop {
            let idle = self.opts.idle;
            // Short slices, so a disconnect seen by `gone` ends the wait.
            self.opts.idle = Duration::from_millis(100);
            let r = self.recv_msg(what);
            self.opts.idle = idle;
            match r {
                Ok(b) => return Ok(Some(b)),
                Err(RpingError::Disconnected(_)) => return Ok(None),
                Err(RpingError::Timeout(..)) => {
                    if gone() {
                        return Ok(None);
                    }
                    if start.elapsed() > idle {
                        return Err(RpingError::Timeout(idle, what));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The bytes of an advertisement this end's buffer takes.
    fn fits(&self, adv: Info) -> Result<usize, RpingError> {
        let len = adv.size as usize;
        if len > self.opts.size {
            return Err(RpingError::TooLarge {
                advertised: adv.size,
                ours: self.opts.size,
            });
        }
        Ok(len)
    }

    /// The client's side: `-C` pings (or until `stop` says so), each validated with `-V`
    /// and printed (`ping data: ...`) with `-v`. The caller disconnects afterwards.
    pub fn ping(
        &mut self,
        out: &mut dyn Write,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Summary, RpingError> {
        let size = self.opts.size;
        let start = self.start.as_ref().expect("a client has a start buffer");
        let source = Info {
            addr: start.addr(),
            rkey: start.rkey(),
            size: size as u32,
        };
        let sink = Info {
            addr: self.rdma.addr(),
            rkey: self.rdma.rkey(),
            size: size as u32,
        };
        let mut sum = Summary::default();
        let mut ping = 0u64;
        while self.opts.count.is_none_or(|c| ping < c) && !stop() {
            let text = ping_text(ping, size);
            let setup = |e: uhca::resource::MemError| RpingError::Setup(format!("buffers: {e}"));
            self.start
                .as_ref()
                .expect("client")
                .write(0, &text)
                .map_err(setup)?;
            // The sink starts empty, so `-V` sees the server's WRITE and not an old ping.
            self.rdma.write(0, &vec![0; size]).map_err(setup)?;
            self.send_msg(&source.emit())?;
            self.recv_msg("the server's go-ahead after its RDMA READ")?;
            self.send_msg(&sink.emit())?;
            self.recv_msg("the server's go-ahead after its RDMA WRITE")?;
            let mut back = vec![0u8; size];
            self.rdma.read(0, &mut back).map_err(setup)?;
            if self.opts.validate {
                if let Some(at) = text.iter().zip(&back).position(|(a, b)| a != b) {
                    return Err(RpingError::Mismatch { ping, at });
                }
                sum.validated += size as u64;
            }
            if self.opts.verbose {
                writeln!(out, "ping data: {}", c_str(&back))?;
            }
            ping += 1;
            sum.pings = ping;
        }
        Ok(sum)
    }
}

#[cfg(test)]
mod tests;

//! perftest's `-R` (rdma_cm) mode for `uhca-perf -R`: what `ib_write_bw -R` and its siblings
//! do instead of TCP (`docs/spec/rdma-cm-wire.md` §6, as captured between two real soft-RoCE
//! ends).
//!
//! With `-R` perftest connects two RC QPs by rdma_cm, one after the other, to the same port:
//! first a control QP that carries perftest's whole out-of-band exchange (version, cycle
//! buffer, cache line, MTU, keys, reports; each message one SEND, received into a 56-byte
//! buffer), then the test QPs. [`QpLink`] is the control QP as a [`MsgLink`] for
//! [`Oob::over`](super::perftest::Oob::over); a [`QpConnector`] connects the test QPs
//! between two meetings of zeroed keys
//! ([`Bench::connect_perftest_with`](super::Bench::connect_perftest_with)). The keys' QPNs and
//! PSNs are then only printed; what the peer uses of them is the buffer's address and rkey.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uhca::Device;
use uhca::cm::transport::ip_gid;
use uhca::cm::{
    AcceptOptions, Cm, CmConfig, CmError, CmQp, ConnId, ConnectOptions, Connection, GsiTransport,
    InMad, MadAddr, MadTransport, TransportError, UNRESOLVED_MAC,
};
use uhca::datapath::{Local, SendFlags, SendOp, SendWr};
use uhca::datapath::{Sge, WcOpcode, WcStatus};
use uhca::hw::layout::cm::CmMessage;
use uhca::hw::layout::cm::RejReason;
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::hw::layout::mad::MAD_SIZE;
use uhca::resource::{
    Access, ConnectParams, Cq, CqConfig, GsiConfig, Mr, Mtu, Pd, Qp, QpConfig, QueueError,
};

use super::PerfError;
use super::perftest::{KEYS_BIN_LEN, MsgLink};
use super::role::Role;

/// The largest message on the control QP: perftest receives into one
/// `struct pingpong_dest` (`post_one_recv_wqe`).
pub const MAX_MSG: usize = KEYS_BIN_LEN;

/// Receives kept posted on the control QP (perftest posts one and reposts it).
const RECVS: usize = 2;

const WR_SEND: u64 = 1;
const WR_RECV: u64 = 0x100;

/// Connects this end's test QPs by rdma_cm, as perftest's `create_rdma_cm_connection`: the
/// client connects each QP to the server's port, the server listens on it and accepts one
/// connect request per QP. `resources` is the responder resources and initiator depth to
/// ask for (perftest: its outstanding reads for READ and atomic tests, else 0), `mtu` the
/// path MTU the two agreed. On return every QP is in RTS.
pub trait QpConnector {
    /// Connects `qps`.
    fn connect(&mut self, qps: &mut [Qp], resources: u8, mtu: Mtu) -> Result<(), PerfError>;

    /// Called before the meeting that precedes [`connect`](Self::connect): a server
    /// listens here, so that a client which connects as soon as the meeting is over never
    /// finds the port closed.
    fn prepare(&mut self) -> Result<(), PerfError> {
        Ok(())
    }
}

/// perftest's control QP (`-R`): an RC QP connected by rdma_cm whose SENDs carry the
/// exchange, as a [`MsgLink`].
pub struct QpLink {
    qp: Qp,
    cq: Cq,
    dev: Device,
    recv: Mr,
    send: Mr,
    /// Receive completions taken while waiting for a send.
    received: VecDeque<(u64, u32)>,
    /// Whether the link is gone (a flushed or failed request).
    broken: bool,
}

fn reset(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, what.to_owned())
}

impl QpLink {
    /// The link on `qp` (connected, in RTS), whose sends and receives complete on `cq`; its
    /// buffers on `pd`. Posts the receives.
    pub fn new(dev: &Device, pd: &Pd, qp: Qp, cq: Cq) -> Result<QpLink, PerfError> {
        let mr = |len, access| {
            pd.alloc_mr(len, access)
                .map_err(|e| PerfError::Setup(format!("control QP buffer: {e}")))
        };
        let mut l = QpLink {
            recv: mr(MAX_MSG * RECVS, Access::LOCAL_WRITE)?,
            send: mr(MAX_MSG, Access::NONE)?,
            qp,
            cq,
            dev: dev.clone(),
            received: VecDeque::new(),
            broken: false,
        };
        for k in 0..RECVS {
            l.post_recv(k)
                .map_err(|e| PerfError::Setup(e.to_string()))?;
        }
        Ok(l)
    }

    /// The QP (to disconnect it).
    pub fn qp_mut(&mut self) -> &mut Qp {
        &mut self.qp
    }

    fn post_recv(&mut self, k: usize) -> io::Result<()> {
        let sge = Sge::of(&self.recv, k * MAX_MSG, MAX_MSG).expect("in the buffer");
        self.qp
            .post_recv(WR_RECV + k as u64, &[sge])
            .map_err(|e| io::Error::other(format!("posting a receive: {e}")))
    }

    /// Polls once; receive completions are queued, a send completion returned. An error
    /// status breaks the link.
    fn poll(&mut self) -> io::Result<bool> {
        let mut sent = false;
        let mut err = None;
        for c in self.cq.poll() {
            let c = c.map_err(|e| io::Error::other(format!("bad CQE: {e}")))?;
            match c.status {
                WcStatus::Success if c.opcode == WcOpcode::Recv => {
                    self.received.push_back((c.wr_id, c.byte_len));
                }
                WcStatus::Success => sent |= c.wr_id == WR_SEND,
                WcStatus::Error {
                    syndrome: CqeSyndrome::WrFlush,
                    ..
                } => err = Some(reset("the control QP was disconnected")),
                s => {
                    err = Some(io::Error::other(format!(
                        "a request on the control QP failed: {s:?}"
                    )))
                }
            }
        }
        if let Some(e) = err {
            self.broken = true;
            return Err(e);
        }
        Ok(sent)
    }

    /// Spins until `done` or `timeout`, with the device's health checked.
    fn spin(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&mut QpLink) -> io::Result<bool>,
    ) -> io::Result<bool> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if done(self)? {
                return Ok(true);
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                std::thread::yield_now();
                self.dev.check_health().map_err(io::Error::other)?;
                if start.elapsed() >= timeout {
                    return Ok(false);
                }
            }
            std::hint::spin_loop();
        }
    }
}

/// How long a SEND on the control QP may take to complete (RNR retries included: the peer
/// may be slow to repost).
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

impl MsgLink for QpLink {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        if self.broken {
            return Err(reset("the control QP is gone"));
        }
        if msg.len() > MAX_MSG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} bytes: perftest receives at most {MAX_MSG}", msg.len()),
            ));
        }
        self.send
            .write(0, msg)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let sge = [Sge::of(&self.send, 0, msg.len()).expect("fits")];
        self.qp
            .post_send(&SendWr {
                wr_id: WR_SEND,
                op: SendOp::Send {
                    local: Local::Sges(&sge),
                },
                flags: SendFlags::SIGNALED,
            })
            .map_err(|e| io::Error::other(format!("posting a SEND: {e}")))?;
        self.qp.ring_doorbell();
        if self.spin(SEND_TIMEOUT, |l| l.poll())? {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "a SEND on the control QP did not complete",
            ))
        }
    }

    fn recv(&mut self, timeout: Duration) -> io::Result<Option<Vec<u8>>> {
        if self.received.is_empty() && !self.broken {
            self.spin(timeout, |l| {
                l.poll()?;
                Ok(!l.received.is_empty())
            })?;
        }
        let Some((wr_id, len)) = self.received.pop_front() else {
            return if self.broken {
                Err(reset("the control QP is gone"))
            } else {
                Ok(None)
            };
        };
        let k = wr_id.wrapping_sub(WR_RECV) as usize;
        if k >= RECVS || len as usize > MAX_MSG {
            self.broken = true;
            return Err(io::Error::other(format!(
                "a receive completion on the control QP with id {wr_id:#x}, {len} bytes"
            )));
        }
        let mut b = vec![0u8; len as usize];
        self.recv
            .read(k * MAX_MSG, &mut b)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.post_recv(k)?;
        Ok(Some(b))
    }
}

/// The starting PSNs of the REQs a CM sent and received, by the requester's QPN and GID
/// (what [`Snoop`] saw, what [`PsnFix`] needs).
pub type ReqPsns = Arc<Mutex<HashMap<(u32, [u8; 16]), u32>>>;

/// A MAD transport that notes the starting PSN of every REQ through it (sent or received).
pub struct Snoop<T> {
    inner: T,
    reqs: ReqPsns,
}

impl<T: MadTransport> Snoop<T> {
    /// Wraps `inner`; the REQs' PSNs go to `reqs`.
    pub fn new(inner: T, reqs: ReqPsns) -> Snoop<T> {
        Snoop { inner, reqs }
    }

    fn note(&self, mad: &[u8]) {
        if let Ok((_, CmMessage::Req(r))) = CmMessage::parse(mad) {
            let mut m = self.reqs.lock().unwrap_or_else(|e| e.into_inner());
            // A CM talks to few peers; forget the old ones beyond that.
            if m.len() >= 1024 {
                m.clear();
            }
            m.insert((r.local_qpn, r.primary.local_gid), r.starting_psn);
        }
    }
}

impl<T: MadTransport> MadTransport for Snoop<T> {
    fn send(&mut self, to: &MadAddr, mad: &[u8; MAD_SIZE]) -> Result<(), TransportError> {
        self.note(mad);
        self.inner.send(to, mad)
    }
    fn recv(&mut self) -> Result<Option<InMad>, TransportError> {
        let m = self.inner.recv()?;
        if let Some(m) = &m {
            self.note(&m.data[..m.len.min(MAD_SIZE)]);
        }
        Ok(m)
    }
    fn wait(&mut self, timeout: Duration) {
        self.inner.wait(timeout)
    }
    fn now(&self) -> Duration {
        self.inner.now()
    }
    fn local(&self) -> MadAddr {
        self.inner.local()
    }
}

/// A QP the CM connects with the PSNs as Linux's CM uses them
/// (`docs/spec/rdma-cm-wire.md` §2, seen on the wire between two soft-RoCE ends): the
/// REQ's starting PSN is what the **passive** side sends with and the active side expects,
/// the REP's the reverse. The CM (`uhca::cm`) first programmed them the other way round,
/// which worked between two uhca ends but not against Linux, and now does it right; this
/// wrapper puts the REQ's PSN where it belongs (and the CM's other PSN, the REP's, in the
/// other place) whichever way the CM hands them over, so with today's CM it changes
/// nothing, and it keeps the tools right against a CM that swaps them.
pub struct PsnFix<'a> {
    qp: &'a mut Qp,
    reqs: ReqPsns,
    /// This end's GID (the requester's, on the active side).
    gid: [u8; 16],
    passive: bool,
}

impl<'a> PsnFix<'a> {
    /// `qp`, to be connected by the active side (`passive` false, from the port's `gid`)
    /// or the passive side.
    pub fn new(qp: &'a mut Qp, reqs: &ReqPsns, gid: [u8; 16], passive: bool) -> PsnFix<'a> {
        PsnFix {
            qp,
            reqs: reqs.clone(),
            gid,
            passive,
        }
    }
}

impl CmQp for PsnFix<'_> {
    fn qpn(&self) -> u32 {
        self.qp.qpn()
    }
    fn connect_qp(&mut self, p: &ConnectParams) -> Result<(), QueueError> {
        let key = if self.passive {
            (p.remote_qpn, p.remote_gid)
        } else {
            (self.qp.qpn(), self.gid)
        };
        let req = self
            .reqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied();
        let mut q = *p;
        if let Some(req) = req {
            // The REP's PSN: the one of the two that is not the REQ's.
            let rep = if p.sq_psn == req { p.rq_psn } else { p.sq_psn };
            (q.sq_psn, q.rq_psn) = if self.passive { (req, rep) } else { (rep, req) };
        }
        self.qp.connect(&q)
    }
    fn disconnect_qp(&mut self) -> Result<(), QueueError> {
        self.qp.to_err()
    }
}

/// Opens the CM on `dev`'s GSI QP (on `pd`): it sends from the GID of `local` when given
/// (a server's bind address), else from the first GID of the family of `v4` (IPv4-mapped
/// for an IPv4 peer, as perftest and rdma_cm pick); `mtu` is the path MTU it asks for and
/// accepts at most. Returns the CM, that GID index and the REQs' PSNs.
pub fn open_cm(
    dev: &Device,
    pd: &Pd,
    local: Option<IpAddr>,
    v4: bool,
    mtu: Mtu,
) -> Result<(Cm<Snoop<GsiTransport>>, u8, ReqPsns), String> {
    let x = match local.filter(|ip| !ip.is_unspecified()) {
        Some(ip) => {
            let gid = ip_gid(ip);
            (0..16u8)
                .find(|&i| dev.roce_address(u32::from(i)).is_ok_and(|a| a.gid == gid))
                .ok_or_else(|| format!("{ip} is not an address of the device's port"))?
        }
        None => super::gid::gid_of_kind(dev, v4),
    };
    let cfg = CmConfig {
        sgid_index: x,
        mtu,
        ..CmConfig::default()
    };
    let open = |e: &dyn std::fmt::Display| format!("opening the CM on QP1: {e}");
    let gsi = dev
        .open_gsi(pd, &GsiConfig::default())
        .map_err(|e| open(&e))?;
    let t = GsiTransport::new(dev, gsi, x).map_err(|e| open(&e))?;
    let reqs = ReqPsns::default();
    Ok((Cm::new(Snoop::new(t, reqs.clone()), cfg), x, reqs))
}

/// How often a connect rejected as a stale connection is tried again, a second apart.
pub const STALE_TRIES: u32 = 30;

/// How often a test QP's connect that meets a port nobody listens on (REJ reason 8) is
/// tried again, and the pause between tries (perftest's `rdma_cm_client_connection`:
/// 10 tries, 100 ms apart; more here, for a server slowed down by TCG).
pub const NO_LISTENER_TRIES: u32 = 100;
const NO_LISTENER_PAUSE: Duration = Duration::from_millis(100);

/// [`Cm::connect`], tried again while the peer rejects the REQ as a stale connection
/// (reason 10), and, when `no_listener` is true, while it rejects it because nobody listens
/// on the port (reason 8). A peer keeps a connection's QPN in "time wait" for a while after
/// it ended (Linux: `cm_match_req` rejects a REQ from a QPN it still holds, and disconnects
/// the old connection). A perftest `-R` server listens for its test QPs only after it
/// answered the meeting before them, so a client that connects as soon as it has the
/// answer may come too early (docs/spec/rdma-cm-wire.md §6, §8). Each try is a new REQ on
/// the same QP (a rejected REQ leaves the QP as it was); the CM keeps answering the wire
/// between tries. Bounded: [`STALE_TRIES`], [`NO_LISTENER_TRIES`].
pub fn connect_fresh<T: MadTransport, Q: CmQp>(
    cm: &mut Cm<T>,
    qp: &mut Q,
    dst: SocketAddr,
    opts: &ConnectOptions<'_>,
    no_listener: bool,
) -> Result<Connection, CmError> {
    let (mut stale, mut absent) = (0, 0);
    loop {
        match cm.connect(qp, dst, opts) {
            Err(CmError::Rejected {
                reason: RejReason::StaleConn,
                ..
            }) if stale < STALE_TRIES => {
                stale += 1;
                cm.pause(Duration::from_secs(1))?;
            }
            Err(CmError::Rejected {
                reason: RejReason::InvalidServiceId,
                ..
            }) if no_listener && absent < NO_LISTENER_TRIES => {
                absent += 1;
                cm.pause(NO_LISTENER_PAUSE)?;
            }
            r => return r,
        }
    }
}

/// How long a server waits for its client's connect request (perftest waits forever;
/// bounded here).
pub const ACCEPT_WAIT: Duration = Duration::from_secs(600);

/// How long a step of a connection (REP, RTU, DREP) may take.
const STEP_WAIT: Duration = Duration::from_secs(30);

/// A QP the CM is done with: disconnecting moves nothing (the QP itself is destroyed with
/// its owner right after), it only sends the DREQ.
struct Detached(u32);

impl CmQp for Detached {
    fn qpn(&self) -> u32 {
        self.0
    }
    fn connect_qp(&mut self, _: &ConnectParams) -> Result<(), QueueError> {
        Err(QueueError::Config("a detached QP connects nothing"))
    }
    fn disconnect_qp(&mut self) -> Result<(), QueueError> {
        Ok(())
    }
}

fn cm_err(what: &'static str) -> impl Fn(CmError) -> PerfError {
    move |e| PerfError::Setup(format!("rdma_cm, {what}: {e}"))
}

/// One end of a perftest `-R` run: the CM, the port the two meet on, the peer (client), and
/// the connections made (the control connection first).
pub struct CmSession<T: MadTransport> {
    cm: Cm<T>,
    role: Role,
    /// The server's address (client) or the port's address (server), with the port.
    addr: SocketAddr,
    conns: Vec<(ConnId, u32)>,
    /// The MAC a client's QPs send to (`ConnectOptions::peer_mac`).
    peer_mac: [u8; 6],
    /// The REQs' PSNs ([`PsnFix`]) and this end's GID.
    reqs: ReqPsns,
    gid: [u8; 16],
    /// Whether a server listens on its port now.
    listening: bool,
}

impl<T: MadTransport> CmSession<T> {
    /// A session on `cm`: a client connects to `addr`, a server listens on `addr`'s port.
    /// `reqs` is what the CM's transport notes of the REQs ([`Snoop`]).
    pub fn new(cm: Cm<T>, role: Role, addr: SocketAddr, reqs: ReqPsns) -> CmSession<T> {
        let gid = cm.transport().local().gid;
        CmSession {
            cm,
            role,
            addr,
            conns: Vec::new(),
            peer_mac: UNRESOLVED_MAC,
            reqs,
            gid,
            listening: false,
        }
    }

    /// The server's MAC, where the link needs it (a model port in loopback; the model's
    /// network port sends by IP address and takes any).
    pub fn set_peer_mac(&mut self, mac: [u8; 6]) {
        self.peer_mac = mac;
    }

    /// The CM.
    pub fn cm(&mut self) -> &mut Cm<T> {
        &mut self.cm
    }

    /// Connects (client) or accepts (server) one QP with `resources` outstanding reads each
    /// way, as perftest's `rdma_client_connect` / `rdma_server_connect`.
    /// `test`: a test QP (its connect is tried again while the server does not listen yet).
    fn connect_one(&mut self, qp: &mut Qp, resources: u8, test: bool) -> Result<(), PerfError> {
        let id = match self.role {
            Role::Client => {
                let opts = ConnectOptions {
                    responder_resources: resources,
                    initiator_depth: resources,
                    peer_mac: self.peer_mac,
                    ..ConnectOptions::default()
                };
                let mut q = PsnFix::new(qp, &self.reqs, self.gid, false);
                let what = if test {
                    "connecting a test QP"
                } else {
                    "connecting"
                };
                connect_fresh(&mut self.cm, &mut q, self.addr, &opts, test)
                    .map_err(cm_err(what))?
                    .id
            }
            Role::Server => {
                let req = self
                    .cm
                    .get_request(ACCEPT_WAIT)
                    .map_err(cm_err("waiting for the client"))?;
                let opts = AcceptOptions {
                    responder_resources: resources,
                    initiator_depth: resources,
                    ..AcceptOptions::default()
                };
                let mut q = PsnFix::new(qp, &self.reqs, self.gid, true);
                let c = self
                    .cm
                    .accept(&req, &mut q, &opts)
                    .map_err(cm_err("accepting"))?;
                c.id
            }
        };
        self.conns.push((id, qp.qpn()));
        Ok(())
    }

    /// Waits for the RTU of the last connection (server); the QP already takes traffic.
    fn established(&mut self) -> Result<(), PerfError> {
        if let (Role::Server, Some(&(id, _))) = (self.role, self.conns.last()) {
            self.cm
                .wait_established(id, STEP_WAIT)
                .map_err(cm_err("waiting for the RTU"))?;
        }
        Ok(())
    }

    /// The control connection: a new RC QP and CQ on `dev`/`pd`, connected (the server
    /// listens for it, accepts one request and stops listening, as perftest), as a
    /// [`QpLink`].
    pub fn control(&mut self, dev: &Device, pd: &Pd) -> Result<QpLink, PerfError> {
        let cq = dev
            .create_cq(&CqConfig {
                entries: 16,
                events: false,
            })
            .map_err(|e| PerfError::Setup(format!("control CQ: {e}")))?;
        let cfg = QpConfig {
            max_send_wr: 4,
            max_recv_wr: 4,
            ..QpConfig::default()
        };
        let mut qp = dev
            .create_qp(pd, &cq, &cq, &cfg)
            .map_err(|e| PerfError::Setup(format!("control QP: {e}")))?;
        self.listen()?;
        let r = self.connect_one(&mut qp, 0, false);
        self.unlisten();
        r?;
        let link = QpLink::new(dev, pd, qp, cq)?;
        self.established()?;
        Ok(link)
    }

    /// Ends every connection, test QPs first: the side that finished sends its DREQs and
    /// waits (bounded) for the DREPs; a DREQ the peer sent first is answered by the CM.
    /// The QPs themselves go with their owners.
    pub fn finish(&mut self) -> Result<(), PerfError> {
        let conns: Vec<(ConnId, u32)> = self.conns.drain(..).rev().collect();
        let mut first = None;
        for (id, qpn) in conns {
            let r = self
                .cm
                .disconnect(id, &mut Detached(qpn))
                .and_then(|()| self.cm.wait_disconnected(id, STEP_WAIT));
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        linger(&mut self.cm);
        match first {
            None | Some(CmError::UnknownConnection(_)) => Ok(()),
            Some(e) => Err(cm_err("disconnecting")(e)),
        }
    }
}

/// How long a CM stays to answer after its connections ended: the peer's own DREQ (a
/// simultaneous disconnect) or a resent one whose DREP was lost would otherwise meet a closed
/// port, and the peer would hold the connection through all its resends.
pub const LINGER: Duration = Duration::from_millis(500);

/// Keeps answering the CM's MADs for [`LINGER`] (the events are of no interest any more).
pub fn linger<T: MadTransport>(cm: &mut Cm<T>) {
    let end = Instant::now() + LINGER;
    while Instant::now() < end {
        match cm.poll() {
            Ok(Some(_)) => {}
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break,
        }
    }
}

impl<T: MadTransport> CmSession<T> {
    /// A server listens on its port (once).
    fn listen(&mut self) -> Result<(), PerfError> {
        if self.role == Role::Server && !self.listening {
            self.cm
                .listen(self.addr.port())
                .map_err(cm_err("listening"))?;
            self.listening = true;
        }
        Ok(())
    }

    /// A server stops listening.
    fn unlisten(&mut self) {
        if self.listening {
            self.cm.unlisten(self.addr.port());
            self.listening = false;
        }
    }
}

impl<T: MadTransport> QpConnector for CmSession<T> {
    fn prepare(&mut self) -> Result<(), PerfError> {
        self.listen()
    }

    fn connect(&mut self, qps: &mut [Qp], resources: u8, _mtu: Mtu) -> Result<(), PerfError> {
        self.listen()?;
        let mut r = Ok(());
        for qp in qps.iter_mut() {
            r = self
                .connect_one(qp, resources, true)
                .and_then(|()| self.established());
            if r.is_err() {
                break;
            }
        }
        self.unlisten();
        r
    }
}

#[cfg(test)]
mod tests;

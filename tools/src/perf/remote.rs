//! Client/server runs, as perftest's: this process is one end, its peer another process,
//! perhaps on another machine, reached over TCP (the messages are [`super::control`]'s).
//!
//! The client drives every test. For `*_bw` WRITE, READ and atomics and for `read_lat` and
//! `atomic_lat` the server is passive: its memory is the target, and it waits for the
//! client's DONE. For `send_bw` the server keeps receives posted and counts them; for
//! `write_lat` and `send_lat` it is the other half of the ping-pong. With `-b` (the
//! client's HELLO says `bidir=1`) the server of a bandwidth test streams to the client as
//! well and reports its direction in a RESULT before its ACK; both ends print both
//! directions together.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use uhca::Device;
use uhca::datapath::Remote;
use uhca::resource::ConnectParams;

pub use super::role::{BEAT, QUIET, REPLY, Role};

use super::bench::{Bench, Peer};
use super::control::{Control, ControlError, Endpoint, Hello, Msg, QpInfo};
use super::end::{End, read_depths, rx_off};
use super::latency::{await_recv, await_tag, put_send, put_write, tag};
use super::meter::Meter;
use super::stream::{Pace, Stream};
use super::wait::{PeerWatch, StallTimer};
use super::{BwResult, LatResult, Op, PerfError, Settings, lat_stats, setup};

/// How long a client tries to reach the server.
pub const CONNECT: Duration = Duration::from_secs(10);

/// The server's listening sockets: every IPv6 and every IPv4 address of TCP `port`.
pub struct Listener {
    socks: Vec<TcpListener>,
}

/// How long [`accept`] sleeps between looks when it listens on two sockets.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// Listens on every address, IPv6 and IPv4, TCP `port`. `[::]` takes IPv4 clients as
/// well where the kernel maps them (Linux's default, `net.ipv6.bindv6only=0`); then
/// `0.0.0.0` on the same port is taken already and not needed. Where IPv6 is off, IPv4
/// alone; where the two are separate, both.
pub fn listen(port: u16) -> Result<Listener, ControlError> {
    let err = |source| ControlError::Io {
        what: format!("listening on TCP port {port}"),
        source,
    };
    let v6 = TcpListener::bind(("::", port));
    // Port 0 asks for any free port: the IPv4 socket must then take the IPv6 one's.
    let port4 = match &v6 {
        Ok(l) => l.local_addr().map_err(err)?.port(),
        Err(_) => port,
    };
    let v4 = TcpListener::bind(("0.0.0.0", port4));
    let socks: Vec<TcpListener> = match (v6, v4) {
        (Ok(a), Ok(b)) => vec![a, b],
        (Ok(a), Err(_)) => vec![a],
        (Err(_), Ok(b)) => vec![b],
        (Err(_), Err(e)) => return Err(err(e)),
    };
    Ok(Listener { socks })
}

impl Listener {
    /// The port it listens on.
    pub fn port(&self) -> Result<u16, ControlError> {
        let a = self.socks[0]
            .local_addr()
            .map_err(|source| ControlError::Io {
                what: "reading the listening port".into(),
                source,
            })?;
        Ok(a.port())
    }
}

/// Waits for one client on `l` (as perftest's server, for as long as it takes).
pub fn accept(l: &Listener) -> Result<Control, ControlError> {
    Control::new(accept_tcp(l)?)
}

/// [`accept`]'s connection, before any protocol.
pub fn accept_tcp(l: &Listener) -> Result<TcpStream, ControlError> {
    let err = |source| ControlError::Io {
        what: "accepting a client".into(),
        source,
    };
    if let [one] = l.socks.as_slice() {
        let (s, _) = one.accept().map_err(err)?;
        return Ok(s);
    }
    for s in &l.socks {
        s.set_nonblocking(true).map_err(err)?;
    }
    loop {
        for sock in &l.socks {
            match sock.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(err)?;
                    return Ok(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(err(e)),
            }
        }
        std::thread::sleep(ACCEPT_POLL);
    }
}

/// Connects to the server at `host`:`port`, trying each of its addresses for at most
/// [`CONNECT`].
pub fn connect(host: &str, port: u16) -> Result<Control, ControlError> {
    Control::new(connect_tcp(host, port)?)
}

/// [`connect`]'s connection, before any protocol.
pub fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, ControlError> {
    let what = format!("connecting to {host}:{port}");
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|source| ControlError::Io {
            what: what.clone(),
            source,
        })?;
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(ControlError::Io {
        what: format!("{what} (is a uhca-perf server running there?)"),
        source: last.unwrap_or_else(|| std::io::Error::other("the name has no address")),
    })
}

/// Client: proposes `h` and waits for the server to confirm it.
pub fn propose(ctl: &mut Control, h: &Hello) -> Result<(), ControlError> {
    ctl.send(&Msg::Hello(h.clone()))?;
    match ctl.recv(REPLY, "the server's HELLO")? {
        Msg::Hello(s) if s == *h => Ok(()),
        Msg::Hello(s) => Err(ControlError::Mismatch(format!(
            "the server answered with other settings: {s:?}"
        ))),
        m => Err(unexpected("HELLO", &m)),
    }
}

/// Server: the client's proposal, which must be for `mode` (else both ends are told).
pub fn proposal(ctl: &mut Control, mode: &str) -> Result<Hello, ControlError> {
    match ctl.recv(REPLY, "the client's HELLO")? {
        Msg::Hello(h) if h.mode == mode => Ok(h),
        Msg::Hello(h) => {
            let why = format!(
                "mode mismatch: the server runs {mode}, the client asked for {}",
                h.mode
            );
            refuse(ctl, &why);
            Err(ControlError::Mismatch(why))
        }
        m => Err(unexpected("HELLO", &m)),
    }
}

/// Server: accepts the client's proposal `h` (the settings it will run with).
pub fn confirm(ctl: &mut Control, h: &Hello) -> Result<(), ControlError> {
    ctl.send(&Msg::Hello(h.clone()))
}

/// Tells the peer why this end gives up (best effort: it may be gone already).
pub fn refuse(ctl: &mut Control, why: &str) {
    let _ = ctl.send(&Msg::Error(why.to_owned()));
}

fn unexpected(expected: &'static str, got: &Msg) -> ControlError {
    ControlError::Unexpected {
        expected,
        got: got.emit(),
    }
}

/// A starting PSN (24 bits) that differs from run to run, as perftest's `lrand48`.
fn random_psn(salt: u32) -> u32 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(salt) as u32 & 0xff_ffff
}

impl Bench {
    /// This process's end on `dev` for `s` (buffers for messages up to `max_size`),
    /// connected to the remote end over `ctl`: the two exchange their END messages (the
    /// client first) and connect their QPs, this side's from GID entry `gid_index`; without
    /// one, the client's is entry 0 and the server's the first of the client's kind (IPv4-
    /// mapped or not): a RoCEv2 packet is IPv4 or IPv6, and a peer that checks addresses (as
    /// Linux's rxe does, and the model) drops an answer from the other kind.
    pub fn connect(
        dev: &Device,
        s: &Settings,
        max_size: usize,
        gid_index: Option<u8>,
        mut ctl: Control,
        role: Role,
    ) -> Result<Bench, PerfError> {
        let mut me = End::new(dev, s, max_size, s.use_dm)?;
        let mut theirs = None;
        if role == Role::Server {
            theirs = Some(match ctl.recv(REPLY, "the peer's END")? {
                Msg::End(e) => e,
                m => return Err(unexpected("END", &m).into()),
            });
        }
        let gid_index = match (gid_index, &theirs) {
            (Some(x), _) => x,
            (None, Some(t)) => super::gid::gid_of_kind(dev, super::gid::v4_mapped(&t.gid)),
            (None, None) => 0,
        };
        let addr = dev
            .roce_address(u32::from(gid_index))
            .map_err(setup("GID (-x)"))?;
        let rx = rx_off(max_size);
        let mine = Endpoint {
            gid: addr.gid,
            mac: addr.mac,
            qps: me
                .qps
                .iter()
                .zip(&me.bufs)
                .map(|(q, b)| {
                    let r = b.remote(rx as u64);
                    QpInfo {
                        qpn: q.qpn(),
                        psn: random_psn(q.qpn()),
                        addr: r.addr,
                        rkey: r.rkey,
                        len: rx as u64,
                    }
                })
                .collect(),
        };
        if role == Role::Client {
            ctl.send(&Msg::End(mine.clone()))?;
        }
        let theirs = match theirs {
            Some(t) => t,
            None => match ctl.recv(REPLY, "the peer's END")? {
                Msg::End(e) => e,
                m => return Err(unexpected("END", &m).into()),
            },
        };
        if theirs.qps.len() != me.qps.len() {
            return Err(ControlError::Mismatch(format!(
                "the peer has {} QPs, this end {}",
                theirs.qps.len(),
                me.qps.len()
            ))
            .into());
        }
        if let Some(q) = theirs.qps.iter().find(|q| q.len < max_size as u64) {
            return Err(ControlError::Mismatch(format!(
                "the peer's buffer of {} bytes is smaller than a {max_size}-byte message",
                q.len
            ))
            .into());
        }
        for ((qp, m), t) in me.qps.iter_mut().zip(&mine.qps).zip(&theirs.qps) {
            let mut p = ConnectParams::new(t.qpn, theirs.gid, theirs.mac);
            (p.sq_psn, p.rq_psn) = (m.psn, t.psn);
            p.mtu = s.mtu;
            p.sgid_index = gid_index;
            read_depths(&mut p, dev, s);
            qp.connect(&p).map_err(setup("connecting"))?;
        }
        if role == Role::Server {
            ctl.send(&Msg::End(mine.clone()))?;
        }
        me.watch.peer = Some(std::sync::Arc::new(
            PeerWatch::new(ctl.stream()).map_err(setup("watching the control connection"))?,
        ));
        Ok(Bench {
            rx_off: rx,
            me,
            peer: Peer::Remote {
                targets: theirs
                    .qps
                    .iter()
                    .map(|q| Remote {
                        addr: q.addr,
                        rkey: q.rkey,
                    })
                    .collect(),
                ctl,
                role,
                ends: Box::new((mine, theirs)),
            },
            _models: Vec::new(),
            settings: s.clone(),
        })
    }

    /// This end's and the remote end's addresses and QPs (perftest's "local address" and
    /// "remote address" lines); `None` when both ends are in this process.
    pub fn endpoints(&self) -> Option<(&Endpoint, &Endpoint)> {
        match &self.peer {
            Peer::Remote { ends, .. } => Some((&ends.0, &ends.1)),
            Peer::Perftest(p) => Some((&p.ends.0, &p.ends.1)),
            Peer::Local(_) => None,
        }
    }

    /// A failed run of a remote pair, most often a stall or a failed request because the
    /// peer went away: says so when the control connection shows it (closed, or an ERROR).
    pub(super) fn explain(&mut self, e: PerfError) -> PerfError {
        if matches!(e, PerfError::Control(_) | PerfError::Perftest(_)) {
            return e;
        }
        // A hang-up says it all on uhca's own connection; a perftest peer's is explained
        // by its exchange below (what it was waiting for, the flags that must match).
        if matches!(e, PerfError::PeerHungUp) && !matches!(self.peer, Peer::Perftest(_)) {
            return e;
        }
        match &mut self.peer {
            Peer::Perftest(p) => match p.gone() {
                Some(source) => PerfError::PerftestPeerLost {
                    during: Box::new(e),
                    source,
                },
                None => e,
            },
            Peer::Remote { ctl, .. } => match ctl.try_recv("the run to end") {
                Err(source) => PerfError::PeerLost {
                    during: Box::new(e),
                    source,
                },
                Ok(_) => e,
            },
            Peer::Local(_) => e,
        }
    }

    /// The control connection, when this end is `role`.
    fn ctl(&mut self, role: Role) -> Result<Option<&mut Control>, PerfError> {
        match &mut self.peer {
            Peer::Local(_) => Ok(None),
            Peer::Remote { ctl, role: r, .. } if *r == role => Ok(Some(ctl)),
            Peer::Perftest(_) => Err(PerfError::Setup(
                "a perftest run has no uhca-perf control connection".into(),
            )),
            Peer::Remote { .. } => Err(PerfError::Setup(format!(
                "this end is not the {role:?}: it cannot do that"
            ))),
        }
    }

    /// Client, before running `size`: START, and the server's READY.
    pub(super) fn begin(&mut self, size: usize) -> Result<(), PerfError> {
        if matches!(self.peer, Peer::Perftest(_)) {
            return self.pt_begin();
        }
        let Some(ctl) = self.ctl(Role::Client)? else {
            return Ok(());
        };
        ctl.send(&Msg::Start(size as u64))?;
        match ctl.recv(REPLY, "READY")? {
            Msg::Ready(n) if n == size as u64 => Ok(()),
            m => Err(unexpected("READY", &m).into()),
        }
    }

    /// Client, after running `size` with `iters` messages completed: DONE, and the
    /// server's ACK; in a bidirectional run first the server's RESULT, returned as its
    /// messages and peak bandwidth (bytes/s). While the server finishes its direction of a
    /// bidirectional SEND test, this end keeps reposting the receives its SENDs take.
    pub(super) fn finish(
        &mut self,
        size: usize,
        iters: u64,
    ) -> Result<Option<(u64, f64)>, PerfError> {
        let Bench {
            me, peer, settings, ..
        } = self;
        let Peer::Remote {
            ctl,
            role: Role::Client,
            ..
        } = peer
        else {
            return Ok(None);
        };
        ctl.send(&Msg::Done {
            size: size as u64,
            iters,
        })?;
        let mut theirs = None;
        if settings.bidirectional {
            // Its own requests are all done: only receive completions come now.
            let mut sink = Stream::new(me.qps.len());
            let deadline = Instant::now() + REPLY;
            theirs = loop {
                if settings.op == Op::Send {
                    me.reap(&mut sink)?;
                }
                match ctl.try_recv("RESULT")? {
                    Some(Msg::Result {
                        size: n,
                        iters,
                        peak,
                    }) if n == size as u64 => break Some((iters, peak as f64)),
                    Some(m) => return Err(unexpected("RESULT", &m).into()),
                    None if Instant::now() > deadline => {
                        return Err(ControlError::Timeout(REPLY, "RESULT").into());
                    }
                    None => std::thread::sleep(Duration::from_micros(50)),
                }
            };
        }
        match ctl.recv(REPLY, "ACK")? {
            Msg::Ack(n) if n == size as u64 => Ok(theirs),
            m => Err(unexpected("ACK", &m).into()),
        }
    }

    /// Server: the client's START for `size`.
    fn await_start(&mut self, size: usize) -> Result<(), PerfError> {
        let ctl = self.ctl(Role::Server)?.ok_or_else(not_remote)?;
        match ctl.recv(REPLY, "START")? {
            Msg::Start(n) if n == size as u64 => Ok(()),
            m => Err(unexpected("START", &m).into()),
        }
    }

    /// Server: sends `m` to the client.
    fn tell(&mut self, m: &Msg) -> Result<(), PerfError> {
        let ctl = self.ctl(Role::Server)?.ok_or_else(not_remote)?;
        Ok(ctl.send(m)?)
    }

    /// Server: waits for the client's DONE for `size` (hearing its beats meanwhile), and
    /// returns the messages it completed.
    fn await_done(&mut self, size: usize) -> Result<u64, PerfError> {
        let ctl = self.ctl(Role::Server)?.ok_or_else(not_remote)?;
        match ctl.recv(QUIET, "DONE")? {
            Msg::Done { size: n, iters } if n == size as u64 => Ok(iters),
            m => Err(unexpected("DONE", &m).into()),
        }
    }

    /// Server side of a bandwidth test of `size`: for SEND, receives and counts the
    /// messages (its own result); otherwise it only waits while the client works on its
    /// memory (no result).
    pub fn serve_bandwidth(&mut self, size: usize) -> Result<Option<BwResult>, PerfError> {
        let r = self.run_serve_bandwidth(size);
        r.map_err(|e| self.explain(e))
    }

    fn run_serve_bandwidth(&mut self, size: usize) -> Result<Option<BwResult>, PerfError> {
        self.await_start(size)?;
        if self.settings.bidirectional {
            return self.serve_both_ways(size).map(Some);
        }
        if self.settings.op != Op::Send {
            self.tell(&Msg::Ready(size as u64))?;
            self.await_done(size)?;
            self.tell(&Msg::Ack(size as u64))?;
            return Ok(None);
        }
        for q in 0..self.me.qps.len() {
            self.me.fill_recvs(q)?;
        }
        self.tell(&Msg::Ready(size as u64))?;
        let start = Instant::now();
        let window = (self.settings.iters / 20).max(1);
        let mut meter = Meter::new(size, window, start);
        let (mut expected, mut last, mut heard) = (None, start, start);
        let mut idle = StallTimer::watching(&self.me.watch);
        let mut next_check = start;
        while expected != Some(meter.total) {
            let n = self.me.reap_recvs()?;
            let now = if n > 0 {
                idle.restart();
                last = Instant::now();
                meter.add(n, last);
                Some(last)
            } else {
                idle.spin()?
            };
            // The control connection, a few times a second: the DONE, or silence.
            if let Some(now) = now.filter(|&t| t >= next_check) {
                next_check = now + Duration::from_millis(50);
                self.check_done(size, now, &mut heard, &mut expected)?;
            }
            if let Some(e) = expected
                && meter.total > e
            {
                return Err(ControlError::Mismatch(format!(
                    "received {} messages, the client completed {e}",
                    meter.total
                ))
                .into());
            }
        }
        self.tell(&Msg::Ack(size as u64))?;
        Ok(Some(meter.result(last)))
    }

    /// A streaming server's look at the control connection at `now`, without waiting: a
    /// beat or the client's DONE for `size` (its message count into `done`) renews
    /// `heard`; no DONE and nothing heard for [`QUIET`] is an error.
    fn check_done(
        &mut self,
        size: usize,
        now: Instant,
        heard: &mut Instant,
        done: &mut Option<u64>,
    ) -> Result<(), PerfError> {
        let ctl = self.ctl(Role::Server)?.ok_or_else(not_remote)?;
        match ctl.try_recv("DONE")? {
            Some(Msg::Beat) => *heard = now,
            Some(Msg::Done { size: s, iters }) if s == size as u64 => {
                (*done, *heard) = (Some(iters), now)
            }
            Some(m) => return Err(unexpected("BEAT or DONE", &m).into()),
            None if done.is_none() && now.duration_since(*heard) > QUIET => {
                return Err(ControlError::Timeout(QUIET, "DONE").into());
            }
            None => {}
        }
        Ok(())
    }

    /// Server side of a bidirectional bandwidth test of `size` (`-b`): streams to the
    /// client as the client streams to it (the same settings; with `-D` until the client's
    /// DONE), keeps receives posted for the client's SENDs, and hears the client's beats.
    /// It then sends its RESULT and ACK; its own result counts both directions (its
    /// messages and those the client's DONE reports).
    fn serve_both_ways(&mut self, size: usize) -> Result<BwResult, PerfError> {
        let s = self.settings.clone();
        let nq = self.me.qps.len();
        let pace = Pace::new(&s, size);
        let iters = pace.iters;
        if s.op == Op::Send {
            for q in 0..nq {
                self.me.fill_recvs(q)?;
            }
        }
        self.tell(&Msg::Ready(size as u64))?;
        let targets: Vec<Remote> = (0..nq).map(|q| self.target(q)).collect();
        let mut st = Stream::new(nq);
        let start = Instant::now();
        let mut meter = Meter::new(size, pace.window(), start);
        let (mut theirs, mut heard, mut next_check) = (None, start, start);
        let mut idle = StallTimer::watching(&self.me.watch);
        let mut now = start;
        loop {
            // With -D the client's DONE ends this end's stream too.
            let stop = s.duration.is_some() && theirs.is_some();
            self.me.pump(&mut st, &targets, &pace, stop)?;
            let n = self.me.reap(&mut st)?;
            if n > 0 {
                now = Instant::now();
                idle.restart();
                meter.add(n, now);
            } else if let Some(t) = idle.spin()? {
                now = t;
            }
            // The control connection, a few times a second: beats, the DONE, or silence.
            if now >= next_check {
                next_check = now + Duration::from_millis(50);
                self.check_done(size, now, &mut heard, &mut theirs)?;
            }
            let drained = (0..nq).all(|q| st.done[q] == st.posted[q]);
            let finished = stop || (s.duration.is_none() && st.done.iter().all(|&d| d >= iters));
            if drained && finished && theirs.is_some() {
                break;
            }
        }
        let end = Instant::now();
        let mine = meter.result(end);
        self.tell(&Msg::Result {
            size: size as u64,
            iters: mine.iters,
            peak: mine.peak as u64,
        })?;
        self.tell(&Msg::Ack(size as u64))?;
        Ok(both_ways(mine, theirs.unwrap_or(0), 0.0, start, end))
    }

    /// Server side of a latency test of `size`: the other half of the WRITE and SEND
    /// ping-pongs, its result the time from each of its answers to the next request over
    /// two (perftest's: `iters` exchanges, one time fewer); for READ and atomics it waits
    /// while the client works on its memory (no result).
    pub fn serve_latency(&mut self, size: usize) -> Result<Option<LatResult>, PerfError> {
        let r = self.run_serve_latency(size);
        r.map_err(|e| self.explain(e))
    }

    fn run_serve_latency(&mut self, size: usize) -> Result<Option<LatResult>, PerfError> {
        self.await_start(size)?;
        let op = self.settings.op;
        if !matches!(op, Op::Write | Op::Send) {
            self.tell(&Msg::Ready(size as u64))?;
            self.await_done(size)?;
            self.tell(&Msg::Ack(size as u64))?;
            return Ok(None);
        }
        if op == Op::Send {
            self.me.fill_recvs(0)?;
        }
        self.tell(&Msg::Ready(size as u64))?;
        let iters = self.settings.iters.max(1);
        let mut samples = Vec::with_capacity(iters.min(10_000_000) as usize);
        let mut inline = vec![0u8; self.settings.inline_size.max(1) as usize];
        let to_client = self.target(0);
        let mut answered: Option<Instant> = None;
        for i in 0..iters {
            match op {
                Op::Write => await_tag(&self.me, self.rx_off, size, tag(i))?,
                _ => await_recv(&mut self.me, self.settings.events)?,
            }
            let t = Instant::now();
            if let Some(a) = answered {
                samples.push(t.duration_since(a).as_secs_f64() * 1e6 / 2.0);
            }
            answered = Some(t);
            match op {
                Op::Write => put_write(
                    &mut self.me,
                    to_client,
                    &self.settings,
                    size,
                    i,
                    &mut inline,
                )?,
                _ => put_send(&mut self.me, &self.settings, size, i, &inline)?,
            }
        }
        let done = self.await_done(size)?;
        if done != iters {
            return Err(ControlError::Mismatch(format!(
                "the client completed {done} exchanges, this end {iters}"
            ))
            .into());
        }
        // The last answer's completion (if signaled) is taken by the next test or teardown.
        self.tell(&Msg::Ack(size as u64))?;
        let mut r = lat_stats(size, &mut samples);
        r.iters = iters;
        Ok(Some(r))
    }

    /// The end of a remote run: BYE both ways (the client first), so neither end mistakes
    /// the other's exit for a failure. Nothing to do when both ends are here.
    pub fn bye(&mut self) -> Result<(), PerfError> {
        let Peer::Remote { ctl, role, .. } = &mut self.peer else {
            return Ok(());
        };
        if *role == Role::Client {
            ctl.send(&Msg::Bye)?;
        }
        match ctl.recv(REPLY, "BYE")? {
            Msg::Bye => {}
            m => return Err(unexpected("BYE", &m).into()),
        }
        if *role == Role::Server {
            ctl.send(&Msg::Bye)?;
        }
        Ok(())
    }
}

/// A bidirectional result: `mine` (this end's direction, measured from `start` to `end`)
/// with the other direction's `their_iters` messages and `their_peak` bytes/s added.
pub(super) fn both_ways(
    mine: BwResult,
    their_iters: u64,
    their_peak: f64,
    start: Instant,
    end: Instant,
) -> BwResult {
    let secs = end.duration_since(start).as_secs_f64().max(1e-9);
    let iters = mine.iters + their_iters;
    let avg = (iters * mine.size as u64) as f64 / secs;
    BwResult {
        iters,
        avg,
        msg_rate: iters as f64 / secs,
        peak: (mine.peak + their_peak).max(avg),
        ..mine
    }
}

fn not_remote() -> PerfError {
    PerfError::Setup("both ends are in this process: there is no remote client".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_takes_ipv4_and_ipv6_clients() {
        let l = listen(0).unwrap();
        let port = l.port().unwrap();
        // IPv6 only where this machine has a loopback address for it.
        let v6 = TcpListener::bind("[::1]:0").is_ok();
        for host in ["127.0.0.1", "::1", "localhost"] {
            if host == "::1" && !v6 {
                continue;
            }
            let client = std::thread::spawn(move || connect(host, port).map(drop));
            accept(&l).unwrap();
            client.join().unwrap().unwrap();
        }
    }
}

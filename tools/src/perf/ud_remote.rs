//! `-c UD` between two processes: `send_lat` and `send_bw` over UD QPs, this process one
//! end, its peer another process (another uhca-perf, or perftest's `ib_send_lat -c UD` /
//! `ib_send_bw -c UD`), met over TCP with uhca-perf's own exchange ([`super::control`]) or
//! perftest's ([`super::perftest`]).
//!
//! Each end has one UD QP ([`super::ud`]'s end: Q_Key [`QKEY`], perftest's `DEF_QKEY`,
//! `docs/spec/perftest-oob.md` "UD"), and an address handle to the peer's GID (the keys'
//! GID; the MAC as [`super::pt_run::peer_mac`] derives it). As perftest, a message is at
//! most one MTU (the MTU both ends agreed: a larger one is refused before any traffic),
//! each receive slot has the 40-byte GRH in front of the message, and the message size
//! reported is the payload's, without the GRH.
//!
//! perftest's exchange is the same for UD as for RC (`docs/spec/perftest-oob.md`): K×q,
//! "connect" (here: the address handle), K, K×q; per size the receives posted, K, the
//! traffic (`send_bw -a`: K after it); at the end K and `done`. uhca-perf's own exchange:
//! HELLO with the mode `send_lat/UD` or `send_bw/UD` (an RC peer refuses it), END (the QPN
//! and GID), then per size START / READY, the traffic, DONE / ACK, and BYE.
//!
//! The traffic: `send_lat` is perftest's ping-pong (the client sends first; each sample
//! is half a round trip; every end's last answer is signaled and waited for, so that a
//! process never exits with its last datagram unsent). `send_bw`: the client streams
//! `-n` datagrams, at most `-t` outstanding; the server counts them. UD has no flow
//! control: a datagram that finds no receive posted is dropped, and the server then
//! reports how many of the client's arrived instead of a result.

use std::time::{Duration, Instant};

use uhca::Device;
use uhca::datapath::SendFlags;
use uhca::datapath::{Completion, WcOpcode};
use uhca::resource::{Ah, AhAttr, UdDest, UdSendWr};

use super::control::{Control, ControlError, Endpoint, Msg, QpInfo};
use super::gid::{gid_of_kind, v4_mapped};
use super::meter::Meter;
use super::perftest::{Agreed, KEYS_LEN, Keys, Oob, OobError, Wait};
use super::pt_run::peer_mac;
use super::remote::{REPLY, Role};
use super::ud::{QKEY, RX_DEPTH, UdEnd, message, message_sge};
use super::wait::STALL;
use super::{BwResult, LatResult, PerfError, Settings, check, lat_stats, setup};

/// How long a `send_bw` server waits for a datagram the client sent once the client says
/// it is done (a datagram still in flight arrives within this; one dropped never does).
const LATE: Duration = Duration::from_secs(2);

/// How often a wait looks at the device and the peer's connection.
const LOOK: Duration = Duration::from_millis(50);

/// How a UD run meets its peer.
enum Link {
    /// uhca-perf's own exchange.
    Uhca(Control),
    /// perftest's; `all`: `-a` (send_bw meets after each size).
    Perftest {
        oob: Box<Oob>,
        mine: Keys,
        all: bool,
    },
}

/// This process's end of a UD run with another process.
pub struct UdRemote {
    end: UdEnd,
    ah: Ah,
    peer_qpn: u32,
    role: Role,
    link: Link,
    settings: Settings,
    /// This end and the peer (the header's address lines).
    ends: (Endpoint, Endpoint),
    agreed: Option<Agreed>,
    /// A message of the client's that came while the server counted (its DONE).
    early: Option<Msg>,
}

/// The mode name uhca-perf's exchange carries for a UD run of `mode`.
pub fn mode_name(mode: &str) -> String {
    format!("{mode}/UD")
}

fn endpoint(qpn: u32, gid: [u8; 16], mac: [u8; 6], len: usize) -> Endpoint {
    Endpoint {
        gid,
        mac,
        qps: vec![QpInfo {
            qpn,
            psn: 0,
            addr: 0,
            rkey: 0,
            len: len as u64,
        }],
    }
}

fn too_large(max_size: usize, mtu: usize) -> PerfError {
    PerfError::Setup(format!(
        "-s {max_size}: a UD message is at most one MTU, and the two ends agreed on {mtu} bytes \
         (-m on both ends sets it)"
    ))
}

fn oob_err(e: OobError) -> PerfError {
    PerfError::Perftest(e)
}

impl UdRemote {
    fn build(
        dev: &Device,
        s: &Settings,
        end: UdEnd,
        x: u8,
        theirs: Endpoint,
        role: Role,
        link: Link,
    ) -> Result<UdRemote, PerfError> {
        let addr = dev.roce_address(u32::from(x)).map_err(setup("GID (-x)"))?;
        let mut attr = AhAttr::with_mac(theirs.gid, theirs.mac);
        attr.sgid_index = x;
        let ah = dev.create_ah(&attr).map_err(setup("address handle"))?;
        let peer_qpn = theirs.qps[0].qpn;
        let mine = endpoint(end.qp.qpn(), addr.gid, addr.mac, end.buf.len());
        Ok(UdRemote {
            end,
            ah,
            peer_qpn,
            role,
            link,
            settings: s.clone(),
            ends: (mine, theirs),
            agreed: None,
            early: None,
        })
    }

    /// This end on `dev` for messages up to `max_size`, met over uhca-perf's exchange `ctl`
    /// (after the HELLOs): END both ways (the client first), then the address handle. The
    /// GID: `-x`, else the client's entry 0 and the server's first of the client's kind.
    pub fn connect_uhca(
        dev: &Device,
        s: &Settings,
        max_size: usize,
        gid_index: Option<u8>,
        mut ctl: Control,
        role: Role,
    ) -> Result<UdRemote, PerfError> {
        let mut end = UdEnd::new(dev, s, max_size)?;
        end.post_recvs(u64::from(RX_DEPTH))?;
        let recv_end = |ctl: &mut Control| match ctl.recv(REPLY, "the peer's END")? {
            Msg::End(e) if e.qps.len() == 1 => Ok(e),
            Msg::End(e) => Err(PerfError::Control(ControlError::Mismatch(format!(
                "the peer has {} QPs; a UD run has one",
                e.qps.len()
            )))),
            m => Err(PerfError::Control(ControlError::Unexpected {
                expected: "END",
                got: m.emit(),
            })),
        };
        let theirs = match role {
            Role::Server => Some(recv_end(&mut ctl)?),
            Role::Client => None,
        };
        let x = match (gid_index, &theirs) {
            (Some(x), _) => x,
            (None, Some(t)) => gid_of_kind(dev, v4_mapped(&t.gid)),
            (None, None) => 0,
        };
        let addr = dev.roce_address(u32::from(x)).map_err(setup("GID (-x)"))?;
        let mine = endpoint(end.qp.qpn(), addr.gid, addr.mac, max_size);
        if role == Role::Client {
            ctl.send(&Msg::End(mine.clone()))?;
        }
        let theirs = match theirs {
            Some(t) => t,
            None => recv_end(&mut ctl)?,
        };
        if role == Role::Server {
            ctl.send(&Msg::End(mine))?;
        }
        if theirs.qps[0].len < max_size as u64 {
            return Err(ControlError::Mismatch(format!(
                "the peer's receives take {} bytes, smaller than a {max_size}-byte message",
                theirs.qps[0].len
            ))
            .into());
        }
        UdRemote::build(dev, s, end, x, theirs, role, Link::Uhca(ctl))
    }

    /// This end on `dev` for messages up to `max_size`, met over perftest's exchange `oob`:
    /// the opening (a message above the agreed MTU is refused here), then the keys as
    /// perftest's send tests exchange them, the address handle to the peer's GID between.
    /// The GID: `-x`, else the first IPv4-mapped entry (perftest's choice on RoCE).
    pub fn connect_perftest(
        dev: &Device,
        s: &Settings,
        max_size: usize,
        gid_index: Option<u8>,
        all: bool,
        mut oob: Oob,
    ) -> Result<UdRemote, PerfError> {
        let role = oob.role();
        let agreed = oob.open(s.mtu).map_err(oob_err)?;
        let mtu = 128usize << agreed.mtu as u32;
        if max_size > mtu {
            return Err(too_large(max_size, mtu));
        }
        let mut settings = s.clone();
        settings.mtu = agreed.mtu;
        let mut end = UdEnd::new(dev, &settings, max_size)?;
        end.post_recvs(u64::from(RX_DEPTH))?;
        let x = gid_index.unwrap_or_else(|| gid_of_kind(dev, true));
        let addr = dev.roce_address(u32::from(x)).map_err(setup("GID (-x)"))?;
        let mine = Keys {
            lid: 0,
            out_reads: 1,
            qpn: end.qp.qpn(),
            psn: end.qp.qpn() & 0xff_ffff,
            rkey: end.buf.rkey(),
            vaddr: end.buf.addr(),
            gid: addr.gid,
            srqn: 0,
        };
        let mut theirs: Option<Keys> = None;
        // K (q = 1), "connect", K, K: the keys must stay the same throughout.
        for what in [
            "the keys of the QP",
            "the keys after connecting",
            "the keys again",
        ] {
            let t = oob.keys(&mine, what, Wait::Reply).map_err(oob_err)?;
            match theirs {
                Some(k) if k != t => {
                    return Err(OobError::Mismatch(format!(
                        "the perftest peer's keys changed (QPN {:#x}, then {:#x}): the two \
                         ends run different tests or -q",
                        k.qpn, t.qpn
                    ))
                    .into());
                }
                _ => theirs = Some(t),
            }
        }
        let t = theirs.expect("three exchanges");
        if v4_mapped(&t.gid) != v4_mapped(&mine.gid) {
            return Err(OobError::Mismatch(
                "the perftest peer's GID is of the other kind (IPv4-mapped or not): give -x \
                 for an entry of its kind"
                    .into(),
            )
            .into());
        }
        let theirs = endpoint(t.qpn, t.gid, peer_mac(&t.gid), mtu);
        let link = Link::Perftest {
            oob: Box::new(oob),
            mine,
            all,
        };
        let mut r = UdRemote::build(dev, &settings, end, x, theirs, role, link)?;
        r.agreed = Some(agreed);
        Ok(r)
    }

    /// What the opening with a perftest peer agreed; `None` with uhca-perf's exchange.
    pub fn perftest_agreed(&self) -> Option<&Agreed> {
        self.agreed.as_ref()
    }

    /// The settings this run uses (with a perftest peer, the MTU the two agreed).
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The run's header as perftest prints it (between its ruler lines).
    pub fn header(&self, title: &str, bw: bool, device: &str) -> String {
        let s = &self.settings;
        let kind = if bw { "BW" } else { "Latency" };
        let gid = |g: &[u8; 16]| {
            g.chunks(2)
                .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
                .collect::<Vec<_>>()
                .join(":")
        };
        let (m, t) = &self.ends;
        [
            format!("                    {title} {kind} Test"),
            format!(" Device         : {device}"),
            " Number of qps  : 1\t\tTransport type : IB".into(),
            " Connection type : UD\t\tUsing SRQ      : OFF".into(),
            format!(" TX depth        : {}", s.tx_depth),
            format!(" RX depth        : {RX_DEPTH}"),
            format!(" Mtu             : {}[B]", 128u32 << s.mtu as u32),
            format!(" Max inline data : {}[B]", s.inline_size.min(188)),
            format!(
                " local address: QPN {:#06x} GID: {}",
                m.qps[0].qpn,
                gid(&m.gid)
            ),
            format!(
                " remote address: QPN {:#06x} GID: {} Q_Key {QKEY:#010x}",
                t.qps[0].qpn,
                gid(&t.gid)
            ),
        ]
        .join("\n")
    }

    /// Before `size`'s traffic: START / READY, or perftest's K (receives are posted).
    fn begin(&mut self, size: usize) -> Result<(), PerfError> {
        match (&mut self.link, self.role) {
            (Link::Uhca(ctl), Role::Client) => {
                ctl.send(&Msg::Start(size as u64))?;
                match ctl.recv(REPLY, "READY")? {
                    Msg::Ready(n) if n == size as u64 => Ok(()),
                    m => Err(unexpected("READY", &m)),
                }
            }
            (Link::Uhca(ctl), Role::Server) => match ctl.recv(REPLY, "START")? {
                Msg::Start(n) if n == size as u64 => {
                    ctl.send(&Msg::Ready(n))?;
                    Ok(())
                }
                m => Err(unexpected("START", &m)),
            },
            (Link::Perftest { oob, mine, .. }, _) => {
                oob.keys(mine, "the keys before the traffic", Wait::Reply)
                    .map_err(oob_err)?;
                Ok(())
            }
        }
    }

    /// After `size`'s traffic of `iters` messages: DONE / ACK (the server checks the
    /// count), or with perftest `send_bw -a` a K.
    fn finish(&mut self, size: usize, iters: u64, bw: bool) -> Result<(), PerfError> {
        match (&mut self.link, self.role) {
            (Link::Uhca(ctl), Role::Client) => {
                ctl.send(&Msg::Done {
                    size: size as u64,
                    iters,
                })?;
                match ctl.recv(REPLY, "ACK")? {
                    Msg::Ack(n) if n == size as u64 => Ok(()),
                    m => Err(unexpected("ACK", &m)),
                }
            }
            (Link::Uhca(ctl), Role::Server) => {
                let m = match self.early.take() {
                    Some(m) => m,
                    None => ctl.recv(REPLY, "DONE")?,
                };
                let done = match m {
                    Msg::Done { size: n, iters } if n == size as u64 => iters,
                    m => return Err(unexpected("DONE", &m)),
                };
                if done != iters {
                    let why = format!(
                        "the client sent {done} messages of {size} bytes, the server received {iters}"
                    );
                    super::remote::refuse(ctl, &why);
                    return Err(PerfError::Setup(why));
                }
                ctl.send(&Msg::Ack(size as u64))?;
                Ok(())
            }
            (Link::Perftest { oob, mine, all }, _) => {
                if bw && *all {
                    oob.keys(mine, "the keys after the traffic", Wait::Reply)
                        .map_err(oob_err)?;
                }
                Ok(())
            }
        }
    }

    /// The end of the run: BYE both ways, or perftest's last K and `done`.
    pub fn close(&mut self) -> Result<(), PerfError> {
        match (&mut self.link, self.role) {
            (Link::Uhca(ctl), role) => {
                if role == Role::Client {
                    ctl.send(&Msg::Bye)?;
                }
                match ctl.recv(REPLY, "BYE")? {
                    Msg::Bye => {}
                    m => return Err(unexpected("BYE", &m)),
                }
                if role == Role::Server {
                    ctl.send(&Msg::Bye)?;
                }
                Ok(())
            }
            (Link::Perftest { oob, mine, .. }, _) => {
                oob.keys(mine, "the closing keys", Wait::Reply)
                    .map_err(oob_err)?;
                oob.done();
                Ok(())
            }
        }
    }

    /// Sends `size` bytes to the peer.
    fn send(&mut self, size: usize, wr_id: u64, flags: SendFlags) -> Result<(), PerfError> {
        let inline = [0x5Au8; 188];
        let sge = message_sge(&self.end.buf, size)?;
        let local = message(&self.settings, size, &inline, &sge);
        self.end.qp.post_send(&UdSendWr {
            wr_id,
            dest: UdDest {
                ah: &self.ah,
                remote_qpn: self.peer_qpn,
                qkey: QKEY,
            },
            local,
            imm: None,
            flags,
        })?;
        self.end.qp.ring_doorbell();
        Ok(())
    }

    /// Whether the peer is still there: a closed or failing connection is an error (a
    /// message of the client's that comes meanwhile, its DONE, is kept for later).
    fn peer_alive(&mut self) -> Result<(), PerfError> {
        match &mut self.link {
            Link::Uhca(ctl) => {
                if self.early.is_none() {
                    self.early = ctl.try_recv("the traffic to end")?;
                }
                Ok(())
            }
            Link::Perftest { oob, .. } => match oob.gone() {
                Some(e) => Err(oob_err(e)),
                None => Ok(()),
            },
        }
    }

    /// The next completion (a failed one is an error), looking at the device and the peer
    /// every [`LOOK`]: a lost device, a peer gone or [`STALL`] without one ends the wait.
    fn wait(&mut self) -> Result<Completion, PerfError> {
        let start = Instant::now();
        let mut next_look = start + LOOK;
        loop {
            if let Some(c) = self.end.cq.poll().next() {
                let c = check(c)?;
                return Ok(c);
            }
            let now = Instant::now();
            if now >= next_look {
                next_look = now + LOOK;
                if self.end.dev.is_lost() {
                    return Err(PerfError::Setup("the device was lost".into()));
                }
                self.peer_alive()?;
                if now.duration_since(start) > STALL {
                    return Err(PerfError::Stalled(STALL));
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Waits for the next receive (taking send completions on the way) and posts its slot
    /// again.
    fn await_recv(&mut self) -> Result<(), PerfError> {
        loop {
            let c = self.wait()?;
            if c.opcode == WcOpcode::Recv {
                return self.end.post_recvs(1);
            }
        }
    }

    /// Waits for the completion of the signaled send `wr_id` (receives that come first
    /// are posted again and counted in the return value).
    fn await_send(&mut self, wr_id: u64) -> Result<u64, PerfError> {
        let mut recvs = 0;
        loop {
            let c = self.wait()?;
            if c.opcode == WcOpcode::Recv {
                self.end.post_recvs(1)?;
                recvs += 1;
            } else if c.wr_id == wr_id {
                return Ok(recvs);
            }
        }
    }

    /// `send_lat -c UD` of `size` with the peer: this end's samples (the client's are
    /// half a round trip from its send; the server's half the time between two answers).
    pub fn latency(&mut self, size: usize) -> Result<LatResult, PerfError> {
        let mtu = 128usize << self.settings.mtu as u32;
        if size > mtu {
            return Err(too_large(size, mtu));
        }
        let iters = self.settings.iters.max(1);
        let sig = u64::from((self.settings.tx_depth / 2).max(1));
        self.begin(size)?;
        let mut samples = Vec::with_capacity(iters.min(10_000_000) as usize);
        let mut last: Option<Instant> = None;
        for i in 0..iters {
            let final_one = i + 1 == iters;
            let flags = if final_one || i % sig == sig - 1 {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            match self.role {
                Role::Client => {
                    let t0 = Instant::now();
                    self.send(size, i, flags)?;
                    if final_one {
                        // The answer may come before the send's completion.
                        if self.await_send(i)? == 0 {
                            self.await_recv()?;
                        }
                    } else {
                        self.await_recv()?;
                    }
                    samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
                Role::Server => {
                    self.await_recv()?;
                    let t = Instant::now();
                    if let Some(p) = last {
                        samples.push(t.duration_since(p).as_secs_f64() * 1e6 / 2.0);
                    }
                    last = Some(t);
                    self.send(size, i, flags)?;
                    if final_one {
                        self.await_send(i)?;
                    }
                }
            }
        }
        let mut r = lat_stats(size, &mut samples);
        r.iters = iters;
        self.finish(size, iters, false)?;
        Ok(r)
    }

    /// `send_bw -c UD` of `size`: the client streams `-n` datagrams and returns its rate;
    /// the server counts them and returns its own.
    pub fn bandwidth(&mut self, size: usize) -> Result<BwResult, PerfError> {
        let mtu = 128usize << self.settings.mtu as u32;
        if size > mtu {
            return Err(too_large(size, mtu));
        }
        self.begin(size)?;
        let iters = self.settings.iters.max(1);
        let r = match self.role {
            Role::Client => self.stream(size, iters)?,
            Role::Server => self.count(size, iters)?,
        };
        self.finish(size, r.iters, true)?;
        Ok(r)
    }

    fn stream(&mut self, size: usize, iters: u64) -> Result<BwResult, PerfError> {
        let depth = u64::from(self.settings.tx_depth.max(1));
        let cq_mod = self
            .settings
            .cq_mod
            .map_or(depth / 4, u64::from)
            .clamp(1, depth);
        let start = Instant::now();
        let mut meter = Meter::new(size, 0, start);
        let (mut posted, mut done) = (0u64, 0u64);
        let mut last_progress = start;
        while done < iters {
            let batch_at = Instant::now();
            let before = posted;
            while posted < iters && posted - done < depth {
                let flags = if (posted + 1).is_multiple_of(cq_mod) || posted + 1 == iters {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                };
                match self.send(size, posted, flags) {
                    Ok(()) => posted += 1,
                    Err(PerfError::Post(uhca::datapath::PostError::QueueFull)) => break,
                    Err(e) => return Err(e),
                }
            }
            if posted > before {
                meter.posted(before, batch_at);
            }
            let (mut moved, mut recvs) = (false, 0);
            for c in self.end.cq.poll() {
                let c = check(c)?;
                if c.opcode == WcOpcode::Recv {
                    recvs += 1;
                    continue;
                }
                let n = (c.wr_id + 1).saturating_sub(done);
                done = done.max(c.wr_id + 1);
                meter.add(n, Instant::now());
                moved = true;
            }
            self.end.post_recvs(recvs)?;
            if moved {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > STALL {
                return Err(PerfError::Stalled(STALL));
            }
        }
        Ok(meter.result(Instant::now()))
    }

    /// Whether the client says its traffic is over (its DONE or perftest's next keys).
    fn client_done(&mut self) -> Result<bool, PerfError> {
        match &mut self.link {
            Link::Uhca(ctl) => {
                if self.early.is_none() {
                    self.early = ctl.try_recv("DONE")?;
                }
                Ok(self.early.is_some())
            }
            Link::Perftest { oob, .. } => oob
                .arrived(KEYS_LEN, "the keys after the traffic")
                .map_err(oob_err),
        }
    }

    fn count(&mut self, size: usize, iters: u64) -> Result<BwResult, PerfError> {
        let start = Instant::now();
        let mut meter = Meter::new(size, 0, start);
        let mut got = 0u64;
        let mut last = start;
        let mut next_look = start;
        let mut client_done: Option<Instant> = None;
        while got < iters {
            let mut n = 0;
            for c in self.end.cq.poll() {
                let c = check(c)?;
                if c.opcode == WcOpcode::Recv {
                    n += 1;
                }
            }
            let now = Instant::now();
            if n > 0 {
                self.end.post_recvs(n)?;
                got += n;
                last = now;
                meter.add(n, now);
                continue;
            }
            if now >= next_look {
                next_look = now + Duration::from_millis(50);
                if self.end.dev.is_lost() {
                    return Err(PerfError::Setup("the device was lost".into()));
                }
                if client_done.is_none() && self.client_done()? {
                    client_done = Some(now);
                }
            }
            let quiet = now.duration_since(last);
            if client_done.is_some_and(|t| now.duration_since(t) > LATE && quiet > LATE) {
                return Err(PerfError::Setup(format!(
                    "received {got} of the client's {iters} datagrams of {size} bytes: UD drops \
                     a datagram that finds no receive posted (try a smaller -t at the client)"
                )));
            }
            if client_done.is_none() && quiet > STALL {
                return Err(PerfError::Stalled(STALL));
            }
            std::hint::spin_loop();
        }
        Ok(meter.result(last))
    }
}

fn unexpected(expected: &'static str, got: &Msg) -> PerfError {
    PerfError::Control(ControlError::Unexpected {
        expected,
        got: got.emit(),
    })
}

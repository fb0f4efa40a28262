//! `uhca-perf` as one end of a perftest run ([`super::perftest`]'s exchange): the steps
//! perftest's test programs take around their traffic, per test, as the client or the
//! server (`docs/spec/perftest-oob.md` has the sequences and their sources).
//!
//! perftest's exchange does not name the test, nor carry the settings: as with perftest,
//! both ends are given the same test and the same `-s -n -a -D -q -b`. What can be checked
//! is: the version, the keys' form, each QP's keys staying the same through the setup
//! (another `-q` sends other keys), the outstanding reads (a WRITE or SEND test offers 1,
//! a READ or atomic test the device's limit), the GID family, and each message's form at
//! its step (keys where a report belongs, or the reverse); everything else that differs
//! ends in a closed connection or a bounded wait on one end, and so on both.

use std::time::{Duration, Instant};

use uhca::Device;
use uhca::datapath::Remote;
use uhca::datapath::SendFlags;
use uhca::resource::ConnectParams;

use super::bench::{Bench, Peer};
use super::control::{Endpoint, QpInfo};
use super::end::{End, read_depths, rx_off};
use super::gid::{gid_of_kind, v4_mapped};
use super::latency::{await_recv, await_send, pingpong_flags, put_send, put_write_tagged};
use super::meter::Meter;
use super::perftest::{Agreed, Keys, Oob, OobError, Report, Wait};
use super::pt_peer::{PtOptions, PtPeer, Shape};
use super::role::Role;
use super::wait::{PeerWatch, StallTimer};
use super::{BwResult, LatResult, Op, PerfError, Settings, lat_stats, setup};

/// The first PSN of a QP (24 bits), different from run to run as perftest's `lrand48`.
fn random_psn(salt: u32) -> u32 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(salt) as u32 & 0xff_ffff
}

/// The Ethernet address of the peer with `gid`. perftest's keys carry no MAC: a link-local
/// GID made from a MAC (modified EUI-64, RFC 4291 appendix A: `ff:fe` in the middle, the
/// U/L bit flipped) gives it back, which is how two model ports on a model link find each
/// other; for any other GID a locally administered MAC made from its last four bytes (a
/// port on an IP network sends by the address, not by this MAC).
pub fn peer_mac(gid: &[u8; 16]) -> [u8; 6] {
    let g = gid;
    if g[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0] && g[11] == 0xff && g[12] == 0xfe {
        return [g[8] ^ 0x02, g[9], g[10], g[13], g[14], g[15]];
    }
    [0x02, 0x00, g[12], g[13], g[14], g[15]]
}

/// The GID index this end uses: `-x`, or the first IPv4-mapped RoCE entry (perftest's
/// choice on RoCE, `get_best_gid_index`), else entry 0.
fn gid_index(dev: &Device, chosen: Option<u8>) -> u8 {
    chosen.unwrap_or_else(|| gid_of_kind(dev, true))
}

/// A [`BwResult`] (bytes/s) as perftest reports it in `gbits`'s unit.
pub fn report_of(r: &BwResult, gbits: bool) -> Report {
    let unit = unit(gbits);
    Report {
        size: r.size as u64,
        iters: r.iters,
        peak: r.peak / unit,
        avg: r.avg / unit,
        msg_rate: r.msg_rate / 1e6,
    }
}

/// A perftest report (in `gbits`'s unit) as a [`BwResult`].
pub fn result_of(r: &Report, gbits: bool) -> BwResult {
    let unit = unit(gbits);
    BwResult {
        size: usize::try_from(r.size).unwrap_or(usize::MAX),
        iters: r.iters,
        peak: r.peak * unit,
        avg: r.avg * unit,
        msg_rate: r.msg_rate * 1e6,
    }
}

/// Bytes/s per report unit: perftest's `format_factor`, 0x100000 for MB/s, 125000000 for
/// Gb/s.
fn unit(gbits: bool) -> f64 {
    if gbits { 125e6 } else { f64::from(1u32 << 20) }
}

impl Bench {
    /// This process's end on `dev` for `s` (messages up to `max_size`), connected to a
    /// perftest peer over `oob`: the opening, then the keys of every QP in the order of
    /// the test's program, the QPs connected where perftest connects its own.
    pub fn connect_perftest(
        dev: &Device,
        s: &Settings,
        max_size: usize,
        opts: PtOptions,
        oob: Oob,
    ) -> Result<Bench, PerfError> {
        Bench::connect_perftest_with(dev, s, max_size, opts, oob, None)
    }

    /// [`connect_perftest`](Self::connect_perftest), the QPs connected by `cm` (perftest's
    /// `-R`: between two exchanges of zeroed keys, before the keys; `super::rdma_cm`)
    /// instead of with the keys' QPNs and PSNs.
    pub fn connect_perftest_with(
        dev: &Device,
        s: &Settings,
        max_size: usize,
        opts: PtOptions,
        mut oob: Oob,
        cm: Option<&mut dyn super::rdma_cm::QpConnector>,
    ) -> Result<Bench, PerfError> {
        let shape = match (s.op, opts.bw) {
            (Op::Send, true) => Shape::SendBw,
            (Op::Send, false) => Shape::SendLat,
            (_, true) => Shape::Bw,
            (_, false) => Shape::Lat,
        };
        let agreed = oob.open(s.mtu).map_err(oob_err)?;
        // perftest's requests land anywhere in the first `max(size, cycle buffer)` bytes
        // from the address in the keys, rounded up to its cache line (`BUFF_SIZE`, `INC`).
        let cl = agreed.cache_line as usize;
        let half = max_size.max(agreed.cycle_buffer as usize).div_ceil(cl) * cl;
        let mut me = End::new(dev, s, half, s.use_dm)?;
        if opts.check {
            let plan = check_plan(s, opts, oob.role())?;
            check_fill(&me, half, rx_off(half), plan.0)?;
        }
        // The waits also watch the connection: a peer that hangs up ends them at once.
        if let Some(stream) = oob.stream() {
            me.watch.peer = Some(std::sync::Arc::new(
                PeerWatch::new(stream).map_err(setup("watching the connection to the peer"))?,
            ));
        }
        let x = gid_index(dev, opts.gid_index);
        let addr = dev.roce_address(u32::from(x)).map_err(setup("GID (-x)"))?;
        let reads = matches!(s.op, Op::Read | Op::Atomic);
        let out_reads = if reads { dev.rd_atomic_limits().1 } else { 1 };
        let rx = rx_off(half);
        let mine: Vec<Keys> = me
            .qps
            .iter()
            .zip(&me.bufs)
            .map(|(q, b)| {
                let r = b.remote(rx as u64);
                Keys {
                    lid: 0,
                    out_reads,
                    qpn: q.qpn(),
                    psn: random_psn(q.qpn()),
                    rkey: r.rkey,
                    vaddr: r.addr,
                    gid: addr.gid,
                    srqn: 0,
                }
            })
            .collect();
        let nq = mine.len();
        let by_cm = cm.is_some();
        if let Some(cm) = cm {
            // perftest -R (`create_rdma_cm_connection`): keys not yet filled in, the
            // rdma_cm connection of every QP, the same again.
            let zero = Keys::default();
            cm.prepare()?;
            oob.keys(&zero, "the meeting before rdma_cm connects", Wait::Reply)
                .map_err(oob_err)?;
            let res = if reads { out_reads.min(255) as u8 } else { 0 };
            cm.connect(&mut me.qps, res, agreed.mtu)?;
            oob.keys(&zero, "the meeting after rdma_cm connected", Wait::Reply)
                .map_err(oob_err)?;
        }
        let mut theirs: Vec<Keys> = Vec::with_capacity(nq);
        let xchg = |oob: &mut Oob, q: usize, theirs: &mut Vec<Keys>| -> Result<(), PerfError> {
            let t = oob
                .keys(&mine[q], "the keys of a QP", Wait::Reply)
                .map_err(oob_err)?;
            match theirs.get(q) {
                None => theirs.push(t),
                Some(k) if *k == t => {}
                Some(k) => {
                    return Err(OobError::Mismatch(format!(
                        "the perftest peer's keys for QP {q} changed (QPN {:#x}, then {:#x}): \
                         the two ends run different -q or different tests",
                        k.qpn, t.qpn
                    ))
                    .into());
                }
            }
            Ok(())
        };
        // Before the connection: QP 0 alone (latency tests), then every QP.
        if shape == Shape::Lat {
            xchg(&mut oob, 0, &mut theirs)?;
        }
        for q in 0..nq {
            xchg(&mut oob, q, &mut theirs)?;
        }
        check_peer(&mine[0], &theirs[0], s.op)?;
        for ((qp, m), t) in me.qps.iter_mut().zip(&mine).zip(&theirs) {
            if by_cm {
                break;
            }
            let mut p = ConnectParams::new(t.qpn, t.gid, peer_mac(&t.gid));
            (p.sq_psn, p.rq_psn) = (m.psn, t.psn);
            p.mtu = agreed.mtu;
            p.sgid_index = x;
            read_depths(&mut p, dev, s);
            // perftest's responder takes `out_reads` at once (its `max_dest_rd_atomic`).
            let theirs_max = u8::try_from(t.out_reads.max(1)).unwrap_or(u8::MAX);
            p.max_rd_atomic = p.max_rd_atomic.min(theirs_max);
            p.max_dest_rd_atomic = u8::try_from(m.out_reads).unwrap_or(u8::MAX);
            qp.connect(&p).map_err(setup("connecting"))?;
        }
        // After it: the SEND tests meet once, then every QP again; the others every QP,
        // then once more "after RTR".
        if matches!(shape, Shape::SendBw | Shape::SendLat) {
            xchg(&mut oob, 0, &mut theirs)?;
        }
        for q in 0..nq {
            xchg(&mut oob, q, &mut theirs)?;
        }
        if matches!(shape, Shape::Bw | Shape::Lat) {
            xchg(&mut oob, 0, &mut theirs)?;
        }
        let endpoint = |keys: &[Keys], mac| Endpoint {
            gid: keys[0].gid,
            mac,
            qps: keys
                .iter()
                .map(|k| QpInfo {
                    qpn: k.qpn,
                    psn: k.psn,
                    addr: k.vaddr,
                    rkey: k.rkey,
                    len: half as u64,
                })
                .collect(),
        };
        let ends = Box::new((
            endpoint(&mine, addr.mac),
            endpoint(&theirs, peer_mac(&theirs[0].gid)),
        ));
        let mut settings = s.clone();
        settings.mtu = agreed.mtu;
        // Every wait of the run watches the peer's socket for a hang-up (and the device).
        if let Some(stream) = oob.stream() {
            me.watch.peer = Some(std::sync::Arc::new(
                PeerWatch::new(stream).map_err(setup("watching the connection"))?,
            ));
        }
        Ok(Bench {
            rx_off: rx,
            me,
            peer: Peer::Perftest(Box::new(PtPeer {
                oob,
                shape,
                opts,
                targets: theirs
                    .iter()
                    .map(|k| Remote {
                        addr: k.vaddr,
                        rkey: k.rkey,
                    })
                    .collect(),
                ends,
                mine,
                last: None,
                agreed,
            })),
            _models: Vec::new(),
            settings,
        })
    }

    /// The settings this run uses (with a perftest peer, the MTU the two agreed).
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// What the opening with a perftest peer agreed; `None` for other runs.
    pub fn perftest_agreed(&self) -> Option<&Agreed> {
        match &self.peer {
            Peer::Perftest(p) => Some(&p.agreed),
            _ => None,
        }
    }

    fn pt(&mut self) -> Option<&mut PtPeer> {
        match &mut self.peer {
            Peer::Perftest(p) => Some(p),
            _ => None,
        }
    }

    /// One keys exchange (QP 0's): a step between sizes or after traffic. `across`: the
    /// peer may still be busy with traffic, so the wait lasts while the port shows life.
    fn pt_meet(&mut self, what: &'static str, across: bool) -> Result<(), PerfError> {
        let Bench { me, peer, .. } = self;
        let Peer::Perftest(p) = peer else {
            return Ok(());
        };
        let mut alive = port_alive(&me.dev);
        let wait = if across {
            Wait::Across(&mut alive)
        } else {
            Wait::Reply
        };
        p.oob.keys(&p.mine[0], what, wait).map_err(oob_err)?;
        Ok(())
    }

    /// Before `size` runs: the SEND tests and the bidirectional ones meet.
    pub(super) fn pt_begin(&mut self) -> Result<(), PerfError> {
        let duplex = self.settings.bidirectional;
        let Some(p) = self.pt() else { return Ok(()) };
        match p.shape {
            Shape::SendBw | Shape::SendLat => self.pt_meet("the keys before the traffic", false),
            Shape::Bw if duplex => self.pt_meet("the keys before the traffic", false),
            _ => Ok(()),
        }
    }

    /// After a bandwidth run of this end measured as `r`: a one-way run keeps it for the
    /// report at the end; a bidirectional one exchanges reports (not SEND with `-D`, as
    /// perftest) and adds the peer's figures to its own, as perftest's
    /// `print_full_bw_report` does. With `-a` (perftest's `RUN_ALL`) the SEND tests, and
    /// the bidirectional others, meet after each size; a single size has no such meeting.
    pub(super) fn pt_finish_bw(&mut self, r: BwResult) -> Result<BwResult, PerfError> {
        let duplex = self.settings.bidirectional;
        let duration = self.settings.duration.is_some();
        let Some(p) = self.pt() else { return Ok(r) };
        let (shape, all, gbits) = (p.shape, p.opts.all, p.opts.gbits);
        if !duplex {
            p.last = Some(r);
            if shape == Shape::SendBw && all {
                self.pt_meet("the keys after the traffic", true)?;
            }
            return Ok(r);
        }
        if shape == Shape::Bw && all {
            self.pt_meet("the keys after the traffic", true)?;
        }
        let mut out = r;
        if !(shape == Shape::SendBw && duration) {
            let Bench { me, peer, .. } = self;
            let Peer::Perftest(p) = peer else {
                return Ok(r);
            };
            let mut alive = port_alive(&me.dev);
            let theirs = p
                .oob
                .reports(&report_of(&r, gbits), Wait::Across(&mut alive))
                .map_err(oob_err)?;
            let t = result_of(&theirs, gbits);
            out.peak += t.peak;
            out.avg += t.avg;
            out.msg_rate += t.msg_rate;
        }
        if shape == Shape::SendBw && all {
            self.pt_meet("the keys after the traffic", true)?;
        }
        Ok(out)
    }

    /// Server of a bandwidth test of `size`: a bidirectional run streams as the client
    /// does; `send_bw` receives and counts `-n` messages per QP (with `-D`: until the
    /// client's next keys, after its traffic, say it is done) and returns its own result; the other one-way tests
    /// have nothing to do per size (the client's report comes at the end, `pt_end`).
    pub fn pt_serve_bandwidth(&mut self, size: usize) -> Result<Option<BwResult>, PerfError> {
        let r = self.run_pt_serve_bandwidth(size);
        r.map_err(|e| self.explain(e))
    }

    fn run_pt_serve_bandwidth(&mut self, size: usize) -> Result<Option<BwResult>, PerfError> {
        if self.settings.bidirectional {
            return self.bandwidth(size).map(Some);
        }
        let (shape, all) = self
            .pt()
            .map_or((None, false), |p| (Some(p.shape), p.opts.all));
        if shape != Some(Shape::SendBw) {
            return Ok(None);
        }
        let nq = self.me.qps.len();
        for q in 0..nq {
            self.me.fill_recvs(q)?;
        }
        self.pt_begin()?;
        let expected = self.settings.iters * nq as u64;
        let duration = self.settings.duration.is_some();
        let start = Instant::now();
        let window = (self.settings.iters / 20).max(1);
        let mut meter = Meter::new(size, window, start);
        let mut last = start;
        let watch = if duration {
            self.me.watch.device_only()
        } else {
            self.me.watch.clone()
        };
        let mut idle = StallTimer::watching(&watch);
        let mut next_check = start;
        let mut client_done = false;
        loop {
            let n = self.me.reap_recvs()?;
            let now = if n > 0 {
                idle.restart();
                last = Instant::now();
                meter.add(n, last);
                Some(last)
            } else {
                idle.spin()?
            };
            if !duration && meter.total >= expected {
                break;
            }
            // The connection, a few times a second: the client's keys after its traffic.
            if let Some(now) = now.filter(|&t| t >= next_check) {
                next_check = now + Duration::from_millis(50);
                let p = self.pt().expect("a perftest peer");
                if p.oob
                    .arrived(super::perftest::KEYS_LEN, "the keys after the traffic")
                    .map_err(oob_err)?
                {
                    if client_done || duration {
                        break;
                    }
                    // Its last receives may still be on the way: one more look.
                    client_done = true;
                }
            }
        }
        if !duration && meter.total != expected {
            return Err(OobError::Mismatch(format!(
                "received {} messages, expected {expected} (-n {} on {nq} QPs): the two ends \
                 run different -n or -q",
                meter.total, self.settings.iters
            ))
            .into());
        }
        if all {
            self.pt_meet("the keys after the traffic", true)?;
        }
        Ok(Some(meter.result(last)))
    }

    /// The end of a perftest run, after every size (perftest's closing steps): a one-way
    /// WRITE, READ or atomic bandwidth test exchanges reports (the client's result goes
    /// to the server, which returns it here, as perftest's server prints it); every test
    /// but `write_lat` meets once more and sends `done`.
    pub fn pt_end(&mut self) -> Result<Option<BwResult>, PerfError> {
        let duplex = self.settings.bidirectional;
        let op = self.settings.op;
        let Some(p) = self.pt() else { return Ok(None) };
        let (shape, role, gbits) = (p.shape, p.oob.role(), p.opts.gbits);
        let mut theirs = None;
        match shape {
            Shape::Lat if op == Op::Write => return Ok(None),
            Shape::Bw if !duplex => {
                self.pt_meet("the keys after the traffic", true)?;
                let Some(p) = self.pt() else { return Ok(None) };
                let mine = match (role, p.last) {
                    (Role::Client, Some(r)) => report_of(&r, gbits),
                    // The server measured nothing: perftest sends what its memory held.
                    _ => Report {
                        size: 0,
                        iters: 0,
                        peak: 0.0,
                        avg: 0.0,
                        msg_rate: 0.0,
                    },
                };
                // The report follows the meeting at once (a wait across traffic here would
                // outlast a peer of another test retrying its requests for ever).
                let r = p.oob.reports(&mine, Wait::Reply).map_err(oob_err)?;
                if role == Role::Server {
                    theirs = Some(result_of(&r, gbits));
                }
            }
            _ => {}
        }
        // Closing: the last meeting (perftest's server of a READ or atomic latency test
        // waits here through the client's whole run), then `done`.
        let across = role == Role::Server;
        self.pt_meet("the closing keys", across)?;
        if let Some(p) = self.pt() {
            p.oob.done();
        }
        Ok(theirs)
    }

    /// Client or server of a latency test of `size` against perftest: `write_lat`'s
    /// ping-pong (the server writes first, each end polls its own memory for the counter
    /// perftest writes into a message's last byte), `send_lat`'s (the client sends first,
    /// after a meeting), the READ and atomic tests' requests (the client; the server has
    /// nothing to do). Returns this end's result, when it measured one.
    pub fn pt_latency(&mut self, size: usize) -> Result<Option<LatResult>, PerfError> {
        let r = self.run_pt_latency(size);
        r.map_err(|e| self.explain(e))
    }

    fn run_pt_latency(&mut self, size: usize) -> Result<Option<LatResult>, PerfError> {
        let role = match self.pt() {
            Some(p) => p.oob.role(),
            None => return Err(PerfError::Setup("not a perftest run".into())),
        };
        let op = self.settings.op;
        if role == Role::Client && matches!(op, Op::Read | Op::Atomic | Op::Send) {
            return self.latency(size).map(Some);
        }
        match op {
            Op::Read | Op::Atomic => Ok(None),
            Op::Send => {
                self.me.fill_recvs(0)?;
                self.pt_begin()?;
                let iters = self.settings.iters.max(1);
                let inline = vec![0u8; self.settings.inline_size.max(1) as usize];
                let mut samples = Vec::with_capacity(iters.min(10_000_000) as usize);
                let mut answered: Option<Instant> = None;
                for i in 0..iters {
                    await_recv(&mut self.me, self.settings.events)?;
                    let t = Instant::now();
                    if let Some(a) = answered {
                        samples.push(t.duration_since(a).as_secs_f64() * 1e6 / 2.0);
                    }
                    answered = Some(t);
                    put_send(&mut self.me, &self.settings, size, i, &inline)?;
                }
                let mut r = lat_stats(size, &mut samples);
                r.iters = iters;
                Ok(Some(r))
            }
            Op::Write => self.pt_write_lat(size, role).map(Some),
        }
    }

    /// `write_lat`'s ping-pong of `size` with a perftest peer, as `role`: iteration `i`
    /// carries `i + 1` (modulo 256) in the message's last byte; the server writes first.
    /// Each sample is half the time between two of this end's writes.
    /// With `-D` it samples until then (each end on its own clock, as perftest's alarm) and
    /// then keeps answering, unsampled, until the peer hangs up or as long again: perftest's
    /// end, started a little earlier or later, spins on its memory until its own alarm and
    /// exits only when a WRITE comes (an end that stopped at its own deadline left a
    /// perftest server spinning for minutes on soft-RoCE).
    fn pt_write_lat(&mut self, size: usize, role: Role) -> Result<LatResult, PerfError> {
        let start = Instant::now();
        let deadline = self.settings.duration.map(|d| start + d);
        let grace_end = self.settings.duration.map(|d| start + 2 * d);
        let iters = match deadline {
            Some(_) => u64::MAX,
            None => self.settings.iters.max(1),
        };
        let mut inline = vec![0u8; self.settings.inline_size.max(1) as usize];
        let mut samples = Vec::with_capacity(self.settings.iters.min(10_000_000) as usize);
        let to_peer = self.target(0);
        let rx = self.rx_off;
        let mut posted: Option<Instant> = None;
        let mut done = 0;
        // A wait for the peer's WRITE: false when the run is over (past the grace period, or
        // the peer hung up after this end's deadline).
        let wait = |me: &End, tag: u8| -> Result<bool, PerfError> {
            match await_tag_until(me, rx, size, tag, grace_end) {
                Err(PerfError::PeerHungUp) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    Ok(false)
                }
                r => r,
            }
        };
        for i in 0..iters {
            let tag = ((i + 1) & 0xff) as u8;
            if role == Role::Client && !wait(&self.me, tag)? {
                break;
            }
            let t = Instant::now();
            let sampling = deadline.is_none_or(|d| t < d);
            if let Some(p) = posted.filter(|_| sampling) {
                samples.push(t.duration_since(p).as_secs_f64() * 1e6 / 2.0);
            }
            posted = Some(t);
            // The last write is waited for: nothing follows it on the connection, and the
            // peer waits for it.
            let last = i + 1 == iters;
            let flags = if last {
                SendFlags::SIGNALED
            } else {
                pingpong_flags(&self.settings, i)
            };
            put_write_tagged(
                &mut self.me,
                to_peer,
                &self.settings,
                size,
                i,
                tag,
                flags,
                &mut inline,
            )?;
            if sampling {
                done = i + 1;
            }
            if role == Role::Server && !wait(&self.me, tag)? {
                break;
            }
            if last {
                // The peer may see this WRITE land, exit and hang up before its ACK is here:
                // that is no failure, so this wait watches the device but not the peer.
                let peer = self.me.watch.peer.take();
                let r = await_send(&mut self.me, i, self.settings.events);
                self.me.watch.peer = peer;
                r?;
            }
        }
        let mut r = lat_stats(size, &mut samples);
        r.iters = done;
        Ok(r)
    }
}

/// The byte at `offset` of the pattern `--check` puts where the peer reads or what this end
/// sends (`tests/vm/pt-check.c` computes the same): 256-byte runs, each shifted by 7 from
/// the one before, so a packet that lands in another packet's place shows.
pub fn pattern_byte(offset: usize) -> u8 {
    (offset
        .wrapping_add(7 * (offset >> 8))
        .wrapping_add(13 * (offset >> 16))
        .wrapping_add(0xa5)) as u8
}

/// Where `--check` looks after a run: the first bytes of a buffer half.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CheckAt {
    /// The half this end sends from (READ responses and receives land there).
    Own,
    /// The half the peer's requests target.
    Target,
}

/// What `--check` does on this end of a one-way WRITE, READ or SEND bandwidth run with
/// `s` and `opts` as `role`: the halves (own, target) it fills with the pattern (`true`)
/// or zeros before the run, and the half it checks after it, if this end sees the outcome.
fn check_plan(
    s: &Settings,
    opts: PtOptions,
    role: Role,
) -> Result<((bool, bool), Option<CheckAt>), PerfError> {
    if !opts.bw || s.bidirectional || s.op == Op::Atomic {
        return Err(PerfError::Setup(
            "--check takes one-way write_bw, read_bw or send_bw with perftest's exchange".into(),
        ));
    }
    Ok(match (s.op, role) {
        (Op::Write | Op::Send | Op::Atomic, Role::Client) => ((true, false), None),
        (Op::Write, Role::Server) => ((false, false), Some(CheckAt::Target)),
        (Op::Send | Op::Atomic, Role::Server) => ((false, false), Some(CheckAt::Own)),
        (Op::Read, Role::Client) => ((false, false), Some(CheckAt::Own)),
        (Op::Read, Role::Server) => ((false, true), None),
    })
}

/// `--check`, before the keys go out: every QP's buffer halves of `half` bytes (the
/// target half at `rx`) get the pattern where `fill` says (own half, target half), zeros
/// elsewhere.
fn check_fill(me: &End, half: usize, rx: usize, fill: (bool, bool)) -> Result<(), PerfError> {
    let bytes = |pattern: bool| -> Vec<u8> {
        (0..half)
            .map(|i| if pattern { pattern_byte(i) } else { 0 })
            .collect()
    };
    let (own, target) = (bytes(fill.0), bytes(fill.1));
    for b in &me.bufs {
        b.write(0, &own).map_err(PerfError::Setup)?;
        b.write(rx, &target).map_err(PerfError::Setup)?;
    }
    Ok(())
}

impl Bench {
    /// `--check`, after the run whose largest message was `size` bytes: the first `size`
    /// bytes of every QP's half where the peer's bytes landed must be the pattern. Returns
    /// the bytes checked (0 where this end cannot see the outcome: the sender of WRITEs and
    /// SENDs, the target of READs; the peer checks those), or an error naming the first
    /// byte that differs.
    pub fn pt_check(&self, size: usize) -> Result<usize, PerfError> {
        let (opts, role) = match &self.peer {
            Peer::Perftest(p) => (p.opts, p.oob.role()),
            _ => return Err(PerfError::Setup("--check needs a perftest peer".into())),
        };
        let (_, at) = check_plan(&self.settings, opts, role)?;
        let Some(at) = at else { return Ok(0) };
        let off = match at {
            CheckAt::Own => 0,
            CheckAt::Target => self.rx_off,
        };
        let mut got = vec![0u8; size];
        for (q, b) in self.me.bufs.iter().enumerate() {
            b.read(off, &mut got).map_err(PerfError::Setup)?;
            let bad = got
                .iter()
                .enumerate()
                .filter(|&(i, &x)| x != pattern_byte(i))
                .map(|(i, _)| i);
            let (mut n, mut first) = (0, None);
            for i in bad {
                n += 1;
                first.get_or_insert(i);
            }
            if let Some(i) = first {
                return Err(PerfError::BytesDiffer(format!(
                    "QP {q}: {n} of the {size} bytes the peer's messages left differ \
                     from the pattern, the first at offset {i} ({:#04x}, expected {:#04x})",
                    got[i],
                    pattern_byte(i)
                )));
            }
        }
        Ok(size * self.me.bufs.len())
    }
}

/// Waits until the last of the first `size` bytes of `dst`'s receiving half (at `rx`) is
/// `tag`: true, or false once `deadline` has passed without it. The stall limit holds as
/// in the ping-pongs without a deadline.
fn await_tag_until(
    dst: &End,
    rx: usize,
    size: usize,
    tag: u8,
    deadline: Option<Instant>,
) -> Result<bool, PerfError> {
    // With a deadline (-D) the peer may finish first and close: not a failure here.
    let watch = if deadline.is_some() {
        dst.watch.device_only()
    } else {
        dst.watch.clone()
    };
    let mut timer = StallTimer::watching(&watch);
    let mut b = [0u8; 1];
    loop {
        dst.bufs[0]
            .read(rx + size - 1, &mut b)
            .map_err(setup("buffer"))?;
        if b[0] == tag {
            return Ok(true);
        }
        let now = match timer.spin() {
            // The peer exits once its last WRITE is acknowledged, so its data is here by
            // then: a hang-up seen after the look above is no failure if a second look
            // finds the byte (write_lat's server failed so at the end of 1 run in 12).
            Err(PerfError::PeerHungUp) => {
                dst.bufs[0]
                    .read(rx + size - 1, &mut b)
                    .map_err(setup("buffer"))?;
                return if b[0] == tag {
                    Ok(true)
                } else {
                    Err(PerfError::PeerHungUp)
                };
            }
            r => r?,
        };
        if let Some(now) = now
            && deadline.is_some_and(|d| now >= d)
        {
            return Ok(false);
        }
    }
}

/// A look at the port for signs of life: true when its packet counters moved since the
/// last look (the peer's traffic, or ours to it, is still going).
fn port_alive(dev: &Device) -> impl FnMut() -> bool + '_ {
    let count = move || {
        dev.port_counters(1, false)
            .map(|c| c.port_rcv_packets + c.port_xmit_packets)
            .ok()
    };
    let mut last = count();
    move || {
        let now = count();
        let moved = now.is_some() && now != last;
        last = now;
        moved
    }
}

/// The checks perftest's keys allow before the connection: `ours` and the peer's `theirs`.
fn check_peer(ours: &Keys, theirs: &Keys, op: Op) -> Result<(), PerfError> {
    if v4_mapped(&ours.gid) != v4_mapped(&theirs.gid) {
        let kind = |g: &[u8; 16]| if v4_mapped(g) { "IPv4" } else { "IPv6" };
        return Err(OobError::Mismatch(format!(
            "GID types differ: this end's GID is {} ({}), the peer's {} ({}); choose GIDs of \
             one kind with -x on both ends",
            uhca::info::format_gid(&ours.gid),
            kind(&ours.gid),
            uhca::info::format_gid(&theirs.gid),
            kind(&theirs.gid)
        ))
        .into());
    }
    if matches!(op, Op::Write | Op::Send) && theirs.out_reads != 1 {
        return Err(OobError::Mismatch(format!(
            "the perftest peer takes {} outstanding reads: it runs a READ or atomic test, this \
             end a {} test",
            theirs.out_reads,
            if op == Op::Write { "WRITE" } else { "SEND" }
        ))
        .into());
    }
    Ok(())
}

fn oob_err(e: OobError) -> PerfError {
    PerfError::Perftest(e)
}

#[cfg(test)]
mod tests;

impl PtPeer {
    /// Whether the connection shows the peer gone.
    pub(super) fn gone(&mut self) -> Option<OobError> {
        self.oob.gone()
    }
}

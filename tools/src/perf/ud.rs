//! `-c UD` (perftest's connection type flag): `send_bw` and `send_lat` over UD QPs, both
//! ends in this process (one model HCA in loopback, or two linked with `--pair`); between
//! two processes, [`super::ud_remote`] uses the same end.
//!
//! Each end has a UD QP (Q_Key [`QKEY`], the run's MTU), a CQ, an address handle to the
//! other end's GID 0 and MAC, and one buffer: the send area first, then [`RX_DEPTH`]
//! receive slots of `GRH_SIZE + size` bytes (every UD message lands behind its 40-byte
//! GRH). As in perftest, a UD message is at most one MTU.
//!
//! - `send_lat`: a ping-pong of SENDs (inline up to `-I`); each iteration's sample is half
//!   the round trip, as for RC.
//! - `send_bw`: the client streams with `-t` outstanding and a completion every quarter of
//!   the depth; the server's receives are posted again as they complete, in the same
//!   loop. UD has no flow control (a datagram that finds no receive posted, or no room on
//!   the link, is dropped), so the client stays at most `-t` datagrams (and at most the
//!   model link's 128 frames) ahead of the server's receives; the run fails if the server
//!   received fewer than were sent.

use std::time::Instant;

use uhca::Device;
use uhca::datapath::{Completion, Sge, WcOpcode};
use uhca::datapath::{Local, SendFlags};
use uhca::pci::model::ModelFunction;
use uhca::resource::{
    Ah, AhAttr, Cq, CqConfig, GRH_SIZE, Mr, QpConfig, UdDest, UdParams, UdQp, UdSendWr,
};

use super::bench::local_devices;
use super::meter::Meter;
use super::wait::STALL;
use super::{BwResult, LatResult, PerfError, Settings, check, lat_stats, setup};

/// The Q_Key both ends use.
pub const QKEY: u32 = 0x1111_1111;
/// Receives each end keeps posted.
pub const RX_DEPTH: u32 = 512;

/// One end: its device, QP, CQ and buffer.
pub(super) struct UdEnd {
    pub(super) dev: Device,
    pub(super) qp: UdQp,
    pub(super) cq: Cq,
    pub(super) buf: Mr,
    /// Bytes of each receive slot (GRH + the largest message).
    slot: usize,
    /// Receives posted so far (the next slot is this modulo [`RX_DEPTH`]).
    posted: u64,
    _pd: uhca::resource::Pd,
}

impl UdEnd {
    pub(super) fn new(dev: &Device, s: &Settings, max_size: usize) -> Result<UdEnd, PerfError> {
        let pd = dev.alloc_pd().map_err(setup("PD"))?;
        let cq = dev
            .create_cq(&CqConfig {
                entries: s.tx_depth + RX_DEPTH,
                events: false,
            })
            .map_err(setup("CQ"))?;
        let cfg = QpConfig {
            max_send_wr: s.tx_depth,
            max_recv_wr: RX_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: s.inline_size.min(188),
        };
        let mut qp = dev
            .create_ud_qp(&pd, &cq, &cq, &cfg)
            .map_err(setup("UD QP"))?;
        let mut p = UdParams::new(QKEY);
        p.mtu = Some(s.mtu);
        qp.activate(&p).map_err(setup("activating the UD QP"))?;
        let slot = GRH_SIZE + max_size.max(1);
        let buf = pd
            .alloc_mr(
                max_size.max(64) + RX_DEPTH as usize * slot,
                uhca::resource::Access::LOCAL_WRITE,
            )
            .map_err(setup("buffer"))?;
        Ok(UdEnd {
            dev: dev.clone(),
            qp,
            cq,
            buf,
            slot,
            posted: 0,
            _pd: pd,
        })
    }

    /// Posts `n` receives into the next slots.
    pub(super) fn post_recvs(&mut self, n: u64) -> Result<(), PerfError> {
        let base = self.buf.len() - RX_DEPTH as usize * self.slot;
        for _ in 0..n {
            let k = (self.posted % u64::from(RX_DEPTH)) as usize;
            let sge = Sge::of(&self.buf, base + k * self.slot, self.slot)
                .ok_or_else(|| PerfError::Setup("receive slot outside the buffer".into()))?;
            self.qp.post_recv(self.posted, &[sge])?;
            self.posted += 1;
        }
        Ok(())
    }
}

/// Keeps the sizes of a `-a` run that fit one `mtu`-byte packet, or refuses a `-s` above
/// it (perftest's UD tests go up to the MTU).
pub fn check_sizes(sizes: &mut Vec<usize>, all: bool, mtu: usize) -> Result<(), String> {
    if all {
        sizes.retain(|&s| s <= mtu);
    } else if let Some(&s) = sizes.iter().find(|&&s| s > mtu) {
        return Err(format!(
            "-s {s}: a UD message is at most one MTU ({mtu} bytes; -m sets it)"
        ));
    }
    Ok(())
}

/// The next completion of `cq`, or [`PerfError::Stalled`] after [`STALL`] without one (a
/// lost device ends the wait too).
pub(super) fn wait_one(dev: &Device, cq: &mut Cq) -> Result<Completion, PerfError> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(c) = cq.poll().next() {
            let c = check(c)?;
            return Ok(c);
        }
        spins += 1;
        if spins.is_multiple_of(1024) {
            if dev.is_lost() {
                return Err(PerfError::Setup("the device was lost".into()));
            }
            if start.elapsed() > STALL {
                return Err(PerfError::Stalled(STALL));
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The SGE of a `size`-byte message at the start of `buf`.
pub(super) fn message_sge(buf: &Mr, size: usize) -> Result<[Sge; 1], PerfError> {
    Ok([Sge::of(buf, 0, size)
        .ok_or_else(|| PerfError::Setup("message larger than the buffer".into()))?])
}

/// The message: inline (from `inline`) up to `-I`, else `sge`.
pub(super) fn message<'a>(
    s: &Settings,
    size: usize,
    inline: &'a [u8],
    sge: &'a [Sge; 1],
) -> Local<'a> {
    if size <= s.inline_size as usize && size <= inline.len() {
        Local::Inline(&inline[..size])
    } else {
        Local::Sges(sge)
    }
}

/// Both ends of a UD run (see the module docs).
pub struct UdBench {
    client: UdEnd,
    server: UdEnd,
    /// Client to server and back.
    to_server: Ah,
    to_client: Ah,
    settings: Settings,
    _models: Vec<std::sync::Arc<ModelFunction>>,
}

impl UdBench {
    /// Boots the model(s) and makes both ends for messages up to `max_size` (at most the
    /// MTU: the caller checks, as perftest refuses larger UD messages).
    pub fn new(s: &Settings, max_size: usize, pair: bool) -> Result<UdBench, PerfError> {
        let (models, dev_c, dev_s) = local_devices(s, pair)?;
        let mut client = UdEnd::new(&dev_c, s, max_size)?;
        let mut server = UdEnd::new(&dev_s, s, max_size)?;
        let ah = |from: &Device, to: &Device| -> Result<Ah, PerfError> {
            let a = to.roce_address(0).map_err(setup("GID"))?;
            from.create_ah(&AhAttr::with_mac(a.gid, a.mac))
                .map_err(setup("address handle"))
        };
        let to_server = ah(&dev_c, &dev_s)?;
        let to_client = ah(&dev_s, &dev_c)?;
        client.post_recvs(u64::from(RX_DEPTH))?;
        server.post_recvs(u64::from(RX_DEPTH))?;
        Ok(UdBench {
            client,
            server,
            to_server,
            to_client,
            settings: s.clone(),
            _models: models,
        })
    }

    /// The client's device.
    pub fn device(&self) -> &Device {
        &self.client.dev
    }

    /// The run's header as perftest prints it (between its ruler lines): `title` the test's
    /// name, `bw` a bandwidth test, `pair` two linked models.
    pub fn header(&self, title: &str, bw: bool, pair: bool) -> String {
        let s = &self.settings;
        let kind = if bw { "BW" } else { "Latency" };
        let device = if pair {
            "uhca model x2 (linked)"
        } else {
            "uhca model (loopback)"
        };
        let (c, sv) = self.qpns();
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
                " local address: QPN {c:#06x}, remote address: QPN {sv:#06x}, Q_Key {QKEY:#010x}"
            ),
        ]
        .join("\n")
    }

    /// The QPNs of both ends (client, server).
    pub fn qpns(&self) -> (u32, u32) {
        (self.client.qp.qpn(), self.server.qp.qpn())
    }

    /// Sends the message `local` of `from` to `dest` (and rings the doorbell).
    fn send(
        from: &mut UdEnd,
        dest: UdDest<'_>,
        local: Local<'_>,
        wr_id: u64,
        flags: SendFlags,
    ) -> Result<(), PerfError> {
        from.qp.post_send(&UdSendWr {
            wr_id,
            dest,
            local,
            imm: None,
            flags,
        })?;
        from.qp.ring_doorbell();
        Ok(())
    }

    /// Waits for `end`'s next receive (taking send completions on the way) and posts its
    /// slot again.
    fn await_recv(end: &mut UdEnd) -> Result<(), PerfError> {
        loop {
            let c = wait_one(&end.dev, &mut end.cq)?;
            if c.opcode == WcOpcode::Recv {
                return end.post_recvs(1);
            }
        }
    }

    /// `send_lat -c UD` for `size`-byte messages.
    pub fn latency(&mut self, size: usize) -> Result<LatResult, PerfError> {
        let s = self.settings.clone();
        let iters = if s.duration.is_some() {
            u64::MAX
        } else {
            s.iters.max(1)
        };
        let mut samples = Vec::with_capacity(s.iters.min(10_000_000) as usize);
        let inline = vec![0x5Au8; s.inline_size.min(188) as usize];
        let (cq, sq) = self.qpns();
        // A completion every half the depth keeps the send queue from filling: a run
        // leaves fewer than that unsignaled behind, and the next one's first completion
        // takes them.
        let sig = u64::from((s.tx_depth / 2).max(1));
        let (sge_c, sge_s) = (
            message_sge(&self.client.buf, size)?,
            message_sge(&self.server.buf, size)?,
        );
        let start = Instant::now();
        let mut i = 0u64;
        while i < iters && s.duration.is_none_or(|d| start.elapsed() < d) {
            let flags = if i % sig == sig - 1 {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            let dest = |ah, remote_qpn| UdDest {
                ah,
                remote_qpn,
                qkey: QKEY,
            };
            let t0 = Instant::now();
            let local = message(&s, size, &inline, &sge_c);
            Self::send(&mut self.client, dest(&self.to_server, sq), local, i, flags)?;
            Self::await_recv(&mut self.server)?;
            let local = message(&s, size, &inline, &sge_s);
            Self::send(&mut self.server, dest(&self.to_client, cq), local, i, flags)?;
            Self::await_recv(&mut self.client)?;
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            i += 1;
        }
        Ok(lat_stats(size, &mut samples))
    }

    /// `send_bw -c UD` for `size`-byte messages (see the module docs).
    pub fn bandwidth(&mut self, size: usize) -> Result<BwResult, PerfError> {
        let s = self.settings.clone();
        let depth = u64::from(s.tx_depth.max(1));
        // UD has no flow control: the client stays at most this many datagrams ahead of
        // the server's receives, within the receives posted and the model link's queue
        // (`LinkConfig::default().depth` frames; a burst past it is lost, as on a wire).
        let window = depth
            .min(u64::from(RX_DEPTH))
            .min(uhca::hw::link::LinkConfig::default().depth as u64);
        let cq_mod = s.cq_mod.map_or(depth / 4, u64::from).clamp(1, depth);
        let iters = if s.duration.is_some() {
            u64::MAX
        } else {
            s.iters.max(1)
        };
        let inline = vec![0x5Au8; s.inline_size.min(188) as usize];
        let sq = self.server.qp.qpn();
        let sge = message_sge(&self.client.buf, size)?;
        let start = Instant::now();
        let mut meter = Meter::new(size, 0, start);
        let (mut posted, mut done, mut received) = (0u64, 0u64, 0u64);
        let mut last_progress = Instant::now();
        let ended =
            |posted: u64| posted >= iters || s.duration.is_some_and(|d| start.elapsed() >= d);
        loop {
            // Post while the queue has room (a completion frees `cq_mod` at a time), at most
            // as many as the server has receives for.
            let batch_at = Instant::now();
            let before = posted;
            while !ended(posted) && posted - done < depth && posted - received < window {
                let last = posted + 1 == iters;
                let flags = if (posted + 1).is_multiple_of(cq_mod) || last {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                };
                let local = message(&s, size, &inline, &sge);
                let r = self.client.qp.post_send(&UdSendWr {
                    wr_id: posted,
                    dest: UdDest {
                        ah: &self.to_server,
                        remote_qpn: sq,
                        qkey: QKEY,
                    },
                    local,
                    imm: None,
                    flags,
                });
                match r {
                    Ok(()) => posted += 1,
                    // Unsignaled sends of an earlier latency run still hold blocks; the
                    // next completion frees them.
                    Err(uhca::datapath::PostError::QueueFull) => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if posted > before {
                meter.posted(before, batch_at);
                self.client.qp.ring_doorbell();
            }
            // Completions: the client's sends, the server's receives (posted again).
            let mut moved = false;
            for c in self.client.cq.poll() {
                let c = check(c)?;
                // Completions of this run's sends only (earlier unsignaled ones complete
                // in passing and report nothing).
                let n = (c.wr_id + 1).saturating_sub(done);
                done = done.max(c.wr_id + 1);
                meter.add(n, Instant::now());
                moved = true;
            }
            let mut got = 0;
            for c in self.server.cq.poll() {
                let c = check(c)?;
                // Its own send completions (of a latency run) count for nothing here.
                if c.opcode == WcOpcode::Recv {
                    got += 1;
                }
            }
            if got > 0 {
                received += got;
                self.server.post_recvs(got)?;
                moved = true;
            }
            if ended(posted) && done == posted && received == posted {
                break;
            }
            if moved {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > STALL {
                if done == posted && received < posted {
                    return Err(PerfError::Setup(format!(
                        "the server received {received} of {posted} datagrams (UD drops what finds no receive)"
                    )));
                }
                return Err(PerfError::Stalled(STALL));
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(meter.result(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::Op;
    use crate::perf::tests::settings;

    /// Every datagram of a run arrives (the server counted as many receives as the client
    /// sent), in loopback and between two linked models, inline and not.
    #[test]
    fn ud_runs_count_every_message_both_ways() {
        for (pair, inline) in [(false, 0), (true, 64)] {
            let mut s = settings(Op::Send, 300, 16);
            s.inline_size = inline;
            let mut b = UdBench::new(&s, 1024, pair).unwrap();
            for size in [1, 64, 1024] {
                let r = b.bandwidth(size).unwrap();
                assert_eq!((r.size, r.iters), (size, 300), "pair {pair}");
                assert!(r.avg > 0.0);
                let l = b.latency(size).unwrap();
                assert_eq!(l.iters, 300);
                assert!(l.min <= l.typical && l.typical <= l.max);
            }
            let stats = b._models[0].hca().stats();
            assert_eq!(stats.ud_dropped, 0, "no datagram dropped");
        }
    }
}

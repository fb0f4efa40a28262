//! The latency loop of the driving end ([`Bench::latency`]) and its ping-pong steps, which
//! perftest's WRITE ping-pong (`pt_run`) uses too.

use std::time::Instant;

use uhca::datapath::{Local, SendFlags, SendOp, SendWr};
use uhca::datapath::{Remote, WcOpcode};

use super::bench::{Bench, Peer};
use super::end::End;
use super::stream::make_wr;
use super::wait::{StallTimer, wait_one};
use super::{LatResult, Op, PerfError, Settings, check, lat_stats, role, setup};

impl Bench {
    /// Latency of `size`-byte messages on QP 0: ping-pong (half the round trip) for WRITE and
    /// SEND, request to completion for READ and atomics. With a remote server, it is told
    /// first (START/READY) and last (DONE/ACK).
    pub fn latency(&mut self, size: usize) -> Result<LatResult, PerfError> {
        if self.settings.op == Op::Write && matches!(self.peer, Peer::Perftest(_)) {
            // perftest's WRITE ping-pong: its own order and counter.
            return self.pt_latency(size)?.ok_or_else(|| {
                PerfError::Setup("the write_lat ping-pong measured nothing".into())
            });
        }
        let r = self.run_latency(size);
        r.map_err(|e| self.explain(e))
    }

    fn run_latency(&mut self, size: usize) -> Result<LatResult, PerfError> {
        let s = self.settings.clone();
        let iters = if s.duration.is_some() {
            u64::MAX
        } else {
            s.iters.max(1)
        };
        let mut samples = Vec::with_capacity(s.iters.min(10_000_000) as usize);
        let mut inline = vec![0u8; s.inline_size.max(1) as usize];
        if s.op == Op::Send {
            if let Peer::Local(server) = &mut self.peer {
                server.fill_recvs(0)?;
            }
            self.me.fill_recvs(0)?;
        }
        self.begin(size)?;
        let start = Instant::now();
        let mut next_beat = start + role::BEAT;
        let mut i = 0u64;
        while i < iters && s.duration.is_none_or(|d| start.elapsed() < d) {
            let t0 = Instant::now();
            match s.op {
                Op::Write => self.pingpong_write(size, i, &mut inline)?,
                Op::Send => self.pingpong_send(size, i, &inline)?,
                Op::Read | Op::Atomic => {
                    let local = self.me.sge(0, size);
                    let remote = self.target(0);
                    let wr = make_wr(&s, size, i, SendFlags::SIGNALED, &local, &inline, remote);
                    self.me.qps[0].post_send(&wr)?;
                    self.me.qps[0].ring_doorbell();
                    wait_one(&self.me.watch, &mut self.me.cq, s.events)?;
                }
            }
            let t1 = Instant::now();
            let dt = t1.duration_since(t0).as_secs_f64() * 1e6;
            samples.push(if matches!(s.op, Op::Write | Op::Send) {
                dt / 2.0
            } else {
                dt
            });
            self.beat(t1, &mut next_beat)?;
            i += 1;
        }
        self.finish(size, i)?;
        Ok(lat_stats(size, &mut samples))
    }

    /// One ping-pong of WRITEs: this end writes `size` bytes ending in the iteration's tag
    /// into the peer's buffer; the peer sees the tag and writes back; this end sees it.
    /// `inline` is the inline data buffer (zeros but for the tag), reused by every
    /// iteration: nothing is cleared or copied on the way to the doorbell.
    fn pingpong_write(&mut self, size: usize, i: u64, inline: &mut [u8]) -> Result<(), PerfError> {
        let tag = tag(i);
        let (s, rx) = (&self.settings, self.rx_off);
        let to_peer = self.target(0);
        put_write(&mut self.me, to_peer, s, size, i, inline)?;
        if let Peer::Local(server) = &mut self.peer {
            await_tag(server, rx, size, tag)?;
            let to_client = self.me.bufs[0].remote(rx as u64);
            put_write(server, to_client, s, size, i, inline)?;
        }
        await_tag(&self.me, rx, size, tag)
    }

    /// One ping-pong of SENDs: this end sends, the peer receives and sends back.
    fn pingpong_send(&mut self, size: usize, i: u64, inline: &[u8]) -> Result<(), PerfError> {
        put_send(&mut self.me, &self.settings, size, i, inline)?;
        if let Peer::Local(server) = &mut self.peer {
            await_recv(server, self.settings.events)?;
            put_send(server, &self.settings, size, i, inline)?;
        }
        await_recv(&mut self.me, self.settings.events)
    }
}

/// The tag of ping-pong iteration `i`: consecutive tags differ and are never 0 (the buffers
/// start zeroed).
pub(super) fn tag(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Completions of ping-pong requests are asked for once per half the depth.
pub(super) fn pingpong_flags(s: &Settings, i: u64) -> SendFlags {
    let sig = u64::from((s.tx_depth / 2).max(1));
    if i % sig == sig - 1 {
        SendFlags::SIGNALED
    } else {
        SendFlags::NONE
    }
}

/// Writes `size` bytes ending in iteration `i`'s tag from `src` to `remote` (inline when
/// `s` allows), and takes the completions that have come.
pub(super) fn put_write(
    src: &mut End,
    remote: Remote,
    s: &Settings,
    size: usize,
    i: u64,
    inline: &mut [u8],
) -> Result<(), PerfError> {
    let flags = pingpong_flags(s, i);
    put_write_tagged(src, remote, s, size, i, tag(i), flags, inline)
}

/// [`put_write`] with the last byte `tag` and `flags` given.
#[allow(clippy::too_many_arguments)]
pub(super) fn put_write_tagged(
    src: &mut End,
    remote: Remote,
    s: &Settings,
    size: usize,
    i: u64,
    tag: u8,
    flags: SendFlags,
    inline: &mut [u8],
) -> Result<(), PerfError> {
    let local_inline = size <= s.inline_size as usize && size <= inline.len();
    if local_inline {
        inline[size - 1] = tag;
    } else {
        src.bufs[0]
            .write(size - 1, &[tag])
            .map_err(setup("buffer"))?;
    }
    let sge = src.sge(0, size);
    let local = if local_inline {
        Local::Inline(&inline[..size])
    } else {
        Local::Sges(&sge)
    };
    src.qps[0].post_send(&SendWr {
        wr_id: i,
        op: SendOp::Write { local, remote },
        flags,
    })?;
    src.qps[0].ring_doorbell();
    for c in src.cq.poll() {
        check(c)?;
    }
    Ok(())
}

/// Waits until the last byte of the first `size` bytes of `dst`'s receiving half is `tag`.
pub(super) fn await_tag(dst: &End, rx: usize, size: usize, tag: u8) -> Result<(), PerfError> {
    let mut timer = StallTimer::watching(&dst.watch);
    let mut b = [0u8; 1];
    loop {
        dst.bufs[0]
            .read(rx + size - 1, &mut b)
            .map_err(setup("buffer"))?;
        if b[0] == tag {
            return Ok(());
        }
        timer.spin()?;
    }
}

/// SENDs `size` bytes from `src` (inline when `s` allows). Its completion is taken by the
/// next [`await_recv`] on `src`, which polls the same CQ: polling here could take the
/// receive completion of the answer too.
pub(super) fn put_send(
    src: &mut End,
    s: &Settings,
    size: usize,
    i: u64,
    inline: &[u8],
) -> Result<(), PerfError> {
    let sge = src.sge(0, size);
    let local = if size <= s.inline_size as usize {
        Local::Inline(&inline[..size])
    } else {
        Local::Sges(&sge)
    };
    src.qps[0].post_send(&SendWr {
        wr_id: i,
        op: SendOp::Send { local },
        flags: pingpong_flags(s, i),
    })?;
    src.qps[0].ring_doorbell();
    Ok(())
}

/// Waits for a receive completion on `dst` (taking send completions on the way) and posts
/// a receive in its place.
pub(super) fn await_recv(dst: &mut End, events: bool) -> Result<(), PerfError> {
    loop {
        let c = wait_one(&dst.watch, &mut dst.cq, events)?;
        if c.opcode == WcOpcode::Recv {
            break;
        }
    }
    dst.post_recvs(0, 1)
}

/// Waits for the completion of the send request `wr_id` on `dst` (taking the earlier ones
/// on the way; every completion on its CQ here is a send's).
pub(super) fn await_send(dst: &mut End, wr_id: u64, events: bool) -> Result<(), PerfError> {
    loop {
        let c = wait_one(&dst.watch, &mut dst.cq, events)?;
        if c.opcode != WcOpcode::Recv && c.wr_id == wr_id {
            return Ok(());
        }
    }
}

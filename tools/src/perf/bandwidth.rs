//! The bandwidth loop of the driving end ([`Bench::bandwidth`]): every QP streams, `-b`
//! both ways; the server's side of uhca-perf's exchange is in [`super::remote`], perftest's
//! in `pt_run`.

use std::time::{Duration, Instant};

use uhca::datapath::Remote;

use super::bench::{Bench, Peer};
use super::meter::Meter;
use super::stream::{Pace, Stream};
use super::wait::CqWait;
use super::{BwResult, Op, PerfError, deadline, progress, remote};

impl Bench {
    /// Streams messages of `size` on every QP, `tx_depth` outstanding, one signaled WQE per
    /// quarter of the depth, one doorbell per batch. With a remote server, it is told
    /// first (START/READY) and last (DONE/ACK).
    pub fn bandwidth(&mut self, size: usize) -> Result<BwResult, PerfError> {
        let r = self.run_bandwidth(size);
        r.map_err(|e| self.explain(e))
    }

    fn run_bandwidth(&mut self, size: usize) -> Result<BwResult, PerfError> {
        let s = self.settings.clone();
        let nq = s.qps as usize;
        let pace = Pace::new(&s, size);
        let iters = pace.iters;
        // The other direction of `-b`: the local peer streams into this end's buffers here;
        // a remote server streams on its own and reports at the end (`finish`).
        let both = s.bidirectional && matches!(self.peer, Peer::Local(_));
        if s.op == Op::Send {
            if let Peer::Local(server) = &mut self.peer {
                for q in 0..nq {
                    server.fill_recvs(q)?;
                }
            }
            if s.bidirectional {
                for q in 0..nq {
                    self.me.fill_recvs(q)?;
                }
            }
        }
        self.begin(size)?;
        let to_peer: Vec<Remote> = (0..nq).map(|q| self.target(q)).collect();
        let to_me: Vec<Remote> = (0..nq)
            .map(|q| self.me.bufs[q].remote(self.rx_off as u64))
            .collect();
        let (mut mine, mut theirs) = (Stream::new(nq), Stream::new(nq));
        let start = Instant::now();
        // The time as last read: on progress, and every SPINS_PER_CLOCK idle loops.
        let mut now = start;
        let mut next_beat = start + remote::BEAT;
        let mut idle = CqWait::new(s.events, &self.me.watch);
        let mut meter = Meter::new(size, pace.window(), start);
        let deadline = s.duration.map(|d| deadline(start, d));
        // On a terminal, a live rate once a second (the first after a second).
        let (live, mut drawn) = (progress::live(), false);
        let mut next_live = start + Duration::from_secs(1);
        // Messages posted in all (both directions with -b), for the peak's post times.
        let posted = |a: &Stream, b: &Stream| -> u64 { a.posted.iter().chain(&b.posted).sum() };
        loop {
            let stop = deadline.is_some_and(|d| now >= d);
            // `now` was read before these posts: a post time no later than theirs.
            let before = posted(&mine, &theirs);
            self.me.pump(&mut mine, &to_peer, &pace, stop)?;
            let mut progressed = self.me.reap(&mut mine)?;
            if let Peer::Local(server) = &mut self.peer {
                if both {
                    server.pump(&mut theirs, &to_me, &pace, stop)?;
                    progressed += server.reap(&mut theirs)?;
                } else if s.op == Op::Send {
                    server.reap_recvs()?;
                }
            }
            if posted(&mine, &theirs) > before {
                meter.posted(before, now);
            }
            if progressed > 0 {
                now = Instant::now();
                idle.progress();
                meter.add(progressed, now);
            } else if let Some(t) = idle.idle(&mut self.me.cq)? {
                now = t;
            }
            self.beat(now, &mut next_beat)?;
            if live && now >= next_live {
                next_live = now + Duration::from_secs(1);
                let secs = now.duration_since(start).as_secs_f64();
                eprint!("{}", progress::live_line(meter.total, size, secs));
                drawn = true;
            }
            let settled = |st: &Stream| {
                (0..nq).all(|q| st.done[q] == st.posted[q])
                    && (stop || (deadline.is_none() && st.done.iter().all(|&d| d >= iters)))
            };
            if settled(&mine) && (!both || settled(&theirs)) {
                break;
            }
        }
        let end = Instant::now();
        if drawn {
            eprint!("{}", progress::LIVE_CLEAR);
        }
        let r = meter.result(end);
        if matches!(self.peer, Peer::Perftest(_)) {
            return self.pt_finish_bw(r);
        }
        let mine_total: u64 = mine.done.iter().sum();
        Ok(match self.finish(size, mine_total)? {
            Some((their_iters, their_peak)) => {
                remote::both_ways(r, their_iters, their_peak, start, end)
            }
            None => r,
        })
    }
}

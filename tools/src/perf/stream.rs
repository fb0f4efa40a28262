//! The posting and completion steps of a bandwidth run, one direction each
//! ([`Stream`]): what `Bench::bandwidth` runs once per direction (twice with `-b`).

use uhca::datapath::{Remote, Sge, WcOpcode};
use uhca::resource::{Local, SendFlags, SendOp, SendWr};

use super::end::End;
use super::{MAX_QPS, Op, PerfError, PostError, Settings, check};

/// A request of the test's kind: `size` bytes of `local` (inline when the settings allow)
/// to `remote`.
pub(super) fn make_wr<'a>(
    s: &Settings,
    size: usize,
    wr_id: u64,
    flags: SendFlags,
    local: &'a [Sge; 1],
    inline: &'a [u8],
    remote: Remote,
) -> SendWr<'a> {
    let data = if size <= s.inline_size as usize && s.op != Op::Read {
        Local::Inline(&inline[..size])
    } else {
        Local::Sges(local)
    };
    let op = match s.op {
        Op::Write => SendOp::Write {
            local: data,
            remote,
        },
        Op::Read => SendOp::Read { local, remote },
        Op::Send => SendOp::Send { local: data },
        Op::Atomic => SendOp::FetchAdd {
            local: local[0],
            remote,
            add: 1,
        },
    };
    SendWr { wr_id, op, flags }
}

/// One direction of a bandwidth run: what an end has posted and seen completed per QP.
pub(super) struct Stream {
    pub(super) posted: Vec<u64>,
    pub(super) done: Vec<u64>,
}

impl Stream {
    /// Nothing posted yet on `qps` QPs.
    pub(super) fn new(qps: usize) -> Stream {
        Stream {
            posted: vec![0; qps],
            done: vec![0; qps],
        }
    }
}

/// How a bandwidth run of `size`-byte messages posts, from its settings: how many
/// messages per QP (unbounded with `-D`), the completion interval and list length
/// (`Settings::pacing`), and the inline data.
pub(super) struct Pace<'a> {
    pub(super) s: &'a Settings,
    pub(super) size: usize,
    pub(super) iters: u64,
    pub(super) sig_every: u64,
    pub(super) list: Option<u64>,
    pub(super) inline: Vec<u8>,
}

impl Pace<'_> {
    /// The pace of `size`-byte messages under `s`.
    pub(super) fn new(s: &Settings, size: usize) -> Pace<'_> {
        let (sig_every, list) = s.pacing();
        Pace {
            s,
            size,
            iters: if s.duration.is_some() {
                u64::MAX
            } else {
                s.iters
            },
            sig_every,
            list,
            inline: vec![0xA5; s.inline_size as usize],
        }
    }

    /// Messages per peak-bandwidth window: a twentieth of the run, at least one
    /// completion interval.
    pub(super) fn window(&self) -> u64 {
        (self.s.iters / 20).max(self.sig_every).max(1)
    }
}

impl End {
    /// Posts on every QP what the depth allows (none once `stop`), in lists of `p.list`,
    /// to `targets[q]`.
    pub(super) fn pump(
        &mut self,
        st: &mut Stream,
        targets: &[Remote],
        p: &Pace<'_>,
        stop: bool,
    ) -> Result<(), PerfError> {
        for (q, &target) in targets.iter().enumerate().take(self.qps.len()) {
            let local = self.sge(q, p.size);
            let cap = st.done[q] + u64::from(p.s.tx_depth);
            let limit = if stop { st.posted[q] } else { cap.min(p.iters) };
            // Lists of `list` requests, each rung once; a shorter one only at the end.
            'lists: loop {
                let n = list_len(limit - st.posted[q], p.iters - st.posted[q], p.list);
                if n == 0 {
                    break;
                }
                let end = st.posted[q] + n;
                while st.posted[q] < end {
                    let i = st.posted[q];
                    let flags = if (i + 1).is_multiple_of(p.sig_every) || i + 1 == p.iters {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    };
                    let wr = make_wr(p.s, p.size, i, flags, &local, &p.inline, target);
                    match self.qps[q].post_send(&wr) {
                        Ok(()) => st.posted[q] += 1,
                        Err(PostError::QueueFull) => {
                            self.qps[q].ring_doorbell();
                            break 'lists;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                self.qps[q].ring_doorbell();
            }
        }
        Ok(())
    }

    /// Takes the completions waiting: send completions advance `st` (returns how many
    /// messages completed); a receive is posted again for each receive completion.
    pub(super) fn reap(&mut self, st: &mut Stream) -> Result<u64, PerfError> {
        let mut progressed = 0;
        self.reap_with(|q, wr_id| {
            progressed += wr_id + 1 - st.done[q];
            st.done[q] = wr_id + 1;
        })?;
        Ok(progressed)
    }

    /// Polls the CQ once and posts a receive for each receive completed; returns how many
    /// (send completions are ignored: an end that only receives has none).
    pub(super) fn reap_recvs(&mut self) -> Result<u64, PerfError> {
        self.reap_with(|_, _| {})
    }

    /// Polls the CQ once: hands each send completion's QP index and `wr_id` to `sent`,
    /// posts a receive again for each receive completion and returns how many there were.
    /// Nothing is allocated: this runs in the measured loop.
    fn reap_with(&mut self, mut sent: impl FnMut(usize, u64)) -> Result<u64, PerfError> {
        let mut recvs = 0u64;
        let mut per_qp = [0u32; MAX_QPS as usize];
        for c in self.cq.poll() {
            let c = check(c)?;
            let q = self.qps.iter().position(|x| x.qpn() == c.qpn).unwrap_or(0);
            if c.opcode == WcOpcode::Recv {
                per_qp[q] += 1;
                recvs += 1;
            } else {
                sent(q, c.wr_id);
            }
        }
        if recvs > 0 {
            for (q, &k) in per_qp.iter().enumerate().take(self.qps.len()) {
                if k > 0 {
                    self.post_recvs(q, k)?;
                }
            }
        }
        Ok(recvs)
    }
}

/// How many requests the bandwidth loop posts before its next doorbell, with `room` for
/// that many in the send queue and `left` still to post: with lists (`-l`), a whole list,
/// or all that is left when that is less, and 0 while the queue has no room for either;
/// without, all it has room for.
pub(super) fn list_len(room: u64, left: u64, list: Option<u64>) -> u64 {
    match list {
        None => room.min(left),
        Some(l) if room >= l => l,
        Some(_) if room >= left => left,
        Some(_) => 0,
    }
}

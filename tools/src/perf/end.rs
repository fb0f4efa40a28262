//! One end of a run in this process ([`End`]): its device, PD, CQ, QPs and a buffer per QP.

use uhca::Device;
use uhca::datapath::{PostError, Sge};
use uhca::resource::{ConnectParams, Cq, CqConfig, Dm, Pd, Qp, QpConfig};

use super::wait::Watch;
use super::{PerfError, Settings, placement, setup};

/// One end of this process: device, PD, CQ, QPs and a buffer per QP.
pub(super) struct End {
    /// Bytes in each half of a buffer: the largest message.
    pub(super) half: usize,
    pub(super) qps: Vec<Qp>,
    pub(super) cq: Cq,
    pub(super) bufs: Vec<placement::Buf>,
    _dm: Vec<Dm>,
    _pd: Pd,
    pub(super) dev: Device,
    /// What this end's waits watch: the device, and the peer once connected.
    pub(super) watch: Watch,
}

impl End {
    /// PD, CQ, `s.qps` QPs and a buffer of two halves of `max_size` (at least 64) bytes per
    /// QP on `dev`: what this end sends from, and what its peer writes into (in device
    /// memory with `local_dm`).
    pub(super) fn new(
        dev: &Device,
        s: &Settings,
        max_size: usize,
        local_dm: bool,
    ) -> Result<End, PerfError> {
        let rx_depth = s.tx_depth.max(2);
        let pd = dev.alloc_pd().map_err(setup("PD"))?;
        let cq = dev
            .create_cq(&CqConfig {
                entries: (2 * (s.tx_depth + rx_depth) * s.qps).max(64),
                events: s.events,
            })
            .map_err(setup("CQ"))?;
        let cfg = QpConfig {
            max_send_wr: s.tx_depth,
            max_recv_wr: rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: s.inline_size,
        };
        let mut qps = Vec::new();
        for _ in 0..s.qps {
            qps.push(dev.create_qp(&pd, &cq, &cq, &cfg).map_err(setup("QP"))?);
        }
        let len = 2 * rx_off(max_size);
        let (bufs, dms) = placement::alloc_bufs(dev, &pd, s.qps as usize, len, local_dm, s.gpu)
            .map_err(PerfError::Setup)?;
        Ok(End {
            half: rx_off(max_size),
            qps,
            cq,
            bufs,
            _dm: dms,
            _pd: pd,
            dev: dev.clone(),
            watch: Watch::new(dev),
        })
    }

    /// The first `size` bytes of QP `qp`'s buffer (the half this end sends from).
    pub(super) fn sge(&self, qp: usize, size: usize) -> [Sge; 1] {
        let mr = &self.bufs[qp];
        [Sge {
            addr: mr.addr(),
            len: size as u32,
            lkey: mr.lkey(),
        }]
    }

    /// A receive into QP `qp`'s sending half, as long as the largest message: the receives
    /// left posted by one size of `-a` take the next, larger one too.
    fn recv_sge(&self, qp: usize) -> [Sge; 1] {
        self.sge(qp, self.half)
    }

    /// Posts receives until the receive queue is full.
    pub(super) fn fill_recvs(&mut self, qp: usize) -> Result<(), PerfError> {
        let sge = self.recv_sge(qp);
        loop {
            match self.qps[qp].post_recv(0, &sge) {
                Ok(()) => {}
                Err(PostError::QueueFull) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(super) fn post_recvs(&mut self, qp: usize, n: u32) -> Result<(), PerfError> {
        let sge = self.recv_sge(qp);
        for _ in 0..n {
            self.qps[qp].post_recv(0, &sge)?;
        }
        Ok(())
    }
}

/// Offset of the half of each buffer that the peer writes into.
pub(super) fn rx_off(max_size: usize) -> usize {
    max_size.max(64)
}

/// Sets the outstanding RDMA READs/atomics of a QP on `dev`: as requester `s.outs`
/// (perftest's `-o`; default: the device's limit), as responder the device's limit. An
/// `-o` above the limit is refused when the QP connects (`QueueError::AboveCap`). And the
/// ACK timeout (`-u`).
pub(crate) fn read_depths(p: &mut ConnectParams, dev: &Device, s: &Settings) {
    let (req, res) = dev.rd_atomic_limits();
    let byte = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    p.max_rd_atomic = s.outs.unwrap_or(byte(req));
    p.max_dest_rd_atomic = byte(res);
    p.timeout = s.qp_timeout;
}

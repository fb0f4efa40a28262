//! Test support: two CMs in one process on one model device in loopback, over the CM's
//! in-memory MAD transport run in real time, so a client and a server in two threads
//! connect real QPs through the CM's messages (REQ, REP, RTU, DREQ, DREP) and then move
//! data between them.

use std::time::{Duration, Instant};

use uhca::Device;
use uhca::cm::{Cm, CmConfig, InMad, MadAddr, MadTransport, MemTransport, TransportError};
use uhca::hw::layout::mad::MAD_SIZE;

use crate::perf::rdma_cm::{ReqPsns, Snoop};

/// One end of a [`MemTransport`] pair on the real clock, whose peer is this device's own
/// GSI (the address of every received MAD is rewritten to it): the CM then connects QPs
/// to the device itself.
pub struct Loop {
    inner: MemTransport,
    me: MadAddr,
    start: Instant,
}

impl MadTransport for Loop {
    fn send(&mut self, to: &MadAddr, mad: &[u8; MAD_SIZE]) -> Result<(), TransportError> {
        self.inner.send(to, mad)
    }
    fn recv(&mut self) -> Result<Option<InMad>, TransportError> {
        Ok(self.inner.recv()?.map(|mut m| {
            m.from.gid = self.me.gid;
            m.from.mac = self.me.mac;
            m
        }))
    }
    fn wait(&mut self, timeout: Duration) {
        if self.inner.queued() == 0 {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
        }
    }
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
    fn local(&self) -> MadAddr {
        self.me
    }
}

/// The CM of one end in the loop, its REQs' PSNs noted.
pub type LoopCm = Cm<Snoop<Loop>>;

/// Two CMs on `dev`'s GID 0 (a client's and a server's), the address the server's CM is
/// reached at for `port`, and the REQ PSNs each notes.
pub fn cms(dev: &Device, port: u16) -> (LoopCm, LoopCm, std::net::SocketAddr, ReqPsns, ReqPsns) {
    let a = dev.roce_address(0).unwrap();
    let ip = uhca::cm::transport::gid_ip(&a.gid);
    let (ta, tb) = MemTransport::pair(ip, ip);
    let me = MadAddr::gsi(a.gid, a.mac);
    let start = Instant::now();
    let (ra, rb) = (ReqPsns::default(), ReqPsns::default());
    let l = |inner, r: &ReqPsns| Snoop::new(Loop { inner, me, start }, r.clone());
    (
        Cm::new(l(ta, &ra), CmConfig::with_seed(1)),
        Cm::new(l(tb, &rb), CmConfig::with_seed(2)),
        std::net::SocketAddr::new(ip, port),
        ra,
        rb,
    )
}

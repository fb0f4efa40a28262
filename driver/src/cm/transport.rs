//! The seam under the MAD layer: [`MadTransport`] sends and receives whole MADs and tells
//! the time, so the MAD layer and the CM run unchanged on the GSI QP (`cm::gsi`) and on
//! [`MemTransport`], an in-memory pair with a virtual clock for deterministic tests.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uhca_layout::mad::MAD_SIZE;

/// Where a MAD goes, or where it came from: a port's GSI (or another UD QP) on RoCEv2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MadAddr {
    /// The port's GID (an IPv4-mapped GID for IPv4).
    pub gid: [u8; 16],
    /// The QP (1 for the GSI).
    pub qpn: u32,
    /// The port's MAC, where the link needs one (see `resource::ah`).
    pub mac: [u8; 6],
    /// IP traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
}

impl MadAddr {
    /// The GSI at `gid`, reached at `mac`, traffic class and flow label 0.
    pub fn gsi(gid: [u8; 16], mac: [u8; 6]) -> MadAddr {
        MadAddr {
            gid,
            qpn: uhca_layout::mad::GSI_QPN,
            mac,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

/// A MAD as received, with its sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InMad {
    /// The bytes ([`len`](Self::len) of them valid; a whole MAD is 256).
    pub data: Box<[u8; MAD_SIZE]>,
    /// Bytes received.
    pub len: usize,
    /// The sender (from the GRH and the completion).
    pub from: MadAddr,
}

/// Why a transport failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The GSI QP failed (device lost, QP in error, ...).
    #[error(transparent)]
    Gsi(Box<dyn std::error::Error + Send + Sync>),
    /// The other end of an in-memory pair is gone.
    #[error("the peer transport is closed")]
    Closed,
}

/// Moves whole MADs between GSIs and tells the time (the test seam of the MAD layer).
pub trait MadTransport {
    /// Sends `mad` to `to`. Unreliable: a MAD may be lost on the way.
    fn send(&mut self, to: &MadAddr, mad: &[u8; MAD_SIZE]) -> Result<(), TransportError>;
    /// The next received MAD, without waiting.
    fn recv(&mut self) -> Result<Option<InMad>, TransportError>;
    /// Waits until a MAD may have arrived or `timeout` has passed on [`now`](Self::now)'s
    /// clock, whichever is first (a virtual clock jumps ahead instead of sleeping).
    fn wait(&mut self, timeout: Duration);
    /// Time since an arbitrary start, monotonic.
    fn now(&self) -> Duration;
    /// This port's GSI address (its GID and MAC).
    fn local(&self) -> MadAddr;
}

/// A MAD on its way: sender, bytes, length.
type Queued = (MadAddr, Box<[u8; MAD_SIZE]>, usize);

/// One direction of a [`MemTransport`] pair, with the shared virtual time.
#[derive(Debug, Default)]
struct Wire {
    /// MADs on their way to each end (index 0 and 1).
    queues: [VecDeque<Queued>; 2],
    /// Nanoseconds of virtual time.
    now_ns: u64,
    /// MADs to lose per direction: each send whose `drop_*` counter is above 0 is lost.
    drop: [u32; 2],
    /// Whether an end sends nothing at all (a peer that never answers).
    mute: [bool; 2],
    /// MADs each end sent (delivered or not).
    sent: [u64; 2],
}

/// One end of an in-memory MAD link with a virtual clock shared by both ends: sends land
/// in the other end's queue, [`wait`](MadTransport::wait) advances the clock instead of
/// sleeping when nothing is queued, and losses are set per direction. Deterministic: made
/// for tests of the MAD layer and the CM.
#[derive(Clone, Debug)]
pub struct MemTransport {
    wire: Arc<Mutex<Wire>>,
    side: usize,
    local: MadAddr,
}

impl MemTransport {
    /// Two connected ends with GIDs `a` and `b` (IPv4-mapped when given IPv4 addresses).
    pub fn pair(a: std::net::IpAddr, b: std::net::IpAddr) -> (MemTransport, MemTransport) {
        let wire = Arc::new(Mutex::new(Wire::default()));
        let end = |side: usize, ip: std::net::IpAddr, mac_last: u8| MemTransport {
            wire: wire.clone(),
            side,
            local: MadAddr::gsi(ip_gid(ip), [0x02, 0, 0, 0, 0, mac_last]),
        };
        (end(0, a, 0x0a), end(1, b, 0x0b))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Wire> {
        // A test that panicked while holding the lock poisons it; the state is still whole.
        self.wire.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Loses the next `n` MADs this end sends.
    pub fn drop_next(&self, n: u32) {
        self.lock().drop[self.side] = n;
    }

    /// Makes this end lose every MAD it sends from now on (`true`) or none (`false`).
    pub fn set_mute(&self, mute: bool) {
        self.lock().mute[self.side] = mute;
    }

    /// Puts raw bytes in this end's receive queue as if `from` had sent them (malformed
    /// input for tests); bytes past 256 are cut, as a GSI receive buffer would.
    pub fn inject(&self, from: MadAddr, bytes: &[u8]) {
        let mut data = Box::new([0u8; MAD_SIZE]);
        let n = bytes.len().min(MAD_SIZE);
        data[..n].copy_from_slice(&bytes[..n]);
        self.lock().queues[self.side].push_back((from, data, n));
    }

    /// MADs this end has sent.
    pub fn sent(&self) -> u64 {
        self.lock().sent[self.side]
    }

    /// MADs waiting in this end's receive queue.
    pub fn queued(&self) -> usize {
        self.lock().queues[self.side].len()
    }

    /// Advances the shared virtual clock by `d`.
    pub fn advance(&self, d: Duration) {
        self.lock().now_ns += d.as_nanos() as u64;
    }
}

/// The GID of an IP address: IPv4 as `::ffff:a.b.c.d`, IPv6 as it is.
pub fn ip_gid(ip: std::net::IpAddr) -> [u8; 16] {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address a GID stands for (IPv4 for an IPv4-mapped GID).
pub fn gid_ip(gid: &[u8; 16]) -> std::net::IpAddr {
    std::net::IpAddr::V6(std::net::Ipv6Addr::from(*gid)).to_canonical()
}

impl MadTransport for MemTransport {
    fn send(&mut self, _to: &MadAddr, mad: &[u8; MAD_SIZE]) -> Result<(), TransportError> {
        let local = self.local;
        let side = self.side;
        let mut w = self.lock();
        w.sent[side] += 1;
        if w.mute[side] {
            return Ok(());
        }
        if w.drop[side] > 0 {
            w.drop[side] -= 1;
            return Ok(());
        }
        w.queues[1 - side].push_back((local, Box::new(*mad), MAD_SIZE));
        Ok(())
    }

    fn recv(&mut self) -> Result<Option<InMad>, TransportError> {
        let side = self.side;
        Ok(self.lock().queues[side]
            .pop_front()
            .map(|(from, data, len)| InMad { data, len, from }))
    }

    fn wait(&mut self, timeout: Duration) {
        let side = self.side;
        let mut w = self.lock();
        if w.queues[side].is_empty() {
            w.now_ns += timeout.as_nanos() as u64;
        }
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.lock().now_ns)
    }

    fn local(&self) -> MadAddr {
        self.local
    }
}

//! The RDMA connection manager over RoCEv2: connect an RC QP to a peer by IP address and
//! port, as librdmacm's `rdma_connect` / `rdma_listen` / `rdma_accept` do, with the CM's
//! MADs on QP1 and no out-of-band channel (IBA Vol. 1 chapter 12; docs/spec/rdma-cm.md).
//!
//! Layers, bottom up:
//! - [`transport`]: [`MadTransport`], the seam: whole MADs in and out, and the time. It is
//!   implemented on the GSI QP ([`GsiTransport`]) and by [`MemTransport`], an in-memory
//!   pair with a virtual clock for deterministic tests.
//! - [`mad`]: the MAD layer: transaction IDs, resends and timeouts, the GSI's answers for
//!   classes nobody serves, malformed MADs dropped and counted.
//! - [`Cm`]: the connection manager: REQ, MRA, REJ, REP, RTU, DREQ and DREP; IP service IDs
//!   (`RDMA_PS_TCP`) and the cma header, so Linux's rdma_cm (rping, `ib_write_bw -R`)
//!   talks to it.
//!
//! # Example
//! Both sides in one thread over the in-memory transport; on a device, open the CM on the
//! GSI QP with [`Cm::open`] and pass the device's [`Qp`](crate::resource::Qp)s instead of
//! the recording [`FakeQp`].
//! ```
//! use uhca::cm::{AcceptOptions, Cm, CmConfig, CmEvent, ConnectOptions, FakeQp, MemTransport};
//! let (ta, tb) = MemTransport::pair("10.0.0.1".parse()?, "10.0.0.2".parse()?);
//! let mut client = Cm::new(ta, CmConfig::with_seed(1));
//! let mut server = Cm::new(tb, CmConfig::with_seed(2));
//! server.listen(7471)?;
//! let (mut qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
//!
//! // Non-blocking steps: the client sends its REQ ...
//! let id = client.start_connect(&qa, "10.0.0.2:7471".parse()?, &ConnectOptions::default())?;
//! // ... the server sees the request and accepts it with its QP (now in RTS) ...
//! let Some(CmEvent::Request(req)) = server.poll()? else { panic!() };
//! assert_eq!(req.remote_qpn, 0x11);
//! let conn_b = server.accept(&req, &mut qb, &AcceptOptions::default())?;
//! // ... the client takes the REP, connects its QP and sends the RTU.
//! let Some(CmEvent::Reply(rid)) = client.poll()? else { panic!() };
//! let conn_a = client.finish_connect(rid, &mut qa)?;
//! assert_eq!(server.poll()?, Some(CmEvent::Established(conn_b.id)));
//! assert_eq!((conn_a.remote_qpn, conn_b.remote_qpn), (0x22, 0x11));
//! assert_eq!(qa.connected.unwrap().rq_psn, qb.connected.unwrap().sq_psn);
//!
//! // Disconnect: DREQ, DREP; both QPs go to the error state.
//! client.disconnect(id, &mut qa)?;
//! assert_eq!(server.poll()?, Some(CmEvent::Disconnected(conn_b.id)));
//! assert_eq!(client.poll()?, Some(CmEvent::Disconnected(id)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//! The blocking forms do the same in one call each: [`Cm::connect`] (REQ to RTU),
//! [`Cm::get_request`] (the next REQ on a listened port), [`Cm::accept`],
//! [`Cm::wait_established`].
//!
//! # Progress
//! The CM has no thread of its own: it reads the GSI QP, resends and answers only inside
//! its calls. A lost REP, RTU, DREQ or DREP is made good only while the side that must
//! resend or answer is in a call, so keep calling [`Cm::poll`] (or a blocking call) while a
//! connection is being made or ended: the passive side [`Cm::wait_established`] after
//! [`Cm::accept`] before waiting on the QP, and both sides poll now and then while
//! connected, so a peer's DREQ is answered.

#![deny(unsafe_code)]

mod api;
mod engine;
mod gsi;
pub mod mad;
#[cfg(test)]
mod tests;
pub mod transport;

use std::net::{IpAddr, SocketAddr};

use uhca_layout::cm::{CmWireError, RejReason};

pub use engine::{Cm, CmCounters};
pub use gsi::{GsiTransport, default_mac_of};
pub use transport::{InMad, MadAddr, MadTransport, MemTransport, TransportError};

use crate::resource::{ConnectParams, Mtu, QueueError};

/// A connection, named by our communication ID (IBA Vol. 1 §12.6.5 `local_comm_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(pub u32);

/// Settings of a [`Cm`]. The defaults are rdma_cm's (docs/spec/rdma-cm.md §5-6).
#[derive(Clone, Copy, Debug)]
pub struct CmConfig {
    /// How long the peer may take to answer, as sent in REQs (4.096 µs · 2^x; 20).
    pub response_timeout: u8,
    /// How often a REQ, REP or DREQ is resent before giving up (15).
    pub max_cm_retries: u8,
    /// Packet lifetime of the path (4.096 µs · 2^x; 16, `CMA_IBOE_PACKET_LIFETIME`).
    pub packet_life_time: u8,
    /// The service timeout of our MRAs (4.096 µs · 2^x; 24, `CMA_CM_MRA_SETTING`).
    pub mra_timeout: u8,
    /// The QP's local ACK timeout, sent as the REQ path's (4.096 µs · 2^x; 19).
    pub local_ack_timeout: u8,
    /// The RNR NAK timer our QPs' responders send (IB encoding; 12).
    pub min_rnr_timer: u8,
    /// Path MTU we offer and accept at most (1024, as rxe on a 1500-byte Ethernet).
    pub mtu: Mtu,
    /// Our GID's index in the port's table (0).
    pub sgid_index: u8,
    /// IP hop limit of our path (64).
    pub hop_limit: u8,
    /// Our CA GUID in REQs and REPs (0: made from the port's MAC, EUI-64).
    pub ca_guid: u64,
    /// Seed of communication IDs, starting PSNs and transaction IDs.
    pub seed: u64,
}

impl CmConfig {
    /// The defaults with a fixed seed (tests; [`Default`] seeds from the clock).
    pub fn with_seed(seed: u64) -> CmConfig {
        CmConfig {
            response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: 16,
            mra_timeout: 24,
            local_ack_timeout: 19,
            min_rnr_timer: 12,
            mtu: Mtu::M1024,
            sgid_index: 0,
            hop_limit: 64,
            ca_guid: 0,
            seed,
        }
    }
}

impl Default for CmConfig {
    fn default() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        CmConfig::with_seed(t ^ (u64::from(std::process::id()) << 32))
    }
}

/// What the active side asks for ([`Cm::connect`]).
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions<'a> {
    /// Private data for the peer (at most [`MAX_REQ_PRIVATE_DATA`] bytes after the cma
    /// header).
    pub private_data: &'a [u8],
    /// RDMA READs/atomics our QP answers at once (1, as rping).
    pub responder_resources: u8,
    /// RDMA READs/atomics our QP issues at once (1).
    pub initiator_depth: u8,
    /// Transport retries (7).
    pub retry_count: u8,
    /// RNR retries the peer should use (7 = infinite).
    pub rnr_retry_count: u8,
    /// The peer port's MAC, where the link needs one (see `resource::ah`; the model's
    /// network port takes any).
    pub peer_mac: [u8; 6],
    /// Our source port in the cma header (0: one made from the communication ID).
    pub src_port: u16,
}

impl Default for ConnectOptions<'_> {
    fn default() -> Self {
        ConnectOptions {
            private_data: &[],
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            peer_mac: UNRESOLVED_MAC,
            src_port: 0,
        }
    }
}

/// What the passive side answers with ([`Cm::accept`]).
#[derive(Clone, Copy, Debug)]
pub struct AcceptOptions<'a> {
    /// Private data for the peer (at most 196 bytes).
    pub private_data: &'a [u8],
    /// RDMA READs/atomics our QP answers at once (1).
    pub responder_resources: u8,
    /// RDMA READs/atomics our QP issues at once (1; at most the REQ's responder resources).
    pub initiator_depth: u8,
    /// RNR retries the peer should use (7).
    pub rnr_retry_count: u8,
}

impl Default for AcceptOptions<'_> {
    fn default() -> Self {
        AcceptOptions {
            private_data: &[],
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
        }
    }
}

pub use crate::resource::UNRESOLVED_MAC;

/// Bytes of private data a REQ carries after the 36-byte cma header.
pub const MAX_REQ_PRIVATE_DATA: usize = 92 - uhca_layout::cm::CMA_HDR_SIZE;

/// A connection request on a listened port, waiting for [`Cm::accept`] or [`Cm::reject`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The connection.
    pub id: ConnId,
    /// The port it is for.
    pub port: u16,
    /// The requester's address and port (from the cma header).
    pub src: SocketAddr,
    /// The address it was sent to.
    pub dst: IpAddr,
    /// The requester's QPN.
    pub remote_qpn: u32,
    /// The requester's responder resources (the most our initiator depth may be).
    pub responder_resources: u8,
    /// The requester's initiator depth.
    pub initiator_depth: u8,
    /// The application's private data (after the cma header; all 56 bytes, zero padded).
    pub private_data: Vec<u8>,
}

/// A connected QP's side of a connection.
#[derive(Clone, Debug)]
pub struct Connection {
    /// The connection.
    pub id: ConnId,
    /// Our QPN.
    pub local_qpn: u32,
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// The peer's address.
    pub peer: IpAddr,
    /// What our QP was connected with.
    pub params: ConnectParams,
    /// The peer's private data (REP's for the active side, REQ's for the passive one).
    pub private_data: Vec<u8>,
}

/// What [`Cm::poll`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ on a listened port (passive side).
    Request(ConnectRequest),
    /// The REP for our REQ came: [`Cm::finish_connect`] next (active side).
    Reply(ConnId),
    /// The RTU for our REP came (passive side).
    Established(ConnId),
    /// The peer rejected our REQ or REP.
    Rejected {
        /// The connection.
        id: ConnId,
        /// Why.
        reason: RejReason,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// The connection ended: the peer's DREQ (answered with a DREP) or the answer to ours.
    /// Move the QP to the error state if the peer disconnected.
    Disconnected(ConnId),
    /// The peer never answered our REQ, REP or DREQ (all retries sent).
    TimedOut(ConnId),
}

/// Why a CM call failed.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The MAD transport failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Driving the QP failed.
    #[error(transparent)]
    Qp(#[from] QueueError),
    /// A message could not be built.
    #[error(transparent)]
    Wire(#[from] CmWireError),
    /// The peer rejected the connection.
    #[error("rejected by the peer: {reason:?}")]
    Rejected {
        /// Why.
        reason: RejReason,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// The peer never answered (all retries sent), or nothing came in the time given.
    #[error("timed out")]
    Timeout,
    /// Too much private data.
    #[error("{len} bytes of private data, at most {max}")]
    PrivateData {
        /// The most allowed.
        max: usize,
        /// What was given.
        len: usize,
    },
    /// The port is already listened on.
    #[error("port {0} is already listened on")]
    AlreadyListening(u16),
    /// No such connection (or it is over).
    #[error("no connection {0:?}")]
    UnknownConnection(ConnId),
    /// The connection is not in a state that allows the call.
    #[error("connection {id:?} is {state}, not {want}")]
    State {
        /// The connection.
        id: ConnId,
        /// Its state.
        state: &'static str,
        /// The state the call needs.
        want: &'static str,
    },
    /// The local and remote addresses are not of one family.
    #[error("address family mismatch")]
    AddressFamily,
}

/// A QP the CM connects: RST→INIT→RTR→RTS with the values of REQ and REP, and to the
/// error state on disconnect. Implemented for [`Qp`](crate::resource::Qp); [`FakeQp`]
/// records instead (tests, the example above).
pub trait CmQp {
    /// The QPN.
    fn qpn(&self) -> u32;
    /// Connects the QP (RST→INIT→RTR→RTS).
    fn connect_qp(&mut self, p: &ConnectParams) -> Result<(), QueueError>;
    /// Moves the QP to the error state.
    fn disconnect_qp(&mut self) -> Result<(), QueueError>;
}

impl CmQp for crate::resource::Qp {
    fn qpn(&self) -> u32 {
        crate::resource::Qp::qpn(self)
    }
    fn connect_qp(&mut self, p: &ConnectParams) -> Result<(), QueueError> {
        self.connect(p)
    }
    fn disconnect_qp(&mut self) -> Result<(), QueueError> {
        self.to_err()
    }
}

/// A QP stand-in that records what the CM did to it.
#[derive(Clone, Copy, Debug, Default)]
pub struct FakeQp {
    /// Its QPN.
    pub qpn: u32,
    /// The parameters of the last connect.
    pub connected: Option<ConnectParams>,
    /// Connects so far.
    pub connects: u32,
    /// Whether it was moved to the error state.
    pub errored: bool,
}

impl FakeQp {
    /// A fake QP numbered `qpn`.
    pub fn new(qpn: u32) -> FakeQp {
        FakeQp {
            qpn,
            ..FakeQp::default()
        }
    }
}

impl CmQp for FakeQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }
    fn connect_qp(&mut self, p: &ConnectParams) -> Result<(), QueueError> {
        self.connected = Some(*p);
        self.connects += 1;
        Ok(())
    }
    fn disconnect_qp(&mut self) -> Result<(), QueueError> {
        self.errored = true;
        Ok(())
    }
}

/// 4.096 µs · 2^`exp` (IBA's timeout encoding), capped at 2^31 units.
pub fn iba_time(exp: u8) -> std::time::Duration {
    std::time::Duration::from_nanos(4096u64 << exp.min(31))
}

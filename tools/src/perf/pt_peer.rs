//! The other end of a perftest run as the harness holds it ([`PtPeer`], in
//! [`Peer::Perftest`](super::bench::Peer::Perftest)) and what its exchange needs beyond the
//! settings ([`PtOptions`]); `pt_run` runs the exchange.

use uhca::datapath::Remote;

use super::BwResult;
use super::control::Endpoint;
use super::perftest::{Agreed, Keys, Oob};

/// What perftest's exchange needs beyond [`Settings`](super::Settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtOptions {
    /// A bandwidth test (else a latency test).
    pub bw: bool,
    /// Every size from 2 to 2^23 (`-a`): duplex WRITE and READ tests then meet after each.
    pub all: bool,
    /// The GID index (`-x`); `None`: the first IPv4-mapped entry, as perftest picks on
    /// RoCE (else entry 0).
    pub gid_index: Option<u8>,
    /// Reports in Gb/s (`--report_gbits`), else MiB/s: the unit of the report's figures.
    pub gbits: bool,
    /// `--check`: the buffers hold the pattern (`pattern_byte` in `pt_run`) where this end's bytes
    /// come from, zeros where the peer's land, before the first keys go out (the peer may
    /// start its traffic as soon as it has them); [`Bench::pt_check`](super::Bench::pt_check) looks afterwards.
    pub check: bool,
}

/// The shape of a test's exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`.
    Bw,
    /// `ib_send_bw`.
    SendBw,
    /// `ib_write_lat`, `ib_read_lat`, `ib_atomic_lat`.
    Lat,
    /// `ib_send_lat`.
    SendLat,
}

/// The other end of a perftest run.
pub(super) struct PtPeer {
    pub(super) oob: Oob,
    pub(super) shape: Shape,
    pub(super) opts: PtOptions,
    pub(super) targets: Vec<Remote>,
    /// This end and the peer, for the header.
    pub(super) ends: Box<(Endpoint, Endpoint)>,
    /// The keys this end sends (each exchange sends QP 0's or each QP's again).
    pub(super) mine: Vec<Keys>,
    /// The last size's result, reported at the end of a one-way bandwidth run.
    pub(super) last: Option<BwResult>,
    /// What the opening agreed.
    pub(super) agreed: Agreed,
}

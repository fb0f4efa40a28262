//! What both kinds of exchange between two processes share, below them: which end this
//! process is ([`Role`]) and how long an end waits for the other ([`REPLY`], [`QUIET`],
//! [`BEAT`]). uhca-perf's own exchange (`remote`), perftest's (`perftest`, `pt_run`) and its
//! RDMA CM connection (`rdma_cm`) all use them, and the harness (`bench`) under them.

use std::time::Duration;

use super::wait::STALL;

/// How often a driving client tells the server it is alive.
pub const BEAT: Duration = Duration::from_secs(1);

/// How long a waiting end hears nothing from a driving peer before it gives up. A client
/// beats between its waits, and no wait of its own lasts longer than the engine's stall
/// limit (30 s), so a live client is never taken for a dead one; a client process that
/// dies closes the connection, which is seen at once.
pub const QUIET: Duration = Duration::from_secs(STALL.as_secs() + 15);

/// How long an end waits for an answer: setup work on the other side, or its last waits
/// (as long as the engine's stall limit).
pub const REPLY: Duration = QUIET;

/// Which end this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Connects, proposes the settings and drives the test.
    Client,
    /// Listens, adopts the client's settings, is the target or the other half.
    Server,
}

//! The errors of the queues' control path: creating, connecting and destroying CQs and QPs.

use crate::cmd::CmdError;
use crate::dma::DmaError;
use crate::pci::PciError;

/// Errors of creating, connecting and destroying CQs and QPs (the control path).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// A command failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
    /// Queue memory could not be provided.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// Interrupt setup failed.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// A requested size is not possible.
    #[error("{what}: {requested} is not a power of two in 1..=2^{log_max}")]
    Size {
        /// Which size.
        what: &'static str,
        /// The request.
        requested: u32,
        /// The device limit (log2).
        log_max: u32,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// A value above what the device supports.
    #[error("{what}: {requested} is more than the device's {max} ({cap})")]
    AboveCap {
        /// Which value.
        what: &'static str,
        /// The request.
        requested: u32,
        /// The device limit.
        max: u32,
        /// The capability that sets the limit.
        cap: &'static str,
    },
    /// No free MSI-X vector for another event CQ.
    #[error("no free interrupt vector for a completion EQ")]
    NoVector,
    /// The CQ was created without events.
    #[error("the CQ was created without events (CqConfig::events)")]
    NoEvents,
    /// A QP transition that is not allowed from the current state.
    #[error("QP transition {op} not allowed from state {state:?}")]
    State {
        /// The transition.
        op: &'static str,
        /// The current state.
        state: super::qp_state::QpState,
    },
    /// Waiting for an event failed.
    #[error("waiting for a completion event: {0}")]
    Io(#[source] std::io::Error),
    /// The device was closed.
    #[error("device is closed")]
    Closed,
    /// The device is lost ([`Device::is_lost`](crate::Device::is_lost)): drop the handles and
    /// reopen the function.
    #[error("device lost")]
    DeviceLost,
}

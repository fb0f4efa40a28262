//! The QP state, its own module: the QPs report it and the control-path error
//! ([`QueueError::State`](super::QueueError::State)) names it, and neither imports the other
//! for it.

/// QP states (§7.3 `state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialized.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Error.
    Err,
    /// A state the driver does not drive to (SQER, SQD, ...), raw.
    Other(u32),
}

impl QpState {
    /// The state of a QPC `state` field.
    pub(super) fn from_raw(v: u32) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            6 => QpState::Err,
            o => QpState::Other(o),
        }
    }
}

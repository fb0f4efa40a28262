//! Device resources created through commands: protection domains, UARs, event queues,
//! memory regions ([`Mr`]) and device memory ([`Dm`]).
//!
//! Each handle owns its firmware object and destroys it on `Drop` (errors are logged and
//! counted, never a panic). Handles keep their device alive.

pub(crate) mod comp_eq;
pub mod cq;
pub mod eq;
pub mod memic;
pub mod mkey;
pub mod pd;
pub mod qp;
mod queue_error;
pub mod uar;

pub use cq::{Cq, CqArmState, CqConfig, CqInfo, CqPeriodMode, CqStatus, QueueError};
pub use eq::EqRing;
pub use memic::{Dm, DmCaps};
pub use mkey::{Access, MemError, Mr, MrOptions};
pub use pd::{Pd, PdInUse};
pub use qp::{
    ConnectParams, Local, Mtu, Qp, QpConfig, QpState, RtsAttrs, SendFlags, SendOp, SendWr,
};
pub use uar::Uar;

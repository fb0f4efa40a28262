//! Device resources created through commands: protection domains, UARs, event queues,
//! memory regions ([`Mr`]) and device memory ([`Dm`]), CQs, RC QPs ([`Qp`]), UD and GSI
//! QPs ([`UdQp`]) with their address handles ([`Ah`]), and the GSI endpoint ([`Gsi`]).
//!
//! Each handle owns its firmware object and destroys it on `Drop` (errors are logged and
//! counted, never a panic). Handles keep their device alive.

pub mod ah;
pub(crate) mod comp_eq;
pub mod cq;
pub mod gsi;
mod mem_error;
pub mod memic;
pub mod mkey;
pub mod pd;
pub mod qp;
mod qp_state;
mod queue_error;
pub mod uar;
pub mod ud;

pub use ah::{Ah, AhAttr, AhError, Gid, Grh, UNRESOLVED_MAC};
pub use cq::{Cq, CqArmState, CqConfig, CqInfo, CqPeriodMode, CqStatus};
pub use gsi::{GSI_RECV_SIZE, Gsi, GsiConfig, GsiCounters, GsiError, GsiEvent, GsiMad, MAD_SIZE};
pub use memic::{Dm, DmCaps};
pub use mkey::{Access, MemError, Mr, MrOptions};
pub use pd::{Pd, PdInUse};
pub use qp::{ConnectParams, Mtu, Qp, QpConfig, QpState, RtsAttrs};
// Kept out of the docs: the work-request vocabulary's home is `datapath` (`resource::qp`).
#[doc(hidden)]
pub use qp::{Local, SendFlags, SendOp, SendWr};
pub use queue_error::QueueError;
pub use uar::Uar;
pub use ud::{GRH_SIZE, GSI_QKEY, GSI_QPN, QKEY_USE_QP, UdDest, UdParams, UdQp, UdSendWr};

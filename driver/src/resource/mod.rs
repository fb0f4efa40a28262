//! Device resources created through commands: protection domains, UARs, event queues.
//!
//! Each handle owns its firmware object and destroys it on `Drop` (errors are logged and
//! counted, never a panic). Handles keep their device alive.

pub mod eq;
pub mod pd;
pub mod uar;

pub use eq::EqRing;
pub use pd::Pd;
pub use uar::Uar;

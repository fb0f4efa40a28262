//! Hardware side of uhca: the software model of the HCA, over the mlx5 layouts.
//!
//! - [`layout`](mod@layout): the crate `uhca-layout`, re-exported: every byte layout the
//!   driver and the device exchange (init segment, command queue, command messages,
//!   contexts, WQEs, CQEs, EQEs), defined once and used by both sides. Dependency-free and
//!   safe; the driver depends on it directly, and on this crate only for the model.
//! - `model` (feature `model`, on by default): a software ConnectX-class HCA that speaks
//!   those layouts behind a BAR0 memory region, a config space and a model IOMMU, run by
//!   its own thread. It is the default device of every uhca tool, example and test.
//! - `link` (feature `model`): links between model ports that carry RoCEv2 frames, with
//!   seeded fault injection.
//! - `rc` (feature `model`): the RC transport engine (requester and responder state
//!   machines over RoCEv2) that the model's QPs run.
//! - [`rng`]: the deterministic generator of the fixed-seed random tests.

#![deny(unsafe_code)]

pub use uhca_layout as layout;

#[cfg(feature = "model")]
mod copy;
#[cfg(feature = "model")]
pub mod lat_trace;
#[cfg(feature = "model")]
pub mod link;
#[cfg(feature = "model")]
pub mod model;
#[cfg(feature = "model")]
pub mod rc;
pub mod rng;

//! The data path: WQE building ([`wqe`]), the send and receive rings ([`sq`]), completion
//! polling ([`cq`]) and their ring arithmetic ([`ring`]). Resources that own these rings
//! are [`Qp`](crate::resource::Qp) and [`Cq`](crate::resource::Cq).
//!
//! Hot-path contract: posting and polling take `&mut` on their queue and make no syscall,
//! take no lock and allocate nothing; device memory is only read through shadow copies
//! and every index it holds is checked before use (style.md §10, §14).

#![deny(unsafe_code)]

pub mod cq;
pub mod rig;
pub mod ring;
pub mod sq;
pub mod wqe;

pub use cq::{Completion, Poll, PollError, WcOpcode, WcStatus};
pub use wqe::{MAX_INLINE, PostError, Remote, Sge};

//! The data path: WQE building ([`wqe`]), the send and receive rings ([`sq`]), completion
//! polling ([`cq`]) and their ring arithmetic ([`ring`]). Resources that own these rings
//! are [`Qp`](crate::resource::Qp) and [`Cq`](crate::resource::Cq).
//!
//! Hot-path contract: posting and polling take `&mut` on their queue and make no syscall,
//! take no lock and allocate nothing (`driver/tests/hot_path_alloc.rs` counts, against
//! the model too); device memory is only read by copying (whole-word volatile loads) and
//! every index it holds is checked before use (style.md §10, §14).
//!
//! Cost: the rings are [`DmaRing`](crate::dma::DmaRing)s (range checked once, then one AND
//! per access). A one-SGE WRITE or SEND is six 8-byte stores of words built in registers,
//! plus the shadow record (`wr_id`, WQE extent) and the counters. A polled requester CQE
//! of the QP seen last, naming the oldest outstanding WQE, is one 8-byte load for owner,
//! opcode, QPN and WQE counter, one masked compare of it against the word the poller
//! expects (QPN and pass kept in the poller's QP cache, counter = the shadow's tail), one
//! compare that something is outstanding (producer counter read once per batch), the slot
//! loads (`wr_id`, WQE extent), the tail store and one load for the byte count; everything
//! else takes the copy-and-parse path. What remains per CQE beyond UCX's ~20 instructions
//! is mostly that shadow slot lookup (mask, bounds check, two loads, a store), the
//! consumer index and pass bookkeeping, and building the typed [`Completion`].

#![deny(unsafe_code)]

pub mod cq;
pub mod rig;
pub mod ring;
pub mod sq;
pub mod wqe;

pub use cq::{Completion, Poll, PollError, WcOpcode, WcStatus};
pub use wqe::{MAX_INLINE, PostError, Remote, Sge};

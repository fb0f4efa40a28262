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
//! opcode, QPN and WQE counter, one compare of the counter against the shadow's tail (and
//! one that something is outstanding), two loads from the shadow and one for the byte
//! count; everything else takes the copy-and-parse path. What remains per CQE beyond
//! UCX's ~20 instructions is mostly that index check against the shadow (tail, head,
//! slot) and building the typed [`Completion`].

#![deny(unsafe_code)]

pub mod cq;
pub mod rig;
pub mod ring;
pub mod sq;
pub mod wqe;

pub use cq::{Completion, Poll, PollError, WcOpcode, WcStatus};
pub use wqe::{MAX_INLINE, PostError, Remote, Sge};

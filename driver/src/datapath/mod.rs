//! The data path: WQE building ([`wqe`]), the send and receive rings ([`sq`]) and the shadow
//! of their posted work requests (`shadow`), completion polling ([`cq`]) and their ring
//! arithmetic ([`ring`]). Resources that own these rings are [`Qp`](crate::resource::Qp)
//! and [`Cq`](crate::resource::Cq).
//!
//! Hot-path contract: posting and polling take `&mut` on their queue and make no syscall,
//! take no lock and allocate nothing (`driver/tests/hot_path_alloc.rs` counts, against
//! the model too); device memory is only read by copying (whole-word volatile loads) and
//! every index it holds is checked before use (style.md §10, §14).
//!
//! Cost: the rings are [`DmaRing`](crate::dma::DmaRing)s and the shadows
//! [`MaskedSlots`](crate::dma::MaskedSlots) (range checked once, then one AND per access);
//! doorbell records are [`DmaRecord`](crate::dma::DmaRecord)s (checked once, then one
//! store). A one-SGE WRITE or SEND is a room check against a cached room end, six 8-byte
//! stores of words built in registers, the shadow record (`wr_id`, WQE start and end) and
//! two counter stores; the doorbell decides "anything pending" and "one WQE, BlueFlame"
//! from the counter at the last doorbell. A polled requester CQE of the hot QP naming its
//! oldest outstanding WQE is one 8-byte load for owner, opcode, QPN and WQE counter, one
//! masked compare of it against the word the poller expects, one compare that something
//! is outstanding, the slot loads (`wr_id`, next WQE), the store that hands the WQE back
//! to the poster and the consumer index step (WRITE/SEND completions carry no byte count;
//! READ and atomic CQEs take the copy-and-parse path). The poller holds the
//! hot QP's counters, key and slot address by value for the whole batch, and its slow
//! path is out of line and cannot unwind, so a polling loop keeps that state in
//! registers. Everything else takes the copy-and-parse path.

#![deny(unsafe_code)]

pub mod cq;
pub(crate) mod post;
#[cfg(any(test, feature = "testing"))]
pub mod rig;
pub mod ring;
pub(crate) mod shadow;
pub mod sq;
pub mod wqe;
pub(crate) mod wr;

pub use cq::{
    Completion, DatagramInfo, NetHeader, Poll, PollError, WcOpcode, WcStatus, wc_status_str,
};
pub use wqe::{MAX_INLINE, PostError, Remote, Sge};
pub use wr::{Local, SendFlags, SendOp, SendWr};

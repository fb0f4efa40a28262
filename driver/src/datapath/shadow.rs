//! The shadow of a QP's posted work requests ([`WqShadow`]), shared by the poster (the
//! send and receive rings, `super::sq`) and the CQ poller (`super::cq`, possibly another
//! thread): each work request's `wr_id` and extent, and the producer and completion
//! counters. Its words are atomics, written once per operation with plain stores on
//! x86-64. Device memory is untrusted (style.md §10): a CQE's WQE counter is checked here
//! against what was posted before it is used.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use super::ring::{RingSize, widen_index16};
use crate::dma::{MaskedSlots, SlotsView};

/// What the poller knows of the send WQE starting at one slot.
#[derive(Debug, Default)]
struct SqSlot {
    wr_id: AtomicU64,
    /// The WQE's first basic-block counter (tells a WQE start from a stale slot).
    start: AtomicU32,
    /// The WQE's one-past-last basic-block counter.
    next: AtomicU32,
}

/// A QP's send shadow slots by address and size ([`WqShadow::send_slots`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendSlots<'a>(SlotsView<'a, SqSlot>);

impl SendSlots<'_> {
    /// [`WqShadow::complete_send`]'s common case, for a CQE whose WQE counter the caller
    /// has matched with `tail`, the first block of the oldest outstanding WQE (a
    /// [`send_tail`](WqShadow::send_tail) the caller advances), having checked that it is
    /// below a [`send_head`](WqShadow::send_head): that WQE's `wr_id` and the counter of
    /// the WQE after it. The caller hands the new counter back with
    /// [`publish_send_tail`](WqShadow::publish_send_tail) (after each completion).
    #[inline(always)]
    pub(crate) fn oldest(self, tail: u32) -> (u64, u32) {
        let s = self.0.get(tail);
        (
            s.wr_id.load(Ordering::Relaxed),
            s.next.load(Ordering::Relaxed),
        )
    }
}

/// The transport of a work queue, as its completions need it: a receive on a datagram
/// QP tells its sender (`cqe64.flags_rqpn`), and the GSI QP's the P_Key
/// (docs/spec/mlx5-ib-objects.md §4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum WqKind {
    /// A connected QP (RC).
    #[default]
    Connected,
    /// A UD QP.
    Ud,
    /// The GSI QP (QP1).
    Gsi,
}

/// Per-QP records shared by the poster and the CQ poller.
#[derive(Debug)]
pub(crate) struct WqShadow {
    pub(crate) qpn: u32,
    /// The QP's transport.
    pub(crate) kind: WqKind,
    sq: RingSize,
    /// One entry per send basic block, used at the block where a WQE starts.
    sq_slots: MaskedSlots<SqSlot>,
    /// Send producer counter as published by the last doorbell.
    sq_head: CachePadded<AtomicU32>,
    /// Send counter up to which WQEs have completed (always a WQE start).
    sq_tail: CachePadded<AtomicU32>,
    rq: RingSize,
    rq_wr_id: MaskedSlots<AtomicU64>,
    rq_head: CachePadded<AtomicU32>,
    rq_tail: CachePadded<AtomicU32>,
}

impl WqShadow {
    pub(crate) fn new(qpn: u32, sq: RingSize, rq: RingSize) -> WqShadow {
        WqShadow {
            qpn,
            kind: WqKind::Connected,
            sq,
            sq_slots: MaskedSlots::new(sq.entries(), SqSlot::default)
                .expect("a RingSize is a power of two"),
            sq_head: Default::default(),
            sq_tail: Default::default(),
            rq,
            rq_wr_id: MaskedSlots::new(rq.entries(), || AtomicU64::new(0))
                .expect("a RingSize is a power of two"),
            rq_head: Default::default(),
            rq_tail: Default::default(),
        }
    }

    /// The shadow of a QP of transport `kind`.
    pub(crate) fn with_kind(mut self, kind: WqKind) -> WqShadow {
        self.kind = kind;
        self
    }

    /// The send ring size (basic blocks).
    pub(crate) fn sq_size(&self) -> RingSize {
        self.sq
    }

    /// The receive ring size (WQEs).
    pub(crate) fn rq_size(&self) -> RingSize {
        self.rq
    }

    /// Records the send WQE of basic blocks `[start, next)` (the send ring, as it posts).
    #[inline(always)]
    pub(super) fn record_send(&self, start: u32, next: u32, wr_id: u64) {
        let s = self.sq_slots.get(start);
        s.wr_id.store(wr_id, Ordering::Relaxed);
        s.start.store(start, Ordering::Relaxed);
        s.next.store(next, Ordering::Relaxed);
    }

    /// A requester CQE for the WQE whose control segment holds `index`: everything up to
    /// and including it has completed. `None` unless it names an outstanding WQE's start
    /// (device memory is untrusted, style.md §10).
    #[inline(always)]
    pub(crate) fn complete_send(&self, index: u16) -> Option<u64> {
        let tail = self.sq_tail.load(Ordering::Relaxed);
        let head = self.sq_head.load(Ordering::Acquire);
        // The common case, every WQE signaled: the CQE names the oldest outstanding WQE,
        // and `tail` is always a WQE start, so one compare (and "anything outstanding")
        // checks it. Otherwise (unsignaled WQEs before it, or a bad index) the full check.
        let start = if index == tail as u16 && tail != head {
            tail
        } else {
            self.find_send_start(index, tail, head)?
        };
        let s = self.sq_slots.get(start);
        self.sq_tail
            .store(s.next.load(Ordering::Relaxed), Ordering::Release);
        Some(s.wr_id.load(Ordering::Relaxed))
    }

    /// The send counter up to which WQEs have completed: the counter of the oldest
    /// outstanding WQE's first block (what its CQE names). The send CQ's poller is the only
    /// writer.
    #[inline(always)]
    pub(crate) fn send_tail(&self) -> u32 {
        self.sq_tail.load(Ordering::Relaxed)
    }

    /// The send producer counter as published by the last doorbell.
    #[inline(always)]
    pub(crate) fn send_head(&self) -> u32 {
        self.sq_head.load(Ordering::Acquire)
    }

    /// The send slots by value, for [`SendSlots::oldest`] in a polling loop.
    #[inline(always)]
    pub(crate) fn send_slots(&self) -> SendSlots<'_> {
        SendSlots(self.sq_slots.view())
    }

    /// Publishes the send completion counter (to the poster's room check and the full
    /// index check); `tail` is a counter [`SendSlots::oldest`] returned.
    #[inline(always)]
    pub(crate) fn publish_send_tail(&self, tail: u32) {
        self.sq_tail.store(tail, Ordering::Release);
    }

    /// `index` widened to the counter of an outstanding WQE's first block, if it is one.
    #[cold]
    #[inline(never)]
    fn find_send_start(&self, index: u16, tail: u32, head: u32) -> Option<u32> {
        let start = widen_index16(index, tail, head)?;
        (self.sq_slots.get(start).start.load(Ordering::Relaxed) == start).then_some(start)
    }

    /// The send completion counter, as the poster's room check reads it.
    #[inline(always)]
    pub(super) fn send_tail_acquire(&self) -> u32 {
        self.sq_tail.load(Ordering::Acquire)
    }

    /// Publishes the send producer counter (the send ring, at its doorbell).
    #[inline(always)]
    pub(super) fn publish_send_head(&self, head: u32) {
        self.sq_head.store(head, Ordering::Release);
    }

    /// The counter after the send WQE that starts at `start` (the ring counts its pending
    /// WQEs by following them).
    pub(super) fn send_next(&self, start: u32) -> u32 {
        self.sq_slots.get(start).next.load(Ordering::Relaxed)
    }

    /// The receive completion counter, as the poster's room check reads it.
    #[inline(always)]
    pub(super) fn recv_tail_acquire(&self) -> u32 {
        self.rq_tail.load(Ordering::Acquire)
    }

    /// Records the `wr_id` of receive WQE `n` (the receive ring, as it posts).
    #[inline(always)]
    pub(super) fn record_recv(&self, n: u32, wr_id: u64) {
        self.rq_wr_id.get(n).store(wr_id, Ordering::Relaxed);
    }

    /// Publishes the receive producer counter.
    #[inline(always)]
    pub(super) fn publish_recv_head(&self, head: u32) {
        self.rq_head.store(head, Ordering::Release);
    }

    /// A responder CQE for receive WQE counter `index`.
    #[inline(always)]
    pub(crate) fn complete_recv(&self, index: u16) -> Option<u64> {
        let tail = self.rq_tail.load(Ordering::Relaxed);
        let head = self.rq_head.load(Ordering::Acquire);
        let n = widen_index16(index, tail, head)?;
        self.rq_tail.store(n.wrapping_add(1), Ordering::Release);
        Some(self.rq_wr_id.get(n).load(Ordering::Relaxed))
    }
}

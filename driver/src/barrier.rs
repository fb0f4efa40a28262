//! Memory barriers of the data path, named by what they order (style.md §12).
//!
//! The device is another agent reading and writing host memory and receiving MMIO writes.
//! Each function states the pair of accesses it orders; call sites say which ones they are.
//! On x86-64 the store-store and load-load cases cost nothing but a compiler fence (TSO),
//! which is what rdma-core's `udma_to_device_barrier`/`udma_from_device_barrier` are there;
//! the two doorbell barriers are `sfence` there, as rdma-core's `mmio_wc_start` and
//! `mmio_flush_writes` (util/udma_barrier.h): stores stay ordered and are pushed out of the
//! write-combining buffers, while the thread's loads go on (a full fence would also hold
//! them until every earlier store has left the store buffer). Elsewhere they are full fences.
//! Sources: prm-subset.md §9.2 (ringing the SQ), §9.3 (doorbell records), §9.7 (owner bit).

#![deny(unsafe_code)]

use std::sync::atomic::{Ordering, fence};

/// Orders WQE (or receive WQE) stores before the doorbell-record store that publishes them
/// (§9.2 step 2, §9.6: the device may read the WQE as soon as it sees the new counter).
#[inline(always)]
pub fn wmb_before_dbr() {
    fence(Ordering::Release);
}

/// Orders the doorbell-record store before the MMIO doorbell / BlueFlame write (§9.2 step
/// 3: the device reads the record when the doorbell arrives).
#[inline(always)]
pub fn wmb_before_doorbell() {
    store_fence();
}

/// Flushes write-combined MMIO stores (the BlueFlame copy) so that the next doorbell cannot
/// overtake them (§9.2 step 4).
#[inline(always)]
pub fn wc_flush() {
    store_fence();
}

/// Every earlier store (write-combined ones included) globally visible before any later
/// store: `sfence` on x86-64 (rdma-core `mmio_flush_writes`), a full fence elsewhere.
#[inline(always)]
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    crate::pci::sfence();
    #[cfg(not(target_arch = "x86_64"))]
    fence(Ordering::SeqCst);
}

/// Orders the load of a CQE's (or EQE's) ownership byte before the loads of its body
/// (§9.7: the device writes `op_own` last; the body is valid once the owner matches).
#[inline(always)]
pub fn rmb_after_owner() {
    fence(Ordering::Acquire);
}

/// Orders the loads of consumed CQEs before the consumer-index store that hands their slots
/// back to the device (§9.7: after consuming, software writes the CQ DBR).
#[inline(always)]
pub fn mb_before_ci_update() {
    fence(Ordering::Release);
}

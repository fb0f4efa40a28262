//! Shared receive queues: SRQs (CREATE_SRQ), XRC SRQs (CREATE_XRC_SRQ) and RMPs
//! (CREATE_RMP), one object kind with three command families
//! (docs/spec/mlx5-ib-objects.md §2).
//!
//! An SRQ's WQEs form a linked list in its buffer: each WQE starts with a 16-byte "next"
//! segment whose `next_wqe_index` names the WQE after it, followed by data segments up to
//! the stride. The device starts at WQE 0 and, for each WQE it takes, reads that WQE's
//! `next_wqe_index` to find the following one; the doorbell record's low 16 bits count the
//! WQEs posted. A receive CQE names the WQE it consumed by its index (`wqe_counter`), so
//! software can put it back on the list in any order. The model's three kinds share one
//! number space (so a QP's `srqn_rmpn_xrqn` names one of them whatever its kind), and each
//! command family accepts only its own kind.
//!
//! A QP whose `rq_type` is SRQ (1) takes its receives from the SRQ named at CREATE_QP; a
//! QP that fails flushes none of the SRQ's WQEs (they belong to every QP on it). Receive
//! buffers are checked against the receiving QP's PD (the SRQ's own PD is checked to exist
//! at create time but not compared), and the limit event (`lwm`) is kept, not raised.

use crate::layout::srq::{SRQ_NEXT_SEG, SRQ_NEXT_WQE_INDEX};
use crate::layout::wqe::{DataSeg, INVALID_LKEY};
use crate::rc::{MAX_SGE, RcSge, RecvWqe, SgeList};

use super::iommu::Dma;
use super::wq::{QueueBuf, extend_counter, read_dbr};

/// Which command family made an SRQ (and alone may query, arm and destroy it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SrqKind {
    /// CREATE_SRQ (0x700): the ISSI 0 form.
    Srq,
    /// CREATE_XRC_SRQ (0x705): bound to an XRC domain and a CQ.
    Xrc,
    /// CREATE_RMP (0x90c): the ISSI 1 form of a basic SRQ.
    Rmp,
}

/// One shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) kind: SrqKind,
    /// XRC domain (XRC SRQs; 0 otherwise).
    pub(crate) xrcd: u32,
    /// Completion queue of an XRC SRQ (0 otherwise).
    pub(crate) cqn: u32,
    pub(crate) user_index: u32,
    /// log2 of the number of WQEs.
    pub(crate) log_size: u32,
    /// log2 of the WQE stride in bytes.
    pub(crate) log_stride: u32,
    /// The limit event watermark (`lwm`), as set by create, ARM or MODIFY_RMP.
    pub(crate) lwm: u32,
    /// In the error state (no WQE is taken).
    pub(crate) error: bool,
    pub(crate) buf: QueueBuf,
    /// Doorbell record: the posted-WQE counter in the low 16 bits of dword 0.
    pub(crate) dbr: u64,
    /// The context as created (`srqc`/`xrc_srqc`: 64 bytes; `rmpc`: 240), for queries.
    pub(crate) ctx: Vec<u8>,
    /// The index of the next WQE to take.
    pub(crate) head: u32,
    /// WQEs taken so far.
    pub(crate) taken: u32,
    /// The posted counter last read from the doorbell record.
    pub(crate) posted: u32,
}

impl Srq {
    /// WQE size in bytes.
    fn stride(&self) -> u64 {
        1 << self.log_stride
    }

    /// WQEs posted and not yet taken (reads the doorbell record when the last value read
    /// says none are left).
    pub(crate) fn pending(&mut self, dma: &Dma<'_>) -> u32 {
        if self.posted == self.taken
            && let Ok(w) = read_dbr(dma, self.dbr)
        {
            self.posted = extend_counter(self.taken, w & 0xFFFF, 16);
        }
        let n = self.posted.wrapping_sub(self.taken) as i32;
        n.max(0) as u32
    }

    /// Takes the WQE at the head of the list: its index (the receive CQE's
    /// `wqe_counter`) and its scatter list; the head moves to its `next_wqe_index`.
    pub(crate) fn take(&mut self, dma: &Dma<'_>) -> Option<RecvWqe> {
        if self.error || self.pending(dma) == 0 {
            return None;
        }
        let index = self.head & ((1 << self.log_size) - 1);
        let at = u64::from(index) * self.stride();
        let mut next = [0u8; SRQ_NEXT_SEG];
        let mut sges = SgeList::new();
        if self.buf.read(dma, at, &mut next).is_ok() {
            let segs = ((self.stride() as usize - SRQ_NEXT_SEG) / 16).min(MAX_SGE);
            let mut seg = [0u8; 16];
            for k in 0..segs {
                let off = at + (SRQ_NEXT_SEG + 16 * k) as u64;
                if self.buf.read(dma, off, &mut seg).is_err() {
                    // An unreachable WQE scatters nothing: the message fails its length.
                    sges = SgeList::new();
                    break;
                }
                let d = DataSeg::new_unchecked(&seg[..]);
                if d.lkey() == INVALID_LKEY && d.byte_count() == 0 {
                    break;
                }
                if d.byte_count() == 0 {
                    continue;
                }
                // At most MAX_SGE entries are read, so the push cannot fail.
                let _ = sges.push(RcSge {
                    lkey: d.lkey(),
                    addr: d.addr(),
                    len: d.byte_count(),
                });
            }
        }
        let n = u16::from_be_bytes([next[SRQ_NEXT_WQE_INDEX], next[SRQ_NEXT_WQE_INDEX + 1]]);
        self.head = u32::from(n);
        self.taken = self.taken.wrapping_add(1);
        Some(RecvWqe {
            wr_id: u64::from(index),
            sges,
        })
    }
}

//! The send and receive rings of a QP (prm-subset.md §9.2-9.6) and their shadows.
//!
//! `post` writes a WQE and advances a local producer counter; [`SendRing::ring_doorbell`]
//! publishes a whole batch: doorbell record, then one doorbell (or BlueFlame) write. The
//! [`WqShadow`] records each work request's `wr_id` and size where the CQ poller (possibly
//! another thread) can find them; its words are atomics, written once per operation with
//! plain stores on x86-64.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use uhca_hw::layout::uar::{QP_DBR_RCV, QP_DBR_SND};
use uhca_hw::layout::wqe::{DS_UNIT, DataSeg, INVALID_LKEY, SEND_WQE_BB};

use super::ring::{RingSize, in_flight, widen_index16};
use super::wqe::{PostError, Sge, WqeBuf};
use crate::barrier;
use crate::dma::DmaRegion;
use crate::pci::Bar;

/// Per-QP records shared by the poster and the CQ poller.
#[derive(Debug)]
pub(crate) struct WqShadow {
    pub(crate) qpn: u32,
    sq: RingSize,
    /// `wr_id` of the WQE starting at each send slot.
    sq_wr_id: Box<[AtomicU64]>,
    /// `start << 32 | next` counters of the WQE starting at each send slot.
    sq_meta: Box<[AtomicU64]>,
    /// Send producer counter as published by the last doorbell.
    sq_head: CachePadded<AtomicU32>,
    /// Send counter up to which WQEs have completed.
    sq_tail: CachePadded<AtomicU32>,
    rq: RingSize,
    rq_wr_id: Box<[AtomicU64]>,
    rq_head: CachePadded<AtomicU32>,
    rq_tail: CachePadded<AtomicU32>,
}

fn atomics(n: u32) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl WqShadow {
    pub(crate) fn new(qpn: u32, sq: RingSize, rq: RingSize) -> WqShadow {
        WqShadow {
            qpn,
            sq,
            sq_wr_id: atomics(sq.entries()),
            sq_meta: atomics(sq.entries()),
            sq_head: Default::default(),
            sq_tail: Default::default(),
            rq,
            rq_wr_id: atomics(rq.entries()),
            rq_head: Default::default(),
            rq_tail: Default::default(),
        }
    }

    /// A requester CQE for the WQE whose control segment holds `index`: everything up to
    /// and including it has completed. `None` unless it names an outstanding WQE's start.
    #[inline(always)]
    pub(crate) fn complete_send(&self, index: u16) -> Option<u64> {
        let tail = self.sq_tail.load(Ordering::Relaxed);
        let head = self.sq_head.load(Ordering::Acquire);
        let start = widen_index16(index, tail, head)?;
        let slot = self.sq.slot(start);
        let meta = self.sq_meta[slot].load(Ordering::Relaxed);
        if (meta >> 32) as u32 != start {
            return None;
        }
        self.sq_tail.store(meta as u32, Ordering::Release);
        Some(self.sq_wr_id[slot].load(Ordering::Relaxed))
    }

    /// A responder CQE for receive WQE counter `index`.
    #[inline(always)]
    pub(crate) fn complete_recv(&self, index: u16) -> Option<u64> {
        let tail = self.rq_tail.load(Ordering::Relaxed);
        let head = self.rq_head.load(Ordering::Acquire);
        let n = widen_index16(index, tail, head)?;
        self.rq_tail.store(n.wrapping_add(1), Ordering::Release);
        Some(self.rq_wr_id[self.rq.slot(n)].load(Ordering::Relaxed))
    }
}

/// Where a QP's doorbells go: its doorbell record and BlueFlame register (§9.1-9.3).
#[derive(Debug)]
pub(crate) struct Doorbell {
    pub(crate) bar: Bar,
    /// BAR offset of the BlueFlame register.
    pub(crate) bf_reg: usize,
    /// Half the register size (0: plain doorbells only).
    pub(crate) bf_half: usize,
    /// Current half (toggles after every doorbell).
    pub(crate) bf_off: usize,
}

/// The send ring: 64-byte basic blocks at `off` of the QP buffer.
#[derive(Debug)]
pub(crate) struct SendRing {
    size: RingSize,
    off: usize,
    qpn: u32,
    head: u32,
    tail: u32,
    pending: u32,
    bf_valid: bool,
    last_ctrl: [u8; 8],
    wqe: WqeBuf,
}

impl SendRing {
    pub(crate) fn new(size: RingSize, off: usize, qpn: u32) -> SendRing {
        SendRing {
            size,
            off,
            qpn,
            head: 0,
            tail: 0,
            pending: 0,
            bf_valid: false,
            last_ctrl: [0; 8],
            wqe: WqeBuf::default(),
        }
    }

    /// Free basic blocks, as of the last look at the shadow.
    pub(crate) fn room(&self, sh: &WqShadow) -> u32 {
        let tail = sh.sq_tail.load(Ordering::Acquire);
        self.size.entries() - in_flight(self.head, tail)
    }

    /// Builds a WQE with `build` (after the control segment) and writes it to the ring.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post(
        &mut self,
        buf: &DmaRegion,
        sh: &WqShadow,
        wr_id: u64,
        opcode: uhca_hw::layout::wqe::WqeOpcode,
        fm_ce_se: u8,
        imm: u32,
        build: impl FnOnce(&mut WqeBuf) -> Result<(), PostError>,
    ) -> Result<(), PostError> {
        let idx = self.head;
        self.wqe.ctrl(opcode, idx as u16, self.qpn, fm_ce_se, imm);
        if let Err(e) = build(&mut self.wqe) {
            self.bf_valid = false;
            return Err(e);
        }
        let n = self.wqe.finish() as u32;
        if in_flight(idx.wrapping_add(n), self.tail) > self.size.entries() {
            self.tail = sh.sq_tail.load(Ordering::Acquire);
            if in_flight(idx.wrapping_add(n), self.tail) > self.size.entries() {
                self.bf_valid = false;
                return Err(PostError::QueueFull);
            }
        }
        // Copy what the device reads (ds × 16 bytes) in one run, or two where the WQE wraps
        // from the end of the ring to its start (§9.4).
        let ring = buf.slice();
        let used = self.wqe.used_bytes();
        let slot = self.size.slot(idx);
        let to_end = (self.size.entries() as usize - slot) * SEND_WQE_BB;
        let at = self.off + slot * SEND_WQE_BB;
        if n == 1 {
            // The common one-block WQE: a fixed 64-byte copy (unrolled stores).
            let block: &[u8; SEND_WQE_BB] = self.wqe.as_bytes()[..SEND_WQE_BB]
                .try_into()
                .expect("one basic block");
            ring.write_words(at, block);
        } else if used.len() <= to_end {
            ring.write_words(at, used);
        } else {
            ring.write_words(at, &used[..to_end]);
            ring.write_words(self.off, &used[to_end..]);
        }
        let next = idx.wrapping_add(n);
        sh.sq_wr_id[slot].store(wr_id, Ordering::Relaxed);
        sh.sq_meta[slot].store(u64::from(idx) << 32 | u64::from(next), Ordering::Relaxed);
        self.last_ctrl = self.wqe.doorbell_bytes();
        self.head = next;
        self.pending += 1;
        self.bf_valid = true;
        Ok(())
    }

    /// Publishes the WQEs posted since the last call (§9.2): shadow head, doorbell record,
    /// then the doorbell, or BlueFlame when the batch is one WQE that fits half a register.
    #[inline(always)]
    pub(crate) fn ring_doorbell(
        &mut self,
        buf: &DmaRegion,
        dbr: usize,
        sh: &WqShadow,
        db: &mut Doorbell,
    ) {
        if self.pending == 0 {
            return;
        }
        sh.sq_head.store(self.head, Ordering::Release);
        barrier::wmb_before_dbr(); // WQEs written before the counter that publishes them
        buf.slice().store_be32(dbr + QP_DBR_SND, self.head & 0xFFFF);
        barrier::wmb_before_doorbell(); // record visible before the device is told to read it
        let at = db.bf_reg + db.bf_off;
        let bytes = self.wqe.as_bytes();
        if self.pending == 1 && self.bf_valid && db.bf_half != 0 && bytes.len() <= db.bf_half {
            let mut words = [0u64; MAX_BF_WORDS];
            let n = bytes.len() / 8;
            for (w, c) in words.iter_mut().zip(bytes.chunks_exact(8)) {
                *w = u64::from_ne_bytes(c.try_into().expect("8 bytes"));
            }
            db.bar.copy_to_u64(at, &words[..n]);
        } else {
            db.bar.write64_raw(at, self.last_ctrl);
        }
        barrier::wc_flush(); // the BlueFlame copy done before the next doorbell
        db.bf_off ^= db.bf_half;
        self.pending = 0;
    }

    /// Producer counter (basic blocks posted).
    pub(crate) fn head(&self) -> u32 {
        self.head
    }

    /// WQEs posted since the last doorbell.
    pub(crate) fn pending(&self) -> u32 {
        self.pending
    }
}

const MAX_BF_WORDS: usize = super::wqe::MAX_WQE_BYTES / 8;

/// The receive ring: `2^stride_log`-byte WQEs of data segments at offset 0 of the QP buffer.
#[derive(Debug)]
pub(crate) struct RecvRing {
    size: RingSize,
    stride_log: u32,
    head: u32,
    tail: u32,
}

/// Most data segments per receive WQE.
pub const MAX_RECV_SGES: usize = 16;

impl RecvRing {
    pub(crate) fn new(size: RingSize, stride_log: u32) -> RecvRing {
        RecvRing {
            size,
            stride_log,
            head: 0,
            tail: 0,
        }
    }

    /// Writes a receive WQE and publishes it in the doorbell record (§9.6).
    #[inline(always)]
    pub(crate) fn post(
        &mut self,
        buf: &DmaRegion,
        dbr: usize,
        sh: &WqShadow,
        wr_id: u64,
        sges: &[Sge],
    ) -> Result<(), PostError> {
        let stride = 1usize << self.stride_log;
        if sges.len() * DS_UNIT > stride {
            return Err(PostError::TooManySges);
        }
        if in_flight(self.head, self.tail) >= self.size.entries() {
            self.tail = sh.rq_tail.load(Ordering::Acquire);
            if in_flight(self.head, self.tail) >= self.size.entries() {
                return Err(PostError::QueueFull);
            }
        }
        let mut w = [0u8; MAX_RECV_SGES * DS_UNIT];
        let mut n = 0;
        for s in sges {
            let mut d = DataSeg::new_unchecked(&mut w[n * DS_UNIT..(n + 1) * DS_UNIT]);
            d.set_byte_count(s.len);
            d.set_lkey(s.lkey);
            d.set_addr(s.addr);
            n += 1;
        }
        if n * DS_UNIT < stride {
            // A short list ends with a segment of byte_count 0 and the invalid lkey (§9.6).
            DataSeg::new_unchecked(&mut w[n * DS_UNIT..(n + 1) * DS_UNIT]).set_lkey(INVALID_LKEY);
            n += 1;
        }
        let slot = self.size.slot(self.head);
        buf.slice().write_words(
            slot << self.stride_log,
            &w[..(n * DS_UNIT).next_multiple_of(8)],
        );
        sh.rq_wr_id[slot].store(wr_id, Ordering::Relaxed);
        self.head = self.head.wrapping_add(1);
        sh.rq_head.store(self.head, Ordering::Release);
        barrier::wmb_before_dbr(); // receive WQE written before the counter publishes it
        buf.slice().store_be32(dbr + QP_DBR_RCV, self.head & 0xFFFF);
        Ok(())
    }

    /// Receive WQEs posted.
    pub(crate) fn head(&self) -> u32 {
        self.head
    }
}

#[cfg(all(test, feature = "model"))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::datapath::wqe::Remote;
    use crate::dma::DmaSpace;
    use crate::pci::model::ModelFunction;
    use uhca_hw::layout::wqe::WqeOpcode;

    const BF: usize = 3 * 4096 + 0x800 + 2 * 512;

    fn setup() -> (DmaRegion, WqShadow, SendRing, Doorbell) {
        let f = ModelFunction::with_defaults().unwrap();
        let bar = Bar::map(&(f.clone() as Arc<dyn crate::pci::PciFunction>), 0).unwrap();
        let space = DmaSpace::new(f);
        let sq = RingSize::new(8, 15).unwrap();
        let sh = WqShadow::new(9, sq, RingSize::new(4, 15).unwrap());
        let db = Doorbell {
            bar,
            bf_reg: BF,
            bf_half: 256,
            bf_off: 0,
        };
        (
            space.alloc(4096).unwrap(),
            sh,
            SendRing::new(sq, 1024, 9),
            db,
        )
    }

    fn post(
        r: &mut SendRing,
        buf: &DmaRegion,
        sh: &WqShadow,
        id: u64,
        sges: usize,
    ) -> Result<(), PostError> {
        let sge = Sge {
            addr: id,
            len: 4,
            lkey: 7,
        };
        r.post(buf, sh, id, WqeOpcode::RdmaWrite, 0, 0, |w| {
            w.raddr(Remote {
                addr: 0x10,
                rkey: 3,
            });
            w.data(&vec![sge; sges])
        })
    }

    #[test]
    fn doorbell_record_then_blueflame_or_doorbell_with_alternating_halves() {
        let (buf, sh, mut r, mut db) = setup();
        post(&mut r, &buf, &sh, 1, 1).unwrap();
        r.ring_doorbell(&buf, 2048, &sh, &mut db);
        assert_eq!(buf.slice().load_be32(2048 + QP_DBR_SND), 1);
        // BlueFlame: the whole WQE went to the first half.
        let mut ring = [0u8; 64];
        buf.slice().read(1024, &mut ring);
        assert_eq!(db.bar.read64_raw(BF), ring[..8]);
        assert_eq!(db.bar.read64_raw(BF + 16), ring[16..24]);
        assert_eq!(db.bf_off, 256);
        // A batch of two: a plain 8-byte doorbell with the last WQE's control segment, to
        // the second half.
        post(&mut r, &buf, &sh, 2, 1).unwrap();
        post(&mut r, &buf, &sh, 3, 1).unwrap();
        r.ring_doorbell(&buf, 2048, &sh, &mut db);
        assert_eq!(buf.slice().load_be32(2048 + QP_DBR_SND), 3);
        let mut last = [0u8; 8];
        buf.slice().read(1024 + 2 * 64, &mut last);
        assert_eq!(db.bar.read64_raw(BF + 256), last);
        assert_eq!(last[1..3], [0, 2], "WQE index 2 in the control segment");
        assert_eq!(db.bf_off, 0);
        // Nothing pending: no doorbell at all.
        r.ring_doorbell(&buf, 2048, &sh, &mut db);
        assert_eq!(db.bf_off, 0);
    }

    #[test]
    fn multi_block_wqe_wraps_and_full_ring_is_an_error() {
        let (buf, sh, mut r, mut db) = setup();
        for id in 0..7 {
            post(&mut r, &buf, &sh, id, 1).unwrap();
        }
        // 7 of 8 blocks used: a 2-block WQE does not fit until completions come back.
        assert_eq!(post(&mut r, &buf, &sh, 7, 6), Err(PostError::QueueFull));
        r.ring_doorbell(&buf, 2048, &sh, &mut db);
        assert_eq!(sh.complete_send(6), Some(6));
        post(&mut r, &buf, &sh, 7, 6).unwrap(); // blocks 7 and 8 (slot 0): wraps
        let mut first = [0u8; 64];
        let mut second = [0u8; 64];
        buf.slice().read(1024 + 7 * 64, &mut first);
        buf.slice().read(1024, &mut second);
        assert_eq!(first[3], 0x08);
        assert_eq!(first[7] & 0x3F, 8, "ds = ctrl + raddr + 6 data");
        // The sixth data segment sits at byte 16 of the wrapped block.
        assert_eq!(second[16..20], 4u32.to_be_bytes());
        assert_eq!(second[24..32], 7u64.to_be_bytes());
        r.ring_doorbell(&buf, 2048, &sh, &mut db);
        assert_eq!(sh.complete_send(7), Some(7));
        assert_eq!(r.room(&sh), 8);
    }

    #[test]
    fn receive_wqes_end_short_lists_and_publish_the_counter() {
        let (buf, sh, _, _) = setup();
        let mut rq = RecvRing::new(RingSize::new(4, 15).unwrap(), 5); // 32-byte WQEs
        let s = Sge {
            addr: 0x1234,
            len: 100,
            lkey: 6,
        };
        rq.post(&buf, 2048, &sh, 50, &[s]).unwrap();
        let mut w = [0u8; 32];
        buf.slice().read(0, &mut w);
        assert_eq!(
            w[..16],
            [0, 0, 0, 100, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0x12, 0x34]
        );
        assert_eq!(w[16..], [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(buf.slice().load_be32(2048 + QP_DBR_RCV), 1);
        assert_eq!(
            rq.post(&buf, 2048, &sh, 0, &[s; 3]),
            Err(PostError::TooManySges)
        );
        for id in 51..54 {
            rq.post(&buf, 2048, &sh, id, &[s, s]).unwrap();
        }
        assert_eq!(
            rq.post(&buf, 2048, &sh, 99, &[s]),
            Err(PostError::QueueFull)
        );
        assert_eq!(sh.complete_recv(0), Some(50));
        assert_eq!(sh.complete_recv(0), None, "already completed");
        rq.post(&buf, 2048, &sh, 54, &[s]).unwrap();
        assert_eq!(buf.slice().load_be32(2048 + QP_DBR_RCV), 5);
    }
}

//! The send and receive rings of a QP (prm-subset.md §9.2-9.6).
//!
//! Posting writes a WQE into the ring with whole 8-byte stores and advances a local
//! producer counter; `SendRing::ring_doorbell` publishes a whole batch: doorbell record,
//! then one doorbell (or BlueFlame) write. The common one-SGE WRITE/SEND has its own
//! path (`SendRing::post_one_sge`): the control segment's constant part (QPN) is
//! precomputed, and the three segments are six stores of values built in registers. Other
//! WQEs are built in a stack buffer by [`WqeBuf`] and copied in.
//!
//! Each post records its work request in the QP's `WqShadow` (`super::shadow`), where
//! the CQ poller finds it.

use uhca_layout::wqe::fast::{
    CTRL_DS, CTRL_FM_CE_SE, CTRL_IMM, CTRL_OPCODE, CTRL_QPN, CTRL_WQE_INDEX, DATA_ADDR,
    DATA_BYTE_COUNT, DATA_LKEY, RADDR_RADDR, RADDR_RKEY,
};
use uhca_layout::wqe::{DS_UNIT, INVALID_LKEY, SEND_WQE_BB, WqeOpcode};

use super::ring::{RingSize, in_flight};
use super::shadow::WqShadow;
use super::wqe::{PostError, Remote, Sge, WqeBuf};
use crate::barrier;
use crate::dma::{DmaRecord, DmaRing};
use crate::pci::Bar;

/// 8-byte words per send basic block.
const BB_WORDS: usize = SEND_WQE_BB / 8;
/// 8-byte words per data segment (the receive ring's unit).
const DS_WORDS: usize = DS_UNIT / 8;

/// The send queue memory: basic blocks.
pub(crate) type SqMem = DmaRing<BB_WORDS>;
/// The receive queue memory, in 16-byte data segments.
pub(crate) type RqMem = DmaRing<DS_WORDS>;

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

/// The send ring: 64-byte basic blocks.
#[derive(Debug)]
pub(crate) struct SendRing {
    ring: SqMem,
    /// The send counter of the QP's doorbell record.
    dbr: DmaRecord,
    /// Ring size (entries of the ring).
    entries: u32,
    /// `qpn` placed in the control segment's first word (big-endian value): the part of
    /// that word that never changes.
    ctrl_qpn: u64,
    head: u32,
    /// The counter the producer may post up to: the completed counter as last read from
    /// the shadow plus the ring size (refreshed when the ring looks full), so that the
    /// room check is one subtraction and compare.
    room_end: u32,
    /// First block of the last WQE posted (its control segment is the doorbell value).
    last: u32,
    /// The producer counter as of the last doorbell: WQEs are pending while `head`
    /// differs, and the batch is one WQE when `last` equals it.
    rung: u32,
    wqe: WqeBuf,
}

impl SendRing {
    /// A send ring over `ring` for QP `qpn`, whose doorbell record's send counter
    /// (`QP_DBR_SND`) is `dbr`.
    pub(crate) fn new(ring: SqMem, dbr: DmaRecord, qpn: u32) -> SendRing {
        SendRing {
            entries: ring.entries(),
            room_end: ring.entries(),
            ring,
            dbr,
            ctrl_qpn: CTRL_QPN.put(qpn.into()),
            head: 0,
            last: 0,
            rung: 0,
            wqe: WqeBuf::default(),
        }
    }

    /// Free basic blocks, as of the last look at the shadow.
    pub(crate) fn room(&self, sh: &WqShadow) -> u32 {
        self.entries - in_flight(self.head, sh.send_tail_acquire())
    }

    /// Whether `blocks` more basic blocks fit, looking at the shadow again if the cached
    /// tail says no.
    #[inline(always)]
    fn fits(&mut self, sh: &WqShadow, blocks: u32) -> bool {
        in_flight(self.room_end, self.head) >= blocks || self.refresh_tail(sh, blocks)
    }

    #[cold]
    #[inline(never)]
    fn refresh_tail(&mut self, sh: &WqShadow, blocks: u32) -> bool {
        self.room_end = sh.send_tail_acquire().wrapping_add(self.entries);
        in_flight(self.room_end, self.head) >= blocks
    }

    /// Posts a one-basic-block WQE of a control segment, an optional remote address
    /// segment (`RADDR`) and one data segment. The hot path of RDMA WRITE and SEND (§9.5):
    /// six 8-byte stores, no stack buffer. A zero-length element is written but left out
    /// of `ds`, so the device skips it as the general path does (rdma-core skips them).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post_one_sge<const RADDR: bool>(
        &mut self,
        sh: &WqShadow,
        wr_id: u64,
        opcode: WqeOpcode,
        fm_ce_se: u8,
        imm: u32,
        remote: Remote,
        sge: &Sge,
    ) -> Result<(), PostError> {
        if !self.fits(sh, 1) {
            return Err(PostError::QueueFull);
        }
        let idx = self.head;
        let ds = if RADDR { 2 } else { 1 } + u64::from(sge.len != 0);
        let e = self.ring.entry(idx);
        e.store(
            0,
            (self.ctrl_qpn
                | CTRL_DS.put(ds)
                | CTRL_OPCODE.put(opcode.raw().into())
                | CTRL_WQE_INDEX.put(idx.into()))
            .to_be(),
        );
        e.store(
            1,
            (CTRL_FM_CE_SE.put(fm_ce_se.into()) | CTRL_IMM.put(imm.into())).to_be(),
        );
        let data = if RADDR {
            e.store(2, RADDR_RADDR.put(remote.addr).to_be());
            e.store(3, RADDR_RKEY.put(remote.rkey.into()).to_be());
            4
        } else {
            2
        };
        e.store(
            data,
            (DATA_BYTE_COUNT.put(sge.len.into()) | DATA_LKEY.put(sge.lkey.into())).to_be(),
        );
        e.store(data + 1, DATA_ADDR.put(sge.addr).to_be());
        self.commit(sh, idx, 1, wr_id);
        Ok(())
    }

    /// Builds a WQE with `build` (after the control segment) in the stack buffer and
    /// copies it into the ring: any send WQE.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post(
        &mut self,
        sh: &WqShadow,
        wr_id: u64,
        opcode: WqeOpcode,
        fm_ce_se: u8,
        imm: u32,
        build: impl FnOnce(&mut WqeBuf) -> Result<(), PostError>,
    ) -> Result<(), PostError> {
        let idx = self.head;
        let qpn = CTRL_QPN.get(self.ctrl_qpn) as u32;
        self.wqe.ctrl(opcode, idx as u16, qpn, fm_ce_se, imm);
        build(&mut self.wqe)?;
        let n = self.wqe.finish() as u32;
        if !self.fits(sh, n) {
            return Err(PostError::QueueFull);
        }
        // What the device reads (ds × 16 bytes), block by block; a WQE that runs past the
        // end of the ring continues at its start (§9.4), which the counter does by itself.
        for (j, w) in self.wqe.used_bytes().chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
            self.ring
                .store(idx.wrapping_add((j / BB_WORDS) as u32), j % BB_WORDS, v);
        }
        self.commit(sh, idx, n, wr_id);
        Ok(())
    }

    /// Takes the WQE of `blocks` blocks at `idx` as posted.
    #[inline(always)]
    fn commit(&mut self, sh: &WqShadow, idx: u32, blocks: u32, wr_id: u64) {
        let next = idx.wrapping_add(blocks);
        sh.record_send(idx, next, wr_id);
        self.last = idx;
        self.head = next;
    }

    /// Publishes the WQEs posted since the last call (§9.2): shadow head, doorbell record,
    /// then the doorbell, or BlueFlame when the batch is one WQE that fits half a register.
    #[inline(always)]
    pub(crate) fn ring_doorbell(&mut self, sh: &WqShadow, db: &mut Doorbell) {
        let head = self.head;
        if head == self.rung {
            return;
        }
        sh.publish_send_head(head);
        barrier::wmb_before_dbr(); // WQEs written before the counter that publishes them
        self.dbr.store_be32(head & 0xFFFF);
        barrier::wmb_before_doorbell(); // record visible before the device is told to read it
        let at = db.bf_reg + db.bf_off;
        let blocks = in_flight(head, self.last) as usize;
        // One WQE (the last starts where the batch does) that fits half the register
        // (which a `bf_half` of 0 never does).
        if self.last == self.rung && blocks * SEND_WQE_BB <= db.bf_half {
            self.blueflame(db, at, blocks);
        } else {
            // The doorbell is the first 8 bytes of the last WQE's control segment.
            db.bar
                .write64_raw(at, self.ring.load(self.last, 0).to_ne_bytes());
        }
        barrier::wc_flush(); // the BlueFlame copy done before the next doorbell
        db.bar.doorbell_rung();
        db.bf_off ^= db.bf_half;
        self.rung = head;
    }

    /// Copies the single pending WQE (`blocks` basic blocks) to the BlueFlame half at `at`.
    #[cold]
    fn blueflame(&self, db: &Doorbell, at: usize, blocks: usize) {
        let mut words = [0u64; MAX_BF_WORDS];
        let n = (blocks * BB_WORDS).min(MAX_BF_WORDS);
        for (j, w) in words[..n].iter_mut().enumerate() {
            *w = self
                .ring
                .load(self.last.wrapping_add((j / BB_WORDS) as u32), j % BB_WORDS);
        }
        db.bar.copy_to_u64(at, &words[..n]);
    }

    /// Producer counter (basic blocks posted).
    pub(crate) fn head(&self) -> u32 {
        self.head
    }

    /// Back to the state after creation (the QP went through 2RST): counters 0, nothing
    /// pending. The caller zeroes the doorbell record and replaces the shadow.
    pub(crate) fn reset(&mut self) {
        self.head = 0;
        self.room_end = self.entries;
        self.last = 0;
        self.rung = 0;
    }

    /// WQEs posted since the last doorbell, counted by following their extents in the
    /// shadow (`sh`, the QP's).
    pub(crate) fn pending(&self, sh: &WqShadow) -> u32 {
        let mut n = 0;
        let mut at = self.rung;
        while at != self.head && n < self.entries {
            at = sh.send_next(at);
            n += 1;
        }
        n
    }
}

const MAX_BF_WORDS: usize = super::wqe::MAX_WQE_BYTES / 8;

/// The receive ring: `2^stride_log`-byte WQEs of data segments.
#[derive(Debug)]
pub(crate) struct RecvRing {
    /// The ring in data segments: WQE `n` is segments `n << seg_log ..`.
    ring: RqMem,
    /// The receive counter of the QP's doorbell record.
    dbr: DmaRecord,
    size: RingSize,
    /// log2 of data segments per WQE.
    seg_log: u32,
    head: u32,
    tail: u32,
}

/// Most data segments per receive WQE.
pub const MAX_RECV_SGES: usize = 16;

impl RecvRing {
    /// A receive ring of `size` WQEs of `2^stride_log` bytes (at least one data segment)
    /// over `ring`, whose doorbell record's receive counter (`QP_DBR_RCV`) is `dbr`.
    pub(crate) fn new(ring: RqMem, dbr: DmaRecord, size: RingSize, stride_log: u32) -> RecvRing {
        RecvRing {
            ring,
            dbr,
            size,
            seg_log: stride_log.saturating_sub(DS_UNIT.trailing_zeros()),
            head: 0,
            tail: 0,
        }
    }

    /// Writes a receive WQE and publishes it in the doorbell record (§9.6).
    #[inline(always)]
    pub(crate) fn post(
        &mut self,
        sh: &WqShadow,
        wr_id: u64,
        sges: &[Sge],
    ) -> Result<(), PostError> {
        let segs = 1usize << self.seg_log;
        if sges.len() > segs {
            return Err(PostError::TooManySges);
        }
        if in_flight(self.head, self.tail) >= self.size.entries() {
            self.tail = sh.recv_tail_acquire();
            if in_flight(self.head, self.tail) >= self.size.entries() {
                return Err(PostError::QueueFull);
            }
        }
        let base = self.head << self.seg_log;
        let r = &self.ring;
        for (k, s) in sges.iter().enumerate() {
            let at = base.wrapping_add(k as u32);
            r.store(
                at,
                0,
                (DATA_BYTE_COUNT.put(s.len.into()) | DATA_LKEY.put(s.lkey.into())).to_be(),
            );
            r.store(at, 1, DATA_ADDR.put(s.addr).to_be());
        }
        if sges.len() < segs {
            // A short list ends with a segment of byte_count 0 and the invalid lkey (§9.6).
            let at = base.wrapping_add(sges.len() as u32);
            r.store(at, 0, DATA_LKEY.put(INVALID_LKEY.into()).to_be());
            r.store(at, 1, 0);
        }
        sh.record_recv(self.head, wr_id);
        self.head = self.head.wrapping_add(1);
        sh.publish_recv_head(self.head);
        barrier::wmb_before_dbr(); // receive WQE written before the counter publishes it
        self.dbr.store_be32(self.head & 0xFFFF);
        Ok(())
    }

    /// Receive WQEs posted.
    pub(crate) fn head(&self) -> u32 {
        self.head
    }

    /// Back to the state after creation (the QP went through 2RST): counters 0.
    pub(crate) fn reset(&mut self) {
        self.head = 0;
        self.tail = 0;
    }
}

#[cfg(all(test, feature = "model"))]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dma::{DmaRegion, DmaSpace};
    use crate::pci::model::ModelFunction;
    use uhca_layout::uar::{QP_DBR_RCV, QP_DBR_SND};

    const BF: usize = 3 * 4096 + 0x800 + 2 * 512;
    const SQ_OFF: usize = 1024;
    const DBR: usize = 2048;

    struct Setup {
        buf: Arc<DmaRegion>,
        sh: WqShadow,
        sq: SendRing,
        db: Doorbell,
    }

    pub(crate) fn record(buf: &Arc<DmaRegion>, off: usize) -> DmaRecord {
        DmaRecord::new(buf.clone(), off).unwrap()
    }

    fn setup() -> Setup {
        let f = ModelFunction::with_defaults().unwrap();
        let bar = Bar::map(&(f.clone() as Arc<dyn crate::pci::PciFunction>), 0).unwrap();
        let space = DmaSpace::new(f);
        let size = RingSize::new(8, 15).unwrap();
        let sh = WqShadow::new(9, size, RingSize::new(4, 15).unwrap());
        let db = Doorbell {
            bar,
            bf_reg: BF,
            bf_half: 256,
            bf_off: 0,
        };
        let buf = Arc::new(space.alloc(4096).unwrap());
        let ring = SqMem::new(buf.clone(), SQ_OFF, size.log()).unwrap();
        let sq = SendRing::new(ring, record(&buf, DBR + QP_DBR_SND), 9);
        Setup { buf, sh, sq, db }
    }

    impl Setup {
        /// A WRITE of `sges` elements through the general path.
        fn post(&mut self, id: u64, sges: usize) -> Result<(), PostError> {
            let sge = Sge {
                addr: id,
                len: 4,
                lkey: 7,
            };
            self.sq.post(&self.sh, id, WqeOpcode::RdmaWrite, 0, 0, |w| {
                w.raddr(Remote {
                    addr: 0x10,
                    rkey: 3,
                });
                w.data(&vec![sge; sges])
            })
        }

        fn ring(&mut self) {
            self.sq.ring_doorbell(&self.sh, &mut self.db);
        }

        fn block(&self, slot: usize) -> [u8; 64] {
            let mut b = [0u8; 64];
            self.buf.slice().read(SQ_OFF + slot * 64, &mut b);
            b
        }
    }

    #[test]
    fn doorbell_record_then_blueflame_or_doorbell_with_alternating_halves() {
        let mut s = setup();
        s.post(1, 1).unwrap();
        s.ring();
        assert_eq!(s.buf.slice().load_be32(DBR + QP_DBR_SND), 1);
        // BlueFlame: the whole WQE went to the first half.
        let ring = s.block(0);
        assert_eq!(s.db.bar.read64_raw(BF), ring[..8]);
        assert_eq!(s.db.bar.read64_raw(BF + 16), ring[16..24]);
        assert_eq!(s.db.bf_off, 256);
        // A batch of two: a plain 8-byte doorbell with the last WQE's control segment, to
        // the second half.
        s.post(2, 1).unwrap();
        s.post(3, 1).unwrap();
        s.ring();
        assert_eq!(s.buf.slice().load_be32(DBR + QP_DBR_SND), 3);
        let last = s.block(2);
        assert_eq!(s.db.bar.read64_raw(BF + 256), last[..8]);
        assert_eq!(last[1..3], [0, 2], "WQE index 2 in the control segment");
        assert_eq!(s.db.bf_off, 0);
        // Nothing pending: no doorbell at all.
        s.ring();
        assert_eq!(s.db.bf_off, 0);
    }

    #[test]
    fn the_one_sge_path_writes_what_the_general_path_writes() {
        let mut s = setup();
        let sge = Sge {
            addr: 0x0102_0304_0506_0708,
            len: 0x40,
            lkey: 0x55,
        };
        let remote = Remote {
            addr: 0x1122_3344_5566_7788,
            rkey: 0xDEAD_BEEF,
        };
        for (imm, op, f) in [
            (0, WqeOpcode::RdmaWrite, 0x08),
            (0xA1B2_C3D4, WqeOpcode::RdmaWriteImm, 0x62),
        ] {
            s.sq.post(&s.sh, 1, op, f, imm, |w| {
                w.raddr(remote);
                w.data(&[sge])
            })
            .unwrap();
            s.sq.post_one_sge::<true>(&s.sh, 2, op, f, imm, remote, &sge)
                .unwrap();
            let (a, b) = (
                s.block(s.sq.head() as usize - 2),
                s.block(s.sq.head() as usize - 1),
            );
            assert_eq!(a[..3], [0, 0, a[2]]);
            assert_eq!(b[2], a[2] + 1, "consecutive WQE indices");
            assert_eq!(a[3..48], b[3..48], "{op:?}");
        }
        for op in [WqeOpcode::Send, WqeOpcode::SendImm] {
            s.sq.post(&s.sh, 1, op, 0x08, 7, |w| w.data(&[sge]))
                .unwrap();
            s.sq.post_one_sge::<false>(&s.sh, 2, op, 0x08, 7, remote, &sge)
                .unwrap();
            let (a, b) = (
                s.block(s.sq.head() as usize - 2),
                s.block(s.sq.head() as usize - 1),
            );
            assert_eq!(a[7] & 0x3F, 2, "ds");
            assert_eq!(a[3..32], b[3..32], "{op:?}");
        }
        s.ring();
        // The shadow has both wr_ids: the first WQE completes as 1, the next as 2.
        assert_eq!(s.sh.complete_send(0), Some(1));
        assert_eq!(s.sh.complete_send(1), Some(2));
        // A zero-length element is left out of `ds`, as the general path skips it.
        let empty = Sge { len: 0, ..sge };
        s.sq.post_one_sge::<true>(&s.sh, 8, WqeOpcode::RdmaWrite, 0, 0, remote, &empty)
            .unwrap();
        assert_eq!(s.block(0)[7] & 0x3F, 2, "ds = ctrl + raddr");
        // Full ring (tail 2, head 9: one more fits): the fast path refuses the next one
        // without writing anything.
        s.sq.post_one_sge::<true>(&s.sh, 9, WqeOpcode::RdmaWrite, 0, 0, remote, &sge)
            .unwrap();
        let before = s.block(2);
        assert_eq!(
            s.sq.post_one_sge::<true>(&s.sh, 9, WqeOpcode::RdmaWrite, 0, 0, remote, &sge),
            Err(PostError::QueueFull)
        );
        assert_eq!((s.sq.head(), s.sq.pending(&s.sh)), (10, 2));
        assert_eq!(s.block(2), before);
    }

    #[test]
    fn multi_block_wqe_wraps_and_full_ring_is_an_error() {
        let mut s = setup();
        for id in 0..7 {
            s.post(id, 1).unwrap();
        }
        // 7 of 8 blocks used: a 2-block WQE does not fit until completions come back.
        assert_eq!(s.post(7, 6), Err(PostError::QueueFull));
        s.ring();
        assert_eq!(s.sh.complete_send(6), Some(6));
        s.post(7, 6).unwrap(); // blocks 7 and 8 (slot 0): wraps
        let (first, second) = (s.block(7), s.block(0));
        assert_eq!(first[3], 0x08);
        assert_eq!(first[7] & 0x3F, 8, "ds = ctrl + raddr + 6 data");
        // The sixth data segment sits at byte 16 of the wrapped block.
        assert_eq!(second[16..20], 4u32.to_be_bytes());
        assert_eq!(second[24..32], 7u64.to_be_bytes());
        s.ring();
        assert_eq!(s.sh.complete_send(7), Some(7));
        assert_eq!(s.sq.room(&s.sh), 8);
    }

    #[test]
    fn completions_check_the_index_in_and_out_of_order() {
        let mut s = setup();
        s.post(1, 6).unwrap(); // blocks 0..2
        s.post(2, 1).unwrap(); // block 2
        s.post(3, 1).unwrap(); // block 3
        assert_eq!(s.sh.complete_send(0), None, "not published yet");
        s.ring();
        assert_eq!(s.sh.complete_send(1), None, "middle of WQE 1");
        assert_eq!(s.sh.complete_send(4), None, "never posted");
        // WQE 2's CQE (WQE 1 unsignaled): both complete.
        assert_eq!(s.sh.complete_send(2), Some(2));
        assert_eq!(s.sh.complete_send(2), None, "already completed");
        assert_eq!(s.sh.complete_send(3), Some(3));
        assert_eq!(s.sh.complete_send(3), None, "nothing outstanding");
    }

    #[test]
    fn receive_wqes_end_short_lists_and_publish_the_counter() {
        let s = setup();
        let rq_size = RingSize::new(4, 15).unwrap();
        // 32-byte WQEs: 2 data segments each.
        let mem = RqMem::new(s.buf.clone(), 0, rq_size.log() + 1).unwrap();
        let mut rq = RecvRing::new(mem, record(&s.buf, DBR + QP_DBR_RCV), rq_size, 5);
        let sh = &s.sh;
        let e = Sge {
            addr: 0x1234,
            len: 100,
            lkey: 6,
        };
        rq.post(sh, 50, &[e]).unwrap();
        let mut w = [0u8; 32];
        s.buf.slice().read(0, &mut w);
        assert_eq!(
            w[..16],
            [0, 0, 0, 100, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0x12, 0x34]
        );
        assert_eq!(w[16..], [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(s.buf.slice().load_be32(DBR + QP_DBR_RCV), 1);
        assert_eq!(rq.post(sh, 0, &[e; 3]), Err(PostError::TooManySges));
        for id in 51..54 {
            rq.post(sh, id, &[e, e]).unwrap();
        }
        assert_eq!(rq.post(sh, 99, &[e]), Err(PostError::QueueFull));
        assert_eq!(sh.complete_recv(0), Some(50));
        assert_eq!(sh.complete_recv(0), None, "already completed");
        rq.post(sh, 54, &[e]).unwrap();
        assert_eq!(s.buf.slice().load_be32(DBR + QP_DBR_RCV), 5);
    }
}

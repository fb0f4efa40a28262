//! The driver's CQ poller against CQEs from a hostile device: any bytes, plausible CQEs
//! with wrong QPNs, WQE counters, opcodes and syndromes, stale owner bits, on the
//! stand-in rig (`uhca::datapath::rig`: a send ring and a CQ on a device-less function).
//!
//! Input: `n u8` signaled WRITEs posted first, then records until the input ends:
//! - `0 stale u8, cqe [u8; 64]`: raw CQE bytes;
//! - `1 opcode u8, qp u8, counter u16, sop u8, syndrome u8, byte_cnt u32`: a plausible CQE
//!   (`qp` 0: the rig's QP, else that QPN; `counter` relative to the oldest WQE);
//! - `2 n u8`: poll up to `n` completions;
//! - `3 n u8`: post `n` more.
//!
//! Invariant: completions of the rig's QP name posted work requests, each later than the
//! last one reported (a CQE completes its WQE and every earlier one).
#![no_main]

use uhca::datapath::rig::Rig;
use uhca_fuzz::Reader;
use uhca_hw::layout::cqe::{CQE_SIZE, Cqe, OP_OWN_OFFSET};

/// The rig's QPN (`datapath::rig`).
const QPN: u32 = 0x42;

struct State {
    rig: Rig,
    posted: u64,
    oldest: u32,
    last: Option<u64>,
}

impl State {
    fn post(&mut self, n: u8) {
        for _ in 0..n {
            if self.rig.post_write(self.posted).is_ok() {
                self.posted += 1;
            }
        }
        self.rig.ring_doorbell();
    }

    fn poll(&mut self, n: u8) {
        for _ in 0..n {
            let Some(r) = self.rig.poll_one() else { return };
            if let Ok(c) = r {
                assert_eq!(c.qpn, QPN, "a completion for a QP not on this CQ: {c:?}");
                assert!(c.wr_id < self.posted, "never posted: {c:?}");
                if let Some(l) = self.last {
                    assert!(c.wr_id > l, "out of order or repeated: {c:?} after {l}");
                }
                self.last = Some(c.wr_id);
                self.oldest = (c.wr_id + 1) as u32;
            }
        }
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let Ok(rig) = Rig::new() else { return };
    let mut s = State {
        rig,
        posted: 0,
        oldest: 0,
        last: None,
    };
    let n = r.u8();
    s.post(n);
    let mut records = 0;
    while !r.done() && records < 256 {
        records += 1;
        match r.u8() % 4 {
            0 => {
                let stale = r.u8() & 1 != 0;
                let mut e = [0u8; CQE_SIZE];
                let b = r.bytes(CQE_SIZE);
                e[..b.len()].copy_from_slice(b);
                s.rig.fuzz_write_cqe(&e, stale);
            }
            1 => {
                let (op, qp, counter, sop) = (r.u8(), r.u8(), r.u16(), r.u8());
                let (synd, cnt) = (r.u8(), r.u32());
                let mut e = [0u8; CQE_SIZE];
                {
                    let mut c = Cqe::new_unchecked(&mut e[..]);
                    c.set_qpn(if qp == 0 { QPN } else { u32::from(qp) });
                    c.set_wqe_counter(u32::from(counter.wrapping_add(s.oldest as u16)));
                    c.set_sop(sop.into());
                    c.set_byte_cnt(cnt);
                }
                e[0x34] = synd;
                e[OP_OWN_OFFSET] = op << 4;
                s.rig.fuzz_write_cqe(&e, false);
            }
            2 => {
                let n = r.u8();
                s.poll(n);
            }
            _ => {
                let n = r.u8();
                s.post(n);
            }
        }
    }
    s.poll(255);
});

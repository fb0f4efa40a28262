//! A test-only driver for the data path: it builds commands with the layouts, runs them
//! through the dispatcher, and posts WQEs / polls CQEs in host memory the model reaches
//! through its IOMMU, ringing doorbells in BAR0 as a driver would (prm-subset.md §9).

mod acks;
mod cmds;
mod ib;
mod ops;
mod rtc;
mod wqe_fuzz;

use super::cmd::dispatch;
use super::lifecycle::Lifecycle;
use super::mem::MappedBuffer;
use super::{Hca, ModelConfig};
use crate::layout::cmd::{CmdStatus, InHeader, Opcode, OutHeader};
use crate::layout::cmds::{
    CreateCqIn, CreateCqOut, CreateEqIn, CreateEqOut, CreateMkeyIn, CreateMkeyOut, CreateQpIn,
    CreateQpOut, Qp2rstIn, Rst2initQpIn,
};
use crate::layout::cqc::Cqc;
use crate::layout::cqe::{CQE_SIZE, OP_OWN_INIT, cqe_is_sw_owned};
use crate::layout::eqc::Eqc;
use crate::layout::mkc::Mkc;
use crate::layout::qpc::{Ads, Qpc};
use crate::layout::uar::{CQ_DOORBELL, UAR_SIZE, bf_reg_offset, cq_arm_word};
use crate::layout::wqe::{CtrlSeg, DataSeg, INVALID_LKEY, RaddrSeg};
use crate::layout::{Buf, BufMut};

const PAGE: usize = 4096;
/// Virtual addresses of MKeys start here (not the IOVA: translation is exercised).
const VA_BASE: u64 = 0x7700_0000_0000;

/// A command's outcome.
pub(super) type Out = (CmdStatus, u32, Vec<u8>);

pub(super) struct Rig<'a> {
    pub(super) hca: &'a Hca,
    pub(super) pd: u32,
    pub(super) uar: u32,
    pub(super) eqn: u32,
    bufs: Vec<MappedBuffer<'a>>,
    next_iova: u64,
}

/// A buffer: index into the rig's list, its IOVA and the VA its MKey gives it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mem {
    pub(super) idx: usize,
    pub(super) iova: u64,
    pub(super) va: u64,
    pub(super) key: u32,
}

pub(super) struct TCq {
    pub(super) cqn: u32,
    buf: usize,
    dbr: usize,
    log: u32,
    pub(super) ci: u32,
}

pub(super) struct TQp {
    pub(super) qpn: u32,
    buf: usize,
    dbr: usize,
    log_sq: u32,
    log_rq: u32,
    sq_off: usize,
    pub(super) sq_pi: u32,
    pub(super) rq_pi: u32,
}

pub(super) fn header(op: Opcode, len: usize) -> Vec<u8> {
    let mut i = vec![0u8; len];
    InHeader::new_unchecked(&mut i[..]).set_opcode(u16::from(op).into());
    i
}

pub(super) fn model(mac_last: u8) -> Hca {
    Hca::new(ModelConfig {
        mac: [0x02, 0, 0, 0, 0, mac_last],
        name: format!("dp{mac_last}"),
        ..Default::default()
    })
    .expect("model")
}

impl<'a> Rig<'a> {
    pub(super) fn new(hca: &'a Hca) -> Rig<'a> {
        hca.shared.iommu.set_bus_master(true);
        let (pd, uar) = {
            let mut core = hca.shared.core();
            core.life = Lifecycle::Initialized;
            (core.pds.alloc().unwrap(), core.uars.alloc().unwrap())
        };
        let mut r = Rig {
            hca,
            pd,
            uar,
            eqn: 0,
            bufs: Vec::new(),
            next_iova: 0x10_0000,
        };
        let eq = r.alloc(PAGE);
        for k in 0..PAGE / 64 {
            r.buf(eq.idx).store_u8_release(k * 64 + 63, 1);
        }
        let mut i = header(Opcode::CreateEq, 0x110 + 8);
        {
            let mut c = Eqc::new_unchecked(&mut i[CreateEqIn::<()>::EQ_CONTEXT_ENTRY..]);
            c.set_log_eq_size(6);
            c.set_uar_page(uar);
        }
        i[0x58 + 7] = 1 << 4; // event type 4 (CQ_ERROR): bit 4 of the first BE64 word
        i.write_be64(0x110, eq.iova);
        let (st, _, out) = r.cmd(&i, 16);
        assert_eq!(st, CmdStatus::Ok);
        r.eqn = CreateEqOut::new_unchecked(&out[..]).eq_number();
        r
    }

    pub(super) fn cmd(&self, input: &[u8], outlen: usize) -> Out {
        let mut core = self.hca.shared.core();
        let out = dispatch(&self.hca.shared, &mut core, input, input.len(), outlen);
        let h = OutHeader::new_unchecked(&out[..]);
        (CmdStatus::from(h.status() as u8), h.syndrome(), out)
    }

    pub(super) fn buf(&self, idx: usize) -> &crate::model::DmaBuffer {
        &self.bufs[idx].buf
    }

    /// Maps a fresh zeroed buffer (no MKey).
    pub(super) fn alloc(&mut self, len: usize) -> Mem {
        let len = len.next_multiple_of(PAGE);
        let iova = self.next_iova;
        self.next_iova += len as u64 + PAGE as u64; // a hole after each buffer
        self.bufs.push(MappedBuffer::new(self.hca, iova, len));
        Mem {
            idx: self.bufs.len() - 1,
            iova,
            va: 0,
            key: 0,
        }
    }

    /// A buffer with an MTT MKey over it; `rights` = (lw, rr, rw, a).
    pub(super) fn mr(&mut self, len: usize, rights: (u32, u32, u32, u32)) -> Mem {
        let mut m = self.alloc(len);
        let pages = len.div_ceil(PAGE);
        let octs = pages.div_ceil(2);
        let va = VA_BASE + m.iova;
        let mut i = header(Opcode::CreateMkey, 0x110 + 16 * octs);
        CreateMkeyIn::new_unchecked(&mut i[..]).set_translations_octword_actual_size(octs as u32);
        {
            let mut c = Mkc::new_unchecked(&mut i[CreateMkeyIn::<()>::MEMORY_KEY_MKEY_ENTRY..]);
            c.set_access_mode_1_0(1);
            c.set_lr(1);
            c.set_lw(rights.0);
            c.set_rr(rights.1);
            c.set_rw(rights.2);
            c.set_a(rights.3);
            c.set_qpn(0xFF_FFFF);
            c.set_mkey_7_0(0x33);
            c.set_pd(self.pd);
            c.set_start_addr(va);
            c.set_len((pages * PAGE) as u64);
            c.set_translations_octword_size(octs as u32);
            c.set_log_page_size(12);
        }
        for k in 0..pages {
            i.write_be64(0x110 + 8 * k, m.iova + (k * PAGE) as u64);
        }
        let (st, syn, out) = self.cmd(&i, 16);
        assert_eq!(st, CmdStatus::Ok, "CREATE_MKEY syndrome {syn:#x}");
        m.va = va;
        m.key = (CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | 0x33;
        m
    }

    pub(super) fn cq_input(&mut self, log: u32) -> (Vec<u8>, usize, usize) {
        let b = self.alloc(CQE_SIZE << log);
        for k in 0..1usize << log {
            self.buf(b.idx)
                .store_u8_release(k * CQE_SIZE + 63, OP_OWN_INIT);
        }
        let d = self.alloc(64);
        let pages = (CQE_SIZE << log).div_ceil(PAGE);
        let mut i = header(Opcode::CreateCq, 0x110 + 8 * pages);
        {
            let mut c = Cqc::new_unchecked(&mut i[CreateCqIn::<()>::CQ_CONTEXT..]);
            c.set_log_cq_size(log);
            c.set_uar_page(self.uar);
            c.set_c_eqn_or_apu_element(self.eqn);
            c.set_dbr_addr(d.iova);
        }
        for k in 0..pages {
            i.write_be64(0x110 + 8 * k, b.iova + (k * PAGE) as u64);
        }
        (i, b.idx, d.idx)
    }

    pub(super) fn cq(&mut self, log: u32) -> TCq {
        let (i, buf, dbr) = self.cq_input(log);
        let (st, syn, out) = self.cmd(&i, 16);
        assert_eq!(st, CmdStatus::Ok, "CREATE_CQ syndrome {syn:#x}");
        TCq {
            cqn: CreateCqOut::new_unchecked(&out[..]).cqn(),
            buf,
            dbr,
            log,
            ci: 0,
        }
    }

    pub(super) fn qp_input(
        &mut self,
        cq_s: u32,
        cq_r: u32,
        log_sq: u32,
        log_rq: u32,
    ) -> (Vec<u8>, TQp) {
        let rq_bytes = (1usize << log_rq) * 64; // stride 64 bytes: 4 SGEs
        let sq_bytes = 64usize << log_sq;
        let b = self.alloc(rq_bytes + sq_bytes);
        let d = self.alloc(64);
        let pages = (rq_bytes + sq_bytes).div_ceil(PAGE);
        let mut i = header(Opcode::CreateQp, 0x110 + 8 * pages);
        {
            let mut c = Qpc::new_unchecked(&mut i[CreateQpIn::<()>::QPC..]);
            c.set_pd(self.pd);
            c.set_cqn_snd(cq_s);
            c.set_cqn_rcv(cq_r);
            c.set_uar_page(self.uar);
            c.set_log_sq_size(log_sq);
            c.set_log_rq_size(log_rq);
            c.set_log_rq_stride(2);
            c.set_dbr_addr(d.iova);
            c.set_pm_state(3);
        }
        for k in 0..pages {
            i.write_be64(0x110 + 8 * k, b.iova + (k * PAGE) as u64);
        }
        let q = TQp {
            qpn: 0,
            buf: b.idx,
            dbr: d.idx,
            log_sq,
            log_rq,
            sq_off: rq_bytes,
            sq_pi: 0,
            rq_pi: 0,
        };
        (i, q)
    }

    pub(super) fn qp(&mut self, cq_s: u32, cq_r: u32) -> TQp {
        let (i, mut q) = self.qp_input(cq_s, cq_r, 6, 6);
        let (st, syn, out) = self.cmd(&i, 16);
        assert_eq!(st, CmdStatus::Ok, "CREATE_QP syndrome {syn:#x}");
        q.qpn = CreateQpOut::new_unchecked(&out[..]).qpn();
        q
    }

    /// A transition input for `qpn` with `f` filling the qpc.
    pub(super) fn modify(&self, op: Opcode, qpn: u32, f: impl FnOnce(&mut [u8])) -> Out {
        let mut i = header(op, 0x110);
        Rst2initQpIn::new_unchecked(&mut i[..]).set_qpn(qpn);
        f(&mut i[0x18..0x18 + 232]);
        self.cmd(&i, 16)
    }

    pub(super) fn simple(&self, op: Opcode, qpn: u32) -> Out {
        let mut i = header(op, 16);
        Qp2rstIn::new_unchecked(&mut i[..]).set_qpn(qpn);
        self.cmd(&i, 464)
    }

    /// RST → INIT → RTR → RTS toward `peer_qpn` on `peer_mac` (GID index 1, IPv4), all
    /// remote rights, MTU 256 (so messages span many packets).
    pub(super) fn connect(&self, qpn: u32, peer_qpn: u32, peer_mac: [u8; 6], peer_gid: [u8; 16]) {
        let (st, syn, _) = self.modify(Opcode::Rst2InitQp, qpn, |q| {
            {
                let mut c = Qpc::new_unchecked(&mut q[..]);
                c.set_rre(1);
                c.set_rwe(1);
                c.set_rae(1);
                c.set_atomic_mode(1);
            }
            Ads::new_unchecked(&mut q[0x18..0x18 + 44]).set_vhca_port_num(1);
        });
        assert_eq!(st, CmdStatus::Ok, "RST2INIT {syn:#x}");
        let (st, syn, _) = self.modify(Opcode::Init2RtrQp, qpn, |q| {
            {
                let mut c = Qpc::new_unchecked(&mut q[..]);
                c.set_mtu(1);
                c.set_log_msg_max(30); // as the driver sets it (caps.log_max_msg)
                c.set_remote_qpn(peer_qpn);
                c.set_next_rcv_psn(0x100);
                c.set_log_rra_max(2);
                c.set_min_rnr_nak(1);
                c.set_rre(1);
                c.set_rwe(1);
                c.set_rae(1);
            }
            let mut a = Ads::new_unchecked(&mut q[0x18..0x18 + 44]);
            a.set_src_addr_index(1);
            a.set_rgid_rip(&peer_gid);
            a.set_rmac_47_32(u32::from(u16::from_be_bytes([peer_mac[0], peer_mac[1]])));
            a.set_rmac_31_0(u32::from_be_bytes(peer_mac[2..].try_into().unwrap()));
            a.set_udp_sport(0xC000);
            a.set_hop_limit(64);
            a.set_vhca_port_num(1);
        });
        assert_eq!(st, CmdStatus::Ok, "INIT2RTR {syn:#x}");
        let (st, syn, _) = self.modify(Opcode::Rtr2RtsQp, qpn, |q| {
            {
                let mut c = Qpc::new_unchecked(&mut q[..]);
                c.set_next_send_psn(0x100);
                c.set_retry_count(7);
                c.set_rnr_retry(7);
                c.set_log_sra_max(2);
            }
            Ads::new_unchecked(&mut q[0x18..0x18 + 44]).set_ack_timeout(14);
        });
        assert_eq!(st, CmdStatus::Ok, "RTR2RTS {syn:#x}");
    }

    /// Two QPs connected to each other through the loopback, each with its own CQ of 64:
    /// `(a, b, a's CQ, b's CQ)`.
    pub(super) fn pair(&mut self) -> (TQp, TQp, TCq, TCq) {
        let (ca, cb) = (self.cq(6), self.cq(6));
        let (a, b) = (self.qp(ca.cqn, ca.cqn), self.qp(cb.cqn, cb.cqn));
        let (mac, gid) = self.addr();
        self.connect(a.qpn, b.qpn, mac, gid);
        self.connect(b.qpn, a.qpn, mac, gid);
        (a, b, ca, cb)
    }

    /// The port's MAC and its IPv4 GID (index 1).
    pub(super) fn addr(&self) -> ([u8; 6], [u8; 16]) {
        let core = self.hca.shared.core();
        (core.vport.mac, core.vport.gids[1].unwrap().gid)
    }

    /// Writes a WQE (`segs` after the control segment) at the SQ producer counter, updates
    /// the DBR and rings the doorbell with the first 8 bytes of the control segment.
    pub(super) fn post(&mut self, q: &mut TQp, opcode: u8, fm_ce_se: u8, imm: u32, segs: &[u8]) {
        self.post_many(q, &[(opcode, fm_ce_se, imm, segs)]);
    }

    /// Posts the WQEs `(opcode, fm_ce_se, imm, segs)` of `wqes` with one doorbell: the
    /// device finds them all at once.
    pub(super) fn post_many(&mut self, q: &mut TQp, wqes: &[(u8, u8, u32, &[u8])]) {
        let mut all = Vec::new();
        for &(opcode, fm_ce_se, imm, segs) in wqes {
            let ds = 1 + segs.len().div_ceil(16);
            let mut w = vec![0u8; (ds * 16).next_multiple_of(64)];
            {
                let mut c = CtrlSeg::new_unchecked(&mut w[..16]);
                c.set_opcode(opcode.into());
                c.set_wqe_index((q.sq_pi + (all.len() / 64) as u32) & 0xFFFF);
                c.set_qpn(q.qpn);
                c.set_ds(ds as u32);
                c.set_fm_ce_se(fm_ce_se.into());
                c.set_imm(imm);
            }
            w[16..16 + segs.len()].copy_from_slice(segs);
            all.extend_from_slice(&w);
        }
        self.post_wqe(q, &all);
    }

    /// Writes the whole WQE `w` (control segment included, a multiple of 64 bytes; or
    /// several, back to back) at the SQ producer counter, updates the DBR and rings the
    /// doorbell (with the first one's control segment).
    pub(super) fn post_wqe(&mut self, q: &mut TQp, w: &[u8]) {
        let nbb = w.len() / 64;
        for b in 0..nbb {
            let slot = ((q.sq_pi + b as u32) & ((1 << q.log_sq) - 1)) as usize;
            let mut buf = self.buf(q.buf);
            buf.write_bytes(q.sq_off + slot * 64, &w[b * 64..b * 64 + 64]);
        }
        q.sq_pi += nbb as u32;
        let mut dbr = self.buf(q.dbr);
        dbr.write_be32(4, q.sq_pi & 0xFFFF);
        let bf = self.uar as usize * UAR_SIZE + bf_reg_offset(1, super::caps::LOG_BF_REG_SIZE);
        self.hca.shared.bar.write_be32(bf, w.read_be32(0));
        self.hca.shared.bar.write_be32(bf + 4, w.read_be32(4));
    }

    /// Posts a receive WQE with `sges` (`(lkey, addr, len)`).
    pub(super) fn post_recv(&mut self, q: &mut TQp, sges: &[(u32, u64, u32)]) {
        let slot = (q.rq_pi & ((1 << q.log_rq) - 1)) as usize;
        let mut w = [0u8; 64];
        for k in 0..4 {
            let mut d = DataSeg::new_unchecked(&mut w[16 * k..16 * k + 16]);
            match sges.get(k) {
                Some(&(lkey, addr, len)) => {
                    d.set_byte_count(len);
                    d.set_lkey(lkey);
                    d.set_addr(addr);
                }
                None => d.set_lkey(INVALID_LKEY),
            }
        }
        let mut buf = self.buf(q.buf);
        buf.write_bytes(slot * 64, &w);
        q.rq_pi += 1;
        let mut dbr = self.buf(q.dbr);
        dbr.write_be32(0, q.rq_pi & 0xFFFF);
    }

    /// The next CQE if software owns it (advances and publishes the consumer index).
    pub(super) fn poll(&self, cq: &mut TCq) -> Option<[u8; 64]> {
        let at = (cq.ci & ((1 << cq.log) - 1)) as usize * CQE_SIZE;
        let b = self.buf(cq.buf);
        if !cqe_is_sw_owned(b.load_u8_acquire(at + 63), cq.ci, cq.log) {
            return None;
        }
        let mut e = [0u8; 64];
        b.read_bytes(at, &mut e);
        cq.ci += 1;
        let mut d = self.buf(cq.dbr);
        d.write_be32(0, cq.ci & 0xFF_FFFF);
        Some(e)
    }

    /// Waits for the next CQE (the device thread runs on its own; no timing is asserted,
    /// the limit only turns a hang into a failure).
    pub(super) fn wait(&self, cq: &mut TCq) -> [u8; 64] {
        let start = std::time::Instant::now();
        loop {
            if let Some(e) = self.poll(cq) {
                return e;
            }
            assert!(start.elapsed().as_secs() < 60, "no CQE on CQ {}", cq.cqn);
            std::thread::yield_now();
        }
    }

    /// Waits until the device has written `n` CQEs past the consumer index, without
    /// consuming them (the CQ's consumer index stays where it is).
    pub(super) fn wait_written(&self, cq: &TCq, n: u32) {
        let idx = cq.ci + n - 1;
        let at = (idx & ((1 << cq.log) - 1)) as usize * CQE_SIZE;
        let start = std::time::Instant::now();
        while !cqe_is_sw_owned(self.buf(cq.buf).load_u8_acquire(at + 63), idx, cq.log) {
            assert!(start.elapsed().as_secs() < 60, "CQE {idx} never written");
            std::thread::yield_now();
        }
    }

    /// Arms `cq` for the next completion (§9.3).
    pub(super) fn arm(&self, cq: &TCq, solicited: bool) {
        let w = cq_arm_word(0, solicited, cq.ci);
        let mut d = self.buf(cq.dbr);
        d.write_be32(4, w);
        let at = self.uar as usize * UAR_SIZE + CQ_DOORBELL;
        self.hca.shared.bar.write_be32(at, w);
        self.hca.shared.bar.write_be32(at + 4, cq.cqn);
    }

    /// EQEs written so far on the rig's EQ: `(type, data word at 0x20, word at 0x38)`.
    pub(super) fn eqes(&self) -> Vec<(u8, u32, u32)> {
        let b = self.buf(0);
        (0..64)
            .filter(|k| b.load_u8_acquire(k * 64 + 63) & 1 == 0)
            .map(|k| {
                (
                    b.load_u8_acquire(k * 64 + 1),
                    b.read_be32(k * 64 + 0x20),
                    b.read_be32(k * 64 + 0x38),
                )
            })
            .collect()
    }
}

/// Segment builders.
pub(super) fn raddr(addr: u64, rkey: u32) -> [u8; 16] {
    let mut s = [0u8; 16];
    let mut r = RaddrSeg::new_unchecked(&mut s[..]);
    r.set_raddr(addr);
    r.set_rkey(rkey);
    s
}

pub(super) fn data(lkey: u32, addr: u64, len: u32) -> [u8; 16] {
    let mut s = [0u8; 16];
    let mut d = DataSeg::new_unchecked(&mut s[..]);
    d.set_byte_count(len);
    d.set_lkey(lkey);
    d.set_addr(addr);
    s
}

pub(super) fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

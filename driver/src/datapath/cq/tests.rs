//! Unit tests of the CQ poller ([`super`]): CQEs written by hand into a 4-entry ring.

use super::*;
use crate::datapath::sq::{Doorbell, SendRing, SqMem};
use crate::datapath::wqe::{Remote, Sge};
use crate::dma::DmaSpace;
use crate::pci::Bar;
use crate::pci::model::ModelFunction;
use uhca_layout::cqe::cqe_owner_for;
use uhca_layout::uar::QP_DBR_SND;
use uhca_layout::wqe::fm_ce_se;

struct Rig {
    ring: CqRing,
    sq: SendRing,
    sh: Arc<WqShadow>,
    db: Doorbell,
    pi: u32,
    space: Arc<DmaSpace>,
}

const QPN: u32 = 5;

fn rig() -> Rig {
    let f = ModelFunction::with_defaults().unwrap();
    let bar = Bar::map(&(f.clone() as Arc<dyn crate::pci::PciFunction>), 0).unwrap();
    let space = DmaSpace::new(f);
    let sq_size = RingSize::new(16, 15).unwrap();
    let sh = Arc::new(WqShadow::new(QPN, sq_size, RingSize::new(4, 15).unwrap()));
    let reg = Arc::new(QpRegistry::default());
    reg.add(&sh);
    let mut ring = CqRing::new(
        Arc::new(space.alloc(4096).unwrap()),
        RingSize::new(4, 15).unwrap(),
        256,
        reg,
    )
    .unwrap();
    ring.refresh();
    let qbuf = Arc::new(space.alloc(4096).unwrap());
    Rig {
        ring,
        sq: SendRing::new(
            SqMem::new(qbuf.clone(), 0, sq_size.log()).unwrap(),
            crate::datapath::sq::tests::record(&qbuf, 4032 + QP_DBR_SND),
            QPN,
        ),
        sh,
        db: Doorbell {
            bar,
            bf_reg: 3 * 4096 + 0x800,
            bf_half: 256,
            bf_off: 0,
        },
        pi: 0,
        space,
    }
}

impl Rig {
    /// Posts a signaled WRITE with `sges` data segments and rings the doorbell.
    fn post(&mut self, wr_id: u64, sges: usize) {
        let sge = Sge {
            addr: 0x1000,
            len: 8,
            lkey: 1,
        };
        self.sq
            .post(
                &self.sh,
                wr_id,
                WqeOpcode::RdmaWrite,
                fm_ce_se::CQ_UPDATE,
                0,
                |w| {
                    w.raddr(Remote::default());
                    w.data(&vec![sge; sges])
                },
            )
            .unwrap();
        self.sq.ring_doorbell(&self.sh, &mut self.db);
    }

    /// Writes a CQE as the device would: body first, `op_own` last with the owner bit.
    fn cqe(&mut self, opcode: CqeOpcode, qpn: u32, counter: u16, fill: impl Fn(&mut [u8])) {
        write_cqe(self.ring.region(), self.pi, opcode, qpn, counter, fill);
        self.pi += 1;
    }

    fn dbr_ci(&self) -> u32 {
        self.ring.region().slice().load_be32(256)
    }
}

/// Writes CQE number `pi` of the 4-entry ring in `region` (see `Rig::cqe`).
fn write_cqe(
    region: &DmaRegion,
    pi: u32,
    opcode: CqeOpcode,
    qpn: u32,
    counter: u16,
    fill: impl Fn(&mut [u8]),
) {
    let mut e = [0u8; CQE_SIZE];
    {
        let mut c = Cqe::new_unchecked(&mut e[..]);
        c.set_qpn(qpn);
        c.set_wqe_counter(counter.into());
        c.set_sop(0x08);
        c.set_byte_cnt(8);
    }
    fill(&mut e);
    let own = cqe_owner_for(pi, 2);
    let slot = (pi & 3) as usize * CQE_SIZE;
    let s = region.slice();
    s.write(slot, &e[..OP_OWN_OFFSET]);
    s.write_u8(slot + OP_OWN_OFFSET, (u8::from(opcode) << 4) | own);
}

#[test]
fn room_freed_by_a_completion_is_seen_by_the_poster_within_the_batch() {
    let mut r = rig();
    for id in 0..3 {
        r.post(id, 1);
    }
    r.cqe(CqeOpcode::Req, QPN, 0, |_| {});
    r.cqe(CqeOpcode::Req, QPN, 1, |_| {});
    assert_eq!(r.sq.room(&r.sh), 13);
    let mut p = Poll::new(&mut r.ring);
    assert_eq!(p.next().unwrap().unwrap().wr_id, 0);
    // The iterator is still alive (a post made in the polling loop): the poster
    // already sees the block of the WQE that completed.
    assert_eq!(r.sq.room(&r.sh), 14);
    assert_eq!(p.next().unwrap().unwrap().wr_id, 1);
    assert_eq!(r.sq.room(&r.sh), 15);
    assert!(p.next().is_none());
    drop(p);
    assert_eq!(r.dbr_ci(), 2);
}

#[test]
fn a_wqe_posted_while_a_batch_is_polled_completes_in_that_batch() {
    let mut r = rig();
    r.post(1, 1);
    r.cqe(CqeOpcode::Req, QPN, 0, |_| {});
    let region = r.ring.region().clone();
    let mut p = Poll::new(&mut r.ring);
    assert_eq!(p.next().unwrap().unwrap().wr_id, 1);
    // Nothing was outstanding when the batch began: this one is past its copy of the
    // send counters, and still completes (through the shared ones), as does the next.
    for (i, id) in [2u64, 3].into_iter().enumerate() {
        r.sq.post(
            &r.sh,
            id,
            WqeOpcode::RdmaWrite,
            fm_ce_se::CQ_UPDATE,
            0,
            |w| {
                w.raddr(Remote::default());
                w.data(&[Sge {
                    addr: 0x1000,
                    len: 8,
                    lkey: 1,
                }])
            },
        )
        .unwrap();
        r.sq.ring_doorbell(&r.sh, &mut r.db);
        write_cqe(
            &region,
            1 + i as u32,
            CqeOpcode::Req,
            QPN,
            1 + i as u16,
            |_| {},
        );
        assert_eq!(p.next().unwrap().unwrap().wr_id, id);
    }
    // With nothing outstanding, a CQE naming the next counter is refused.
    write_cqe(&region, 3, CqeOpcode::Req, QPN, 3, |_| {});
    assert_eq!(
        p.next(),
        Some(Err(PollError::BadIndex {
            qpn: QPN,
            wqe_counter: 3
        }))
    );
    assert_eq!(p.next(), None);
    drop(p);
    assert_eq!(r.dbr_ci(), 4);
    assert_eq!(r.sq.room(&r.sh), 16);
}

#[test]
fn requester_and_error_cqes_map_to_completions() {
    let mut r = rig();
    r.post(11, 1);
    r.post(12, 6); // 2 basic blocks: counters 1 and 2
    r.post(13, 1);
    r.cqe(CqeOpcode::Req, QPN, 0, |_| {});
    r.cqe(CqeOpcode::ReqErr, QPN, 1, |e| {
        let mut x = ErrCqe::new_unchecked(e);
        x.set_syndrome(0x13);
        x.set_vendor_err_synd(0x88);
        x.set_s_wqe_opcode(0x12);
    });
    let got: Vec<_> = r.ring_poll();
    assert_eq!(got.len(), 2);
    let c0 = got[0].unwrap();
    assert_eq!(
        (c0.wr_id, c0.status, c0.opcode, c0.qpn),
        (11, WcStatus::Success, WcOpcode::RdmaWrite, QPN)
    );
    let c1 = got[1].unwrap();
    assert_eq!(c1.wr_id, 12);
    assert_eq!(c1.opcode, WcOpcode::FetchAdd);
    assert_eq!(c1.byte_len, 8);
    assert_eq!(
        c1.status,
        WcStatus::Error {
            syndrome: CqeSyndrome::RemoteAccess,
            vendor_err: 0x88
        }
    );
    // One consumer-index update for the batch.
    assert_eq!(r.dbr_ci(), 2);
    // The send ring got its blocks back up to the end of WQE 12.
    assert_eq!(r.sq.room(&r.sh), 16 - 1);
}

impl Rig {
    fn ring_poll(&mut self) -> Vec<Result<Completion, PollError>> {
        Poll::new(&mut self.ring).collect()
    }
}

#[test]
fn untrusted_indices_and_qpns_are_reported_not_followed() {
    let mut r = rig();
    r.post(1, 6); // counters 0..2
    r.post(2, 1); // counter 2
    r.cqe(CqeOpcode::Req, QPN, 1, |_| {}); // middle of WQE 1
    r.cqe(CqeOpcode::Req, QPN, 7, |_| {}); // never posted
    r.cqe(CqeOpcode::Req, 99, 0, |_| {}); // unknown QP
    r.cqe(CqeOpcode::Resize, QPN, 0, |_| {});
    let got = r.ring_poll();
    assert_eq!(
        got,
        vec![
            Err(PollError::BadIndex {
                qpn: QPN,
                wqe_counter: 1
            }),
            Err(PollError::BadIndex {
                qpn: QPN,
                wqe_counter: 7
            }),
            Err(PollError::UnknownQp { qpn: 99 }),
            Err(PollError::BadOpcode(CqeOpcode::Resize)),
        ]
    );
    // Nothing was completed by the bad CQEs; a good one still works.
    r.cqe(CqeOpcode::Req, QPN, 2, |_| {});
    assert_eq!(r.ring_poll()[0].unwrap().wr_id, 2);
    assert_eq!(r.dbr_ci(), 5);
}

#[test]
fn ownership_parity_follows_the_pass() {
    let mut r = rig();
    for i in 0..4 {
        r.post(i, 1);
    }
    for i in 0..4u16 {
        r.cqe(CqeOpcode::Req, QPN, i, |_| {});
    }
    assert_eq!(r.ring_poll().len(), 4);
    // Slot 0 still holds the first pass's CQE (owner 0): on the second pass it is stale.
    assert!(r.ring_poll().is_empty());
    r.post(4, 1);
    r.cqe(CqeOpcode::Req, QPN, 4, |_| {}); // owner 1
    assert_eq!(r.ring_poll()[0].unwrap().wr_id, 4);
    assert_eq!(r.dbr_ci(), 5);
}

#[test]
fn two_qps_on_one_cq_and_unsignaled_wqes_completed_in_passing() {
    let mut r = rig();
    let size = RingSize::new(16, 15).unwrap();
    let other = Arc::new(WqShadow::new(6, size, RingSize::new(4, 15).unwrap()));
    r.ring.qps.registry.add(&other);
    let region = Arc::new(r.space.alloc(4096).unwrap());
    let mut sq6 = SendRing::new(
        SqMem::new(region.clone(), 0, size.log()).unwrap(),
        crate::datapath::sq::tests::record(&region, 4032 + QP_DBR_SND),
        6,
    );
    let sge = Sge {
        addr: 0x1000,
        len: 8,
        lkey: 1,
    };
    for id in [60, 61] {
        sq6.post_one_sge::<true>(
            &other,
            id,
            WqeOpcode::RdmaWrite,
            fm_ce_se::CQ_UPDATE,
            0,
            Remote::default(),
            &sge,
        )
        .unwrap();
    }
    sq6.ring_doorbell(&other, &mut r.db);
    for id in [50, 51, 52] {
        r.post(id, 1);
    }
    r.cqe(CqeOpcode::Req, QPN, 0, |_| {});
    r.cqe(CqeOpcode::Req, 6, 0, |_| {});
    // WQE 51 was (in effect) unsignaled: the CQE of 52 completes both.
    r.cqe(CqeOpcode::Req, QPN, 2, |_| {});
    r.cqe(CqeOpcode::Req, 6, 1, |_| {});
    let ids: Vec<_> = r
        .ring_poll()
        .into_iter()
        .map(|c| c.unwrap().wr_id)
        .collect();
    assert_eq!(ids, [50, 60, 52, 61]);
    assert_eq!(r.sq.room(&r.sh), 16);
    assert_eq!(sq6.room(&other), 16);
}

#[test]
fn empty_poll_writes_no_doorbell_record() {
    let mut r = rig();
    r.ring.region().slice().store_be32(256, 0xABCD);
    assert!(r.ring_poll().is_empty());
    assert_eq!(r.dbr_ci(), 0xABCD);
}

#[test]
fn only_read_and_atomic_send_completions_carry_a_byte_count() {
    let mut r = rig();
    for id in 0..4 {
        r.post(id, 1);
    }
    // The CQE's send opcode decides the completion's kind; every CQE has byte_cnt 100.
    for (i, sop) in [0x08u8, 0x10, 0x12, 0x0a].into_iter().enumerate() {
        r.cqe(CqeOpcode::Req, QPN, i as u16, |e| {
            let mut c = Cqe::new_unchecked(e);
            c.set_sop(sop.into());
            c.set_byte_cnt(100);
        });
    }
    let got: Vec<_> = r
        .ring_poll()
        .into_iter()
        .map(|c| {
            let c = c.unwrap();
            (c.wr_id, c.opcode, c.byte_len)
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, WcOpcode::RdmaWrite, 0),
            (1, WcOpcode::RdmaRead, 100),
            (2, WcOpcode::FetchAdd, 8),
            (3, WcOpcode::Send, 0),
        ]
    );
    assert_eq!(r.sq.room(&r.sh), 16);
}

#[test]
fn a_qp_cache_reload_on_an_odd_pass_keeps_the_owner_rule() {
    let mut r = rig();
    for i in 0..4u16 {
        r.post(i.into(), 1);
        r.cqe(CqeOpcode::Req, QPN, i, |_| {});
    }
    assert_eq!(r.ring_poll().len(), 4);
    // Consumer index 4: the second pass (owner 1). A new QP reloads the cache, which
    // forgets the hot QP: the empty entry (owner 0, from the first pass) is still empty,
    // and a CQE written on this pass is still seen.
    let other = Arc::new(WqShadow::new(
        6,
        RingSize::new(16, 15).unwrap(),
        RingSize::new(4, 15).unwrap(),
    ));
    r.ring.qps.registry.add(&other);
    assert!(r.ring_poll().is_empty());
    r.ring.qps.registry.remove(&other);
    assert!(r.ring_poll().is_empty());
    r.post(4, 1);
    r.cqe(CqeOpcode::Req, QPN, 4, |_| {});
    let got = r.ring_poll();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].unwrap().wr_id, 4);
    assert_eq!(r.dbr_ci(), 5);
}

/// A device writing nonsense: CQEs with any opcode, known and unknown QPNs, WQE counters
/// of outstanding WQEs, of their middles and of nothing, and random bodies, among WQEs
/// posted as room allows. The poller reports what it cannot trust and follows nothing
/// blindly: every completion names a WQE still outstanding, nothing completes twice, the
/// send ring's room never exceeds its size, and nothing panics. Fixed-seed xorshift.
#[test]
fn random_cqes_are_reported_or_taken_never_followed_blindly() {
    let mut r = rig();
    let mut rng = uhca_hw::rng::XorShift64::new(0xC0E5_EED5_1234_0001_u64);
    let mut next = move || rng.next();
    // Outstanding WQEs: (first send counter, wr_id), oldest first.
    let mut out: std::collections::VecDeque<(u32, u64)> = Default::default();
    let (mut counter, mut id) = (0u32, 0u64);
    let (mut taken, mut refused) = (0, 0);
    for round in 0..5000 {
        while out.len() < 8 && r.sq.room(&r.sh) >= 2 {
            let sges = 1 + (next() % 6) as usize; // 1 or 2 basic blocks
            r.post(id, sges);
            out.push_back((counter, id));
            counter += if sges > 2 { 2 } else { 1 };
            id += 1;
        }
        for _ in 0..1 + next() % 4 {
            let opcode = if next() % 2 == 0 {
                CqeOpcode::Req
            } else {
                CqeOpcode::from((next() % 16) as u8)
            };
            let qpn = match next() % 8 {
                0 => 99,
                1 => next() as u32 & 0xFF_FFFF,
                _ => QPN,
            };
            let wqe_counter = match next() % 4 {
                0 => next() as u16,
                1 => out.back().map_or(0, |&(c, _)| c as u16 + 1), // past the last
                _ => out
                    .get((next() % out.len().max(1) as u64) as usize)
                    .map_or(0, |&(c, _)| c as u16),
            };
            let noise: Vec<u8> = (0..OP_OWN_OFFSET).map(|_| next() as u8).collect();
            let keep = next() % 2 == 0; // else the body is noise too
            r.cqe(opcode, qpn, wqe_counter, |e| {
                if !keep {
                    e[..0x30].copy_from_slice(&noise[..0x30]);
                }
            });
        }
        for c in r.ring_poll() {
            match c {
                Ok(c) => {
                    let at = out
                        .iter()
                        .position(|&(_, w)| w == c.wr_id)
                        .unwrap_or_else(|| panic!("round {round}: {c:?} names no outstanding WQE"));
                    // It and the unsignaled-in-effect WQEs before it are done.
                    out.drain(..=at);
                    taken += 1;
                }
                Err(_) => refused += 1,
            }
        }
        assert!(
            r.sq.room(&r.sh) <= 16,
            "round {round}: room past the ring's size"
        );
    }
    assert!(
        taken > 500 && refused > 500,
        "{taken} taken, {refused} refused"
    );
}

/// Statuses print as libibverbs' `ibv_wc_status_str` words, not Rust Debug text.
#[test]
fn statuses_read_as_ibv_wc_status_str() {
    let err = |syndrome, vendor_err| WcStatus::Error {
        syndrome,
        vendor_err,
    };
    assert_eq!(WcStatus::Success.to_string(), "success");
    assert_eq!(
        err(CqeSyndrome::TransportRetryExc, 0).to_string(),
        "transport retry counter exceeded"
    );
    assert_eq!(
        err(CqeSyndrome::WrFlush, 0x81).to_string(),
        "Work Request Flushed Error (vendor error 0x81)"
    );
    assert_eq!(
        err(CqeSyndrome::Unknown(0x33), 0).to_string(),
        "general error (syndrome 0x33)"
    );
}

#[test]
fn datagram_receives_tell_their_sender_and_connected_ones_do_not() {
    use crate::datapath::shadow::WqKind;
    use crate::datapath::sq::{RecvRing, RqMem};
    use uhca_layout::uar::QP_DBR_RCV;
    let f = ModelFunction::with_defaults().unwrap();
    let space = DmaSpace::new(f);
    let rq_size = RingSize::new(4, 15).unwrap();
    let one = RingSize::new(1, 15).unwrap();
    let reg = Arc::new(QpRegistry::default());
    let kinds = [(5, WqKind::Ud), (6, WqKind::Gsi), (7, WqKind::Connected)];
    let mut rings = Vec::new();
    for (qpn, kind) in kinds {
        let sh = Arc::new(WqShadow::new(qpn, one, rq_size).with_kind(kind));
        reg.add(&sh);
        let buf = Arc::new(space.alloc(4096).unwrap());
        let mem = RqMem::new(buf.clone(), 0, rq_size.log()).unwrap();
        let dbr = crate::datapath::sq::tests::record(&buf, 1024 + QP_DBR_RCV);
        let mut rq = RecvRing::new(mem, dbr, rq_size, 4);
        rq.post(&sh, 100 + u64::from(qpn), &[Sge::default()])
            .unwrap();
        rings.push((sh, rq));
    }
    let mut ring = CqRing::new(Arc::new(space.alloc(4096).unwrap()), rq_size, 256, reg).unwrap();
    ring.refresh();
    // flags_rqpn: g = 1 ([29:28]), RoCE header type IPv4 (2, [25:24]), source QP 0x123456.
    let sender = |e: &mut [u8]| {
        e[0x18..0x1c].copy_from_slice(&(1u32 << 28 | 2 << 24 | 0x12_3456).to_be_bytes());
        e[0x24..0x28].copy_from_slice(&0xFFFFu32.to_be_bytes());
        e[0x2c..0x30].copy_from_slice(&(40u32 + 256).to_be_bytes());
    };
    let region = ring.region().clone();
    write_cqe(&region, 0, CqeOpcode::RespSend, 5, 0, sender);
    write_cqe(&region, 1, CqeOpcode::RespSend, 6, 0, sender);
    write_cqe(&region, 2, CqeOpcode::RespSend, 7, 0, sender);
    let got: Vec<Completion> = Poll::new(&mut ring).map(|c| c.unwrap()).collect();
    assert_eq!(got.len(), 3);
    let ud = got[0].datagram.expect("UD: the sender");
    assert_eq!(
        (ud.src_qp, ud.grh, ud.net, ud.pkey),
        (0x12_3456, true, NetHeader::Ipv4, None)
    );
    assert_eq!(
        (got[0].wr_id, got[0].byte_len, got[0].imm),
        (105, 296, None)
    );
    let gsi = got[1].datagram.expect("GSI: the sender");
    assert_eq!(gsi.pkey, Some(0xFFFF), "the GSI QP's CQE carries the P_Key");
    assert_eq!(
        got[2].datagram, None,
        "a connected QP's receive has no datagram"
    );
    // With immediate data, the word is the immediate, not a P_Key; an error has no sender.
    for (k, id) in [(1, 7), (0, 8)] {
        let (sh, rq) = &mut rings[k];
        rq.post(sh, id, &[Sge::default()]).unwrap();
    }
    write_cqe(&region, 3, CqeOpcode::RespSendImm, 6, 1, sender);
    write_cqe(&region, 4, CqeOpcode::RespErr, 5, 1, |e| {
        e[0x37] = u8::from(CqeSyndrome::LocalLength);
    });
    let got: Vec<Completion> = Poll::new(&mut ring).map(|c| c.unwrap()).collect();
    assert_eq!(got[0].imm, Some(0xFFFF));
    assert_eq!(got[0].datagram.unwrap().pkey, None);
    assert!(!got[1].status.is_ok());
    assert_eq!(got[1].datagram, None);
}

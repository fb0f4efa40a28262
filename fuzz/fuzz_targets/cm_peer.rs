//! The RDMA CM against a hostile peer: any MAD bytes, plausible CM messages naming our
//! live connections, time passing, and the application accepting, rejecting, connecting
//! and disconnecting, over the in-memory MAD transport with its virtual clock
//! (`uhca::cm`; docs/spec/rdma-cm.md).
//!
//! Input records until the input ends:
//! - `0 blob`: raw bytes as a received MAD (at most 256);
//! - `1 kind u8, pick u8, local u32, qpn u32, psn u32, x u8, port u16, tid u64`: a CM
//!   message (`kind % 7`: REQ, MRA, REJ, REP, RTU, DREQ, DREP) whose remote communication
//!   ID is our connection `pick` (or `local` when `pick` is past them), with transaction
//!   ID `tid`;
//! - `2 ms u16`: the virtual clock moves on;
//! - `3 i u8`: the application answers pending request `i` (accept if even, else reject);
//! - `4 i u8`: the application disconnects connection `i`;
//! - `5`: the application starts a connection to the peer.
//!
//! Invariants: a MAD that parses as a CM message emits back to bytes that parse the same
//! (the pretty-printer round trip); no request is reported twice; every connected QP is
//! connected once; the CM keeps no more connections than were asked for.
#![no_main]

use std::collections::HashSet;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use uhca::cm::{
    AcceptOptions, Cm, CmConfig, CmEvent, ConnId, ConnectOptions, ConnectRequest, FakeQp, MadAddr,
    MemTransport, UNRESOLVED_MAC,
};
use uhca_fuzz::Reader;
use uhca_hw::layout::cm::{
    CmMessage, CmaHdrRepr, CommIds, DrepRepr, DreqRepr, MraRepr, RDMA_PS_TCP, RejReason, RejRepr,
    RepRepr, ReqRepr, RtuRepr, ip_service_id,
};
use uhca_hw::layout::mad::MAD_SIZE;

struct State {
    cm: Cm<MemTransport>,
    wire: MemTransport,
    peer: MadAddr,
    pending: Vec<ConnectRequest>,
    conns: Vec<ConnId>,
    requests_seen: HashSet<ConnId>,
    asked: usize,
    next_qpn: u32,
}

impl State {
    fn message(&self, r: &mut Reader<'_>) -> CmMessage {
        let (kind, pick) = (r.u8(), r.u8());
        let (local, qpn, psn, x, port) = (r.u32(), r.u32(), r.u32(), r.u8(), r.u16());
        let ours = self.conns.get(pick as usize).map_or(local, |c| c.0);
        let ids = CommIds {
            local_comm_id: local,
            remote_comm_id: ours,
        };
        match kind % 7 {
            0 => CmMessage::Req(ReqRepr {
                local_comm_id: local,
                service_id: ip_service_id(RDMA_PS_TCP, port % 4),
                local_ca_guid: u64::from(x),
                local_qpn: qpn & 0xff_ffff,
                starting_psn: psn & 0xff_ffff,
                path_mtu: x % 7,
                transport_service_type: (x >> 4) % 2,
                responder_resources: x,
                initiator_depth: x.rotate_left(3),
                max_cm_retries: x & 0xf,
                private_data: CmaHdrRepr {
                    src: "10.0.0.1:1".parse().expect("address"),
                    dst: "10.0.0.2".parse().expect("address"),
                }
                .emit()
                .map(|h| h.to_vec())
                .unwrap_or_default()
                .into_iter()
                .map(|b| if x == 0xff { b ^ 1 } else { b })
                .collect(),
                ..ReqRepr::default()
            }),
            1 => CmMessage::Mra(MraRepr {
                local_comm_id: local,
                remote_comm_id: ours,
                message_mraed: x % 4,
                service_timeout: x & 0x1f,
                private_data: Vec::new(),
            }),
            2 => CmMessage::Rej(RejRepr {
                local_comm_id: local,
                remote_comm_id: ours,
                message_rejected: x % 4,
                reason: RejReason::from(u16::from(x)),
                ..RejRepr::default()
            }),
            3 => CmMessage::Rep(RepRepr {
                local_comm_id: local,
                remote_comm_id: ours,
                local_qpn: qpn & 0xff_ffff,
                starting_psn: psn & 0xff_ffff,
                responder_resources: x,
                rnr_retry_count: x & 7,
                ..RepRepr::default()
            }),
            4 => CmMessage::Rtu(RtuRepr {
                ids,
                private_data: Vec::new(),
            }),
            5 => CmMessage::Dreq(DreqRepr {
                ids,
                remote_qpn_eecn: qpn & 0xff_ffff,
                private_data: Vec::new(),
            }),
            _ => CmMessage::Drep(DrepRepr {
                ids,
                private_data: Vec::new(),
            }),
        }
    }

    fn qp(&mut self) -> FakeQp {
        self.next_qpn += 1;
        FakeQp::new(self.next_qpn)
    }

    fn drain(&mut self) {
        while let Ok(Some(ev)) = self.cm.poll() {
            match ev {
                CmEvent::Request(r) => {
                    assert!(self.requests_seen.insert(r.id), "request {:?} twice", r.id);
                    self.asked += 1;
                    self.pending.push(r);
                }
                CmEvent::Reply(id) => {
                    let mut qp = self.qp();
                    if self.cm.finish_connect(id, &mut qp).is_ok() {
                        assert_eq!(qp.connects, 1);
                    }
                }
                _ => {}
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (ta, tb) = MemTransport::pair("10.0.0.2".parse().unwrap(), "10.0.0.1".parse().unwrap());
    let mut cfg = CmConfig::with_seed(1);
    cfg.max_cm_retries = 3;
    let mut cm = Cm::new(ta.clone(), cfg);
    cm.listen(1).unwrap();
    cm.listen(2).unwrap();
    let peer = MadAddr::gsi(
        uhca::cm::transport::ip_gid("10.0.0.1".parse().unwrap()),
        UNRESOLVED_MAC,
    );
    // What the CM sends is never read: the peer is the input.
    drop(tb);
    let mut s = State {
        cm,
        wire: ta,
        peer,
        pending: Vec::new(),
        conns: Vec::new(),
        requests_seen: HashSet::new(),
        asked: 0,
        next_qpn: 0x100,
    };
    let mut r = Reader::new(data);
    while !r.done() {
        match r.u8() % 6 {
            0 => {
                let b = r.blob(MAD_SIZE);
                if let Ok((hdr, msg)) = CmMessage::parse(b) {
                    let again = msg.emit(hdr.transaction_id).expect("parsed messages fit");
                    assert_eq!(CmMessage::parse(&again).expect("re-parses").1, msg);
                }
                s.wire.inject(s.peer, b);
            }
            1 => {
                let m = s.message(&mut r);
                if let Ok(mad) = m.emit(r.u64()) {
                    s.wire.inject(s.peer, &mad);
                }
            }
            2 => s
                .wire
                .advance(Duration::from_millis(u64::from(r.u16()) * 16)),
            3 => {
                let i = r.u8();
                if !s.pending.is_empty() {
                    let req = s.pending.remove(i as usize % s.pending.len());
                    if i.is_multiple_of(2) {
                        let mut qp = s.qp();
                        if s.cm
                            .accept(&req, &mut qp, &AcceptOptions::default())
                            .is_ok()
                        {
                            assert_eq!(qp.connects, 1);
                            s.conns.push(req.id);
                        }
                    } else {
                        let _ = s.cm.reject(&req, b"no");
                    }
                }
            }
            4 => {
                let i = r.u8() as usize;
                if let Some(&id) = s.conns.get(i % s.conns.len().max(1)) {
                    let mut qp = s.qp();
                    let _ = s.cm.disconnect(id, &mut qp);
                }
            }
            _ => {
                let qp = s.qp();
                if let Ok(id) = s.cm.start_connect(
                    &qp,
                    "10.0.0.1:2".parse().unwrap(),
                    &ConnectOptions::default(),
                ) {
                    s.asked += 1;
                    s.conns.push(id);
                }
            }
        }
        s.drain();
        assert!(
            s.cm.connections() <= s.asked,
            "{} > {}",
            s.cm.connections(),
            s.asked
        );
    }
});

//! The CM's state: connections by communication ID, listeners, and what each received
//! message does to them (IBA Vol. 1 §12.9 state machine, the RC subset rdma_cm uses;
//! docs/spec/rdma-cm.md §6). The calls that start things are in `api.rs`.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use uhca_layout::cm::{
    CmMessage, CmaHdrRepr, CommIds, DrepRepr, IP_PS_MASK, MraRepr, RDMA_PS_TCP, RejReason, RejRepr,
    RepRepr, ReqRepr, ip_service_id, msg_code,
};
use uhca_layout::mad::{MAD_SIZE, Method, MgmtClass};

use super::mad::{MadEvent, MadLayer, TrackId};
use super::transport::{MadAddr, MadTransport};
use super::{CmConfig, CmError, CmEvent, ConnId, ConnectRequest, iba_time};

/// Where a connection stands (IBA Vol. 1 §12.9.6 states, those of RC over rdma_cm).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Active: REQ sent, waiting for REP (or MRA, REJ).
    ReqSent,
    /// Active: REP received, [`Cm::finish_connect`] not called yet.
    RepRcvd(Box<RepRepr>),
    /// Passive: REQ received, the application has not answered.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Disconnected (DREQ/DREP done); kept to answer resent DREQs.
    TimeWait,
    /// Rejected or timed out; kept to drop late messages.
    Failed,
}

impl State {
    pub(super) fn name(&self) -> &'static str {
        match self {
            State::ReqSent => "REQ sent",
            State::RepRcvd(_) => "REP received",
            State::ReqRcvd => "REQ received",
            State::RepSent => "REP sent",
            State::Established => "established",
            State::DreqSent => "DREQ sent",
            State::TimeWait => "disconnected",
            State::Failed => "failed",
        }
    }
}

/// One connection.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) state: State,
    pub(super) remote_id: u32,
    pub(super) remote_guid: u64,
    /// The transaction ID of REQ, REP, RTU and REJ (the REQ's).
    pub(super) tid: u64,
    /// Our DREQ's, or the peer's DREQ's (echoed in the DREP).
    pub(super) dreq_tid: u64,
    pub(super) peer: MadAddr,
    pub(super) local_qpn: u32,
    /// The starting PSN we sent (REQ or REP): the first PSN we expect from the peer.
    pub(super) local_psn: u32,
    pub(super) remote_qpn: u32,
    /// The REQ (sent or received).
    pub(super) req: Box<ReqRepr>,
    /// The resend timer of our REQ, REP or DREQ.
    pub(super) track: Option<TrackId>,
    /// The last REP, RTU or DREP we sent, for a resent REQ, REP or DREQ.
    pub(super) last: Option<Box<[u8; MAD_SIZE]>>,
    /// Whether the application was told the connection ended.
    pub(super) told_end: bool,
    /// When it was first seen over (time wait or failed), for forgetting it later.
    pub(super) ended: Option<Duration>,
}

/// Counters of a [`Cm`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// CM MADs that did not parse (wrong attribute, class version, method) and were dropped.
    pub malformed: u64,
    /// Messages for no connection we know, or not allowed in its state, dropped.
    pub stray: u64,
    /// REQs rejected: nobody listens on the service (reason 8).
    pub rejected_no_listener: u64,
    /// REQs rejected for their content (transport type, cma header, MTU).
    pub rejected_invalid: u64,
    /// Resent REQs answered with our REP again, or an MRA.
    pub duplicate_reqs: u64,
    /// Connections that timed out.
    pub timeouts: u64,
}

/// The connection manager on one port (see the module docs).
pub struct Cm<T: MadTransport> {
    pub(super) mad: MadLayer<T>,
    pub(super) cfg: CmConfig,
    pub(super) conns: HashMap<u32, Conn>,
    /// (peer's comm ID, peer's CA GUID) → our comm ID, to spot resent REQs.
    pub(super) by_remote: HashMap<(u32, u64), u32>,
    pub(super) listeners: Vec<u16>,
    /// Events found while a blocking call waited for its own.
    pub(super) events: VecDeque<CmEvent>,
    pub(super) rng: u64,
    pub(super) counters: CmCounters,
}

impl<T: MadTransport> std::fmt::Debug for Cm<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cm")
            .field("conns", &self.conns.len())
            .field("listeners", &self.listeners)
            .field("counters", &self.counters)
            .finish()
    }
}

impl<T: MadTransport> Cm<T> {
    /// A CM over `transport`.
    pub fn new(transport: T, cfg: CmConfig) -> Self {
        let mut rng = cfg.seed ^ 0x9e37_79b9_7f4a_7c15;
        let tid_seed = splitmix(&mut rng);
        let mut mad = MadLayer::new(transport, tid_seed);
        // The CM's messages are all Send (IBA §12.6.2); a ClassPortInfo Get is answered
        // "unsupported", as Linux's CM (which registers for Send only) has it answered.
        mad.serve(
            MgmtClass::Cm,
            uhca_layout::cm::CM_CLASS_VERSION,
            &[Method::Send],
        );
        Cm {
            mad,
            cfg,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            listeners: Vec::new(),
            events: VecDeque::new(),
            rng,
            counters: CmCounters::default(),
        }
    }

    /// The CM's counters.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// The MAD layer's counters.
    pub fn mad_counters(&self) -> super::mad::MadCounters {
        self.mad.counters()
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        self.mad.transport()
    }

    /// Our CA GUID: the configured one, or the EUI-64 of the port's MAC.
    pub(super) fn ca_guid(&self) -> u64 {
        if self.cfg.ca_guid != 0 {
            return self.cfg.ca_guid;
        }
        let m = self.mad.transport().local().mac;
        u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
    }

    /// A fresh, unused, non-zero communication ID.
    pub(super) fn new_comm_id(&mut self) -> u32 {
        loop {
            let id = splitmix(&mut self.rng) as u32;
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// A random 24-bit starting PSN.
    pub(super) fn new_psn(&mut self) -> u32 {
        splitmix(&mut self.rng) as u32 & 0xff_ffff
    }

    /// How long to wait for the answer to a REQ, REP or DREQ (Linux `cm_send_req`):
    /// twice the packet lifetime plus the peer's response time.
    pub(super) fn response_wait(&self, peer_response_timeout: u8) -> Duration {
        2 * iba_time(self.cfg.packet_life_time) + iba_time(peer_response_timeout)
    }

    /// Sends `msg` once with transaction `tid`.
    pub(super) fn send_msg(
        &mut self,
        to: &MadAddr,
        msg: &CmMessage,
        tid: u64,
    ) -> Result<Box<[u8; MAD_SIZE]>, CmError> {
        let mad = Box::new(msg.emit(tid)?);
        self.mad.send(to, &mad)?;
        Ok(mad)
    }

    /// The next event: one a blocking call put aside, or the next from the wire.
    pub fn poll(&mut self) -> Result<Option<CmEvent>, CmError> {
        if let Some(ev) = self.events.pop_front() {
            return Ok(Some(ev));
        }
        self.poll_wire()
    }

    /// Forgets connections that have been over (time wait, failed) for twice the time a
    /// peer waits for an answer: their late messages are answered or dropped by then
    /// (a DREQ for a forgotten connection still gets its DREP), and a long-running CM does
    /// not grow without bound.
    fn reap(&mut self) {
        let now = self.mad.now();
        let linger = 2 * self.response_wait(self.cfg.response_timeout);
        let mut gone = Vec::new();
        for (&id, c) in self.conns.iter_mut() {
            if !matches!(c.state, State::TimeWait | State::Failed) {
                continue;
            }
            match c.ended {
                None => c.ended = Some(now),
                Some(t) if now.saturating_sub(t) > linger => gone.push(id),
                Some(_) => {}
            }
        }
        for id in gone {
            if let Some(c) = self.conns.remove(&id) {
                if let Some(t) = c.track {
                    self.mad.complete(t);
                }
                let key = (c.remote_id, c.remote_guid);
                if self.by_remote.get(&key) == Some(&id) {
                    self.by_remote.remove(&key);
                }
            }
        }
    }

    /// How many connections the CM keeps (live, or over but not yet forgotten).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Runs timers and received MADs until one makes an event.
    pub(super) fn poll_wire(&mut self) -> Result<Option<CmEvent>, CmError> {
        self.reap();
        while let Some(ev) = self.mad.poll()? {
            let out = match ev {
                MadEvent::TimedOut { id, .. } => self.timed_out(id)?,
                MadEvent::Received { hdr, mad } => {
                    if hdr.is_response() || hdr.method_kind() != Method::Send {
                        self.counters.malformed += 1;
                        continue;
                    }
                    match CmMessage::parse(&mad.data[..]) {
                        Ok((_, msg)) => self.handle(hdr.transaction_id, mad.from, msg)?,
                        Err(_) => {
                            self.counters.malformed += 1;
                            None
                        }
                    }
                }
                // We track no Get/Set.
                MadEvent::Response { .. } => None,
            };
            if out.is_some() {
                return Ok(out);
            }
        }
        Ok(None)
    }

    fn timed_out(&mut self, track: TrackId) -> Result<Option<CmEvent>, CmError> {
        let Some((&id, _)) = self.conns.iter().find(|(_, c)| c.track == Some(track)) else {
            return Ok(None);
        };
        let c = self.conns.get_mut(&id).expect("found above");
        c.track = None;
        match c.state {
            State::ReqSent | State::RepSent => {
                // Give up with a REJ as Linux's `cm_destroy_id` does: after a REQ, reason
                // timeout with our CA GUID as the additional information; after a REP,
                // consumer reject; "message rejected" is neither (`cm_format_rej`).
                let req_sent = c.state == State::ReqSent;
                c.state = State::Failed;
                let (peer, tid, remote_id) = (c.peer, c.tid, c.remote_id);
                let mut r = rej(id, remote_id, msg_code::OTHER, RejReason::ConsumerReject);
                if req_sent {
                    r.reason = RejReason::Timeout;
                    r.rejected_info_length = 8;
                    r.ari[..8].copy_from_slice(&self.ca_guid().to_be_bytes());
                }
                self.counters.timeouts += 1;
                self.send_msg(&peer, &CmMessage::Rej(r), tid)?;
                Ok(Some(CmEvent::TimedOut(ConnId(id))))
            }
            State::DreqSent => {
                c.state = State::TimeWait;
                c.told_end = true;
                Ok(Some(CmEvent::Disconnected(ConnId(id))))
            }
            _ => Ok(None),
        }
    }

    fn handle(
        &mut self,
        tid: u64,
        from: MadAddr,
        msg: CmMessage,
    ) -> Result<Option<CmEvent>, CmError> {
        match msg {
            CmMessage::Req(r) => self.on_req(tid, from, r),
            CmMessage::Mra(m) => Ok(self.on_mra(m)),
            CmMessage::Rej(r) => Ok(self.on_rej(r)),
            CmMessage::Rep(r) => self.on_rep(r),
            CmMessage::Rtu(r) => Ok(self.on_rtu(r.ids)),
            CmMessage::Dreq(d) => self.on_dreq(tid, from, d.ids, d.remote_qpn_eecn),
            CmMessage::Drep(d) => Ok(self.on_drep(d.ids)),
        }
    }

    fn on_req(
        &mut self,
        tid: u64,
        from: MadAddr,
        req: ReqRepr,
    ) -> Result<Option<CmEvent>, CmError> {
        let key = (req.local_comm_id, req.local_ca_guid);
        if let Some(&id) = self.by_remote.get(&key) {
            return self.duplicate_req(id, from, tid);
        }
        let reject = |cm: &mut Self, reason| -> Result<Option<CmEvent>, CmError> {
            let r = rej(0, req.local_comm_id, msg_code::REQ, reason);
            cm.send_msg(&from, &CmMessage::Rej(r), tid)?;
            Ok(None)
        };
        let port = req.service_id as u16;
        if req.service_id & IP_PS_MASK != ip_service_id(RDMA_PS_TCP, 0)
            || !self.listeners.contains(&port)
        {
            self.counters.rejected_no_listener += 1;
            return reject(self, RejReason::InvalidServiceId);
        }
        if req.transport_service_type != 0 || req.extended_transport_type != 0 {
            self.counters.rejected_invalid += 1;
            return reject(self, RejReason::InvalidTransportType);
        }
        if !(1..=5).contains(&req.path_mtu) {
            self.counters.rejected_invalid += 1;
            return reject(self, RejReason::InvalidMtu);
        }
        let Some(cma) = CmaHdrRepr::parse(&req.private_data) else {
            // What Linux's rdma_cm does with a REQ it cannot take: the listener's handler
            // fails and the CM rejects as the consumer.
            self.counters.rejected_invalid += 1;
            return reject(self, RejReason::ConsumerReject);
        };
        let id = self.new_comm_id();
        let local_psn = self.new_psn();
        let request = ConnectRequest {
            id: ConnId(id),
            port,
            src: cma.src,
            dst: cma.dst,
            remote_qpn: req.local_qpn,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            private_data: req.private_data[uhca_layout::cm::CMA_HDR_SIZE..].to_vec(),
        };
        let peer = MadAddr {
            gid: req.primary.local_gid,
            ..from
        };
        self.by_remote.insert(key, id);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                remote_id: req.local_comm_id,
                remote_guid: req.local_ca_guid,
                tid,
                dreq_tid: 0,
                peer,
                local_qpn: 0,
                local_psn,
                remote_qpn: req.local_qpn,
                req: Box::new(req),
                track: None,
                last: None,
                told_end: false,
                ended: None,
            },
        );
        Ok(Some(CmEvent::Request(request)))
    }

    /// A REQ for a connection we have (its REP or REJ was lost, or we are slow): IBA
    /// §12.9.8.1; docs/spec/rdma-cm.md §6. Never a second connection.
    fn duplicate_req(
        &mut self,
        id: u32,
        from: MadAddr,
        tid: u64,
    ) -> Result<Option<CmEvent>, CmError> {
        self.counters.duplicate_reqs += 1;
        let c = &self.conns[&id];
        match c.state {
            State::ReqRcvd => {
                let mra = MraRepr {
                    local_comm_id: id,
                    remote_comm_id: c.remote_id,
                    message_mraed: msg_code::REQ as u8,
                    service_timeout: self.cfg.mra_timeout,
                    private_data: Vec::new(),
                };
                self.send_msg(&from, &CmMessage::Mra(mra), tid)?;
            }
            State::RepSent => {
                if let Some(rep) = c.last.clone() {
                    self.mad.send(&from, &rep)?;
                }
            }
            _ => {}
        }
        Ok(None)
    }

    fn on_mra(&mut self, m: MraRepr) -> Option<CmEvent> {
        let wait = self.response_wait(m.service_timeout);
        let Some(c) = conn_for(&mut self.conns, m.remote_comm_id, m.local_comm_id) else {
            self.counters.stray += 1;
            return None;
        };
        let ok = matches!(
            (&c.state, u32::from(m.message_mraed)),
            (State::ReqSent, msg_code::REQ) | (State::RepSent, msg_code::REP)
        );
        match (ok, c.track) {
            (true, Some(t)) => {
                self.mad.extend(t, wait);
            }
            _ => self.counters.stray += 1,
        }
        None
    }

    fn on_rej(&mut self, r: RejRepr) -> Option<CmEvent> {
        let Some(c) = conn_for(&mut self.conns, r.remote_comm_id, r.local_comm_id) else {
            self.counters.stray += 1;
            return None;
        };
        if !matches!(c.state, State::ReqSent | State::RepRcvd(_) | State::RepSent) {
            self.counters.stray += 1;
            return None;
        }
        c.state = State::Failed;
        c.told_end = true;
        if let Some(t) = c.track.take() {
            self.mad.complete(t);
        }
        Some(CmEvent::Rejected {
            id: ConnId(r.remote_comm_id),
            reason: r.reason,
            private_data: r.private_data,
        })
    }

    fn on_rep(&mut self, r: RepRepr) -> Result<Option<CmEvent>, CmError> {
        let Some(c) = conn_for(&mut self.conns, r.remote_comm_id, r.local_comm_id) else {
            self.counters.stray += 1;
            return Ok(None);
        };
        match c.state {
            State::ReqSent => {
                c.remote_id = r.local_comm_id;
                c.remote_guid = r.local_ca_guid;
                c.remote_qpn = r.local_qpn;
                c.state = State::RepRcvd(Box::new(r.clone()));
                if let Some(t) = c.track.take() {
                    self.mad.complete(t);
                }
                Ok(Some(CmEvent::Reply(ConnId(r.remote_comm_id))))
            }
            // Our RTU was lost: send it again (IBA §12.9.8.3).
            State::Established | State::DreqSent => {
                let (peer, last) = (c.peer, c.last.clone());
                if let Some(rtu) = last {
                    self.mad.send(&peer, &rtu)?;
                }
                Ok(None)
            }
            _ => {
                self.counters.stray += 1;
                Ok(None)
            }
        }
    }

    fn on_rtu(&mut self, ids: CommIds) -> Option<CmEvent> {
        let Some(c) = conn_for(&mut self.conns, ids.remote_comm_id, ids.local_comm_id) else {
            self.counters.stray += 1;
            return None;
        };
        if c.state != State::RepSent {
            self.counters.stray += 1;
            return None;
        }
        c.state = State::Established;
        if let Some(t) = c.track.take() {
            self.mad.complete(t);
        }
        Some(CmEvent::Established(ConnId(ids.remote_comm_id)))
    }

    fn on_dreq(
        &mut self,
        tid: u64,
        from: MadAddr,
        ids: CommIds,
        qpn: u32,
    ) -> Result<Option<CmEvent>, CmError> {
        let drep = |ids: &CommIds| {
            CmMessage::Drep(DrepRepr {
                ids: CommIds {
                    local_comm_id: ids.remote_comm_id,
                    remote_comm_id: ids.local_comm_id,
                },
                private_data: Vec::new(),
            })
        };
        let ours = ids.remote_comm_id;
        let known = self
            .conns
            .get(&ours)
            .is_some_and(|c| c.remote_id == ids.local_comm_id && c.local_qpn == qpn);
        if !known {
            // Linux answers a DREQ it cannot match with a DREP all the same
            // (`cm_dreq_handler` → `cm_issue_drep`), so the peer stops resending.
            self.counters.stray += 1;
            self.send_msg(&from, &drep(&ids), tid)?;
            return Ok(None);
        }
        let c = self.conns.get_mut(&ours).expect("checked above");
        let event = match c.state {
            State::Established | State::RepSent | State::DreqSent => {
                if let Some(t) = c.track.take() {
                    self.mad.complete(t);
                }
                // A DREQ after our REP means the peer took the REP (its RTU was lost):
                // the connection was established before it ended (IBA §12.9.8.4).
                let was_rep_sent = c.state == State::RepSent;
                c.state = State::TimeWait;
                c.dreq_tid = tid;
                let end = (!std::mem::replace(&mut c.told_end, true))
                    .then_some(CmEvent::Disconnected(ConnId(ours)));
                if was_rep_sent {
                    self.events.extend(end);
                    Some(CmEvent::Established(ConnId(ours)))
                } else {
                    end
                }
            }
            State::TimeWait => None,
            _ => {
                self.counters.stray += 1;
                return Ok(None);
            }
        };
        let peer = c.peer;
        let mad = self.send_msg(&peer, &drep(&ids), tid)?;
        if let Some(c) = self.conns.get_mut(&ours) {
            c.last = Some(mad);
        }
        Ok(event)
    }

    fn on_drep(&mut self, ids: CommIds) -> Option<CmEvent> {
        let Some(c) = conn_for(&mut self.conns, ids.remote_comm_id, ids.local_comm_id) else {
            self.counters.stray += 1;
            return None;
        };
        if c.state != State::DreqSent {
            self.counters.stray += 1;
            return None;
        }
        c.state = State::TimeWait;
        if let Some(t) = c.track.take() {
            self.mad.complete(t);
        }
        (!std::mem::replace(&mut c.told_end, true))
            .then_some(CmEvent::Disconnected(ConnId(ids.remote_comm_id)))
    }
}

/// The connection a message for our comm ID `ours` from the peer's `theirs` is about.
fn conn_for(conns: &mut HashMap<u32, Conn>, ours: u32, theirs: u32) -> Option<&mut Conn> {
    let c = conns.get_mut(&ours)?;
    // Before the REP, an active connection does not know the peer's ID yet.
    (c.remote_id == theirs || c.remote_id == 0).then_some(c)
}

/// A REJ from `ours` to `theirs`.
pub(super) fn rej(ours: u32, theirs: u32, msg: u32, reason: RejReason) -> RejRepr {
    RejRepr {
        local_comm_id: ours,
        remote_comm_id: theirs,
        message_rejected: msg as u8,
        reason,
        ..RejRepr::default()
    }
}

/// splitmix64: the next value of a small, seeded generator (IDs and PSNs need to differ
/// between connections and runs, not to be secret).
pub(super) fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

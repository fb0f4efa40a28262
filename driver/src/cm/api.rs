//! The calls of [`Cm`]: listen, connect (in steps or blocking), accept, reject and
//! disconnect; each builds its message the way Linux's rdma_cm does
//! (docs/spec/rdma-cm.md §4-6).

use std::net::SocketAddr;
use std::time::Duration;

use uhca_layout::cm::{
    CMA_HDR_SIZE, CmMessage, CmPath, CmaHdrRepr, CommIds, DreqRepr, RDMA_PS_TCP, RejReason,
    RepRepr, ReqRepr, RtuRepr, ip_service_id, msg_code, private_len,
};

use super::engine::{Conn, State, rej};
use super::transport::{MadAddr, MadTransport, gid_ip, ip_gid};
use super::{
    AcceptOptions, CmError, CmEvent, CmQp, ConnId, ConnectOptions, ConnectRequest, Connection,
    MAX_REQ_PRIVATE_DATA,
};
use crate::resource::{Access, ConnectParams, Mtu};

/// Longest single wait of the blocking calls between looks at the wire.
const WAIT_STEP: Duration = Duration::from_millis(50);

/// The RoCEv2 UDP source port of a flow label (Linux `rdma_flow_label_to_udp_sport`),
/// 0xC000 without one.
fn flow_label_sport(fl: u32) -> u16 {
    let (low, high) = (fl & 0x03fff, fl & 0xfc000);
    ((low ^ (high >> 14)) as u16) | 0xc000
}

impl<T: MadTransport> Cm<T> {
    /// Takes REQs for TCP port `port` (service ID `0x0000000001060000 | port`); REQs for
    /// ports nobody listens on are rejected with reason 8, invalid service ID.
    pub fn listen(&mut self, port: u16) -> Result<(), CmError> {
        if self.listeners.contains(&port) {
            return Err(CmError::AlreadyListening(port));
        }
        self.listeners.push(port);
        Ok(())
    }

    /// Stops taking REQs for `port` (connections made stay).
    pub fn unlisten(&mut self, port: u16) {
        self.listeners.retain(|&p| p != port);
    }

    /// Lets `d` pass on the transport's clock while the CM goes on answering the wire
    /// (resends, a peer's DREQ); the events met meanwhile stay for [`poll`](Self::poll).
    /// The pause between two tries of a connect that met a port nobody listened on yet.
    pub fn pause(&mut self, d: Duration) -> Result<(), CmError> {
        let end = self.mad.now() + d;
        loop {
            let now = self.mad.now();
            if now >= end {
                return Ok(());
            }
            match self.poll_wire()? {
                Some(ev) => self.events.push_back(ev),
                None => self.mad.wait((end - now).min(WAIT_STEP)),
            }
        }
    }

    /// Where connection `id` stands, if it exists.
    pub fn state(&self, id: ConnId) -> Option<&'static str> {
        self.conns.get(&id.0).map(|c| c.state.name())
    }

    fn conn(&mut self, id: ConnId) -> Result<&mut Conn, CmError> {
        self.conns
            .get_mut(&id.0)
            .ok_or(CmError::UnknownConnection(id))
    }

    fn wrong_state(id: ConnId, c: &Conn, want: &'static str) -> CmError {
        CmError::State {
            id,
            state: c.state.name(),
            want,
        }
    }

    /// Sends a REQ for `dst` (its IP and TCP port) from `qp` and returns at once; the REP
    /// comes as [`CmEvent::Reply`] from [`poll`](Self::poll), then call
    /// [`finish_connect`](Self::finish_connect). The REQ is resent until answered, up to
    /// `max_cm_retries` times ([`CmEvent::TimedOut`]).
    pub fn start_connect<Q: CmQp>(
        &mut self,
        qp: &Q,
        dst: SocketAddr,
        opts: &ConnectOptions<'_>,
    ) -> Result<ConnId, CmError> {
        if opts.private_data.len() > MAX_REQ_PRIVATE_DATA {
            return Err(CmError::PrivateData {
                max: MAX_REQ_PRIVATE_DATA,
                len: opts.private_data.len(),
            });
        }
        let local = self.mad.transport().local();
        let id = self.new_comm_id();
        let psn = self.new_psn();
        let src_port = if opts.src_port != 0 {
            opts.src_port
        } else {
            (id as u16) | 0x8000
        };
        let cma = CmaHdrRepr {
            src: SocketAddr::new(gid_ip(&local.gid), src_port),
            dst: dst.ip(),
        }
        .emit()
        .ok_or(CmError::AddressFamily)?;
        let mut private_data = cma.to_vec();
        private_data.extend_from_slice(opts.private_data);
        let req = ReqRepr {
            local_comm_id: id,
            service_id: ip_service_id(RDMA_PS_TCP, dst.port()),
            local_ca_guid: self.ca_guid(),
            local_qpn: qp.qpn(),
            responder_resources: opts.responder_resources,
            initiator_depth: opts.initiator_depth,
            remote_cm_response_timeout: self.cfg.response_timeout,
            starting_psn: psn,
            local_cm_response_timeout: self.cfg.response_timeout,
            retry_count: opts.retry_count & 7,
            partition_key: 0xffff,
            path_mtu: self.cfg.mtu as u8,
            rnr_retry_count: opts.rnr_retry_count & 7,
            max_cm_retries: self.cfg.max_cm_retries & 0xf,
            primary: CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: local.gid,
                remote_gid: ip_gid(dst.ip()),
                hop_limit: self.cfg.hop_limit,
                local_ack_timeout: self.cfg.local_ack_timeout,
                // Linux `cma_get_roce_udp_flow_label`: a hash of the two ports.
                flow_label: (u32::from(src_port) * 31 + u32::from(dst.port())) & 0xf_ffff,
                ..CmPath::default()
            },
            private_data,
            ..ReqRepr::default()
        };
        let peer = MadAddr::gsi(ip_gid(dst.ip()), opts.peer_mac);
        let tid = self.mad.next_tid();
        let mad = CmMessage::Req(req.clone()).emit(tid)?;
        let wait = self.response_wait(self.cfg.response_timeout);
        let track = self
            .mad
            .send_tracked(&peer, &mad, wait, u32::from(self.cfg.max_cm_retries))?;
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                remote_id: 0,
                remote_guid: 0,
                tid,
                dreq_tid: 0,
                peer,
                local_qpn: qp.qpn(),
                local_psn: psn,
                remote_qpn: 0,
                req: Box::new(req),
                track: Some(track),
                last: None,
                told_end: false,
                ended: None,
            },
        );
        Ok(ConnId(id))
    }

    /// After [`CmEvent::Reply`]: connects `qp` (RST→INIT→RTR→RTS) with the REP's QPN,
    /// starting PSN and resources, and sends the RTU.
    pub fn finish_connect<Q: CmQp>(
        &mut self,
        id: ConnId,
        qp: &mut Q,
    ) -> Result<Connection, CmError> {
        let cfg = self.cfg;
        let c = self.conn(id)?;
        let State::RepRcvd(rep) = &c.state else {
            return Err(Self::wrong_state(id, c, "REP received"));
        };
        let rep = rep.clone();
        let req = &c.req;
        let mut p = ConnectParams::new(rep.local_qpn, c.peer.gid, c.peer.mac);
        // A starting PSN is what its sender expects to receive: we send from the REP's
        // (Linux `cm_rep_handler`: sq_psn from the REP; docs/spec/rdma-cm.md §6).
        p.sq_psn = rep.starting_psn;
        p.rq_psn = c.local_psn;
        p.sgid_index = cfg.sgid_index;
        p.mtu = cfg.mtu;
        p.timeout = cfg.local_ack_timeout;
        p.retry_cnt = req.retry_count;
        p.rnr_retry = rep.rnr_retry_count;
        p.min_rnr_timer = cfg.min_rnr_timer;
        // As Linux's CM on the REP (`cm_rep_handler`): our reads in flight are what the
        // peer's responder takes, our responder takes what the peer will issue.
        p.max_rd_atomic = rep.responder_resources;
        p.max_dest_rd_atomic = rep.initiator_depth;
        p.access = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        p.hop_limit = cfg.hop_limit;
        p.udp_sport = flow_label_sport(req.primary.flow_label);
        let (peer, tid, remote_id) = (c.peer, c.tid, c.remote_id);
        if let Err(e) = qp.connect_qp(&p) {
            let r = rej(id.0, remote_id, msg_code::REP, RejReason::ConsumerReject);
            self.conn(id)?.state = State::Failed;
            self.send_msg(&peer, &CmMessage::Rej(r), tid)?;
            return Err(e.into());
        }
        let rtu = RtuRepr {
            ids: CommIds {
                local_comm_id: id.0,
                remote_comm_id: remote_id,
            },
            private_data: Vec::new(),
        };
        let mad = self.send_msg(&peer, &CmMessage::Rtu(rtu), tid)?;
        let c = self.conn(id)?;
        c.state = State::Established;
        c.last = Some(mad);
        Ok(Connection {
            id,
            local_qpn: qp.qpn(),
            remote_qpn: rep.local_qpn,
            peer: gid_ip(&peer.gid),
            params: p,
            private_data: rep.private_data,
        })
    }

    /// Connects `qp` to `dst`: REQ, then waits for the REP (resending the REQ; an MRA
    /// extends the wait), connects the QP and sends the RTU. Events for other connections
    /// met meanwhile stay for [`poll`](Self::poll).
    pub fn connect<Q: CmQp>(
        &mut self,
        qp: &mut Q,
        dst: SocketAddr,
        opts: &ConnectOptions<'_>,
    ) -> Result<Connection, CmError> {
        let id = self.start_connect(qp, dst, opts)?;
        loop {
            match self.poll_wire()? {
                Some(CmEvent::Reply(r)) if r == id => return self.finish_connect(id, qp),
                Some(CmEvent::Rejected {
                    id: r,
                    reason,
                    private_data,
                }) if r == id => {
                    return Err(CmError::Rejected {
                        reason,
                        private_data,
                    });
                }
                Some(CmEvent::TimedOut(r)) if r == id => return Err(CmError::Timeout),
                Some(other) => self.events.push_back(other),
                None => self.mad.wait(WAIT_STEP),
            }
        }
    }

    /// Accepts a request: connects `qp` (RST→INIT→RTR→RTS, as rdma_accept does) with the
    /// REQ's QPN, starting PSN, path and retry counts, and sends the REP; the RTU comes as
    /// [`CmEvent::Established`]. The REP is resent until then.
    pub fn accept<Q: CmQp>(
        &mut self,
        request: &ConnectRequest,
        qp: &mut Q,
        opts: &AcceptOptions<'_>,
    ) -> Result<Connection, CmError> {
        let id = request.id;
        if opts.private_data.len() > private_len::REP {
            return Err(CmError::PrivateData {
                max: private_len::REP,
                len: opts.private_data.len(),
            });
        }
        let cfg = self.cfg;
        let guid = self.ca_guid();
        let c = self.conn(id)?;
        if c.state != State::ReqRcvd {
            return Err(Self::wrong_state(id, c, "REQ received"));
        }
        let req = c.req.clone();
        let mtu = Mtu::from_ib(req.path_mtu.min(cfg.mtu as u8)).unwrap_or(Mtu::M256);
        let initiator_depth = opts.initiator_depth.min(req.responder_resources);
        let mut p = ConnectParams::new(req.local_qpn, req.primary.local_gid, c.peer.mac);
        // We send from the REQ's starting PSN and expect ours, sent in the REP (Linux
        // `cm_req_handler`: sq_psn from the REQ; docs/spec/rdma-cm.md §6).
        p.sq_psn = req.starting_psn;
        p.rq_psn = c.local_psn;
        p.sgid_index = cfg.sgid_index;
        p.mtu = mtu;
        p.timeout = req.primary.local_ack_timeout;
        p.retry_cnt = req.retry_count;
        p.rnr_retry = req.rnr_retry_count;
        p.min_rnr_timer = cfg.min_rnr_timer;
        p.max_rd_atomic = initiator_depth;
        p.max_dest_rd_atomic = opts.responder_resources;
        p.access = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        p.hop_limit = if req.primary.hop_limit == 0 {
            cfg.hop_limit
        } else {
            req.primary.hop_limit
        };
        p.udp_sport = flow_label_sport(req.primary.flow_label);
        let (peer, tid, remote_id) = (c.peer, c.tid, c.remote_id);
        if let Err(e) = qp.connect_qp(&p) {
            let r = rej(id.0, remote_id, msg_code::REQ, RejReason::NoQp);
            self.conn(id)?.state = State::Failed;
            self.send_msg(&peer, &CmMessage::Rej(r), tid)?;
            return Err(e.into());
        }
        let rep = RepRepr {
            local_comm_id: id.0,
            remote_comm_id: remote_id,
            local_qpn: qp.qpn(),
            starting_psn: p.rq_psn,
            responder_resources: opts.responder_resources,
            initiator_depth,
            target_ack_delay: cfg.packet_life_time.saturating_sub(1),
            rnr_retry_count: opts.rnr_retry_count & 7,
            local_ca_guid: guid,
            private_data: opts.private_data.to_vec(),
            ..RepRepr::default()
        };
        let mad = CmMessage::Rep(rep).emit(tid)?;
        let wait = self.response_wait(req.local_cm_response_timeout);
        let retries = u32::from(req.max_cm_retries);
        let track = self.mad.send_tracked(&peer, &mad, wait, retries)?;
        let c = self.conn(id)?;
        c.state = State::RepSent;
        c.local_qpn = qp.qpn();
        c.track = Some(track);
        c.last = Some(Box::new(mad));
        Ok(Connection {
            id,
            local_qpn: qp.qpn(),
            remote_qpn: req.local_qpn,
            peer: gid_ip(&peer.gid),
            params: p,
            private_data: request.private_data.clone(),
        })
    }

    /// Rejects a request (REJ, reason 28 "consumer reject", as rdma_reject does).
    pub fn reject(&mut self, request: &ConnectRequest, private_data: &[u8]) -> Result<(), CmError> {
        let id = request.id;
        if private_data.len() > private_len::REJ {
            return Err(CmError::PrivateData {
                max: private_len::REJ,
                len: private_data.len(),
            });
        }
        let c = self.conn(id)?;
        if c.state != State::ReqRcvd {
            return Err(Self::wrong_state(id, c, "REQ received"));
        }
        c.state = State::Failed;
        let (peer, tid, remote_id) = (c.peer, c.tid, c.remote_id);
        let mut r = rej(id.0, remote_id, msg_code::REQ, RejReason::ConsumerReject);
        r.private_data = private_data.to_vec();
        self.send_msg(&peer, &CmMessage::Rej(r), tid)?;
        Ok(())
    }

    /// Disconnects: moves `qp` to the error state and sends a DREQ (resent until the DREP
    /// comes, then [`CmEvent::Disconnected`]). On a connection the peer already ended, only
    /// moves the QP.
    pub fn disconnect<Q: CmQp>(&mut self, id: ConnId, qp: &mut Q) -> Result<(), CmError> {
        let c = self.conn(id)?;
        match c.state {
            State::Established | State::RepSent => {}
            State::TimeWait | State::Failed | State::DreqSent => {
                qp.disconnect_qp()?;
                return Ok(());
            }
            _ => return Err(Self::wrong_state(id, c, "established")),
        }
        if let Some(t) = c.track.take() {
            self.mad.complete(t);
        }
        qp.disconnect_qp()?;
        let tid = self.mad.next_tid();
        let c = self.conn(id)?;
        let (peer, remote_id, remote_qpn) = (c.peer, c.remote_id, c.remote_qpn);
        let timeout = c.req.remote_cm_response_timeout;
        let dreq = DreqRepr {
            ids: CommIds {
                local_comm_id: id.0,
                remote_comm_id: remote_id,
            },
            remote_qpn_eecn: remote_qpn,
            private_data: Vec::new(),
        };
        let mad = CmMessage::Dreq(dreq).emit(tid)?;
        let wait = self.response_wait(timeout);
        let track = self
            .mad
            .send_tracked(&peer, &mad, wait, u32::from(self.cfg.max_cm_retries))?;
        let c = self.conn(id)?;
        c.state = State::DreqSent;
        c.dreq_tid = tid;
        c.track = Some(track);
        Ok(())
    }

    /// Waits up to `timeout` (on the transport's clock) for an event that `want` takes;
    /// other events stay for [`poll`](Self::poll).
    fn wait_for<R>(
        &mut self,
        timeout: Duration,
        mut want: impl FnMut(&CmEvent) -> Option<Result<R, CmError>>,
    ) -> Result<R, CmError> {
        if let Some(pos) = self.events.iter().position(|e| want(e).is_some()) {
            let ev = self.events.remove(pos).expect("position is in range");
            return want(&ev).expect("matched above");
        }
        let end = self.mad.now() + timeout;
        loop {
            match self.poll_wire()? {
                Some(ev) => match want(&ev) {
                    Some(r) => return r,
                    None => self.events.push_back(ev),
                },
                None => {
                    let now = self.mad.now();
                    if now >= end {
                        return Err(CmError::Timeout);
                    }
                    self.mad.wait((end - now).min(WAIT_STEP));
                }
            }
        }
    }

    /// Waits up to `timeout` for the next REQ on a listened port.
    pub fn get_request(&mut self, timeout: Duration) -> Result<ConnectRequest, CmError> {
        self.wait_for(timeout, |e| match e {
            CmEvent::Request(r) => Some(Ok(r.clone())),
            _ => None,
        })
    }

    /// Waits up to `timeout` for the RTU of an accepted connection.
    pub fn wait_established(&mut self, id: ConnId, timeout: Duration) -> Result<(), CmError> {
        if self.conns.get(&id.0).map(|c| &c.state) == Some(&State::Established) {
            // Already seen by a poll; drop its queued event if any.
            self.events.retain(|e| *e != CmEvent::Established(id));
            return Ok(());
        }
        self.wait_for(timeout, |e| match e {
            CmEvent::Established(i) if *i == id => Some(Ok(())),
            CmEvent::TimedOut(i) if *i == id => Some(Err(CmError::Timeout)),
            CmEvent::Rejected {
                id: i,
                reason,
                private_data,
            } if *i == id => Some(Err(CmError::Rejected {
                reason: *reason,
                private_data: private_data.clone(),
            })),
            _ => None,
        })
    }

    /// Waits up to `timeout` for the end of a connection ([`CmEvent::Disconnected`]).
    pub fn wait_disconnected(&mut self, id: ConnId, timeout: Duration) -> Result<(), CmError> {
        if self.conns.get(&id.0).is_some_and(|c| c.told_end) {
            self.events.retain(|e| *e != CmEvent::Disconnected(id));
            return Ok(());
        }
        self.wait_for(timeout, |e| match e {
            CmEvent::Disconnected(i) if *i == id => Some(Ok(())),
            _ => None,
        })
    }
}

use super::Cm;

/// The CMA header bytes must fit the REQ with the user's data.
const _: () = assert!(CMA_HDR_SIZE + MAX_REQ_PRIVATE_DATA == private_len::REQ);

//! The MAD layer: whole MADs over a [`MadTransport`] (the GSI QP, or an in-memory pair),
//! with transaction IDs, timeouts and resends, and the GSI's answers for what nobody serves
//! (IBA Vol. 1 §13.4-13.5; docs/spec/rdma-cm.md §1).
//!
//! - [`MadLayer::send`] sends once; [`MadLayer::send_tracked`] sends and resends the same
//!   bytes every `timeout` until [`complete`](MadLayer::complete)d, up to `retries` times,
//!   then reports [`MadEvent::TimedOut`]. A tracked Get/Set completes by itself when the
//!   GetResp with its transaction ID arrives ([`MadEvent::Response`]); other MADs (the
//!   CM's, all method Send) are completed by the layer above, which knows what answers them.
//! - [`MadLayer::poll`] runs the timers and reads one received MAD: a MAD of a class,
//!   version and method [`serve`](MadLayer::serve)d is [`MadEvent::Received`]; a Get/Set of
//!   another class, class version or method is answered with a GetResp carrying status "method/attribute not
//!   supported" or "bad version", as Linux's MAD layer does; anything else unwanted, and
//!   every malformed MAD (short, wrong base version), is dropped and counted
//!   ([`MadCounters`]). Nothing a peer sends can panic or stop the layer.

use std::time::Duration;

use uhca_layout::mad::{MAD_SIZE, MadHeader, Method, MgmtClass, status};

use super::transport::{InMad, MadAddr, MadTransport, TransportError};

/// Identifies a tracked send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TrackId(u64);

/// What [`MadLayer::poll`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MadEvent {
    /// A well-formed MAD of a served class.
    Received {
        /// Its header.
        hdr: MadHeader,
        /// The MAD and its sender.
        mad: InMad,
    },
    /// The GetResp of a tracked Get/Set (the tracking is over).
    Response {
        /// The tracked send.
        id: TrackId,
        /// The response's header (its status).
        hdr: MadHeader,
        /// The response.
        mad: InMad,
    },
    /// A tracked send was resent `retries` times and never completed.
    TimedOut {
        /// The tracked send.
        id: TrackId,
        /// Its transaction ID.
        tid: u64,
        /// Its attribute ID.
        attribute_id: u16,
    },
}

/// Counters of a [`MadLayer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MadCounters {
    /// MADs sent (first sends and resends).
    pub sent: u64,
    /// Of those, resends of tracked MADs.
    pub resent: u64,
    /// Tracked sends that ran out of retries.
    pub timeouts: u64,
    /// MADs received and handed up (events `Received` and `Response`).
    pub received: u64,
    /// Malformed MADs dropped (shorter than 256 bytes, base version not 1).
    pub malformed: u64,
    /// Well-formed MADs nobody wanted, dropped (unserved class with a method that gets no
    /// answer, or a response matching no tracked request).
    pub unwanted: u64,
    /// Get/Set of an unserved class or version answered with an error status.
    pub answered_unsupported: u64,
}

struct Tracked {
    id: TrackId,
    to: MadAddr,
    mad: Box<[u8; MAD_SIZE]>,
    tid: u64,
    attribute_id: u16,
    timeout: Duration,
    deadline: Duration,
    retries_left: u32,
    /// A Get/Set: a GetResp with `tid` completes it.
    wants_resp: bool,
}

/// The MAD layer over one transport (see the module docs).
pub struct MadLayer<T: MadTransport> {
    t: T,
    /// (class, version, methods taken).
    served: Vec<(MgmtClass, u8, Vec<Method>)>,
    tracked: Vec<Tracked>,
    next_id: u64,
    tid_hi: u32,
    tid_lo: u32,
    counters: MadCounters,
}

impl<T: MadTransport> std::fmt::Debug for MadLayer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MadLayer")
            .field("served", &self.served)
            .field("tracked", &self.tracked.len())
            .field("counters", &self.counters)
            .finish()
    }
}

impl<T: MadTransport> MadLayer<T> {
    /// A layer over `t`; transaction IDs start at `tid_seed` (their high 32 bits stay, the
    /// low 32 count up).
    pub fn new(t: T, tid_seed: u64) -> Self {
        MadLayer {
            t,
            served: Vec::new(),
            tracked: Vec::new(),
            next_id: 1,
            tid_hi: (tid_seed >> 32) as u32,
            tid_lo: tid_seed as u32,
            counters: MadCounters::default(),
        }
    }

    /// Hands MADs of `class` at `version` with one of `methods` up as
    /// [`MadEvent::Received`] (a Get/Set of that class with another method is answered
    /// "unsupported", as Linux's MAD layer answers what no agent registered for).
    pub fn serve(&mut self, class: MgmtClass, version: u8, methods: &[Method]) {
        match self
            .served
            .iter_mut()
            .find(|(c, v, _)| (*c, *v) == (class, version))
        {
            Some((_, _, m)) => m.extend_from_slice(methods),
            None => self.served.push((class, version, methods.to_vec())),
        }
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.t
    }

    /// The transport, mutably.
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.t
    }

    /// The transport's clock.
    pub fn now(&self) -> Duration {
        self.t.now()
    }

    /// The counters.
    pub fn counters(&self) -> MadCounters {
        self.counters
    }

    /// A fresh transaction ID.
    pub fn next_tid(&mut self) -> u64 {
        self.tid_lo = self.tid_lo.wrapping_add(1);
        (u64::from(self.tid_hi) << 32) | u64::from(self.tid_lo)
    }

    /// Sends `mad` once.
    pub fn send(&mut self, to: &MadAddr, mad: &[u8; MAD_SIZE]) -> Result<(), TransportError> {
        self.t.send(to, mad)?;
        self.counters.sent += 1;
        Ok(())
    }

    /// Sends `mad` now and again every `timeout` until it is completed, at most `retries`
    /// more times; then [`MadEvent::TimedOut`].
    pub fn send_tracked(
        &mut self,
        to: &MadAddr,
        mad: &[u8; MAD_SIZE],
        timeout: Duration,
        retries: u32,
    ) -> Result<TrackId, TransportError> {
        self.send(to, mad)?;
        let hdr = MadHeader::parse(&mad[..]).ok();
        let id = TrackId(self.next_id);
        self.next_id += 1;
        let wants_resp = hdr.is_some_and(|h| {
            !h.is_response() && matches!(h.method_kind(), Method::Get | Method::Set)
        });
        self.tracked.push(Tracked {
            id,
            to: *to,
            mad: Box::new(*mad),
            tid: hdr.map_or(0, |h| h.transaction_id),
            attribute_id: hdr.map_or(0, |h| h.attribute_id),
            timeout,
            deadline: self.t.now() + timeout,
            retries_left: retries,
            wants_resp,
        });
        Ok(id)
    }

    /// Stops tracking `id` (its answer came). `false` if it was not tracked.
    pub fn complete(&mut self, id: TrackId) -> bool {
        let before = self.tracked.len();
        self.tracked.retain(|t| t.id != id);
        self.tracked.len() != before
    }

    /// Pushes the next resend of `id` to `wait` from now (a peer asked for more time:
    /// an MRA). `false` if it was not tracked.
    pub fn extend(&mut self, id: TrackId, wait: Duration) -> bool {
        let now = self.t.now();
        match self.tracked.iter_mut().find(|t| t.id == id) {
            Some(t) => {
                t.deadline = now + wait;
                true
            }
            None => false,
        }
    }

    /// Whether `id` is still tracked.
    pub fn is_tracked(&self, id: TrackId) -> bool {
        self.tracked.iter().any(|t| t.id == id)
    }

    /// When the next tracked send is due, if any.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.tracked.iter().map(|t| t.deadline).min()
    }

    /// Waits for input or the next timer, at most `max`.
    pub fn wait(&mut self, max: Duration) {
        let now = self.t.now();
        let until_timer = self
            .next_deadline()
            .map_or(max, |d| d.saturating_sub(now).min(max));
        self.t.wait(until_timer);
    }

    /// Runs the timers (resends; at most one [`MadEvent::TimedOut`]) and then reads
    /// received MADs until one is for the layer above.
    pub fn poll(&mut self) -> Result<Option<MadEvent>, TransportError> {
        if let Some(ev) = self.run_timers()? {
            return Ok(Some(ev));
        }
        while let Some(mad) = self.t.recv()? {
            if let Some(ev) = self.handle(mad)? {
                self.counters.received += 1;
                return Ok(Some(ev));
            }
        }
        Ok(None)
    }

    fn run_timers(&mut self) -> Result<Option<MadEvent>, TransportError> {
        let now = self.t.now();
        let mut i = 0;
        while i < self.tracked.len() {
            if self.tracked[i].deadline > now {
                i += 1;
                continue;
            }
            if self.tracked[i].retries_left == 0 {
                let t = self.tracked.remove(i);
                self.counters.timeouts += 1;
                return Ok(Some(MadEvent::TimedOut {
                    id: t.id,
                    tid: t.tid,
                    attribute_id: t.attribute_id,
                }));
            }
            let t = &mut self.tracked[i];
            t.retries_left -= 1;
            t.deadline = now + t.timeout;
            let (to, mad) = (t.to, t.mad.clone());
            self.t.send(&to, &mad)?;
            self.counters.sent += 1;
            self.counters.resent += 1;
            i += 1;
        }
        Ok(None)
    }

    /// One received MAD: an event for the layer above, or handled here.
    fn handle(&mut self, mad: InMad) -> Result<Option<MadEvent>, TransportError> {
        if mad.len < MAD_SIZE {
            self.counters.malformed += 1;
            return Ok(None);
        }
        let Ok(hdr) = MadHeader::parse(&mad.data[..]) else {
            self.counters.malformed += 1;
            return Ok(None);
        };
        if hdr.is_response()
            && let Some(pos) = self
                .tracked
                .iter()
                .position(|t| t.wants_resp && t.tid == hdr.transaction_id)
        {
            let t = self.tracked.remove(pos);
            return Ok(Some(MadEvent::Response { id: t.id, hdr, mad }));
        }
        let kind = hdr.method_kind();
        if self
            .served
            .iter()
            .any(|(c, v, m)| (*c, *v) == (hdr.mgmt_class, hdr.class_version) && m.contains(&kind))
        {
            return Ok(Some(MadEvent::Received { hdr, mad }));
        }
        let is_request =
            !hdr.is_response() && matches!(hdr.method_kind(), Method::Get | Method::Set);
        if !is_request {
            self.counters.unwanted += 1;
            return Ok(None);
        }
        // IBA §13.4.7, Linux `generate_unmatched_resp`: a Get/Set nobody serves gets a
        // GetResp with the reason in its status, the rest of the MAD sent back as it came.
        let version_known = self
            .served
            .iter()
            .any(|(c, v, _)| (*c, *v) == (hdr.mgmt_class, hdr.class_version));
        let class_known = self.served.iter().any(|(c, _, _)| *c == hdr.mgmt_class);
        let code = if class_known && !version_known {
            status::BAD_VERSION
        } else {
            status::UNSUPPORTED_METHOD_ATTR
        };
        let mut out = *mad.data;
        hdr.response(code).emit(&mut out[..]);
        self.send(&mad.from, &out)?;
        self.counters.answered_unsupported += 1;
        Ok(None)
    }
}

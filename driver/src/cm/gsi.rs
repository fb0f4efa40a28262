//! [`MadTransport`] on the device's GSI QP ([`Gsi`]): each send goes through an address
//! handle made from the destination GID (kept for the next MAD to the same place), each
//! received MAD comes with its sender from the GRH (docs/spec/rdma-cm.md §1).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use uhca_layout::mad::MAD_SIZE;

use super::transport::{InMad, MadAddr, MadTransport, TransportError};
use super::{Cm, CmConfig, CmError};
use crate::handle::Device;
use crate::resource::{Ah, AhAttr, Gid, Gsi, GsiConfig, GsiError, GsiEvent, Pd};

/// How long [`MadTransport::send`] waits for a send buffer to come free (sends on UD
/// complete as soon as they leave the port; this bounds a stuck device, it never times
/// a healthy one).
const BUSY_LIMIT: Duration = Duration::from_secs(1);

/// Address handles kept per destination at most (a CM talks to few peers).
const MAX_AHS: usize = 256;

fn gsi_err(e: GsiError) -> TransportError {
    TransportError::Gsi(Box::new(e))
}

/// The GSI QP as a [`MadTransport`].
pub struct GsiTransport {
    dev: Device,
    gsi: Gsi,
    sgid_index: u8,
    local: MadAddr,
    start: Instant,
    ahs: HashMap<MadAddr, Ah>,
    inbox: VecDeque<InMad>,
    tag: u64,
    /// The MAC to reach a sender's GSI at, from its GID.
    mac_of: fn(&Gid) -> [u8; 6],
}

impl std::fmt::Debug for GsiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GsiTransport")
            .field("local", &self.local)
            .field("gsi", &self.gsi)
            .finish()
    }
}

/// The MAC [`GsiTransport`] answers a sender at by default: the one a link-local GID
/// names, else [`UNRESOLVED_MAC`](crate::resource::UNRESOLVED_MAC) (enough for the
/// model's network port; see `resource::ah`).
pub fn default_mac_of(gid: &Gid) -> [u8; 6] {
    gid.link_local_mac()
        .unwrap_or(crate::resource::UNRESOLVED_MAC)
}

impl GsiTransport {
    /// The transport on `gsi` of `dev`, sending from GID index `sgid_index`.
    pub fn new(dev: &Device, gsi: Gsi, sgid_index: u8) -> Result<GsiTransport, CmError> {
        let a = dev
            .roce_address(sgid_index.into())
            .map_err(|e| TransportError::Gsi(Box::new(e)))?;
        Ok(GsiTransport {
            dev: dev.clone(),
            gsi,
            sgid_index,
            local: MadAddr::gsi(a.gid, a.mac),
            start: Instant::now(),
            ahs: HashMap::new(),
            inbox: VecDeque::new(),
            tag: 0,
            mac_of: default_mac_of,
        })
    }

    /// Answers senders at the MAC `f` gives for their GID (a neighbour table).
    pub fn set_mac_of(&mut self, f: fn(&Gid) -> [u8; 6]) {
        self.mac_of = f;
    }

    /// The GSI endpoint (its counters).
    pub fn gsi(&self) -> &Gsi {
        &self.gsi
    }

    fn ah(&mut self, to: &MadAddr) -> Result<&Ah, TransportError> {
        if !self.ahs.contains_key(to) {
            if self.ahs.len() >= MAX_AHS {
                self.ahs.clear();
            }
            let attr = AhAttr {
                dgid: Gid(to.gid),
                sgid_index: self.sgid_index,
                traffic_class: to.traffic_class,
                hop_limit: 64,
                flow_label: to.flow_label,
                udp_sport: None,
                dmac: to.mac,
            };
            let ah = self
                .dev
                .create_ah(&attr)
                .map_err(|e| TransportError::Gsi(Box::new(e)))?;
            self.ahs.insert(*to, ah);
        }
        Ok(&self.ahs[to])
    }

    /// Keeps what an event brings: a received MAD goes to the inbox.
    fn stash(&mut self, ev: GsiEvent) {
        if let GsiEvent::Received(m) = ev {
            self.inbox.push_back(InMad {
                len: m.len,
                from: MadAddr {
                    gid: m.grh.sgid.0,
                    qpn: m.src_qp,
                    mac: (self.mac_of)(&m.grh.sgid),
                    traffic_class: m.grh.traffic_class,
                    flow_label: m.grh.flow_label,
                },
                data: m.data,
            });
        }
        // Sent and RecvFailed are counted by the Gsi itself.
    }
}

impl MadTransport for GsiTransport {
    fn send(&mut self, to: &MadAddr, mad: &[u8; MAD_SIZE]) -> Result<(), TransportError> {
        self.tag = self.tag.wrapping_add(1);
        let tag = self.tag;
        let deadline = Instant::now() + BUSY_LIMIT;
        loop {
            let ah = self.ah(to)?.clone();
            let r = if to.qpn == 1 {
                self.gsi.send(&ah, mad, tag)
            } else {
                self.gsi
                    .send_to(&ah, to.qpn, crate::resource::GSI_QKEY, mad, tag)
            };
            match r {
                Ok(()) => return Ok(()),
                Err(GsiError::Busy(_)) if Instant::now() < deadline => {
                    // Reap send completions (keeping received MADs), then try again.
                    match self.gsi.wait(Duration::from_millis(1)).map_err(gsi_err)? {
                        Some(ev) => self.stash(ev),
                        None => std::thread::yield_now(),
                    }
                }
                Err(e) => return Err(gsi_err(e)),
            }
        }
    }

    fn recv(&mut self) -> Result<Option<InMad>, TransportError> {
        loop {
            if let Some(m) = self.inbox.pop_front() {
                return Ok(Some(m));
            }
            match self.gsi.poll().map_err(gsi_err)? {
                Some(ev) => self.stash(ev),
                None => return Ok(None),
            }
        }
    }

    fn wait(&mut self, timeout: Duration) {
        if !self.inbox.is_empty() {
            return;
        }
        // An error here shows again at the next recv, which reports it.
        if let Ok(Some(ev)) = self.gsi.wait(timeout) {
            self.stash(ev);
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn local(&self) -> MadAddr {
        self.local
    }
}

impl Cm<GsiTransport> {
    /// Opens port 1's GSI QP on `pd` (default [`GsiConfig`]) and a CM on it, sending from
    /// GID index `cfg.sgid_index`.
    pub fn open(dev: &Device, pd: &Pd, cfg: CmConfig) -> Result<Self, CmError> {
        let gsi = dev.open_gsi(pd, &GsiConfig::default()).map_err(gsi_err)?;
        let t = GsiTransport::new(dev, gsi, cfg.sgid_index)?;
        Ok(Cm::new(t, cfg))
    }
}

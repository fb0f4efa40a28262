//! [`Bench`]: both ends of a run, connected; the other end ([`Peer`]) in this process (one
//! model HCA in loopback, two linked ones, or an opened device), in another process over
//! uhca-perf's exchange, or a perftest peer.

use std::time::Instant;

use uhca::datapath::Remote;
use uhca::hw::model::{Hca, ModelConfig};
use uhca::pci::model::ModelFunction;
use uhca::resource::ConnectParams;
use uhca::{Device, DeviceConfig};

use super::end::{End, read_depths, rx_off};
use super::{Pacing, PerfError, Settings, control, pt_peer, role, setup};

/// The other end of a run.
pub(super) enum Peer {
    /// In this process.
    Local(Box<End>),
    /// In another process: its buffer halves we target, one per QP, and the connection
    /// to it.
    Remote {
        targets: Vec<Remote>,
        ctl: control::Control,
        role: role::Role,
        /// This end and the peer as the END messages described them.
        ends: Box<(control::Endpoint, control::Endpoint)>,
    },
    /// In another process that speaks perftest's exchange (perftest itself, or a
    /// `uhca-perf` in that mode).
    Perftest(Box<pt_peer::PtPeer>),
}

/// Both ends of a run, connected.
pub struct Bench {
    /// Offset of the half of each buffer that the peer writes into.
    pub(super) rx_off: usize,
    /// This process's end (the client's, the driving one, when both are here).
    pub(super) me: End,
    pub(super) peer: Peer,
    pub(super) _models: Vec<std::sync::Arc<ModelFunction>>,
    pub(super) settings: Settings,
}

/// A model HCA of this process, its MAC ending in `mac_last`, its loopback with or without
/// offloads.
pub(super) fn model(
    mac_last: u8,
    offload: bool,
) -> Result<std::sync::Arc<ModelFunction>, PerfError> {
    let mut cfg = ModelConfig {
        loopback_offload: offload,
        ..ModelConfig::default()
    };
    cfg.mac[5] = mac_last;
    ModelFunction::new(cfg).map_err(setup("starting the model"))
}

/// Both ends' devices in this process: one model HCA in loopback (both ends on it), or two
/// linked ones (`pair`); the models, the client's device and the server's.
pub(super) fn local_devices(
    s: &Settings,
    pair: bool,
) -> Result<(Vec<std::sync::Arc<ModelFunction>>, Device, Device), PerfError> {
    let mut models = vec![model(0x10, s.loopback_offload)?];
    if pair {
        models.push(model(0x20, s.loopback_offload)?);
        Hca::link_pair(models[0].hca(), models[1].hca()).map_err(setup("linking models"))?;
    }
    let open = |m: &std::sync::Arc<ModelFunction>| {
        Device::open(m.clone(), DeviceConfig::default()).map_err(setup("booting"))
    };
    let dev_c = open(&models[0])?;
    let dev_s = if pair {
        open(&models[1])?
    } else {
        dev_c.clone()
    };
    Ok((models, dev_c, dev_s))
}

/// Checks `-x`: the entry must exist in the port's GID table and hold an address (as
/// perftest's `ibv_query_gid` check), so a bad index is a message before any connection,
/// on the end that gave it, not a failed command later or the peer's "connection closed".
pub fn check_gid_index(dev: &Device, index: u8) -> Result<(), String> {
    let size = dev
        .summary()
        .map_err(|e| format!("-x {index}: reading the GID table: {e}"))?
        .ports
        .first()
        .map_or(0, |p| p.gid_table_size);
    if u32::from(index) >= size {
        return Err(format!(
            "-x {index}: the port's GID table has {size} entries (0..={}; uhca-info lists them)",
            size.saturating_sub(1)
        ));
    }
    let a = dev
        .roce_address(u32::from(index))
        .map_err(|e| format!("-x {index}: reading GID entry {index}: {e}"))?;
    if a.gid == [0; 16] {
        return Err(format!(
            "-x {index}: GID entry {index} is empty (uhca-info lists the entries in use)"
        ));
    }
    Ok(())
}

impl Bench {
    /// The device of this process's end (the client's when both are here).
    pub fn device(&self) -> &Device {
        &self.me.dev
    }

    /// Boots the model(s), creates and connects the QPs for `s` with buffers of `max_size`.
    pub fn new(s: &Settings, max_size: usize, pair: bool) -> Result<Bench, PerfError> {
        let (models, dev_c, dev_s) = local_devices(s, pair)?;
        Bench::connect_local(s, max_size, dev_c, dev_s, models)
    }

    /// Both ends in this process on `dev` (an opened device, such as a function bound to
    /// vfio-pci), in loopback through its port's own MAC.
    pub fn on_device(s: &Settings, max_size: usize, dev: Device) -> Result<Bench, PerfError> {
        Bench::connect_local(s, max_size, dev.clone(), dev, Vec::new())
    }

    fn connect_local(
        s: &Settings,
        max_size: usize,
        dev_c: Device,
        dev_s: Device,
        models: Vec<std::sync::Arc<ModelFunction>>,
    ) -> Result<Bench, PerfError> {
        let mut client = End::new(&dev_c, s, max_size, s.use_dm)?;
        let mut server = End::new(&dev_s, s, max_size, false)?;
        let ca = client.dev.roce_address(0).map_err(setup("GID"))?;
        let sa = server.dev.roce_address(0).map_err(setup("GID"))?;
        for (i, (c, sv)) in client.qps.iter_mut().zip(server.qps.iter_mut()).enumerate() {
            let psn = 0x1000 * (i as u32 + 1);
            let mut pc = ConnectParams::new(sv.qpn(), sa.gid, sa.mac);
            (pc.sq_psn, pc.rq_psn) = (psn, psn + 7);
            let mut ps = ConnectParams::new(c.qpn(), ca.gid, ca.mac);
            (ps.sq_psn, ps.rq_psn) = (psn + 7, psn);
            (pc.mtu, ps.mtu) = (s.mtu, s.mtu);
            read_depths(&mut pc, &dev_c, s);
            read_depths(&mut ps, &dev_s, s);
            c.connect(&pc).map_err(setup("connecting"))?;
            sv.connect(&ps).map_err(setup("connecting"))?;
        }
        Ok(Bench {
            rx_off: rx_off(max_size),
            me: client,
            peer: Peer::Local(Box::new(server)),
            _models: models,
            settings: s.clone(),
        })
    }

    /// How this run paces its requests (`-Q`, `-l`, `-o` as they take effect).
    pub fn pacing(&self) -> Pacing {
        let (cq_mod, post_list) = self.settings.pacing();
        let outs = self
            .settings
            .outs
            .map_or(self.me.dev.rd_atomic_limits().0, u32::from);
        Pacing {
            cq_mod,
            post_list,
            outs,
        }
    }

    /// Where QP `qp`'s requests land: the peer's receiving half.
    pub(super) fn target(&self, qp: usize) -> Remote {
        match &self.peer {
            Peer::Local(e) => e.bufs[qp].remote(self.rx_off as u64),
            Peer::Remote { targets, .. } => targets[qp],
            Peer::Perftest(p) => p.targets[qp],
        }
    }

    /// Every second or so while this end drives: tells a remote server it is still here.
    pub(super) fn beat(&mut self, now: Instant, next: &mut Instant) -> Result<(), PerfError> {
        if now < *next {
            return Ok(());
        }
        *next = now + role::BEAT;
        if let Peer::Remote { ctl, .. } = &mut self.peer {
            ctl.send(&control::Msg::Beat)?;
        }
        Ok(())
    }
}

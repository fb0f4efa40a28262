//! Which device a tool drives, and opening it: the built-in model HCA (`model`, the
//! default), a PCI function bound to vfio-pci (`0000:3b:00.0`), or a device served over
//! vfio-user on a UNIX socket (a `uhca-model` process). Shared by `uhca-info` and
//! `uhca-perf` (`-d/--device`, `--vfio-user`). `uhca-perf` can also join the built-in
//! model's port to another process's by the UDP link `uhca-model` uses (`--link-local`,
//! `--link-peer`).

use std::net::SocketAddr;
use std::path::PathBuf;

use uhca::{Device, DeviceConfig};

/// The device a tool was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The built-in model HCA, in this process.
    Model,
    /// A PCI function bound to vfio-pci, by its address.
    Vfio(String),
    /// A device served over vfio-user on this UNIX socket.
    VfioUser(PathBuf),
    /// The built-in model HCA, its port joined to another process's model by a UDP link
    /// from `local` to `peer` (as `uhca-model --link-local --link-peer`). Its MAC is
    /// derived from `local` ([`link_mac`]), so the two ends of a link differ.
    LinkedModel {
        /// This end's UDP address.
        local: SocketAddr,
        /// The other end's UDP address.
        peer: SocketAddr,
    },
    /// The built-in model HCA, its port on the host's IP network (RoCEv2 on UDP 4791,
    /// `--net`).
    #[cfg(feature = "model")]
    NetModel(Box<crate::net_port::NetFlags>),
}

/// The device flags `uhca-info` and `uhca-perf` share (`#[command(flatten)]`).
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceFlags {
    /// Device: `model` (the built-in software HCA, default) or a PCI address
    /// (`0000:3b:00.0`) bound to vfio-pci.
    #[arg(
        short = 'd',
        long = "device",
        default_value = "model",
        conflicts_with = "vfio_user"
    )]
    pub device: String,
    /// The device served over vfio-user on this UNIX socket (a `uhca-model --socket`
    /// process).
    #[arg(long, value_name = "SOCKET")]
    pub vfio_user: Option<PathBuf>,
}

impl DeviceFlags {
    /// The device these flags name.
    pub fn spec(&self) -> DeviceSpec {
        DeviceSpec::from_flags(&self.device, self.vfio_user.as_deref())
    }
}

/// A locally administered unicast MAC derived from `local`: two ends of a link, which
/// have distinct addresses, get distinct MACs (a hash, so a clash is possible but unlikely).
pub fn link_mac(local: SocketAddr) -> [u8; 6] {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    local.hash(&mut h);
    let v = h.finish().to_be_bytes();
    [0x02, 0x00, v[0], v[1], v[2], v[3]]
}

impl DeviceSpec {
    /// From the tools' flags: `--vfio-user SOCKET` wins, else `-d model` or `-d BDF`.
    pub fn from_flags(device: &str, vfio_user: Option<&std::path::Path>) -> DeviceSpec {
        match (vfio_user, device) {
            (Some(s), _) => DeviceSpec::VfioUser(s.to_path_buf()),
            (None, "model") => DeviceSpec::Model,
            (None, bdf) => DeviceSpec::Vfio(bdf.to_owned()),
        }
    }

    /// How a report names the device.
    pub fn describe(&self) -> String {
        match self {
            DeviceSpec::Model => "uhca model".into(),
            DeviceSpec::Vfio(bdf) => format!("{bdf} (vfio-pci)"),
            DeviceSpec::VfioUser(s) => format!("vfio-user {}", s.display()),
            DeviceSpec::LinkedModel { local, peer } => {
                format!("uhca model, UDP link {local} -> {peer}")
            }
            #[cfg(feature = "model")]
            DeviceSpec::NetModel(f) => {
                format!(
                    "uhca model, RoCEv2 port on {}",
                    f.net.as_deref().unwrap_or("")
                )
            }
        }
    }
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// This build has no model HCA.
    #[error("this build has no model HCA (feature `model`); pass --device BDF")]
    NoModel,
    /// The model, the VFIO function or the vfio-user socket could not be opened.
    #[error("cannot open {what}: {source}")]
    Open {
        /// The device.
        what: String,
        /// Why.
        #[source]
        source: uhca::pci::PciError,
    },
    /// The UDP link of the built-in model could not be bound.
    #[error("the model's UDP link on {local}: {source}")]
    Link {
        /// The local address.
        local: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The model's network port could not be opened.
    #[cfg(feature = "model")]
    #[error(transparent)]
    Net(#[from] crate::net_port::NetPortError),
    /// The device opened but did not boot.
    #[error("booting {what}: {source}")]
    Boot {
        /// The device.
        what: String,
        /// Why.
        #[source]
        source: uhca::DeviceError,
    },
}

/// Opens and boots the device `spec` names with `cfg`.
pub fn open(spec: &DeviceSpec, cfg: DeviceConfig) -> Result<Device, OpenError> {
    let what = match spec {
        DeviceSpec::Model | DeviceSpec::LinkedModel { .. } => "the model".to_owned(),
        #[cfg(feature = "model")]
        DeviceSpec::NetModel(_) => "the model".to_owned(),
        DeviceSpec::Vfio(bdf) => bdf.clone(),
        DeviceSpec::VfioUser(s) => format!("the vfio-user device {}", s.display()),
    };
    let open_err = |source| OpenError::Open {
        what: what.clone(),
        source,
    };
    let boot_err = |source| OpenError::Boot {
        what: what.clone(),
        source,
    };
    match spec {
        DeviceSpec::Model => open_model(None, cfg, open_err, boot_err),
        DeviceSpec::LinkedModel { local, peer } => {
            open_model(Some((*local, *peer)), cfg, open_err, boot_err)
        }
        #[cfg(feature = "model")]
        DeviceSpec::NetModel(flags) => {
            let (mc, link) =
                crate::net_port::open_port(flags, uhca::hw::model::ModelConfig::default())?;
            let f = uhca::pci::model::ModelFunction::new(mc).map_err(open_err)?;
            crate::net_port::attach(f.hca(), link);
            Device::open(f, cfg).map_err(boot_err)
        }
        // iommufd + cdev when the kernel has it, else the legacy container/group.
        DeviceSpec::Vfio(bdf) => {
            let f = uhca::pci::vfio::open(bdf, &uhca::pci::vfio::VfioOptions::default())
                .map_err(open_err)?;
            Device::open(f, cfg).map_err(boot_err)
        }
        DeviceSpec::VfioUser(sock) => {
            let f = uhca::pci::vfio_user::VfioUserFunction::connect(sock).map_err(open_err)?;
            Device::open(f, cfg).map_err(boot_err)
        }
    }
}

/// The built-in model, with its port on a UDP link from `link.0` to `link.1` if given.
#[cfg(feature = "model")]
fn open_model(
    link: Option<(SocketAddr, SocketAddr)>,
    cfg: DeviceConfig,
    open_err: impl Fn(uhca::pci::PciError) -> OpenError,
    boot_err: impl Fn(uhca::DeviceError) -> OpenError,
) -> Result<Device, OpenError> {
    use uhca::hw::link::udp::UdpLink;
    use uhca::hw::model::ModelConfig;
    use uhca::pci::model::ModelFunction;
    let Some((local, peer)) = link else {
        let f = ModelFunction::with_defaults().map_err(open_err)?;
        return Device::open(f, cfg).map_err(boot_err);
    };
    let udp = UdpLink::bind(local, peer).map_err(|source| OpenError::Link { local, source })?;
    let f = ModelFunction::new(ModelConfig {
        mac: link_mac(local),
        ..ModelConfig::default()
    })
    .map_err(open_err)?;
    f.hca().attach_link(Box::new(udp));
    Device::open(f, cfg).map_err(boot_err)
}

#[cfg(not(feature = "model"))]
fn open_model(
    _: Option<(SocketAddr, SocketAddr)>,
    _: DeviceConfig,
    _: impl Fn(uhca::pci::PciError) -> OpenError,
    _: impl Fn(uhca::DeviceError) -> OpenError,
) -> Result<Device, OpenError> {
    Err(OpenError::NoModel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_name_the_device_and_link_macs_differ() {
        let p = std::path::Path::new("/tmp/m.sock");
        assert_eq!(DeviceSpec::from_flags("model", None), DeviceSpec::Model);
        assert_eq!(
            DeviceSpec::from_flags("0000:3b:00.0", None),
            DeviceSpec::Vfio("0000:3b:00.0".into())
        );
        assert_eq!(
            DeviceSpec::from_flags("model", Some(p)),
            DeviceSpec::VfioUser(p.into())
        );
        let (a, b) = (
            "127.0.0.1:4791".parse().unwrap(),
            "127.0.0.1:4792".parse().unwrap(),
        );
        assert_ne!(link_mac(a), link_mac(b));
        assert_eq!(link_mac(a), link_mac(a));
        // Locally administered, unicast.
        assert_eq!(link_mac(a)[0] & 0x03, 0x02);
    }
}

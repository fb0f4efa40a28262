//! Which device a tool drives, and opening it: the built-in model HCA (`model`, the
//! default), a PCI function bound to vfio-pci (`0000:3b:00.0`), or a device served over
//! vfio-user on a UNIX socket (a `uhca-model` process). Shared by `uhca-info` and
//! `uhca-perf` (`-d/--device`, `--vfio-user`).

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
        DeviceSpec::Model => "the model".to_owned(),
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
        DeviceSpec::Model => open_model(cfg, open_err, boot_err),
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

#[cfg(feature = "model")]
fn open_model(
    cfg: DeviceConfig,
    open_err: impl Fn(uhca::pci::PciError) -> OpenError,
    boot_err: impl Fn(uhca::DeviceError) -> OpenError,
) -> Result<Device, OpenError> {
    let f = uhca::pci::model::ModelFunction::with_defaults().map_err(open_err)?;
    Device::open(f, cfg).map_err(boot_err)
}

#[cfg(not(feature = "model"))]
fn open_model(
    _: DeviceConfig,
    _: impl Fn(uhca::pci::PciError) -> OpenError,
    _: impl Fn(uhca::DeviceError) -> OpenError,
) -> Result<Device, OpenError> {
    Err(OpenError::NoModel)
}

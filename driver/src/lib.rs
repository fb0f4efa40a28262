//! uhca: a userspace driver for mlx5-family (ConnectX-4 and later) RDMA NICs.
//!
//! The driver owns a PCI function (bound to vfio-pci, or the built-in software model) and
//! drives it entirely from user space. Layers, bottom up, each a module:
//! - [`pci`]: the PCI function: config space, BARs ([`pci::Bar`]), DMA mapping, MSI-X.
//!   Backends: the in-process model (feature `model`, the default device), kernel VFIO
//!   (container/group and iommufd + device cdev) and vfio-user; [`pci::sysfs`]: discovery,
//!   binding to vfio-pci (`uhca-bind` and the VM guest tests use it).
//! - [`dma`]: DMA memory (memfd, hugepages when available) mapped into the device's IOVA
//!   space, and the IOVA allocator. `barrier` (internal): the memory barriers, named by
//!   what they order.
//! - [`cmd`]: the command interface: queue, mailboxes, slots, typed commands ([`cmd::ops`]).
//! - The device's shared state (`device`, internal): the PRM boot and teardown order
//!   (`boot`), firmware pages (`pages`), the control EQ (`eq`) and health monitoring
//!   (`health`; its error is [`HealthError`]), which every resource of a device holds.
//! - [`datapath`]: the hot path: WQE building, send rings, doorbells and BlueFlame, CQ
//!   polling; no locks, allocation or system call per operation.
//! - [`resource`]: PDs, UARs, completion EQs, MRs, device memory (MEMIC), CQs, RC, UD and
//!   GSI QPs, and address handles, each created from the [`Device`] handle ([`Device::open`]),
//!   which holds what a device's resources share (the completion-EQ pool).
//! - [`cm`]: the RDMA connection manager over RoCEv2 (MADs on QP1; `connect(ip, port)`,
//!   `listen(port)`), as librdmacm's rdma_cm speaks it.
//! - [`peer`]: peer memory (dma-bufs of another device's BAR): clients, registration,
//!   revocation.
//! - `cuda` (feature `gpu`): the CUDA client for peer memory: GPU memory exported as a
//!   dma-buf, with libcuda loaded at run time.
//! - [`info`]: a device summary in `ibv_devinfo`'s terms.
//!
//! [`layout`] re-exports the mlx5 layouts the driver shares with the model (`uhca-layout`);
//! `hw` re-exports the model crate (feature `model`). Test fixtures (the data path's
//! stand-in rig, a device-less PCI function, fake sysfs trees) are built with the feature
//! `testing` only and are not part of the API.
//!
//! ```
//! let dev = uhca::Device::open_model()?;
//! let pd = dev.alloc_pd()?;
//! assert!(dev.fw_pages() > 0);
//! drop(pd);
//! dev.close()?;
//! # Ok::<(), uhca::DeviceError>(())
//! ```

// `unsafe` lives only in the modules named for it: `pci` (BAR mappings, the VFIO and
// iommufd ioctls, the model's shared BAR memory), `dma` (DMA memory, volatile access to
// device-shared rings) and `cuda` (calls into libcuda). Every other module is safe code.
#![deny(unsafe_code)]

pub(crate) mod barrier;
mod boot;
pub mod cm;
pub mod cmd;
#[cfg(feature = "gpu")]
#[allow(unsafe_code)]
pub mod cuda;
pub mod datapath;
mod device;
#[allow(unsafe_code)]
pub mod dma;
pub(crate) mod eq;
mod handle;
pub(crate) mod health;
pub mod info;
pub(crate) mod pages;
#[allow(unsafe_code)]
pub mod pci;
pub mod peer;
pub mod resource;

pub use boot::cap_word;
pub use device::{
    AsyncEvent, Caps, DeviceConfig, DeviceError, DeviceInfo, MAX_PAGES_PER_REQUEST,
    MAX_PENDING_EVENTS, is_status,
};
pub use handle::Device;
pub use health::HealthError;
/// The model crate (`uhca-hw`): the software HCA behind [`pci::model`] (feature `model`).
#[cfg(feature = "model")]
pub use uhca_hw as hw;
/// The mlx5 layouts (`uhca-layout`) the driver and the model share.
pub use uhca_layout as layout;

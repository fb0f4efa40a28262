//! uhca: a userspace driver for mlx5-family (ConnectX-4 and later) RDMA NICs.
//!
//! The driver owns a PCI function (bound to vfio-pci, or the built-in software model) and
//! drives it entirely from user space. Layers, bottom up, each a module:
//! - [`pci`]: the PCI function: config space, BARs ([`pci::Bar`]), DMA mapping, MSI-X.
//!   Backends: the in-process model (feature `model`, the default device) and kernel VFIO.
//! - [`dma`]: DMA memory (memfd, hugepages when available) mapped into the device's IOVA
//!   space, and the IOVA allocator.
//! - [`cmd`]: the command interface: queue, mailboxes, slots, typed commands ([`cmd::ops`]).
//! - [`boot`](Device::open): the PRM boot and teardown order, firmware pages, the control
//!   EQ and health monitoring, behind one [`Device`] handle.
//! - [`resource`]: PDs, UARs, EQs.
//! - [`cm`]: the RDMA connection manager over RoCEv2 (MADs on QP1; `connect(ip, port)`,
//!   `listen(port)`), as librdmacm's rdma_cm speaks it.
//! - [`peer`]: peer memory (dma-bufs of another device's BAR): clients, registration,
//!   revocation.
//! - `cuda` (feature `gpu`): the CUDA client for peer memory: GPU memory exported as a
//!   dma-buf, with libcuda loaded at run time.
//!
//! ```
//! let dev = uhca::Device::open_model()?;
//! let pd = dev.alloc_pd()?;
//! assert!(dev.fw_pages() > 0);
//! drop(pd);
//! dev.close()?;
//! # Ok::<(), uhca::DeviceError>(())
//! ```

pub mod barrier;
mod boot;
pub mod cm;
pub mod cmd;
#[cfg(feature = "gpu")]
pub mod cuda;
pub mod datapath;
mod device;
pub mod dma;
pub mod health;
pub mod info;
pub mod pages;
pub mod pci;
pub mod peer;
pub mod resource;

pub use boot::cap_word;
pub use device::{
    AsyncEvent, Caps, Device, DeviceConfig, DeviceError, DeviceInfo, MAX_PAGES_PER_REQUEST,
    MAX_PENDING_EVENTS, is_status,
};
pub use uhca_hw as hw;

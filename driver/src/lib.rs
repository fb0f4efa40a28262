//! uhca: a userspace driver for mlx5-family (ConnectX-4 and later) RDMA NICs.
//!
//! Layers, bottom up (each a module):
//! - [`pci`]: the PCI function the driver owns (config space, BARs, DMA mapping, MSI-X),
//!   with backends for the built-in software model and for real kernel VFIO.

pub mod pci;

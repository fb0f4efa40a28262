//! Shared code of the uhca tools. [`device`] opens the device a tool is pointed at (uhca-info,
//! uhca-perf); [`perf`] is the engine behind `uhca-perf`; [`reference`](mod@reference)
//! measures the machine figures its results are compared with (`uhca-perf cacheline|memcpy`);
//! [`logging`] sets up their log output; `model_server` (feature `vfio-user`) serves the model
//! HCA over vfio-user for `uhca-model`; `net_port` (feature `model`) puts the model's port on
//! the host's IP network; [`rping`] is rping's protocol on a connected QP (`uhca-rping`);
//! [`topology`] reads the P2P topology between a NIC and a GPU from sysfs (`uhca-bind status`);
//! [`pipe`] ends every tool quietly when its output is closed early (`uhca-perf ... | head -1`).

#![deny(unsafe_code)]

#[cfg(test)]
mod cm_loop;
pub mod device;
pub mod logging;
#[cfg(feature = "vfio-user")]
pub mod model_server;
#[cfg(feature = "model")]
pub mod net_port;
pub mod perf;
pub mod pipe;
pub mod reference;
pub mod rping;
pub mod topology;

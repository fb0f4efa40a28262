//! The configuration a model HCA is made with ([`ModelConfig`]).

use std::time::Duration;

/// The first QPN the model gives out (0 and 1 are the special QPs).
pub(crate) const FIRST_QPN: u32 = 2;
/// The highest [`ModelConfig::first_qpn`] taken: the bottom half of the QPN space
/// (`caps::LOG_MAX_QP`, which checks this at compile time), so the top half is always there
/// to allocate.
pub(crate) const MAX_FIRST_QPN: u32 = 1 << 15;

/// Configuration of a model HCA. `Default` is a ConnectX-5-like single-port RoCE HCA.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Firmware revision: major, minor, subminor.
    pub fw_rev: (u16, u16, u16),
    /// `initializing` stays 1 this long after creation and after reset.
    pub boot_delay: Duration,
    /// `health_counter` advances at least this often.
    pub health_period: Duration,
    /// Permanent MAC address of port 1.
    pub mac: [u8; 6],
    /// QUERY_PAGES boot answer.
    pub boot_pages: u32,
    /// QUERY_PAGES init answer.
    pub init_pages: u32,
    /// MEMIC window size and `max_memic_size` in bytes (multiple of 4 KiB).
    pub memic_size: u32,
    /// Name (memfd name, logs).
    pub name: String,
    /// The port's loopback queue takes Linux `lo`'s offloads (default): frames a port sends
    /// to itself carry no ICRC, and RDMA WRITE, SEND and READ response payloads cross it as
    /// bursts (`rc::Burst`), copied once from the sender's memory. False: they are real
    /// packets, one per MTU with an ICRC, as on a link.
    pub loopback_offload: bool,
    /// The addresses of the network interface the port is put on
    /// ([`link::net::NetLink`](crate::link::net::NetLink)); empty (default): the port has
    /// the made-up addresses of its MAC. When given, the GID table holds them as Linux
    /// builds a RoCE device's table from its netdev: the IPv6 link-local addresses first,
    /// then the IPv4 addresses (IPv4-mapped), then the other IPv6 addresses, all RoCEv2.
    pub port_addrs: Vec<std::net::IpAddr>,
    /// The lowest QPN the model hands out (default 2, the first after the SMI and GSI
    /// QPs; values below 2 or in the top half of the QPN space are taken as 2). A port on
    /// a real network starts each run somewhere else (`ModelConfig::run_first_qpn`): a
    /// peer's CM remembers a connection after it ends (IBA §12.9.8.3.1, time wait) and
    /// rejects a new REQ from the same CA GUID and QPN as stale (REJ reason 10), which a
    /// fresh model handing out the same QPNs every run runs into (seen against Linux's CM,
    /// docs/spec/rdma-cm-wire.md §8).
    pub first_qpn: u32,
}

impl ModelConfig {
    /// A first QPN that differs from run to run (from the clock and the process ID), for
    /// models whose port faces peers that outlive the process.
    pub fn run_first_qpn() -> u32 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut x = t ^ (u64::from(std::process::id()) << 20);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        FIRST_QPN + (x % u64::from(MAX_FIRST_QPN - FIRST_QPN)) as u32
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            fw_rev: (16, 35, 1000),
            boot_delay: Duration::from_millis(1),
            health_period: Duration::from_millis(1),
            mac: [0x02, 0x00, 0x00, 0x00, 0x00, 0x01],
            boot_pages: 4,
            init_pages: 8,
            memic_size: 256 << 10,
            name: "model0".to_string(),
            loopback_offload: true,
            port_addrs: Vec::new(),
            first_qpn: FIRST_QPN,
        }
    }
}

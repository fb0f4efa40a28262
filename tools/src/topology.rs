//! P2P topology facts between a NIC and a peer (GPU) from sysfs (vfio-kernel.md §2.6):
//! their IOMMU groups, the PCI path between them (from the canonical device paths
//! `devices/pciDDDD:BB/<root port>/.../<bdf>`), whether they share a root port, and the ACS
//! capability and control of every bridge on the path (PCIe extended capability 0x000D,
//! read from the binary `config` file; beyond the first 64 bytes that needs root).
//!
//! iommufd's dma-buf import runs no `pci_p2pdma_distance()` check, so this is the check the
//! user gets: it reports facts and the caveats they imply, it does not decide.

use std::fs;
use std::path::PathBuf;

use uhca::pci::sysfs::{Sysfs, SysfsError, normalize_bdf};

/// PCIe extended capability id of ACS.
pub const ACS_CAP_ID: u16 = 0x000D;
/// ACS Source Validation.
pub const ACS_SV: u16 = 1 << 0;
/// ACS Translation Blocking.
pub const ACS_TB: u16 = 1 << 1;
/// ACS P2P Request Redirect.
pub const ACS_RR: u16 = 1 << 2;
/// ACS P2P Completion Redirect.
pub const ACS_CR: u16 = 1 << 3;
/// ACS Upstream Forwarding.
pub const ACS_UF: u16 = 1 << 4;
/// ACS P2P Egress Control.
pub const ACS_EC: u16 = 1 << 5;
/// ACS Direct Translated P2P.
pub const ACS_DT: u16 = 1 << 6;

/// What a bridge's config space says about ACS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acs {
    /// The extended capability list has no ACS capability.
    NotCapable,
    /// ACS capability and control registers.
    Present {
        /// ACS Capability register.
        cap: u16,
        /// ACS Control register.
        ctrl: u16,
    },
    /// The extended config space could not be read (only 64 bytes without root).
    Unknown(String),
}

impl Acs {
    /// Names of the control bits that are on (`SV TB RR CR UF EC DT`).
    pub fn ctrl_names(ctrl: u16) -> Vec<&'static str> {
        let names = ["SV", "TB", "RR", "CR", "UF", "EC", "DT"];
        (0..7)
            .filter(|b| ctrl & (1 << b) != 0)
            .map(|b| names[b])
            .collect()
    }

    /// Whether P2P requests are redirected upstream (RR and CR on).
    pub fn redirects(&self) -> Option<bool> {
        match self {
            Acs::Present { ctrl, .. } => Some(ctrl & (ACS_RR | ACS_CR) == ACS_RR | ACS_CR),
            Acs::NotCapable => Some(false),
            Acs::Unknown(_) => None,
        }
    }
}

/// One bridge on the path between the two functions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bridge {
    /// Its address.
    pub bdf: String,
    /// Its ACS state.
    pub acs: Acs,
}

/// The P2P topology between a NIC and a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pTopology {
    /// The NIC.
    pub nic: String,
    /// The peer (a GPU).
    pub peer: String,
    /// IOMMU groups of both (`None`: no group, IOMMU off).
    pub groups: (Option<String>, Option<String>),
    /// Host bridges (`pciDDDD:BB`) of both.
    pub host_bridges: (Option<String>, Option<String>),
    /// Root ports of both (the first bridge below the host bridge).
    pub root_ports: (Option<String>, Option<String>),
    /// Bridges between the two functions: up from the NIC to the lowest common bridge (or
    /// the root ports) and down to the peer, each once.
    pub path: Vec<Bridge>,
}

impl P2pTopology {
    /// Whether both sit in one IOMMU group.
    pub fn same_group(&self) -> bool {
        self.groups.0.is_some() && self.groups.0 == self.groups.1
    }

    /// Whether both sit under one root port.
    pub fn same_root_port(&self) -> bool {
        self.root_ports.0.is_some() && self.root_ports.0 == self.root_ports.1
    }

    /// The caveats these facts imply (vfio-kernel.md §2.6), one line each.
    pub fn caveats(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.same_group() {
            v.push(format!(
                "NIC and peer share IOMMU group {}: their P2P traffic may bypass the IOMMU (switch routing), both must be owned by vfio-pci, and the peer's bus addresses are not in the IOVA ranges",
                self.groups.0.as_deref().unwrap_or("?")
            ));
        }
        if self.groups.0.is_none() || self.groups.1.is_none() {
            v.push("no IOMMU group: the IOMMU is off or the function is not isolated".into());
        }
        if !self.same_root_port() {
            v.push(
                "different root ports: P2P goes through the root complex, which must forward peer-to-peer (the kernel's P2PDMA whitelist: AMD Zen and some Intel Xeon host bridges); measure it"
                    .into(),
            );
        }
        if self.host_bridges.0 != self.host_bridges.1 {
            v.push("different host bridges (PCI domains or root complexes): P2P across them is rarely supported".into());
        }
        for b in &self.path {
            match b.acs.redirects() {
                Some(true) => v.push(format!(
                    "{}: ACS redirect on: P2P requests go up to the IOMMU and back (translated, slower)",
                    b.bdf
                )),
                Some(false) if self.same_root_port() => v.push(format!(
                    "{}: no ACS redirect: P2P below it is routed by the switch without the IOMMU",
                    b.bdf
                )),
                None => v.push(format!("{}: ACS unknown (run as root to read extended config space)", b.bdf)),
                Some(false) => {}
            }
        }
        v
    }
}

/// Finds the ACS capability in an extended config space image (`config` file bytes).
pub fn parse_acs(config: &[u8]) -> Acs {
    if config.len() < 0x104 {
        return Acs::Unknown(format!(
            "only {} bytes of config space readable (extended space needs root)",
            config.len()
        ));
    }
    let rd32 = |o: usize| u32::from_le_bytes(config[o..o + 4].try_into().expect("4 bytes"));
    let rd16 = |o: usize| u16::from_le_bytes(config[o..o + 2].try_into().expect("2 bytes"));
    let mut off = 0x100usize;
    // At most (4096 - 256) / 4 capabilities: a loop in the list cannot hang us.
    for _ in 0..960 {
        if off < 0x100 || off + 8 > config.len() {
            break;
        }
        let h = rd32(off);
        if h == 0 || h == u32::MAX {
            break;
        }
        if (h & 0xFFFF) as u16 == ACS_CAP_ID {
            return Acs::Present {
                cap: rd16(off + 4),
                ctrl: rd16(off + 6),
            };
        }
        off = (h >> 20) as usize & !3;
        if off == 0 {
            break;
        }
    }
    Acs::NotCapable
}

/// A sysfs file's hexadecimal value (`vendor`), if it reads and parses.
fn read_hex_u16(path: &std::path::Path) -> Option<u16> {
    let s = fs::read_to_string(path).ok()?;
    u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

fn is_bdf(s: &str) -> bool {
    normalize_bdf(s).is_ok_and(|n| n == s)
}

/// The P2P topology facts of a sysfs tree (`uhca-bind status`), on the driver's [`Sysfs`].
pub trait Topology {
    /// The canonical path of `bdf` below `devices/`: the host bridge (`pciDDDD:BB`) and the
    /// bridges above the function, top down (the function itself excluded).
    fn upstream_path(&self, bdf: &str) -> Result<(Option<String>, Vec<String>), SysfsError>;
    /// The ACS state of `bdf` from its `config` file.
    fn acs_of(&self, bdf: &str) -> Acs;
    /// Display-class functions (class 0x03xxxx: GPUs), sorted.
    fn gpu_functions(&self) -> Result<Vec<String>, SysfsError>;
    /// The P2P topology between `nic` and `peer`.
    fn p2p_topology(&self, nic: &str, peer: &str) -> Result<P2pTopology, SysfsError>;
}

impl Topology for Sysfs {
    /// The canonical path of `bdf` below `devices/`: the host bridge (`pciDDDD:BB`) and the
    /// bridges above the function, top down (the function itself excluded).
    fn upstream_path(&self, bdf: &str) -> Result<(Option<String>, Vec<String>), SysfsError> {
        let d = self.device_dir(bdf);
        let real: PathBuf = fs::canonicalize(&d).map_err(|source| SysfsError::Io {
            path: d.clone(),
            source,
        })?;
        let mut host = None;
        let mut chain = Vec::new();
        for c in real.components() {
            let s = c.as_os_str().to_string_lossy();
            if s.starts_with("pci") && s.len() == 10 && s.as_bytes()[7] == b':' {
                host = Some(s.into_owned());
                chain.clear();
            } else if host.is_some() && is_bdf(&s) {
                chain.push(s.into_owned());
            }
        }
        if chain.last().map(String::as_str) == Some(bdf) {
            chain.pop();
        }
        Ok((host, chain))
    }

    /// The ACS state of `bdf` from its `config` file.
    fn acs_of(&self, bdf: &str) -> Acs {
        match fs::read(self.device_dir(bdf).join("config")) {
            Ok(b) => parse_acs(&b),
            Err(e) => Acs::Unknown(e.to_string()),
        }
    }

    /// Display-class functions (class 0x03xxxx: GPUs), sorted.
    fn gpu_functions(&self) -> Result<Vec<String>, SysfsError> {
        Ok(self
            .all_functions()?
            .into_iter()
            .filter(|b| {
                fs::read_to_string(self.device_dir(b).join("class")).is_ok_and(|c| {
                    u32::from_str_radix(c.trim().trim_start_matches("0x"), 16)
                        .is_ok_and(|v| v >> 16 == 0x03)
                })
            })
            .collect())
    }

    /// The P2P topology between `nic` and `peer`.
    fn p2p_topology(&self, nic: &str, peer: &str) -> Result<P2pTopology, SysfsError> {
        let (nic, peer) = (normalize_bdf(nic)?, normalize_bdf(peer)?);
        for b in [&nic, &peer] {
            let d = self.device_dir(b);
            read_hex_u16(&d.join("vendor")).ok_or_else(|| SysfsError::NoFunction {
                bdf: b.clone(),
                path: d.clone(),
            })?;
        }
        let (h1, c1) = self.upstream_path(&nic)?;
        let (h2, c2) = self.upstream_path(&peer)?;
        let common = if h1 == h2 {
            c1.iter().zip(&c2).take_while(|(a, b)| a == b).count()
        } else {
            0
        };
        // Up from the NIC to the lowest common bridge (included), then down to the peer.
        let mut path: Vec<String> = c1[common.saturating_sub(1)..]
            .iter()
            .rev()
            .cloned()
            .collect();
        if common == 0 {
            path = c1.iter().rev().cloned().collect();
        }
        path.extend(c2[common..].iter().cloned());
        Ok(P2pTopology {
            groups: (self.iommu_group_of(&nic), self.iommu_group_of(&peer)),
            root_ports: (c1.first().cloned(), c2.first().cloned()),
            host_bridges: (h1, h2),
            path: path
                .into_iter()
                .map(|bdf| Bridge {
                    acs: self.acs_of(&bdf),
                    bdf,
                })
                .collect(),
            nic,
            peer,
        })
    }
}

#[cfg(test)]
mod tests;

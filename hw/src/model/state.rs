//! The device's state: the lifecycle state machine and the resource tables.
//!
//! One `Core` lives behind a mutex in `Shared`; the device thread holds it while it runs a
//! batch of commands or doorbells, and `Hca::reset` replaces it with a fresh one. Adding a
//! resource kind (CQ, QP, MKey, MEMIC) means adding a table here and handlers in `cmd/`.

use std::collections::BTreeMap;

use super::ModelConfig;
use super::caps::CapSet;
use super::eq::Eq;
use super::lifecycle::Lifecycle;
use super::memic::Memic;
use super::mkey::MkeyTable;
use super::model_config::{FIRST_QPN, MAX_FIRST_QPN};
use super::pages::Pages;
use super::queues::DataPath;
use super::table::IdAlloc;
use super::vport::{RegState, Vport};

/// Everything a function-level reset forgets.
pub(crate) struct Core {
    pub(crate) life: Lifecycle,
    /// Current ISSI (SET_ISSI).
    pub(crate) issi: u16,
    /// CUR capability pages.
    pub(crate) caps: CapSet,
    /// Firmware pages.
    pub(crate) pages: Pages,
    /// UAR indexes (BAR0 page numbers).
    pub(crate) uars: IdAlloc,
    /// Protection domains.
    pub(crate) pds: IdAlloc,
    /// Event queues by EQ number.
    pub(crate) eqs: BTreeMap<u32, Eq>,
    /// Vport state: RoCE enable, MTU, GID table.
    pub(crate) vport: Vport,
    /// HOST_ENDIANNESS register (`he` byte) as last written.
    pub(crate) host_endianness: u8,
    /// The writable access registers (PAOS, PTYS, PMTU, NODE_DESC).
    pub(crate) regs: RegState,
    /// SET_DRIVER_VERSION string.
    pub(crate) driver_version: Vec<u8>,
    /// CQ numbers (from 1: 0 marks an empty CQ doorbell).
    pub(crate) cqns: IdAlloc,
    /// QP numbers (from 2: 0 and 1 are the special QPs' numbers on the wire, IBA Vol. 1
    /// §3.5.8; the GSI QP answers to 1 whatever its own number, `ud.rs`).
    pub(crate) qpns: IdAlloc,
    /// CQs and QPs (prm-subset.md §6.5, §6.6).
    pub(crate) dp: Box<DataPath>,
    /// Memory keys (prm-subset.md §6.7).
    pub(crate) mkeys: MkeyTable,
    /// MEMIC allocations (prm-subset.md §11).
    pub(crate) memic: Memic,
    /// Transport domains (ALLOC_TRANSPORT_DOMAIN; docs/spec/mlx5-ib-objects.md §7).
    pub(crate) tds: IdAlloc,
    /// XRC domains (ALLOC_XRCD; docs/spec/mlx5-ib-objects.md §1).
    pub(crate) xrcds: IdAlloc,
    /// SRQ, XRC SRQ and RMP numbers, one space (`srq.rs`).
    pub(crate) srqns: IdAlloc,
}

impl Core {
    pub(crate) fn new(cfg: &ModelConfig) -> Core {
        Core {
            life: Lifecycle::Disabled,
            issi: 0,
            caps: CapSet::new(cfg),
            pages: Pages::new(cfg),
            uars: IdAlloc::new(
                crate::layout::uar::FIRST_UAR_INDEX,
                super::bar_layout::UAR_INDEX_END,
            ),
            pds: IdAlloc::new(1, 1 << super::caps::LOG_MAX_PD),
            eqs: BTreeMap::new(),
            vport: Vport::new(cfg),
            host_endianness: 0,
            regs: RegState::new(),
            driver_version: Vec::new(),
            cqns: IdAlloc::new(1, 1 << super::caps::LOG_MAX_CQ),
            // QPNs 0 and 1 are the subnet management and general services QPs (IBA
            // §10.2.3): a peer delivers packets for QP1 to its GSI QP (rxe: RC opcodes to
            // it are dropped) and Wireshark decodes their payloads as MADs. An RC QP gets
            // 2 and up (docs/spec/rocev2-net.md §3).
            qpns: IdAlloc::new(
                if (FIRST_QPN..MAX_FIRST_QPN).contains(&cfg.first_qpn) {
                    cfg.first_qpn
                } else {
                    FIRST_QPN
                },
                1 << super::caps::LOG_MAX_QP,
            ),
            dp: Box::default(),
            mkeys: MkeyTable::new(super::caps::LOG_MAX_MKEY),
            memic: Memic::new(
                super::bar_layout::MEMIC_OFFSET as u64,
                u64::from(cfg.memic_size),
                super::caps::LOG_MAX_MEMIC_ALIGN,
            ),
            tds: IdAlloc::new(1, 1 << super::caps::LOG_MAX_TRANSPORT_DOMAIN),
            xrcds: IdAlloc::new(1, 1 << super::caps::LOG_MAX_XRCD),
            srqns: IdAlloc::new(1, 1 << super::caps::LOG_MAX_SRQ),
        }
    }

    /// Objects that consume an ICM page each (prm-subset.md §10; budget in `pages.rs`).
    pub(crate) fn icm_objects(&self) -> u32 {
        (self.uars.len() + self.pds.len() + self.eqs.len()) as u32 + self.mkeys.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qpns_start_at_the_configured_first_qpn_and_bad_values_fall_back_to_2() {
        use crate::model::ModelConfig;
        let first = |q| {
            let cfg = ModelConfig {
                first_qpn: q,
                ..ModelConfig::default()
            };
            Core::new(&cfg).qpns.alloc()
        };
        assert_eq!(first(FIRST_QPN), Some(2));
        assert_eq!(first(0x1234), Some(0x1234));
        assert_eq!(first(0), Some(2), "QPN 0 is the SMI QP");
        assert_eq!(first(1), Some(2), "QPN 1 is the GSI QP");
        assert_eq!(first(MAX_FIRST_QPN), Some(2), "the top half stays free");
        for _ in 0..100 {
            let q = ModelConfig::run_first_qpn();
            assert!((FIRST_QPN..MAX_FIRST_QPN).contains(&q), "{q:#x}");
        }
    }
}

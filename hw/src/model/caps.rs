//! Capability pages (prm-subset.md §8): the model's values are the documented constants
//! below. MAX pages never change; CUR pages start equal to MAX except where a field is
//! "on request" (set by SET_HCA_CAP), and SET_HCA_CAP may only lower or enable what MAX
//! allows.

use crate::layout::caps::{AtomicCaps, CmdHcaCap, CmdHcaCap2, DeviceMemCap, RoceCap};
use crate::layout::cmd::{CAP_SIZE, CapType};
use crate::layout::{Buf, BufMut};

use super::{ModelConfig, bar_layout};

/// `log_max_qp`: 2^16 QPs.
pub(crate) const LOG_MAX_QP: u32 = 16;
// `ModelConfig::first_qpn` is taken only in the bottom half of the QPN space.
const _: () = assert!(super::model_config::MAX_FIRST_QPN == 1 << (LOG_MAX_QP - 1));
/// `log_max_qp_sz`: 2^15 WQEs per queue.
pub(crate) const LOG_MAX_QP_SZ: u32 = 15;
/// `log_max_cq`: 2^16 CQs.
pub(crate) const LOG_MAX_CQ: u32 = 16;
/// `log_max_cq_sz`: 2^22 CQEs per CQ.
pub(crate) const LOG_MAX_CQ_SZ: u32 = 22;
/// `log_max_eq`: 2^4 EQs.
pub(crate) const LOG_MAX_EQ: u32 = 4;
/// `log_max_eq_sz`: 2^22 EQEs per EQ.
pub(crate) const LOG_MAX_EQ_SZ: u32 = 22;
/// `log_max_mkey`: 2^20 MKeys.
pub(crate) const LOG_MAX_MKEY: u32 = 20;
/// `log_max_transport_domain`: 2^16 transport domains.
pub(crate) const LOG_MAX_TRANSPORT_DOMAIN: u32 = 16;
/// `log_max_xrcd`: 2^16 XRC domains (docs/spec/mlx5-ib-objects.md §1).
pub(crate) const LOG_MAX_XRCD: u32 = 16;
/// `log_max_srq`: 2^16 SRQs, XRC SRQs and RMPs together (`srq.rs`).
pub(crate) const LOG_MAX_SRQ: u32 = 16;
/// `log_max_srq_sz`: 2^15 WQEs per SRQ.
pub(crate) const LOG_MAX_SRQ_SZ: u32 = 15;
/// `log_max_pd`: 2^18 PDs.
pub(crate) const LOG_MAX_PD: u32 = 18;
/// `log_max_mrw_sz`: MRs up to 2^46 bytes.
pub(crate) const LOG_MAX_MRW_SZ: u32 = 46;
/// `log_max_msg`: messages up to 2^30 bytes (1 GiB, as ConnectX).
pub(crate) const LOG_MAX_MSG: u32 = 30;
/// `log_max_ra_req_qp` / `log_max_ra_res_qp`: 16 outstanding RDMA READ / atomics per QP.
pub(crate) const LOG_MAX_RA: u32 = 4;
/// `log_bf_reg_size`: 512-byte BlueFlame registers (two 256-byte buffers).
pub(crate) const LOG_BF_REG_SIZE: u32 = 9;
/// `max_wqe_sz_sq`: 1 KiB send WQEs.
pub(crate) const MAX_WQE_SZ_SQ: u32 = 1024;
/// `max_wqe_sz_rq`: 512-byte receive WQEs.
pub(crate) const MAX_WQE_SZ_RQ: u32 = 512;
/// `gid_table_size` and `roce_address_table_size`.
pub(crate) const GID_TABLE_SIZE: u32 = 16;
/// `pkey_table_size` (encoded as in `mlx5_ifc.h`: 0 = 128 entries).
pub(crate) const PKEY_TABLE_SIZE: u32 = 0;
/// `device_frequency_khz`: the internal timer counts nanoseconds (1 GHz).
pub(crate) const DEVICE_FREQUENCY_KHZ: u32 = 1_000_000;
/// `local_ca_ack_delay` (2^n * 4.096 us).
pub(crate) const LOCAL_CA_ACK_DELAY: u32 = 16;
/// `max_mkey_log_entity_size_mtt` (CAP_2): MTT pages up to 1 GiB (prm-subset.md §7.5).
pub(crate) const MAX_MKEY_LOG_ENTITY_SIZE_MTT: u32 = 30;
/// `log_max_memic_addr_alignment`: up to 2^(6 + 12) = 256 KiB alignment.
pub(crate) const LOG_MAX_MEMIC_ALIGN: u32 = 12;
/// `log_min_memic_alloc_size`: 64-byte allocation granularity.
pub(crate) const LOG_MIN_MEMIC_ALLOC: u32 = 6;
/// `r_roce_dest_udp_port`: the IANA RoCEv2 port.
pub(crate) const ROCE_V2_UDP_PORT: u32 = 4791;

/// The pages the model has: `(type, MAX, CUR)`.
#[derive(Clone)]
pub(crate) struct CapSet {
    pages: Vec<(CapType, Vec<u8>, Vec<u8>)>,
}

impl CapSet {
    /// Power-on capabilities for `cfg`.
    pub(crate) fn new(cfg: &ModelConfig) -> CapSet {
        let mut general = page();
        fill_general(&mut general);
        let mut general_cur = general.clone();
        {
            // Off until the driver asks for them (Linux sets these when MAX has them).
            let mut c = CmdHcaCap::new_unchecked(&mut general_cur[..]);
            c.set_release_all_pages(0);
            c.set_cmdif_checksum(0);
            c.set_drain_sigerr(0);
        }
        let mut general2 = page();
        {
            let mut c = CmdHcaCap2::new_unchecked(&mut general2[..]);
            c.set_max_num_eqs_24b(1 << LOG_MAX_EQ);
            c.set_max_mkey_log_entity_size_mtt(MAX_MKEY_LOG_ENTITY_SIZE_MTT);
        }
        let mut dev_mem = page();
        {
            let mut d = DeviceMemCap::new_unchecked(&mut dev_mem[..]);
            d.set_memic(1);
            d.set_log_min_memic_alloc_size(LOG_MIN_MEMIC_ALLOC);
            d.set_log_max_memic_addr_alignment(LOG_MAX_MEMIC_ALIGN);
            d.set_memic_bar_start_addr(bar_layout::MEMIC_OFFSET as u64);
            d.set_memic_bar_size(cfg.memic_size);
            d.set_max_memic_size(cfg.memic_size);
        }
        let mut atomic = page();
        {
            let mut a = AtomicCaps::new_unchecked(&mut atomic[..]);
            // 8-byte IB atomics (CMP_SWAP, FETCH_ADD), big-endian requests by default.
            a.set_atomic_operations(0x3);
            a.set_atomic_size_qp(0x8);
            a.set_atomic_size_dc(0x8);
            a.set_supported_atomic_req_8B_endianness_mode_1(1);
        }
        let mut roce = page();
        {
            let mut r = RoceCap::new_unchecked(&mut roce[..]);
            r.set_sw_r_roce_src_udp_port(1);
            r.set_fl_rc_qp_when_roce_enabled(1);
            r.set_l3_type(0b110); // IPv4 and IPv6
            r.set_roce_version(0b100); // RoCEv2
            r.set_r_roce_dest_udp_port(ROCE_V2_UDP_PORT);
            r.set_r_roce_max_src_udp_port(0xFFFF);
            r.set_r_roce_min_src_udp_port(0xC000);
            r.set_roce_address_table_size(GID_TABLE_SIZE);
        }
        let both = |t, p: Vec<u8>| (t, p.clone(), p);
        CapSet {
            pages: vec![
                (CapType::General, general, general_cur),
                both(CapType::General2, general2),
                both(CapType::DevMem, dev_mem),
                both(CapType::Atomic, atomic),
                both(CapType::Roce, roce),
            ],
        }
    }

    /// The MAX (`cur` false) or CUR page of `t`, if the model has that capability type.
    pub(crate) fn get(&self, t: CapType, cur: bool) -> Option<&[u8]> {
        self.pages
            .iter()
            .find(|(k, ..)| *k == t)
            .map(|(_, max, c)| if cur { &c[..] } else { &max[..] })
    }

    /// The CUR general page.
    #[allow(dead_code, reason = "used by the data path and atomics")]
    pub(crate) fn general(&self) -> CmdHcaCap<&[u8]> {
        CmdHcaCap::new_unchecked(self.get(CapType::General, true).expect("general caps"))
    }

    /// The CUR atomic page.
    #[allow(dead_code, reason = "used by the data path and atomics")]
    pub(crate) fn atomic(&self) -> AtomicCaps<&[u8]> {
        AtomicCaps::new_unchecked(self.get(CapType::Atomic, true).expect("atomic caps"))
    }

    /// SET_HCA_CAP: applies the settable fields of `req` to the CUR page of `t`. Fields that
    /// are not settable are ignored (as firmware does); a settable field above MAX is
    /// refused with `Err(field name)` and nothing changes.
    pub(crate) fn set(&mut self, t: CapType, req: &[u8]) -> Result<(), Option<&'static str>> {
        let Some((_, max, cur)) = self.pages.iter_mut().find(|(k, ..)| *k == t) else {
            return Err(None);
        };
        let settable: &[(&'static str, usize, u32, u32)] = match t {
            CapType::General => &[
                ("log_max_qp", 0x010, 4, 0),
                ("pkey_table_size", 0x030, 15, 0),
                ("cmdif_checksum", 0x040, 15, 14),
                ("drain_sigerr", 0x040, 16, 16),
                ("cache_line_128byte", 0x02c, 27, 27),
                ("release_all_pages", 0x028, 26, 26),
                ("uar_4k", 0x048, 31, 31),
                ("log_uar_page_sz", 0x090, 15, 0),
                ("mkey_by_name", 0x04c, 25, 25),
                ("disable_link_up", 0x034, 11, 11),
            ],
            CapType::Atomic => &[("atomic_req_8B_endianness_mode", 0x008, 31, 30)],
            CapType::Roce => &[("sw_r_roce_src_udp_port", 0x000, 27, 27)],
            _ => &[],
        };
        let mut next = cur.clone();
        for &(name, off, msb, lsb) in settable {
            let v = req.get_bits(off, msb, lsb);
            let limit = match name {
                // Enumerations, not limits: any MAX-supported mode may be chosen.
                "atomic_req_8B_endianness_mode" => {
                    if max.get_bits(0x008, 25, 25) == 1 {
                        1
                    } else {
                        0
                    }
                }
                "pkey_table_size" | "log_uar_page_sz" | "disable_link_up" => u32::MAX,
                "cmdif_checksum" => 0, // signatures are not supported (§3.4)
                "drain_sigerr" | "release_all_pages" | "cache_line_128byte" | "mkey_by_name" => 1,
                _ => max.get_bits(off, msb, lsb),
            };
            if v > limit {
                return Err(Some(name));
            }
            next.set_bits(off, msb, lsb, v);
        }
        *cur = next;
        Ok(())
    }
}

fn page() -> Vec<u8> {
    vec![0u8; CAP_SIZE]
}

/// The MAX general page (prm-subset.md §8.2).
fn fill_general(p: &mut [u8]) {
    let mut c = CmdHcaCap::new_unchecked(&mut *p);
    c.set_hca_cap_2(1);
    c.set_log_max_srq_sz(LOG_MAX_SRQ_SZ);
    c.set_log_max_srq(LOG_MAX_SRQ);
    // XRC domains and XRC SRQs (model/cmd/srq.rs); no XRC QPs yet.
    c.set_xrc(1);
    c.set_log_max_xrcd(LOG_MAX_XRCD);
    c.set_log_max_qp_sz(LOG_MAX_QP_SZ);
    c.set_log_max_qp(LOG_MAX_QP);
    c.set_log_max_cq_sz(LOG_MAX_CQ_SZ);
    c.set_log_max_cq(LOG_MAX_CQ);
    c.set_log_max_eq_sz(LOG_MAX_EQ_SZ);
    c.set_log_max_mkey(LOG_MAX_MKEY);
    c.set_log_max_eq(LOG_MAX_EQ);
    c.set_log_max_mrw_sz(LOG_MAX_MRW_SZ);
    c.set_release_all_pages(1);
    c.set_log_max_ra_req_qp(LOG_MAX_RA);
    c.set_log_max_ra_res_qp(LOG_MAX_RA);
    c.set_cache_line_128byte(1);
    c.set_gid_table_size(GID_TABLE_SIZE);
    c.set_pkey_table_size(PKEY_TABLE_SIZE);
    c.set_device_memory(1);
    // MCAM, MCQS and MCQI (the firmware version devlink reports; model/cmd/reg.rs).
    c.set_mcam_reg(1);
    c.set_local_ca_ack_delay(LOCAL_CA_ACK_DELAY);
    c.set_port_type(1); // Ethernet
    c.set_num_ports(1);
    c.set_log_max_msg(LOG_MAX_MSG);
    c.set_cqe_version(1);
    c.set_cmdif_checksum(0);
    c.set_drain_sigerr(1);
    c.set_roce(1);
    c.set_atomic(1);
    // The transports the model runs (QpKind::from_st): RC and UD. UC is not modelled, so
    // its bit stays 0 and CREATE_QP refuses it (QP_BAD_ST); Linux's mlx5_ib does not read
    // the bit and passes UC QPs on (rdma-core's UC tests fail through the mlx5 judge).
    c.set_rc(1);
    c.set_ud(1);
    c.set_umem_uid_0(1);
    c.set_log_pg_sz(12);
    c.set_bf(1);
    c.set_driver_version(1);
    c.set_log_bf_reg_size(LOG_BF_REG_SIZE);
    c.set_max_wqe_sz_sq(MAX_WQE_SZ_SQ);
    c.set_max_wqe_sz_rq(MAX_WQE_SZ_RQ);
    c.set_log_max_transport_domain(LOG_MAX_TRANSPORT_DOMAIN);
    c.set_log_max_pd(LOG_MAX_PD);
    c.set_max_num_eqs(1 << LOG_MAX_EQ);
    c.set_log_uar_page_sz(0);
    c.set_device_frequency_khz(DEVICE_FREQUENCY_KHZ);
    c.set_device_frequency_mhz(DEVICE_FREQUENCY_KHZ / 1000);
    c.set_num_of_uars_per_page(1);
    // QUERY_VPORT_COUNTER (model/cmd/vport.rs).
    crate::layout::cmds::set_cap_vport_counters(p, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_refuses_above_max_and_changes_nothing() {
        let mut caps = CapSet::new(&ModelConfig::default());
        let mut req = caps.get(CapType::General, true).unwrap().to_vec();
        CmdHcaCap::new_unchecked(&mut req[..]).set_log_max_qp(LOG_MAX_QP + 1);
        assert_eq!(caps.set(CapType::General, &req), Err(Some("log_max_qp")));
        assert_eq!(caps.general().log_max_qp(), LOG_MAX_QP);
        CmdHcaCap::new_unchecked(&mut req[..]).set_log_max_qp(10);
        caps.set(CapType::General, &req).unwrap();
        assert_eq!(caps.general().log_max_qp(), 10);
    }

    #[test]
    fn read_only_fields_are_ignored() {
        let mut caps = CapSet::new(&ModelConfig::default());
        let mut req = caps.get(CapType::General, true).unwrap().to_vec();
        CmdHcaCap::new_unchecked(&mut req[..]).set_log_max_pd(1);
        caps.set(CapType::General, &req).unwrap();
        assert_eq!(caps.general().log_max_pd(), LOG_MAX_PD);
        assert_eq!(caps.set(CapType::Odp, &req), Err(None));
    }
}

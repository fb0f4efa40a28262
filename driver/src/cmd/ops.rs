//! Typed commands: one function per firmware command, built on the shared layouts.

use uhca_layout::cmd::{CAP_MODE_CUR, CAP_SIZE, CapType, ManagePagesOpMod, Opcode};
use uhca_layout::cmds::*;
use uhca_layout::eqc::Eqc;
use uhca_layout::vport::{NicVportContext, RoceAddrLayout};
use uhca_layout::{Buf, BufMut};

use super::{CmdError, input};
use crate::pci::Iova;

/// Something that executes commands (the device, with its waiting policy).
pub trait Exec {
    /// Executes a command on a regular slot.
    fn exec(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError>;
    /// Executes a firmware-page command on the reserved slot.
    fn exec_pages(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError>;
}

/// ENABLE_HCA for our own function.
pub fn enable_hca(c: &dyn Exec) -> Result<(), CmdError> {
    c.exec(&input(Opcode::EnableHca, 0, 16), 16).map(drop)
}

/// DISABLE_HCA for our own function.
pub fn disable_hca(c: &dyn Exec) -> Result<(), CmdError> {
    c.exec(&input(Opcode::DisableHca, 0, 16), 16).map(drop)
}

/// QUERY_ISSI: returns (current_issi, supported_issi_dw0).
pub fn query_issi(c: &dyn Exec) -> Result<(u32, u32), CmdError> {
    let out = c.exec(&input(Opcode::QueryIssi, 0, 16), QueryIssiOut::<()>::SIZE)?;
    let o = QueryIssiOut::new_unchecked(&out[..]);
    Ok((o.current_issi(), o.supported_issi_dw0()))
}

/// SET_ISSI.
pub fn set_issi(c: &dyn Exec, issi: u32) -> Result<(), CmdError> {
    let mut i = input(Opcode::SetIssi, 0, SetIssiIn::<()>::SIZE);
    SetIssiIn::new_unchecked(&mut i[..]).set_current_issi(issi);
    c.exec(&i, 16).map(drop)
}

/// QUERY_PAGES with `op_mod` (1 boot, 2 init, 3 regular): returns the signed page count.
pub fn query_pages(c: &dyn Exec, op_mod: u16) -> Result<i32, CmdError> {
    let out = c.exec(
        &input(Opcode::QueryPages, op_mod, 16),
        QueryPagesOut::<()>::SIZE,
    )?;
    Ok(QueryPagesOut::new_unchecked(&out[..]).num_pages() as i32)
}

/// MANAGE_PAGES GIVE of `pages` (4 KiB-aligned device addresses).
pub fn give_pages(c: &dyn Exec, pages: &[Iova]) -> Result<(), CmdError> {
    let mut i = input(
        Opcode::ManagePages,
        ManagePagesOpMod::Give.into(),
        16 + 8 * pages.len(),
    );
    ManagePagesIn::new_unchecked(&mut i[..]).set_input_num_entries(pages.len() as u32);
    for (k, p) in pages.iter().enumerate() {
        i.write_be64(ManagePagesIn::<()>::PAS + 8 * k, p.0);
    }
    c.exec_pages(&i, 16).map(drop)
}

/// MANAGE_PAGES CANT_GIVE: tells the device a page request cannot be met.
pub fn cant_give_pages(c: &dyn Exec) -> Result<(), CmdError> {
    c.exec_pages(
        &input(Opcode::ManagePages, ManagePagesOpMod::CantGive.into(), 16),
        16,
    )
    .map(drop)
}

/// MANAGE_PAGES TAKE of up to `count` pages: returns the addresses the device gave back.
pub fn take_pages(c: &dyn Exec, count: u32) -> Result<Vec<Iova>, CmdError> {
    let mut i = input(Opcode::ManagePages, ManagePagesOpMod::Take.into(), 16);
    ManagePagesIn::new_unchecked(&mut i[..]).set_input_num_entries(count);
    let out = c.exec_pages(&i, 16 + 8 * count as usize)?;
    let n = ManagePagesOut::new_unchecked(&out[..]).output_num_entries();
    if n > count {
        // More than asked for is corruption (prm-subset.md §10).
        return Err(CmdError::DeviceDead(format!(
            "MANAGE_PAGES TAKE returned {n} > {count} pages"
        )));
    }
    Ok((0..n as usize)
        .map(|k| Iova(out.read_be64(ManagePagesOut::<()>::PAS + 8 * k)))
        .collect())
}

/// QUERY_HCA_CAP of `cap` (current or maximum values): the 4 KiB capability page.
pub fn query_hca_cap(c: &dyn Exec, cap: CapType, cur: bool) -> Result<Vec<u8>, CmdError> {
    let op_mod = (u16::from(cap) << 1) | if cur { CAP_MODE_CUR } else { 0 };
    let out = c.exec(
        &input(Opcode::QueryHcaCap, op_mod, 16),
        QueryHcaCapOut::<()>::SIZE,
    )?;
    Ok(out[QueryHcaCapOut::<()>::CAPABILITY..].to_vec())
}

/// SET_HCA_CAP of `cap` with a full 4 KiB capability page.
pub fn set_hca_cap(c: &dyn Exec, cap: CapType, page: &[u8]) -> Result<(), CmdError> {
    let mut i = input(
        Opcode::SetHcaCap,
        u16::from(cap) << 1,
        SetHcaCapIn::<()>::SIZE,
    );
    let n = page.len().min(CAP_SIZE);
    i[SetHcaCapIn::<()>::CAPABILITY..][..n].copy_from_slice(&page[..n]);
    c.exec(&i, 16).map(drop)
}

/// ACCESS_REG write of the HOST_ENDIANNESS register (prm-subset.md §4 step 5).
pub fn set_host_endianness(c: &dyn Exec) -> Result<(), CmdError> {
    let mut i = input(Opcode::AccessReg, 0, 16 + 16);
    AccessRegisterIn::new_unchecked(&mut i[..]).set_register_id(0x7004);
    i[AccessRegisterIn::<()>::REGISTER_DATA] = if cfg!(target_endian = "big") { 0x80 } else { 0 };
    c.exec(&i, 16 + 16).map(drop)
}

/// INIT_HCA.
pub fn init_hca(c: &dyn Exec) -> Result<(), CmdError> {
    c.exec(&input(Opcode::InitHca, 0, InitHcaIn::<()>::SIZE), 16)
        .map(drop)
}

/// TEARDOWN_HCA with the graceful profile.
pub fn teardown_hca(c: &dyn Exec) -> Result<(), CmdError> {
    c.exec(
        &input(Opcode::TeardownHca, 0, 16),
        TeardownHcaOut::<()>::SIZE,
    )
    .map(drop)
}

/// QUERY_ADAPTER: returns the board id (PSID) and vendor id.
pub fn query_adapter(c: &dyn Exec) -> Result<(String, u32), CmdError> {
    let out = c.exec(
        &input(Opcode::QueryAdapter, 0, 16),
        QueryAdapterOut::<()>::SIZE,
    )?;
    let o = QueryAdapterOut::new_unchecked(&out[..]);
    let psid = o.vsd_contd_psid();
    let end = psid.iter().position(|&b| b == 0).unwrap_or(psid.len());
    Ok((
        String::from_utf8_lossy(&psid[..end]).into_owned(),
        o.ieee_vendor_id(),
    ))
}

/// ALLOC_UAR: returns the UAR index.
pub fn alloc_uar(c: &dyn Exec) -> Result<u32, CmdError> {
    let out = c.exec(&input(Opcode::AllocUar, 0, 16), AllocUarOut::<()>::SIZE)?;
    Ok(AllocUarOut::new_unchecked(&out[..]).uar())
}

/// DEALLOC_UAR.
pub fn dealloc_uar(c: &dyn Exec, uar: u32) -> Result<(), CmdError> {
    let mut i = input(Opcode::DeallocUar, 0, 16);
    DeallocUarIn::new_unchecked(&mut i[..]).set_uar(uar);
    c.exec(&i, 16).map(drop)
}

/// ALLOC_PD: returns the PD number.
pub fn alloc_pd(c: &dyn Exec) -> Result<u32, CmdError> {
    let out = c.exec(&input(Opcode::AllocPd, 0, 16), AllocPdOut::<()>::SIZE)?;
    Ok(AllocPdOut::new_unchecked(&out[..]).pd())
}

/// DEALLOC_PD.
pub fn dealloc_pd(c: &dyn Exec, pd: u32) -> Result<(), CmdError> {
    let mut i = input(Opcode::DeallocPd, 0, 16);
    DeallocPdIn::new_unchecked(&mut i[..]).set_pd(pd);
    c.exec(&i, 16).map(drop)
}

/// Parameters of CREATE_EQ.
#[derive(Clone, Debug)]
pub struct CreateEq<'a> {
    /// log2 of the number of entries.
    pub log_eq_size: u32,
    /// UAR index for the EQ's doorbells.
    pub uar_page: u32,
    /// MSI-X vector.
    pub intr: u32,
    /// Event types subscribed (bit t of word 0 = type t).
    pub event_bitmask: u64,
    /// 4 KiB pages of the EQ buffer.
    pub pages: &'a [Iova],
}

/// CREATE_EQ: returns the EQ number.
pub fn create_eq(c: &dyn Exec, p: &CreateEq<'_>) -> Result<u32, CmdError> {
    let base = CreateEqIn::<()>::PAS;
    let mut i = input(Opcode::CreateEq, 0, base + 8 * p.pages.len());
    {
        let mut eqc = Eqc::new_unchecked(&mut i[CreateEqIn::<()>::EQ_CONTEXT_ENTRY..]);
        eqc.set_log_eq_size(p.log_eq_size);
        eqc.set_uar_page(p.uar_page);
        eqc.set_intr(p.intr);
        eqc.set_log_page_size(0);
    }
    let mut mask = [0u8; 32];
    mask[..8].copy_from_slice(&p.event_bitmask.to_be_bytes());
    CreateEqIn::new_unchecked(&mut i[..]).set_event_bitmask(&mask);
    for (k, pg) in p.pages.iter().enumerate() {
        i.write_be64(base + 8 * k, pg.0);
    }
    let out = c.exec(&i, CreateEqOut::<()>::SIZE)?;
    Ok(CreateEqOut::new_unchecked(&out[..]).eq_number())
}

/// DESTROY_EQ.
pub fn destroy_eq(c: &dyn Exec, eqn: u32) -> Result<(), CmdError> {
    let mut i = input(Opcode::DestroyEq, 0, 16);
    DestroyEqIn::new_unchecked(&mut i[..]).set_eq_number(eqn);
    c.exec(&i, 16).map(drop)
}

/// Port facts from the NIC vport context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicVport {
    /// Permanent MAC address.
    pub mac: [u8; 6],
    /// MTU in bytes.
    pub mtu: u32,
    /// RoCE enabled.
    pub roce_en: bool,
    /// Datagrams the port dropped for a wrong Q_Key (`qkey_violation_counter`, a 16-bit
    /// counter that stops at its maximum; `ibv_port_attr.qkey_viol_cntr`).
    pub qkey_violations: u16,
}

/// L2 framing the hardware MTU counts beyond the netdev MTU: Ethernet header (14), one
/// VLAN tag (4) and the FCS (4), as Linux `MLX5E_HW2SW_MTU` subtracts it.
pub const HW_MTU_OVERHEAD: u32 = 22;

/// The RoCE path MTU for a port with hardware MTU `hw_mtu`: the largest IB MTU (256, 512,
/// 1024, 2048, 4096) not above the netdev MTU, as Linux `ib_mtu_int_to_enum` picks it
/// (RoCE headers fit in the difference).
pub fn roce_mtu(hw_mtu: u32) -> u32 {
    let eth = hw_mtu.saturating_sub(HW_MTU_OVERHEAD);
    [4096, 2048, 1024, 512]
        .into_iter()
        .find(|&m| eth >= m)
        .unwrap_or(256)
}

/// QUERY_NIC_VPORT_CONTEXT of our own vport.
pub fn query_nic_vport_context(c: &dyn Exec) -> Result<NicVport, CmdError> {
    let out = c.exec(
        &input(Opcode::QueryNicVportContext, 0, 16),
        16 + NicVportContext::<()>::SIZE,
    )?;
    let v = NicVportContext::new_unchecked(&out[16..]);
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&out[16 + 0xf6..16 + 0xfc]);
    Ok(NicVport {
        mac,
        mtu: v.mtu(),
        roce_en: v.roce_en() == 1,
        qkey_violations: v.qkey_violation_counter() as u16,
    })
}

/// MODIFY_NIC_VPORT_CONTEXT setting `roce_en` (rdma-core vfio does this after INIT_HCA).
pub fn enable_roce(c: &dyn Exec) -> Result<(), CmdError> {
    let mut i = input(
        Opcode::ModifyNicVportContext,
        0,
        0x100 + NicVportContext::<()>::SIZE,
    );
    i.set_bits(0x0c, 1, 1, 1); // field_select.roce_en
    NicVportContext::new_unchecked(&mut i[0x100..]).set_roce_en(1);
    c.exec(&i, 16).map(drop)
}

/// QUERY_VPORT_STATE: returns (admin_state, state).
pub fn query_vport_state(c: &dyn Exec) -> Result<(u32, u32), CmdError> {
    let out = c.exec(
        &input(Opcode::QueryVportState, 0, 16),
        QueryVportStateOut::<()>::SIZE,
    )?;
    let o = QueryVportStateOut::new_unchecked(&out[..]);
    Ok((o.admin_state(), o.state()))
}

/// One `traffic_counter` of QUERY_VPORT_COUNTER: packets and octets (64-bit each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCounter {
    /// Packets.
    pub packets: u64,
    /// Octets (bytes).
    pub octets: u64,
}

/// What QUERY_VPORT_COUNTER reports (Linux `mlx5_ifc.h` `query_vport_counter_out`): the
/// vport's traffic counters. `*_ib_*` are the RoCE (RDMA) traffic, `*_eth_*` other
/// Ethernet traffic steered to or from the vport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VportCounters {
    /// Received packets dropped as errors.
    pub received_errors: TrafficCounter,
    /// Packets that failed to transmit.
    pub transmit_errors: TrafficCounter,
    /// Received unicast RoCE.
    pub received_ib_unicast: TrafficCounter,
    /// Transmitted unicast RoCE.
    pub transmitted_ib_unicast: TrafficCounter,
    /// Received multicast RoCE.
    pub received_ib_multicast: TrafficCounter,
    /// Transmitted multicast RoCE.
    pub transmitted_ib_multicast: TrafficCounter,
    /// Received Ethernet broadcast.
    pub received_eth_broadcast: TrafficCounter,
    /// Transmitted Ethernet broadcast.
    pub transmitted_eth_broadcast: TrafficCounter,
    /// Received Ethernet unicast.
    pub received_eth_unicast: TrafficCounter,
    /// Transmitted Ethernet unicast.
    pub transmitted_eth_unicast: TrafficCounter,
    /// Received Ethernet multicast.
    pub received_eth_multicast: TrafficCounter,
    /// Transmitted Ethernet multicast.
    pub transmitted_eth_multicast: TrafficCounter,
    /// Traffic looped back inside the device (when `vport_counter_local_loopback`).
    pub local_loopback: TrafficCounter,
}

/// QUERY_VPORT_COUNTER of our own vport on `port_num` (1-based; 0 = the native port);
/// with `clear` the device zeroes the counters as it reads them.
pub fn query_vport_counter(
    c: &dyn Exec,
    port_num: u32,
    clear: bool,
) -> Result<VportCounters, CmdError> {
    let mut i = input(
        Opcode::QueryVportCounter,
        QUERY_VPORT_COUNTER_OP_MOD_VPORT,
        QueryVportCounterIn::<()>::SIZE,
    );
    {
        let mut q = QueryVportCounterIn::new_unchecked(&mut i[..]);
        q.set_port_num(port_num);
        q.set_clear(u32::from(clear));
    }
    let out = c.exec(&i, QueryVportCounterOut::<()>::SIZE)?;
    let o = QueryVportCounterOut::new_unchecked(&out[..]);
    let t = |packets, octets| TrafficCounter { packets, octets };
    Ok(VportCounters {
        received_errors: t(o.received_errors_packets(), o.received_errors_octets()),
        transmit_errors: t(o.transmit_errors_packets(), o.transmit_errors_octets()),
        received_ib_unicast: t(
            o.received_ib_unicast_packets(),
            o.received_ib_unicast_octets(),
        ),
        transmitted_ib_unicast: t(
            o.transmitted_ib_unicast_packets(),
            o.transmitted_ib_unicast_octets(),
        ),
        received_ib_multicast: t(
            o.received_ib_multicast_packets(),
            o.received_ib_multicast_octets(),
        ),
        transmitted_ib_multicast: t(
            o.transmitted_ib_multicast_packets(),
            o.transmitted_ib_multicast_octets(),
        ),
        received_eth_broadcast: t(
            o.received_eth_broadcast_packets(),
            o.received_eth_broadcast_octets(),
        ),
        transmitted_eth_broadcast: t(
            o.transmitted_eth_broadcast_packets(),
            o.transmitted_eth_broadcast_octets(),
        ),
        received_eth_unicast: t(
            o.received_eth_unicast_packets(),
            o.received_eth_unicast_octets(),
        ),
        transmitted_eth_unicast: t(
            o.transmitted_eth_unicast_packets(),
            o.transmitted_eth_unicast_octets(),
        ),
        received_eth_multicast: t(
            o.received_eth_multicast_packets(),
            o.received_eth_multicast_octets(),
        ),
        transmitted_eth_multicast: t(
            o.transmitted_eth_multicast_packets(),
            o.transmitted_eth_multicast_octets(),
        ),
        local_loopback: t(o.local_loopback_packets(), o.local_loopback_octets()),
    })
}

/// A RoCE GID table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoceAddress {
    /// The GID (IPv6 or IPv4-mapped address).
    pub gid: [u8; 16],
    /// RoCE version (2 = RoCEv2).
    pub roce_version: u32,
    /// L3 type (0 IPv4, 1 IPv6).
    pub l3_type: u32,
    /// Source MAC.
    pub mac: [u8; 6],
}

/// QUERY_ROCE_ADDRESS of GID table entry `index` on port 1.
pub fn query_roce_address(c: &dyn Exec, index: u32) -> Result<RoceAddress, CmdError> {
    let mut i = input(Opcode::QueryRoceAddress, 0, 16);
    i.set_bits(0x08, 31, 16, index);
    i.set_bits(0x08, 3, 0, 1);
    let out = c.exec(&i, 16 + RoceAddrLayout::<()>::SIZE)?;
    let a = RoceAddrLayout::new_unchecked(&out[16..]);
    let mut mac = [0u8; 6];
    mac[..2].copy_from_slice(&(a.source_mac_47_32() as u16).to_be_bytes());
    mac[2..].copy_from_slice(&a.source_mac_31_0().to_be_bytes());
    Ok(RoceAddress {
        gid: a.source_l3_address(),
        roce_version: a.roce_version(),
        l3_type: a.roce_l3_type(),
        mac,
    })
}

/// Reads the `status`/`syndrome` pair of an output message.
pub fn out_header(out: &[u8]) -> (u32, u32) {
    (out.get_bits(0, 31, 24), out.read_be32(4))
}

/// Parameters of CREATE_MKEY (prm-subset.md §6.7, §7.5).
#[derive(Clone, Debug)]
pub struct CreateMkey<'a> {
    /// Access mode (MTT or MEMIC).
    pub access_mode: uhca_layout::mkc::AccessMode,
    /// Owning PD.
    pub pd: u32,
    /// `mkey_7_0`: the variant byte of the key.
    pub variant: u8,
    /// `lw`, `rr`, `rw`, `a` (local read is always set).
    pub rights: [bool; 4],
    /// `start_addr`: the first byte's address (MEMIC: BAR0 offset).
    pub start_addr: u64,
    /// `len`.
    pub len: u64,
    /// `log_page_size` (absolute, MTT mode).
    pub log_page_size: u32,
    /// MTT entries (`address | wr_en << 1 | rd_en`); empty for MEMIC.
    pub mtts: &'a [u64],
}

/// CREATE_MKEY with the MTT list inline (a mailbox chain carries long lists): returns the
/// MKey index.
pub fn create_mkey(c: &dyn Exec, p: &CreateMkey<'_>) -> Result<u32, CmdError> {
    use uhca_layout::mkc::Mkc;
    let octs = p.mtts.len().div_ceil(2);
    let base = CreateMkeyIn::<()>::KLM_PAS_MTT;
    let mut i = input(Opcode::CreateMkey, 0, base + 16 * octs);
    {
        let mut ci = CreateMkeyIn::new_unchecked(&mut i[..]);
        // Honour the entries' rd_en/wr_en (§6.7; rdma-core vfio always sets it).
        ci.set_pg_access(u32::from(!p.mtts.is_empty()));
        ci.set_translations_octword_actual_size(octs as u32);
    }
    {
        let mode = u32::from(p.access_mode);
        let mut m = Mkc::new_unchecked(&mut i[CreateMkeyIn::<()>::MEMORY_KEY_MKEY_ENTRY..]);
        m.set_access_mode_1_0(mode & 3);
        m.set_access_mode_4_2(mode >> 2);
        m.set_lr(1);
        m.set_lw(p.rights[0].into());
        m.set_rr(p.rights[1].into());
        m.set_rw(p.rights[2].into());
        m.set_a(p.rights[3].into());
        m.set_qpn(0xFF_FFFF);
        m.set_mkey_7_0(p.variant.into());
        m.set_pd(p.pd);
        m.set_start_addr(p.start_addr);
        m.set_len(p.len);
        m.set_translations_octword_size(octs as u32);
        m.set_log_page_size(p.log_page_size);
    }
    for (k, e) in p.mtts.iter().enumerate() {
        i.write_be64(base + 8 * k, *e);
    }
    let out = c.exec(&i, CreateMkeyOut::<()>::SIZE)?;
    Ok(CreateMkeyOut::new_unchecked(&out[..]).mkey_index())
}

/// DESTROY_MKEY.
pub fn destroy_mkey(c: &dyn Exec, index: u32) -> Result<(), CmdError> {
    let mut i = input(Opcode::DestroyMkey, 0, 16);
    DestroyMkeyIn::new_unchecked(&mut i[..]).set_mkey_index(index);
    c.exec(&i, 16).map(drop)
}

/// What QUERY_MKEY reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MkeyInfo {
    /// The 64-byte mkc.
    pub mkc: [u8; 64],
    /// The first four translation entries.
    pub mtts: [u64; 4],
}

/// QUERY_MKEY.
pub fn query_mkey(c: &dyn Exec, index: u32) -> Result<MkeyInfo, CmdError> {
    let mut i = input(Opcode::QueryMkey, 0, 16);
    QueryMkeyIn::new_unchecked(&mut i[..]).set_mkey_index(index);
    let out = c.exec(&i, QueryMkeyOut::<()>::SIZE)?;
    let mut mkc = [0u8; 64];
    mkc.copy_from_slice(&out[QueryMkeyOut::<()>::MEMORY_KEY_MKEY_ENTRY..][..64]);
    let mtts = std::array::from_fn(|k| out.read_be64(0x110 + 8 * k));
    Ok(MkeyInfo { mkc, mtts })
}

/// ALLOC_MEMIC: `size` bytes (a multiple of 64) inside `[range_start, range_start +
/// range_size)` aligned to `64 << log_align`; returns the BAR0 offset (§6.8, §11).
pub fn alloc_memic(
    c: &dyn Exec,
    range_start: u64,
    range_size: u32,
    size: u32,
    log_align: u32,
) -> Result<u64, CmdError> {
    let mut i = input(Opcode::AllocMemic, 0, AllocMemicIn::<()>::SIZE);
    {
        let mut a = AllocMemicIn::new_unchecked(&mut i[..]);
        a.set_range_start_addr(range_start);
        a.set_range_size(range_size);
        a.set_memic_size(size);
        a.set_log_memic_addr_alignment(log_align);
    }
    let out = c.exec(&i, AllocMemicOut::<()>::SIZE)?;
    Ok(AllocMemicOut::new_unchecked(&out[..]).memic_start_addr())
}

/// DEALLOC_MEMIC of an allocation (its address and size as allocated).
pub fn dealloc_memic(c: &dyn Exec, addr: u64, size: u32) -> Result<(), CmdError> {
    let mut i = input(Opcode::DeallocMemic, 0, DeallocMemicIn::<()>::SIZE);
    let mut d = DeallocMemicIn::new_unchecked(&mut i[..]);
    d.set_memic_start_addr(addr);
    d.set_memic_size(size);
    c.exec(&i, 16).map(drop)
}

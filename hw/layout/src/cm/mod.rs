//! Communication-manager messages (IBA Vol. 1 §12.6; docs/spec/rdma-cm.md §2-3): REQ,
//! MRA, REJ, REP, RTU, DREQ and DREP, each a 256-byte MAD of class 0x07, version 2,
//! method Send, told apart by the attribute ID.
//!
//! The views lay every field at its byte offset **in the whole MAD** (the IBA tables count
//! from the end of the 24-byte common header: add 0x18). Field names are the IBA names in
//! snake_case, as Linux's `ibta_vol1_c12.h` spells them. Each message has a `Repr`
//! (`ReqRepr`, ...) with `parse` and `emit`; [`CmMessage`] parses any of them from a MAD.
//!
//! The cma header ([`CmaHdr`]) is what librdmacm and the kernel's `rdma_cm` put at the
//! start of a REQ's private data for the IP-based services (docs/spec/rdma-cm.md §4).

use super::mad::{MAD_SIZE, MadError, MadHeader, MgmtClass};
use crate::layout;

/// The CM's class version (IBA Vol. 1 §12.6.2; Linux `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;

crate::enum_with_unknown! {
    /// CM attribute IDs (IBA Vol. 1 §12.6.2 table 103).
    pub enum CmAttr(u16) {
        /// ClassPortInfo.
        ClassPortInfo = 0x0001,
        /// ConnectRequest.
        Req = 0x0010,
        /// MsgRcptAck.
        Mra = 0x0011,
        /// ConnectReject.
        Rej = 0x0012,
        /// ConnectReply.
        Rep = 0x0013,
        /// ReadyToUse.
        Rtu = 0x0014,
        /// DisconnectRequest.
        Dreq = 0x0015,
        /// DisconnectReply.
        Drep = 0x0016,
        /// ServiceIDResReq.
        SidrReq = 0x0017,
        /// ServiceIDResReqResp.
        SidrRep = 0x0018,
        /// LoadAlternatePath.
        Lap = 0x0019,
        /// AlternatePathResponse.
        Apr = 0x001a,
    }
}

crate::enum_with_unknown! {
    /// REJ reasons (IBA Vol. 1 §12.6.7.2 table 108).
    pub enum RejReason(u16) {
        /// No QP available.
        NoQp = 1,
        /// No EE context available.
        NoEec = 2,
        /// No resources available.
        NoResources = 3,
        /// Timeout (the sender gave up waiting).
        Timeout = 4,
        /// The request is not supported.
        UnsupportedReq = 5,
        /// Invalid communication ID.
        InvalidCommId = 6,
        /// Invalid communication instance.
        InvalidCommInstance = 7,
        /// Invalid service ID: nobody listens on it.
        InvalidServiceId = 8,
        /// Invalid transport service type.
        InvalidTransportType = 9,
        /// Stale connection.
        StaleConn = 10,
        /// The RDC does not exist.
        RdcNotExist = 11,
        /// Invalid primary GID.
        InvalidGid = 12,
        /// Invalid primary LID.
        InvalidLid = 13,
        /// Invalid primary SL.
        InvalidSl = 14,
        /// Invalid primary traffic class.
        InvalidTrafficClass = 15,
        /// Invalid primary hop limit.
        InvalidHopLimit = 16,
        /// Invalid primary packet rate.
        InvalidPacketRate = 17,
        /// Port and CM redirection.
        PortCmRedirect = 24,
        /// Port redirection.
        PortRedirect = 25,
        /// Invalid path MTU.
        InvalidMtu = 26,
        /// Insufficient responder resources.
        InsufficientRespResources = 27,
        /// Consumer reject: the application said no (`rdma_reject`).
        ConsumerReject = 28,
        /// RNR retry count reject.
        RnrRetryCountReject = 29,
        /// Duplicate local communication ID.
        DupLocalCommId = 30,
        /// Unsupported class version.
        InvalidClassVersion = 31,
        /// Invalid primary flow label.
        InvalidFlowLabel = 32,
    }
}

/// `message_mraed` / `message_rejected`: which message an MRA or REJ answers (IBA Vol. 1
/// §12.6.6 and §12.6.7).
pub mod msg_code {
    /// The REQ.
    pub const REQ: u32 = 0;
    /// The REP.
    pub const REP: u32 = 1;
    /// A LAP (MRA) / no message (REJ, "other").
    pub const OTHER: u32 = 2;
}

/// Bytes of private data of each message (IBA Vol. 1 §12.6.5-12.6.11).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
}

layout! {
    /// ConnectRequest (IBA Vol. 1 §12.6.5 table 104), offsets in the whole MAD.
    pub struct Req, "cm_req", size 256;
    local_comm_id, set_local_comm_id: 0x18 [31:0],
    service_id, set_service_id: 0x20 u64,
    local_ca_guid, set_local_ca_guid: 0x28 u64,
    local_q_key, set_local_q_key: 0x34 [31:0],
    local_qpn, set_local_qpn: 0x38 [31:8],
    responder_resources, set_responder_resources: 0x38 [7:0],
    local_eecn, set_local_eecn: 0x3c [31:8],
    initiator_depth, set_initiator_depth: 0x3c [7:0],
    remote_eecn, set_remote_eecn: 0x40 [31:8],
    remote_cm_response_timeout, set_remote_cm_response_timeout: 0x40 [7:3],
    transport_service_type, set_transport_service_type: 0x40 [2:1],
    end_to_end_flow_control, set_end_to_end_flow_control: 0x40 [0:0],
    starting_psn, set_starting_psn: 0x44 [31:8],
    local_cm_response_timeout, set_local_cm_response_timeout: 0x44 [7:3],
    retry_count, set_retry_count: 0x44 [2:0],
    partition_key, set_partition_key: 0x48 [31:16],
    path_packet_payload_mtu, set_path_packet_payload_mtu: 0x48 [15:12],
    rdc_exists, set_rdc_exists: 0x48 [11:11],
    rnr_retry_count, set_rnr_retry_count: 0x48 [10:8],
    max_cm_retries, set_max_cm_retries: 0x48 [7:4],
    srq, set_srq: 0x48 [3:3],
    extended_transport_type, set_extended_transport_type: 0x48 [2:0],
    primary_local_port_lid, set_primary_local_port_lid: 0x4c [31:16],
    primary_remote_port_lid, set_primary_remote_port_lid: 0x4c [15:0],
    primary_local_port_gid, set_primary_local_port_gid: 0x50 [u8; 16],
    primary_remote_port_gid, set_primary_remote_port_gid: 0x60 [u8; 16],
    primary_flow_label, set_primary_flow_label: 0x70 [31:12],
    primary_packet_rate, set_primary_packet_rate: 0x70 [5:0],
    primary_traffic_class, set_primary_traffic_class: 0x74 [31:24],
    primary_hop_limit, set_primary_hop_limit: 0x74 [23:16],
    primary_sl, set_primary_sl: 0x74 [15:12],
    primary_subnet_local, set_primary_subnet_local: 0x74 [11:11],
    primary_local_ack_timeout, set_primary_local_ack_timeout: 0x74 [7:3],
    alternate_local_port_lid, set_alternate_local_port_lid: 0x78 [31:16],
    alternate_remote_port_lid, set_alternate_remote_port_lid: 0x78 [15:0],
    alternate_local_port_gid, set_alternate_local_port_gid: 0x7c [u8; 16],
    alternate_remote_port_gid, set_alternate_remote_port_gid: 0x8c [u8; 16],
    alternate_flow_label, set_alternate_flow_label: 0x9c [31:12],
    alternate_packet_rate, set_alternate_packet_rate: 0x9c [5:0],
    alternate_traffic_class, set_alternate_traffic_class: 0xa0 [31:24],
    alternate_hop_limit, set_alternate_hop_limit: 0xa0 [23:16],
    alternate_sl, set_alternate_sl: 0xa0 [15:12],
    alternate_subnet_local, set_alternate_subnet_local: 0xa0 [11:11],
    alternate_local_ack_timeout, set_alternate_local_ack_timeout: 0xa0 [7:3],
    sap_supported, set_sap_supported: 0xa0 [2:2],
    private_data, set_private_data: 0xa4 [u8; 92],
}

layout! {
    /// MsgRcptAck (IBA Vol. 1 §12.6.6 table 105), offsets in the whole MAD.
    pub struct Mra, "cm_mra", size 256;
    local_comm_id, set_local_comm_id: 0x18 [31:0],
    remote_comm_id, set_remote_comm_id: 0x1c [31:0],
    message_mraed, set_message_mraed: 0x20 [31:30],
    service_timeout, set_service_timeout: 0x20 [23:19],
    private_data, set_private_data: 0x22 [u8; 222],
}

layout! {
    /// ConnectReject (IBA Vol. 1 §12.6.7 table 106), offsets in the whole MAD.
    pub struct Rej, "cm_rej", size 256;
    local_comm_id, set_local_comm_id: 0x18 [31:0],
    remote_comm_id, set_remote_comm_id: 0x1c [31:0],
    message_rejected, set_message_rejected: 0x20 [31:30],
    rejected_info_length, set_rejected_info_length: 0x20 [23:17],
    reason, set_reason: 0x20 [15:0],
    ari, set_ari: 0x24 [u8; 72],
    private_data, set_private_data: 0x6c [u8; 148],
}

layout! {
    /// ConnectReply (IBA Vol. 1 §12.6.8 table 109), offsets in the whole MAD.
    pub struct Rep, "cm_rep", size 256;
    local_comm_id, set_local_comm_id: 0x18 [31:0],
    remote_comm_id, set_remote_comm_id: 0x1c [31:0],
    local_q_key, set_local_q_key: 0x20 [31:0],
    local_qpn, set_local_qpn: 0x24 [31:8],
    local_ee_context_number, set_local_ee_context_number: 0x28 [31:8],
    starting_psn, set_starting_psn: 0x2c [31:8],
    responder_resources, set_responder_resources: 0x30 [31:24],
    initiator_depth, set_initiator_depth: 0x30 [23:16],
    target_ack_delay, set_target_ack_delay: 0x30 [15:11],
    failover_accepted, set_failover_accepted: 0x30 [10:9],
    end_to_end_flow_control, set_end_to_end_flow_control: 0x30 [8:8],
    rnr_retry_count, set_rnr_retry_count: 0x30 [7:5],
    srq, set_srq: 0x30 [4:4],
    local_ca_guid, set_local_ca_guid: 0x34 u64,
    private_data, set_private_data: 0x3c [u8; 196],
}

layout! {
    /// ReadyToUse (IBA Vol. 1 §12.6.9 table 110), offsets in the whole MAD.
    pub struct Rtu, "cm_rtu", size 256;
    local_comm_id, set_local_comm_id: 0x18 [31:0],
    remote_comm_id, set_remote_comm_id: 0x1c [31:0],
    private_data, set_private_data: 0x20 [u8; 224],
}

layout! {
    /// DisconnectRequest (IBA Vol. 1 §12.6.10 table 111), offsets in the whole MAD.
    pub struct Dreq, "cm_dreq", size 256;
    local_comm_id, set_local_comm_id: 0x18 [31:0],
    remote_comm_id, set_remote_comm_id: 0x1c [31:0],
    remote_qpn_eecn, set_remote_qpn_eecn: 0x20 [31:8],
    private_data, set_private_data: 0x24 [u8; 220],
}

layout! {
    /// DisconnectReply (IBA Vol. 1 §12.6.11 table 112), offsets in the whole MAD.
    pub struct Drep, "cm_drep", size 256;
    local_comm_id, set_local_comm_id: 0x18 [31:0],
    remote_comm_id, set_remote_comm_id: 0x1c [31:0],
    private_data, set_private_data: 0x20 [u8; 224],
}

layout! {
    /// The cma header at the start of a REQ's private data for the IP-based port spaces
    /// (Linux `drivers/infiniband/core/cma.c` `struct cma_hdr`, 36 bytes; docs/spec/rdma-cm.md §4).
    pub struct CmaHdr, "cma_hdr", size 36;
    cma_version, set_cma_version: 0x00 [31:24],
    ip_version, set_ip_version: 0x00 [23:20],
    port, set_port: 0x00 [15:0],
    src_addr, set_src_addr: 0x04 [u8; 16],
    dst_addr, set_dst_addr: 0x14 [u8; 16],
}

/// Bytes of the cma header.
pub const CMA_HDR_SIZE: usize = 36;
/// The cma header version (Linux `CMA_VERSION`).
pub const CMA_VERSION: u8 = 0x00;
/// The service ID of the IP-based port space `ps`, port `port` (Linux
/// `cma_get_service_id`; docs/spec/rdma-cm.md §4): `(ps << 16) | port`.
pub const fn ip_service_id(ps: u16, port: u16) -> u64 {
    ((ps as u64) << 16) | port as u64
}
/// The port space of TCP-like connections (librdmacm `RDMA_PS_TCP`): rping, perftest `-R`.
pub const RDMA_PS_TCP: u16 = 0x0106;
/// The mask that keeps a service ID's port space (Linux `RDMA_IB_IP_PS_MASK`).
pub const IP_PS_MASK: u64 = 0xffff_ffff_ffff_0000;

/// Why a MAD is not a well-formed CM message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmWireError {
    /// Not a MAD.
    Mad(MadError),
    /// Not of the CM class.
    NotCm(u8),
    /// A CM class version other than 2.
    ClassVersion(u8),
    /// An attribute that is not one of the connection messages.
    Attribute(u16),
    /// More private data than the message holds.
    PrivateData {
        /// The message's room.
        max: usize,
        /// What was given.
        len: usize,
    },
}

impl core::fmt::Display for CmWireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmWireError::Mad(e) => e.fmt(f),
            CmWireError::NotCm(c) => write!(f, "management class {c:#04x} is not the CM (0x07)"),
            CmWireError::ClassVersion(v) => write!(f, "CM class version {v} (2 expected)"),
            CmWireError::Attribute(a) => write!(f, "CM attribute {a:#06x} is not a message"),
            CmWireError::PrivateData { max, len } => {
                write!(f, "{len} bytes of private data (the message holds {max})")
            }
        }
    }
}

impl std::error::Error for CmWireError {}

impl From<MadError> for CmWireError {
    fn from(e: MadError) -> Self {
        CmWireError::Mad(e)
    }
}

mod repr;
pub use repr::*;

#[cfg(test)]
mod tests;

/// The common header of a CM message with attribute `attr` and transaction `tid`.
pub fn cm_header(attr: CmAttr, tid: u64) -> MadHeader {
    MadHeader {
        mgmt_class: MgmtClass::Cm,
        class_version: CM_CLASS_VERSION,
        method: super::mad::Method::Send.raw(),
        status: 0,
        class_specific: 0,
        transaction_id: tid,
        attribute_id: attr.raw(),
        attribute_modifier: 0,
    }
}

/// Copies `data` into a zeroed private-data field of `N` bytes.
fn private_field<const N: usize>(data: &[u8]) -> Result<[u8; N], CmWireError> {
    if data.len() > N {
        return Err(CmWireError::PrivateData {
            max: N,
            len: data.len(),
        });
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Ok(out)
}

/// A zeroed MAD buffer.
pub fn new_mad() -> [u8; MAD_SIZE] {
    [0u8; MAD_SIZE]
}

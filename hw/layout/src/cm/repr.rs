//! The `Repr`s of the CM messages: plain structs with `parse` (from a view) and `emit`
//! (into a view), and [`CmMessage`], any of them parsed from or emitted as a whole MAD.

use super::*;
use crate::mad::MAD_SIZE;
use crate::{Buf, BufMut};

/// One path of a REQ (primary or alternate; IBA Vol. 1 §12.6.5 table 104). On RoCE the
/// LIDs are unused and the GIDs are the IP addresses (docs/spec/rdma-cm.md §5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmPath {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (the sender's).
    pub local_gid: [u8; 16],
    /// Remote port GID (the receiver's).
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBA encoding).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local: the GRH may be left out (1 bit).
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits, 4.096 µs · 2^x).
    pub local_ack_timeout: u8,
}

/// A REQ (IBA Vol. 1 §12.6.5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReqRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The service asked for.
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key (RD only).
    pub local_q_key: u32,
    /// The sender's QPN (24 bits).
    pub local_qpn: u32,
    /// RDMA READs/atomics the sender's responder takes at once.
    pub responder_resources: u8,
    /// The sender's EECN (RD only).
    pub local_eecn: u32,
    /// RDMA READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// The receiver's EECN (RD only).
    pub remote_eecn: u32,
    /// How long the receiver may take to answer (5 bits, 4.096 µs · 2^x).
    pub remote_cm_response_timeout: u8,
    /// 0 RC, 1 UC, 2 RD (2 bits).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The sender's first send PSN (24 bits).
    pub starting_psn: u32,
    /// How long the sender takes to answer (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub partition_key: u16,
    /// Path MTU (4 bits, IB encoding: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retries (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// How often the CM resends this REQ (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 0 unless XRC).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary: CmPath,
    /// The alternate path (all zero when there is none).
    pub alternate: CmPath,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data (on parse: all 92 bytes; on emit: up to 92, zero padded).
    pub private_data: Vec<u8>,
}

fn b(v: u32) -> bool {
    v != 0
}

/// Reads one path of a REQ view through the accessors named.
macro_rules! read_path {
    ($v:ident, $llid:ident, $rlid:ident, $lgid:ident, $rgid:ident, $fl:ident, $rate:ident,
     $tc:ident, $hop:ident, $sl:ident, $sub:ident, $ack:ident) => {
        CmPath {
            local_lid: $v.$llid() as u16,
            remote_lid: $v.$rlid() as u16,
            local_gid: $v.$lgid(),
            remote_gid: $v.$rgid(),
            flow_label: $v.$fl(),
            packet_rate: $v.$rate() as u8,
            traffic_class: $v.$tc() as u8,
            hop_limit: $v.$hop() as u8,
            sl: $v.$sl() as u8,
            subnet_local: b($v.$sub()),
            local_ack_timeout: $v.$ack() as u8,
        }
    };
}

/// Writes one path into a REQ view.
macro_rules! write_path {
    ($v:ident, $p:expr, $llid:ident, $rlid:ident, $lgid:ident, $rgid:ident, $fl:ident,
     $rate:ident, $tc:ident, $hop:ident, $sl:ident, $sub:ident, $ack:ident) => {{
        let p = $p;
        $v.$llid(p.local_lid.into());
        $v.$rlid(p.remote_lid.into());
        $v.$lgid(&p.local_gid);
        $v.$rgid(&p.remote_gid);
        $v.$fl(p.flow_label & 0xf_ffff);
        $v.$rate(u32::from(p.packet_rate & 0x3f));
        $v.$tc(p.traffic_class.into());
        $v.$hop(p.hop_limit.into());
        $v.$sl(u32::from(p.sl & 0xf));
        $v.$sub(p.subnet_local.into());
        $v.$ack(u32::from(p.local_ack_timeout & 0x1f));
    }};
}

impl ReqRepr {
    /// Parses a REQ view.
    pub fn parse<B: Buf>(v: &Req<B>) -> Self {
        ReqRepr {
            local_comm_id: v.local_comm_id(),
            service_id: v.service_id(),
            local_ca_guid: v.local_ca_guid(),
            local_q_key: v.local_q_key(),
            local_qpn: v.local_qpn(),
            responder_resources: v.responder_resources() as u8,
            local_eecn: v.local_eecn(),
            initiator_depth: v.initiator_depth() as u8,
            remote_eecn: v.remote_eecn(),
            remote_cm_response_timeout: v.remote_cm_response_timeout() as u8,
            transport_service_type: v.transport_service_type() as u8,
            end_to_end_flow_control: b(v.end_to_end_flow_control()),
            starting_psn: v.starting_psn(),
            local_cm_response_timeout: v.local_cm_response_timeout() as u8,
            retry_count: v.retry_count() as u8,
            partition_key: v.partition_key() as u16,
            path_mtu: v.path_packet_payload_mtu() as u8,
            rdc_exists: b(v.rdc_exists()),
            rnr_retry_count: v.rnr_retry_count() as u8,
            max_cm_retries: v.max_cm_retries() as u8,
            srq: b(v.srq()),
            extended_transport_type: v.extended_transport_type() as u8,
            primary: read_path!(
                v,
                primary_local_port_lid,
                primary_remote_port_lid,
                primary_local_port_gid,
                primary_remote_port_gid,
                primary_flow_label,
                primary_packet_rate,
                primary_traffic_class,
                primary_hop_limit,
                primary_sl,
                primary_subnet_local,
                primary_local_ack_timeout
            ),
            alternate: read_path!(
                v,
                alternate_local_port_lid,
                alternate_remote_port_lid,
                alternate_local_port_gid,
                alternate_remote_port_gid,
                alternate_flow_label,
                alternate_packet_rate,
                alternate_traffic_class,
                alternate_hop_limit,
                alternate_sl,
                alternate_subnet_local,
                alternate_local_ack_timeout
            ),
            sap_supported: b(v.sap_supported()),
            private_data: v.private_data().to_vec(),
        }
    }

    /// Writes the REQ into a view (the header is the caller's); values wider than their
    /// field are cut to it.
    pub fn emit<B: BufMut>(&self, v: &mut Req<B>) -> Result<(), CmWireError> {
        let pd = private_field::<{ private_len::REQ }>(&self.private_data)?;
        v.set_local_comm_id(self.local_comm_id);
        v.set_service_id(self.service_id);
        v.set_local_ca_guid(self.local_ca_guid);
        v.set_local_q_key(self.local_q_key);
        v.set_local_qpn(self.local_qpn & 0xff_ffff);
        v.set_responder_resources(self.responder_resources.into());
        v.set_local_eecn(self.local_eecn & 0xff_ffff);
        v.set_initiator_depth(self.initiator_depth.into());
        v.set_remote_eecn(self.remote_eecn & 0xff_ffff);
        v.set_remote_cm_response_timeout(u32::from(self.remote_cm_response_timeout & 0x1f));
        v.set_transport_service_type(u32::from(self.transport_service_type & 3));
        v.set_end_to_end_flow_control(self.end_to_end_flow_control.into());
        v.set_starting_psn(self.starting_psn & 0xff_ffff);
        v.set_local_cm_response_timeout(u32::from(self.local_cm_response_timeout & 0x1f));
        v.set_retry_count(u32::from(self.retry_count & 7));
        v.set_partition_key(self.partition_key.into());
        v.set_path_packet_payload_mtu(u32::from(self.path_mtu & 0xf));
        v.set_rdc_exists(self.rdc_exists.into());
        v.set_rnr_retry_count(u32::from(self.rnr_retry_count & 7));
        v.set_max_cm_retries(u32::from(self.max_cm_retries & 0xf));
        v.set_srq(self.srq.into());
        v.set_extended_transport_type(u32::from(self.extended_transport_type & 7));
        write_path!(
            v,
            &self.primary,
            set_primary_local_port_lid,
            set_primary_remote_port_lid,
            set_primary_local_port_gid,
            set_primary_remote_port_gid,
            set_primary_flow_label,
            set_primary_packet_rate,
            set_primary_traffic_class,
            set_primary_hop_limit,
            set_primary_sl,
            set_primary_subnet_local,
            set_primary_local_ack_timeout
        );
        write_path!(
            v,
            &self.alternate,
            set_alternate_local_port_lid,
            set_alternate_remote_port_lid,
            set_alternate_local_port_gid,
            set_alternate_remote_port_gid,
            set_alternate_flow_label,
            set_alternate_packet_rate,
            set_alternate_traffic_class,
            set_alternate_hop_limit,
            set_alternate_sl,
            set_alternate_subnet_local,
            set_alternate_local_ack_timeout
        );
        v.set_sap_supported(self.sap_supported.into());
        v.set_private_data(&pd);
        Ok(())
    }
}

/// An MRA (IBA Vol. 1 §12.6.6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MraRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 when MRAing a REQ whose sender's is unknown:
    /// never, the REQ carries it).
    pub remote_comm_id: u32,
    /// Which message is acknowledged ([`msg_code`]).
    pub message_mraed: u8,
    /// How much longer the sender needs (5 bits, 4.096 µs · 2^x).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl MraRepr {
    /// Parses an MRA view.
    pub fn parse<B: Buf>(v: &Mra<B>) -> Self {
        MraRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            message_mraed: v.message_mraed() as u8,
            service_timeout: v.service_timeout() as u8,
            private_data: v.private_data().to_vec(),
        }
    }
    /// Writes the MRA into a view.
    pub fn emit<B: BufMut>(&self, v: &mut Mra<B>) -> Result<(), CmWireError> {
        let pd = private_field::<{ private_len::MRA }>(&self.private_data)?;
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_message_mraed(u32::from(self.message_mraed & 3));
        v.set_service_timeout(u32::from(self.service_timeout & 0x1f));
        v.set_private_data(&pd);
        Ok(())
    }
}

/// A REJ (IBA Vol. 1 §12.6.7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected ([`msg_code`]).
    pub message_rejected: u8,
    /// Bytes of `ari` that mean something (7 bits).
    pub rejected_info_length: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional rejection information (72 bytes).
    pub ari: [u8; 72],
    /// Private data.
    pub private_data: Vec<u8>,
}

impl Default for RejRepr {
    fn default() -> Self {
        RejRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: 0,
            rejected_info_length: 0,
            reason: RejReason::Unknown(0),
            ari: [0; 72],
            private_data: Vec::new(),
        }
    }
}

impl RejRepr {
    /// Parses a REJ view.
    pub fn parse<B: Buf>(v: &Rej<B>) -> Self {
        RejRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            message_rejected: v.message_rejected() as u8,
            rejected_info_length: v.rejected_info_length() as u8,
            reason: RejReason::from(v.reason() as u16),
            ari: v.ari(),
            private_data: v.private_data().to_vec(),
        }
    }
    /// Writes the REJ into a view.
    pub fn emit<B: BufMut>(&self, v: &mut Rej<B>) -> Result<(), CmWireError> {
        let pd = private_field::<{ private_len::REJ }>(&self.private_data)?;
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_message_rejected(u32::from(self.message_rejected & 3));
        v.set_rejected_info_length(u32::from(self.rejected_info_length & 0x7f));
        v.set_reason(self.reason.raw().into());
        v.set_ari(&self.ari);
        v.set_private_data(&pd);
        Ok(())
    }
}

/// A REP (IBA Vol. 1 §12.6.8).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's (the REQ's sender's) communication ID.
    pub remote_comm_id: u32,
    /// The sender's Q_Key (RD only).
    pub local_q_key: u32,
    /// The sender's QPN (24 bits).
    pub local_qpn: u32,
    /// The sender's EE context (RD only).
    pub local_ee_context_number: u32,
    /// The sender's first send PSN (24 bits).
    pub starting_psn: u32,
    /// RDMA READs/atomics the sender's responder takes at once.
    pub responder_resources: u8,
    /// RDMA READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retries the REQ's sender should use (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl RepRepr {
    /// Parses a REP view.
    pub fn parse<B: Buf>(v: &Rep<B>) -> Self {
        RepRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            local_q_key: v.local_q_key(),
            local_qpn: v.local_qpn(),
            local_ee_context_number: v.local_ee_context_number(),
            starting_psn: v.starting_psn(),
            responder_resources: v.responder_resources() as u8,
            initiator_depth: v.initiator_depth() as u8,
            target_ack_delay: v.target_ack_delay() as u8,
            failover_accepted: v.failover_accepted() as u8,
            end_to_end_flow_control: b(v.end_to_end_flow_control()),
            rnr_retry_count: v.rnr_retry_count() as u8,
            srq: b(v.srq()),
            local_ca_guid: v.local_ca_guid(),
            private_data: v.private_data().to_vec(),
        }
    }
    /// Writes the REP into a view.
    pub fn emit<B: BufMut>(&self, v: &mut Rep<B>) -> Result<(), CmWireError> {
        let pd = private_field::<{ private_len::REP }>(&self.private_data)?;
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_local_q_key(self.local_q_key);
        v.set_local_qpn(self.local_qpn & 0xff_ffff);
        v.set_local_ee_context_number(self.local_ee_context_number & 0xff_ffff);
        v.set_starting_psn(self.starting_psn & 0xff_ffff);
        v.set_responder_resources(self.responder_resources.into());
        v.set_initiator_depth(self.initiator_depth.into());
        v.set_target_ack_delay(u32::from(self.target_ack_delay & 0x1f));
        v.set_failover_accepted(u32::from(self.failover_accepted & 3));
        v.set_end_to_end_flow_control(self.end_to_end_flow_control.into());
        v.set_rnr_retry_count(u32::from(self.rnr_retry_count & 7));
        v.set_srq(self.srq.into());
        v.set_local_ca_guid(self.local_ca_guid);
        v.set_private_data(&pd);
        Ok(())
    }
}

/// The messages that carry two communication IDs and private data only: RTU and DREP
/// (and DREQ, with the QPN).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommIds {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
}

/// An RTU (IBA Vol. 1 §12.6.9).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RtuRepr {
    /// Communication IDs.
    pub ids: CommIds,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// A DREQ (IBA Vol. 1 §12.6.10).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DreqRepr {
    /// Communication IDs.
    pub ids: CommIds,
    /// The receiver's QPN (24 bits).
    pub remote_qpn_eecn: u32,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// A DREP (IBA Vol. 1 §12.6.11).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrepRepr {
    /// Communication IDs.
    pub ids: CommIds,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl RtuRepr {
    /// Parses an RTU view.
    pub fn parse<B: Buf>(v: &Rtu<B>) -> Self {
        RtuRepr {
            ids: CommIds {
                local_comm_id: v.local_comm_id(),
                remote_comm_id: v.remote_comm_id(),
            },
            private_data: v.private_data().to_vec(),
        }
    }
    /// Writes the RTU into a view.
    pub fn emit<B: BufMut>(&self, v: &mut Rtu<B>) -> Result<(), CmWireError> {
        let pd = private_field::<{ private_len::RTU }>(&self.private_data)?;
        v.set_local_comm_id(self.ids.local_comm_id);
        v.set_remote_comm_id(self.ids.remote_comm_id);
        v.set_private_data(&pd);
        Ok(())
    }
}

impl DreqRepr {
    /// Parses a DREQ view.
    pub fn parse<B: Buf>(v: &Dreq<B>) -> Self {
        DreqRepr {
            ids: CommIds {
                local_comm_id: v.local_comm_id(),
                remote_comm_id: v.remote_comm_id(),
            },
            remote_qpn_eecn: v.remote_qpn_eecn(),
            private_data: v.private_data().to_vec(),
        }
    }
    /// Writes the DREQ into a view.
    pub fn emit<B: BufMut>(&self, v: &mut Dreq<B>) -> Result<(), CmWireError> {
        let pd = private_field::<{ private_len::DREQ }>(&self.private_data)?;
        v.set_local_comm_id(self.ids.local_comm_id);
        v.set_remote_comm_id(self.ids.remote_comm_id);
        v.set_remote_qpn_eecn(self.remote_qpn_eecn & 0xff_ffff);
        v.set_private_data(&pd);
        Ok(())
    }
}

impl DrepRepr {
    /// Parses a DREP view.
    pub fn parse<B: Buf>(v: &Drep<B>) -> Self {
        DrepRepr {
            ids: CommIds {
                local_comm_id: v.local_comm_id(),
                remote_comm_id: v.remote_comm_id(),
            },
            private_data: v.private_data().to_vec(),
        }
    }
    /// Writes the DREP into a view.
    pub fn emit<B: BufMut>(&self, v: &mut Drep<B>) -> Result<(), CmWireError> {
        let pd = private_field::<{ private_len::DREP }>(&self.private_data)?;
        v.set_local_comm_id(self.ids.local_comm_id);
        v.set_remote_comm_id(self.ids.remote_comm_id);
        v.set_private_data(&pd);
        Ok(())
    }
}

/// Any connection message of the CM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MsgRcptAck.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(RtuRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(DrepRepr),
}

impl CmMessage {
    /// The attribute ID of the message.
    pub fn attr(&self) -> CmAttr {
        match self {
            CmMessage::Req(_) => CmAttr::Req,
            CmMessage::Mra(_) => CmAttr::Mra,
            CmMessage::Rej(_) => CmAttr::Rej,
            CmMessage::Rep(_) => CmAttr::Rep,
            CmMessage::Rtu(_) => CmAttr::Rtu,
            CmMessage::Dreq(_) => CmAttr::Dreq,
            CmMessage::Drep(_) => CmAttr::Drep,
        }
    }

    /// Parses a whole MAD: its header must be the CM class, version 2, and the attribute
    /// one of the seven connection messages (the method is the caller's to check: the
    /// CM's are Send).
    pub fn parse(mad: &[u8]) -> Result<(MadHeader, CmMessage), CmWireError> {
        let hdr = MadHeader::parse(mad)?;
        if hdr.mgmt_class != MgmtClass::Cm {
            return Err(CmWireError::NotCm(hdr.mgmt_class.raw()));
        }
        if hdr.class_version != CM_CLASS_VERSION {
            return Err(CmWireError::ClassVersion(hdr.class_version));
        }
        let mad = &mad[..MAD_SIZE];
        let msg = match CmAttr::from(hdr.attribute_id) {
            CmAttr::Req => CmMessage::Req(ReqRepr::parse(&Req::new_unchecked(mad))),
            CmAttr::Mra => CmMessage::Mra(MraRepr::parse(&Mra::new_unchecked(mad))),
            CmAttr::Rej => CmMessage::Rej(RejRepr::parse(&Rej::new_unchecked(mad))),
            CmAttr::Rep => CmMessage::Rep(RepRepr::parse(&Rep::new_unchecked(mad))),
            CmAttr::Rtu => CmMessage::Rtu(RtuRepr::parse(&Rtu::new_unchecked(mad))),
            CmAttr::Dreq => CmMessage::Dreq(DreqRepr::parse(&Dreq::new_unchecked(mad))),
            CmAttr::Drep => CmMessage::Drep(DrepRepr::parse(&Drep::new_unchecked(mad))),
            other => return Err(CmWireError::Attribute(other.raw())),
        };
        Ok((hdr, msg))
    }

    /// The whole MAD: the CM header with transaction `tid`, then the message.
    pub fn emit(&self, tid: u64) -> Result<[u8; MAD_SIZE], CmWireError> {
        let mut mad = new_mad();
        cm_header(self.attr(), tid).emit(&mut mad[..]);
        let m = &mut mad[..];
        match self {
            CmMessage::Req(r) => r.emit(&mut Req::new_unchecked(m))?,
            CmMessage::Mra(r) => r.emit(&mut Mra::new_unchecked(m))?,
            CmMessage::Rej(r) => r.emit(&mut Rej::new_unchecked(m))?,
            CmMessage::Rep(r) => r.emit(&mut Rep::new_unchecked(m))?,
            CmMessage::Rtu(r) => r.emit(&mut Rtu::new_unchecked(m))?,
            CmMessage::Dreq(r) => r.emit(&mut Dreq::new_unchecked(m))?,
            CmMessage::Drep(r) => r.emit(&mut Drep::new_unchecked(m))?,
        }
        Ok(mad)
    }
}

/// The cma header, parsed (docs/spec/rdma-cm.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHdrRepr {
    /// The REQ sender's address and port.
    pub src: std::net::SocketAddr,
    /// The address the REQ is for (the port is the service ID's).
    pub dst: std::net::IpAddr,
}

impl CmaHdrRepr {
    /// Parses the cma header at the start of a REQ's private data: version 0, IP version
    /// 4 (addresses in the last 4 of 16 bytes) or 6. `None` when it is not one.
    pub fn parse(private_data: &[u8]) -> Option<Self> {
        let v = CmaHdr::new_checked(private_data).ok()?;
        if v.cma_version() != u32::from(CMA_VERSION) {
            return None;
        }
        let (src, dst) = (v.src_addr(), v.dst_addr());
        let (s, d): (std::net::IpAddr, std::net::IpAddr) = match v.ip_version() {
            4 => {
                let last4 = |a: [u8; 16]| std::net::Ipv4Addr::new(a[12], a[13], a[14], a[15]);
                (last4(src).into(), last4(dst).into())
            }
            6 => (
                std::net::Ipv6Addr::from(src).into(),
                std::net::Ipv6Addr::from(dst).into(),
            ),
            _ => return None,
        };
        Some(CmaHdrRepr {
            src: std::net::SocketAddr::new(s, v.port() as u16),
            dst: d,
        })
    }

    /// The 36 header bytes; `None` when the two addresses are not of one family.
    pub fn emit(&self) -> Option<[u8; CMA_HDR_SIZE]> {
        use std::net::IpAddr;
        let mut out = [0u8; CMA_HDR_SIZE];
        let mut v = CmaHdr::new_unchecked(&mut out[..]);
        v.set_cma_version(CMA_VERSION.into());
        let (ver, s, d) = match (self.src.ip(), self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let pad = |a: std::net::Ipv4Addr| {
                    let mut x = [0u8; 16];
                    x[12..].copy_from_slice(&a.octets());
                    x
                };
                (4, pad(s), pad(d))
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => (6, s.octets(), d.octets()),
            _ => return None,
        };
        v.set_ip_version(ver);
        v.set_port(self.src.port().into());
        v.set_src_addr(&s);
        v.set_dst_addr(&d);
        Some(out)
    }
}

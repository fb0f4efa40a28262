//! Header views (`layout!`) and `Repr`s: Ethernet II, IPv4, IPv6, UDP, and the IBA
//! transport headers BTH, RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH.
//!
//! Offsets: Ethernet II (IEEE 802.3), IPv4 (RFC 791 §3.1), IPv6 (RFC 8200 §3), UDP
//! (RFC 768), IBA headers (IBA Vol. 1 Release 1.2.1 §9.2-9.3, the same as rxe's
//! `rxe_hdr.h` and Wireshark's `packet-infiniband.c`). Field names are the spec names in
//! snake_case. Each `Repr` has `parse` (from a view), `emit` (into a view) and
//! `buffer_len`.

use super::{EtherType, WireError};
use crate::layout;
use crate::{Buf, BufMut};

/// Bytes of an Ethernet II header (no VLAN tag).
pub const ETH_SIZE: usize = 14;
/// Bytes of an IPv4 header without options.
pub const IPV4_SIZE: usize = 20;
/// Bytes of an IPv6 header.
pub const IPV6_SIZE: usize = 40;
/// Bytes of a UDP header.
pub const UDP_SIZE: usize = 8;
/// Bytes of a BTH.
pub const BTH_SIZE: usize = 12;
/// Bytes of a RETH.
pub const RETH_SIZE: usize = 16;
/// Bytes of an AETH.
pub const AETH_SIZE: usize = 4;
/// Bytes of an AtomicETH.
pub const ATOMIC_ETH_SIZE: usize = 28;
/// Bytes of an AtomicAckETH.
pub const ATOMIC_ACK_ETH_SIZE: usize = 8;
/// Bytes of an ImmDt.
pub const IMM_DT_SIZE: usize = 4;
/// Bytes of an IETH.
pub const IETH_SIZE: usize = 4;
/// Bytes of a DETH.
pub const DETH_SIZE: usize = 8;

layout! {
    /// Ethernet II header.
    pub struct EthHdr, "eth", size 14;
    dst_addr, set_dst_addr: 0x00 [u8; 6],
    src_addr, set_src_addr: 0x06 [u8; 6],
    ethertype, set_ethertype: 0x0c [u8; 2],
}

layout! {
    /// IPv4 header without options (RFC 791).
    pub struct Ipv4Hdr, "ipv4", size 20;
    version, set_version: 0x00 [31:28],
    ihl, set_ihl: 0x00 [27:24],
    dscp, set_dscp: 0x00 [23:18],
    ecn, set_ecn: 0x00 [17:16],
    total_length, set_total_length: 0x00 [15:0],
    identification, set_identification: 0x04 [31:16],
    flags, set_flags: 0x04 [15:13],
    fragment_offset, set_fragment_offset: 0x04 [12:0],
    ttl, set_ttl: 0x08 [31:24],
    protocol, set_protocol: 0x08 [23:16],
    header_checksum, set_header_checksum: 0x08 [15:0],
    src_addr, set_src_addr: 0x0c [u8; 4],
    dst_addr, set_dst_addr: 0x10 [u8; 4],
}

layout! {
    /// IPv6 header (RFC 8200).
    pub struct Ipv6Hdr, "ipv6", size 40;
    version, set_version: 0x00 [31:28],
    traffic_class, set_traffic_class: 0x00 [27:20],
    flow_label, set_flow_label: 0x00 [19:0],
    payload_length, set_payload_length: 0x04 [31:16],
    next_header, set_next_header: 0x04 [15:8],
    hop_limit, set_hop_limit: 0x04 [7:0],
    src_addr, set_src_addr: 0x08 [u8; 16],
    dst_addr, set_dst_addr: 0x18 [u8; 16],
}

layout! {
    /// UDP header (RFC 768).
    pub struct UdpHdr, "udp", size 8;
    src_port, set_src_port: 0x00 [31:16],
    dst_port, set_dst_port: 0x00 [15:0],
    length, set_length: 0x04 [31:16],
    checksum, set_checksum: 0x04 [15:0],
}

layout! {
    /// Base Transport Header (IBA Vol. 1 §9.2).
    pub struct Bth, "bth", size 12;
    opcode, set_opcode: 0x00 [31:24],
    se, set_se: 0x00 [23:23],
    m, set_m: 0x00 [22:22],
    pad_cnt, set_pad_cnt: 0x00 [21:20],
    tver, set_tver: 0x00 [19:16],
    p_key, set_p_key: 0x00 [15:0],
    fecn, set_fecn: 0x04 [31:31],
    becn, set_becn: 0x04 [30:30],
    resv6a, set_resv6a: 0x04 [29:24],
    dest_qp, set_dest_qp: 0x04 [23:0],
    ack_req, set_ack_req: 0x08 [31:31],
    resv7, set_resv7: 0x08 [30:24],
    psn, set_psn: 0x08 [23:0],
}

layout! {
    /// RDMA Extended Transport Header (IBA Vol. 1 §9.3.3).
    pub struct Reth, "reth", size 16;
    va, set_va: 0x00 u64,
    r_key, set_r_key: 0x08 [31:0],
    dma_length, set_dma_length: 0x0c [31:0],
}

layout! {
    /// ACK Extended Transport Header (IBA Vol. 1 §9.3.5).
    pub struct Aeth, "aeth", size 4;
    syndrome, set_syndrome: 0x00 [31:24],
    msn, set_msn: 0x00 [23:0],
}

layout! {
    /// Atomic Extended Transport Header (IBA Vol. 1 §9.3.4).
    pub struct AtomicEth, "atomic_eth", size 28;
    va, set_va: 0x00 u64,
    r_key, set_r_key: 0x08 [31:0],
    swap_add_data, set_swap_add_data: 0x0c u64,
    compare_data, set_compare_data: 0x14 u64,
}

layout! {
    /// Atomic ACK Extended Transport Header (IBA Vol. 1 §9.3.6).
    pub struct AtomicAckEth, "atomic_ack_eth", size 8;
    orig_remote_data, set_orig_remote_data: 0x00 u64,
}

layout! {
    /// Immediate data (IBA Vol. 1 §9.3.7).
    pub struct ImmDt, "imm_dt", size 4;
    immediate_data, set_immediate_data: 0x00 [31:0],
}

layout! {
    /// Invalidate Extended Transport Header (IBA Vol. 1 §9.3.8).
    pub struct Ieth, "ieth", size 4;
    r_key, set_r_key: 0x00 [31:0],
}

layout! {
    /// Datagram Extended Transport Header (IBA Vol. 1 §9.3.3): the Q_Key and the sender's QP
    /// of a UD packet.
    pub struct Deth, "deth", size 8;
    q_key, set_q_key: 0x00 [31:0],
    src_qp, set_src_qp: 0x04 [23:0],
}

/// DETH contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Queue key.
    pub q_key: u32,
    /// Source QP number (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Reads the header.
    pub fn parse<B: Buf>(v: &Deth<B>) -> Self {
        Self {
            q_key: v.q_key(),
            src_qp: v.src_qp(),
        }
    }
}

/// Ethernet II header contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EthRepr {
    /// Destination MAC.
    pub dst_addr: [u8; 6],
    /// Source MAC.
    pub src_addr: [u8; 6],
    /// EtherType.
    pub ethertype: EtherType,
}

impl EthRepr {
    /// Reads the header.
    #[inline(always)]
    pub fn parse<B: Buf>(v: &EthHdr<B>) -> Self {
        Self {
            dst_addr: v.dst_addr(),
            src_addr: v.src_addr(),
            ethertype: EtherType::from(u16::from_be_bytes(v.ethertype())),
        }
    }
    /// Writes the header.
    pub fn emit<B: BufMut>(&self, v: &mut EthHdr<B>) {
        v.set_dst_addr(&self.dst_addr);
        v.set_src_addr(&self.src_addr);
        v.set_ethertype(&u16::from(self.ethertype).to_be_bytes());
    }
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        ETH_SIZE
    }
}

/// The Internet checksum (RFC 1071) of `data` (an even number of bytes is not required).
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// IPv4 header contents. Version, IHL (5), protocol and checksum are implied or computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: [u8; 4],
    /// Destination address.
    pub dst_addr: [u8; 4],
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits).
    pub ecn: u8,
    /// Identification.
    pub identification: u16,
    /// Don't-fragment flag.
    pub dont_fragment: bool,
    /// Time to live.
    pub ttl: u8,
    /// Protocol (17 for RoCEv2).
    pub protocol: u8,
    /// Bytes after the IP header (total length minus 20).
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Reads and validates the header: version 4, no options, not a fragment, checksum.
    #[inline(always)]
    pub fn parse(v: &Ipv4Hdr<&[u8]>) -> Result<Self, WireError> {
        if v.version() != 4 {
            return Err(WireError::BadIpVersion(v.version() as u8));
        }
        if v.ihl() != 5 {
            return Err(WireError::Ipv4Options { ihl: v.ihl() as u8 });
        }
        let total = v.total_length() as usize;
        if total < IPV4_SIZE {
            return Err(WireError::BadLength {
                layer: "ipv4",
                value: total,
            });
        }
        let hdr = &v.buf()[..IPV4_SIZE];
        if internet_checksum(hdr) != 0 {
            let got = v.header_checksum() as u16;
            let mut copy = [0u8; IPV4_SIZE];
            copy.copy_from_slice(hdr);
            copy[10] = 0;
            copy[11] = 0;
            return Err(WireError::BadIpChecksum {
                got,
                want: internet_checksum(&copy),
            });
        }
        // Flags: bit 1 DF, bit 0 MF.
        if v.flags() & 1 != 0 || v.fragment_offset() != 0 {
            return Err(WireError::Fragmented);
        }
        Ok(Self {
            src_addr: v.src_addr(),
            dst_addr: v.dst_addr(),
            dscp: v.dscp() as u8,
            ecn: v.ecn() as u8,
            identification: v.identification() as u16,
            dont_fragment: v.flags() & 2 != 0,
            ttl: v.ttl() as u8,
            protocol: v.protocol() as u8,
            payload_len: total - IPV4_SIZE,
        })
    }

    /// Writes the header, with its checksum, into the first 20 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        let mut v = Ipv4Hdr::new_unchecked(&mut buf[..IPV4_SIZE]);
        v.set_version(4);
        v.set_ihl(5);
        v.set_dscp(u32::from(self.dscp & 0x3F));
        v.set_ecn(u32::from(self.ecn & 3));
        v.set_total_length((IPV4_SIZE + self.payload_len) as u32 & 0xFFFF);
        v.set_identification(u32::from(self.identification));
        v.set_flags(if self.dont_fragment { 2 } else { 0 });
        v.set_fragment_offset(0);
        v.set_ttl(u32::from(self.ttl));
        v.set_protocol(u32::from(self.protocol));
        v.set_header_checksum(0);
        v.set_src_addr(&self.src_addr);
        v.set_dst_addr(&self.dst_addr);
        let sum = internet_checksum(&buf[..IPV4_SIZE]);
        Ipv4Hdr::new_unchecked(&mut buf[..IPV4_SIZE]).set_header_checksum(u32::from(sum));
    }

    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        IPV4_SIZE
    }
}

/// IPv6 header contents. The version is implied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: [u8; 16],
    /// Destination address.
    pub dst_addr: [u8; 16],
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Next header (17 for RoCEv2).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Ipv6Repr {
    /// Reads and validates the header (version 6).
    #[inline(always)]
    pub fn parse<B: Buf>(v: &Ipv6Hdr<B>) -> Result<Self, WireError> {
        if v.version() != 6 {
            return Err(WireError::BadIpVersion(v.version() as u8));
        }
        Ok(Self {
            src_addr: v.src_addr(),
            dst_addr: v.dst_addr(),
            traffic_class: v.traffic_class() as u8,
            flow_label: v.flow_label(),
            next_header: v.next_header() as u8,
            hop_limit: v.hop_limit() as u8,
            payload_len: v.payload_length() as usize,
        })
    }
    /// Writes the header.
    pub fn emit<B: BufMut>(&self, v: &mut Ipv6Hdr<B>) {
        v.set_version(6);
        v.set_traffic_class(u32::from(self.traffic_class));
        v.set_flow_label(self.flow_label & 0xF_FFFF);
        v.set_payload_length(self.payload_len as u32 & 0xFFFF);
        v.set_next_header(u32::from(self.next_header));
        v.set_hop_limit(u32::from(self.hop_limit));
        v.set_src_addr(&self.src_addr);
        v.set_dst_addr(&self.dst_addr);
    }
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        IPV6_SIZE
    }
}

/// UDP header contents. The length is implied by the payload; RoCEv2 sends checksum 0 and
/// receivers ignore it (the ICRC covers the data; a ConnectX-4 Lx capture in scapy's
/// `test/contrib/roce.uts` carries checksum 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port (flow entropy in RoCEv2).
    pub src_port: u16,
    /// Destination port (4791).
    pub dst_port: u16,
    /// Bytes after the UDP header.
    pub payload_len: usize,
}

impl UdpRepr {
    /// Reads the header; fails if the length field is smaller than the header.
    #[inline(always)]
    pub fn parse<B: Buf>(v: &UdpHdr<B>) -> Result<Self, WireError> {
        let len = v.length() as usize;
        if len < UDP_SIZE {
            return Err(WireError::BadLength {
                layer: "udp",
                value: len,
            });
        }
        Ok(Self {
            src_port: v.src_port() as u16,
            dst_port: v.dst_port() as u16,
            payload_len: len - UDP_SIZE,
        })
    }
    /// Writes the header with checksum 0.
    pub fn emit<B: BufMut>(&self, v: &mut UdpHdr<B>) {
        v.set_src_port(u32::from(self.src_port));
        v.set_dst_port(u32::from(self.dst_port));
        v.set_length((UDP_SIZE + self.payload_len) as u32 & 0xFFFF);
        v.set_checksum(0);
    }
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        UDP_SIZE
    }
}

/// BTH contents (every field, reserved bits excluded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Raw opcode (see [`RcOpcode`](super::RcOpcode)).
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// Migration state.
    pub m: bool,
    /// Pad count (0-3).
    pub pad_cnt: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub p_key: u16,
    /// FECN (congestion experienced forward).
    pub fecn: bool,
    /// BECN (congestion backward).
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl BthRepr {
    /// Reads the header.
    #[inline(always)]
    pub fn parse<B: Buf>(v: &Bth<B>) -> Self {
        Self {
            opcode: v.opcode() as u8,
            se: v.se() != 0,
            m: v.m() != 0,
            pad_cnt: v.pad_cnt() as u8,
            tver: v.tver() as u8,
            p_key: v.p_key() as u16,
            fecn: v.fecn() != 0,
            becn: v.becn() != 0,
            dest_qp: v.dest_qp(),
            ack_req: v.ack_req() != 0,
            psn: v.psn(),
        }
    }
    /// Writes the header; reserved bits are written as 0.
    pub fn emit<B: BufMut>(&self, v: &mut Bth<B>) {
        v.set_opcode(u32::from(self.opcode));
        v.set_se(u32::from(self.se));
        v.set_m(u32::from(self.m));
        v.set_pad_cnt(u32::from(self.pad_cnt & 3));
        v.set_tver(u32::from(self.tver & 0xF));
        v.set_p_key(u32::from(self.p_key));
        v.set_fecn(u32::from(self.fecn));
        v.set_becn(u32::from(self.becn));
        v.set_resv6a(0);
        v.set_dest_qp(self.dest_qp & 0xFF_FFFF);
        v.set_ack_req(u32::from(self.ack_req));
        v.set_resv7(0);
        v.set_psn(self.psn & 0xFF_FFFF);
    }
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        BTH_SIZE
    }
}

/// RETH contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub r_key: u32,
    /// DMA length of the whole RDMA operation.
    pub dma_length: u32,
}

impl RethRepr {
    /// Reads the header.
    #[inline(always)]
    pub fn parse<B: Buf>(v: &Reth<B>) -> Self {
        Self {
            va: v.va(),
            r_key: v.r_key(),
            dma_length: v.dma_length(),
        }
    }
    /// Writes the header.
    pub fn emit<B: BufMut>(&self, v: &mut Reth<B>) {
        v.set_va(self.va);
        v.set_r_key(self.r_key);
        v.set_dma_length(self.dma_length);
    }
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        RETH_SIZE
    }
}

crate::enum_with_unknown! {
    /// NAK codes of an AETH syndrome `011xxxxx` (IBA Vol. 1 Table 44).
    pub enum NakCode(u8) {
        /// PSN sequence error.
        PsnSequenceError = 0,
        /// Invalid request.
        InvalidRequest = 1,
        /// Remote access error.
        RemoteAccessError = 2,
        /// Remote operational error.
        RemoteOperationalError = 3,
        /// Invalid RD request.
        InvalidRdRequest = 4,
    }
}

/// The AETH syndrome byte, decoded (IBA Vol. 1 §9.7.5.2.1, Tables 42-44): bit 7 reserved,
/// bits 6:5 the kind (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK), bits 4:0 the value
/// (credit count, RNR timer or NAK code). Lossless: any byte round-trips.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// ACK with a 5-bit credit count (`0b11111` = invalid/unlimited credits).
    Ack {
        /// Credit count.
        credits: u8,
    },
    /// Receiver-not-ready NAK with the encoded 5-bit RNR timer.
    RnrNak {
        /// Encoded RNR NAK timer.
        timer: u8,
    },
    /// NAK with its code.
    Nak(NakCode),
    /// Reserved encoding (bit 7 set or kind `10`), raw byte.
    Reserved(u8),
}

impl From<u8> for AethSyndrome {
    fn from(b: u8) -> Self {
        let value = b & 0x1F;
        match b >> 5 {
            0b000 => AethSyndrome::Ack { credits: value },
            0b001 => AethSyndrome::RnrNak { timer: value },
            0b011 => AethSyndrome::Nak(NakCode::from(value)),
            _ => AethSyndrome::Reserved(b),
        }
    }
}

impl From<AethSyndrome> for u8 {
    fn from(s: AethSyndrome) -> u8 {
        match s {
            AethSyndrome::Ack { credits } => credits & 0x1F,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            AethSyndrome::Nak(code) => 0x60 | (u8::from(code) & 0x1F),
            AethSyndrome::Reserved(b) => b,
        }
    }
}

/// AETH contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: AethSyndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads the header.
    #[inline(always)]
    pub fn parse<B: Buf>(v: &Aeth<B>) -> Self {
        Self {
            syndrome: AethSyndrome::from(v.syndrome() as u8),
            msn: v.msn(),
        }
    }
    /// Writes the header.
    pub fn emit<B: BufMut>(&self, v: &mut Aeth<B>) {
        v.set_syndrome(u32::from(u8::from(self.syndrome)));
        v.set_msn(self.msn & 0xFF_FFFF);
    }
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        AETH_SIZE
    }
}

/// AtomicETH contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub r_key: u32,
    /// Swap (CmpSwap) or add (FetchAdd) operand.
    pub swap_add_data: u64,
    /// Compare operand (CmpSwap).
    pub compare_data: u64,
}

impl AtomicEthRepr {
    /// Reads the header.
    #[inline(always)]
    pub fn parse<B: Buf>(v: &AtomicEth<B>) -> Self {
        Self {
            va: v.va(),
            r_key: v.r_key(),
            swap_add_data: v.swap_add_data(),
            compare_data: v.compare_data(),
        }
    }
    /// Writes the header.
    pub fn emit<B: BufMut>(&self, v: &mut AtomicEth<B>) {
        v.set_va(self.va);
        v.set_r_key(self.r_key);
        v.set_swap_add_data(self.swap_add_data);
        v.set_compare_data(self.compare_data);
    }
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_SIZE
    }
}

/// AtomicAckETH contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// The remote data before the atomic operation.
    pub orig_remote_data: u64,
}

impl AtomicAckEthRepr {
    /// Reads the header.
    #[inline(always)]
    pub fn parse<B: Buf>(v: &AtomicAckEth<B>) -> Self {
        Self {
            orig_remote_data: v.orig_remote_data(),
        }
    }
    /// Writes the header.
    pub fn emit<B: BufMut>(&self, v: &mut AtomicAckEth<B>) {
        v.set_orig_remote_data(self.orig_remote_data);
    }
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_SIZE
    }
}

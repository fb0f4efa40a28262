//! The RoCEv2 packet builder and parser: a whole frame as one `Repr`.
//!
//! [`RocePacket::emit`] writes Ethernet II, IP, UDP, BTH, the extension headers the opcode
//! calls for, the payload, zero pad and the ICRC into a caller buffer. [`RocePacket::parse`]
//! validates a received frame (lengths, IPv4 checksum, UDP port, ICRC, BTH version, opcode
//! against headers, pad) and returns a [`RocePacketRef`] whose payload borrows the frame.
//! Neither allocates. [`RocePacket::emit_in_place`] builds a frame around a payload the
//! caller already put in place, so the data path writes each payload byte once.
//!
//! Derived fields are computed by `emit` and filled in by `parse`: the EtherType, the IP
//! and UDP lengths, the IP protocol / next header (17), the IPv4 checksum, the BTH PadCnt
//! and the ICRC. The UDP checksum is sent as 0 and not checked on receipt (RoCEv2 relies on
//! the ICRC). Bytes after the IP datagram (Ethernet minimum-size padding) are ignored.

use core::fmt;
use core::ops::Deref;

use super::headers::*;
use super::icrc::{icrc, icrc_in_place};
use super::{
    EtherType, HeaderSet, ICRC_SIZE, IP_PROTO_UDP, ROCE_UDP_PORT, RcOpcode, WireError, opcode_info,
    pad_count,
};

/// The network header of a RoCEv2 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4 (EtherType 0x0800).
    V4(Ipv4Repr),
    /// IPv6 (EtherType 0x86DD).
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => IPV4_SIZE,
            IpRepr::V6(_) => IPV6_SIZE,
        }
    }
    /// The EtherType that announces this header.
    pub const fn ethertype(&self) -> EtherType {
        match self {
            IpRepr::V4(_) => EtherType::Ipv4,
            IpRepr::V6(_) => EtherType::Ipv6,
        }
    }
}

/// The extension headers between the BTH and the payload; which ones are present must
/// match the opcode ([`RcOpcode::headers`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExtHeaders {
    /// RETH (RDMA WRITE First/Only, READ request).
    pub reth: Option<RethRepr>,
    /// AtomicETH (CmpSwap, FetchAdd).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, READ response First/Last/Only, ATOMIC ACK).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (ATOMIC ACK).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt: the immediate data (`... with Immediate`).
    pub imm_dt: Option<u32>,
    /// IETH: the R_Key to invalidate (`SEND ... with Invalidate`).
    pub ieth: Option<u32>,
    /// DETH: the Q_Key and source QP of a UD packet.
    pub deth: Option<DethRepr>,
}

impl ExtHeaders {
    /// Which headers are present.
    pub const fn set(&self) -> HeaderSet {
        HeaderSet {
            reth: self.reth.is_some(),
            atomic_eth: self.atomic_eth.is_some(),
            aeth: self.aeth.is_some(),
            atomic_ack_eth: self.atomic_ack_eth.is_some(),
            imm_dt: self.imm_dt.is_some(),
            ieth: self.ieth.is_some(),
            deth: self.deth.is_some(),
        }
    }

    /// Writes the present headers in wire order into `buf` (exactly `set().len()` bytes),
    /// big-endian as their `Repr::emit`s write them (the packet tests compare the two).
    pub(super) fn emit(&self, buf: &mut [u8]) {
        let mut off = 0;
        let mut put = |bytes: &[u8]| {
            buf[off..off + bytes.len()].copy_from_slice(bytes);
            off += bytes.len();
        };
        if let Some(d) = &self.deth {
            put(&d.q_key.to_be_bytes());
            put(&(d.src_qp & 0xFF_FFFF).to_be_bytes());
        }
        if let Some(r) = &self.reth {
            put(&r.va.to_be_bytes());
            put(&r.r_key.to_be_bytes());
            put(&r.dma_length.to_be_bytes());
        }
        if let Some(a) = &self.atomic_eth {
            put(&a.va.to_be_bytes());
            put(&a.r_key.to_be_bytes());
            put(&a.swap_add_data.to_be_bytes());
            put(&a.compare_data.to_be_bytes());
        }
        if let Some(a) = &self.aeth {
            put(&((u32::from(u8::from(a.syndrome)) << 24) | (a.msn & 0xFF_FFFF)).to_be_bytes());
        }
        if let Some(a) = &self.atomic_ack_eth {
            put(&a.orig_remote_data.to_be_bytes());
        }
        if let Some(imm) = self.imm_dt {
            put(&imm.to_be_bytes());
        }
        if let Some(r_key) = self.ieth {
            put(&r_key.to_be_bytes());
        }
    }

    /// Reads the headers of `set` in wire order from `buf` (at least `set.len()` bytes).
    /// Straight-line, each header at its running offset (no closure: it stays inlined in
    /// the receive path).
    #[inline(always)]
    fn parse(set: HeaderSet, buf: &[u8]) -> Self {
        let mut ext = Self::default();
        let mut off = 0;
        if set.deth {
            ext.deth = Some(DethRepr::parse(&Deth::new_unchecked(&buf[..DETH_SIZE])));
            off += DETH_SIZE;
        }
        if set.reth {
            let b = &buf[off..off + RETH_SIZE];
            ext.reth = Some(RethRepr::parse(&Reth::new_unchecked(b)));
            off += RETH_SIZE;
        }
        if set.atomic_eth {
            let b = &buf[off..off + ATOMIC_ETH_SIZE];
            ext.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEth::new_unchecked(b)));
            off += ATOMIC_ETH_SIZE;
        }
        if set.aeth {
            let b = &buf[off..off + AETH_SIZE];
            ext.aeth = Some(AethRepr::parse(&Aeth::new_unchecked(b)));
            off += AETH_SIZE;
        }
        if set.atomic_ack_eth {
            let b = &buf[off..off + ATOMIC_ACK_ETH_SIZE];
            ext.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(b)));
            off += ATOMIC_ACK_ETH_SIZE;
        }
        if set.imm_dt {
            ext.imm_dt = Some(ImmDt::new_unchecked(&buf[off..off + IMM_DT_SIZE]).immediate_data());
            off += IMM_DT_SIZE;
        }
        if set.ieth {
            ext.ieth = Some(Ieth::new_unchecked(&buf[off..off + IETH_SIZE]).r_key());
        }
        ext
    }
}

/// A whole RoCEv2 frame: Ethernet II, IP, UDP, BTH, extension headers and payload (the pad
/// and ICRC are derived). See the module docs for which header fields `emit` derives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RocePacket<'a> {
    /// Ethernet header (the EtherType is derived from `ip`).
    pub eth: EthRepr,
    /// IP header (lengths and protocol are derived).
    pub ip: IpRepr,
    /// UDP header (the length is derived; `dst_port` should be [`ROCE_UDP_PORT`]).
    pub udp: UdpRepr,
    /// BTH (`pad_cnt` is derived from the payload length).
    pub bth: BthRepr,
    /// Extension headers.
    pub ext: ExtHeaders,
    /// Payload, without pad.
    pub payload: &'a [u8],
}

/// A parsed, validated frame: the packet with its payload borrowed from the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RocePacketRef<'a> {
    /// The packet.
    pub packet: RocePacket<'a>,
    /// The ICRC found in the frame (checked unless parsed with
    /// [`RocePacket::parse_trusted`]).
    pub icrc: u32,
    /// Bytes of the frame the packet occupies (less than the frame with Ethernet padding).
    pub frame_len: usize,
}

impl<'a> Deref for RocePacketRef<'a> {
    type Target = RocePacket<'a>;
    fn deref(&self) -> &RocePacket<'a> {
        &self.packet
    }
}

/// `Err(Truncated)` unless `len >= need`.
fn need(layer: &'static str, need: usize, len: usize) -> Result<(), WireError> {
    if len < need {
        Err(WireError::Truncated { layer, need, len })
    } else {
        Ok(())
    }
}

impl<'a> RocePacket<'a> {
    /// The BTH opcode, decoded.
    pub fn opcode(&self) -> RcOpcode {
        RcOpcode::from(self.bth.opcode)
    }

    /// Bytes after the UDP header: BTH, extension headers, payload, pad, ICRC.
    fn udp_payload_len(&self, payload_len: usize) -> usize {
        let padded = payload_len + usize::from(pad_count(payload_len));
        BTH_SIZE + self.ext.set().len() + padded + ICRC_SIZE
    }

    /// Bytes of the whole frame `emit` writes.
    pub fn buffer_len(&self) -> usize {
        ETH_SIZE + self.ip.buffer_len() + UDP_SIZE + self.udp_payload_len(self.payload.len())
    }

    /// Writes the frame into `buf` and returns its length. Fails, writing nothing, if the
    /// opcode is not implemented, the extension headers or payload do not fit the opcode, the
    /// packet exceeds the IP length field, or `buf` is too small.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_inner(buf, self.payload.len(), true)
    }

    /// Where the payload starts in a frame with these headers: after Ethernet, IP, UDP, BTH
    /// and the extension headers of `ext`.
    pub fn payload_offset(ip: &IpRepr, ext: &ExtHeaders) -> usize {
        ETH_SIZE + ip.buffer_len() + UDP_SIZE + BTH_SIZE + ext.set().len()
    }

    /// [`emit`](Self::emit) for a payload of `payload_len` bytes that is already in place at
    /// [`payload_offset`](Self::payload_offset) of `buf` (gathered there by the caller, so
    /// the payload is written once); `self.payload` is not used. Writes the headers, the pad
    /// and the ICRC around it, with the same checks as `emit`.
    pub fn emit_in_place(&self, buf: &mut [u8], payload_len: usize) -> Result<usize, WireError> {
        self.emit_inner(buf, payload_len, false)
    }

    fn emit_inner(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        copy_payload: bool,
    ) -> Result<usize, WireError> {
        let op = self.opcode();
        let want = op
            .headers()
            .ok_or(WireError::UnsupportedOpcode(self.bth.opcode))?;
        if self.ext.set() != want {
            return Err(WireError::HeaderMismatch {
                opcode: self.bth.opcode,
            });
        }
        if !op.has_payload() && payload_len != 0 {
            return Err(WireError::UnexpectedPayload {
                opcode: self.bth.opcode,
                len: payload_len,
            });
        }
        let udp_len = UDP_SIZE + self.udp_payload_len(payload_len);
        let ip_payload = match self.ip {
            IpRepr::V4(_) => IPV4_SIZE + udp_len,
            IpRepr::V6(_) => udp_len,
        };
        if ip_payload > usize::from(u16::MAX) {
            return Err(WireError::BadLength {
                layer: "ip",
                value: ip_payload,
            });
        }
        let total = ETH_SIZE + self.ip.buffer_len() + udp_len;
        if buf.len() < total {
            return Err(WireError::BufferTooSmall {
                need: total,
                len: buf.len(),
            });
        }
        let buf = &mut buf[..total];

        let eth = EthRepr {
            ethertype: self.ip.ethertype(),
            ..self.eth
        };
        eth.emit(&mut EthHdr::new_unchecked(&mut buf[..ETH_SIZE]));
        let mut off = ETH_SIZE;
        match self.ip {
            IpRepr::V4(ip) => {
                let ip = Ipv4Repr {
                    payload_len: udp_len,
                    protocol: IP_PROTO_UDP,
                    ..ip
                };
                ip.emit(&mut buf[off..off + IPV4_SIZE]);
            }
            IpRepr::V6(ip) => {
                let ip = Ipv6Repr {
                    payload_len: udp_len,
                    next_header: IP_PROTO_UDP,
                    ..ip
                };
                ip.emit(&mut Ipv6Hdr::new_unchecked(&mut buf[off..off + IPV6_SIZE]));
            }
        }
        off += self.ip.buffer_len();
        let udp = UdpRepr {
            payload_len: udp_len - UDP_SIZE,
            ..self.udp
        };
        udp.emit(&mut UdpHdr::new_unchecked(&mut buf[off..off + UDP_SIZE]));
        off += UDP_SIZE;
        let pad = pad_count(payload_len);
        let bth = BthRepr {
            pad_cnt: pad,
            ..self.bth
        };
        bth.emit(&mut Bth::new_unchecked(&mut buf[off..off + BTH_SIZE]));
        off += BTH_SIZE;
        let ext_len = want.len();
        self.ext.emit(&mut buf[off..off + ext_len]);
        off += ext_len;
        if copy_payload {
            buf[off..off + payload_len].copy_from_slice(self.payload);
        }
        off += payload_len;
        buf[off..off + usize::from(pad)].fill(0);
        off += usize::from(pad);
        let crc = icrc_in_place(&mut buf[ETH_SIZE..off])?;
        buf[off..off + ICRC_SIZE].copy_from_slice(&crc.to_le_bytes());
        Ok(off + ICRC_SIZE)
    }

    /// Parses and validates a frame. Checks, in order: Ethernet and IP lengths, EtherType,
    /// IP version, IPv4 options/fragments/checksum, protocol UDP, UDP length and port 4791,
    /// the ICRC, BTH TVer, the opcode, the extension headers' length, payload and pad.
    pub fn parse(buf: &'a [u8]) -> Result<RocePacketRef<'a>, WireError> {
        Self::parse_inner(buf, true)
    }

    /// As [`parse`](Self::parse), every check but the ICRC's: the ICRC is read into
    /// [`RocePacketRef::icrc`] and not recomputed.
    ///
    /// Only for frames that never left the device, whose bytes cannot have been corrupted
    /// in flight: the model port's internal loopback queue (the receive path passes its
    /// frames here; every frame that crossed a link goes through [`parse`](Self::parse)).
    /// Linux trusts its own loopback the same way: `dev_loopback_xmit`
    /// (`net/core/dev.c`) marks looped-back packets `CHECKSUM_UNNECESSARY`. The sender still
    /// generates the ICRC, so the frame stays a complete RoCEv2 packet.
    pub fn parse_trusted(buf: &'a [u8]) -> Result<RocePacketRef<'a>, WireError> {
        Self::parse_inner(buf, false)
    }

    /// [`parse`](Self::parse) if `verify_icrc`, else [`parse_trusted`](Self::parse_trusted),
    /// inlined into the caller: a receive path that sees both kinds of frame gets one copy
    /// of the parser, and the parsed packet is built in the caller's frame, not copied
    /// there.
    #[inline(always)]
    pub fn parse_with(buf: &'a [u8], verify_icrc: bool) -> Result<RocePacketRef<'a>, WireError> {
        Self::parse_inner(buf, verify_icrc)
    }

    /// The parser; `verify_icrc` false skips only the ICRC comparison.
    #[inline(always)]
    fn parse_inner(buf: &'a [u8], verify_icrc: bool) -> Result<RocePacketRef<'a>, WireError> {
        need("eth", ETH_SIZE, buf.len())?;
        let eth = EthRepr::parse(&EthHdr::new_unchecked(&buf[..ETH_SIZE]));
        match eth.ethertype {
            EtherType::Ipv4 => Self::parse_ip::<IPV4_SIZE>(buf, eth, verify_icrc),
            EtherType::Ipv6 => Self::parse_ip::<IPV6_SIZE>(buf, eth, verify_icrc),
            EtherType::Unknown(t) => Err(WireError::UnsupportedEtherType(t)),
        }
    }

    /// The parser after the Ethernet header, for an IP header of `IP` bytes (the one the
    /// EtherType announces): the header offsets are constants.
    #[inline(always)]
    fn parse_ip<const IP: usize>(
        buf: &'a [u8],
        eth: EthRepr,
        verify_icrc: bool,
    ) -> Result<RocePacketRef<'a>, WireError> {
        let (l3, l4) = (ETH_SIZE, ETH_SIZE + IP);
        let (ip, l3_end) = if IP == IPV4_SIZE {
            need("ipv4", l4, buf.len())?;
            let ip = Ipv4Repr::parse(&Ipv4Hdr::new_unchecked(&buf[l3..l4]))?;
            if ip.protocol != IP_PROTO_UDP {
                return Err(WireError::NotUdp(ip.protocol));
            }
            (IpRepr::V4(ip), l4 + ip.payload_len)
        } else {
            need("ipv6", l4, buf.len())?;
            let ip = Ipv6Repr::parse(&Ipv6Hdr::new_unchecked(&buf[l3..l4]))?;
            if ip.next_header != IP_PROTO_UDP {
                return Err(WireError::NotUdp(ip.next_header));
            }
            (IpRepr::V6(ip), l4 + ip.payload_len)
        };
        need("ip payload", l3_end, buf.len())?;
        need("udp", l4 + UDP_SIZE, l3_end)?;
        let udp = UdpRepr::parse(&UdpHdr::new_unchecked(&buf[l4..l4 + UDP_SIZE]))?;
        if l4 + UDP_SIZE + udp.payload_len != l3_end {
            return Err(WireError::BadLength {
                layer: "udp",
                value: UDP_SIZE + udp.payload_len,
            });
        }
        if udp.dst_port != ROCE_UDP_PORT {
            return Err(WireError::NotRoce {
                dst_port: udp.dst_port,
            });
        }
        let l5 = l4 + UDP_SIZE;
        need("bth+icrc", l5 + BTH_SIZE + ICRC_SIZE, l3_end)?;
        let icrc_at = l3_end - ICRC_SIZE;
        let got = u32::from_le_bytes([
            buf[icrc_at],
            buf[icrc_at + 1],
            buf[icrc_at + 2],
            buf[icrc_at + 3],
        ]);
        if verify_icrc {
            let want = icrc(&buf[l3..icrc_at])?;
            if got != want {
                return Err(WireError::BadIcrc { got, want });
            }
        }

        let bth = BthRepr::parse(&Bth::new_unchecked(&buf[l5..l5 + BTH_SIZE]));
        if bth.tver != 0 {
            return Err(WireError::BadTransportVersion(bth.tver));
        }
        let (set, has_payload) =
            opcode_info(bth.opcode).ok_or(WireError::UnsupportedOpcode(bth.opcode))?;
        let ext_at = l5 + BTH_SIZE;
        let data_at = ext_at + set.len();
        need("extension headers", data_at, icrc_at)?;
        let ext = ExtHeaders::parse(set, &buf[ext_at..data_at]);
        let data_len = icrc_at - data_at;
        let pad = usize::from(bth.pad_cnt);
        if !has_payload && data_len != 0 {
            return Err(WireError::UnexpectedPayload {
                opcode: bth.opcode,
                len: data_len,
            });
        }
        if pad > data_len || !data_len.is_multiple_of(4) {
            return Err(WireError::BadPad {
                pad_count: bth.pad_cnt,
                data_len,
            });
        }
        let payload = &buf[data_at..icrc_at - pad];
        Ok(RocePacketRef {
            packet: RocePacket {
                eth,
                ip,
                udp,
                bth,
                ext,
                payload,
            },
            icrc: got,
            frame_len: l3_end,
        })
    }
}

/// A one-line summary, e.g. for the fuzz target and traces.
impl fmt::Display for RocePacket<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ip {
            IpRepr::V4(ip) => {
                let [a, b, c, d] = ip.src_addr;
                let [e, g, h, i] = ip.dst_addr;
                write!(f, "IPv4 {a}.{b}.{c}.{d} > {e}.{g}.{h}.{i}")?;
            }
            IpRepr::V6(ip) => write!(f, "IPv6 {:02x?} > {:02x?}", ip.src_addr, ip.dst_addr)?,
        }
        let b = &self.bth;
        write!(
            f,
            " udp {} > {} {:?} qp {:#08x} psn {:#08x} pkey {:#06x}{}{}{}",
            self.udp.src_port,
            self.udp.dst_port,
            self.opcode(),
            b.dest_qp,
            b.psn,
            b.p_key,
            if b.se { " se" } else { "" },
            if b.ack_req { " ackreq" } else { "" },
            if b.m { " m" } else { "" },
        )?;
        let e = &self.ext;
        if let Some(r) = &e.reth {
            write!(
                f,
                " reth va {:#x} rkey {:#x} len {}",
                r.va, r.r_key, r.dma_length
            )?;
        }
        if let Some(a) = &e.atomic_eth {
            write!(
                f,
                " atomic va {:#x} rkey {:#x} swap_add {:#x} cmp {:#x}",
                a.va, a.r_key, a.swap_add_data, a.compare_data
            )?;
        }
        if let Some(a) = &e.aeth {
            write!(f, " aeth {:?} msn {:#x}", a.syndrome, a.msn)?;
        }
        if let Some(a) = &e.atomic_ack_eth {
            write!(f, " orig {:#x}", a.orig_remote_data)?;
        }
        if let Some(imm) = e.imm_dt {
            write!(f, " imm {imm:#x}")?;
        }
        if let Some(r_key) = e.ieth {
            write!(f, " inv rkey {r_key:#x}")?;
        }
        if let Some(d) = &e.deth {
            write!(f, " qkey {:#x} src_qp {:#x}", d.q_key, d.src_qp)?;
        }
        write!(f, " payload {}", self.payload.len())
    }
}

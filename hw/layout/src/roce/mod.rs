//! RoCEv2 wire formats: Ethernet II, IPv4/IPv6, UDP and the InfiniBand transport headers,
//! the invariant CRC, and a zero-allocation packet builder/parser (style.md §3-7, §21).
//!
//! A RoCEv2 frame, as model ports exchange it (InfiniBand Architecture Specification,
//! Release 1.2.1, Annex A17 "RoCEv2"; IBA Vol. 1 §9.2-9.3 for the transport headers):
//!
//! ```text
//! | Ethernet II 14 | IPv4 20 / IPv6 40 | UDP 8 (dst 4791) | BTH 12 | ext. headers | payload | pad 0-3 | ICRC 4 |
//! ```
//!
//! - [`headers`]: one `layout!` view and one `Repr` per header ([`Bth`]/[`BthRepr`], ...).
//! - [`icrc`](mod@icrc): the invariant CRC over the masked IP/UDP/BTH headers and the rest of
//!   the packet.
//! - [`template`]: [`HeaderTemplate`], a connection's fixed header bytes: the data path's
//!   frame builder (the same bytes as [`RocePacket`]'s, written with fewer steps).
//! - [`packet`]: [`RocePacket`] (emit) and [`RocePacket::parse`] (validating parse into a
//!   [`RocePacketRef`] that borrows the caller's buffer).
//!
//! Codes here ([`RcOpcode`], [`NakCode`], [`EtherType`]) are lossless (`Unknown(raw)`); the
//! packet parser refuses what it cannot interpret with a typed [`WireError`].

pub mod headers;
pub mod icrc;
pub mod packet;
pub mod template;

#[cfg(test)]
mod tests;

pub use headers::*;
pub use icrc::{Crc32, crc32, icrc, icrc_in_place};
pub use packet::{ExtHeaders, IpRepr, RocePacket, RocePacketRef};
pub use template::{BthVar, HeaderTemplate};

/// UDP destination port of RoCEv2 (IANA "roce", IBA Annex A17).
pub const ROCE_UDP_PORT: u16 = 4791;
/// IP protocol number of UDP.
pub const IP_PROTO_UDP: u8 = 17;
/// Bytes of the ICRC trailer.
pub const ICRC_SIZE: usize = 4;

crate::enum_with_unknown! {
    /// Ethernet II EtherType of the frames we carry.
    pub enum EtherType(u16) {
        /// IPv4.
        Ipv4 = 0x0800,
        /// IPv6.
        Ipv6 = 0x86DD,
    }
}

crate::enum_with_unknown! {
    /// BTH opcodes of the Reliable Connected transport (IBA Vol. 1 Table 38, transport
    /// prefix `000`), and the two of the Unreliable Datagram transport (prefix `011`): SEND
    /// Only and SEND Only with Immediate. Other transports (UC `001`, CNP `0x81`) and the
    /// UD codes without an IBA meaning decode as `Unknown`.
    pub enum RcOpcode(u8) {
        /// SEND First.
        SendFirst = 0x00,
        /// SEND Middle.
        SendMiddle = 0x01,
        /// SEND Last.
        SendLast = 0x02,
        /// SEND Last with Immediate.
        SendLastImm = 0x03,
        /// SEND Only.
        SendOnly = 0x04,
        /// SEND Only with Immediate.
        SendOnlyImm = 0x05,
        /// RDMA WRITE First.
        RdmaWriteFirst = 0x06,
        /// RDMA WRITE Middle.
        RdmaWriteMiddle = 0x07,
        /// RDMA WRITE Last.
        RdmaWriteLast = 0x08,
        /// RDMA WRITE Last with Immediate.
        RdmaWriteLastImm = 0x09,
        /// RDMA WRITE Only.
        RdmaWriteOnly = 0x0A,
        /// RDMA WRITE Only with Immediate.
        RdmaWriteOnlyImm = 0x0B,
        /// RDMA READ Request.
        RdmaReadRequest = 0x0C,
        /// RDMA READ Response First.
        RdmaReadResponseFirst = 0x0D,
        /// RDMA READ Response Middle.
        RdmaReadResponseMiddle = 0x0E,
        /// RDMA READ Response Last.
        RdmaReadResponseLast = 0x0F,
        /// RDMA READ Response Only.
        RdmaReadResponseOnly = 0x10,
        /// Acknowledge.
        Acknowledge = 0x11,
        /// ATOMIC Acknowledge.
        AtomicAcknowledge = 0x12,
        /// CmpSwap.
        CompareSwap = 0x13,
        /// FetchAdd.
        FetchAdd = 0x14,
        /// SEND Last with Invalidate.
        SendLastInv = 0x16,
        /// SEND Only with Invalidate.
        SendOnlyInv = 0x17,
        /// UD SEND Only (DETH).
        UdSendOnly = 0x64,
        /// UD SEND Only with Immediate (DETH, ImmDt).
        UdSendOnlyImm = 0x65,
    }
}

/// Which extension headers follow the BTH, in wire order (IBA Vol. 1 §9.2: DETH, RETH,
/// AtomicETH, AETH, AtomicAckETH, ImmDt, IETH).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeaderSet {
    /// RDMA Extended Transport Header.
    pub reth: bool,
    /// Atomic Extended Transport Header.
    pub atomic_eth: bool,
    /// ACK Extended Transport Header.
    pub aeth: bool,
    /// Atomic ACK Extended Transport Header.
    pub atomic_ack_eth: bool,
    /// Immediate data.
    pub imm_dt: bool,
    /// Invalidate Extended Transport Header.
    pub ieth: bool,
    /// Datagram Extended Transport Header (UD).
    pub deth: bool,
}

impl HeaderSet {
    /// Total bytes of the extension headers in the set.
    pub const fn len(&self) -> usize {
        (self.reth as usize) * RETH_SIZE
            + (self.atomic_eth as usize) * ATOMIC_ETH_SIZE
            + (self.aeth as usize) * AETH_SIZE
            + (self.atomic_ack_eth as usize) * ATOMIC_ACK_ETH_SIZE
            + (self.imm_dt as usize) * IMM_DT_SIZE
            + (self.ieth as usize) * IETH_SIZE
            + (self.deth as usize) * DETH_SIZE
    }

    /// True when no extension header follows the BTH.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RcOpcode {
    /// The extension headers this opcode carries (IBA Vol. 1 Table 38, "Packet header
    /// formats"), or `None` for an opcode this build does not implement.
    pub const fn headers(self) -> Option<HeaderSet> {
        use RcOpcode::*;
        let none = HeaderSet {
            reth: false,
            atomic_eth: false,
            aeth: false,
            atomic_ack_eth: false,
            imm_dt: false,
            ieth: false,
            deth: false,
        };
        Some(match self {
            SendFirst | SendMiddle | SendLast | SendOnly => none,
            RdmaWriteMiddle | RdmaWriteLast | RdmaReadResponseMiddle => none,
            SendLastImm | SendOnlyImm | RdmaWriteLastImm => HeaderSet {
                imm_dt: true,
                ..none
            },
            SendLastInv | SendOnlyInv => HeaderSet { ieth: true, ..none },
            RdmaWriteFirst | RdmaWriteOnly | RdmaReadRequest => HeaderSet { reth: true, ..none },
            RdmaWriteOnlyImm => HeaderSet {
                reth: true,
                imm_dt: true,
                ..none
            },
            RdmaReadResponseFirst | RdmaReadResponseLast | RdmaReadResponseOnly | Acknowledge => {
                HeaderSet { aeth: true, ..none }
            }
            AtomicAcknowledge => HeaderSet {
                aeth: true,
                atomic_ack_eth: true,
                ..none
            },
            CompareSwap | FetchAdd => HeaderSet {
                atomic_eth: true,
                ..none
            },
            UdSendOnly => HeaderSet { deth: true, ..none },
            UdSendOnlyImm => HeaderSet {
                deth: true,
                imm_dt: true,
                ..none
            },
            Unknown(_) => return None,
        })
    }

    /// Whether the packet may carry a payload (SEND, WRITE and READ response data packets).
    /// READ requests, ACKs and atomics carry none.
    pub const fn has_payload(self) -> bool {
        use RcOpcode::*;
        !matches!(
            self,
            RdmaReadRequest | Acknowledge | AtomicAcknowledge | CompareSwap | FetchAdd | Unknown(_)
        )
    }

    /// Sent by the requester (SEND, WRITE, READ request, atomics).
    pub const fn is_request(self) -> bool {
        use RcOpcode::*;
        matches!(
            self,
            SendFirst
                | SendMiddle
                | SendLast
                | SendLastImm
                | SendOnly
                | SendOnlyImm
                | RdmaWriteFirst
                | RdmaWriteMiddle
                | RdmaWriteLast
                | RdmaWriteLastImm
                | RdmaWriteOnly
                | RdmaWriteOnlyImm
                | RdmaReadRequest
                | CompareSwap
                | FetchAdd
                | SendLastInv
                | SendOnlyInv
        )
    }

    /// Sent by the responder (READ responses, ACK, ATOMIC ACK).
    pub const fn is_response(self) -> bool {
        use RcOpcode::*;
        matches!(
            self,
            RdmaReadResponseFirst
                | RdmaReadResponseMiddle
                | RdmaReadResponseLast
                | RdmaReadResponseOnly
                | Acknowledge
                | AtomicAcknowledge
        )
    }

    /// The UD opcodes this build implements (not in [`ALL`](Self::ALL), which an RC QP
    /// takes).
    pub const UD: [RcOpcode; 2] = [RcOpcode::UdSendOnly, RcOpcode::UdSendOnlyImm];

    /// Whether the opcode is of the UD transport.
    pub const fn is_ud(self) -> bool {
        matches!(self, RcOpcode::UdSendOnly | RcOpcode::UdSendOnlyImm)
    }

    /// Every RC opcode this build implements, in numeric order.
    pub const ALL: [RcOpcode; 23] = {
        use RcOpcode::*;
        [
            SendFirst,
            SendMiddle,
            SendLast,
            SendLastImm,
            SendOnly,
            SendOnlyImm,
            RdmaWriteFirst,
            RdmaWriteMiddle,
            RdmaWriteLast,
            RdmaWriteLastImm,
            RdmaWriteOnly,
            RdmaWriteOnlyImm,
            RdmaReadRequest,
            RdmaReadResponseFirst,
            RdmaReadResponseMiddle,
            RdmaReadResponseLast,
            RdmaReadResponseOnly,
            Acknowledge,
            AtomicAcknowledge,
            CompareSwap,
            FetchAdd,
            SendLastInv,
            SendOnlyInv,
        ]
    };
}

/// [`RcOpcode::headers`] and [`RcOpcode::has_payload`] of every raw opcode, looked up
/// by the packet builders and the parser (one load instead of two matches).
const OPCODE_INFO: [Option<(HeaderSet, bool)>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < RcOpcode::ALL.len() + RcOpcode::UD.len() {
        let op = if i < RcOpcode::ALL.len() {
            RcOpcode::ALL[i]
        } else {
            RcOpcode::UD[i - RcOpcode::ALL.len()]
        };
        if let Some(h) = op.headers() {
            t[op.raw() as usize] = Some((h, op.has_payload()));
        }
        i += 1;
    }
    t
};

/// The extension headers raw opcode `op` carries and whether it may carry a payload, or
/// `None` for an opcode this build does not implement (as [`RcOpcode::headers`]).
#[inline(always)]
pub(crate) fn opcode_info(op: u8) -> Option<(HeaderSet, bool)> {
    OPCODE_INFO[usize::from(op)]
}

/// A 24-bit packet sequence number (IBA Vol. 1 §9.7.1) with modular arithmetic.
///
/// Comparison follows the IBA rule: `a` is before `b` when `b` lies within the half of the
/// PSN space (2^23) that follows `a`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the 24 PSN bits.
    pub const MASK: u32 = 0x00FF_FFFF;
    /// Half of the PSN space: the window within which two PSNs are ordered.
    pub const HALF: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Self(v & Self::MASK)
    }
    /// The 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }
    /// `self + n` modulo 2^24.
    pub const fn add(self, n: u32) -> Self {
        Self::new(self.0.wrapping_add(n))
    }
    /// The next PSN.
    pub const fn next(self) -> Self {
        self.add(1)
    }
    /// Signed distance from `other` to `self` in `[-2^23, 2^23)`: positive when `self` is
    /// after `other`.
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back: sign-extends bit 23.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }
    /// `self` comes strictly before `other` (within half the space).
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }
    /// `self` comes strictly after `other` (within half the space).
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

/// Pad bytes that bring a payload of `len` bytes to a multiple of 4: the BTH PadCnt
/// (IBA Vol. 1 §9.2, BTH; rxe `bth_pad`). Pad bytes are zero and covered by the ICRC.
pub const fn pad_count(len: usize) -> u8 {
    ((4 - (len % 4)) % 4) as u8
}

/// Why a frame could not be parsed or emitted. Layout-level, so dependency-free
/// (Display/Error by hand, like [`LengthError`](crate::LengthError)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The buffer ended before a header or the length a header announces.
    Truncated {
        /// Header or part being read.
        layer: &'static str,
        /// Bytes needed from the start of the frame.
        need: usize,
        /// Bytes available.
        len: usize,
    },
    /// The EtherType is neither IPv4 nor IPv6.
    UnsupportedEtherType(u16),
    /// The IP version nibble does not match the EtherType.
    BadIpVersion(u8),
    /// IPv4 with options (IHL other than 5) is not RoCEv2 traffic we produce.
    Ipv4Options {
        /// Header length in 32-bit words.
        ihl: u8,
    },
    /// The IPv4 packet is a fragment.
    Fragmented,
    /// The IPv4 header checksum is wrong.
    BadIpChecksum {
        /// Value in the header.
        got: u16,
        /// Value computed over the header.
        want: u16,
    },
    /// The IP payload is not UDP.
    NotUdp(u8),
    /// The IP or UDP length fields disagree with each other or the frame.
    BadLength {
        /// Header whose length field is wrong.
        layer: &'static str,
        /// The length it announces.
        value: usize,
    },
    /// The UDP destination port is not 4791.
    NotRoce {
        /// The destination port found.
        dst_port: u16,
    },
    /// BTH TVer is not 0.
    BadTransportVersion(u8),
    /// A BTH opcode this build does not implement (raw value).
    UnsupportedOpcode(u8),
    /// The pad count does not fit the payload, or the opcode carries no payload.
    BadPad {
        /// BTH PadCnt.
        pad_count: u8,
        /// Bytes between the headers and the ICRC.
        data_len: usize,
    },
    /// An opcode that carries no payload came with payload bytes.
    UnexpectedPayload {
        /// Raw opcode.
        opcode: u8,
        /// Payload bytes found.
        len: usize,
    },
    /// (emit) The extension headers given do not match the opcode.
    HeaderMismatch {
        /// Raw opcode.
        opcode: u8,
    },
    /// The ICRC does not match the packet.
    BadIcrc {
        /// ICRC in the packet.
        got: u32,
        /// ICRC computed over the packet.
        want: u32,
    },
    /// (emit) The output buffer is too small.
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        len: usize,
    },
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            WireError::Truncated { layer, need, len } => {
                write!(f, "truncated {layer}: need {need} bytes, have {len}")
            }
            WireError::UnsupportedEtherType(t) => write!(f, "unsupported EtherType {t:#06x}"),
            WireError::BadIpVersion(v) => write!(f, "IP version {v} does not match the EtherType"),
            WireError::Ipv4Options { ihl } => {
                write!(f, "IPv4 options are not supported (IHL {ihl})")
            }
            WireError::Fragmented => write!(f, "IPv4 fragment"),
            WireError::BadIpChecksum { got, want } => {
                write!(
                    f,
                    "bad IPv4 header checksum {got:#06x}, expected {want:#06x}"
                )
            }
            WireError::NotUdp(p) => write!(f, "IP protocol {p} is not UDP"),
            WireError::BadLength { layer, value } => write!(f, "bad {layer} length {value}"),
            WireError::NotRoce { dst_port } => {
                write!(f, "UDP port {dst_port} is not RoCEv2 (4791)")
            }
            WireError::BadTransportVersion(v) => write!(f, "BTH TVer {v} is not 0"),
            WireError::UnsupportedOpcode(op) => write!(f, "unsupported BTH opcode {op:#04x}"),
            WireError::BadPad {
                pad_count,
                data_len,
            } => {
                write!(
                    f,
                    "pad count {pad_count} does not fit {data_len} data bytes"
                )
            }
            WireError::UnexpectedPayload { opcode, len } => {
                write!(
                    f,
                    "opcode {opcode:#04x} carries no payload but has {len} bytes"
                )
            }
            WireError::HeaderMismatch { opcode } => {
                write!(f, "extension headers do not match opcode {opcode:#04x}")
            }
            WireError::BadIcrc { got, want } => {
                write!(f, "bad ICRC {got:#010x}, expected {want:#010x}")
            }
            WireError::BufferTooSmall { need, len } => {
                write!(
                    f,
                    "buffer of {len} bytes is smaller than the {need}-byte packet"
                )
            }
        }
    }
}

impl std::error::Error for WireError {}

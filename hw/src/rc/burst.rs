//! [`Burst`]: the segmentation offload of a port's own loopback queue, shared by the
//! requester (WRITE and SEND bursts out, READ response bursts in) and the responder (the
//! reverse), and the whole messages that follow a burst in its frame.

use super::sge::{RcSge, SgeList};
use crate::layout::roce::{AethRepr, RethRepr};

/// Segmentation offload on a local link: consecutive packets of one message (RDMA WRITE or
/// SEND requests, or the responses to an RDMA READ) sent as one frame, whose payload stays in
/// the sender's memory until the receiver copies it in.
///
/// Only a port's loopback offload sends bursts ([`Offload::send_burst`](super::Offload::send_burst)),
/// for frames that stay inside the device (the port's own loopback queue carries the burst
/// beside its frame), as Linux's `lo` takes 64 KiB
/// segments (`NETIF_F_ALL_TSO`, MTU 64 KiB) and hands the sender's buffer to the receiver
/// without a copy: nothing on such a path can split, lose or corrupt a packet, and no wire
/// sees it. The frame holds the first packet's headers (opcode, PSN, RETH) and no payload;
/// the burst says what the packets after it carry. The receiver takes it as it would
/// take the packets one by one (a responder: PSN, opcode sequence, lengths, R_Key, then the
/// data, then an ACK if the last packet asks; a requester: the response's PSN, opcodes and
/// lengths, then the data and the completion), with one key check and one copy for the
/// whole. Every frame that crosses a link is a real packet of at most one MTU.
///
/// A burst that ends its message may carry whole messages that follow it ([`more`](Self::more)):
/// RDMA WRITEs and SENDs that follow it in the send queue, or the responses to READs that
/// follow it in the responder's queue, as a TCP sender coalesces small writes into one
/// segment. The receiver takes each as if it came in a burst of its own, in order.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Burst {
    /// Packets it stands for (at least 1), from the frame's PSN on.
    pub packets: u32,
    /// Payload bytes of all of them: one MTU in each but the last, which has 1 to MTU
    /// (0 only in a lone zero-length packet).
    pub len: u32,
    /// The last packet ends the message (RDMA WRITE or SEND Last or Only, with `imm`; a
    /// READ response burst always does).
    pub ends: bool,
    /// The immediate data of a last packet of RDMA WRITE or SEND with immediate.
    pub imm: Option<u32>,
    /// The solicited-event bit of a last packet of SEND.
    pub se: bool,
    /// AckReq of the last packet.
    pub ack_req: bool,
    /// Bytes the packets would take on a wire (the port counters count them).
    pub wire_len: u32,
    /// The payload: `len` bytes from byte `offset` of `sges`, read in the sender's
    /// protection domain `domain` ([`Memory::domain`](super::Memory::domain)). A READ response's is one entry:
    /// the R_Key and address of the request, checked by the responder for remote read.
    pub sges: SgeList,
    /// See `sges`.
    pub offset: u64,
    /// See `sges`.
    pub domain: u32,
    /// Whole messages (RDMA WRITEs and SENDs after a request burst, READ responses after a
    /// READ response burst) that follow this burst's message in PSN order (none unless it
    /// `ends` it); their payloads are read in the same `domain`.
    pub more: MoreMsgs,
}

impl Burst {
    /// Packets the frame stands for: the burst's own and those of [`more`](Self::more).
    pub fn frame_packets(&self) -> u32 {
        self.more
            .as_slice()
            .iter()
            .fold(self.packets, |n, m| n + m.packets)
    }

    /// Bytes the frame's packets would take on a wire.
    pub fn frame_wire_len(&self) -> u32 {
        self.more
            .as_slice()
            .iter()
            .fold(self.wire_len, |n, m| n + m.wire_len)
    }
}

/// Most whole messages a [`Burst`] carries after its own.
pub const MAX_MORE: usize = 7;

/// A whole RDMA WRITE or SEND (with or without immediate) from one local SGE, or all the
/// responses to one RDMA READ, carried by a [`Burst`] after its own message: what its first
/// packet's headers say, and its payload (a READ response's: the R_Key and range of the
/// request, in the responder's domain).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoreMsg {
    /// Its packets (all of the message's, at least 1).
    pub packets: u32,
    /// The first packet's raw opcode (RDMA WRITE or SEND First, Only or Only with
    /// Immediate; RDMA READ Response First or Only).
    pub opcode: u8,
    /// A WRITE's RETH: remote address, R_Key and the message's length (none for a SEND).
    pub reth: Option<RethRepr>,
    /// The message's length in bytes.
    pub len: u32,
    /// The immediate data of a WRITE or SEND with immediate.
    pub imm: Option<u32>,
    /// The solicited-event bit of a SEND's last packet.
    pub se: bool,
    /// A READ response's AETH (its first packet's).
    pub aeth: Option<AethRepr>,
    /// AckReq of its last packet.
    pub ack_req: bool,
    /// Bytes its packets would take on a wire.
    pub wire_len: u32,
    /// The payload, read in the burst's domain.
    pub sge: RcSge,
}

/// The [`MoreMsg`]s of a [`Burst`]: up to [`MAX_MORE`], in order (no allocation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoreMsgs {
    items: [MoreMsg; MAX_MORE],
    len: u8,
}

impl MoreMsgs {
    /// The entries, in order.
    pub fn as_slice(&self) -> &[MoreMsg] {
        &self.items[..usize::from(self.len)]
    }

    /// Appends `w`; false (nothing appended) when full.
    pub fn push(&mut self, w: MoreMsg) -> bool {
        let Some(slot) = self.items.get_mut(usize::from(self.len)) else {
            return false;
        };
        *slot = w;
        self.len += 1;
        true
    }

    /// Whether another entry fits.
    pub fn is_full(&self) -> bool {
        usize::from(self.len) == MAX_MORE
    }
}

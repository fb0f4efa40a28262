//! Send work requests of a connected (RC) QP: the operation, its local data and flags, as
//! [`Qp::post_send`](crate::resource::Qp::post_send) takes them and `post` writes them into
//! the ring. Their public home is [`datapath`](super), with the rest of the work-request
//! vocabulary: [`Sge`], [`Remote`] and [`PostError`](super::PostError).

use uhca_layout::wqe::fm_ce_se;

use super::wqe::{Remote, Sge};

/// Send flags of a work request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags(u8);

impl SendFlags {
    /// No completion unless it fails.
    pub const NONE: SendFlags = SendFlags(0);
    /// Write a CQE on success too (`MLX5_WQE_CTRL_CQ_UPDATE`, §9.5).
    pub const SIGNALED: SendFlags = SendFlags(fm_ce_se::CQ_UPDATE);
    /// The receiver's CQE carries the solicited-event bit.
    pub const SOLICITED: SendFlags = SendFlags(fm_ce_se::SOLICITED);
    /// Wait for earlier READs/atomics before this one (fence mode 2).
    pub const FENCE: SendFlags = SendFlags(fm_ce_se::FENCE);
}

impl SendFlags {
    /// The `fm_ce_se` bits of the control segment (§9.5).
    #[inline(always)]
    pub(crate) const fn bits(self) -> u8 {
        self.0
    }

    /// Both sets of flags (usable in constants).
    pub const fn union(self, other: SendFlags) -> SendFlags {
        SendFlags(self.0 | other.0)
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// Local data of a SEND or WRITE: data segments or inline bytes (copied into the WQE).
#[derive(Clone, Copy, Debug)]
pub enum Local<'a> {
    /// Scatter/gather elements.
    Sges(&'a [Sge]),
    /// Bytes carried in the WQE itself (up to the QP's `max_inline`).
    Inline(&'a [u8]),
}

/// The operation of a send work request (§9.5 segment table).
#[derive(Clone, Copy, Debug)]
pub enum SendOp<'a> {
    /// RDMA WRITE.
    Write {
        /// Local data.
        local: Local<'a>,
        /// Remote target.
        remote: Remote,
    },
    /// RDMA WRITE with immediate (consumes a receive at the peer).
    WriteImm {
        /// Local data.
        local: Local<'a>,
        /// Remote target.
        remote: Remote,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into `local`.
    Read {
        /// Local scatter list.
        local: &'a [Sge],
        /// Remote source.
        remote: Remote,
    },
    /// SEND.
    Send {
        /// Local data.
        local: Local<'a>,
    },
    /// SEND with immediate.
    SendImm {
        /// Local data.
        local: Local<'a>,
        /// Immediate data.
        imm: u32,
    },
    /// Atomic compare-and-swap of the 8 bytes at `remote`; the old value lands in `local`
    /// (big-endian, §9.5).
    CompareSwap {
        /// 8-byte local buffer for the original value.
        local: Sge,
        /// 8-byte aligned remote address.
        remote: Remote,
        /// Value compared.
        compare: u64,
        /// Value swapped in on equality.
        swap: u64,
    },
    /// Atomic fetch-and-add.
    FetchAdd {
        /// 8-byte local buffer for the original value.
        local: Sge,
        /// 8-byte aligned remote address.
        remote: Remote,
        /// Value added.
        add: u64,
    },
}

/// A send work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp<'a>,
    /// Signaled, solicited, fence.
    pub flags: SendFlags,
}

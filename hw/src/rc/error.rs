//! Why the RC engine refuses a work request when it is posted.

/// Why a work request was refused at post time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RcPostError {
    /// The send queue is full.
    #[error("send queue full")]
    QueueFull,
    /// Inline data on READ or an atomic.
    #[error("inline data is allowed only for SEND and RDMA WRITE")]
    InlineNotAllowed,
    /// The local buffer of an atomic is not 8 bytes.
    #[error("atomic local buffer of {len} bytes, must be 8")]
    BadAtomicLength {
        /// Bytes given.
        len: u64,
    },
    /// The message is longer than the QP allows (`RcQpConfig::log_max_msg`, at most IBA's
    /// 2^31 bytes, Vol. 1 §9.4), or alone spans half the PSN space.
    #[error("message of {len} bytes exceeds the QP's maximum message size")]
    TooLong {
        /// Bytes given.
        len: u64,
    },
    /// More inline bytes than [`MAX_INLINE`](super::MAX_INLINE).
    #[error("more than {max} inline bytes")]
    InlineTooLong {
        /// The limit.
        max: usize,
    },
    /// Both inline data and SGEs in one request.
    #[error("inline data and scatter/gather entries in one request")]
    MixedLocalData,
    /// More SGEs than [`MAX_SGE`](super::MAX_SGE).
    #[error("more than {max} scatter/gather entries")]
    TooManySges {
        /// The limit.
        max: usize,
    },
}

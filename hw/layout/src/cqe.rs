//! Completion queue entries (prm-subset.md §9.7).

use crate::layout;

/// Bytes per (64-byte format) CQE.
pub const CQE_SIZE: usize = 64;
/// Byte offset of `op_own`, which the device writes last.
pub const OP_OWN_OFFSET: usize = 0x3f;
/// `op_own` of a freshly initialised entry (opcode INVALID, owner 0).
pub const OP_OWN_INIT: u8 = 0xF0;

layout! {
    /// A CQE of a successful completion (`mlx5_cqe64`).
    pub struct Cqe, "cqe64", size 64;
    wqe_id, set_wqe_id: 0x00 [15:0],
    rss_hash_result, set_rss_hash_result: 0x0c [31:0],
    rss_hash_type, set_rss_hash_type: 0x10 [31:24],
    ml_path, set_ml_path: 0x10 [23:16],
    check_sum, set_check_sum: 0x14 [31:16],
    slid, set_slid: 0x14 [15:0],
    g, set_g: 0x18 [29:28],
    sl, set_sl: 0x18 [27:24],
    rqpn, set_rqpn: 0x18 [23:0],
    hds_ip_ext, set_hds_ip_ext: 0x1c [31:24],
    l4_l3_hdr_type, set_l4_l3_hdr_type: 0x1c [23:16],
    vlan_info, set_vlan_info: 0x1c [15:0],
    lro_num_seg, set_lro_num_seg: 0x20 [31:24],
    srqn_uidx, set_srqn_uidx: 0x20 [23:0],
    imm_inval_pkey, set_imm_inval_pkey: 0x24 [31:0],
    byte_cnt, set_byte_cnt: 0x2c [31:0],
    timestamp, set_timestamp: 0x30 u64,
    sop, set_sop: 0x38 [31:24],
    qpn, set_qpn: 0x38 [23:0],
    wqe_counter, set_wqe_counter: 0x3c [31:16],
    signature, set_signature: 0x3c [15:8],
    op_own, set_op_own: 0x3c [7:0],
}

layout! {
    /// An error CQE (`mlx5_err_cqe`, opcodes 13/14).
    pub struct ErrCqe, "err_cqe", size 64;
    srqn, set_srqn: 0x20 [23:0],
    byte_cnt, set_byte_cnt: 0x2c [31:0],
    hw_err_synd, set_hw_err_synd: 0x34 [31:24],
    hw_synd_type, set_hw_synd_type: 0x34 [23:16],
    vendor_err_synd, set_vendor_err_synd: 0x34 [15:8],
    syndrome, set_syndrome: 0x34 [7:0],
    s_wqe_opcode, set_s_wqe_opcode: 0x38 [31:24],
    qpn, set_qpn: 0x38 [23:0],
    wqe_counter, set_wqe_counter: 0x3c [31:16],
    signature, set_signature: 0x3c [15:8],
    op_own, set_op_own: 0x3c [7:0],
}

/// The CQE fields that the data path reads out of whole big-endian 8-byte words
/// ([`WordField::get`](crate::WordField::get)), looked up in the tables above at
/// compile time: one definition of each field, no second table.
pub mod fast {
    use super::{Cqe, ErrCqe};
    use crate::{Field, WordField};

    /// `cqe64.op_own` (the last byte, written last by the device).
    pub const OP_OWN: WordField = WordField::of(Field::named(Cqe::<()>::FIELDS, "op_own"));
    /// `cqe64.wqe_counter`.
    pub const WQE_COUNTER: WordField =
        WordField::of(Field::named(Cqe::<()>::FIELDS, "wqe_counter"));
    /// `cqe64.qpn`.
    pub const QPN: WordField = WordField::of(Field::named(Cqe::<()>::FIELDS, "qpn"));
    /// `cqe64.sop` (the send opcode of a requester CQE).
    pub const SOP: WordField = WordField::of(Field::named(Cqe::<()>::FIELDS, "sop"));
    /// `cqe64.byte_cnt`.
    pub const BYTE_CNT: WordField = WordField::of(Field::named(Cqe::<()>::FIELDS, "byte_cnt"));
    /// `cqe64.imm_inval_pkey`.
    pub const IMM_INVAL_PKEY: WordField =
        WordField::of(Field::named(Cqe::<()>::FIELDS, "imm_inval_pkey"));
    /// `err_cqe.syndrome`.
    pub const ERR_SYNDROME: WordField =
        WordField::of(Field::named(ErrCqe::<()>::FIELDS, "syndrome"));

    /// The 8-byte word holding `op_own`, `wqe_counter`, `qpn` and `sop`: one load gives
    /// the owner bit and everything a requester completion needs.
    pub const TAIL_WORD: usize = OP_OWN.word;
    const _: () = assert!(
        WQE_COUNTER.word == TAIL_WORD
            && QPN.word == TAIL_WORD
            && SOP.word == TAIL_WORD
            && OP_OWN.shift == 0
    );

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::cqe::CQE_SIZE;

        #[test]
        fn word_reads_match_the_getters() {
            let mut b = [0u8; CQE_SIZE];
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i as u8).wrapping_mul(37) ^ 0xA5;
            }
            let c = Cqe::new_unchecked(&b[..]);
            let w = |f: WordField| {
                let k = f.word * 8;
                f.get(u64::from_be_bytes(b[k..k + 8].try_into().unwrap())) as u32
            };
            assert_eq!(w(OP_OWN), c.op_own());
            assert_eq!(w(WQE_COUNTER), c.wqe_counter());
            assert_eq!(w(QPN), c.qpn());
            assert_eq!(w(SOP), c.sop());
            assert_eq!(w(BYTE_CNT), c.byte_cnt());
            assert_eq!(w(IMM_INVAL_PKEY), c.imm_inval_pkey());
            assert_eq!(w(ERR_SYNDROME), ErrCqe::new_unchecked(&b[..]).syndrome());
        }
    }
}

crate::enum_with_unknown! {
    /// CQE opcodes, `op_own >> 4` (§9.7).
    pub enum CqeOpcode(u8) {
        /// Requester completion.
        Req = 0,
        /// Responder: RDMA WRITE with immediate.
        RespWrImm = 1,
        /// Responder: SEND.
        RespSend = 2,
        /// Responder: SEND with immediate.
        RespSendImm = 3,
        /// Responder: SEND with invalidate.
        RespSendInv = 4,
        /// CQ resize.
        Resize = 5,
        /// No packet.
        NoPacket = 6,
        /// Signature error.
        SigErr = 12,
        /// Requester error.
        ReqErr = 13,
        /// Responder error.
        RespErr = 14,
        /// Not yet written.
        Invalid = 15,
    }
}

crate::enum_with_unknown! {
    /// Error CQE syndromes (§9.7, `cq.h`).
    pub enum CqeSyndrome(u8) {
        /// Local length error.
        LocalLength = 0x01,
        /// Local QP operation error.
        LocalQpOp = 0x02,
        /// Local protection error.
        LocalProt = 0x04,
        /// Flushed (the QP is in ERR).
        WrFlush = 0x05,
        /// Memory window bind error.
        MwBind = 0x06,
        /// Bad response.
        BadResp = 0x10,
        /// Local access error.
        LocalAccess = 0x11,
        /// Remote invalid request.
        RemoteInvalReq = 0x12,
        /// Remote access error.
        RemoteAccess = 0x13,
        /// Remote operation error.
        RemoteOp = 0x14,
        /// Transport retry counter exceeded.
        TransportRetryExc = 0x15,
        /// RNR retry counter exceeded.
        RnrRetryExc = 0x16,
        /// Remote aborted.
        RemoteAborted = 0x22,
    }
}

/// The CQE at consumer index `ci` is software-owned when its opcode is not INVALID and its
/// owner bit equals the pass parity of `ci` (§9.7).
#[inline]
pub const fn cqe_is_sw_owned(op_own: u8, ci: u32, log_cq_size: u32) -> bool {
    (op_own >> 4) != 15 && (op_own & 1) as u32 == (ci >> log_cq_size) & 1
}

/// The owner bit the device writes for producer index `pi` (§9.7).
#[inline]
pub const fn cqe_owner_for(pi: u32, log_cq_size: u32) -> u8 {
    ((pi >> log_cq_size) & 1) as u8
}

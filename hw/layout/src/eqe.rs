//! Event queue entries (prm-subset.md §9.8).
//!
//! Every EQE is 64 bytes with `type` at byte 1 and `owner` in the last byte; the event data
//! at bytes 0x20-0x3B depends on the type, so each event shape has its own view.

use crate::layout;

/// Bytes per EQE.
pub const EQE_SIZE: usize = 64;
/// Spare entries Linux adds to every EQ (`MLX5_NUM_SPARE_EQE`); software must update the
/// consumer index at least this often.
pub const NUM_SPARE_EQE: u32 = 0x80;

layout! {
    /// Fields shared by every EQE.
    pub struct Eqe, "eqe", size 64;
    r#type, set_type: 0x00 [23:16],
    sub_type, set_sub_type: 0x00 [7:0],
    data, DATA: 0x20 nested 28,
    signature, set_signature: 0x3c [15:8],
    owner, set_owner: 0x3c [0:0],
}

layout! {
    /// Completion event (type 0x00).
    pub struct EqeComp, "eqe_comp", size 64;
    r#type, set_type: 0x00 [23:16],
    cqn, set_cqn: 0x38 [23:0],
    owner, set_owner: 0x3c [0:0],
}

layout! {
    /// QP events (types 0x01-0x03, 0x05, 0x07, 0x10, 0x11).
    pub struct EqeQp, "eqe_qp_srq", size 64;
    r#type, set_type: 0x00 [23:16],
    res_type, set_res_type: 0x34 [31:24],
    qpn, set_qpn: 0x38 [23:0],
    owner, set_owner: 0x3c [0:0],
}

layout! {
    /// CQ error event (type 0x04).
    pub struct EqeCqErr, "eqe_cq_err", size 64;
    r#type, set_type: 0x00 [23:16],
    cqn, set_cqn: 0x20 [23:0],
    syndrome, set_syndrome: 0x28 [7:0],
    owner, set_owner: 0x3c [0:0],
}

layout! {
    /// Port change event (type 0x09).
    pub struct EqePortChange, "eqe_port_state", size 64;
    r#type, set_type: 0x00 [23:16],
    sub_type, set_sub_type: 0x00 [7:0],
    port, set_port: 0x28 [31:28],
    owner, set_owner: 0x3c [0:0],
}

layout! {
    /// Command completion event (type 0x0A).
    pub struct EqeCmd, "eqe_cmd", size 64;
    r#type, set_type: 0x00 [23:16],
    vector, set_vector: 0x20 [31:0],
    owner, set_owner: 0x3c [0:0],
}

layout! {
    /// Page request event (type 0x0B).
    pub struct EqePageReq, "eqe_page_req", size 64;
    r#type, set_type: 0x00 [23:16],
    ec_function, set_ec_function: 0x20 [31:16],
    func_id, set_func_id: 0x20 [15:0],
    num_pages, set_num_pages: 0x24 [31:0],
    owner, set_owner: 0x3c [0:0],
}

/// `ec_function` bit 14 of a page request: release all pages of the function.
pub const PAGE_REQ_RELEASE_ALL: u32 = 1 << 14;

crate::enum_with_unknown! {
    /// Event types (§9.8).
    pub enum EventType(u8) {
        /// Completion event.
        Comp = 0x00,
        /// Path migrated.
        PathMig = 0x01,
        /// Communication established.
        CommEst = 0x02,
        /// SQ drained.
        SqDrained = 0x03,
        /// CQ error.
        CqError = 0x04,
        /// WQ catastrophic error.
        WqCatasError = 0x05,
        /// Path migration failed.
        PathMigFailed = 0x07,
        /// Internal error.
        InternalError = 0x08,
        /// Port change.
        PortChange = 0x09,
        /// Command completion.
        Cmd = 0x0A,
        /// Page request.
        PageRequest = 0x0B,
        /// ODP page fault.
        PageFault = 0x0C,
        /// NIC vport change.
        NicVportChange = 0x0D,
        /// WQ invalid request error.
        WqInvalReqError = 0x10,
        /// WQ access error.
        WqAccessError = 0x11,
    }
}

crate::enum_with_unknown! {
    /// PORT_CHANGE `sub_type` (§9.8).
    pub enum PortChangeSubtype(u8) {
        /// Port down.
        Down = 1,
        /// Port active.
        Active = 4,
        /// Port initialized.
        Initialized = 5,
        /// LID change.
        Lid = 6,
        /// PKey change.
        Pkey = 7,
        /// GUID change.
        Guid = 8,
        /// Client reregister.
        ClientRereg = 9,
    }
}

/// The EQE at consumer index `ci` is software-owned when its owner bit equals the pass
/// parity of `ci` (§9.8): entries start with owner = 1, the device writes 0 on pass 0.
#[inline]
pub const fn eqe_is_sw_owned(owner: u8, ci: u32, log_eq_size: u32) -> bool {
    (owner & 1) as u32 == (ci >> log_eq_size) & 1
}

/// The owner bit the device writes for producer index `pi` (§9.8).
#[inline]
pub const fn eqe_owner_for(pi: u32, log_eq_size: u32) -> u8 {
    ((pi >> log_eq_size) & 1) as u8
}

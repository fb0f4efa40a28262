//! Command syndromes: one stable, distinct 32-bit value per failure reason (out bytes 4-7,
//! prm-subset.md §3.6, §3.8). Real firmware syndromes are not public; these are the
//! model's. The high 16 bits group the reasons (0x0001 generic checks, 0x0002 lifecycle,
//! 0x0003 pages, 0x0004 capabilities, 0x0005 resources, 0x0006 EQ, 0x0007 vport/RoCE,
//! 0x0008 registers, 0x0010 MKeys, 0x0011 MEMIC); the low 16 bits number them.

/// BAD_OP_ERR: the opcode is not implemented by the model.
pub const BAD_OPCODE: u32 = 0x0001_0001;
/// BAD_INP_LEN_ERR: `inlen` is shorter than the command's input layout (or its array).
pub const INLEN_TOO_SHORT: u32 = 0x0001_0002;
/// BAD_OUTP_LEN_ERR: `outlen` is shorter than the command's output layout.
pub const OUTLEN_TOO_SHORT: u32 = 0x0001_0003;
/// BAD_PARAM_ERR: `op_mod` is not defined for this command.
pub const BAD_OP_MOD: u32 = 0x0001_0004;
/// BAD_PARAM_ERR: `function_id` / `embedded_cpu_function` / `other_*` name another function.
pub const BAD_FUNCTION: u32 = 0x0001_0005;

/// BAD_SYS_STATE_ERR: the HCA is not enabled (ENABLE_HCA first).
pub const HCA_NOT_ENABLED: u32 = 0x0002_0001;
/// BAD_SYS_STATE_ERR: ENABLE_HCA on an enabled HCA.
pub const HCA_ALREADY_ENABLED: u32 = 0x0002_0002;
/// BAD_SYS_STATE_ERR: a resource command before INIT_HCA.
pub const HCA_NOT_INITIALIZED: u32 = 0x0002_0003;
/// BAD_SYS_STATE_ERR: a pre-init command (SET_HCA_CAP, SET_ISSI, INIT_HCA) after INIT_HCA.
pub const HCA_ALREADY_INITIALIZED: u32 = 0x0002_0004;
/// BAD_SYS_STATE_ERR: DISABLE_HCA without TEARDOWN_HCA.
pub const HCA_NOT_TORN_DOWN: u32 = 0x0002_0005;
/// BAD_SYS_STATE_ERR: a resource command after TEARDOWN_HCA.
pub const HCA_TORN_DOWN: u32 = 0x0002_0006;
/// BAD_PARAM_ERR: SET_ISSI with an unsupported ISSI.
pub const BAD_ISSI: u32 = 0x0002_0007;
/// BAD_PARAM_ERR: TEARDOWN_HCA with an unsupported profile.
pub const BAD_TEARDOWN_PROFILE: u32 = 0x0002_0008;

/// BAD_INP_LEN_ERR: MANAGE_PAGES GIVE `input_num_entries` does not fit `inlen`.
pub const PAGES_COUNT_MISMATCH: u32 = 0x0003_0001;
/// BAD_PARAM_ERR: a given page address is not 4 KiB aligned.
pub const PAGE_MISALIGNED: u32 = 0x0003_0002;
/// BAD_PARAM_ERR: a given page is not reachable through the IOMMU.
pub const PAGE_UNREACHABLE: u32 = 0x0003_0003;
/// BAD_PARAM_ERR: a given page is already held (or given twice).
pub const PAGE_DUPLICATE: u32 = 0x0003_0004;
/// NO_RES_ERR: INIT_HCA before the boot + init pages were given.
pub const INIT_PAGES_MISSING: u32 = 0x0003_0005;
/// BAD_OUTP_LEN_ERR: MANAGE_PAGES TAKE output cannot hold one address.
pub const TAKE_OUTLEN: u32 = 0x0003_0006;

/// BAD_PARAM_ERR: QUERY/SET_HCA_CAP for a capability type the model does not have.
pub const BAD_CAP_TYPE: u32 = 0x0004_0001;
/// BAD_PARAM_ERR: SET_HCA_CAP sets a field above its MAX value.
pub const CAP_ABOVE_MAX: u32 = 0x0004_0002;

/// NO_RES_ERR: no free UAR index.
pub const NO_FREE_UAR: u32 = 0x0005_0001;
/// BAD_RES_ERR: DEALLOC_UAR of a UAR that is not allocated.
pub const BAD_UAR: u32 = 0x0005_0002;
/// NO_RES_ERR: no free PD number.
pub const NO_FREE_PD: u32 = 0x0005_0003;
/// BAD_RES_ERR: DEALLOC_PD of a PD that is not allocated.
pub const BAD_PD: u32 = 0x0005_0004;
/// RES_BUSY: DEALLOC_UAR of a UAR an EQ still uses.
pub const UAR_IN_USE: u32 = 0x0005_0005;

/// NO_RES_ERR: no free EQ number.
pub const NO_FREE_EQ: u32 = 0x0006_0001;
/// BAD_RES_ERR: DESTROY_EQ of an EQ that does not exist.
pub const BAD_EQ: u32 = 0x0006_0002;
/// BAD_PARAM_ERR: `log_eq_size` above `log_max_eq_sz`.
pub const EQ_SIZE: u32 = 0x0006_0003;
/// BAD_RES_ERR: `uar_page` is not an allocated UAR.
pub const EQ_BAD_UAR: u32 = 0x0006_0004;
/// BAD_PARAM_ERR: `intr` is not an MSI-X vector of the function.
pub const EQ_BAD_INTR: u32 = 0x0006_0005;
/// BAD_PARAM_ERR: `log_page_size` / `page_offset` / a `pas` entry is malformed.
pub const EQ_BAD_PAS: u32 = 0x0006_0006;
/// BAD_PARAM_ERR: the EQ buffer is not reachable through the IOMMU.
pub const EQ_BUF_UNREACHABLE: u32 = 0x0006_0007;

/// BAD_PARAM_ERR: GID index beyond `roce_address_table_size`.
pub const BAD_GID_INDEX: u32 = 0x0007_0001;
/// BAD_PARAM_ERR: port number other than 0/1, or another vport.
pub const BAD_PORT: u32 = 0x0007_0002;
/// BAD_PARAM_ERR: SET_ROCE_ADDRESS with an unsupported RoCE version or L3 type.
pub const BAD_ROCE_ADDRESS: u32 = 0x0007_0003;

/// BAD_PARAM_ERR: ACCESS_REG of a register the model does not have.
pub const BAD_REGISTER: u32 = 0x0008_0001;
/// BAD_PARAM_ERR: ACCESS_REG write of a register that firmware only lets software read.
pub const REG_READ_ONLY: u32 = 0x0008_0002;
/// BAD_PARAM_ERR: a port register naming a `local_port` other than 1.
pub const REG_BAD_PORT: u32 = 0x0008_0003;
/// BAD_PARAM_ERR: a register field outside what the register defines (PAOS `admin_status`,
/// PTYS `proto_mask`, PMTU `admin_mtu`, MCQI `info_type`, a PCAM/MCAM group).
pub const REG_BAD_FIELD: u32 = 0x0008_0004;
/// BAD_PARAM_ERR: MCQS/MCQI of a component index past the last component.
pub const REG_BAD_COMPONENT: u32 = 0x0008_0005;

/// NO_RES_ERR: no free MKey index (`log_max_mkey`).
pub const NO_FREE_MKEY: u32 = 0x0010_0001;
/// BAD_RES_ERR: DESTROY_MKEY / QUERY_MKEY of an index that does not exist.
pub const BAD_MKEY: u32 = 0x0010_0002;
/// BAD_PARAM_ERR: `access_mode` other than MTT (0x1) or MEMIC (0x5).
pub const MKEY_BAD_ACCESS_MODE: u32 = 0x0010_0003;
/// BAD_RES_ERR: the mkc `pd` is not an allocated PD.
pub const MKEY_BAD_PD: u32 = 0x0010_0004;
/// BAD_PARAM_ERR: `qpn` is not 0xFFFFFF (binding an MKey to a QP is not supported).
pub const MKEY_BAD_QPN: u32 = 0x0010_0005;
/// BAD_PARAM_ERR: `log_page_size` outside 12..=`max_mkey_log_entity_size_mtt`.
pub const MKEY_BAD_PAGE_SIZE: u32 = 0x0010_0006;
/// BAD_PARAM_ERR: `start_addr + len` wraps, or `length64` (not supported).
pub const MKEY_BAD_RANGE: u32 = 0x0010_0007;
/// BAD_INP_LEN_ERR: `translations_octword_actual_size` does not fit `inlen`.
pub const MKEY_MTT_INLEN: u32 = 0x0010_0008;
/// BAD_PARAM_ERR: fewer MTT entries than the region's pages (and the MKey is not `free`).
pub const MKEY_MTT_TOO_FEW: u32 = 0x0010_0009;
/// BAD_PARAM_ERR: an MTT address is not aligned to the MKey page size.
pub const MKEY_MTT_MISALIGNED: u32 = 0x0010_000a;
/// BAD_PARAM_ERR: `translations_octword_actual_size` above `translations_octword_size`.
pub const MKEY_MTT_ABOVE_SIZE: u32 = 0x0010_000b;
/// BAD_PARAM_ERR: `mkey_umem_valid` (UMEM-backed translations are not supported).
pub const MKEY_UMEM_UNSUPPORTED: u32 = 0x0010_000c;
/// BAD_PARAM_ERR: a MEMIC MKey's `[start_addr, start_addr + len)` is not inside one
/// MEMIC allocation.
pub const MKEY_MEMIC_RANGE: u32 = 0x0010_000d;
/// BAD_PARAM_ERR: a MEMIC MKey with a translation list.
pub const MKEY_MEMIC_TRANSLATIONS: u32 = 0x0010_000e;

/// BAD_PARAM_ERR: `memic_size` is 0 or not a multiple of 64 bytes.
pub const MEMIC_BAD_SIZE: u32 = 0x0011_0001;
/// BAD_PARAM_ERR: `log_memic_addr_alignment` above `log_max_memic_addr_alignment`.
pub const MEMIC_BAD_ALIGNMENT: u32 = 0x0011_0002;
/// BAD_PARAM_ERR: the range is outside the MEMIC window or smaller than `memic_size`.
pub const MEMIC_BAD_RANGE: u32 = 0x0011_0003;
/// NO_RES_ERR: no free, aligned device memory in the range.
pub const MEMIC_NO_SPACE: u32 = 0x0011_0004;
/// BAD_PARAM_ERR: DEALLOC_MEMIC / MODIFY_MEMIC of an address and size that are not an
/// allocation.
pub const MEMIC_BAD_ADDR: u32 = 0x0011_0005;
/// RES_BUSY: DEALLOC_MEMIC of memory a MEMIC MKey still covers.
pub const MEMIC_IN_USE: u32 = 0x0011_0006;
/// BAD_PARAM_ERR: MODIFY_MEMIC of an operation type not in `memic_operations`.
pub const MEMIC_BAD_OPERATION: u32 = 0x0011_0007;

/// (Group 0x0012: CQs and queue buffers; 0x0013: QPs.)
/// NO_RES_ERR: no free CQ number.
pub const NO_FREE_CQ: u32 = 0x0012_0001;
/// BAD_RES_ERR: the CQ does not exist.
pub const BAD_CQ: u32 = 0x0012_0002;
/// BAD_PARAM_ERR: `log_cq_size` above `log_max_cq_sz`.
pub const CQ_SIZE: u32 = 0x0012_0003;
/// BAD_PARAM_ERR: 128-byte CQEs, CQE compression, `cc` or `apu_cq` (not modelled).
pub const CQ_UNSUPPORTED_FORMAT: u32 = 0x0012_0004;
/// BAD_RES_ERR: the CQ's `uar_page` is not an allocated UAR.
pub const CQ_BAD_UAR: u32 = 0x0012_0005;
/// BAD_RES_ERR: the CQ's `c_eqn` is not an EQ.
pub const CQ_BAD_EQ: u32 = 0x0012_0006;
/// RES_BUSY: DESTROY_CQ of a CQ a QP still uses.
pub const CQ_IN_USE: u32 = 0x0012_0007;
/// BAD_PARAM_ERR: a CQ buffer or DBR in a devx umem (not modelled).
pub const CQ_UMEM_UNSUPPORTED: u32 = 0x0012_0008;
/// BAD_PARAM_ERR: a queue buffer's `log_page_size`, `page_offset` or `pas` entry is malformed.
pub const BAD_PAS: u32 = 0x0012_0009;
/// BAD_PARAM_ERR: a queue buffer page is not reachable through the IOMMU.
pub const BUF_UNREACHABLE: u32 = 0x0012_000a;
/// BAD_PARAM_ERR: a doorbell record is misaligned or unreachable.
pub const BAD_DBR: u32 = 0x0012_000b;
/// BAD_PARAM_ERR: MODIFY_CQ `modify_field_select` names a field other than period, count,
/// `oi` and period mode.
pub const CQ_BAD_FIELD_SELECT: u32 = 0x0012_000c;
/// BAD_PARAM_ERR: a `cq_period_mode` other than 0 (from the EQE) or 1 (from the CQE).
pub const CQ_BAD_PERIOD_MODE: u32 = 0x0012_000d;
/// NO_RES_ERR: no free QP number.
pub const NO_FREE_QP: u32 = 0x0013_0001;
/// BAD_RES_ERR: the QP does not exist.
pub const BAD_QP: u32 = 0x0013_0002;
/// BAD_PARAM_ERR: a service type other than RC.
pub const QP_BAD_ST: u32 = 0x0013_0003;
/// BAD_RES_ERR: the QP's `pd` is not allocated.
pub const QP_BAD_PD: u32 = 0x0013_0004;
/// BAD_RES_ERR: `cqn_snd` or `cqn_rcv` is not a CQ.
pub const QP_BAD_CQ: u32 = 0x0013_0005;
/// BAD_RES_ERR: the QP's `uar_page` is not an allocated UAR.
pub const QP_BAD_UAR: u32 = 0x0013_0006;
/// BAD_PARAM_ERR: `log_sq_size`/`log_rq_size` above `log_max_qp_sz` or an RQ stride above `max_wqe_sz_rq`.
pub const QP_SIZE: u32 = 0x0013_0007;
/// BAD_PARAM_ERR: `qpc_ext`, umem buffers, `input_qpn`, SRQ/CRQ receive queues (not modelled).
pub const QP_UNSUPPORTED: u32 = 0x0013_0008;
/// BAD_QP_STATE_ERR: RST2INIT of a QP not in RST.
pub const QP_NOT_RST: u32 = 0x0013_0009;
/// BAD_QP_STATE_ERR: INIT2INIT or INIT2RTR of a QP not in INIT.
pub const QP_NOT_INIT: u32 = 0x0013_000a;
/// BAD_QP_STATE_ERR: RTR2RTS of a QP not in RTR.
pub const QP_NOT_RTR: u32 = 0x0013_000b;
/// BAD_QP_STATE_ERR: RTS2RTS of a QP not in RTS.
pub const QP_NOT_RTS: u32 = 0x0013_0010;
/// BAD_PARAM_ERR: RTS2RTS `opt_param_mask` names an attribute the model cannot change in RTS
/// (it takes RNR_TIMEOUT, RETRY_COUNT, RNR_RETRY and ACK_TIMEOUT).
pub const QP_BAD_OPT_PARAM: u32 = 0x0013_0011;
/// BAD_PARAM_ERR: INIT2RTR with `mtu` outside 1..=5.
pub const QP_BAD_MTU: u32 = 0x0013_000c;
/// BAD_PARAM_ERR: INIT2RTR with `src_addr_index` naming no GID entry.
pub const QP_BAD_GID_INDEX: u32 = 0x0013_000d;
/// BAD_PARAM_ERR: `vhca_port_num` other than 0 or 1.
pub const QP_BAD_PORT: u32 = 0x0013_000e;
/// BAD_PARAM_ERR: RTR2RTS with attributes the transport cannot use.
pub const QP_BAD_ATTR: u32 = 0x0013_000f;

/// NO_RES_ERR: no free transport domain.
pub const NO_FREE_TD: u32 = 0x0005_0006;
/// BAD_RES_ERR: no such transport domain.
pub const BAD_TD: u32 = 0x0005_0007;
/// BAD_PARAM_ERR: a PA MKey with a translation list.
pub const MKEY_PA_TRANSLATIONS: u32 = 0x0010_000f;
/// BAD_PARAM_ERR: CREATE_QP names an SRQ (`rq_type` 1) that does not exist or is an XRC SRQ.
pub const QP_BAD_SRQ: u32 = 0x0013_0012;
/// BAD_PARAM_ERR: a transition's `opt_param_mask` or `q_key` does not fit the QP's transport.
pub const QP_BAD_QKEY: u32 = 0x0013_0013;
/// NO_RES_ERR: no free SRQ / XRC SRQ / RMP number.
pub const NO_FREE_SRQ: u32 = 0x0014_0001;
/// BAD_RES_ERR: no SRQ of the command's kind with that number.
pub const BAD_SRQ: u32 = 0x0014_0002;
/// BAD_PARAM_ERR: SRQ size or stride out of range.
pub const SRQ_SIZE: u32 = 0x0014_0003;
/// BAD_RES_ERR: the SRQ's PD does not exist.
pub const SRQ_BAD_PD: u32 = 0x0014_0004;
/// BAD_RES_ERR: the XRC SRQ's CQ does not exist.
pub const SRQ_BAD_CQ: u32 = 0x0014_0005;
/// BAD_RES_ERR: the XRC SRQ's XRC domain does not exist.
pub const SRQ_BAD_XRCD: u32 = 0x0014_0006;
/// RESOURCE_BUSY: a QP still takes its receives from the SRQ.
pub const SRQ_IN_USE: u32 = 0x0014_0007;
/// BAD_PARAM_ERR: umem, signature, tag matching or another SRQ feature the model lacks.
pub const SRQ_UNSUPPORTED: u32 = 0x0014_0008;
/// BAD_PARAM_ERR: an RMP state other than RDY, or a MODIFY_RMP bitmask bit the model lacks.
pub const SRQ_BAD_STATE: u32 = 0x0014_0009;
/// NO_RES_ERR: no free XRC domain.
pub const NO_FREE_XRCD: u32 = 0x0015_0001;
/// BAD_RES_ERR: no such XRC domain.
pub const BAD_XRCD: u32 = 0x0015_0002;
/// RESOURCE_BUSY: an XRC SRQ or QP still uses the XRC domain.
pub const XRCD_IN_USE: u32 = 0x0015_0003;
/// BAD_PARAM_ERR: QUERY_HCA_VPORT_PKEY of an index past the P_Key table.
pub const BAD_PKEY_INDEX: u32 = 0x0007_0004;

/// Every syndrome with its name (for tests and pretty-printers).
pub const ALL: &[(&str, u32)] = &[
    ("BAD_OPCODE", BAD_OPCODE),
    ("INLEN_TOO_SHORT", INLEN_TOO_SHORT),
    ("OUTLEN_TOO_SHORT", OUTLEN_TOO_SHORT),
    ("BAD_OP_MOD", BAD_OP_MOD),
    ("BAD_FUNCTION", BAD_FUNCTION),
    ("HCA_NOT_ENABLED", HCA_NOT_ENABLED),
    ("HCA_ALREADY_ENABLED", HCA_ALREADY_ENABLED),
    ("HCA_NOT_INITIALIZED", HCA_NOT_INITIALIZED),
    ("HCA_ALREADY_INITIALIZED", HCA_ALREADY_INITIALIZED),
    ("HCA_NOT_TORN_DOWN", HCA_NOT_TORN_DOWN),
    ("HCA_TORN_DOWN", HCA_TORN_DOWN),
    ("BAD_ISSI", BAD_ISSI),
    ("BAD_TEARDOWN_PROFILE", BAD_TEARDOWN_PROFILE),
    ("PAGES_COUNT_MISMATCH", PAGES_COUNT_MISMATCH),
    ("PAGE_MISALIGNED", PAGE_MISALIGNED),
    ("PAGE_UNREACHABLE", PAGE_UNREACHABLE),
    ("PAGE_DUPLICATE", PAGE_DUPLICATE),
    ("INIT_PAGES_MISSING", INIT_PAGES_MISSING),
    ("TAKE_OUTLEN", TAKE_OUTLEN),
    ("BAD_CAP_TYPE", BAD_CAP_TYPE),
    ("CAP_ABOVE_MAX", CAP_ABOVE_MAX),
    ("NO_FREE_UAR", NO_FREE_UAR),
    ("BAD_UAR", BAD_UAR),
    ("NO_FREE_PD", NO_FREE_PD),
    ("BAD_PD", BAD_PD),
    ("UAR_IN_USE", UAR_IN_USE),
    ("NO_FREE_EQ", NO_FREE_EQ),
    ("BAD_EQ", BAD_EQ),
    ("EQ_SIZE", EQ_SIZE),
    ("EQ_BAD_UAR", EQ_BAD_UAR),
    ("EQ_BAD_INTR", EQ_BAD_INTR),
    ("EQ_BAD_PAS", EQ_BAD_PAS),
    ("EQ_BUF_UNREACHABLE", EQ_BUF_UNREACHABLE),
    ("BAD_GID_INDEX", BAD_GID_INDEX),
    ("BAD_PORT", BAD_PORT),
    ("BAD_ROCE_ADDRESS", BAD_ROCE_ADDRESS),
    ("BAD_REGISTER", BAD_REGISTER),
    ("REG_READ_ONLY", REG_READ_ONLY),
    ("REG_BAD_PORT", REG_BAD_PORT),
    ("REG_BAD_FIELD", REG_BAD_FIELD),
    ("REG_BAD_COMPONENT", REG_BAD_COMPONENT),
    ("NO_FREE_MKEY", NO_FREE_MKEY),
    ("BAD_MKEY", BAD_MKEY),
    ("MKEY_BAD_ACCESS_MODE", MKEY_BAD_ACCESS_MODE),
    ("MKEY_BAD_PD", MKEY_BAD_PD),
    ("MKEY_BAD_QPN", MKEY_BAD_QPN),
    ("MKEY_BAD_PAGE_SIZE", MKEY_BAD_PAGE_SIZE),
    ("MKEY_BAD_RANGE", MKEY_BAD_RANGE),
    ("MKEY_MTT_INLEN", MKEY_MTT_INLEN),
    ("MKEY_MTT_TOO_FEW", MKEY_MTT_TOO_FEW),
    ("MKEY_MTT_MISALIGNED", MKEY_MTT_MISALIGNED),
    ("MKEY_MTT_ABOVE_SIZE", MKEY_MTT_ABOVE_SIZE),
    ("MKEY_UMEM_UNSUPPORTED", MKEY_UMEM_UNSUPPORTED),
    ("MKEY_MEMIC_RANGE", MKEY_MEMIC_RANGE),
    ("MKEY_MEMIC_TRANSLATIONS", MKEY_MEMIC_TRANSLATIONS),
    ("MEMIC_BAD_SIZE", MEMIC_BAD_SIZE),
    ("MEMIC_BAD_ALIGNMENT", MEMIC_BAD_ALIGNMENT),
    ("MEMIC_BAD_RANGE", MEMIC_BAD_RANGE),
    ("MEMIC_NO_SPACE", MEMIC_NO_SPACE),
    ("MEMIC_BAD_ADDR", MEMIC_BAD_ADDR),
    ("MEMIC_IN_USE", MEMIC_IN_USE),
    ("MEMIC_BAD_OPERATION", MEMIC_BAD_OPERATION),
    ("NO_FREE_CQ", NO_FREE_CQ),
    ("BAD_CQ", BAD_CQ),
    ("CQ_SIZE", CQ_SIZE),
    ("CQ_UNSUPPORTED_FORMAT", CQ_UNSUPPORTED_FORMAT),
    ("CQ_BAD_UAR", CQ_BAD_UAR),
    ("CQ_BAD_EQ", CQ_BAD_EQ),
    ("CQ_IN_USE", CQ_IN_USE),
    ("CQ_UMEM_UNSUPPORTED", CQ_UMEM_UNSUPPORTED),
    ("CQ_BAD_FIELD_SELECT", CQ_BAD_FIELD_SELECT),
    ("CQ_BAD_PERIOD_MODE", CQ_BAD_PERIOD_MODE),
    ("BAD_PAS", BAD_PAS),
    ("BUF_UNREACHABLE", BUF_UNREACHABLE),
    ("BAD_DBR", BAD_DBR),
    ("NO_FREE_QP", NO_FREE_QP),
    ("BAD_QP", BAD_QP),
    ("QP_BAD_ST", QP_BAD_ST),
    ("QP_BAD_PD", QP_BAD_PD),
    ("QP_BAD_CQ", QP_BAD_CQ),
    ("QP_BAD_UAR", QP_BAD_UAR),
    ("QP_SIZE", QP_SIZE),
    ("QP_UNSUPPORTED", QP_UNSUPPORTED),
    ("QP_NOT_RST", QP_NOT_RST),
    ("QP_NOT_INIT", QP_NOT_INIT),
    ("QP_NOT_RTR", QP_NOT_RTR),
    ("QP_BAD_MTU", QP_BAD_MTU),
    ("QP_BAD_GID_INDEX", QP_BAD_GID_INDEX),
    ("QP_BAD_PORT", QP_BAD_PORT),
    ("QP_BAD_ATTR", QP_BAD_ATTR),
    ("QP_NOT_RTS", QP_NOT_RTS),
    ("QP_BAD_OPT_PARAM", QP_BAD_OPT_PARAM),
    ("NO_FREE_TD", NO_FREE_TD),
    ("BAD_TD", BAD_TD),
    ("MKEY_PA_TRANSLATIONS", MKEY_PA_TRANSLATIONS),
    ("QP_BAD_SRQ", QP_BAD_SRQ),
    ("QP_BAD_QKEY", QP_BAD_QKEY),
    ("NO_FREE_SRQ", NO_FREE_SRQ),
    ("BAD_SRQ", BAD_SRQ),
    ("SRQ_SIZE", SRQ_SIZE),
    ("SRQ_BAD_PD", SRQ_BAD_PD),
    ("SRQ_BAD_CQ", SRQ_BAD_CQ),
    ("SRQ_BAD_XRCD", SRQ_BAD_XRCD),
    ("SRQ_IN_USE", SRQ_IN_USE),
    ("SRQ_UNSUPPORTED", SRQ_UNSUPPORTED),
    ("SRQ_BAD_STATE", SRQ_BAD_STATE),
    ("NO_FREE_XRCD", NO_FREE_XRCD),
    ("BAD_XRCD", BAD_XRCD),
    ("XRCD_IN_USE", XRCD_IN_USE),
    ("BAD_PKEY_INDEX", BAD_PKEY_INDEX),
];

/// The name of a syndrome, if it is one of the model's.
pub fn name(syndrome: u32) -> Option<&'static str> {
    ALL.iter().find(|(_, v)| *v == syndrome).map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    #[test]
    fn syndromes_are_distinct() {
        let mut v: Vec<u32> = super::ALL.iter().map(|(_, s)| *s).collect();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), super::ALL.len());
    }
}

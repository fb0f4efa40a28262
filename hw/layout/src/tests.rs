//! Golden tests for every layout: sizes, offsets against the fact sheet, per-field round
//! trips at byte level, and overlap checks (style.md §6).

use super::*;

/// Every layout of the crate, as (PRM name, size, fields).
fn all_layouts() -> Vec<(&'static str, usize, &'static [Field])> {
    macro_rules! list {
        ($($p:path),* $(,)?) => {
            vec![$( (<$p>::PRM_NAME, <$p>::SIZE, <$p>::FIELDS) ),*]
        };
    }
    use crate::reg::*;
    use caps::*;
    use cmd::*;
    use cmds::*;
    use cqe::*;
    use eqe::*;
    use init_seg::*;
    use mkc::*;
    use qpc::*;
    use vport::*;
    use wqe::*;
    list![
        InitSeg<()>,
        HealthBuffer<()>,
        CmdEntry<()>,
        MailboxBlock<()>,
        InHeader<()>,
        OutHeader<()>,
        CmdPas<()>,
        QueryHcaCapIn<()>,
        QueryHcaCapOut<()>,
        SetHcaCapIn<()>,
        QueryAdapterOut<()>,
        InitHcaIn<()>,
        TeardownHcaIn<()>,
        TeardownHcaOut<()>,
        EnableHcaIn<()>,
        QueryIssiOut<()>,
        SetIssiIn<()>,
        AccessRegisterIn<()>,
        QueryPagesIn<()>,
        QueryPagesOut<()>,
        ManagePagesIn<()>,
        ManagePagesOut<()>,
        AllocPdOut<()>,
        DeallocPdIn<()>,
        AllocUarOut<()>,
        DeallocUarIn<()>,
        AllocTransportDomainOut<()>,
        DeallocTransportDomainIn<()>,
        CreateEqIn<()>,
        CreateEqOut<()>,
        DestroyEqIn<()>,
        CreateCqIn<()>,
        CreateCqOut<()>,
        DestroyCqIn<()>,
        QueryCqIn<()>,
        QueryCqOut<()>,
        ModifyCqIn<()>,
        CreateQpIn<()>,
        CreateQpOut<()>,
        Rst2initQpIn<()>,
        Qp2rstIn<()>,
        QueryQpIn<()>,
        QueryQpOut<()>,
        CreateMkeyIn<()>,
        CreateMkeyOut<()>,
        DestroyMkeyIn<()>,
        QueryMkeyIn<()>,
        QueryMkeyOut<()>,
        AllocMemicIn<()>,
        AllocMemicOut<()>,
        DeallocMemicIn<()>,
        ModifyMemicIn<()>,
        ModifyMemicOut<()>,
        QueryNicVportContextIn<()>,
        QueryHcaVportContextIn<()>,
        QueryHcaVportGidIn<()>,
        QueryHcaVportGidOut<()>,
        SetRoceAddressIn<()>,
        QueryVportStateIn<()>,
        QueryVportStateOut<()>,
        CreateUmemIn<()>,
        CreateUmemOut<()>,
        NicVportContext<()>,
        HcaVportContext<()>,
        RoceAddrLayout<()>,
        eqc::Eqc<()>,
        cqc::Cqc<()>,
        Qpc<()>,
        Ads<()>,
        Mkc<()>,
        Mtt<()>,
        CmdHcaCap<()>,
        CmdHcaCap2<()>,
        DeviceMemCap<()>,
        AtomicCaps<()>,
        RoceCap<()>,
        Eqe<()>,
        EqeComp<()>,
        EqeQp<()>,
        EqeCqErr<()>,
        EqePortChange<()>,
        EqeCmd<()>,
        EqePageReq<()>,
        Cqe<()>,
        ErrCqe<()>,
        CtrlSeg<()>,
        RaddrSeg<()>,
        DataSeg<()>,
        AtomicSeg<()>,
        InlineSeg<()>,
        DisableHcaIn<()>,
        AccessRegisterOut<()>,
        SetDriverVersionIn<()>,
        QueryNicVportContextOut<()>,
        ModifyNicVportContextIn<()>,
        QueryHcaVportContextOut<()>,
        QueryRoceAddressIn<()>,
        QueryRoceAddressOut<()>,
        QueryVportCounterIn<()>,
        QueryVportCounterOut<()>,
        srq::Srqc<()>,
        srq::XrcSrqc<()>,
        srq::Wq<()>,
        srq::Rmpc<()>,
        srq::CreateSrqIn<()>,
        srq::CreateSrqOut<()>,
        srq::DestroySrqIn<()>,
        srq::QuerySrqOut<()>,
        srq::ArmRqIn<()>,
        srq::CreateRmpIn<()>,
        srq::ModifyRmpIn<()>,
        srq::QueryRmpOut<()>,
        srq::AllocXrcdOut<()>,
        srq::DeallocXrcdIn<()>,
        srq::QueryHcaVportPkeyIn<()>,
        srq::QueryHcaVportPkeyOut<()>,
        umr::UmrCtrlSeg<()>,
        ud::DatagramSeg<()>,
        roce::Deth<()>,
        HostEndiannessReg<()>,
        DefaultTimeout<()>,
        DtorReg<()>,
        PaosReg<()>,
        PtysReg<()>,
        PmtuReg<()>,
        NodeDescReg<()>,
        PcamReg<()>,
        McamReg<()>,
        McqsReg<()>,
        McqiReg<()>,
        McqiCap<()>,
        McqiVersion<()>,
    ]
}

/// Independent model of where bit `b` of the BE32 word at `word` lands: (byte, bit in byte).
fn bit_position(word: usize, b: u32) -> (usize, u32) {
    (word + (31 - b as usize) / 8, b % 8)
}

#[test]
fn fields_lie_inside_their_structure() {
    for (name, size, fields) in all_layouts() {
        for f in fields {
            let (first, len) = f.byte_span();
            let end = if let FieldKind::Bits { .. } = f.kind {
                f.offset + 4
            } else {
                first + len
            };
            assert!(
                end <= size || matches!(f.kind, FieldKind::Flex),
                "{name}.{} ends at {end:#x} past size {size:#x}",
                f.name
            );
            if let FieldKind::Bits { msb, lsb } = f.kind {
                assert!(msb <= 31 && lsb <= msb, "{name}.{} bad bits", f.name);
                assert_eq!(f.offset % 4, 0, "{name}.{} not on a dword", f.name);
            }
        }
    }
}

#[test]
fn no_two_fields_overlap() {
    for (name, size, fields) in all_layouts() {
        for word in (0..size).step_by(4) {
            let mut used = 0u32;
            for f in fields {
                let m = f.word_mask(word);
                assert_eq!(
                    used & m,
                    0,
                    "{name}.{} overlaps another field in word {word:#x}",
                    f.name
                );
                used |= m;
            }
        }
    }
}

/// Sets each bit field to all-ones through the generic accessors and checks that exactly the
/// bytes and bits the fact sheet names changed, then clears it and checks the buffer is zero.
#[test]
fn every_bit_field_round_trips_at_its_fact_sheet_position() {
    for (name, size, fields) in all_layouts() {
        for f in fields {
            let mut buf = vec![0u8; size.max(8)];
            match f.kind {
                FieldKind::Bits { msb, lsb } => {
                    let all = mask(msb, lsb) >> lsb;
                    buf.set_bits(f.offset, msb, lsb, all);
                    let mut expect = vec![0u8; buf.len()];
                    for b in lsb..=msb {
                        let (byte, bit) = bit_position(f.offset, b);
                        expect[byte] |= 1 << bit;
                    }
                    assert_eq!(buf, expect, "{name}.{} bytes", f.name);
                    assert_eq!(buf.get_bits(f.offset, msb, lsb), all, "{name}.{}", f.name);
                    // A value pattern that differs per bit reads back unchanged.
                    let pattern = 0xA5A5_A5A5u32 & all;
                    buf.set_bits(f.offset, msb, lsb, pattern);
                    assert_eq!(
                        buf.get_bits(f.offset, msb, lsb),
                        pattern,
                        "{name}.{}",
                        f.name
                    );
                    buf.set_bits(f.offset, msb, lsb, 0);
                    assert!(buf.iter().all(|&b| b == 0), "{name}.{} clear", f.name);
                }
                FieldKind::U64 => {
                    buf.write_be64(f.offset, 0x0102_0304_0506_0708);
                    assert_eq!(&buf[f.offset..f.offset + 8], &[1, 2, 3, 4, 5, 6, 7, 8]);
                    assert_eq!(buf.read_be64(f.offset), 0x0102_0304_0506_0708);
                }
                _ => {}
            }
        }
    }
}

/// Parses `| Byte | Bits | Field |` tables of the fact sheet and checks each of our tables
/// row by row: same offsets, same bit ranges, same widths. The fact sheet is the snapshot in
/// `docs/spec/prm-subset.md` (see `docs/spec/README.md`), so a clean checkout runs this.
#[test]
fn tables_match_the_fact_sheet() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/spec/prm-subset.md");
    let text = std::fs::read_to_string(path).expect("docs/spec/prm-subset.md in the repository");
    let lines: Vec<&str> = text.lines().collect();
    let ours: std::collections::HashMap<_, _> = all_layouts()
        .into_iter()
        .map(|(n, s, f)| (n, (s, f)))
        .collect();
    let mut checked = 0;
    for (i, l) in lines.iter().enumerate() {
        let Some(rest) = l.strip_prefix("**") else {
            continue;
        };
        let Some((name, tail)) = rest.split_once("**") else {
            continue;
        };
        let name = name.trim_end_matches(" (selected)");
        let Some(size) = tail
            .trim()
            .strip_prefix('(')
            .and_then(|t| t.strip_suffix(" B)"))
        else {
            continue;
        };
        let (ref_size, fields) = ours
            .get(name)
            .unwrap_or_else(|| panic!("no layout for {name}"));
        assert_eq!(size.parse::<usize>().unwrap(), *ref_size, "{name} size");
        let mut j = i + 1;
        while !lines[j].starts_with("| Byte") {
            j += 1;
        }
        j += 2;
        let mut k = 0;
        while j < lines.len() && lines[j].starts_with('|') {
            let cols: Vec<&str> = lines[j]
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let off = usize::from_str_radix(cols[0].trim_start_matches("0x"), 16).unwrap();
            let f = &fields[k];
            assert_eq!(
                f.offset, off,
                "{name}.{} offset (sheet row {})",
                f.name, cols[2]
            );
            let bits = cols[1];
            match f.kind {
                FieldKind::Bits { msb, lsb } => {
                    let want = if msb == lsb {
                        format!("[{msb}]")
                    } else {
                        format!("[{msb}:{lsb}]")
                    };
                    assert_eq!(bits, want, "{name}.{} bits", f.name);
                }
                FieldKind::U64 => assert_eq!(bits, "8B", "{name}.{}", f.name),
                FieldKind::Bytes(n) | FieldKind::Nested(n) => {
                    assert_eq!(bits, format!("{n}B"), "{name}.{}", f.name)
                }
                FieldKind::Flex => assert_eq!(bits, "flex", "{name}.{}", f.name),
            }
            assert!(
                cols[2].contains(f.name.trim_start_matches("r#")),
                "{name}: {} vs {}",
                f.name,
                cols[2]
            );
            j += 1;
            k += 1;
            checked += 1;
        }
        assert_eq!(k, fields.len(), "{name}: row count");
    }
    assert!(checked > 400, "only {checked} rows checked");
}

#[test]
fn golden_examples_from_the_fact_sheet() {
    // §3.3: QUERY_ISSI supported_issi_dw0 is output byte 0x6C.
    let mut out = [0u8; 112];
    cmds::QueryIssiOut::new_unchecked(&mut out[..]).set_supported_issi_dw0(0x3);
    assert_eq!(&out[0x6c..0x70], &[0, 0, 0, 3]);
    // §8.2: log_max_qp is capability byte 0x10 [4:0].
    let mut cap = [0u8; 256];
    caps::CmdHcaCap::new_unchecked(&mut cap[..]).set_log_max_qp(18);
    assert_eq!(cap[0x13], 18);
    // §3.2: the entry's status_own is the last byte; token byte 0x3C.
    let mut e = [0u8; 64];
    let mut entry = cmd::CmdEntry::new_unchecked(&mut e[..]);
    entry.set_status_own(1);
    entry.set_token(0xAB);
    entry.set_type(7);
    assert_eq!((e[0], e[0x3c], e[0x3f]), (7, 0xAB, 1));
    // §7.5: an MTT with both enables is addr | 3.
    let mut m = [0u8; 8];
    let mut mtt = mkc::Mtt::new_unchecked(&mut m[..]);
    mtt.set_ptag_63_32(0x1);
    mtt.set_ptag_31_8(0x23_4567);
    mtt.set_wr_en(1);
    mtt.set_rd_en(1);
    assert_eq!(u64::from_be_bytes(m), 0x1_2345_6703);
    // §9.5: ctrl segment opmod_idx_opcode / qpn_ds.
    let mut c = [0u8; 16];
    let mut ctrl = wqe::CtrlSeg::new_unchecked(&mut c[..]);
    ctrl.set_wqe_index(0x1234);
    ctrl.set_opcode(0x08);
    ctrl.set_qpn(0xABCDEF);
    ctrl.set_ds(3);
    assert_eq!(&c[..8], &[0x00, 0x12, 0x34, 0x08, 0xAB, 0xCD, 0xEF, 0x03]);
    // §9.8 / §9.7 owner rules.
    assert!(eqe::eqe_is_sw_owned(0, 0, 4) && !eqe::eqe_is_sw_owned(1, 0, 4));
    assert!(eqe::eqe_is_sw_owned(1, 16, 4));
    assert!(!cqe::cqe_is_sw_owned(cqe::OP_OWN_INIT, 0, 4));
    assert!(cqe::cqe_is_sw_owned(0x00, 0, 4) && cqe::cqe_is_sw_owned(0x01, 16, 4));
}

#[test]
fn short_buffer_is_refused() {
    let buf = [0u8; 10];
    let err = cqc::Cqc::new_checked(&buf[..]).unwrap_err();
    assert_eq!((err.need, err.len), (64, 10));
    assert!(err.to_string().contains("cqc"));
}

#[test]
fn codes_are_lossless() {
    for raw in 0..=u16::MAX {
        assert_eq!(u16::from(cmd::Opcode::from(raw)), raw);
    }
    for raw in 0..=u8::MAX {
        assert_eq!(u8::from(cmd::CmdStatus::from(raw)), raw);
        assert_eq!(u8::from(cqe::CqeSyndrome::from(raw)), raw);
        assert_eq!(u8::from(eqe::EventType::from(raw)), raw);
    }
    assert_eq!(cmd::Opcode::from(0x100), cmd::Opcode::QueryHcaCap);
    assert_eq!(cmd::Opcode::from(0x999), cmd::Opcode::Unknown(0x999));
}

#[test]
fn mailbox_split() {
    assert_eq!(cmd::mailbox_blocks(16), 0);
    assert_eq!(cmd::mailbox_blocks(112), 1);
    assert_eq!(cmd::mailbox_blocks(4112), 8);
    assert_eq!(init_seg::decode_timeout_ms(0), None);
    assert_eq!(init_seg::decode_timeout_ms((1 << 29) | 60), Some(60_000));
}

#[test]
fn nic_interface_is_three_bits_so_sw_reset_reads_as_seven() {
    use init_seg::{NicInterface, cmdq_addr_l_sz};
    // Address bits, SW_RESET (7) in [10:8] and the read-only sizes in [7:0].
    let v = 0x1234_5000 | (7 << 8) | 0x56;
    assert_eq!(cmdq_addr_l_sz::nic_interface(v), 7);
    assert_eq!(
        NicInterface::from(cmdq_addr_l_sz::nic_interface(v)),
        NicInterface::SwReset
    );
    assert_eq!(cmdq_addr_l_sz::nic_interface(0x1234_5000 | (1 << 8)), 1);
    // Bit 11 is reserved, not part of the state.
    assert_eq!(cmdq_addr_l_sz::nic_interface(0x800), 0);
    let w = cmdq_addr_l_sz::with_nic_interface(v, 1);
    assert_eq!(w, 0x1234_5000 | (1 << 8) | 0x56);
    assert_eq!(cmdq_addr_l_sz::with_nic_interface(w, 0), 0x1234_5056);
}

#[test]
fn mtu_codes_round_trip() {
    for (code, bytes) in [(1u8, 256u32), (2, 512), (3, 1024), (4, 2048), (5, 4096)] {
        let m = qpc::Mtu::from_ib(code).unwrap();
        assert_eq!((m as u8, m.bytes()), (code, bytes));
    }
    assert_eq!(qpc::Mtu::from_ib(0), None);
    assert_eq!(qpc::Mtu::from_ib(6), None);
}

#[test]
fn access_rights_are_the_mkc_bits() {
    use mkc::Access;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    assert_eq!(rw.mkc_rights(), [true, false, true, false]);
    assert_eq!(Access::ALL.mkc_rights(), [true; 4]);
    assert_eq!(Access::NONE.mkc_rights(), [false; 4]);
    assert!(Access::ALL.contains(rw) && !rw.contains(Access::REMOTE_READ));
    assert_eq!(format!("{:?}", Access::NONE), "Access(LOCAL_READ)");
    assert_eq!(format!("{rw:?}"), "Access(LOCAL_WRITE | REMOTE_WRITE)");
}

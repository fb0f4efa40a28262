//! The model's command lifecycle, driven with raw commands through the driver's command
//! interface (no `Device`): every out-of-order or malformed command gets the PRM status and
//! the model's syndrome, changes nothing, and the model then boots normally.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uhca::cmd::{CmdError, CmdIf, CmdIfParams, SlotClass, input, ops};
use uhca::dma::{DmaRegion, DmaSpace};
use uhca::hw::layout::cmd::{CapType, CmdStatus, DeliveryStatus, Opcode, QueryPagesOpMod};
use uhca::hw::layout::init_seg::reg;
use uhca::hw::layout::{Buf, BufMut};
use uhca::pci::{self, Bar, Iova, PciFunction};
use uhca_hw::model::syndrome as syn;
use uhca_tests::model;

/// A fresh model with its command queue set up and nothing else.
struct Raw {
    cmd: CmdIf,
    dma: Arc<DmaSpace>,
}

impl Raw {
    fn new() -> Raw {
        let f: Arc<dyn PciFunction> = model();
        pci::set_bus_master(&*f, true).unwrap();
        let bar = Bar::map(&f, 0).unwrap();
        let dma = DmaSpace::new(f);
        let params = CmdIfParams {
            log_size: 5,
            log_stride: 6,
            timeout: Duration::from_secs(20),
        };
        let cmd = CmdIf::new(bar.clone(), &dma, params).unwrap();
        let start = Instant::now();
        while bar.read32_be(reg::INITIALIZING) >> 31 == 1 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "model never left initializing"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        Raw { cmd, dma }
    }

    fn exec(&self, i: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError> {
        self.cmd
            .exec(i, out_len, SlotClass::Regular, &mut || Ok(()))
    }

    /// Runs `i` and expects a refusal with `status` and `syndrome`.
    fn refused(&self, i: &[u8], out_len: usize, status: CmdStatus, syndrome: u32) {
        match self.exec(i, out_len) {
            Err(CmdError::Failed {
                status: s,
                syndrome: y,
                ..
            }) => {
                assert_eq!(
                    (s, y),
                    (status, syndrome),
                    "opcode {:#x}",
                    i.read_be32(0) >> 16
                )
            }
            other => panic!("expected {status:?}/{syndrome:#x}, got {other:?}"),
        }
    }

    fn give(&self, pages: &[Iova]) -> Result<Vec<u8>, CmdError> {
        let mut i = input(Opcode::ManagePages, 1, 16 + 8 * pages.len());
        i.write_be32(0x0c, pages.len() as u32);
        for (k, p) in pages.iter().enumerate() {
            i.write_be64(0x10 + 8 * k, p.0);
        }
        self.exec(&i, 16)
    }

    fn query_pages(&self, phase: QueryPagesOpMod) -> u32 {
        self.exec(&input(Opcode::QueryPages, phase.into(), 16), 16)
            .unwrap()
            .read_be32(0x0c)
    }
}

fn region_pages(r: &DmaRegion, n: usize) -> Vec<Iova> {
    (0..n).map(|k| Iova(r.iova().0 + 4096 * k as u64)).collect()
}

#[test]
fn out_of_order_and_malformed_commands_are_refused_and_the_model_still_boots() {
    use CmdStatus::*;
    let raw = Raw::new();
    let nop16 = |op| input(op, 0, 16);
    // Before ENABLE_HCA only ENABLE_HCA is accepted.
    raw.refused(
        &input(Opcode::InitHca, 0, 32),
        16,
        BadSysStateErr,
        syn::HCA_NOT_ENABLED,
    );
    raw.refused(
        &nop16(Opcode::QueryIssi),
        112,
        BadSysStateErr,
        syn::HCA_NOT_ENABLED,
    );
    let mut other = nop16(Opcode::EnableHca);
    other.set_bits(0x08, 15, 0, 3);
    raw.refused(&other, 16, BadParamErr, syn::BAD_FUNCTION);
    raw.exec(&nop16(Opcode::EnableHca), 16).unwrap();
    raw.refused(
        &nop16(Opcode::EnableHca),
        16,
        BadSysStateErr,
        syn::HCA_ALREADY_ENABLED,
    );
    // Enabled, not initialized.
    raw.refused(
        &nop16(Opcode::AllocPd),
        16,
        BadSysStateErr,
        syn::HCA_NOT_INITIALIZED,
    );
    raw.refused(
        &nop16(Opcode::TeardownHca),
        16,
        BadSysStateErr,
        syn::HCA_NOT_INITIALIZED,
    );
    let mut issi = input(Opcode::SetIssi, 0, 16);
    issi.write_be32(0x08, 5);
    raw.refused(&issi, 16, BadParamErr, syn::BAD_ISSI);
    raw.refused(
        &nop16(Opcode::Unknown(0x7ff)),
        16,
        BadOpErr,
        syn::BAD_OPCODE,
    );
    raw.refused(
        &input(Opcode::QueryPages, 7, 16),
        16,
        BadParamErr,
        syn::BAD_OP_MOD,
    );
    // Lengths: a capability query answers any outlen from its header up, cut to it (no
    // room for the page is no error); SET_HCA_CAP with no page is refused.
    let head = raw.exec(&nop16(Opcode::QueryHcaCap), 16).unwrap();
    assert_eq!(head.len(), 16);
    raw.refused(
        &nop16(Opcode::SetHcaCap),
        16,
        BadInpLenErr,
        syn::INLEN_TOO_SHORT,
    );
    raw.refused(
        &input(Opcode::QueryHcaCap, 0x07 << 1, 16),
        4112,
        BadParamErr,
        syn::BAD_CAP_TYPE,
    );
    let max = ops::query_hca_cap(&Exec(&raw), CapType::General, false).unwrap();
    let mut big = max.clone();
    big.set_bits(0x010, 4, 0, max.get_bits(0x010, 4, 0) + 1); // log_max_qp above MAX
    let e = ops::set_hca_cap(&Exec(&raw), CapType::General, &big).unwrap_err();
    assert_eq!(e.status(), Some((BadParamErr, syn::CAP_ABOVE_MAX)));
    // INIT_HCA needs its pages first.
    raw.refused(
        &input(Opcode::InitHca, 0, 32),
        16,
        NoResErr,
        syn::INIT_PAGES_MISSING,
    );
    // Bad pages: misaligned, not mapped, given twice; none of them is kept.
    let mem = DmaRegion::new(&raw.dma, 64 * 4096).unwrap();
    let e = raw.give(&[Iova(mem.iova().0 + 8)]).unwrap_err();
    assert_eq!(e.status(), Some((BadParamErr, syn::PAGE_MISALIGNED)));
    let e = raw.give(&[Iova(0x7777_0000_0000)]).unwrap_err();
    assert_eq!(e.status(), Some((BadParamErr, syn::PAGE_UNREACHABLE)));
    let e = raw.give(&[mem.iova(), mem.iova()]).unwrap_err();
    assert_eq!(e.status(), Some((BadParamErr, syn::PAGE_DUPLICATE)));
    // The refusals changed nothing: the model still wants every page.
    let boot = raw.query_pages(QueryPagesOpMod::Boot) as usize;
    let init = raw.query_pages(QueryPagesOpMod::Init) as usize;
    assert!(boot > 0 && init >= boot);
    // Now the right order works.
    raw.give(&region_pages(&mem, init)).unwrap();
    assert_eq!(raw.query_pages(QueryPagesOpMod::Init), 0);
    raw.exec(&input(Opcode::InitHca, 0, 32), 16).unwrap();
    raw.refused(
        &input(Opcode::InitHca, 0, 32),
        16,
        BadSysStateErr,
        syn::HCA_ALREADY_INITIALIZED,
    );
    raw.refused(
        &nop16(Opcode::DisableHca),
        16,
        BadSysStateErr,
        syn::HCA_NOT_TORN_DOWN,
    );
    let pd = ops::alloc_pd(&Exec(&raw)).unwrap();
    ops::dealloc_pd(&Exec(&raw), pd).unwrap();
    raw.exec(&nop16(Opcode::TeardownHca), 16).unwrap();
    raw.refused(
        &nop16(Opcode::AllocPd),
        16,
        BadSysStateErr,
        syn::HCA_TORN_DOWN,
    );
    // Every page comes back, exactly those given.
    let mut back = ops::take_pages(&Exec(&raw), 1000).unwrap();
    back.sort_by_key(|p| p.0);
    assert_eq!(back, region_pages(&mem, init));
    raw.exec(&nop16(Opcode::DisableHca), 16).unwrap();
}

#[test]
fn delivery_errors_leave_no_side_effects() {
    let raw = Raw::new();
    raw.exec(&input(Opcode::EnableHca, 0, 16), 16).unwrap();
    // An output longer than the largest message the model accepts: the delivery status
    // says so (prm-subset.md §3.7) and the command does not run.
    let e = raw
        .exec(
            &input(Opcode::QueryIssi, 0, 16),
            uhca_hw::model::MAX_MSG + 1,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            CmdError::Delivery {
                status: DeliveryStatus::OutLengthErr,
                ..
            }
        ),
        "{e:?}"
    );
    // The model keeps running and the same slot works again.
    raw.exec(&input(Opcode::QueryIssi, 0, 16), 112).unwrap();
}

/// Adapts the raw command interface to the typed command helpers.
struct Exec<'a>(&'a Raw);

impl ops::Exec for Exec<'_> {
    fn exec(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError> {
        self.0.exec(input, out_len)
    }

    fn exec_pages(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError> {
        self.0
            .cmd
            .exec(input, out_len, SlotClass::Pages, &mut || Ok(()))
    }
}

//! What the real drivers (Linux mlx5_core, rdma-core's mlx5_vfio, pyverbs) taught about the
//! firmware (issue #18, `docs/spec/firmware-behaviour.md`), checked through the driver's
//! command interface against the model: boot pages come back before INIT_HCA, capability
//! queries answer a short `outlen`, and the command that creates a command-event EQ gets no
//! completion EQE of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uhca::cmd::{CmdError, CmdIf, CmdIfParams, SlotClass, input, ops};
use uhca::dma::{DmaRegion, DmaSpace};
use uhca::hw::layout::cmd::{CapType, Opcode};
use uhca::hw::layout::eqe::EventType;
use uhca::hw::layout::init_seg::reg;
use uhca::pci::{self, Bar, Iova, PciFunction};
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
                "still initializing"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        Raw { cmd, dma }
    }

    /// `n` pages of fresh DMA memory (kept alive by the returned region).
    fn pages(&self, n: usize) -> (DmaRegion, Vec<Iova>) {
        let r = DmaRegion::new(&self.dma, 4096 * n).unwrap();
        let v = (0..n).map(|k| Iova(r.iova().0 + 4096 * k as u64)).collect();
        (r, v)
    }
}

impl ops::Exec for Raw {
    fn exec(&self, i: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError> {
        self.cmd
            .exec(i, out_len, SlotClass::Regular, &mut || Ok(()))
    }

    fn exec_pages(&self, i: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError> {
        self.cmd.exec(i, out_len, SlotClass::Pages, &mut || Ok(()))
    }
}

/// Linux's probe error path (`mlx5_reclaim_startup_pages` before INIT_HCA): every boot page
/// comes back, and the device asks for them again.
#[test]
fn boot_pages_come_back_before_init_hca() {
    let raw = Raw::new();
    ops::enable_hca(&raw).unwrap();
    let boot = ops::query_pages(&raw, 1).unwrap();
    assert!(boot > 0);
    let (_mem, pages) = raw.pages(boot as usize);
    ops::give_pages(&raw, &pages).unwrap();
    assert_eq!(ops::query_pages(&raw, 1).unwrap(), 0);
    let mut back = ops::take_pages(&raw, boot as u32).unwrap();
    back.sort_by_key(|p| p.0);
    assert_eq!(back, pages, "exactly the pages given");
    assert_eq!(ops::query_pages(&raw, 1).unwrap(), boot);
    ops::disable_hca(&raw).unwrap();
}

/// pyverbs' `is_eth()` asks QUERY_HCA_CAP for 0x810 bytes: the start of the page, cut.
#[test]
fn a_capability_query_answers_a_short_outlen_with_the_start_of_the_page() {
    let raw = Raw::new();
    ops::enable_hca(&raw).unwrap();
    let full = ops::query_hca_cap(&raw, CapType::General, true).unwrap();
    let i = input(
        Opcode::QueryHcaCap,
        (u16::from(CapType::General) << 1) | 1,
        16,
    );
    let short = ops::Exec::exec(&raw, &i, 0x810).unwrap();
    assert_eq!(short.len(), 0x810);
    assert_eq!(&short[0x10..], &full[..0x800]);
    // QUERY_ADAPTER and QUERY_ISSI likewise.
    let adapter = ops::Exec::exec(&raw, &input(Opcode::QueryAdapter, 0, 16), 0x20).unwrap();
    assert_eq!(adapter.len(), 0x20);
}

/// Linux creates its command EQ while commands are polled: the CREATE_EQ that creates it
/// gets no completion EQE there (it would be taken for a stale completion), the next
/// command does.
#[test]
fn the_eq_a_command_creates_gets_no_completion_of_that_command() {
    let raw = Raw::new();
    ops::enable_hca(&raw).unwrap();
    ops::set_issi(&raw, 1).unwrap();
    let boot = ops::query_pages(&raw, 1).unwrap() as usize;
    let (_b, pages) = raw.pages(boot);
    ops::give_pages(&raw, &pages).unwrap();
    let init = ops::query_pages(&raw, 2).unwrap() as usize;
    let (_i, pages) = raw.pages(init);
    ops::give_pages(&raw, &pages).unwrap();
    ops::init_hca(&raw).unwrap();
    let uar = ops::alloc_uar(&raw).unwrap();
    let (eq_mem, eq_pages) = raw.pages(1);
    let eqn = ops::create_eq(
        &raw,
        &ops::CreateEq {
            log_eq_size: 6,
            uar_page: uar,
            intr: 0,
            event_bitmask: 1 << u8::from(EventType::Cmd),
            pages: &eq_pages,
        },
    )
    .unwrap();
    let event_type = |k: usize| eq_mem.slice().read_u8(64 * k + 1);
    assert_eq!(event_type(0), 0, "no EQE for the CREATE_EQ itself");
    ops::query_adapter(&raw).unwrap();
    // The completion may follow the output by a moment (written after the ownership).
    let start = Instant::now();
    while event_type(0) != u8::from(EventType::Cmd) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no completion EQE"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(event_type(1), 0, "one EQE per command");
    ops::destroy_eq(&raw, eqn).unwrap();
}

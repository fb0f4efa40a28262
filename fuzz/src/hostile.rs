//! The driver against a hostile device: the model computes every command's output, and
//! the fuzzer's plan rewrites it before the driver sees it (bytes, status and syndrome,
//! length, delivery status), writes init-segment and health words, and posts events
//! (PAGE_REQUESTs with any count, any EQE type and data). The driver boots
//! (`Device::open`), makes a PD, a UAR, an MR, CQs and a QP, handles events, checks
//! health and closes: whatever the device says, it must end with `Ok` or a typed error:
//! never a panic, a hang or undefined behaviour (ASan).
//!
//! Input: a prelude (`fw u8`: bit 0 raises `initializing` for good, bit 1 writes the
//! `nic_interface` bits of `cmdq_addr_l_sz` from bits 4-6, bit 2 leaves the commands to
//! the model's thread instead of running them to completion: see below), then actions
//! until the input ends, each `at u8` (the command it follows, counted from 0) and `kind u8`:
//! - `0 off u16, xor u8`: flip an output byte;
//! - `1 status u8, syndrome u32`: a refusal;
//! - `2 len u16`: the output cut or zero-extended to `len`;
//! - `3 ds u8`: a delivery status instead of success;
//! - `4 off u16, value u32`: a BAR0 word of the init segment or health buffer
//!   (offset below 0x1040, 4-aligned);
//! - `5 n u32`: a PAGE_REQUEST for `n` pages (negative: pages offered back);
//! - `6 type u8, sub u8, data [u8; 28]`: any event;
//! - `7 syndrome u8`: the health syndrome (firmware assert).
//!
//! One model serves every input ([`Harness`]): before each it goes back to the state of a
//! fresh one (`Hca::fuzz_reset`, and the driver's MKey variants start again), so that an
//! input runs as it would alone (`tests/determinism.rs`). Unless the prelude's bit 2 says
//! otherwise, the driver's thread makes the model's passes while it waits for a command
//! ([`Options::drive`]): a command then costs no handoff between threads, which on a
//! loaded machine is a scheduler time slice.
//!
//! `UHCA_FUZZ_TRACE=1` prints how far the driver got (replaying one input);
//! `UHCA_FUZZ_NO_DRIVE=1` leaves the commands to the model's thread.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uhca::pci::PciFunction;
use uhca::pci::model::ModelFunction;
use uhca::resource::{Access, CqConfig, QpConfig};
use uhca::{Device, DeviceConfig};
use uhca_hw::layout::cmd::{DeliveryStatus, Opcode};
use uhca_hw::layout::cmds::QueryPagesOut;
use uhca_hw::layout::eqe::EventType;
use uhca_hw::model::{ModelConfig, fuzzing};

use crate::Reader;
use crate::anon::AnonMem;

/// One hostile action.
#[derive(Clone, Debug)]
enum Act {
    Flip(u16, u8),
    Refuse(u8, u32),
    Len(u16),
    Delivery(u8),
    Bar(u16, u32),
    PageRequest(i32),
    Event(u8, u8, [u8; 28]),
    Syndrome(u8),
}

/// What the device thread asks the injector thread to do (events need the core lock the
/// device thread holds while the hook runs).
enum Inject {
    Pages(i32),
    Event(u8, u8, [u8; 28]),
    Syndrome(u8),
    /// Answers once everything sent before it is done.
    Sync(mpsc::SyncSender<()>),
}

fn decode(r: &mut Reader<'_>) -> BTreeMap<u8, Vec<Act>> {
    let mut plan: BTreeMap<u8, Vec<Act>> = BTreeMap::new();
    let mut n = 0;
    while !r.done() && n < 64 {
        n += 1;
        let at = r.u8();
        let act = match r.u8() % 8 {
            0 => Act::Flip(r.u16(), r.u8()),
            1 => Act::Refuse(r.u8(), r.u32()),
            2 => Act::Len(r.u16()),
            3 => Act::Delivery(r.u8()),
            4 => Act::Bar((r.u16() % 0x1040) & !3, r.u32()),
            5 => Act::PageRequest(r.u32() as i32),
            6 => {
                let (t, s) = (r.u8(), r.u8());
                let mut d = [0u8; 28];
                d.copy_from_slice(&{
                    let mut b = r.bytes(28).to_vec();
                    b.resize(28, 0);
                    b
                });
                Act::Event(t, s, d)
            }
            _ => Act::Syndrome(r.u8()),
        };
        plan.entry(at).or_default().push(act);
    }
    plan
}

/// BAR0 of the model as an address (the hook runs on the device thread).
#[derive(Clone, Copy)]
struct BarPtr(usize, usize);

impl BarPtr {
    fn read(self, off: usize) -> u32 {
        if off + 4 > self.1 {
            return 0;
        }
        // SAFETY: inside BAR0 (checked), which outlives the hook (see `write`). A volatile
        // aligned 32-bit load, as a device register read.
        u32::from_be(unsafe { std::ptr::read_volatile((self.0 + off) as *const u32) })
    }

    fn write(self, off: usize, v: u32) {
        if off + 4 <= self.1 {
            // SAFETY: inside BAR0 (checked), which outlives the hook: the hook is removed
            // before the model is dropped. A volatile aligned 32-bit store, as a device
            // register write.
            unsafe { std::ptr::write_volatile((self.0 + off) as *mut u32, v.to_be()) }
        }
    }
}

static NO_DRIVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// How a run waits on the device (the fuzz target's: [`Options::default`]).
#[derive(Clone, Debug)]
pub struct Options {
    /// The driver's health poll interval.
    pub health_interval: Duration,
    /// The driver's command timeout.
    pub cmd_timeout: Duration,
    /// Run to completion: the driver's thread makes the model's passes while it waits for
    /// a command (`DeviceConfig::drive_commands`), instead of waiting for the model's
    /// thread to be scheduled (on a loaded machine, a time slice per command).
    pub drive: bool,
    /// Record a [`Transcript`].
    pub record: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            // Short enough that a syndrome or a stalled counter is seen within one run (a
            // loaded machine may starve the model's health tick: a dead device is a typed
            // error too).
            health_interval: Duration::from_millis(20),
            // Short: a command the hostile device redirected (queue address, doorbell)
            // never completes, and every such wait is a whole timeout.
            cmd_timeout: Duration::from_millis(100),
            // `UHCA_FUZZ_NO_DRIVE=1`: the model's thread runs the commands, as before (to
            // compare coverage and speed).
            drive: !*NO_DRIVE.get_or_init(|| std::env::var_os("UHCA_FUZZ_NO_DRIVE").is_some()),
            record: false,
        }
    }
}

/// What one run did, as far as it depends on the input alone: every command the driver
/// sent and what it read back (the output after the plan's rewriting, and the delivery
/// status), up to the first event the plan injects (events and health syndromes reach
/// the device from another thread, so what follows them depends on timing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transcript {
    /// (input, output, delivery status) of each command, in order.
    pub commands: Vec<(Vec<u8>, Vec<u8>, Option<u8>)>,
    /// The plan injected an event: the transcript ends there.
    pub injected: bool,
}

/// The model, and the thread that injects events into it, kept across inputs.
struct Model {
    f: Arc<ModelFunction>,
    tx: mpsc::Sender<Inject>,
    injector: std::thread::JoinHandle<()>,
}

impl Model {
    fn new() -> Model {
        let f = ModelFunction::new(ModelConfig {
            name: "hostile".into(),
            // No boot delay: the driver's wait for `initializing` polls every 200 µs, a
            // per-input cost; flags bit 0 raises `initializing` when an input wants that
            // wait.
            boot_delay: Duration::ZERO,
            ..ModelConfig::default()
        })
        .expect("model");
        let (tx, rx) = mpsc::channel::<Inject>();
        let injector = {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in rx {
                    match i {
                        Inject::Pages(n) => f.hca().inject_page_request(n),
                        Inject::Event(t, s, d) => f.hca().inject_event(EventType::from(t), s, &d),
                        Inject::Syndrome(s) => f.hca().faults().set_health_syndrome(s),
                        Inject::Sync(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
        };
        Model { f, tx, injector }
    }

    /// Waits until the injector has done everything sent so far.
    fn sync(&self) {
        let (done, wait) = mpsc::sync_channel(1);
        if self.tx.send(Inject::Sync(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// Stops the injector; a model still referenced (memory the driver leaked on purpose
    /// keeps the function alive) stops its device thread at least.
    fn discard(self) {
        let Model { f, tx, injector } = self;
        drop(tx);
        injector.join().expect("injector");
        if Arc::strong_count(&f) > 1 {
            f.hca().fuzz_halt();
        }
    }
}

/// The target's state across inputs: one model, reset to its power-on state before each
/// input ([`Hca::fuzz_reset`](uhca_hw::model::Hca::fuzz_reset)), so that an input runs as
/// it would on a fresh model (a crash reproduces from the input alone; the test
/// `tests/determinism.rs` checks it). A model the driver leaked memory into (a queue the
/// device refused to destroy keeps its mapping) is given up and the next input gets a
/// fresh one.
#[derive(Default)]
pub struct Harness {
    model: Option<Model>,
}

impl Harness {
    /// A harness; the model is made by the first input.
    pub fn new() -> Harness {
        Harness::default()
    }

    /// Runs one input (see the module docs) with the fuzz target's options.
    pub fn run_input(&mut self, data: &[u8]) {
        self.run(data, &Options::default());
    }

    /// Runs one input with `opts`; the transcript is empty unless `opts.record`.
    pub fn run(&mut self, data: &[u8], opts: &Options) -> Transcript {
        let m = match self.model.take() {
            Some(m) => m,
            None => Model::new(),
        };
        m.f.hca().fuzz_reset();
        // The driver's MKey variant bytes are per process: back to their start too.
        uhca::resource::mkey::fuzz_reset_variants();
        let transcript = run_on(&m, data, opts);
        m.sync();
        // The driver is closed: only memory it leaked on purpose keeps the function
        // (beyond this harness and the injector) or a mapping alive.
        if Arc::strong_count(&m.f) > 2 || !m.f.hca().dma_mappings().is_empty() {
            m.discard();
        } else {
            self.model = Some(m);
        }
        transcript
    }
}

/// Runs one input on a fresh model (what the fuzz target did before it kept its model;
/// the reference of the determinism test).
pub fn run_fresh(data: &[u8], opts: &Options) -> Transcript {
    let mut h = Harness::new();
    let t = h.run(data, opts);
    if let Some(m) = h.model.take() {
        m.discard();
    }
    t
}

fn run_on(m: &Model, data: &[u8], opts: &Options) -> Transcript {
    let mut r = Reader::new(data);
    let fw = r.u8();
    let plan = decode(&mut r);
    let f = &m.f;
    let bar = f.hca().bar0();
    let bar = BarPtr(bar.ptr as usize, bar.len);
    if fw & 1 != 0 {
        bar.write(0x1fc, 1 << 31); // `initializing` (the model clears it after its delay)
    }
    if fw & 2 != 0 {
        // nic_interface (bits 10:8 of cmdq_addr_l_sz) as the device reports it: the rest of
        // the word kept. Writing the whole word zeroed the queue's size and stride too,
        // which the driver then read as a bad geometry, unless the model's thread had
        // restored them first (it keeps [7:0] as the device's read-only bits), which
        // depended on whether that thread was awake: on a kept model it was.
        let l = bar.read(0x14);
        bar.write(0x14, (l & !(7 << 8)) | u32::from(fw >> 4 & 7) << 8);
    }
    let tx = Mutex::new(m.tx.clone());
    let record = opts.record;
    let transcript = Arc::new(Mutex::new(Transcript::default()));
    let rec = transcript.clone();
    let mut count: u8 = 0;
    fuzzing::set_output_hook(Some(Box::new(move |input, out| {
        let at = count;
        count = count.saturating_add(1);
        let mut lie = None;
        let mut injected = false;
        for a in plan.get(&at).into_iter().flatten() {
            match a {
                Act::Flip(off, x) => {
                    if !out.is_empty() {
                        let i = usize::from(*off) % out.len();
                        out[i] ^= x;
                    }
                }
                Act::Refuse(s, syn) => {
                    if out.len() >= 8 {
                        out[0] = *s;
                        out[4..8].copy_from_slice(&syn.to_be_bytes());
                    }
                }
                Act::Len(n) => out.resize(usize::from(*n), 0),
                Act::Delivery(ds) => lie = Some(DeliveryStatus::from(*ds & 0x7F)),
                Act::Bar(off, v) => bar.write(usize::from(*off), *v),
                Act::PageRequest(n) => {
                    let n = cut_pages(*n);
                    injected = true;
                    let _ = tx.lock().map(|t| t.send(Inject::Pages(n)));
                }
                Act::Event(t, s, d) => {
                    injected = true;
                    let _ = tx.lock().map(|q| q.send(Inject::Event(*t, *s, *d)));
                }
                Act::Syndrome(s) => {
                    injected = true;
                    let _ = tx.lock().map(|t| t.send(Inject::Syndrome(*s)));
                }
            }
        }
        // QUERY_PAGES' count is a request like a PAGE_REQUEST's (the driver gives that many
        // at boot): cut the same way, whatever the plan made of the output. Uncut, one
        // flipped byte had the driver map and populate 1.6 GB in seconds per input.
        if input.get(..2) == Some(&u16::from(Opcode::QueryPages).to_be_bytes()[..])
            && let Ok(mut q) = QueryPagesOut::new_checked(&mut out[..])
        {
            q.set_num_pages(cut_pages(q.num_pages() as i32) as u32);
        }
        if record
            && let Ok(mut t) = rec.lock()
            && !t.injected
        {
            let ds = lie.map(|d: DeliveryStatus| u8::from(d));
            t.commands.push((input.to_vec(), out.clone(), ds));
            t.injected = injected;
        }
        lie
    })));
    let cfg = DeviceConfig {
        health_interval: opts.health_interval,
        init_timeout: Duration::from_millis(50),
        cmd_timeout: Some(opts.cmd_timeout),
        // Bit 2: the model's own thread runs the commands; then the driver waits as it does
        // in production (health polls and events taken during the wait, timeouts), which
        // run to completion rarely gives it time for. The fuzzer keeps such inputs where
        // they reach more; the others run fast.
        drive_commands: opts.drive && fw & 4 == 0,
        ..DeviceConfig::default()
    };
    // Driven commands: the model's thread stays out of the passes, or the driver's tries
    // would find them taken a varying number of times, and the point where its command
    // wait services events (a PAGE_REQUEST answered earlier or later among the commands)
    // would follow the scheduler (tests/determinism.rs saw it under load).
    f.hca().fuzz_driven_only(cfg.drive_commands);
    let pf: Arc<dyn PciFunction> = f.clone();
    let trace = std::env::var_os("UHCA_FUZZ_TRACE").is_some();
    let t0 = std::time::Instant::now();
    match Device::open(pf, cfg) {
        Ok(dev) => {
            exercise(&dev, trace);
            let r = dev.close();
            if trace {
                eprintln!("close: {r:?}");
            }
        }
        Err(e) if trace => eprintln!("open: {e} ({:?})", t0.elapsed()),
        Err(_) => {}
    }
    fuzzing::set_output_hook(None); // drops the hook and its sender
    if trace {
        eprintln!("done after {:?}", t0.elapsed());
    }
    transcript.lock().map(|t| t.clone()).unwrap_or_default()
}

/// A count of pages the device asks for, as this harness lets the driver see it: counts the
/// driver honours (up to 2^20 pages, 4 GiB) are cut to under 2^12 (16 MiB), so a run stays
/// fast and within the fuzzer's memory limit; counts it refuses, and offers (negative),
/// pass as they are.
fn cut_pages(n: i32) -> i32 {
    if (1 << 12..=1 << 20).contains(&n) {
        n % (1 << 12)
    } else {
        n
    }
}

/// Where the registered buffer lives: a fixed, page-aligned address (its address and page
/// offset are in the commands that register it), above AddressSanitizer's shadow memory.
const MR_ADDR: usize = 0x5a00_0000_0000;

/// The registered buffer.
struct MrMem(AnonMem);

// SAFETY: a mapping owned by the MR until deregistration, which never moves.
unsafe impl uhca::dma::MrBuffer for MrMem {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// What an application does after boot; every error is acceptable, nothing else is.
fn exercise(dev: &Device, trace: bool) {
    let _ = dev.process_events();
    let _ = dev.check_health();
    let _ = dev.take_events();
    let Ok(pd) = dev.alloc_pd() else { return };
    let _uar = dev.alloc_uar();
    let mr = pd.reg_mr(MrMem(AnonMem::at(MR_ADDR, 8192)), Access::ALL);
    if let Ok(mr) = &mr {
        let _ = mr.query();
    }
    let cq = dev.create_cq(&CqConfig::default());
    let cq2 = dev.create_cq(&CqConfig {
        entries: 16,
        events: true,
    });
    if let (Ok(cq), Ok(cq2)) = (&cq, &cq2) {
        let _ = cq.query();
        if let Ok(qp) = dev.create_qp(&pd, cq, cq2, &QpConfig::default()) {
            let _ = qp.query_state();
        }
    }
    let _ = dev.process_events();
    let _ = dev.fw_pages();
    if trace {
        eprintln!(
            "booted; mr {:?}, cq {:?}, cq with events {:?}",
            mr.as_ref().map(|m| m.lkey()),
            cq.as_ref().map(|c| c.cqn()),
            cq2.as_ref().map(|c| c.cqn())
        );
    }
}

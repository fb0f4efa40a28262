//! The driver against a hostile device: the model computes every command's output, and
//! the fuzzer's plan rewrites it before the driver sees it (bytes, status and syndrome,
//! length, delivery status), writes init-segment and health words, and posts events
//! (PAGE_REQUESTs with any count, any EQE type and data). The driver boots
//! (`Device::open`), makes a PD, a UAR, an MR, CQs and a QP, handles events, checks
//! health and closes: whatever the device says, it must end with `Ok` or a typed error:
//! never a panic, a hang or undefined behaviour (ASan).
//!
//! Input: a prelude (`fw u8`: bit 0 raises `initializing` for good, bit 1 writes the
//! `nic_interface` bits of `cmdq_addr_l_sz` from bits 4-6), then actions until the input
//! ends, each `at u8` (the command it follows, counted from 0) and `kind u8`:
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
//! `UHCA_FUZZ_TRACE=1` prints how far the driver got (replaying one input).

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uhca::pci::PciFunction;
use uhca::pci::model::ModelFunction;
use uhca::resource::{Access, CqConfig, QpConfig};
use uhca::{Device, DeviceConfig};
use uhca_hw::layout::cmd::DeliveryStatus;
use uhca_hw::layout::eqe::EventType;
use uhca_hw::model::{ModelConfig, fuzzing};

use crate::Reader;

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
    fn write(self, off: usize, v: u32) {
        if off + 4 <= self.1 {
            // SAFETY: inside BAR0 (checked), which outlives the hook: the hook is removed
            // before the model is dropped. A volatile aligned 32-bit store, as a device
            // register write.
            unsafe { std::ptr::write_volatile((self.0 + off) as *mut u32, v.to_be()) }
        }
    }
}

/// Runs one input (see the module docs).
pub fn run_input(data: &[u8]) {
    let mut r = Reader::new(data);
    let fw = r.u8();
    let plan = decode(&mut r);
    let f = ModelFunction::new(ModelConfig {
        name: "hostile".into(),
        // No boot delay: the driver's wait for `initializing` polls every 200 µs, a
        // per-input cost; flags bit 0 raises `initializing` when an input wants that wait.
        boot_delay: Duration::ZERO,
        ..ModelConfig::default()
    })
    .expect("model");
    let bar = f.hca().bar0();
    let bar = BarPtr(bar.ptr as usize, bar.len);
    if fw & 1 != 0 {
        bar.write(0x1fc, 1 << 31); // `initializing` (the model clears it after its delay)
    }
    if fw & 2 != 0 {
        // nic_interface (bits 10:8 of cmdq_addr_l_sz) as the device reports it.
        bar.write(0x14, u32::from(fw >> 4 & 7) << 8);
    }
    let (tx, rx) = mpsc::channel::<Inject>();
    let injector = {
        let f = f.clone();
        std::thread::spawn(move || {
            for i in rx {
                match i {
                    Inject::Pages(n) => f.hca().inject_page_request(n),
                    Inject::Event(t, s, d) => f.hca().inject_event(EventType::from(t), s, &d),
                    Inject::Syndrome(s) => f.hca().faults().set_health_syndrome(s),
                }
            }
        })
    };
    let tx = Mutex::new(tx);
    let mut count: u8 = 0;
    fuzzing::set_output_hook(Some(Box::new(move |_input, out| {
        let at = count;
        count = count.saturating_add(1);
        let mut lie = None;
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
                    // Requests the driver honours (up to 2^20 pages, 4 GiB) are cut to
                    // 2^12 (16 MiB): a run must stay fast and in the fuzzer's memory limit.
                    let n = if (1 << 12..=1 << 20).contains(n) {
                        n % (1 << 12)
                    } else {
                        *n
                    };
                    let _ = tx.lock().map(|t| t.send(Inject::Pages(n)));
                }
                Act::Event(t, s, d) => {
                    let _ = tx.lock().map(|q| q.send(Inject::Event(*t, *s, *d)));
                }
                Act::Syndrome(s) => {
                    let _ = tx.lock().map(|t| t.send(Inject::Syndrome(*s)));
                }
            }
        }
        lie
    })));
    let cfg = DeviceConfig {
        // Short enough that a syndrome or a stalled counter is seen within one run (a
        // loaded machine may starve the model's health tick: a dead device is a typed
        // error too).
        health_interval: Duration::from_millis(20),
        init_timeout: Duration::from_millis(50),
        // Short: a command the hostile device redirected (queue address, doorbell) never
        // completes, and every such wait is a whole timeout.
        cmd_timeout: Some(Duration::from_millis(100)),
        ..DeviceConfig::default()
    };
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
    injector.join().expect("injector");
    if Arc::strong_count(&f) > 1 {
        // The driver leaked a queue on purpose (its DESTROY was refused): the memory keeps
        // the function, and so the model, alive; stop its device thread at least.
        f.hca().fuzz_halt();
    }
    if trace {
        eprintln!("done after {:?}", t0.elapsed());
    }
}

/// What an application does after boot; every error is acceptable, nothing else is.
fn exercise(dev: &Device, trace: bool) {
    let _ = dev.process_events();
    let _ = dev.check_health();
    let _ = dev.take_events();
    let Ok(pd) = dev.alloc_pd() else { return };
    let _uar = dev.alloc_uar();
    let mr = pd.reg_mr(vec![0u8; 8192], Access::ALL);
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

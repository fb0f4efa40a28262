//! The harnesses that keep state across inputs (one model, one link pair) must run every
//! input as it would run alone, so that a crash reproduces from its input: each seed, run
//! after the others (forwards, then backwards: A after B and B after A), must observe
//! exactly what it observes on fresh state.

use std::sync::Mutex;
use std::time::Duration;

use uhca_fuzz::{cmdq, hostile, rc};

/// The harnesses share process-wide state (the model's output hook, the driver's MKey
/// variants): one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("seed dir")
        .map(|e| {
            let p = e.expect("entry").path();
            let d = std::fs::read(&p).expect("seed");
            (p.file_name().unwrap().to_string_lossy().into_owned(), d)
        })
        .collect();
    v.sort();
    assert!(v.len() > 4, "seeds of {target}");
    v
}

/// Runs every seed after every other one (forwards, then backwards) with `kept`, and
/// compares each result with the seed's `fresh` one (`Debug` lines: the first that differs
/// is reported).
fn check<T: PartialEq + std::fmt::Debug>(
    seeds: &[(String, Vec<u8>)],
    mut fresh: impl FnMut(&[u8]) -> T,
    mut kept: impl FnMut(&[u8]) -> T,
) {
    let reference: Vec<T> = seeds.iter().map(|(_, d)| fresh(d)).collect();
    let order = (0..seeds.len()).chain((0..seeds.len()).rev());
    for i in order {
        let got = kept(&seeds[i].1);
        if got != reference[i] {
            let (a, b) = (format!("{got:#?}"), format!("{:#?}", reference[i]));
            let (n, (x, y)) = a
                .lines()
                .zip(b.lines())
                .enumerate()
                .find(|(_, (x, y))| x != y)
                .unwrap_or((0, ("(length)", "(length)")));
            panic!(
                "{}: differs from a fresh run at line {n}: {x} vs {y}",
                seeds[i].0
            );
        }
    }
}

#[test]
fn model_cmd_runs_an_input_as_on_a_fresh_model() {
    let _serial = serial();
    let seeds = seeds("model_cmd");
    let mut kept = cmdq::Harness::new();
    check(
        &seeds,
        |d| cmdq::Harness::new().run_recorded(d),
        |d| kept.run_recorded(d),
    );
}

#[test]
fn model_cmd_reset_clears_what_the_device_wrote() {
    let _serial = serial();
    // A driver's session makes EQs and gives firmware pages: the device writes EQEs and
    // page tags into the harness's memory, which QUERY_CQ and QUERY_SRQ can read back
    // (doorbell records) in a later input.
    let (_, session) = seeds("model_cmd")
        .into_iter()
        .find(|(n, _)| n == "driver-session")
        .expect("seed driver-session");
    let mut h = cmdq::Harness::new();
    h.run_input(&session);
    assert!(!h.memory_is_zero(), "the session wrote nothing");
    h.reset();
    assert!(h.memory_is_zero(), "reset left bytes behind");
}

#[test]
fn rc_receive_runs_an_input_as_on_a_fresh_link() {
    let _serial = serial();
    let seeds = seeds("rc_receive");
    check(
        &seeds,
        |d| {
            rc::forget_links();
            rc::run_recorded(d)
        },
        rc::run_recorded,
    );
}

/// MANAGE_PAGES, the command that answers a PAGE_REQUEST.
const MANAGE_PAGES: [u8; 2] = [0x01, 0x08];

/// `t` with what the scheduler orders taken out of its order. When the model's own thread
/// runs the commands (the prelude's bit 2), it posts a PAGE_REQUEST after the command that
/// changed its demand, and the driver answers it whenever it next drains its event queue:
/// before or after the command that follows, as with hardware, whatever the inputs before.
/// Such a transcript keeps every other command in order and its MANAGE_PAGES commands
/// sorted at the end. (A plan's actions count commands; the seeds that set bit 2 have none.)
fn settled(mut t: hostile::Transcript, input: &[u8]) -> hostile::Transcript {
    if input.first().is_some_and(|fw| fw & 4 != 0) {
        let (mut pages, rest): (Vec<_>, Vec<_>) = t
            .commands
            .into_iter()
            .partition(|c| c.0.starts_with(&MANAGE_PAGES));
        pages.sort();
        t.commands = rest.into_iter().chain(pages).collect();
    }
    t
}

#[test]
fn driver_device_runs_an_input_as_on_a_fresh_model() {
    let _serial = serial();
    // No health polls (a loaded machine may starve the model's health tick) and a long
    // command timeout (a command must not time out by load alone): what is left depends on
    // the input only, up to the first injected event (`Transcript`).
    let opts = hostile::Options {
        health_interval: Duration::from_secs(3600),
        cmd_timeout: Duration::from_secs(10),
        drive: true,
        record: true,
    };
    let seeds = seeds("driver_device");
    let mut kept = hostile::Harness::new();
    let reference: Vec<_> = seeds
        .iter()
        .map(|(_, d)| settled(hostile::run_fresh(d, &opts), d))
        .collect();
    for i in (0..seeds.len()).chain((0..seeds.len()).rev()) {
        let got = settled(kept.run(&seeds[i].1, &opts), &seeds[i].1);
        let want = &reference[i];
        let ops = |t: &hostile::Transcript| {
            t.commands
                .iter()
                .map(|c| format!("{:02x}{:02x}", c.0[0], c.0[1]))
                .collect::<Vec<_>>()
                .join(" ")
        };
        if got != *want {
            eprintln!(
                "{}:\n kept  {}\n fresh {}",
                seeds[i].0,
                ops(&got),
                ops(want)
            );
        }
        for (k, (g, w)) in got.commands.iter().zip(&want.commands).enumerate() {
            let at = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
            assert!(
                g == w,
                "{}: command {k} (opcode {:02x}{:02x}) differs from a fresh run: input at {:?}, output at {:?} (lengths {} {}), delivery {:?} {:?}",
                seeds[i].0,
                w.0[0],
                w.0[1],
                at(&g.0, &w.0),
                at(&g.1, &w.1),
                g.1.len(),
                w.1.len(),
                g.2,
                w.2
            );
        }
        assert_eq!(got, *want, "{}: a different number of commands", seeds[i].0);
    }
    let clean = hostile::run_fresh(
        &seeds.iter().find(|(n, _)| n == "clean-boot").unwrap().1,
        &opts,
    );
    assert!(
        clean.commands.len() > 20,
        "a clean boot: {} commands",
        clean.commands.len()
    );
}

/// Found by the sixth campaign (2026-11-28): inputs whose SENDs used every receive WQE left
/// the requester retrying its RNR NAKs forever (`rnr_retry` 7), so the harness's drain never
/// ended ("no quiescence"). The drain now gives an end that sends RNR NAKs with an empty
/// receive queue more receives, as an application would; both inputs end, and their
/// completions are checked as every input's are.
#[test]
fn rc_receive_drains_an_rnr_retried_forever() {
    let _g = serial();
    let all = seeds("rc_receive");
    let found: Vec<_> = all
        .iter()
        .filter(|(n, _)| n.starts_with("rnr-forever-"))
        .collect();
    assert_eq!(found.len(), 2, "the two inputs the campaign found");
    for (_, d) in found {
        rc::forget_links();
        let o = rc::run_recorded(d);
        assert!(
            o.completions.iter().flatten().any(|c| c.contains("Recv")),
            "the receiver completed receives"
        );
    }
}

/// Found by the tenth campaign (2026-11-28, `model_cmd`): the input creates an EQ that takes
/// command completions and whose buffer is the command queue page (its PAS is the queue's
/// IOVA), so the device wrote the completion EQE of slot 26's command over that very entry,
/// as hardware would; the harness read the EQE's data (`1 << 26`) as the command's output,
/// "status 0x4 without a syndrome". It now checks only entries the device wrote nothing
/// else over (`Harness::overwritten`).
#[test]
fn model_cmd_skips_an_entry_an_eq_wrote_over() {
    let _g = serial();
    let all = seeds("model_cmd");
    let (_, d) = all
        .iter()
        .find(|(n, _)| n == "eq-over-cmdq")
        .expect("the input the campaign found");
    let mut h = cmdq::Harness::new();
    h.run_input(d);
    assert!(
        h.overwritten(26),
        "the EQ's write over slot 26's entry is seen"
    );
}

//! Measures a harness's speed without libFuzzer: feeds every file of a seed directory to
//! the target's `run_input` `rounds` times in one process and prints inputs per second.
//! `harness-speed <rc_receive|model_cmd|driver_device> <seed dir> [rounds]`; a plain
//! release build (no coverage instrumentation), so the figures are the harness's own cost.
//! `UHCA_SPEED_EACH=1` prints each input's time; `UHCA_FUZZ_NO_DRIVE=1` runs
//! `driver_device` without run to completion (`hostile::Options::drive`).

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: harness-speed <rc_receive|model_cmd|driver_device> <seed dir> [rounds]");
        std::process::exit(2);
    }
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let each = std::env::var_os("UHCA_SPEED_EACH").is_some();
    let mut inputs: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(&args[2])
        .expect("seed dir")
        .map(|e| {
            let p = e.expect("entry").path();
            let d = std::fs::read(&p).expect("seed");
            (p, d)
        })
        .collect();
    inputs.sort();
    let mut cmdq: Option<uhca_fuzz::cmdq::Harness> = None;
    let mut hostile = uhca_fuzz::hostile::Harness::new();
    let hostile_opts = uhca_fuzz::hostile::Options::default();
    let t0 = Instant::now();
    let mut n = 0usize;
    for _ in 0..rounds {
        for (p, i) in &inputs {
            let t = Instant::now();
            match args[1].as_str() {
                "rc_receive" => uhca_fuzz::rc::run_input(i),
                "model_cmd" => cmdq
                    .get_or_insert_with(uhca_fuzz::cmdq::Harness::new)
                    .run_input(i),
                "driver_device" => {
                    hostile.run(i, &hostile_opts);
                }
                t => panic!("unknown target {t}"),
            }
            n += 1;
            if each {
                eprintln!(
                    "{:>10.3} ms {}",
                    t.elapsed().as_secs_f64() * 1e3,
                    p.display()
                );
            }
        }
    }
    let s = t0.elapsed().as_secs_f64();
    println!(
        "{}: {n} inputs in {s:.2} s = {:.1} inputs/s",
        args[1],
        n as f64 / s
    );
}

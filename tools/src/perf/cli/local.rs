//! Both ends of a test in this process: on the built-in model (one HCA in loopback through its
//! port's own MAC, or two linked by the model's in-process link with `--pair`), or on a
//! device bound to vfio-pci with the buffers in a GPU (`-d BDF --use_cuda N`); `-c UD` on the
//! model.

use super::Args;
use super::checks::validate;
use super::report::{
    LINE, bw_columns, bw_line, closing, drive, header, lat_columns, lat_line, progress,
};
use crate::device;
use crate::perf::{self, Bench};

/// The RC test `a` with both ends here: the header, then every size.
pub(super) fn run(a: &Args) -> Result<(), String> {
    let (sizes, settings) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    let mut bench = if a.gpu_loopback() {
        let dev =
            device::open(&a.spec(), uhca::DeviceConfig::default()).map_err(|e| e.to_string())?;
        Bench::on_device(&settings, max, dev)
    } else {
        Bench::new(&settings, max, a.pair)
    }
    .map_err(|e| e.to_string())?;
    if let Some(x) = a.gid_index {
        perf::check_gid_index(bench.device(), x)?;
    }
    header(a, &settings, &bench);
    drive(a, &mut bench, &sizes)
}

/// `-c UD`: both ends here ([`perf::ud`]).
pub(super) fn run_ud(a: &Args) -> Result<(), String> {
    let (sizes, s) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    let mut bench = perf::ud::UdBench::new(&s, max, a.pair).map_err(|e| e.to_string())?;
    if let Some(x) = a.gid_index {
        perf::check_gid_index(bench.device(), x)?;
    }
    if a.output.is_none() {
        println!("{LINE}");
        println!("{}", bench.header(a.mode.title(), a.mode.is_bw(), a.pair));
        println!("{LINE}");
    }
    let p = progress(&sizes, &s);
    if a.mode.is_bw() {
        bw_columns(a);
        for (k, &size) in sizes.iter().enumerate() {
            p.start(k, size);
            bw_line(a, &bench.bandwidth(size).map_err(|e| e.to_string())?);
        }
    } else {
        lat_columns(a);
        for (k, &size) in sizes.iter().enumerate() {
            p.start(k, size);
            lat_line(a, &bench.latency(size).map_err(|e| e.to_string())?);
        }
    }
    closing(a);
    Ok(())
}

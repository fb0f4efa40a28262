//! `uhca-perf`: perftest-like bandwidth and latency tests over uhca RC QPs.
//!
//! ```text
//! uhca-perf write_bw -s 65536 -n 5000      # or: ln -s uhca-perf write_bw; ./write_bw -s 65536
//! uhca-perf write_lat -s 2 -n 10000
//! uhca-perf read_bw -a --report_gbits
//! uhca-perf cacheline -n 1000000            # reference: one-way cross-core cache-line transfer
//! uhca-perf memcpy -s 65536 -n 200000       # reference: single-thread memcpy bandwidth
//! ```
//!
//! Both ends run in this process on the built-in model HCA (loopback through the port's own
//! MAC), or on two model HCAs joined by the model's in-process link with `--pair`.
//!
//! Between two processes or machines, as perftest: `uhca-perf write_bw -d 0000:3b:00.0`
//! (a server: it waits for one client on TCP `-p`, 18515 by default) and `uhca-perf write_bw
//! -d 0000:3b:00.0 SERVER` (the client). A device other than the built-in model
//! (`-d BDF`, `--vfio-user SOCKET`, or the model on a UDP link: `--link-local ADDR
//! --link-peer ADDR`), a HOST or `-p` asks for this mode. The two agree over TCP in
//! perftest's own exchange (`uhca_tools::perf::perftest`; either end may be perftest's
//! `ib_write_bw` & co., both get the same flags), or with `--oob uhca` in uhca-perf's own
//! (`uhca_tools::perf::control`): the mode must be the same on both, and the size,
//! iterations, `-D`, QPs, depth, inline size and MTU are the client's.
//! `--use_cuda 0` puts both ends' buffers in the model GPU's BAR (peer memory registered
//! through the peer-memory client; `--use_cuda_dmabuf` registers the dma-buf fd instead):
//! the header says "model GPU", as it is not GPU hardware. With `-d BDF` and no HOST or
//! `-p`, `--use_cuda N` runs both ends in this process on that device (loopback) with the
//! buffers in GPU N among the display-class functions bound to vfio-pci: each buffer a
//! range of its BAR1 exported by the kernel as a VFIO dma-buf and imported by the HCA with
//! `IOMMU_IOAS_MAP_FILE` (`uhca-perf write_bw -d 0000:00:03.0 --use_cuda 0
//! --use_cuda_dmabuf`; tests/vm/run-p2p-test.sh runs it in a guest), and the header names the
//! GPU and that path.

use std::process::ExitCode;

use clap::Parser;
use uhca_tools::perf::cli::{self, Args, RefArgs};

fn main() -> ExitCode {
    uhca_tools::pipe::end_on_broken_pipe();
    // Log lines (the network port's counters when it closes, at `info`) only when asked.
    if std::env::var_os("UHCA_LOG").is_some() {
        uhca_tools::logging::init("UHCA_LOG", "warn");
    }
    let argv = cli::argv();
    if cli::is_reference(&argv) {
        return match RefArgs::try_parse_from(argv).map(|a| cli::run_reference(&a)) {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) => {
                eprintln!("uhca-perf: {e}");
                ExitCode::FAILURE
            }
            Err(e) => {
                let _ = e.print();
                ExitCode::from(2)
            }
        };
    }
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uhca-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

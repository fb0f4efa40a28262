//! A tool whose output is closed early (`uhca-perf write_bw | head -1`) ends as `ls` does:
//! killed by `SIGPIPE`, nothing on stderr, never a panic (exit 101).

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};

/// Runs `bin` with `args` and its standard output a pipe whose reader is gone before the tool
/// writes (deterministically: a `head` that stopped reading); returns how it ended and its
/// stderr.
fn run_with_stdout_closed(bin: &str, args: &[&str]) -> (ExitStatus, String) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut err)
        .expect("stderr reads");
    (child.wait().expect("waits"), err)
}

fn ends_like_ls(bin: &str, args: &[&str]) {
    let (status, err) = run_with_stdout_closed(bin, args);
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert_ne!(status.code(), Some(101), "{args:?}: {err}");
    assert_eq!(
        status.signal(),
        Some(libc::SIGPIPE),
        "{args:?}: {status}, {err}"
    );
    assert_eq!(err, "", "{args:?}");
}

#[test]
fn uhca_perf_ends_quietly_on_a_closed_stdout() {
    let perf = env!("CARGO_BIN_EXE_uhca-perf");
    ends_like_ls(perf, &["write_bw", "-n", "100"]);
    ends_like_ls(perf, &["write_lat", "-n", "100"]);
}

#[test]
fn uhca_info_ends_quietly_on_a_closed_stdout() {
    let info = env!("CARGO_BIN_EXE_uhca-info");
    ends_like_ls(info, &[]);
    ends_like_ls(info, &["--json", "--counters"]);
}

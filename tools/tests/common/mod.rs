//! Shared by the tools' CLI tests: run a built binary and collect what it said.

use std::process::Command;

/// Runs `bin` (a path from `env!("CARGO_BIN_EXE_...")`) with `args`; returns its exit code
/// (-1 when killed by a signal), stdout and stderr.
pub fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin).args(args).output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

//! A closed output ends a tool as it ends `ls`: `uhca-perf write_bw -a | head -1` stops
//! quietly, killed by `SIGPIPE`, instead of panicking (exit 101) on the next `println!`.
//!
//! Rust ignores `SIGPIPE`, so a write to a pipe whose reader has gone fails with `EPIPE`, and
//! `println!`/`eprintln!` panic on it. Every tool in `tools/src/bin` calls [`end_on_broken_pipe`]
//! first in `main`: it wraps the panic hook, and a panic that is exactly the standard output's
//! (or error's) broken pipe ends the process by `SIGPIPE`'s default action, with nothing said.
//! Every other panic goes to the previous hook unchanged. `SIGPIPE` itself stays ignored, so a
//! socket whose peer went away (the vfio-user client, the model server) still gets `EPIPE` as
//! an error it reports.

use std::io;
use std::panic::{self, PanicHookInfo};

/// Installs the broken-pipe ending on top of the current panic hook (call it after any
/// [`panic::set_hook`] of the tool's own).
pub fn end_on_broken_pipe() {
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if is_broken_pipe_print(info) {
            die_of_sigpipe();
        }
        previous(info);
    }));
}

/// Whether `info` is the standard library's panic on a print to a closed pipe.
fn is_broken_pipe_print(info: &PanicHookInfo<'_>) -> bool {
    let payload = info.payload();
    let msg = match payload.downcast_ref::<String>() {
        Some(s) => s.as_str(),
        None => match payload.downcast_ref::<&str>() {
            Some(s) => s,
            None => return false,
        },
    };
    is_broken_pipe_message(msg)
}

/// Whether `msg` is what `print!`/`eprint!` panic with when the write fails with `EPIPE`.
fn is_broken_pipe_message(msg: &str) -> bool {
    let epipe = io::Error::from_raw_os_error(libc::EPIPE).to_string();
    ["stdout", "stderr"]
        .iter()
        .any(|s| msg == format!("failed printing to {s}: {epipe}"))
}

/// Ends the process as an unhandled `SIGPIPE` does (the shell sees 128 + 13 = 141).
#[allow(unsafe_code)]
fn die_of_sigpipe() -> ! {
    // SAFETY: restoring a signal's default disposition and raising it takes no pointers and
    // touches no memory of ours; the process ends here.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // Only if the signal is blocked in this thread: the same status by hand.
    std::process::exit(128 + libc::SIGPIPE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_print_to_a_broken_pipe_is_matched() {
        assert!(is_broken_pipe_message(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(is_broken_pipe_message(
            "failed printing to stderr: Broken pipe (os error 32)"
        ));
        assert!(!is_broken_pipe_message(
            "failed printing to stdout: No space left on device (os error 28)"
        ));
        assert!(!is_broken_pipe_message("index out of bounds"));
    }
}

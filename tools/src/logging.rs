//! The tools' log output: `tracing` events on stderr, filtered by an environment variable,
//! in colour only when stderr is a terminal (and `NO_COLOR` is unset or empty,
//! no-color.org), so a log redirected to a file or a pipe carries no escape codes.

use std::io::IsTerminal;

/// Whether log lines get ANSI colours: stderr is a terminal and `no_color` (the value of
/// `NO_COLOR`) is unset or empty.
pub fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Sends the process's `tracing` events to stderr, filtered by the variable `filter_var`
/// (`RUST_LOG` syntax), `default` when it is unset or invalid.
pub fn init(filter_var: &str, default: &str) {
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(filter_var)
                .unwrap_or_else(|_| default.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::use_colour;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some(OsStr::new(""))));
    }
}

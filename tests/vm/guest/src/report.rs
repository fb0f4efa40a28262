//! The PASS/FAIL tally the guest programs print, and a tracing writer that counts the
//! driver's ERROR events (teardown reports its errors there).

use std::sync::atomic::{AtomicUsize, Ordering};

/// ERROR events the driver logged through `tracing` since the program started.
static DRIVER_ERRORS: AtomicUsize = AtomicUsize::new(0);

/// ERROR events logged so far (through a subscriber writing to [`CountErrors`]).
pub fn driver_errors() -> usize {
    DRIVER_ERRORS.load(Ordering::Relaxed)
}

/// Sends tracing output to stderr and counts ERROR events.
pub struct CountErrors;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CountErrors {
    type Writer = std::io::Stderr;
    fn make_writer(&'a self) -> std::io::Stderr {
        std::io::stderr()
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> std::io::Stderr {
        if *meta.level() == tracing::Level::ERROR {
            DRIVER_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
        std::io::stderr()
    }
}

/// Installs the global tracing subscriber: INFO and above (or `RUST_LOG`) to stderr,
/// through [`CountErrors`].
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(CountErrors)
        .without_time()
        .with_ansi(false)
        .init();
}

/// The PASS/FAIL tally.
#[derive(Debug, Default)]
pub struct Tally {
    /// Checks passed.
    pub passed: u32,
    /// Checks failed.
    pub failed: u32,
    /// Whether to print a line per check.
    pub quiet: bool,
}

impl Tally {
    /// Records one check and prints its line.
    pub fn check(&mut self, ok: bool, what: impl AsRef<str>) -> bool {
        let word = if ok {
            self.passed += 1;
            "PASS"
        } else {
            self.failed += 1;
            "FAIL"
        };
        if !self.quiet || !ok {
            println!("{word}: {}", what.as_ref());
        }
        ok
    }

    /// Records a `Result` as one check; returns the value on success.
    pub fn ok<T, E: std::fmt::Display>(&mut self, r: Result<T, E>, what: &str) -> Option<T> {
        match r {
            Ok(v) => {
                self.check(true, what);
                Some(v)
            }
            Err(e) => {
                self.check(false, format!("{what}: {e}"));
                None
            }
        }
    }

    /// Prints the summary line the host scripts look for.
    pub fn print_result(&self) {
        println!("RESULT: {} passed, {} failed", self.passed, self.failed);
    }
}

//! `uhca-perf` from the outside: bad flags get a message and a failing exit status, never a
//! panic; a small run prints perftest's table.

mod common;

fn perf(args: &[&str]) -> (i32, String, String) {
    common::run(env!("CARGO_BIN_EXE_uhca-perf"), args)
}

#[test]
fn bad_flags_are_messages_not_panics() {
    for (args, want) in [
        (&["write_bw", "-s", "0"][..], "size"),
        (&["write_bw", "-s", "99999999999"], "size"),
        (&["write_bw", "-t", "0"], "depth"),
        (&["write_bw", "-n", "0"], "-n"),
        (
            &["write_bw", "-x", "99"],
            "-x 99: the port's GID table has 16 entries",
        ),
        (&["write_bw", "-x", "5"], "GID entry 5 is empty"),
        (
            &["write_bw", "-D", "18446744073709551615"],
            "-D 18446744073709551615",
        ),
        (&["read_bw", "-D", "31536001"], "1..=31536000 seconds"),
        (&["write_bw", "-D", "0"], "1..=31536000 seconds"),
        (&["write_bw", "-q", "0"], "QPs"),
        (&["write_bw", "-I", "4096"], "inline"),
        (&["write_bw", "-a", "-s", "64"], "exclude"),
        (&["write_lat", "--use_dm"], "use_dm"),
        (
            &["write_bw", "--use_dm", "-s", "1048576"],
            "more than the device's 262144 bytes",
        ),
        (&["atomic_bw", "-s", "16"], "8 bytes"),
        (&["write_bw", "-s", "banana"], "invalid value"),
        (&["no_such_test"], "invalid value"),
        (&["write_bw", "--no-such-flag"], "unexpected argument"),
        (&["read_bw", "-o", "0"], "invalid value"),
        (
            &["read_bw", "-o", "17", "-n", "10"],
            "max_rd_atomic: 17 is more than the device's 16",
        ),
        (&["write_bw", "-Q", "0"], "invalid value"),
        (&["write_bw", "-l", "0"], "a list is 1..=the depth"),
        (
            &["write_bw", "-l", "33", "-t", "32"],
            "a list is 1..=the depth (-t 32)",
        ),
        (&["write_bw", "-c", "UD"], "write_bw needs a connected QP"),
        (&["write_bw", "-i", "2"], "one port"),
        (&["write_lat", "-e"], "watches the message's last byte"),
        (&["write_lat", "-b"], "bandwidth tests"),
        (&["write_bw", "--output", "latency"], "latency tests"),
        (&["write_lat", "--output=bandwidth"], "bandwidth tests"),
        (&["write_bw", "--output=peak"], "invalid value"),
        (&["write_bw", "-b", "-e"], "two CQs"),
        (&["send_bw", "-e"], "run a server and a client"),
        (
            &["write_bw", "--no-offload", "-p", "18599"],
            "built-in model",
        ),
    ] {
        let (code, _, err) = perf(args);
        assert_ne!(code, 0, "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// perftest's `-o`, `-Q`, `-l`, `-c RC` and `-i 1` are taken (`-Q` above the depth is cut
/// to it, as perftest does).
#[test]
fn perftest_pacing_flags_run() {
    for args in [
        &["read_bw", "-s", "4096", "-n", "100", "-t", "16", "-o", "2"][..],
        &["atomic_lat", "-n", "50", "-o", "1", "-e"],
        &["write_bw", "-s", "4096", "-n", "100", "-t", "16", "-e"],
        &[
            "send_bw", "-s", "4096", "-n", "50", "-t", "16", "-b", "-q", "2",
        ],
        &[
            "write_bw", "-s", "4096", "-n", "100", "-t", "16", "-Q", "1000", "-l", "3",
        ],
        &[
            "send_bw", "-s", "4096", "-n", "100", "-t", "16", "-Q", "5", "-l", "16", "-c", "rc",
            "-i", "1",
        ],
    ] {
        let (code, out, err) = perf(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        // The messages completed: 100 or 50, and with -b on 2 QPs 2 x 2 x 50.
        assert!(
            [" 100 ", " 50 ", " 200 "].iter().any(|n| out.contains(n)),
            "{args:?}: {out}"
        );
    }
}

/// Whether `s` is a figure as perftest prints it: digits, a point, `decimals` digits.
fn is_figure(s: &str, decimals: usize) -> bool {
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    match s.split_once('.') {
        Some((int, frac)) => digits(int) && digits(frac) && frac.len() == decimals,
        None => false,
    }
}

/// `--output` prints one figure per size and nothing else (as perftest, for scripts);
/// `-N` prints the peak as 0.
#[test]
fn output_prints_one_figure_per_size() {
    // (args, lines, decimals): perftest's "%.2f" for MB/s and usec, "%.6f" for Mpps.
    for (args, lines, decimals) in [
        (
            &["write_bw", "-s", "4096", "-n", "100", "--output=bandwidth"][..],
            1,
            2,
        ),
        (
            &[
                "send_bw",
                "-s",
                "4096",
                "-n",
                "100",
                "--output",
                "message_rate",
            ],
            1,
            6,
        ),
        (&["write_lat", "-n", "100", "--output=latency"], 1, 2),
        (&["read_bw", "-a", "-n", "20", "--output=bandwidth"], 23, 2),
    ] {
        let (code, out, err) = perf(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let got: Vec<&str> = out.lines().collect();
        assert_eq!(got.len(), lines, "{args:?}: {out}");
        // A well-formed figure, not a speed: a loaded machine may print 0.00.
        for l in got {
            assert!(is_figure(l, decimals), "{args:?}: {l:?}");
        }
    }
    let (code, out, _) = perf(&["write_bw", "-s", "4096", "-n", "100", "-N"]);
    assert_eq!(code, 0);
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("4096"))
        .unwrap();
    assert_eq!(row.split_whitespace().nth(2), Some("0.00"), "{row}");
}

#[test]
fn small_runs_print_perftest_tables() {
    let (code, out, err) = perf(&["write_bw", "-s", "4096", "-n", "100", "-t", "16"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "#bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        ),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("4096       100 ")),
        "{out}"
    );
    // The loopback as real packets: the same table.
    let args = [
        "write_bw",
        "-s",
        "8192",
        "-n",
        "100",
        "-t",
        "16",
        "--no-offload",
    ];
    let (code, out, err) = perf(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("8192       100 ")),
        "{out}"
    );
    let (code, out, err) = perf(&["send_lat", "-s", "2", "-n", "100", "--pair"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("t_typical[usec]") && out.contains("99.9% percentile[usec]"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("2       100 ")),
        "{out}"
    );
}

#[test]
fn gpu_placement_runs_on_the_model_gpu_and_says_so() {
    for extra in [&[][..], &["--use_cuda_dmabuf"][..]] {
        let mut args = vec![
            "write_bw",
            "-s",
            "4096",
            "-n",
            "100",
            "-t",
            "16",
            "--use_cuda",
            "0",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = perf(&args);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("model GPU BAR1"), "{out}");
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with("4096       100 ")),
            "{out}"
        );
    }
    let (code, out, err) = perf(&[
        "read_lat",
        "-s",
        "64",
        "-n",
        "50",
        "--use_cuda",
        "0",
        "--pair",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("model GPU BAR1") && out.contains("t_typical[usec]"),
        "{out}"
    );
    for (args, want) in [
        (&["write_bw", "--use_cuda", "1"][..], "model GPU 0"),
        (&["write_bw", "--use_cuda_dmabuf"], "needs --use_cuda"),
        (&["write_bw", "--use_cuda", "0", "--use_dm"], "exclude"),
        (&["atomic_bw", "--use_cuda", "0"], "atomics"),
    ] {
        let (code, _, err) = perf(args);
        assert_ne!(code, 0, "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // With -d BDF and no HOST or -p, --use_cuda is a loopback run on that device (the
    // guest's P2P test runs it on real vfio-pci functions): here the device is absent, and
    // the error is the device's, not a refusal of --use_cuda in a client/server run.
    let (code, _, err) = perf(&["write_bw", "-d", "0000:ff:1f.7", "--use_cuda", "0"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("0000:ff:1f.7") && !err.contains("client/server"),
        "{err}"
    );
}

/// The software model pins nothing, so the memory-lock limit does not apply to it: runs
/// with many QPs or every size pass under a small `ulimit -l` without CAP_IPC_LOCK (a
/// normal user's default), as they would on a machine with no NIC.
#[test]
fn the_model_runs_under_a_small_memlock_limit() {
    // As root, drop CAP_IPC_LOCK from the bounding set so the limit would apply.
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    let drop_cap = if root {
        "setpriv --bounding-set=-ipc_lock"
    } else {
        ""
    };
    for args in ["write_bw -q 64 -n 100 -s 65536", "write_bw -a -n 4"] {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -l 64 && exec {drop_cap} \"$0\" {args}"))
            .arg(env!("CARGO_BIN_EXE_uhca-perf"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args}: {err}");
        assert!(!err.contains("RLIMIT_MEMLOCK"), "{args}: {err}");
    }
}

/// A run through many sizes says on stderr as each starts (it ran silent for minutes);
/// stdout keeps only the figures.
#[test]
fn long_runs_report_progress_on_stderr() {
    let (code, out, err) = perf(&["read_bw", "-a", "-n", "20", "--output=bandwidth"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 23, "{out}");
    for (k, size) in (1..=23).map(|k| 1usize << k).enumerate() {
        let want = format!("uhca-perf: size {size} ({}/23), 20 messages", k + 1);
        assert!(err.contains(&want), "{want}: {err}");
    }
    // A short single-size run off a terminal stays quiet.
    let (code, _, err) = perf(&["write_bw", "-s", "4096", "-n", "100"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("uhca-perf: size"), "{err}");
}

//! Unit tests of the flags' checks.

use clap::Parser;

use super::*;

fn inline_of(argv: &[&str]) -> u32 {
    let a = Args::try_parse_from(argv).unwrap();
    validate(&a).unwrap().1.inline_size
}

#[test]
fn latency_writes_and_sends_default_to_perftest_inline_sizes() {
    assert_eq!(inline_of(&["uhca-perf", "write_lat"]), 220);
    assert_eq!(inline_of(&["uhca-perf", "send_lat"]), 220);
    assert_eq!(inline_of(&["uhca-perf", "write_lat", "-I", "0"]), 0);
    assert_eq!(inline_of(&["uhca-perf", "send_lat", "-I", "16"]), 16);
    assert_eq!(inline_of(&["uhca-perf", "write_bw"]), 0);
    assert_eq!(inline_of(&["uhca-perf", "read_lat"]), 0);
    let a = Args::try_parse_from(["uhca-perf", "write_lat", "-I", "221"]).unwrap();
    assert!(validate(&a).is_err());
}

#[test]
fn ud_runs_send_tests_here_up_to_the_mtu() {
    let check = |v: &[&str]| validate(&Args::try_parse_from(v).unwrap());
    let (sizes, s) = check(&["uhca-perf", "send_lat", "-c", "UD"]).unwrap();
    assert_eq!((sizes, s.qps), (vec![2], 1));
    let (sizes, _) = check(&["uhca-perf", "send_bw", "-c", "ud", "-a", "-m", "2048"]).unwrap();
    assert_eq!(sizes, (1..=11).map(|k| 1usize << k).collect::<Vec<_>>());
    for bad in [
        &[
            "uhca-perf",
            "send_bw",
            "-c",
            "UD",
            "-s",
            "4096",
            "-m",
            "1024",
        ][..],
        &["uhca-perf", "write_bw", "-c", "UD"],
        &["uhca-perf", "send_bw", "-c", "UD", "-q", "2"],
        &["uhca-perf", "send_bw", "-c", "UD", "-b"],
        // Between two processes (HOST given): not with -R, -D or --check.
        &[
            "uhca-perf",
            "send_bw",
            "-c",
            "UD",
            "--vfio-user",
            "s",
            "-R",
            "h",
        ],
        &[
            "uhca-perf",
            "send_bw",
            "-c",
            "UD",
            "--vfio-user",
            "s",
            "-D",
            "2",
            "h",
        ],
        &[
            "uhca-perf",
            "send_bw",
            "-c",
            "UD",
            "--vfio-user",
            "s",
            "--check",
            "h",
        ],
        &["uhca-perf", "send_bw", "-c", "UC"],
    ] {
        assert!(check(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn qp_timeout_and_check_are_taken_where_they_apply() {
    let parse = |v: &[&str]| {
        let mut v = v.to_vec();
        v.extend(["-d", "0000:3b:00.0"]);
        Args::try_parse_from(v)
    };
    let a = parse(&["uhca-perf", "read_bw", "-u", "20"]).unwrap();
    assert_eq!(validate(&a).unwrap().1.qp_timeout, 20);
    let a = parse(&["uhca-perf", "read_bw"]).unwrap();
    assert_eq!(validate(&a).unwrap().1.qp_timeout, 14);
    assert!(parse(&["uhca-perf", "read_bw", "-u", "32"]).is_err());
    // --check: one-way write/read/send bandwidth with perftest's exchange, client or
    // server.
    for ok in [
        &["uhca-perf", "send_bw", "--check"][..],
        &["uhca-perf", "read_bw", "--check", "host"],
    ] {
        assert!(validate(&parse(ok).unwrap()).is_ok(), "{ok:?}");
    }
    for bad in [
        &["uhca-perf", "atomic_bw", "--check", "host"][..],
        &["uhca-perf", "write_lat", "--check", "host"],
        &["uhca-perf", "write_bw", "--check", "-b", "host"],
        &["uhca-perf", "write_bw", "--check", "--oob", "uhca", "host"],
    ] {
        assert!(validate(&parse(bad).unwrap()).is_err(), "{bad:?}");
    }
    let local = Args::try_parse_from(["uhca-perf", "write_bw", "--check"]).unwrap();
    assert!(validate(&local).is_err(), "--check needs a peer");
}

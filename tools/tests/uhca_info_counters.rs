//! `uhca-info` port counters from the outside: `-c/--counters` (and `-v`) print the
//! `perfquery -x` names with their units in text and an object per port in JSON; a
//! mistyped flag is a message and a failing exit status, never a panic.

mod common;

fn info(args: &[&str]) -> (i32, String, String) {
    common::run(env!("CARGO_BIN_EXE_uhca-info"), args)
}

const NAMES: [&str; 8] = [
    "PortXmitData",
    "PortRcvData",
    "PortXmitPkts",
    "PortRcvPkts",
    "PortUnicastXmitPkts",
    "PortUnicastRcvPkts",
    "PortMulticastXmitPkts",
    "PortMulticastRcvPkts",
];

/// The value printed after `name:` and its dots.
fn value(text: &str, name: &str) -> Option<u64> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(&format!("{name}:")))?;
    line[name.len() + 1..].trim_start_matches('.').parse().ok()
}

#[test]
fn counters_flag_prints_perfquery_names_with_units() {
    for flag in ["-c", "--counters", "-v"] {
        let (code, out, err) = info(&[flag]);
        assert_eq!(code, 0, "{flag}: {err}");
        assert!(
            out.contains("4-byte words"),
            "{flag}: units explained\n{out}"
        );
        for name in NAMES {
            // A freshly booted model has sent nothing.
            assert_eq!(value(&out, name), Some(0), "{flag}: {name}\n{out}");
        }
    }
    let (code, out, _) = info(&[]);
    assert_eq!(code, 0);
    assert!(!out.contains("PortXmitData"), "counters only when asked");
}

#[test]
fn counters_in_json_are_an_object_per_port() {
    let (code, out, err) = info(&["--json", "--counters"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let c = &v["ports"][0]["counters"];
    assert!(c.is_object(), "{out}");
    for name in NAMES {
        assert_eq!(c[name].as_u64(), Some(0), "{name}");
    }
    assert_eq!(
        c["vport"]["transmitted_ib_unicast"]["octets"].as_u64(),
        Some(0)
    );
    assert!(c["units"].as_str().unwrap().contains("4-byte words"));
    let (_, plain, _) = info(&["--json"]);
    let v: serde_json::Value = serde_json::from_str(&plain).unwrap();
    assert!(v["ports"][0].get("counters").is_none());
}

/// `--traffic 3`: three 4 KiB WRITEs at the default 1024-byte MTU over the loopback, each
/// four request frames (IPv6 GID 0: Ethernet 14 + IPv6 40 + UDP 8 + BTH 12 + ICRC 4 = 78
/// bytes of headers, + RETH 16 on the first) and one ACK (78 + AETH 4), every frame sent
/// and received by the one port: 3 * 5 packets, 3 * (4096 + 4 * 78 + 16 + 82) bytes.
#[test]
fn traffic_makes_the_counters_count_exactly() {
    let (code, out, err) = info(&["-c", "--traffic", "3"]);
    assert_eq!(code, 0, "{err}");
    let bytes = 3 * (4096 + 4 * 78 + 16 + 82);
    for (name, want) in [
        ("PortXmitData", bytes / 4),
        ("PortRcvData", bytes / 4),
        ("PortXmitPkts", 15),
        ("PortRcvPkts", 15),
        ("PortUnicastXmitPkts", 15),
        ("PortUnicastRcvPkts", 15),
        ("PortMulticastXmitPkts", 0),
        ("PortMulticastRcvPkts", 0),
        ("RcvErrorPkts", 0),
    ] {
        assert_eq!(value(&out, name), Some(want), "{name}\n{out}");
    }
}

#[test]
fn a_mistyped_counters_flag_is_a_message() {
    for (args, want) in [
        (&["-c", "--traffic", "0"][..], "not in 1..=1000000"),
        (&["-c", "--traffic", "lots"], "invalid value"),
        (&["--traffic", "5"], "--counters"),
        (&["--counter"][..], "unexpected argument"),
        (&["--countrs"], "--counters"),
        (&["--counters=yes"], "unexpected value"),
    ] {
        let (code, _, err) = info(args);
        assert_ne!(code, 0, "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

//! `uhca-info` port counters from the outside: `-c/--counters` (and `-v`) print the
//! `perfquery -x` names with their units in text and an object per port in JSON; a
//! mistyped flag is a message and a failing exit status, never a panic.

use std::process::Command;

fn info(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_uhca-info"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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

#[test]
fn a_mistyped_counters_flag_is_a_message() {
    for (args, want) in [
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

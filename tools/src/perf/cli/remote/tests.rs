//! Unit tests of the client/server runs' settings.

use clap::Parser;

use super::*;

#[test]
fn the_server_runs_with_the_clients_settings() {
    let parse = |v: &[&str]| Args::try_parse_from(v).unwrap();
    let client = parse(&[
        "uhca-perf",
        "send_bw",
        "-s",
        "4096",
        "-n",
        "77",
        "-q",
        "2",
        "-t",
        "16",
        "-m",
        "4096",
        "-I",
        "64",
        "-D",
        "3",
        "-d",
        "0000:3b:00.0",
        "server",
    ]);
    let server = parse(&["uhca-perf", "send_bw", "-d", "0000:3b:00.0"]);
    assert_eq!(
        (client.role(), server.role()),
        (Some(Role::Client), Some(Role::Server))
    );
    let (sizes, s) = validate(&client).unwrap();
    let h = hello_of(&client, &sizes, &s);
    assert_eq!(
        (h.size, h.iters, h.qps, h.mtu, h.duration),
        (4096, 77, 2, 4096, 3)
    );
    let adopted = adopt(&server, &h);
    let (sizes2, s2) = validate(&adopted).unwrap();
    assert_eq!(sizes2, sizes);
    assert_eq!(hello_of(&adopted, &sizes2, &s2), h);
    // -a travels as such.
    let all = parse(&["uhca-perf", "write_bw", "-a", "--vfio-user", "s", "h"]);
    let (sizes, s) = validate(&all).unwrap();
    let h = hello_of(&all, &sizes, &s);
    let (sizes2, _) = validate(&adopt(&server, &h)).unwrap();
    assert_eq!((h.all, sizes2.len(), sizes2), (true, 23, sizes));
    // Both ends in this process: no flag of the client/server mode.
    assert_eq!(parse(&["uhca-perf", "write_bw"]).role(), None);
    assert_eq!(parse(&["uhca-perf", "write_bw", "--pair"]).role(), None);
}

//! Unit tests of the network port.

use super::*;

#[test]
fn faults_parse() {
    let f = parse_faults("seed=9,drop=100,dup=7,reorder=5,corrupt=3,mangle=2").unwrap();
    assert_eq!(
        f,
        FaultConfig {
            seed: 9,
            drop_one_in: 100,
            duplicate_one_in: 7,
            reorder_one_in: 5,
            corrupt_one_in: 3,
            mangle_one_in: 2,
        }
    );
    assert!(parse_faults("drop").is_err());
    assert!(parse_faults("drop=x").is_err());
    assert!(parse_faults("lose=3").is_err());
    assert!(parse_faults("drop=99999999999").is_err());
}

#[test]
fn a_port_on_loopback_gets_its_address_as_its_gid() {
    let flags = NetFlags {
        net: Some("127.0.0.1".into()),
        net_port: 0,
        net_peer_port: ROCE_PORT,
        ..NetFlags::default()
    };
    let (m, link) = open_port(&flags, ModelConfig::default()).unwrap();
    assert_eq!(
        m.port_addrs,
        vec!["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(m.mac[0], 0x06);
    assert_eq!(link.local_addrs().len(), 1);
    let bad = NetFlags {
        net: Some("192.0.2.1".into()),
        ..flags
    };
    assert!(matches!(
        open_port(&bad, ModelConfig::default()),
        Err(NetPortError::Resolve { .. })
    ));
}

/// The floor's ping-pong (`udp-rc`) gets every pair answered, measures each counted round
/// trip, and stops its echo at the end (the echo's thread returns).
#[test]
fn the_gso_pair_ping_pong_is_answered_and_stops_its_echo() {
    use super::udp_ref::rc;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let at = sock.local_addr().unwrap();
    let echo = std::thread::spawn(move || rc::echo(&sock));
    let r = rc::pingpong(at, 20).unwrap();
    assert_eq!(r.len(), 20);
    assert!(r.iter().all(|&ns| ns > 0.0));
    assert!(r.windows(2).all(|w| w[0] <= w[1]), "sorted");
    echo.join().unwrap().unwrap();
}

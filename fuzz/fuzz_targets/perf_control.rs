//! uhca-perf's control protocol (`uhca_tools::perf::control`): any bytes from the peer,
//! through `Control` on a real TCP connection (lines, limits, UTF-8, parsing), and every
//! line through `Msg::parse`, whose accepted messages must survive `emit` then `parse`
//! unchanged.
//!
//! Input: the bytes the peer sends (then it closes its end).
#![no_main]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use uhca_tools::perf::control::{Control, ControlError, Msg};

static LISTENER: OnceLock<TcpListener> = OnceLock::new();

fn round_trip(line: &str) {
    if let Ok(m) = Msg::parse(line) {
        let again = Msg::parse(&m.emit()).expect("an emitted message parses");
        assert_eq!(again, m, "emit/parse changed the message of {line:?}");
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for line in String::from_utf8_lossy(data).split('\n') {
        round_trip(line);
    }
    let l = LISTENER.get_or_init(|| TcpListener::bind("127.0.0.1:0").expect("bind"));
    let mut peer = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (ours, _) = l.accept().expect("accept");
    // The whole input fits the socket buffers (libFuzzer's -max_len keeps it small).
    peer.write_all(data).expect("send");
    peer.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut c = Control::new(ours).expect("control");
    let mut n = 0;
    loop {
        n += 1;
        let r = if n % 2 == 0 {
            c.try_recv("fuzz").map(|m| m.unwrap_or(Msg::Beat))
        } else {
            c.recv(Duration::from_secs(5), "fuzz")
        };
        match r {
            Ok(m) => round_trip(&m.emit()),
            Err(ControlError::Timeout(..)) => panic!("a closed peer read as a timeout"),
            Err(_) => break,
        }
        if n > 10_000 {
            panic!("no end of messages");
        }
    }
});

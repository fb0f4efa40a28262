//! A hostile or broken vfio-user client: `uhca-model --persist` (and `--gpu`) gets sessions of random
//! bytes, truncated and oversized messages, and after a proper VERSION handshake random
//! commands with random bodies. Each session may fail, but the server process must live
//! on and serve the next client; at the end a real client boots the device through it.
//! The generator is a fixed-seed xorshift: the same sessions on every run.

mod model_proc;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use model_proc::ModelProc;
use uhca::hw::rng::XorShift64 as Rng;

/// A vfio-user message: the 16-byte header (message id, command, size, flags, error) and
/// `body`; `size` overrides the size field (else header + body).
fn message(id: u16, cmd: u16, body: &[u8], size: Option<u32>) -> Vec<u8> {
    let mut m = Vec::with_capacity(16 + body.len());
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(&cmd.to_le_bytes());
    m.extend_from_slice(&size.unwrap_or(16 + body.len() as u32).to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes()); // flags: a command
    m.extend_from_slice(&0u32.to_le_bytes()); // error
    m.extend_from_slice(body);
    m
}

/// The VERSION command a client opens with (major 0, minor 1, JSON capabilities).
fn version() -> Vec<u8> {
    let mut body = vec![0, 0, 1, 0];
    body.extend_from_slice(br#"{"capabilities":{"max_msg_fds":8,"max_data_xfer_size":1048576}}"#);
    body.push(0);
    message(0, 1, &body, None)
}

/// One session's bytes.
fn session(rng: &mut Rng) -> Vec<u8> {
    match rng.below(4) {
        // Noise.
        0 => {
            let n = 1 + rng.below(300) as usize;
            rng.bytes(n)
        }
        // A VERSION with a body cut short, or with a size field that lies.
        1 => {
            let mut v = version();
            match rng.below(3) {
                0 => v.truncate(rng.below(v.len() as u64) as usize),
                1 => v[4..8].copy_from_slice(&(rng.next() as u32).to_le_bytes()),
                _ => {
                    let at = 20 + rng.below(v.len() as u64 - 20) as usize;
                    v[at] = rng.next() as u8; // the JSON garbled
                }
            }
            v
        }
        // A proper handshake, then random commands.
        _ => {
            let mut s = version();
            for id in 1..1 + rng.below(12) as u16 {
                let cmd = rng.below(18) as u16;
                let n = rng.below(96) as usize;
                let body = rng.bytes(n);
                let size = match rng.below(6) {
                    0 => Some(rng.below(16) as u32),
                    1 => Some(rng.next() as u32),
                    _ => None,
                };
                s.extend(message(id, cmd, &body, size));
            }
            s
        }
    }
}

/// Sends `n` hostile sessions to the server at `sock`; each may fail, the server must not.
fn hostile_sessions(sock: &std::path::Path, seed: u64, n: usize) {
    let mut rng = Rng::new(seed);
    for k in 0..n {
        let mut c = UnixStream::connect(sock)
            .unwrap_or_else(|e| panic!("session {k}: the server is gone: {e}"));
        c.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        // The server may close the connection on the first bad byte: a failed write is
        // its answer, not an error of the test.
        let _ = c.write_all(&session(&mut rng));
        let mut sink = [0u8; 4096];
        let _ = c.read(&mut sink);
        drop(c);
    }
}

#[test]
fn a_hostile_client_never_takes_the_server_down() {
    let model = ModelProc::spawn(&["--persist"]);
    hostile_sessions(&model.sock, 0x000B_ADC1_1E47, 150);
    // Still serving: a real client boots the device and reads it.
    assert_eq!(model.info_json()["vendor_id"], 0x15b3);
}

#[test]
fn a_hostile_client_never_takes_the_gpu_server_down() {
    let gpu = ModelProc::spawn(&["--gpu", "--gpu-bar-mib", "1", "--persist"]);
    hostile_sessions(&gpu.sock, 0x0006_B0BA_D500, 100);
    // Still serving: a real client reads its identity.
    let mut c = vfio_user::Client::new(&gpu.sock).expect("a real client after the fuzzing");
    let mut id = [0u8; 4];
    c.region_read(7, 0, &mut id).unwrap();
    assert_eq!(id, [0x36, 0x1b, 0xff, 0x00]);
}

//! `uhca-model` processes for the tools' tests (each test binary uses a part of it).

#![allow(dead_code)]

use std::net::UdpSocket;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running `uhca-model`, killed on drop.
pub struct ModelProc {
    /// The process.
    pub child: Child,
    /// Its vfio-user socket.
    pub sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl ModelProc {
    /// `uhca-model --socket TMP/model.sock ARGS`, once it listens.
    pub fn spawn(args: &[&str]) -> ModelProc {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("model.sock");
        Self::spawn_in(dir, sock, args)
    }

    /// A process on `sock`, a path that may exist already (a stale socket).
    pub fn spawn_at(sock: PathBuf, args: &[&str]) -> ModelProc {
        Self::spawn_in(tempfile::tempdir().unwrap(), sock, args)
    }

    fn spawn_in(dir: tempfile::TempDir, sock: PathBuf, args: &[&str]) -> ModelProc {
        use std::os::unix::fs::MetadataExt;
        let inode = |p: &PathBuf| {
            std::fs::symlink_metadata(p)
                .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
                .ok()
        };
        let stale = inode(&sock);
        let child = Command::new(env!("CARGO_BIN_EXE_uhca-model"))
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("uhca-model starts");
        let mut p = ModelProc {
            child,
            sock,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        // Until the socket exists and is not the stale one it replaces.
        while inode(&p.sock).is_none() || inode(&p.sock) == stale {
            assert!(
                p.child.try_wait().unwrap().is_none(),
                "uhca-model exited early"
            );
            assert!(Instant::now() < deadline, "uhca-model never listened");
            std::thread::sleep(Duration::from_millis(5));
        }
        p
    }

    /// `uhca-info --vfio-user SOCK --json`: the device facts a client reads through this
    /// server (the run must succeed).
    pub fn info_json(&self) -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_uhca-info"))
            .arg("--vfio-user")
            .arg(&self.sock)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Waits (bounded) for the process to exit by itself.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "uhca-model did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ModelProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free UDP port on localhost (bound and released: good enough for a test).
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Two model processes whose ports are joined by a UDP link on localhost (distinct MACs).
pub fn linked_pair() -> (ModelProc, ModelProc) {
    let (pa, pb) = (free_udp_port(), free_udp_port());
    let (la, lb) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    let a = ModelProc::spawn(&[
        "--name",
        "ma",
        "--mac",
        "02:00:00:00:00:0a",
        "--link-local",
        &la,
        "--link-peer",
        &lb,
    ]);
    let b = ModelProc::spawn(&[
        "--name",
        "mb",
        "--mac",
        "02:00:00:00:00:0b",
        "--link-local",
        &lb,
        "--link-peer",
        &la,
    ]);
    (a, b)
}

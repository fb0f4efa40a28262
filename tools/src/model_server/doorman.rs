//! The doorman: while one client is served, answers every other that connects with "busy"
//! instead of leaving it in the listen queue until its reply timeout.
//!
//! The server loop (ours, `vfu`, or the `vfio_user` crate's) accepts one connection per
//! session and serves it to the end; a second client's connection waits unaccepted, and its
//! VERSION goes unanswered. Once the session has touched the device (its first backend call,
//! so the loop's own `accept` has certainly returned and nobody else accepts on the socket),
//! the doorman accepts on a duplicate of the listening socket, reads the newcomer's first
//! message and answers it with an error reply carrying `EBUSY`, then closes the connection.
//! It stops, and is joined, before the next session's `accept`, so it never takes a client
//! that the server would have served.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use uhca::pci::vfio_user::proto::{FLAG_ERROR, FLAG_REPLY, HEADER_LEN, Header};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::poll::PollContext;

/// How long a newcomer has to send its first message before it is closed unanswered.
const FIRST_MESSAGE: Duration = Duration::from_secs(1);
/// The most of a newcomer's first message that is read (and dropped) before the reply.
const MAX_DISCARD: u64 = 1 << 16;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The session has not touched the device yet: the server's `accept` may be pending.
    Waiting,
    /// A client is being served: newcomers are told "busy".
    Serving,
    /// The session ended.
    Stopped,
}

struct Shared {
    phase: Mutex<Phase>,
    changed: Condvar,
    stop: EventFd,
}

/// One session's doorman thread (see the module docs).
pub(super) struct Doorman {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// The session's handle that opens the door: [`Doorman::serving`] from the backend's first
/// call.
#[derive(Clone)]
pub(super) struct Opener(Arc<Shared>);

impl Opener {
    /// The session touched the device: from now on newcomers are told "busy".
    pub(super) fn serving(&self) {
        let mut p = self.0.phase.lock().unwrap_or_else(|e| e.into_inner());
        if *p == Phase::Waiting {
            *p = Phase::Serving;
            self.0.changed.notify_all();
        }
    }
}

impl Doorman {
    /// Starts the doorman for one session on a duplicate of the server's listening socket.
    pub(super) fn start(listener: &UnixListener) -> io::Result<(Doorman, Opener)> {
        let listener = listener.try_clone()?;
        let shared = Arc::new(Shared {
            phase: Mutex::new(Phase::Waiting),
            changed: Condvar::new(),
            stop: EventFd::new(libc::EFD_NONBLOCK)?,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("uhca-model-doorman".into())
            .spawn(move || run(&s, &listener))?;
        Ok((
            Doorman {
                shared: shared.clone(),
                thread: Some(thread),
            },
            Opener(shared),
        ))
    }

    /// Ends the session's doorman and waits for it, before the next `accept`.
    pub(super) fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        {
            let mut p = self.shared.phase.lock().unwrap_or_else(|e| e.into_inner());
            *p = Phase::Stopped;
            self.shared.changed.notify_all();
        }
        let _ = self.shared.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Doorman {
    fn drop(&mut self) {
        self.halt();
    }
}

fn run(s: &Shared, listener: &UnixListener) {
    {
        let mut p = s.phase.lock().unwrap_or_else(|e| e.into_inner());
        while *p == Phase::Waiting {
            p = s.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        if *p == Phase::Stopped {
            return;
        }
    }
    const LISTENER: u8 = 0;
    const STOP: u8 = 1;
    let poll = match PollContext::<u8>::new()
        .and_then(|p| p.add(listener, LISTENER).map(|()| p))
        .and_then(|p| p.add(&s.stop, STOP).map(|()| p))
    {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "doorman: cannot watch the socket; newcomers wait");
            return;
        }
    };
    loop {
        let ready = match poll.wait() {
            Ok(ev) => ev.iter_readable().map(|e| e.token()).collect::<Vec<u8>>(),
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => {
                tracing::warn!(error = %e, "doorman: poll");
                return;
            }
        };
        if ready.contains(&STOP) {
            return;
        }
        if ready.contains(&LISTENER) {
            // Only this thread accepts while a session is served, so a pending connection
            // is there to be taken and the blocking accept returns at once.
            match listener.accept() {
                Ok((stream, _)) => refuse(stream),
                Err(e) => tracing::debug!(error = %e, "doorman: accept"),
            }
        }
    }
}

/// Answers a newcomer's first message with an `EBUSY` error reply, then closes it.
fn refuse(mut stream: UnixStream) {
    tracing::info!("a second client connected while one is served: told busy");
    let _ = stream.set_read_timeout(Some(FIRST_MESSAGE));
    let _ = stream.set_write_timeout(Some(FIRST_MESSAGE));
    let mut hb = [0u8; HEADER_LEN];
    if stream.read_exact(&mut hb).is_err() {
        return;
    }
    let h = Header::parse(&hb);
    let body = u64::from(h.size).saturating_sub(HEADER_LEN as u64);
    let _ = io::copy(
        &mut (&mut stream).take(body.min(MAX_DISCARD)),
        &mut io::sink(),
    );
    let reply = Header {
        id: h.id,
        command: h.command,
        size: HEADER_LEN as u32,
        flags: FLAG_REPLY | FLAG_ERROR,
        error: libc::EBUSY as u32,
    };
    let _ = stream.write_all(&reply.emit());
}

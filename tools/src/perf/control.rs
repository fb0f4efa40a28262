//! The out-of-band exchange of `uhca-perf` in client/server mode, over one TCP connection.
//!
//! Our own format (not perftest's): one message per line of ASCII text, at most
//! [`MAX_LINE`] bytes, `uhca-perf/1 KIND key=value ...\n`. The first word names the protocol
//! and its version; a peer that sends anything else is refused. The conversation:
//!
//! ```text
//! client                                   server
//! HELLO mode= size= all= iters= duration= qps= tx_depth= inline= mtu= bidir=
//!                                          HELLO (the same fields: what it will run)
//!                                          or ERROR why (a different mode), then it exits
//! END gid= mac= qp=QPN:PSN:ADDR:RKEY:LEN ... (one qp= per QP)
//!                                          END (the same, the server's side)
//! -- per message size --
//! START size=                             (the client has posted what it needs)
//!                                          READY size= (the server has posted its receives)
//!   ... the test; every second a BEAT from the client while it drives
//! DONE size= iters= (messages completed)
//!                                          RESULT size= iters= peak= (with bidir=1 only:
//!                                          the server's own direction, messages and
//!                                          bytes/s)
//!                                          ACK size= (the server has counted them)
//! -- at the end --
//! BYE                                      BYE
//! ```
//!
//! The mode must be the same on both ends (else both report the mismatch); the size, the
//! iterations, `-D`, the QP count, the depth, the inline size, the MTU and `-b` (`bidir`,
//! absent in a peer that predates it: 0) are the client's:
//! the server runs with what the client sent. GIDs are 32 hex digits, MACs 12, addresses hex,
//! the rest decimal. Every read has a deadline ([`Control::recv`]): a peer that goes quiet or
//! away is an error, never a hang.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The first word of every message: the protocol and its version.
pub const PROTOCOL: &str = "uhca-perf/1";

/// The longest message line accepted (64 QPs of endpoint data fit many times over).
pub const MAX_LINE: usize = 16 << 10;

/// What went wrong on the control connection.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The peer said nothing for too long.
    #[error("the peer sent nothing for {0:?} (waiting for {1})")]
    Timeout(Duration, &'static str),
    /// The peer closed the connection.
    #[error("the peer closed the connection (waiting for {0})")]
    Closed(&'static str),
    /// A line that is not a message of this protocol.
    #[error("bad message from the peer: {0}")]
    Malformed(String),
    /// A valid message that does not belong here.
    #[error("unexpected message from the peer: expected {expected}, got `{got}`")]
    Unexpected {
        /// What the conversation expected.
        expected: &'static str,
        /// The line received.
        got: String,
    },
    /// The peer refused the run (its ERROR message).
    #[error("the peer refused: {0}")]
    Refused(String),
    /// The two ends want different things.
    #[error("{0}")]
    Mismatch(String),
}

/// One end's settings as the client proposes and the server confirms them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The test (`write_bw`, ...).
    pub mode: String,
    /// Message size (ignored with `all`).
    pub size: u64,
    /// Every size from 2 to 2^23 (`-a`).
    pub all: bool,
    /// Iterations.
    pub iters: u64,
    /// Seconds per size instead of iterations (0: none).
    pub duration: u64,
    /// QPs.
    pub qps: u32,
    /// Send queue depth.
    pub tx_depth: u32,
    /// Inline bytes.
    pub inline_size: u32,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Both directions at once (`-b`): the server streams to the client too.
    pub bidir: bool,
}

/// One QP of an end, as its peer needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: u32,
    /// First send PSN (24 bits).
    pub psn: u32,
    /// Address of the buffer half the peer targets.
    pub addr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length.
    pub len: u64,
}

/// An end's address and QPs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// GID (the `-x` index's entry).
    pub gid: [u8; 16],
    /// MAC.
    pub mac: [u8; 6],
    /// QPs, in order.
    pub qps: Vec<QpInfo>,
}

/// A message of the exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Settings.
    Hello(Hello),
    /// A refusal, with the reason.
    Error(String),
    /// Address and QPs.
    End(Endpoint),
    /// The client is about to run `size`.
    Start(u64),
    /// The server is ready for `size`.
    Ready(u64),
    /// The client is alive and driving.
    Beat,
    /// The client finished `size` with `iters` messages completed.
    Done {
        /// Message size.
        size: u64,
        /// Messages completed, all QPs together.
        iters: u64,
    },
    /// The server's own direction of a bidirectional `size`: messages it completed and its
    /// peak bandwidth (bytes/s).
    Result {
        /// Message size.
        size: u64,
        /// Messages completed.
        iters: u64,
        /// Peak bandwidth, bytes/s.
        peak: u64,
    },
    /// The server has finished `size` too.
    Ack(u64),
    /// The end of the conversation.
    Bye,
}

/// `s` with its control characters (line breaks, terminal escapes) as spaces: a refusal is
/// one line, and the peer's words are printed.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    // Hex digits only (`from_str_radix` alone would take a `+`).
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (k, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * k..2 * k + 2], 16).ok()?;
    }
    Some(out)
}

impl Msg {
    /// The message as one line, without the newline.
    pub fn emit(&self) -> String {
        let body = match self {
            Msg::Hello(h) => format!(
                "HELLO mode={} size={} all={} iters={} duration={} qps={} tx_depth={} inline={} mtu={} bidir={}",
                h.mode,
                h.size,
                u8::from(h.all),
                h.iters,
                h.duration,
                h.qps,
                h.tx_depth,
                h.inline_size,
                h.mtu,
                u8::from(h.bidir)
            ),
            Msg::Error(why) => format!("ERROR {}", printable(why)),
            Msg::End(e) => {
                let mut s = format!("END gid={} mac={}", hex(&e.gid), hex(&e.mac));
                for q in &e.qps {
                    s += &format!(" qp={}:{}:{:x}:{}:{}", q.qpn, q.psn, q.addr, q.rkey, q.len);
                }
                s
            }
            Msg::Start(size) => format!("START size={size}"),
            Msg::Ready(size) => format!("READY size={size}"),
            Msg::Beat => "BEAT".into(),
            Msg::Done { size, iters } => format!("DONE size={size} iters={iters}"),
            Msg::Result { size, iters, peak } => {
                format!("RESULT size={size} iters={iters} peak={peak}")
            }
            Msg::Ack(size) => format!("ACK size={size}"),
            Msg::Bye => "BYE".into(),
        };
        format!("{PROTOCOL} {body}")
    }

    /// Parses one line (without its newline).
    pub fn parse(line: &str) -> Result<Msg, ControlError> {
        let bad = || ControlError::Malformed(line.chars().take(200).collect());
        let rest = line.strip_prefix(PROTOCOL).ok_or_else(|| {
            ControlError::Malformed(format!(
                "`{}` does not start with `{PROTOCOL}` (not a uhca-perf peer, or another version)",
                line.chars().take(80).collect::<String>()
            ))
        })?;
        let rest = rest.strip_prefix(' ').ok_or_else(bad)?;
        let (kind, args) = rest.split_once(' ').unwrap_or((rest, ""));
        if kind == "ERROR" {
            return Ok(Msg::Error(printable(args)));
        }
        let mut fields = Vec::new();
        for w in args.split(' ').filter(|w| !w.is_empty()) {
            fields.push(w.split_once('=').ok_or_else(bad)?);
        }
        let one = |k: &str| -> Result<&str, ControlError> {
            let mut it = fields.iter().filter(|(n, _)| *n == k);
            match (it.next(), it.next()) {
                (Some((_, v)), None) => Ok(v),
                _ => Err(bad()),
            }
        };
        let num = |k: &str| -> Result<u64, ControlError> { one(k)?.parse().map_err(|_| bad()) };
        let n32 =
            |k: &str| -> Result<u32, ControlError> { u32::try_from(num(k)?).map_err(|_| bad()) };
        let msg = match kind {
            "HELLO" => Msg::Hello(Hello {
                mode: one("mode")?.to_owned(),
                size: num("size")?,
                all: match num("all")? {
                    0 => false,
                    1 => true,
                    _ => return Err(bad()),
                },
                iters: num("iters")?,
                duration: num("duration")?,
                qps: n32("qps")?,
                tx_depth: n32("tx_depth")?,
                inline_size: n32("inline")?,
                mtu: n32("mtu")?,
                // Absent in a peer from before `-b`: unidirectional.
                bidir: match fields.iter().any(|(n, _)| *n == "bidir") {
                    false => false,
                    true => match num("bidir")? {
                        0 => false,
                        1 => true,
                        _ => return Err(bad()),
                    },
                },
            }),
            "END" => {
                let mut qps = Vec::new();
                for (_, v) in fields.iter().filter(|(n, _)| *n == "qp") {
                    let p: Vec<&str> = v.split(':').collect();
                    let [qpn, psn, addr, rkey, len] = p[..] else {
                        return Err(bad());
                    };
                    qps.push(QpInfo {
                        qpn: qpn.parse().map_err(|_| bad())?,
                        psn: psn.parse().map_err(|_| bad())?,
                        addr: u64::from_str_radix(addr, 16).map_err(|_| bad())?,
                        rkey: rkey.parse().map_err(|_| bad())?,
                        len: len.parse().map_err(|_| bad())?,
                    });
                }
                Msg::End(Endpoint {
                    gid: unhex(one("gid")?).ok_or_else(bad)?,
                    mac: unhex(one("mac")?).ok_or_else(bad)?,
                    qps,
                })
            }
            "START" => Msg::Start(num("size")?),
            "READY" => Msg::Ready(num("size")?),
            "BEAT" => Msg::Beat,
            "DONE" => Msg::Done {
                size: num("size")?,
                iters: num("iters")?,
            },
            "RESULT" => Msg::Result {
                size: num("size")?,
                iters: num("iters")?,
                peak: num("peak")?,
            },
            "ACK" => Msg::Ack(num("size")?),
            "BYE" => Msg::Bye,
            _ => return Err(bad()),
        };
        Ok(msg)
    }
}

/// The control connection: whole-line messages in both directions, every read bounded.
pub struct Control {
    stream: TcpStream,
    /// Bytes received past the last whole line.
    pending: Vec<u8>,
}

impl Control {
    /// The connection itself (to watch it for the peer hanging up, `PeerWatch`).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> Result<Control, ControlError> {
        stream
            .set_nodelay(true)
            .map_err(|source| ControlError::Io {
                what: "TCP_NODELAY".into(),
                source,
            })?;
        Ok(Control {
            stream,
            pending: Vec::new(),
        })
    }

    /// Sends `m`.
    pub fn send(&mut self, m: &Msg) -> Result<(), ControlError> {
        let mut line = m.emit();
        line.push('\n');
        self.stream
            .write_all(line.as_bytes())
            .map_err(|source| ControlError::Io {
                what: "sending to the peer".into(),
                source,
            })
    }

    /// The next message that is not a [`Msg::Beat`], waiting at most `timeout` for each
    /// line; `what` names what is awaited in errors. An ERROR from the peer is returned as
    /// [`ControlError::Refused`].
    pub fn recv(&mut self, timeout: Duration, what: &'static str) -> Result<Msg, ControlError> {
        loop {
            match self.line(Some(timeout), what)? {
                Some(l) => match Msg::parse(&l)? {
                    Msg::Beat => {}
                    Msg::Error(why) => return Err(ControlError::Refused(why)),
                    m => return Ok(m),
                },
                None => return Err(ControlError::Timeout(timeout, what)),
            }
        }
    }

    /// A message that has already arrived, if any (never waits); beats are returned.
    pub fn try_recv(&mut self, what: &'static str) -> Result<Option<Msg>, ControlError> {
        match self.line(None, what)? {
            Some(l) => match Msg::parse(&l)? {
                Msg::Error(why) => Err(ControlError::Refused(why)),
                m => Ok(Some(m)),
            },
            None => Ok(None),
        }
    }

    /// One line: waiting up to `timeout`, or not at all (`None`). `Ok(None)`: nothing yet.
    fn line(
        &mut self,
        timeout: Option<Duration>,
        what: &'static str,
    ) -> Result<Option<String>, ControlError> {
        let io = |source| ControlError::Io {
            what: format!("receiving from the peer (waiting for {what})"),
            source,
        };
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(n) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=n).collect();
                let line = String::from_utf8(line[..n].to_vec())
                    .map_err(|_| ControlError::Malformed("a line that is not UTF-8".into()))?;
                return Ok(Some(line.trim_end_matches('\r').to_owned()));
            }
            // perftest's exchange opens with its version NUL-padded to 16 bytes and has no
            // newline: without this, a line would be awaited until the deadline.
            if self.pending.contains(&0) {
                return Err(ControlError::Malformed(
                    "binary data with NULs, not a line: the peer speaks perftest's exchange \
                     (give both ends the same --oob)"
                        .into(),
                ));
            }
            if self.pending.len() > MAX_LINE {
                return Err(ControlError::Malformed(format!(
                    "a line longer than {MAX_LINE} bytes"
                )));
            }
            match deadline {
                None => self.stream.set_nonblocking(true).map_err(io)?,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    self.stream.set_nonblocking(false).map_err(io)?;
                    self.stream.set_read_timeout(Some(left)).map_err(io)?;
                }
            }
            let mut buf = [0u8; 4096];
            let r = self.stream.read(&mut buf);
            if deadline.is_none() {
                self.stream.set_nonblocking(false).map_err(io)?;
            }
            match r {
                Ok(0) => return Err(ControlError::Closed(what)),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if deadline.is_none() {
                        return Ok(None);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests;

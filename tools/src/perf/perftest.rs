//! perftest's own out-of-band exchange, byte by byte (`docs/spec/perftest-oob.md`): what
//! `ib_write_bw` and its siblings send each other over TCP before, between and after the
//! traffic, so that a perftest peer and `uhca-perf` can be the two ends of one test.
//!
//! Every message is fixed-size and symmetric: the client writes its copy first, then reads
//! the server's; the server reads, then writes. perftest reads each message with a single
//! `read()` and fails on a short one, so each message here goes out in one write. The
//! messages: the version (16 bytes of NUL-padded text), the cycle buffer and the cache-line
//! size (big-endian `int32`s, both ends use the larger), the MTU (the decimal digit of the
//! `ibv_mtu` enum and a NUL; both ends use the smaller), the keys of a QP ([`Keys`], 108
//! bytes of text), the bandwidth report ([`Report`], five 8-byte big-endian fields) and
//! `done\0`, which nobody reads.
//!
//! With `-R` perftest sends the same messages, each as one SEND on an RC QP of its own that
//! rdma_cm connected, and the keys as a binary `struct pingpong_dest` ([`KEYS_BIN_LEN`]
//! bytes, `docs/spec/rdma-cm-wire.md` §6): [`Oob::over`] takes such a message link
//! ([`MsgLink`], `super::rdma_cm`) instead of a TCP connection.
//!
//! Unlike perftest, every read here is bounded: by [`REPLY`] between steps, and across a
//! phase of traffic (where the peer answers only when its traffic is over) by
//! [`QUIET`] without any sign of life (a byte on the connection or a packet through the
//! port). A closed connection or a message that is not perftest's is an error at once.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use uhca::resource::Mtu;

use super::role::Role;

/// The version this end announces: perftest 4.5-0.17 (Debian bookworm's `perftest`).
pub const VERSION: &str = "6.06";

/// The oldest peer version perftest accepts, and so do we
/// (`check_version_compatibility`).
pub const MIN_VERSION: f64 = 5.70;

/// Bytes of the version message (`MAX_VERSION`).
pub const VERSION_LEN: usize = 16;

/// Bytes of a keys message with a GID (`KEY_MSG_SIZE_GID`): 107 characters and a NUL.
pub const KEYS_LEN: usize = 108;

/// Bytes of a keys message over rdma_cm (`-R`): `struct pingpong_dest` with its fields
/// big-endian (`rdma_write_keys`).
pub const KEYS_BIN_LEN: usize = 56;

/// The closing message (`ctx_close_connection`).
pub const DONE: &[u8; 5] = b"done\0";

/// perftest's cycle buffer: the page size (`sysconf(_SC_PAGESIZE)`).
pub const CYCLE_BUFFER: u32 = 4096;

/// perftest's cache-line size (`DEF_CACHE_LINE_SIZE`, when sysfs does not say).
pub const CACHE_LINE: u32 = 64;

/// How long a step of the exchange may wait for the peer's copy.
pub const REPLY: Duration = super::role::REPLY;

/// How long a wait across traffic may see no sign of life from the peer.
pub const QUIET: Duration = super::role::QUIET;

/// The slice of a wait across traffic between two looks for signs of life.
const SLICE: Duration = Duration::from_millis(500);

/// What went wrong in the exchange with a perftest peer.
#[derive(Debug, thiserror::Error)]
pub enum OobError {
    /// A socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The peer sent nothing (and, across traffic, showed no sign of life) for too long.
    #[error("the perftest peer sent nothing for {after:?} (waiting for {what})")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        after: Duration,
    },
    /// The peer closed the connection.
    #[error(
        "the perftest peer closed the connection (waiting for {0}): it failed, or it runs \
         another test or other flags (-a, -b, -D, -q, -n must be the same on both ends)"
    )]
    Closed(&'static str),
    /// The peer's version is one perftest itself refuses.
    #[error(
        "the peer is perftest version {0}: not compatible (perftest needs {MIN_VERSION:.2} or later)"
    )]
    Version(String),
    /// Bytes that are not the message this step of perftest's exchange expects.
    #[error("the peer sent {got} where perftest sends {what}{hint}")]
    Malformed {
        /// The message expected.
        what: &'static str,
        /// What came, quoted.
        got: String,
        /// Why that may be.
        hint: &'static str,
    },
    /// The peer's settings or test differ from this end's.
    #[error("{0}")]
    Mismatch(String),
}

/// Bytes shown in errors, as text where printable.
fn quote(b: &[u8]) -> String {
    let t: String = b
        .iter()
        .take(48)
        .map(|&c| match c {
            0x20..=0x7e => (c as char).to_string(),
            _ => format!("\\x{c:02x}"),
        })
        .collect();
    format!("`{t}`")
}

/// The keys of one QP as perftest sends them (`ethernet_write_keys`, `KEY_PRINT_FMT_GID`):
/// `%04x:%04x:%06x:%06x:%08x:%016llx:` + 16 × `%02x:` + `%08x:` and a NUL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Keys {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding READs/atomics this end takes as responder (1 in WRITE and SEND tests).
    pub out_reads: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN this end sends (24 bits).
    pub psn: u32,
    /// R_Key of the buffer the peer targets.
    pub rkey: u32,
    /// Its address.
    pub vaddr: u64,
    /// This end's GID.
    pub gid: [u8; 16],
    /// SRQ number (0 without XRC/DC).
    pub srqn: u32,
}

impl Keys {
    /// The 56 bytes of `struct pingpong_dest` perftest sends over rdma_cm (`-R`,
    /// `rdma_write_keys`): lid, out_reads, qpn, psn, rkey as big-endian u32s, 4 bytes of
    /// padding (perftest leaves them uninitialised; zeros here), vaddr (u64), the GID, srqn
    /// and the GID index (u32s).
    pub fn emit_bin(&self, gid_index: u32) -> [u8; KEYS_BIN_LEN] {
        let mut b = [0u8; KEYS_BIN_LEN];
        let words = [
            u32::from(self.lid),
            self.out_reads,
            self.qpn,
            self.psn,
            self.rkey,
        ];
        for (k, w) in words.iter().enumerate() {
            b[4 * k..4 * k + 4].copy_from_slice(&w.to_be_bytes());
        }
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&gid_index.to_be_bytes());
        b
    }

    /// Parses the binary keys of `-R` (what `rdma_read_keys` takes: all but the padding
    /// and the GID index).
    pub fn parse_bin(b: &[u8]) -> Result<Keys, OobError> {
        if b.len() != KEYS_BIN_LEN {
            return Err(OobError::Malformed {
                what: "the keys of a QP (56 bytes of struct pingpong_dest)",
                got: quote(b),
                hint: "",
            });
        }
        let w = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        Ok(Keys {
            lid: w(0) as u16,
            out_reads: w(4),
            qpn: w(8) & 0xff_ffff,
            psn: w(12) & 0xff_ffff,
            rkey: w(16),
            vaddr: u64::from_be_bytes(v),
            gid,
            srqn: w(48),
        })
    }

    /// The 108 bytes on the wire.
    pub fn emit(&self) -> [u8; KEYS_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads & 0xffff,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            s += &format!("{b:02x}:");
        }
        s += &format!("{:08x}:", self.srqn);
        let mut out = [0u8; KEYS_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses a keys message: 23 colon-terminated hex fields of perftest's widths, then
    /// NULs.
    pub fn parse(b: &[u8]) -> Result<Keys, OobError> {
        let bad = |hint| OobError::Malformed {
            what: "the keys of a QP (`0000:0001:000011:...`)",
            got: quote(b),
            hint,
        };
        let text_len = b.iter().position(|&c| c == 0).ok_or_else(|| bad(""))?;
        if b.len() != KEYS_LEN || b[text_len..].iter().any(|&c| c != 0) {
            return Err(bad(""));
        }
        let text = std::str::from_utf8(&b[..text_len]).map_err(|_| bad(""))?;
        let fields: Vec<&str> = text.split(':').collect();
        // 23 fields, each ended by ':' (so the split leaves an empty last piece).
        if fields.len() != 24 || !fields[23].is_empty() {
            return Err(bad(""));
        }
        const WIDTHS: [usize; 6] = [4, 4, 6, 6, 8, 16];
        let hex = |f: &str, width: usize| -> Result<u64, OobError> {
            if f.len() != width || !f.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad(""));
            }
            u64::from_str_radix(f, 16).map_err(|_| bad(""))
        };
        let mut v = [0u64; 6];
        for (k, w) in WIDTHS.iter().enumerate() {
            v[k] = hex(fields[k], *w)?;
        }
        let mut gid = [0u8; 16];
        for (k, g) in gid.iter_mut().enumerate() {
            *g = hex(fields[6 + k], 2)? as u8;
        }
        Ok(Keys {
            lid: v[0] as u16,
            out_reads: v[1] as u32,
            qpn: v[2] as u32,
            psn: v[3] as u32,
            rkey: v[4] as u32,
            vaddr: v[5],
            gid,
            srqn: hex(fields[22], 8)? as u32,
        })
    }
}

/// A bandwidth report as perftest exchanges it (`xchg_bw_reports`, peer version 5.33 or
/// later): the message size, the messages (all QPs), the peak and average bandwidth in
/// the sender's unit (MiB/s, or Gb/s with `--report_gbits`) and the message rate (Mpps).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Report {
    /// Message size, bytes.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Peak bandwidth.
    pub peak: f64,
    /// Average bandwidth.
    pub avg: f64,
    /// Messages per second, in millions.
    pub msg_rate: f64,
}

impl Report {
    /// The five 8-byte fields, big-endian (doubles byte-swapped as perftest's
    /// `hton_double`), in the order they are exchanged.
    pub fn fields(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.peak.to_bits().to_be_bytes(),
            self.avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// From the five fields.
    pub fn from_fields(f: &[[u8; 8]; 5]) -> Report {
        let d = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        Report {
            size: u64::from_be_bytes(f[0]),
            iters: u64::from_be_bytes(f[1]),
            peak: d(f[2]),
            avg: d(f[3]),
            msg_rate: d(f[4]),
        }
    }
}

/// What the two ends agreed before the keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Agreed {
    /// The peer's version text.
    pub peer_version: String,
    /// The larger cycle buffer: perftest's RDMA requests land within this many bytes of
    /// the address in the keys (or within the message, when it is larger).
    pub cycle_buffer: u32,
    /// The larger cache-line size.
    pub cache_line: u32,
    /// The smaller MTU.
    pub mtu: Mtu,
}

/// How long a read may wait.
pub enum Wait<'a> {
    /// Up to [`REPLY`].
    Reply,
    /// Across traffic: as long as the peer or `alive` (a look at the port's counters)
    /// shows life at least once every [`QUIET`].
    Across(&'a mut dyn FnMut() -> bool),
}

/// A message link to a perftest peer that is not TCP: perftest's rdma_cm control QP with
/// `-R` (`super::rdma_cm`). Each `send` is one message, each `recv` returns one.
pub trait MsgLink: Send {
    /// Sends `msg` as one message and waits until it is delivered.
    fn send(&mut self, msg: &[u8]) -> std::io::Result<()>;
    /// The next message, waiting up to `timeout` (`Ok(None)`: nothing came); an error
    /// once the link is gone (`ErrorKind::ConnectionReset` when the peer disconnected).
    fn recv(&mut self, timeout: Duration) -> std::io::Result<Option<Vec<u8>>>;
}

/// What an [`Oob`] runs on.
enum Link {
    /// perftest's TCP connection.
    Tcp(TcpStream),
    /// perftest's rdma_cm control QP (`-R`), with the GID index the keys name.
    Msg(Box<dyn MsgLink>, u32),
}

/// The connection to a perftest peer (or a `uhca-perf` speaking perftest): TCP, or with
/// `-R` an RC QP of its own.
pub struct Oob {
    link: Link,
    role: Role,
    /// Bytes received and not yet taken.
    pending: Vec<u8>,
}

impl Oob {
    /// The TCP connection (to watch it for the peer hanging up, `perf::PeerWatch`); `None`
    /// over rdma_cm.
    pub fn stream(&self) -> Option<&TcpStream> {
        match &self.link {
            Link::Tcp(s) => Some(s),
            Link::Msg(..) => None,
        }
    }

    /// perftest's exchange over a message link (`-R`); `gid_index` goes into the keys.
    pub fn over(link: Box<dyn MsgLink>, role: Role, gid_index: u32) -> Oob {
        Oob {
            link: Link::Msg(link, gid_index),
            role,
            pending: Vec::new(),
        }
    }

    /// Wraps a connected stream; `role` decides who writes first.
    pub fn new(stream: TcpStream, role: Role) -> Result<Oob, OobError> {
        stream.set_nodelay(true).map_err(|source| OobError::Io {
            what: "TCP_NODELAY".into(),
            source,
        })?;
        Ok(Oob {
            link: Link::Tcp(stream),
            role,
            pending: Vec::new(),
        })
    }

    /// Which end this is.
    pub fn role(&self) -> Role {
        self.role
    }

    fn write(&mut self, msg: &[u8], what: &'static str) -> Result<(), OobError> {
        let r = match &mut self.link {
            Link::Tcp(s) => s.write_all(msg),
            Link::Msg(l, _) => l.send(msg),
        };
        r.map_err(|source| match source.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                OobError::Closed(what)
            }
            _ => OobError::Io {
                what: format!("sending {what} to the peer"),
                source,
            },
        })
    }

    fn io(what: &'static str) -> impl Fn(std::io::Error) -> OobError {
        move |source| OobError::Io {
            what: format!("receiving from the peer (waiting for {what})"),
            source,
        }
    }

    /// `n` bytes from the peer, waiting as `wait` allows.
    fn read(
        &mut self,
        n: usize,
        what: &'static str,
        mut wait: Wait<'_>,
    ) -> Result<Vec<u8>, OobError> {
        let io = Self::io(what);
        let limit = match wait {
            Wait::Reply => REPLY,
            Wait::Across(_) => QUIET,
        };
        let mut heard = Instant::now();
        loop {
            if self.pending.len() >= n {
                return Ok(self.pending.drain(..n).collect());
            }
            let left = limit.saturating_sub(heard.elapsed());
            if left.is_zero() {
                return Err(OobError::Timeout { what, after: limit });
            }
            let slice = match wait {
                Wait::Reply => left,
                Wait::Across(_) => left.min(SLICE),
            };
            match self.link_read(Some(slice)) {
                Ok(0) => return Err(OobError::Closed(what)),
                Ok(_) => heard = Instant::now(),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if let Wait::Across(alive) = &mut wait
                        && alive()
                    {
                        heard = Instant::now();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // A peer that closed with our message unread resets the connection.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(OobError::Closed(what));
                }
                Err(e) => return Err(io(e)),
            }
        }
    }

    /// Appends what the link has to `pending`, waiting up to `wait` (`None`: not at all);
    /// returns the bytes taken. `Ok(0)` is a closed connection; nothing yet is
    /// `WouldBlock` (or `TimedOut`).
    fn link_read(&mut self, wait: Option<Duration>) -> std::io::Result<usize> {
        let mut buf = [0u8; 512];
        let k = match &mut self.link {
            Link::Tcp(s) => match wait {
                Some(t) => {
                    s.set_read_timeout(Some(t))?;
                    s.read(&mut buf)?
                }
                None => {
                    s.set_nonblocking(true)?;
                    let r = s.read(&mut buf);
                    s.set_nonblocking(false)?;
                    r?
                }
            },
            Link::Msg(l, _) => match l.recv(wait.unwrap_or(Duration::ZERO))? {
                Some(m) if !m.is_empty() => {
                    self.pending.extend_from_slice(&m);
                    return Ok(m.len());
                }
                // perftest sends no empty message: nothing to take.
                _ => return Err(std::io::ErrorKind::WouldBlock.into()),
            },
        };
        self.pending.extend_from_slice(&buf[..k]);
        Ok(k)
    }

    /// Takes what has arrived without waiting; true once `n` bytes are there (for
    /// `read` to take). A closed connection is an error.
    pub fn arrived(&mut self, n: usize, what: &'static str) -> Result<bool, OobError> {
        let io = Self::io(what);
        if self.pending.len() >= n {
            return Ok(true);
        }
        match self.link_read(None) {
            Ok(0) => Err(OobError::Closed(what)),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                Err(OobError::Closed(what))
            }
            Ok(_) => Ok(self.pending.len() >= n),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(io(e)),
        }
    }

    /// One symmetric exchange: this end's `mine`, the peer's message of the same length.
    pub fn xchg(
        &mut self,
        mine: &[u8],
        what: &'static str,
        wait: Wait<'_>,
    ) -> Result<Vec<u8>, OobError> {
        match self.role {
            Role::Client => {
                self.write(mine, what)?;
                self.read(mine.len(), what, wait)
            }
            Role::Server => {
                let theirs = self.read(mine.len(), what, wait)?;
                self.write(mine, what)?;
                Ok(theirs)
            }
        }
    }

    /// The opening: versions, cycle buffers, cache lines and MTUs; this end offers `mtu`.
    pub fn open(&mut self, mtu: Mtu) -> Result<Agreed, OobError> {
        let mut v = [0u8; VERSION_LEN];
        v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let theirs = self.xchg(&v, "the version", Wait::Reply)?;
        let peer_version = parse_version(&theirs)?;
        let cycle = self.xchg(
            &CYCLE_BUFFER.to_be_bytes(),
            "the cycle buffer size",
            Wait::Reply,
        )?;
        let cache = self.xchg(
            &CACHE_LINE.to_be_bytes(),
            "the cache line size",
            Wait::Reply,
        )?;
        let int = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap_or_default());
        let (cycle, cache) = (int(&cycle), int(&cache));
        // perftest allocates with these as alignments: powers of two, within reason.
        for (what, v, max) in [
            ("cycle buffer", cycle, 1 << 30),
            ("cache line", cache, 1 << 16),
        ] {
            if !v.is_power_of_two() || v > max {
                return Err(OobError::Mismatch(format!(
                    "the perftest peer's {what} size of {v} bytes is not a power of two up to {max}"
                )));
            }
        }
        let m = [b'0' + mtu as u8, 0];
        let theirs = self.xchg(&m, "the MTU", Wait::Reply)?;
        let peer_mtu = match theirs[..] {
            [d @ b'1'..=b'5', 0] => mtu_of(d - b'0'),
            _ => {
                return Err(OobError::Malformed {
                    what: "the MTU (`3\\0` for 1024 ... `5\\0` for 4096)",
                    got: quote(&theirs),
                    hint: "",
                });
            }
        };
        Ok(Agreed {
            peer_version,
            cycle_buffer: cycle.max(CYCLE_BUFFER),
            cache_line: cache.max(CACHE_LINE),
            mtu: if (peer_mtu as u8) < (mtu as u8) {
                peer_mtu
            } else {
                mtu
            },
        })
    }

    /// One keys exchange.
    pub fn keys(
        &mut self,
        mine: &Keys,
        what: &'static str,
        wait: Wait<'_>,
    ) -> Result<Keys, OobError> {
        if let Link::Msg(_, gid_index) = self.link {
            let b = self.xchg(&mine.emit_bin(gid_index), what, wait)?;
            return Keys::parse_bin(&b);
        }
        let b = self.xchg(&mine.emit(), what, wait)?;
        Keys::parse(&b).map_err(|e| match e {
            OobError::Malformed { what, got, .. } if looks_like_report(&b) => OobError::Malformed {
                what,
                got,
                hint: ": binary numbers, as in a bandwidth report (the peer runs another test, \
                       or other -a/-b/-D flags)",
            },
            e => e,
        })
    }

    /// The report exchange: this end's `mine`, the peer's; the first field waits as
    /// `wait` allows (the peer may still be busy with traffic), the others a reply's time.
    pub fn reports(&mut self, mine: &Report, wait: Wait<'_>) -> Result<Report, OobError> {
        let mut theirs = [[0u8; 8]; 5];
        let mut wait = Some(wait);
        for (t, m) in theirs.iter_mut().zip(mine.fields()) {
            let w = wait.take().unwrap_or(Wait::Reply);
            let b = self.xchg(&m, "the bandwidth report", w)?;
            if b.iter().all(|c| c.is_ascii_hexdigit() || *c == b':') {
                return Err(OobError::Malformed {
                    what: "a bandwidth report",
                    got: quote(&b),
                    hint: ": keys text (the peer runs another test, e.g. send_bw or a latency \
                           test against a WRITE, READ or atomic bandwidth test)",
                });
            }
            t.copy_from_slice(&b);
        }
        Ok(Report::from_fields(&theirs))
    }

    /// The closing `done\0` (nobody reads it; best effort, the peer may be gone). Over
    /// rdma_cm perftest sends none (`ctx_close_connection`).
    pub fn done(&mut self) {
        if let Link::Tcp(s) = &mut self.link {
            let _ = s.write_all(DONE);
        }
    }

    /// Whether the connection shows the peer gone (closed, or failing).
    pub fn gone(&mut self) -> Option<OobError> {
        self.arrived(usize::MAX, "the run to end").err()
    }
}

/// The `ibv_mtu` enum value `v` (1..=5).
fn mtu_of(v: u8) -> Mtu {
    match v {
        1 => Mtu::M256,
        2 => Mtu::M512,
        3 => Mtu::M1024,
        4 => Mtu::M2048,
        _ => Mtu::M4096,
    }
}

/// The version text of a version message (NUL-padded ASCII, a decimal number as `atof`
/// reads it), checked against [`MIN_VERSION`].
pub fn parse_version(b: &[u8]) -> Result<String, OobError> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let text = std::str::from_utf8(&b[..end]).unwrap_or("");
    let num: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let hint = if b.starts_with(b"uhca-perf/") {
        ": this is uhca-perf's own protocol (give both ends the same --oob)"
    } else {
        ": not a perftest peer?"
    };
    let v: f64 = num.parse().map_err(|_| OobError::Malformed {
        what: "its version (`6.06\\0...`)",
        got: quote(b),
        hint,
    })?;
    if v < MIN_VERSION {
        return Err(OobError::Version(text.to_owned()));
    }
    Ok(text.to_owned())
}

/// Whether 108 bytes look like the fields of a bandwidth report rather than text.
fn looks_like_report(b: &[u8]) -> bool {
    b.iter().take(8).any(|c| !c.is_ascii_graphic())
}

#[cfg(test)]
mod tests;

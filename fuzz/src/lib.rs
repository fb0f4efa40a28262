//! Harnesses of uhca's coverage-guided fuzz targets (`fuzz_targets/`, run with cargo-fuzz).
//!
//! Every target reads a structured input: a sequence of records decoded by [`Reader`]
//! (little-endian integers, length-prefixed byte strings, zeros once the input runs out),
//! so that almost every input reaches the code under test instead of dying at the first
//! length check, and so that [`Writer`] can encode seeds from real traffic
//! (`src/bin/make_seeds.rs` writes `seeds/`). The record format of each target is
//! documented on its harness module.

pub mod anon;
pub mod cmdq;
pub mod hostile;
pub mod rc;
pub mod vfio_user;

/// Decodes a fuzz input: reads never fail; past the end they return zeros (and
/// [`Reader::done`] turns true), so every byte string is some input.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    /// Whether the input is used up.
    pub fn done(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    /// The next little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// The next `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (a, b) = self.data.split_at(n);
        self.data = b;
        a
    }

    /// A byte string prefixed by its u16 length, cut to `max`.
    pub fn blob(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u16()).min(max);
        self.bytes(n)
    }
}

/// Encodes inputs in [`Reader`]'s format (seeds).
#[derive(Debug, Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Appends a little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    /// Appends a u16-length-prefixed byte string.
    pub fn blob(&mut self, v: &[u8]) -> &mut Self {
        self.u16(v.len() as u16);
        self.bytes(v)
    }
}

/// Installs a panic hook that aborts (as libFuzzer's does) when the panic is located in a
/// file whose path contains one of `ours`, and otherwise lets it unwind: the code under
/// test catches those by design (`catch_unwind` around a third-party crate), and they must
/// not count as crashes. A panic of the harness thread aborts in any case
/// (libfuzzer-sys catches it).
pub fn abort_on_panic_in(ours: &'static [&'static str]) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let file = info.location().map(|l| l.file()).unwrap_or("");
        if ours.iter().any(|t| file.contains(t)) {
            default(info);
            std::process::abort();
        }
    }));
}

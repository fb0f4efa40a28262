//! mlx5 hardware layouts, defined once and used by both the driver (`uhca`) and the model
//! (`uhca-hw`, which re-exports this crate as `uhca_hw::layout`). Dependency-free and safe.
//!
//! Every structure the device reads or writes is big-endian and described in
//! `docs/spec/prm-subset.md` as rows of `(byte offset of the BE32 word, bit range)`.
//! The [`layout!`](crate::layout!) macro turns such a table into a typed view:
//!
//! ```
//! use uhca_layout::cqc::Cqc;
//! let mut buf = [0u8; Cqc::<()>::SIZE];
//! let mut cqc = Cqc::new_checked(&mut buf[..]).unwrap();
//! cqc.set_log_cq_size(10);
//! cqc.set_dbr_addr(0x1000);
//! assert_eq!(cqc.log_cq_size(), 10);
//! assert_eq!(buf[0x0c], 10); // log_cq_size: 0x0c `[28:24]`
//! ```
//!
//! Views are generic over [`Buf`], so the same view reads a command mailbox copy (`[u8]`)
//! or, through the driver's volatile DMA slice type, device-shared memory, without ever
//! creating a Rust reference into memory the device writes.
//!
//! Module per structure family (style.md §1): [`init_seg`], [`cmd`] (queue entry, mailbox,
//! headers, codes), [`cmds`] (command in/out messages), [`caps`], [`eqc`], [`cqc`], [`qpc`],
//! [`mkc`], [`eqe`], [`cqe`], [`wqe`], [`uar`], [`reg`] (access registers), [`roce`] (RoCEv2 frames between model ports), [`mad`] and [`cm`] (management datagrams on QP1 and the connection manager's messages).

#![deny(unsafe_code)]

pub mod caps;
pub mod cm;
pub mod cmd;
pub mod cmds;
pub mod cqc;
pub mod cqe;
pub mod eqc;
pub mod eqe;
pub mod init_seg;
pub mod mad;
pub mod mkc;
pub mod qpc;
pub mod reg;
pub mod roce;
pub mod srq;
pub mod uar;
pub mod ud;
pub mod umr;
pub mod vport;
pub mod wqe;

#[cfg(test)]
mod tests;

/// Byte storage that layouts are read from: big-endian 32-bit words at byte offsets.
///
/// Implemented for byte slices, arrays and vectors here, and by the driver for its
/// volatile DMA slices. Offsets past the end panic (a layout bug, never device input:
/// views check their length once in `new_checked`).
pub trait Buf {
    /// Length in bytes.
    fn buf_len(&self) -> usize;
    /// Reads the big-endian 32-bit word at byte `off`.
    fn read_be32(&self, off: usize) -> u32;
    /// Copies `out.len()` bytes starting at `off` into `out`.
    fn read_bytes(&self, off: usize, out: &mut [u8]);

    /// Reads the big-endian 64-bit value at byte `off` (two BE32 words, high first).
    fn read_be64(&self, off: usize) -> u64 {
        (u64::from(self.read_be32(off)) << 32) | u64::from(self.read_be32(off + 4))
    }
    /// Reads the field `[msb:lsb]` of the BE32 word at `off` (prm-subset.md §1 get rule).
    fn get_bits(&self, off: usize, msb: u32, lsb: u32) -> u32 {
        (self.read_be32(off) & mask(msb, lsb)) >> lsb
    }
}

/// Byte storage that layouts are written to.
pub trait BufMut: Buf {
    /// Writes `v` as a big-endian 32-bit word at byte `off`.
    fn write_be32(&mut self, off: usize, v: u32);
    /// Copies `src` to byte `off`.
    fn write_bytes(&mut self, off: usize, src: &[u8]);

    /// Writes `v` as a big-endian 64-bit value at byte `off`.
    fn write_be64(&mut self, off: usize, v: u64) {
        self.write_be32(off, (v >> 32) as u32);
        self.write_be32(off + 4, v as u32);
    }
    /// Sets the field `[msb:lsb]` of the BE32 word at `off` (prm-subset.md §1 set rule).
    /// Bits of `v` that do not fit the field are dropped (debug builds assert they are 0).
    fn set_bits(&mut self, off: usize, msb: u32, lsb: u32, v: u32) {
        if msb == 31 && lsb == 0 {
            // A whole word: no read-modify-write (matters for MMIO registers).
            self.write_be32(off, v);
            return;
        }
        let m = mask(msb, lsb);
        debug_assert!(
            (u64::from(v) << lsb) & !u64::from(m) == 0,
            "value {v:#x} does not fit [{msb}:{lsb}]"
        );
        let w = self.read_be32(off);
        self.write_be32(off, (w & !m) | ((v << lsb) & m));
    }
}

/// The mask of bits `[msb:lsb]` in a 32-bit word.
pub const fn mask(msb: u32, lsb: u32) -> u32 {
    let width = msb - lsb + 1;
    if width == 32 {
        u32::MAX
    } else {
        ((1u32 << width) - 1) << lsb
    }
}

// `#[inline]`: the data path builds WQEs and parses CQEs through these on stack buffers,
// from another crate (driver), where they must fold into plain loads and stores.
impl Buf for [u8] {
    #[inline]
    fn buf_len(&self) -> usize {
        self.len()
    }
    #[inline]
    fn read_be32(&self, off: usize) -> u32 {
        u32::from_be_bytes(self[off..off + 4].try_into().expect("4 bytes"))
    }
    #[inline]
    fn read_bytes(&self, off: usize, out: &mut [u8]) {
        out.copy_from_slice(&self[off..off + out.len()]);
    }
}

impl BufMut for [u8] {
    #[inline]
    fn write_be32(&mut self, off: usize, v: u32) {
        self[off..off + 4].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        self[off..off + src.len()].copy_from_slice(src);
    }
}

macro_rules! forward_buf {
    ($($t:ty),*) => {$(
        impl<T: Buf + ?Sized> Buf for $t {
            fn buf_len(&self) -> usize { (**self).buf_len() }
            fn read_be32(&self, off: usize) -> u32 { (**self).read_be32(off) }
            fn read_bytes(&self, off: usize, out: &mut [u8]) { (**self).read_bytes(off, out) }
        }
    )*};
}
forward_buf!(&T, &mut T, Box<T>);

impl<T: BufMut + ?Sized> BufMut for &mut T {
    fn write_be32(&mut self, off: usize, v: u32) {
        (**self).write_be32(off, v)
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        (**self).write_bytes(off, src)
    }
}

impl<T: BufMut + ?Sized> BufMut for Box<T> {
    fn write_be32(&mut self, off: usize, v: u32) {
        (**self).write_be32(off, v)
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        (**self).write_bytes(off, src)
    }
}

impl Buf for Vec<u8> {
    fn buf_len(&self) -> usize {
        self.len()
    }
    fn read_be32(&self, off: usize) -> u32 {
        self.as_slice().read_be32(off)
    }
    fn read_bytes(&self, off: usize, out: &mut [u8]) {
        self.as_slice().read_bytes(off, out)
    }
}

impl BufMut for Vec<u8> {
    fn write_be32(&mut self, off: usize, v: u32) {
        self.as_mut_slice().write_be32(off, v)
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        self.as_mut_slice().write_bytes(off, src)
    }
}

impl<const N: usize> Buf for [u8; N] {
    fn buf_len(&self) -> usize {
        N
    }
    fn read_be32(&self, off: usize) -> u32 {
        self.as_slice().read_be32(off)
    }
    fn read_bytes(&self, off: usize, out: &mut [u8]) {
        self.as_slice().read_bytes(off, out)
    }
}

impl<const N: usize> BufMut for [u8; N] {
    fn write_be32(&mut self, off: usize, v: u32) {
        self.as_mut_slice().write_be32(off, v)
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        self.as_mut_slice().write_bytes(off, src)
    }
}

/// How a field sits in its structure (one row of a fact-sheet table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    /// Bits `[msb:lsb]` of the BE32 word at the field's offset.
    Bits {
        /// Most significant bit (31 = MSB of the word).
        msb: u32,
        /// Least significant bit.
        lsb: u32,
    },
    /// A big-endian 64-bit value.
    U64,
    /// A byte array of the given length, copied as is.
    Bytes(usize),
    /// A nested structure of the given size (its own view is applied at the offset).
    Nested(usize),
    /// A flexible array that runs to the end of the message.
    Flex,
}

/// One field of a layout table: name (the PRM name in snake_case), byte offset, kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// PRM field name.
    pub name: &'static str,
    /// Byte offset of the word (or first byte) holding the field.
    pub offset: usize,
    /// Shape of the field.
    pub kind: FieldKind,
}

impl Field {
    /// The bytes the field occupies, as `(first byte, length)`; a bit field is reported
    /// at byte granularity (the bytes its bits touch). `Flex` occupies nothing by itself.
    pub fn byte_span(&self) -> (usize, usize) {
        match self.kind {
            FieldKind::Bits { msb, lsb } => {
                let first = self.offset + (31 - msb as usize) / 8;
                let last = self.offset + (31 - lsb as usize) / 8;
                (first, last - first + 1)
            }
            FieldKind::U64 => (self.offset, 8),
            FieldKind::Bytes(n) | FieldKind::Nested(n) => (self.offset, n),
            FieldKind::Flex => (self.offset, 0),
        }
    }

    /// The set bits of this field inside the BE32 word at `word` (for overlap checks).
    pub fn word_mask(&self, word: usize) -> u32 {
        match self.kind {
            FieldKind::Bits { msb, lsb } if word == self.offset => mask(msb, lsb),
            FieldKind::Bits { .. } | FieldKind::Flex => 0,
            FieldKind::U64 | FieldKind::Bytes(_) | FieldKind::Nested(_) => {
                let (first, len) = self.byte_span();
                let mut m = 0u32;
                for b in 0..4 {
                    let byte = word + b;
                    if byte >= first && byte < first + len {
                        m |= 0xFF << (24 - 8 * b);
                    }
                }
                m
            }
        }
    }
}

impl Field {
    /// The field called `name` in `fields`. Meant for `const` items, where a missing name
    /// is a compile-time error.
    pub const fn named(fields: &[Field], name: &str) -> Field {
        let mut i = 0;
        while i < fields.len() {
            if str_eq(fields[i].name, name) {
                return fields[i];
            }
            i += 1;
        }
        panic!("no such field in the layout table");
    }
}

/// A field as part of a big-endian 64-bit word, for hot paths that build or parse a
/// structure with whole 8-byte stores and loads instead of per-field setters (the data
/// path's WQEs and CQEs). It is derived from the layout table, so there is still one
/// definition of each field: `WordField::of(Field::named(CtrlSeg::<()>::FIELDS, "qpn"))`
/// in a `const` looks the row up at compile time, and `put`/`get` are a shift and a mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WordField {
    /// Index of the 8-byte word (counted from byte 0 of the structure) holding the field.
    pub word: usize,
    /// Shift of the field's least significant bit in the word read as a big-endian `u64`.
    pub shift: u32,
    /// The field's value mask (not shifted).
    pub mask: u64,
}

impl WordField {
    /// The word position of `f`: a bit field, or an 8-byte aligned `u64`. Anything else
    /// does not lie in one aligned word (a compile-time error in a `const`).
    pub const fn of(f: Field) -> WordField {
        match f.kind {
            FieldKind::Bits { msb, lsb } => WordField {
                word: f.offset / 8,
                // prm-subset.md §1: a BE32 word at an 8-aligned offset is the high half.
                shift: if f.offset.is_multiple_of(8) {
                    lsb + 32
                } else {
                    lsb
                },
                mask: (mask(msb, lsb) >> lsb) as u64,
            },
            FieldKind::U64 if f.offset.is_multiple_of(8) => WordField {
                word: f.offset / 8,
                shift: 0,
                mask: u64::MAX,
            },
            _ => panic!("field does not lie in one aligned 8-byte word"),
        }
    }

    /// `v` placed in the field, as part of its big-endian 8-byte word (bits of `v` that
    /// do not fit are dropped).
    #[inline(always)]
    pub const fn put(self, v: u64) -> u64 {
        (v & self.mask) << self.shift
    }

    /// The field's value in its big-endian 8-byte word `word`.
    #[inline(always)]
    pub const fn get(self, word: u64) -> u64 {
        (word >> self.shift) & self.mask
    }
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A buffer was too short for the layout applied to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LengthError {
    /// Layout name.
    pub layout: &'static str,
    /// Bytes needed.
    pub need: usize,
    /// Bytes available.
    pub len: usize,
}

impl core::fmt::Display for LengthError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "buffer of {} bytes is shorter than the {}-byte {} layout",
            self.len, self.need, self.layout
        )
    }
}

impl std::error::Error for LengthError {}

/// Declares a lossless code enum: every raw value maps to a variant, unknown ones to
/// `Unknown(raw)`, so parsing device output never fails and never loses the value
/// (style.md §7).
#[macro_export]
macro_rules! enum_with_unknown {
    (
        $(#[$meta:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this build does not name.
            Unknown($ty),
        }

        impl $name {
            /// The raw value (usable in constants and `match` patterns).
            pub const fn raw(self) -> $ty {
                match self {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(v: $ty) -> Self {
                match v {
                    $( x if x == $value => $name::$variant, )+
                    other => $name::Unknown(other),
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(v: $name) -> $ty {
                match v {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

/// Declares a typed big-endian view over a fact-sheet table (style.md §3-4).
///
/// Each row is `name, set_name: OFFSET [MSB:LSB]` (a bit field of the BE32 word at `OFFSET`, read as
/// `u32`), `name: OFFSET u64`, `name: OFFSET [u8; N]`, `name: OFFSET nested N` (a
/// sub-structure of N bytes) or `name: OFFSET flex` (a trailing array). For those two the
/// second name is an associated `const` holding the offset (`cq_context, CQ_CONTEXT: 0x10
/// nested 64`), so callers apply the nested view at `Struct::<()>::CQ_CONTEXT`. For every bit, `u64` and byte
/// field the view gets a getter `name()` and a setter `set_name()`; every field is listed in
/// `FIELDS` so tests can check offsets, round trips and overlaps generically.
#[macro_export]
macro_rules! layout {
    (
        $(#[$meta:meta])*
        pub struct $name:ident, $prm:literal, size $size:expr;
        $( $field:ident, $setter:ident : $off:literal $kind:tt $($arg:literal)? ),* $(,)?
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name<B> {
            buf: B,
        }

        impl $name<()> {
            /// Size of the structure in bytes.
            pub const SIZE: usize = $size;
            /// PRM name of the structure.
            pub const PRM_NAME: &'static str = $prm;
            /// Every field of the table, in fact-sheet order.
            pub const FIELDS: &'static [$crate::Field] = &[
                $( $crate::layout!(@field $field $off $kind $($arg)?) ),*
            ];
            $( $crate::layout!(@const $setter $off $kind $($arg)?); )*
        }

        #[allow(dead_code, non_snake_case, clippy::len_without_is_empty)]
        impl<B: $crate::Buf> $name<B> {
            /// Wraps `buf` without checking its length.
            pub const fn new_unchecked(buf: B) -> Self {
                Self { buf }
            }
            /// Wraps `buf`, checking that it holds the whole structure.
            pub fn new_checked(buf: B) -> Result<Self, $crate::LengthError> {
                let len = buf.buf_len();
                if len < $size {
                    return Err($crate::LengthError { layout: $prm, need: $size, len });
                }
                Ok(Self { buf })
            }
            /// Gives the buffer back.
            pub fn into_inner(self) -> B {
                self.buf
            }
            /// The underlying buffer.
            pub fn buf(&self) -> &B {
                &self.buf
            }
            $( $crate::layout!(@get $field $off $kind $($arg)?); )*
        }

        #[allow(dead_code, non_snake_case)]
        impl<B: $crate::BufMut> $name<B> {
            /// The underlying buffer, mutably.
            pub fn buf_mut(&mut self) -> &mut B {
                &mut self.buf
            }
            $( $crate::layout!(@set $field $setter $off $kind $($arg)?); )*
        }
    };

    (@field $f:ident $off:literal [$msb:literal : $lsb:literal]) => {
        $crate::Field { name: stringify!($f), offset: $off,
            kind: $crate::FieldKind::Bits { msb: $msb, lsb: $lsb } }
    };
    (@field $f:ident $off:literal u64) => {
        $crate::Field { name: stringify!($f), offset: $off,
            kind: $crate::FieldKind::U64 }
    };
    (@field $f:ident $off:literal [u8; $n:literal]) => {
        $crate::Field { name: stringify!($f), offset: $off,
            kind: $crate::FieldKind::Bytes($n) }
    };
    (@field $f:ident $off:literal nested $n:literal) => {
        $crate::Field { name: stringify!($f), offset: $off,
            kind: $crate::FieldKind::Nested($n) }
    };
    (@field $f:ident $off:literal flex) => {
        $crate::Field { name: stringify!($f), offset: $off,
            kind: $crate::FieldKind::Flex }
    };

    (@const $s:ident $off:literal nested $n:literal) => {
        #[doc = concat!("Byte offset of the nested structure (", stringify!($n), " bytes).")]
        pub const $s: usize = $off;
    };
    (@const $s:ident $off:literal flex) => {
        #[doc = "Byte offset of the trailing array."]
        pub const $s: usize = $off;
    };
    (@const $s:ident $off:literal $($rest:tt)*) => {};

    (@get $f:ident $off:literal [$msb:literal : $lsb:literal]) => {
        #[doc = concat!("`", stringify!($f), "`: byte ", stringify!($off), " bits `[", stringify!($msb), ":", stringify!($lsb), "]`.")]
        #[inline]
        pub fn $f(&self) -> u32 {
            $crate::Buf::get_bits(&self.buf, $off, $msb, $lsb)
        }
    };
    (@get $f:ident $off:literal u64) => {
        #[doc = concat!("`", stringify!($f), "`: big-endian u64 at byte ", stringify!($off), ".")]
        #[inline]
        pub fn $f(&self) -> u64 {
            $crate::Buf::read_be64(&self.buf, $off)
        }
    };
    (@get $f:ident $off:literal [u8; $n:literal]) => {
        #[doc = concat!("`", stringify!($f), "`: ", stringify!($n), " bytes at byte ", stringify!($off), ".")]
        #[inline]
        pub fn $f(&self) -> [u8; $n] {
            let mut out = [0u8; $n];
            $crate::Buf::read_bytes(&self.buf, $off, &mut out);
            out
        }
    };
    (@get $f:ident $off:literal nested $n:literal) => {};
    (@get $f:ident $off:literal flex) => {};

    (@set $f:ident $s:ident $off:literal [$msb:literal : $lsb:literal]) => {
        #[doc = concat!("Sets `", stringify!($f), "` (byte ", stringify!($off), " bits `[", stringify!($msb), ":", stringify!($lsb), "]`).")]
        #[inline]
        pub fn $s(&mut self, v: u32) {
            $crate::BufMut::set_bits(&mut self.buf, $off, $msb, $lsb, v)
        }
    };
    (@set $f:ident $s:ident $off:literal u64) => {
        #[doc = concat!("Sets `", stringify!($f), "` (big-endian u64 at byte ", stringify!($off), ").")]
        #[inline]
        pub fn $s(&mut self, v: u64) {
            $crate::BufMut::write_be64(&mut self.buf, $off, v)
        }
    };
    (@set $f:ident $s:ident $off:literal [u8; $n:literal]) => {
        #[doc = concat!("Sets `", stringify!($f), "` (", stringify!($n), " bytes at byte ", stringify!($off), ").")]
        #[inline]
        pub fn $s(&mut self, v: &[u8; $n]) {
            $crate::BufMut::write_bytes(&mut self.buf, $off, v)
        }
    };
    (@set $f:ident $s:ident $off:literal nested $n:literal) => {};
    (@set $f:ident $s:ident $off:literal flex) => {};
}

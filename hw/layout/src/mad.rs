//! Management datagrams (MADs): the 256-byte messages of QP1 (the GSI), and their common
//! header (IBA Vol. 1 §13.4.2-13.4.3; docs/spec/rdma-cm.md §1).
//!
//! Every MAD starts with the 24-byte common header below; the class-specific data
//! (for the communication manager: [`super::cm`]) follows it. [`MadHeader`] is the `Repr`:
//! [`MadHeader::parse`] checks what every class needs (length, base version) and
//! [`MadHeader::emit`] writes it.

use crate::layout;
use crate::{Buf, BufMut};

/// Bytes of a MAD on a UD QP (IBA Vol. 1 §13.4.1: "MADs are 256 bytes").
pub const MAD_SIZE: usize = 256;
/// Bytes of the common MAD header (IBA Vol. 1 §13.4.2, figure 145).
pub const MAD_HDR_SIZE: usize = 24;
/// The only base version (IBA Vol. 1 §13.4.2 table 145 `BaseVersion`).
pub const BASE_VERSION: u8 = 1;
/// The Q_Key of QP1 (IBA Vol. 1 §13.5.1: GSI packets carry Q_Key 0x80010000): a GSI QP
/// receives only datagrams with this Q_Key, and a MAD is sent with it.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The QPN the GSI QP of a port answers to on the wire (IBA Vol. 1 §10.2.3: QP1).
pub const GSI_QPN: u32 = 1;

layout! {
    /// The common MAD header (IBA Vol. 1 §13.4.2, table 145).
    pub struct MadHdr, "mad_hdr", size 24;
    base_version, set_base_version: 0x00 [31:24],
    mgmt_class, set_mgmt_class: 0x00 [23:16],
    class_version, set_class_version: 0x00 [15:8],
    r, set_r: 0x00 [7:7],
    method, set_method: 0x00 [6:0],
    status, set_status: 0x04 [31:16],
    class_specific, set_class_specific: 0x04 [15:0],
    transaction_id, set_transaction_id: 0x08 u64,
    attribute_id, set_attribute_id: 0x10 [31:16],
    attribute_modifier, set_attribute_modifier: 0x14 [31:0],
}

crate::enum_with_unknown! {
    /// Management classes (IBA Vol. 1 §13.4.4 table 146, those uhca meets on QP1).
    pub enum MgmtClass(u8) {
        /// Subnet administration.
        SubnAdm = 0x03,
        /// Performance management.
        Perf = 0x04,
        /// Baseboard management.
        BoardMgmt = 0x05,
        /// Device management.
        DevMgmt = 0x06,
        /// Communication management (IBA Vol. 1 chapter 12).
        Cm = 0x07,
        /// SNMP tunnelling.
        Snmp = 0x08,
    }
}

crate::enum_with_unknown! {
    /// Methods, without the response bit (IBA Vol. 1 §13.4.5 table 147).
    pub enum Method(u8) {
        /// Get (a request; answered with GetResp).
        Get = 0x01,
        /// Set (a request; answered with GetResp).
        Set = 0x02,
        /// Send (a datagram; never answered by the MAD layer: the CM's messages).
        Send = 0x03,
        /// Trap.
        Trap = 0x05,
        /// Report.
        Report = 0x06,
        /// TrapRepress.
        TrapRepress = 0x07,
        /// GetTable.
        GetTable = 0x12,
        /// Delete.
        Delete = 0x15,
    }
}

/// The response bit of `method` (IBA Vol. 1 §13.4.5: GetResp = 0x81).
pub const METHOD_RESP: u8 = 0x80;
/// GetResp: the answer to Get and Set.
pub const METHOD_GET_RESP: u8 = 0x81;

/// MAD status codes (IBA Vol. 1 §13.4.7 table 148; the "invalid field" code is bits
/// `[4:2]`).
pub mod status {
    /// Success.
    pub const OK: u16 = 0x0000;
    /// Busy: the request was dropped, try again later (bit 0).
    pub const BUSY: u16 = 0x0001;
    /// Code 1: bad version (the class version is not supported).
    pub const BAD_VERSION: u16 = 1 << 2;
    /// Code 2: the method is not supported.
    pub const UNSUPPORTED_METHOD: u16 = 2 << 2;
    /// Code 3: the method/attribute combination is not supported (also what Linux's MAD
    /// layer answers for a Get/Set of a class nobody registered: `generate_unmatched_resp`).
    pub const UNSUPPORTED_METHOD_ATTR: u16 = 3 << 2;
    /// Code 7: a field of the attribute or its modifier holds an invalid value.
    pub const INVALID_FIELD: u16 = 7 << 2;
}

/// Why bytes are not a MAD (the MAD layer drops them and counts the reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MadError {
    /// Shorter than a whole MAD.
    Short(usize),
    /// A base version other than 1.
    BaseVersion(u8),
}

impl core::fmt::Display for MadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MadError::Short(n) => write!(f, "{n} bytes is shorter than a {MAD_SIZE}-byte MAD"),
            MadError::BaseVersion(v) => write!(f, "MAD base version {v} (only 1 exists)"),
        }
    }
}

impl std::error::Error for MadError {}

/// The common MAD header, parsed (IBA Vol. 1 §13.4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadHeader {
    /// Management class.
    pub mgmt_class: MgmtClass,
    /// Class version (2 for the CM).
    pub class_version: u8,
    /// Method with the response bit (bit 7) included, as on the wire.
    pub method: u8,
    /// Status (responses only).
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID (chosen by the requester; echoed in responses).
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// Bytes of the header.
    pub const fn buffer_len() -> usize {
        MAD_HDR_SIZE
    }

    /// Parses the header of the MAD in `buf`, which must hold a whole MAD (256 bytes;
    /// anything after them is ignored) with base version 1.
    pub fn parse<B: Buf + ?Sized>(buf: &B) -> Result<Self, MadError> {
        if buf.buf_len() < MAD_SIZE {
            return Err(MadError::Short(buf.buf_len()));
        }
        let v = MadHdr::new_unchecked(buf);
        if v.base_version() != u32::from(BASE_VERSION) {
            return Err(MadError::BaseVersion(v.base_version() as u8));
        }
        Ok(MadHeader {
            mgmt_class: MgmtClass::from(v.mgmt_class() as u8),
            class_version: v.class_version() as u8,
            method: (v.r() << 7 | v.method()) as u8,
            status: v.status() as u16,
            class_specific: v.class_specific() as u16,
            transaction_id: v.transaction_id(),
            attribute_id: v.attribute_id() as u16,
            attribute_modifier: v.attribute_modifier(),
        })
    }

    /// Writes the header (base version 1) into the first 24 bytes of `buf`.
    pub fn emit<B: BufMut + ?Sized>(&self, buf: &mut B) {
        let mut v = MadHdr::new_unchecked(buf);
        v.set_base_version(BASE_VERSION.into());
        v.set_mgmt_class(self.mgmt_class.raw().into());
        v.set_class_version(self.class_version.into());
        v.set_r(u32::from(self.method >> 7));
        v.set_method(u32::from(self.method & 0x7f));
        v.set_status(self.status.into());
        v.set_class_specific(self.class_specific.into());
        v.set_transaction_id(self.transaction_id);
        v.set_attribute_id(self.attribute_id.into());
        v.set_attribute_modifier(self.attribute_modifier);
    }

    /// Whether this is a response (the method's R bit).
    pub fn is_response(&self) -> bool {
        self.method & METHOD_RESP != 0
    }

    /// The method without the response bit.
    pub fn method_kind(&self) -> Method {
        Method::from(self.method & !METHOD_RESP)
    }

    /// The header of the GetResp that answers this Get/Set with `status` (same class,
    /// version, attribute and transaction ID; IBA Vol. 1 §13.4.6.1).
    pub fn response(&self, status: u16) -> MadHeader {
        MadHeader {
            method: METHOD_GET_RESP,
            status,
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Field, FieldKind};

    /// A ClassPortInfo Get of the CM class (the header bytes as IBA table 145 lays them out).
    const GOLDEN: [u8; 24] = [
        0x01, 0x07, 0x02, 0x01, // base 1, class CM, version 2, Get
        0x00, 0x1c, 0xab, 0xcd, // status 0x001c, class-specific 0xabcd
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // TID
        0x00, 0x01, 0x00, 0x00, // attribute 0x0001, reserved
        0xde, 0xad, 0xbe, 0xef, // modifier
    ];

    fn golden_header() -> MadHeader {
        MadHeader {
            mgmt_class: MgmtClass::Cm,
            class_version: 2,
            method: 0x01,
            status: status::INVALID_FIELD,
            class_specific: 0xabcd,
            transaction_id: 0x0102_0304_0506_0708,
            attribute_id: 0x0001,
            attribute_modifier: 0xdead_beef,
        }
    }

    #[test]
    fn header_golden_bytes_both_ways() {
        let mut buf = [0u8; MAD_SIZE];
        golden_header().emit(&mut buf[..]);
        assert_eq!(buf[..24], GOLDEN);
        assert!(buf[24..].iter().all(|&b| b == 0));
        let mut mad = [0u8; MAD_SIZE];
        mad[..24].copy_from_slice(&GOLDEN);
        assert_eq!(MadHeader::parse(&mad[..]), Ok(golden_header()));
    }

    #[test]
    fn response_bit_and_getresp() {
        let h = golden_header();
        assert!(!h.is_response());
        assert_eq!(h.method_kind(), Method::Get);
        let r = h.response(status::UNSUPPORTED_METHOD_ATTR);
        assert!(r.is_response());
        assert_eq!(r.method_kind(), Method::Get);
        assert_eq!((r.transaction_id, r.attribute_id), (h.transaction_id, 1));
        let mut buf = [0u8; MAD_SIZE];
        r.emit(&mut buf[..]);
        assert_eq!((buf[3], buf[4], buf[5]), (0x81, 0x00, 0x0c));
    }

    #[test]
    fn short_or_wrong_version_is_refused() {
        assert_eq!(MadHeader::parse(&[0u8; 255][..]), Err(MadError::Short(255)));
        let mut mad = [0u8; MAD_SIZE];
        mad[0] = 2;
        assert_eq!(MadHeader::parse(&mad[..]), Err(MadError::BaseVersion(2)));
        assert_eq!(MadHeader::parse(&[0u8; 0][..]), Err(MadError::Short(0)));
    }

    #[test]
    fn fields_cover_the_header_without_overlap() {
        let mut covered = [0u32; 6];
        for f in MadHdr::<()>::FIELDS {
            for (w, slot) in covered.iter_mut().enumerate() {
                let m = f.word_mask(w * 4);
                assert_eq!(*slot & m, 0, "{} overlaps", f.name);
                *slot |= m;
            }
        }
        // Everything but the reserved half-word after the attribute ID.
        assert_eq!(covered, [!0, !0, !0, !0, 0xffff_0000, !0]);
        let f: Field = Field::named(MadHdr::<()>::FIELDS, "transaction_id");
        assert_eq!((f.offset, f.kind), (8, FieldKind::U64));
    }

    #[test]
    fn codes_are_lossless() {
        for v in 0..=255u8 {
            assert_eq!(MgmtClass::from(v).raw(), v);
            assert_eq!(Method::from(v).raw(), v);
        }
    }
}

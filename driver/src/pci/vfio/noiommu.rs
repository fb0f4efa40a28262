//! No-IOMMU support: process capabilities and physical addresses from `/proc/self/pagemap`
//! (vfio-kernel.md §1.5). Without an IOMMU the device sees physical addresses, so a
//! "mapping" only checks that the caller's IOVA is the physical address of the memory and
//! that the memory is physically contiguous.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::VfioError;

/// `CAP_IPC_LOCK`: pinned pages are not counted against RLIMIT_MEMLOCK.
pub const CAP_IPC_LOCK: u32 = 14;
/// `CAP_SYS_RAWIO`: needed to open a no-IOMMU group.
pub const CAP_SYS_RAWIO: u32 = 17;
/// `CAP_SYS_ADMIN`: needed for PFNs in `/proc/self/pagemap`.
pub const CAP_SYS_ADMIN: u32 = 21;

/// The effective capability mask from `/proc/self/status` text (`CapEff:` line).
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

/// Whether this process has capability `cap` (effective set, from `capget(2)`).
pub fn has_cap(cap: u32) -> std::io::Result<bool> {
    Ok(crate::dma::effective_capabilities()? & (1 << cap) != 0)
}

/// Refuses no-IOMMU mode unless the process may use it, naming what is missing.
pub fn check_caps(cap_eff: u64) -> Result<(), VfioError> {
    let mut missing = Vec::new();
    if cap_eff & (1 << CAP_SYS_RAWIO) == 0 {
        missing.push("CAP_SYS_RAWIO (to open a no-IOMMU group)");
    }
    if cap_eff & (1 << CAP_SYS_ADMIN) == 0 {
        missing.push("CAP_SYS_ADMIN (to read physical addresses from /proc/self/pagemap)");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(VfioError::NoIommuRefused(format!(
        "missing {}; run as root or grant them, e.g. `setcap cap_sys_rawio,cap_sys_admin+ep <binary>`",
        missing.join(" and ")
    )))
}

const PM_PRESENT: u64 = 1 << 63;
const PM_PFN_MASK: u64 = (1 << 55) - 1;

/// Decodes pagemap entries covering `[vaddr, vaddr + len)` (one entry per `page` bytes,
/// starting at the page that holds `vaddr`) into the physical address of `vaddr`, requiring
/// every page present and the whole range physically contiguous.
pub fn decode_pagemap(entries: &[u64], page: u64, vaddr: u64, len: u64) -> Result<u64, VfioError> {
    let first = vaddr / page;
    let last = (vaddr + len.max(1) - 1) / page;
    if entries.len() as u64 != last - first + 1 {
        return Err(VfioError::Malformed {
            what: "pagemap",
            why: "entry count does not cover the range",
        });
    }
    let mut base = None;
    for (i, &e) in entries.iter().enumerate() {
        if e & PM_PRESENT == 0 {
            return Err(VfioError::Pagemap(
                "a page is not present (touch or mlock the memory first)",
            ));
        }
        let pfn = e & PM_PFN_MASK;
        if pfn == 0 {
            return Err(VfioError::Pagemap(
                "the kernel hides PFNs: CAP_SYS_ADMIN is needed",
            ));
        }
        match base {
            None => base = Some(pfn),
            Some(b) if pfn != b + i as u64 => {
                return Err(VfioError::Pagemap(
                    "the memory is not physically contiguous (use one hugepage)",
                ));
            }
            Some(_) => {}
        }
    }
    Ok(base.expect("at least one entry") * page + vaddr % page)
}

/// The physical address of `[vaddr, vaddr + len)`, which must be present and contiguous.
pub fn virt_to_phys(vaddr: usize, len: usize) -> Result<u64, VfioError> {
    let page = super::sys::page_size() as u64;
    let (va, len) = (vaddr as u64, len as u64);
    let first = va / page;
    let n = ((va + len.max(1) - 1) / page - first + 1) as usize;
    let f = File::open("/proc/self/pagemap").map_err(|source| VfioError::Io {
        path: "/proc/self/pagemap".into(),
        source,
    })?;
    let mut raw = vec![0u8; n * 8];
    f.read_exact_at(&mut raw, first * 8)
        .map_err(|source| VfioError::Io {
            path: "/proc/self/pagemap".into(),
            source,
        })?;
    let entries: Vec<u64> = raw
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect();
    decode_pagemap(&entries, page, va, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_eff_parsing_and_refusal() {
        let s = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\nCapBnd:\t0\n";
        assert_eq!(parse_cap_eff(s), Some(0x1ff_ffff_ffff));
        assert!(check_caps(0x1ff_ffff_ffff).is_ok());
        let e = check_caps(0).unwrap_err().to_string();
        assert!(
            e.contains("CAP_SYS_RAWIO") && e.contains("CAP_SYS_ADMIN"),
            "{e}"
        );
        let e = check_caps(1 << CAP_SYS_RAWIO).unwrap_err().to_string();
        assert!(
            !e.contains("CAP_SYS_RAWIO") && e.contains("CAP_SYS_ADMIN"),
            "{e}"
        );
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
    }

    #[test]
    fn pagemap_decoding() {
        let p = PM_PRESENT;
        // Two contiguous pages, address in the middle of the first.
        assert_eq!(
            decode_pagemap(&[p | 0x1234, p | 0x1235], 4096, 0x7000_0800, 0x1000).unwrap(),
            0x0123_4800
        );
        // Not contiguous.
        assert!(matches!(
            decode_pagemap(&[p | 0x1234, p | 0x2000], 4096, 0, 0x2000),
            Err(VfioError::Pagemap(_))
        ));
        // Not present; PFN hidden.
        assert!(decode_pagemap(&[0x1234], 4096, 0, 0x1000).is_err());
        let e = decode_pagemap(&[p], 4096, 0, 0x1000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CAP_SYS_ADMIN"), "{e}");
        // Wrong entry count.
        assert!(decode_pagemap(&[p | 1], 4096, 0, 0x2000).is_err());
        // Soft-dirty and exclusive bits (55, 56) are not part of the PFN.
        assert_eq!(
            decode_pagemap(&[p | (3 << 55) | 0x10], 4096, 0, 0x1000).unwrap(),
            0x10_000
        );
    }
}

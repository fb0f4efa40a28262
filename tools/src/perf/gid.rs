//! The GID table entries an end picks (perftest's choice on RoCE), shared by the exchanges.

use uhca::Device;

/// Whether `gid` is an IPv4-mapped address (`::ffff:a.b.c.d`).
pub(super) fn v4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10..12] == [0xff, 0xff]
}

/// The first GID table entry that is IPv4-mapped (`v4`) or an IPv6 address (not zero),
/// else entry 0.
pub(super) fn gid_of_kind(dev: &Device, v4: bool) -> u8 {
    (0..16u8)
        .find(|&i| {
            dev.roce_address(u32::from(i)).is_ok_and(|a| {
                v4_mapped(&a.gid) == v4 && a.gid != [0; 16] && (!v4 || a.gid[12..] != [0; 4])
            })
        })
        .unwrap_or(0)
}

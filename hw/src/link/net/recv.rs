//! How datagrams come in ([`NetLink::refill`], [`NetLink::accept`]): a batch from the
//! packet ring or `recvmmsg`, and each packet checked (length, source, ICRC) with the
//! Ethernet, IP and UDP headers rebuilt in front of it for the model.

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::sys::{self, BATCH};
use super::{C, HEAD, MAX_FRAME_LEN, NetLink, Rx, pcap};
use crate::lat_trace;
use crate::layout::roce::headers::{BTH_SIZE, ETH_SIZE, IPV4_SIZE, IPV6_SIZE, UDP_SIZE};
use crate::layout::roce::{ICRC_SIZE, ROCE_UDP_PORT, icrc_in_place, internet_checksum};
use crate::link::LinkError;

impl NetLink {
    /// Checks the packet of `len` bytes at `o` in datagram `i` of the batch (0 and the
    /// datagram's length unless the kernel coalesced several) and rebuilds its headers in
    /// front of it (over the end of the packet before it, already delivered); the frame's
    /// range in its buffer, or `None` (dropped and counted).
    pub(super) fn accept(
        &self,
        rx: &mut Rx,
        i: usize,
        o: usize,
        len: usize,
    ) -> Option<std::ops::Range<usize>> {
        let r = self.accept_inner(rx, i, o, len);
        if r.is_none() {
            self.rx_errors.0.fetch_add(1, Ordering::Relaxed);
            self.rx_errors.1.fetch_add(len as u64, Ordering::Relaxed);
        }
        r
    }

    fn accept_inner(
        &self,
        rx: &mut Rx,
        i: usize,
        o: usize,
        len: usize,
    ) -> Option<std::ops::Range<usize>> {
        let d = rx.got[i];
        if d.truncated || len > MAX_FRAME_LEN {
            self.stats.add(C::RxTooLong, 1);
            return None;
        }
        if len < BTH_SIZE + ICRC_SIZE {
            self.stats.add(C::RxTruncated, 1);
            return None;
        }
        let local = self.socks[rx.sock].addr;
        let src = d.src?;
        let ip_len = if local.is_ipv4() {
            IPV4_SIZE
        } else {
            IPV6_SIZE
        };
        let at = HEAD + o;
        let start = at - (ETH_SIZE + ip_len + UDP_SIZE);
        let buf = &mut rx.bufs[i];
        let (l3, l4, end) = (start + ETH_SIZE, at - UDP_SIZE, at + len);
        buf[start..start + 6].copy_from_slice(&self.mac);
        buf[start + 6..start + 12].copy_from_slice(&peer_mac(src.ip()));
        let udp_len = (UDP_SIZE + len) as u16;
        match (src.ip(), local.ip()) {
            (IpAddr::V4(s), IpAddr::V4(l)) => {
                buf[start + 12..l3].copy_from_slice(&[0x08, 0x00]);
                let h = &mut buf[l3..l4];
                h[..4].copy_from_slice(&[0x45, 0, 0, 0]);
                h[2..4].copy_from_slice(&(udp_len + IPV4_SIZE as u16).to_be_bytes());
                h[4..10].copy_from_slice(&[0, 0, 0x40, 0, 64, 17]);
                h[10..12].fill(0);
                h[12..16].copy_from_slice(&s.octets());
                h[16..20].copy_from_slice(&l.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(l)) => {
                buf[start + 12..l3].copy_from_slice(&[0x86, 0xDD]);
                let h = &mut buf[l3..l4];
                h[..4].copy_from_slice(&[0x60, 0, 0, 0]);
                h[4..6].copy_from_slice(&udp_len.to_be_bytes());
                h[6..8].copy_from_slice(&[17, 64]);
                h[8..24].copy_from_slice(&s.octets());
                h[24..40].copy_from_slice(&l.octets());
            }
            _ => return None,
        }
        buf[l4..l4 + 2].copy_from_slice(&src.port().to_be_bytes());
        buf[l4 + 2..l4 + 4].copy_from_slice(&local.port().to_be_bytes());
        buf[l4 + 4..l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
        buf[l4 + 6..l4 + 8].fill(0);
        let got = u32::from_le_bytes(buf[end - ICRC_SIZE..end].try_into().ok()?);
        let l3b = &mut buf[l3..end - ICRC_SIZE];
        let ok = match (ip_len == IPV4_SIZE, d.ipv4) {
            (true, Some((id, flags))) => {
                // The sender's header was seen (a packet ring): the ICRC is checked in
                // full. The segments of a GSO message are numbered on from its ID, as the
                // kernel would have cut them.
                let k = d.seg.map_or(0, |g| o / g.max(1)) as u16;
                l3b[4..6].copy_from_slice(&id.wrapping_add(k).to_be_bytes());
                l3b[6..8].copy_from_slice(&flags.to_be_bytes());
                icrc_in_place(l3b).is_ok_and(|c| c == got)
            }
            (true, None) => match rx.ids.check(l3b, got) {
                Some(0) => true,
                Some(_) => {
                    self.stats.add(C::RxIdRecovered, 1);
                    true
                }
                None => false,
            },
            (false, _) => icrc_in_place(l3b).is_ok_and(|c| c == got),
        };
        if !ok {
            self.stats.add(C::RxBadIcrc, 1);
            return None;
        }
        if ip_len == IPV4_SIZE {
            let c = internet_checksum(&buf[l3..l4]);
            buf[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        if self.capturing() {
            let mut c = buf[start..end].to_vec();
            pcap::fill_udp_checksum(&mut c);
            self.record(&c);
        }
        // The model's parser wants the RoCEv2 port; the ICRC was checked above.
        buf[l4 + 2..l4 + 4].copy_from_slice(&ROCE_UDP_PORT.to_be_bytes());
        self.stats.add(C::RxDatagrams, 1);
        self.stats.add(C::RxBytes, len as u64);
        Some(start..end)
    }

    /// Fills the receive batch from the next socket that has datagrams; false if none has.
    pub(super) fn refill(&self, rx: &mut Rx) -> Result<bool, LinkError> {
        for k in 0..self.socks.len() {
            let s = (rx.rr + k) % self.socks.len();
            let Rx {
                bufs,
                got,
                room,
                rings,
                ..
            } = rx;
            let n = match rings.get_mut(s) {
                Some(r) => {
                    let mut n = 0;
                    while n < BATCH {
                        let Some(d) = r.take(&mut bufs[n], HEAD) else {
                            break;
                        };
                        got[n] = d;
                        n += 1;
                    }
                    self.stats.add(C::RxRingFull, r.take_dropped());
                    n
                }
                None => {
                    let fd = self.socks[s].sock.as_raw_fd();
                    sys::recv_batch(fd, room, bufs, HEAD, got).map_err(LinkError::Io)?
                }
            };
            if n > 0 {
                lat_trace::mark(lat_trace::Ev::RxBatch, n as u32, 0);
                (rx.count, rx.next, rx.seg_off, rx.sock) = (n, 0, 0, s);
                rx.rr = (s + 1) % self.socks.len();
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// A locally administered MAC standing for the peer at `ip` in the frames the port rebuilds
/// (the socket does not see the peer's MAC): `02:00` and the address's last four bytes.
fn peer_mac(ip: IpAddr) -> [u8; 6] {
    let b = match ip {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => a.octets()[12..].try_into().unwrap_or([0; 4]),
    };
    [0x02, 0x00, b[0], b[1], b[2], b[3]]
}

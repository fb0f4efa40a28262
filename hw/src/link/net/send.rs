//! How the queued datagrams leave ([`NetLink::send_queue`]): runs of one size to one peer
//! as UDP GSO messages, each IPv4 segment's ICRC renumbered for the Identification the
//! kernel gives it, all of a socket's in one `sendmmsg`.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::sys::{self, BATCH, Msg};
use super::{C, GSO_BYTES, GSO_SEGMENTS, NetLink, Pending, Tx, ipv4_id};
use crate::lat_trace;
use crate::layout::roce::ICRC_SIZE;
use crate::layout::roce::headers::{IPV4_SIZE, UDP_SIZE};

impl NetLink {
    /// Sends every queued datagram (a held one stays held): runs of datagrams of one
    /// size (the last may be shorter) from one socket to one peer go as one UDP GSO
    /// message, the others alone, all of a socket's in one `sendmmsg`.
    pub(super) fn send_queue(&self, tx: &mut Tx) {
        let Tx {
            slots,
            free,
            queue,
            held,
            msgs,
            ids,
            room,
            ..
        } = tx;
        // A slot queued twice (a duplicate, or a held datagram sent again) goes alone: a
        // GSO segment's ICRC is rewritten in its slot for its place in the message.
        let (mut seen, mut twice) = (0u128, 0u128);
        for p in queue.iter() {
            let b = 1u128 << p.slot;
            twice |= seen & b;
            seen |= b;
        }
        let gso = self.gso.load(Ordering::Relaxed);
        let mut at = 0;
        while at < queue.len() {
            let sock = queue[at].sock;
            msgs.clear();
            let mut j = at;
            while j < queue.len() && queue[j].sock == sock && msgs.len() < BATCH {
                let p = queue[j];
                let mut count = 1;
                if gso && twice >> p.slot & 1 == 0 {
                    let mut total = p.len;
                    while let Some(q) = queue.get(j + count) {
                        if count == GSO_SEGMENTS
                            || q.sock != sock
                            || q.dst != p.dst
                            || q.len > p.len
                            || total + q.len > GSO_BYTES
                            || twice >> q.slot & 1 == 1
                        {
                            break;
                        }
                        total += q.len;
                        count += 1;
                        if q.len < p.len {
                            break;
                        }
                    }
                }
                let m = Msg {
                    dst: p.dst,
                    first: j,
                    count,
                    seg: (count > 1).then_some(p.len as u16),
                };
                renumber(slots, &queue[j..j + count], ids);
                msgs.push(m);
                j += count;
            }
            let fd = self.socks[sock].sock.as_raw_fd();
            let mut sent = 0;
            while sent < msgs.len() {
                lat_trace::mark(lat_trace::Ev::TxCall, (msgs.len() - sent) as u32, 0);
                let r = sys::send_msgs(fd, room, &msgs[sent..], |i: usize| {
                    let p = &queue[i];
                    &slots[p.slot][p.off..p.off + p.len]
                });
                let m = msgs[sent];
                match r {
                    Ok(0) => {
                        let left: usize = msgs[sent..].iter().map(|m| m.count).sum();
                        self.stats.add(C::TxErrors, left as u64);
                        break;
                    }
                    Ok(k) => {
                        lat_trace::mark(lat_trace::Ev::TxSent, k as u32, 0);
                        for m in &msgs[sent..sent + k] {
                            let bytes: usize =
                                (m.first..m.first + m.count).map(|i| queue[i].len).sum();
                            self.stats.add(C::TxDatagrams, m.count as u64);
                            self.stats.add(C::TxBytes, bytes as u64);
                        }
                        sent += k;
                    }
                    Err(e) if m.seg.is_some() => {
                        // The kernel or the route refuses GSO (no checksum offload on the
                        // device, an old kernel): from now on every datagram goes alone.
                        tracing::info!(error = %e, "UDP GSO refused; sending datagrams one by one");
                        self.gso.store(false, Ordering::Relaxed);
                        let group = &queue[m.first..m.first + m.count];
                        renumber(slots, group, ids);
                        let singles: Vec<Msg> = (m.first..m.first + m.count)
                            .map(|i| Msg {
                                dst: m.dst,
                                first: i,
                                count: 1,
                                seg: None,
                            })
                            .collect();
                        msgs.splice(sent..=sent, singles);
                    }
                    Err(e) => {
                        // This datagram is lost (as on a wire); the next ones still go.
                        tracing::debug!(error = %e, dst = %m.dst, "datagram not sent");
                        self.stats.add(C::TxErrors, m.count as u64);
                        sent += 1;
                    }
                }
            }
            at = j;
        }
        queue.clear();
        let keep = held.map(|h| h.slot);
        free.clear();
        free.extend((0..slots.len()).filter(|&s| Some(s) != keep));
    }
}

/// The IPv4 Identification of GSO segments (docs/spec/rocev2-net.md §2): the kernel sends
/// segment `k` of a message with ID `k` where the datagram alone would have 0, so the
/// ICRC each was queued with (ID 0) changes by [`ipv4_id::IdDelta`] for `k`; a second
/// call changes it back (a message sent one by one after all).
/// IPv6 has no Identification: nothing changes.
fn renumber(slots: &mut [Box<[u8]>], group: &[Pending], ids: &mut ipv4_id::IdDelta) {
    if group.len() < 2 || !group[0].dst.is_ipv4() {
        return;
    }
    for (k, p) in group.iter().enumerate().skip(1) {
        // The ICRC covers the IPv4 header to the end of the pad.
        let d = ids.delta(IPV4_SIZE + UDP_SIZE + p.len - ICRC_SIZE, k as u16);
        let at = p.off + p.len - ICRC_SIZE;
        let f = &mut slots[p.slot][at..at + ICRC_SIZE];
        let c = u32::from_le_bytes([f[0], f[1], f[2], f[3]]) ^ d;
        f.copy_from_slice(&c.to_le_bytes());
    }
}

//! What the RC engine sees of the device: its link ([`Wire`]: the port's loopback queue by
//! destination MAC, else the attached link, with the port's counters) and its memory
//! ([`Mem`]: the MKey translation with the QP's PD, through the pass's IOMMU lock).

use super::*;

/// What the engine transmits through: loopback by destination MAC, else the peer link.
pub(super) struct Wire<'a> {
    /// The port's MAC: frames to it go to `looped`.
    pub(super) mac: [u8; 6],
    /// The port's loopback queue.
    pub(super) looped: &'a Loopback<rc::Burst>,
    /// The attached link, if any.
    pub(super) peer: Option<&'a (dyn Link + Send + Sync)>,
    /// Frames sent (the pass's progress).
    pub(super) sent: &'a AtomicU64,
    /// Frames refused because a queue was full.
    pub(super) full: &'a AtomicU64,
    pub(super) sh: &'a Shared,
}

impl Link for Wire<'_> {
    fn max_frame_len(&self) -> usize {
        self.peer
            .map_or(usize::MAX, |p| p.max_frame_len())
            .min(self.looped.max_frame_len())
    }

    fn send(&self, frame: &[u8]) -> Result<(), LinkError> {
        let r = if frame.first_chunk::<6>() == Some(&self.mac) {
            self.looped.send(frame)
        } else if let Some(p) = self.peer {
            p.send(frame)
        } else {
            // No link attached: the frame leaves into nothing, as on an unplugged port.
            Ok(())
        };
        self.account(&r, 1, frame.len() as u64);
        r
    }

    /// Builds the frame in the buffer of the likelier link (the peer if one is attached,
    /// else the loopback queue) and, if its destination MAC says it belongs on the other,
    /// copies it there instead: in the common cases each frame is written once.
    fn send_with(
        &self,
        scratch: &mut [u8],
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<(), LinkError> {
        let mac = self.mac;
        let mut built = false;
        let mut len = 0;
        let mut other = None;
        let r = match self.peer {
            Some(p) => p.send_with(scratch, &mut |buf: &mut [u8]| {
                let n = build(buf)?;
                (built, len) = (true, n);
                if buf.first_chunk::<6>() == Some(&mac) {
                    other = Some(self.looped.send(&buf[..n]));
                    return None;
                }
                Some(n)
            }),
            None => self.looped.send_with(scratch, &mut |buf: &mut [u8]| {
                let n = build(buf)?;
                (built, len) = (true, n);
                if buf.first_chunk::<6>() == Some(&mac) {
                    return Some(n);
                }
                // No link attached: the frame leaves into nothing, as on an unplugged port.
                other = Some(Ok(()));
                None
            }),
        };
        if !built && r.is_ok() {
            return Ok(()); // the builder sent nothing
        }
        let r = other.unwrap_or(r);
        self.account(&r, 1, len as u64);
        r
    }

    fn try_recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        Ok(None) // the port receives through `Port`, never through the engine
    }

    /// A frame to the port's own MAC goes to its loopback queue, which takes the offloads
    /// unless the model was made without them (`ModelConfig::loopback_offload`).
    fn is_local(&self, dst_mac: &[u8; 6]) -> bool {
        *dst_mac == self.mac && self.sh.cfg.loopback_offload
    }

    /// A frame for the attached link, if that link computes and checks ICRCs itself.
    fn offloads_icrc(&self, dst_mac: &[u8; 6]) -> bool {
        *dst_mac != self.mac && self.peer.is_some_and(|p| p.offloads_icrc(dst_mac))
    }

    fn flush(&self) -> Result<(), LinkError> {
        self.peer.map_or(Ok(()), |p| p.flush())
    }
}

/// The port's loopback offload ([`rc::Offload`]): bursts to its own MAC, queued on its
/// loopback queue beside their frames.
impl rc::Offload for Wire<'_> {
    /// A frame to the port's own MAC, unless the model was made without the offloads
    /// (`ModelConfig::loopback_offload`).
    fn takes_bursts(&self, dst_mac: &[u8; 6]) -> bool {
        *dst_mac == self.mac && self.sh.cfg.loopback_offload
    }

    /// Queues the burst on the loopback queue, if its frame is for this port (else
    /// `NoBursts`, nothing sent).
    fn send_burst(
        &self,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        burst: &rc::Burst,
    ) -> Result<(), LinkError> {
        let mac = self.mac;
        let mut foreign = false;
        let r = self.looped.send_with_side(
            &mut |buf: &mut [u8]| {
                let n = build(buf)?;
                foreign = buf.first_chunk::<6>() != Some(&mac);
                (!foreign).then_some(n)
            },
            burst,
        );
        if foreign && r.is_ok() {
            return Err(LinkError::NoBursts);
        }
        self.account(&r, burst.frame_packets(), u64::from(burst.frame_wire_len()));
        if r.is_ok() {
            // Only the device thread writes it.
            Counters::inc_dev(&self.sh.stats.bursts_tx);
        }
        r
    }
}

impl Wire<'_> {
    /// Counts a send's outcome: a frame standing for `packets` packets of `octets` bytes in
    /// all (one, as long as the frame, but for a burst).
    fn account(&self, r: &Result<(), LinkError>, packets: u32, octets: u64) {
        // Only the device thread writes `sent`, `full` and `packets_tx`.
        match r {
            Ok(()) => {
                Counters::inc_dev(self.sent);
                Counters::add_dev(&self.sh.stats.packets_tx, u64::from(packets));
                self.sh.stats.port.transmitted(packets, octets);
            }
            Err(LinkError::Full) => {
                Counters::inc_dev(self.full);
            }
            Err(_) => {}
        }
    }
}

/// Memory as the engine sees it: the MKey translation with the QP's PD.
pub(super) struct Mem<'a, 'd> {
    pub(super) sh: &'a Shared,
    pub(super) dma: &'a Dma<'d>,
    /// The MKey table.
    pub(super) keys: &'a mkey::MkeyTable,
    /// The QP's protection domain.
    pub(super) pd: u32,
}

impl Mem<'_, '_> {
    /// The target (in this memory's PD) and source (in its own domain, read locally) of a
    /// copy in.
    fn ends(&self, r: &rc::CopyIn) -> (mkey::CopyEnd, mkey::CopyEnd) {
        let dst = mkey::CopyEnd {
            key: r.dst_key,
            pd: self.pd,
            va: r.dst_va,
            need: need(r.access),
        };
        let src = mkey::CopyEnd {
            key: r.src_key,
            pd: r.src_domain,
            va: r.src_va,
            need: need(rc::AccessKind::LocalRead),
        };
        (dst, src)
    }

    /// Whether `len` bytes at `va` may be accessed through `key` in protection domain `pd`
    /// with `access`: key, PD, bounds and rights of the whole range decided by one MKey
    /// lookup and its first and last byte (the MKey range is contiguous); holes in the
    /// translation show up when the data moves. The probe decides as one-byte reads would
    /// but reads nothing: the destination line stays where the host has it until the data
    /// is written. Nothing to check for `len` 0.
    fn probe(
        &self,
        pd: u32,
        key: u32,
        va: u64,
        len: u64,
        access: rc::AccessKind,
    ) -> Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        va.checked_add(len - 1).ok_or(AccessError::OutOfRange)?;
        mkey::mem_probe(self.sh, self.dma, self.keys, key, pd, va, len, need(access))
            .map_err(|e| access_error(key, e))
    }
}

/// An unused end (fills arrays of copies).
const END0: mkey::CopyEnd = mkey::CopyEnd {
    key: 0,
    pd: 0,
    va: 0,
    need: Access::NONE,
};

fn need(a: rc::AccessKind) -> Access {
    match a {
        rc::AccessKind::LocalRead => Access::NONE,
        rc::AccessKind::LocalWrite => Access::LOCAL_WRITE,
        rc::AccessKind::RemoteRead => Access::REMOTE_READ,
        rc::AccessKind::RemoteWrite => Access::REMOTE_WRITE,
        rc::AccessKind::RemoteAtomic => Access::REMOTE_ATOMIC,
    }
}

fn access_error(key: u32, e: MkeyFault) -> AccessError {
    match e {
        MkeyFault::BadKey | MkeyFault::NotInPd => AccessError::InvalidKey { key },
        MkeyFault::OutOfBounds => AccessError::OutOfRange,
        MkeyFault::NoRight => AccessError::Denied,
        MkeyFault::Unmapped => AccessError::Fault,
    }
}

impl rc::Memory for Mem<'_, '_> {
    fn domain(&self) -> u32 {
        self.pd
    }

    fn check_in(&self, domain: u32, key: u32, va: u64, len: u64) -> Result<(), AccessError> {
        self.probe(domain, key, va, len, rc::AccessKind::LocalRead)
    }

    fn copy_in(
        &self,
        dst_key: u32,
        dst_va: u64,
        access: rc::AccessKind,
        src_domain: u32,
        src_key: u32,
        src_va: u64,
        len: u64,
    ) -> Result<(), rc::CopyFault> {
        let (dst, src) = self.ends(&rc::CopyIn {
            dst_key,
            dst_va,
            access,
            src_domain,
            src_key,
            src_va,
            len,
        });
        let len =
            usize::try_from(len).map_err(|_| rc::CopyFault::Target(AccessError::OutOfRange))?;
        mkey::mem_copy(self.sh, self.dma, self.keys, dst, src, len).map_err(|e| match e {
            mkey::CopySide::Source(e) => rc::CopyFault::Source(access_error(src_key, e)),
            mkey::CopySide::Target(e) => rc::CopyFault::Target(access_error(dst_key, e)),
        })
    }

    fn copy_in_batch(&self, reqs: &[rc::CopyIn]) -> usize {
        let mut copies = [(END0, END0, 0); mkey::MAX_BATCH];
        let mut n = 0;
        for (r, c) in reqs.iter().zip(&mut copies) {
            let Ok(len) = usize::try_from(r.len) else {
                break;
            };
            // A zero-length copy checks nothing (`mem_copy`): not one for a batch.
            if len == 0 {
                break;
            }
            let (dst, src) = self.ends(r);
            *c = (dst, src, len);
            n += 1;
        }
        mkey::mem_copy_batch(self.dma, self.keys, &copies[..n])
    }

    fn check(
        &self,
        key: u32,
        va: u64,
        len: u64,
        access: rc::AccessKind,
    ) -> Result<(), AccessError> {
        self.probe(self.pd, key, va, len, access)
    }

    fn read(
        &self,
        key: u32,
        va: u64,
        buf: &mut [u8],
        a: rc::AccessKind,
    ) -> Result<(), AccessError> {
        mkey::mem_read(self.sh, self.dma, self.keys, key, self.pd, va, buf, need(a))
            .map_err(|e| access_error(key, e))
    }

    fn write(&self, key: u32, va: u64, data: &[u8], a: rc::AccessKind) -> Result<(), AccessError> {
        mkey::mem_write(
            self.sh,
            self.dma,
            self.keys,
            key,
            self.pd,
            va,
            data,
            need(a),
        )
        .map_err(|e| access_error(key, e))
    }

    fn atomic(&self, key: u32, va: u64, op: rc::AtomicOp) -> Result<u64, AccessError> {
        if !va.is_multiple_of(8) {
            return Err(AccessError::Misaligned);
        }
        mkey::mem_atomic(
            self.sh,
            self.dma,
            self.keys,
            key,
            self.pd,
            va,
            op,
            Access::REMOTE_ATOMIC,
        )
        .map_err(|e| access_error(key, e))
    }
}

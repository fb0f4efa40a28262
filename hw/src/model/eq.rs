//! Event queues (prm-subset.md §6.4, §7.1, §9.8): EQE posting with the owner rule, consumer
//! index and arming through the UAR doorbells, overrun, and MSI-X signalling.
//!
//! Doorbells: the driver writes `eqn << 24 | ci` (BE32) at UAR offset 0x40 (update and arm)
//! or 0x48 (update only). The model takes each word with a swap to [`DB_EMPTY`], so every
//! write is seen once; two writes to the same word between two polls coalesce to the last
//! one, as a posted-write buffer would merge them. Hardware takes every write, and drivers
//! rely on it: Linux arms its command, async and page-request EQs through the same word of
//! one UAR. A host that forwards BAR writes one by one (uhca-model serving trapped UAR pages
//! to QEMU) hands each EQ doorbell to [`apply_doorbell`] instead (`Hca::doorbell_write`), so
//! each arm counts (firmware-behaviour.md §Events). An EQ whose consumer index falls a full
//! ring behind its producer index overruns: EQEs are dropped and counted until software
//! catches up.

use crate::layout::eqe::{EQE_SIZE, EventType, eqe_owner_for};
use crate::layout::uar::{EQ_DOORBELL_ARM, EQ_DOORBELL_NOARM, UAR_SIZE};

use super::caps::LOG_MAX_EQ;
use super::{Counters, Shared};

/// What a doorbell word holds when nothing was written since the last poll.
pub(crate) const DB_EMPTY: u32 = u32::MAX;

/// The event queues by EQ number.
pub(crate) type Eqs = std::collections::BTreeMap<u32, Eq>;

/// One event queue.
#[derive(Debug)]
pub(crate) struct Eq {
    pub(crate) eqn: u32,
    pub(crate) log_size: u32,
    pub(crate) uar: u32,
    pub(crate) intr: u32,
    /// `event_bitmask` words 0-3 (bit t of word t/64 = event type t).
    pub(crate) mask: [u64; 4],
    /// Buffer pages (IOVAs), each `page_size` bytes.
    pub(crate) pas: Vec<u64>,
    pub(crate) page_size: u64,
    /// Byte offset of entry 0 in the first page.
    pub(crate) offset: u64,
    /// Producer index (EQEs written).
    pub(crate) pi: u32,
    /// Consumer index as last reported by a doorbell.
    pub(crate) ci: u32,
    pub(crate) armed: bool,
    pub(crate) overrun: bool,
}

impl Eq {
    /// Whether the EQ subscribed event type `t`.
    pub(crate) fn wants(&self, t: u8) -> bool {
        self.mask[usize::from(t / 64)] >> (t % 64) & 1 == 1
    }

    /// IOVA of entry `idx`.
    fn entry_iova(&self, idx: u32) -> u64 {
        let at = self.offset + u64::from(idx) * EQE_SIZE as u64;
        self.pas[(at / self.page_size) as usize] + at % self.page_size
    }

    fn size(&self) -> u32 {
        1 << self.log_size
    }
}

/// Posts an event of type `t` to every EQ that subscribed it; returns how many EQs took it.
pub(crate) fn post_event(
    sh: &Shared,
    eqs: &mut Eqs,
    t: EventType,
    sub_type: u8,
    data: &[u8; 28],
) -> usize {
    let code = u8::from(t);
    let eqns: Vec<u32> = eqs
        .values()
        .filter(|e| e.wants(code))
        .map(|e| e.eqn)
        .collect();
    eqns.into_iter()
        .filter(|&eqn| post_to(sh, eqs, eqn, code, sub_type, data))
        .count()
}

/// Writes one EQE to EQ `eqn` (completion events name their EQ; no mask check). Returns
/// false when the EQE was dropped (no such EQ, overrun, or its buffer is unreachable).
pub(crate) fn post_to(
    sh: &Shared,
    eqs: &mut Eqs,
    eqn: u32,
    t: u8,
    sub_type: u8,
    data: &[u8; 28],
) -> bool {
    let Some(eq) = eqs.get_mut(&eqn) else {
        return false;
    };
    if eq.pi.wrapping_sub(eq.ci) >= eq.size() {
        if !eq.overrun {
            tracing::warn!(
                eqn,
                pi = eq.pi,
                ci = eq.ci,
                "EQ overrun: events dropped until software catches up"
            );
        }
        eq.overrun = true;
        Counters::inc(&sh.stats.eq_overruns);
        return false;
    }
    eq.overrun = false;
    let mut eqe = [0u8; EQE_SIZE];
    eqe[0x01] = t;
    eqe[0x03] = sub_type;
    eqe[0x20..0x3c].copy_from_slice(data);
    let at = eq.entry_iova(eq.pi & (eq.size() - 1));
    let owner = eqe_owner_for(eq.pi, eq.log_size);
    // Body first, then the owner byte with release: software that sees the owner flip
    // sees the whole entry.
    if sh.iommu.write(at, &eqe[..EQE_SIZE - 1]).is_err()
        || sh.iommu.write_u8_release(at + 0x3f, owner).is_err()
    {
        tracing::warn!(eqn, "EQ buffer unreachable, event dropped");
        return false;
    }
    eq.pi = eq.pi.wrapping_add(1);
    Counters::inc(&sh.stats.eqes_posted);
    if eq.armed {
        eq.armed = false;
        signal(sh, eq.intr);
    }
    true
}

/// Signals MSI-X `vector` if software routed it to an eventfd.
fn signal(sh: &Shared, vector: u32) {
    let irqs = sh.irqs.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(fd)) = irqs.get(vector as usize) {
        // A full eventfd counter only means the interrupt is already pending.
        let _ = fd.write(1);
        Counters::inc(&sh.stats.irqs_signalled);
    }
}

/// Takes the EQ doorbells of every UAR that has an EQ; true if any was written.
pub(crate) fn poll_doorbells(sh: &Shared, eqs: &mut Eqs) -> bool {
    // Runs on every device-thread pass: the distinct UARs go in a stack array (one per EQ
    // at most), not a heap Vec.
    let mut uars = [0u32; 1 << LOG_MAX_EQ];
    let mut n = 0;
    for e in eqs.values() {
        if !uars[..n].contains(&e.uar) {
            uars[n] = e.uar;
            n += 1;
        }
    }
    let mut any = false;
    for &uar in &uars[..n] {
        let base = uar as usize * UAR_SIZE;
        for (off, arm) in [(EQ_DOORBELL_NOARM, false), (EQ_DOORBELL_ARM, true)] {
            // Read first: an idle pass then only shares the line instead of owning it.
            if sh.bar.read_be32(base + off) == DB_EMPTY {
                continue;
            }
            let w = sh.bar.swap_be32(base + off, DB_EMPTY);
            if w == DB_EMPTY {
                continue;
            }
            any = true;
            apply_doorbell(sh, eqs, uar, arm, w);
        }
    }
    any
}

/// Applies one EQ doorbell word `eqn << 24 | ci` written to UAR `uar` (`arm`: at
/// [`EQ_DOORBELL_ARM`]): the consumer index moves, and an arm arms the EQ (interrupting at
/// once when EQEs are pending). A doorbell naming an EQ of another UAR is ignored.
pub(crate) fn apply_doorbell(sh: &Shared, eqs: &mut Eqs, uar: u32, arm: bool, w: u32) {
    let (eqn, ci) = (w >> 24, w & 0xFF_FFFF);
    let Some(eq) = eqs.get_mut(&eqn) else {
        return;
    };
    if eq.uar != uar {
        return; // a doorbell on another EQ's UAR page is ignored
    }
    // The index is 24 bits on the wire; keep the full counter's high bits.
    eq.ci = (eq.pi & !0xFF_FFFF) | ci;
    if eq.ci.wrapping_sub(eq.pi) < 1 << 23 && eq.ci != eq.pi {
        eq.ci = eq.ci.wrapping_sub(1 << 24);
    }
    if arm {
        eq.armed = true;
        // Arming with unconsumed EQEs interrupts at once.
        if eq.ci != eq.pi {
            eq.armed = false;
            signal(sh, eq.intr);
        }
    }
}

/// Marks the doorbell words of UAR `uar` empty (at ALLOC_UAR).
pub(crate) fn clear_doorbells(sh: &Shared, uar: u32) {
    let base = uar as usize * UAR_SIZE;
    sh.bar.write_be32(base + EQ_DOORBELL_ARM, DB_EMPTY);
    sh.bar.write_be32(base + EQ_DOORBELL_NOARM, DB_EMPTY);
}

#[cfg(test)]
mod doorbell_tests {
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    use crate::layout::BufMut;
    use crate::layout::cmd::{CmdStatus, Opcode};
    use crate::layout::cmds::{CreateEqIn, CreateEqOut};
    use crate::layout::eqc::Eqc;
    use crate::layout::eqe::EventType;
    use crate::layout::uar::{EQ_DOORBELL_ARM, UAR_SIZE, eq_doorbell_word};
    use crate::model::tests::{Rig, header, model};

    /// Linux arms its command, async and page EQs through the same UAR word, one write
    /// after the other: each write that reaches the model as one access arms its own EQ.
    #[test]
    fn arms_of_two_eqs_through_one_word_both_count() {
        let hca = model(70);
        let mut r = Rig::new(&hca);
        let mem = r.alloc(4096);
        let mut i = header(Opcode::CreateEq, 0x110 + 8);
        {
            let mut c = Eqc::new_unchecked(&mut i[CreateEqIn::<()>::EQ_CONTEXT_ENTRY..]);
            c.set_log_eq_size(6);
            c.set_uar_page(r.uar);
            c.set_intr(1);
        }
        i[0x58 + 6] = 1 << (u8::from(EventType::PortChange) - 8); // event 9
        i.write_be64(0x110, mem.iova);
        let (st, _, out) = r.cmd(&i, 16);
        assert_eq!(st, CmdStatus::Ok);
        let second = CreateEqOut::new_unchecked(&out[..]).eq_number();
        let fds: Vec<EventFd> = (0..2)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        for (v, fd) in fds.iter().enumerate() {
            hca.set_irq(v as u32, Some(fd.try_clone().unwrap()))
                .unwrap();
        }
        let word = r.uar as usize * UAR_SIZE + EQ_DOORBELL_ARM;
        for eqn in [r.eqn, second] {
            let w = eq_doorbell_word(eqn, 0).to_be_bytes();
            assert!(hca.doorbell_write(word, &w));
        }
        hca.inject_event(EventType::CqError, 0, &[0; 28]);
        hca.inject_event(EventType::PortChange, 4, &[0; 28]);
        assert_eq!(fds[0].read().unwrap(), 1, "the first EQ was armed");
        assert_eq!(fds[1].read().unwrap(), 1, "the second EQ was armed");
        // Anything else is no doorbell taken this way: a CQ doorbell, a UAR not allocated.
        assert!(!hca.doorbell_write(r.uar as usize * UAR_SIZE + 0x20, &[0; 4]));
        assert!(!hca.doorbell_write((r.uar as usize + 5) * UAR_SIZE + EQ_DOORBELL_ARM, &[0; 4]));
        assert!(!hca.doorbell_write(word, &[0; 8]));
    }
}

//! A send ring and a CQ over real DMA memory with a stand-in device that completes every
//! WQE at once: the driver's own cost per post and per polled CQE, without a device thread
//! in the measurement (benchmarks, `cargo bench -p uhca`).
//!
//! The stand-in writes CQEs exactly as §9.7 says (body, then `op_own` with the owner bit of
//! the pass), so polling runs the same code as against the model or hardware.

use std::sync::Arc;

use uhca_layout::cqe::{CQE_SIZE, Cqe, CqeOpcode, OP_OWN_OFFSET, cqe_owner_for};
use uhca_layout::uar::QP_DBR_SND;
use uhca_layout::wqe::WqeOpcode;

use super::cq::{Completion, CqRing, Poll, PollError, QpRegistry};
use super::ring::RingSize;
use super::shadow::WqShadow;
use super::sq::{Doorbell, SendRing, SqMem};
use super::wqe::{PostError, Remote, Sge};
use super::wr::{Local, SendFlags, SendOp, SendWr};
use crate::dma::{DmaRecord, DmaSpace};
use crate::pci::null::NullFunction;
use crate::pci::{Bar, PciError, PciFunction};
use crate::resource::qp::{SendLimits, post_wr};

const QPN: u32 = 0x42;
const LOG: u32 = 10;
/// The rig's QP takes one element and no inline data (`QpConfig`'s defaults but inline).
const LIMITS: SendLimits = SendLimits {
    max_sge: 1,
    max_inline: 0,
};

/// Rings on DMA memory of a device-less PCI function ([`NullFunction`]).
pub struct Rig {
    sq: SendRing,
    shadow: Arc<WqShadow>,
    db: Doorbell,
    cq: CqRing,
    /// WQE counters posted and not yet completed by the stand-in: `[done, head)` (every
    /// WQE of the rig is one basic block).
    done: u32,
    cq_pi: u32,
    _f: Arc<NullFunction>,
}

/// Why the rig could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    /// The model function failed.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// DMA memory failed.
    #[error(transparent)]
    Dma(#[from] crate::dma::DmaError),
    /// A ring did not fit its memory (a bug of the rig).
    #[error("ring does not fit its memory")]
    Geometry,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig").field("done", &self.done).finish()
    }
}

impl Rig {
    /// A rig with 1024-block send ring and 1024-entry CQ.
    pub fn new() -> Result<Rig, RigError> {
        let f = Arc::new(NullFunction::default());
        let pf: Arc<dyn PciFunction> = f.clone();
        let bar = Bar::map(&pf, 0)?;
        let space = DmaSpace::new(pf);
        let size = RingSize::new(1 << LOG, 15).expect("power of two");
        let shadow = Arc::new(WqShadow::new(
            QPN,
            size,
            RingSize::new(16, 15).expect("pow2"),
        ));
        let reg = Arc::new(QpRegistry::default());
        reg.add(&shadow);
        let cq_buf = space.alloc((CQE_SIZE << LOG) + 64)?;
        let mut cq =
            CqRing::new(Arc::new(cq_buf), size, CQE_SIZE << LOG, reg).ok_or(RigError::Geometry)?;
        cq.refresh();
        let sq_buf = Arc::new(space.alloc((64 << LOG) + 64)?);
        let sq_dbr =
            DmaRecord::new(sq_buf.clone(), (64 << LOG) + QP_DBR_SND).ok_or(RigError::Geometry)?;
        let sq_mem = SqMem::new(sq_buf, 0, LOG).ok_or(RigError::Geometry)?;
        Ok(Rig {
            sq: SendRing::new(sq_mem, sq_dbr, QPN),
            shadow,
            db: Doorbell {
                bar,
                bf_reg: 3 * 4096 + 0x800 + 2 * 512,
                bf_half: 256,
                bf_off: 0,
            },
            cq,
            done: 0,
            cq_pi: 0,
            _f: f,
        })
    }

    /// Posts a signaled one-SGE RDMA WRITE (no doorbell) of a fixed element to a fixed
    /// remote buffer (constants the compiler may fold into the WQE words; see
    /// [`post_write_to`](Self::post_write_to) for run-time operands).
    #[inline]
    pub fn post_write(&mut self, wr_id: u64) -> Result<(), PostError> {
        let sge = Sge {
            addr: 0x1000,
            len: 64,
            lkey: 0x100,
        };
        let remote = Remote {
            addr: 0x2000,
            rkey: 0x200,
        };
        self.post_write_to(wr_id, &sge, remote)
    }

    /// Posts a signaled RDMA WRITE of `sge` to `remote` (no doorbell) through the code of
    /// [`Qp::post_send`](crate::resource::Qp::post_send) after its state check.
    #[inline]
    pub fn post_write_to(
        &mut self,
        wr_id: u64,
        sge: &Sge,
        remote: Remote,
    ) -> Result<(), PostError> {
        let wr = SendWr {
            wr_id,
            op: SendOp::Write {
                local: Local::Sges(std::slice::from_ref(sge)),
                remote,
            },
            flags: SendFlags::SIGNALED,
        };
        post_wr(&mut self.sq, &self.shadow, LIMITS, &wr)
    }

    /// Publishes the posted WQEs (doorbell record, then doorbell or BlueFlame).
    #[inline]
    pub fn ring_doorbell(&mut self) {
        self.sq.ring_doorbell(&self.shadow, &mut self.db);
    }

    /// The stand-in device: one REQ CQE per posted WQE, at once.
    pub fn complete_all(&mut self) {
        let s = self.cq.region().slice();
        let head = self.sq.head();
        while self.done != head {
            let idx = self.done as u16;
            self.done = self.done.wrapping_add(1);
            let mut e = [0u8; CQE_SIZE];
            {
                let mut c = Cqe::new_unchecked(&mut e[..]);
                c.set_qpn(QPN);
                c.set_wqe_counter(idx.into());
                c.set_sop(u8::from(WqeOpcode::RdmaWrite).into());
            }
            let off = (self.cq_pi as usize & ((1 << LOG) - 1)) * CQE_SIZE;
            s.write(off, &e[..OP_OWN_OFFSET]);
            s.write_u8(
                off + OP_OWN_OFFSET,
                (u8::from(CqeOpcode::Req) << 4) | cqe_owner_for(self.cq_pi, LOG),
            );
            self.cq_pi += 1;
        }
    }

    /// The completions available now.
    #[inline]
    pub fn poll(&mut self) -> Poll<'_> {
        Poll::new(&mut self.cq)
    }

    /// Fuzzing (feature `fuzzing`): writes `cqe` as the next entry the device produces,
    /// the body first and `op_own` last, with the owner bit of the producer's pass unless
    /// `stale` (then the previous pass's: an entry the poller must not take).
    #[cfg(feature = "fuzzing")]
    pub fn fuzz_write_cqe(&mut self, cqe: &[u8; CQE_SIZE], stale: bool) {
        let s = self.cq.region().slice();
        let off = (self.cq_pi as usize & ((1 << LOG) - 1)) * CQE_SIZE;
        s.write(off, &cqe[..OP_OWN_OFFSET]);
        let owner = cqe_owner_for(self.cq_pi, LOG) ^ u8::from(stale);
        s.write_u8(off + OP_OWN_OFFSET, (cqe[OP_OWN_OFFSET] & !1) | owner);
        if !stale {
            self.cq_pi = self.cq_pi.wrapping_add(1);
        }
    }

    /// WQEs posted so far (the send producer counter).
    #[cfg(feature = "fuzzing")]
    pub fn fuzz_posted(&self) -> u32 {
        self.sq.head()
    }

    /// One completion, if any (publishes the consumer index).
    #[inline]
    pub fn poll_one(&mut self) -> Option<Result<Completion, PollError>> {
        self.poll().next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rig_posts_completes_and_polls_in_order() {
        let mut r = Rig::new().unwrap();
        for round in 0..3u64 {
            for i in 0..700 {
                r.post_write(round * 1000 + i).unwrap();
            }
            r.ring_doorbell();
            r.complete_all();
            let ids: Vec<u64> = r.poll().map(|c| c.unwrap().wr_id).collect();
            assert_eq!(ids, (0..700).map(|i| round * 1000 + i).collect::<Vec<_>>());
        }
        assert!(r.poll_one().is_none());
    }
}

//! Event queue rings (prm-subset.md §7.1, §9.3, §9.8).

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use uhca_layout::eqe::{EQE_SIZE, eqe_is_sw_owned};
use uhca_layout::uar::{EQ_DOORBELL_ARM, EQ_DOORBELL_NOARM, UAR_SIZE, eq_doorbell_word};

use crate::dma::{DmaError, DmaRegion, DmaSpace};
use crate::pci::{Bar, Iova};

/// An EQ buffer in DMA memory with its software consumer index.
///
/// Entries are copied out (shadowed) before they are parsed: the device owns the ring.
#[derive(Debug)]
pub struct EqRing {
    region: DmaRegion,
    log_size: u32,
    ci: u32,
    eqn: u32,
    uar: u32,
}

impl EqRing {
    /// Allocates a ring of `2^log_size` entries with every owner bit set to 1 (§9.4).
    pub fn new(space: &Arc<DmaSpace>, log_size: u32) -> Result<EqRing, DmaError> {
        let region = space.alloc(EQE_SIZE << log_size)?;
        let s = region.slice();
        for i in 0..(1usize << log_size) {
            s.write_u8(i * EQE_SIZE + 0x3f, 1);
        }
        Ok(EqRing {
            region,
            log_size,
            ci: 0,
            eqn: 0,
            uar: 0,
        })
    }

    /// The 4 KiB pages of the buffer, for CREATE_EQ's `pas`.
    pub fn pages(&self) -> Vec<Iova> {
        (0..self.region.len().div_ceil(4096))
            .map(|i| self.region.iova().add(i as u64 * 4096))
            .collect()
    }

    /// log2 of the number of entries.
    pub fn log_size(&self) -> u32 {
        self.log_size
    }

    /// Records the EQ number and UAR the device assigned.
    pub fn attach(&mut self, eqn: u32, uar: u32) {
        self.eqn = eqn;
        self.uar = uar;
    }

    /// EQ number.
    pub fn eqn(&self) -> u32 {
        self.eqn
    }

    /// The next software-owned entry, copied out, advancing the consumer index.
    pub fn next_event(&mut self) -> Option<[u8; EQE_SIZE]> {
        let mask = (1u32 << self.log_size) - 1;
        let slot = self
            .region
            .sub(((self.ci & mask) as usize) * EQE_SIZE, EQE_SIZE);
        if !eqe_is_sw_owned(slot.read_u8(0x3f), self.ci, self.log_size) {
            return None;
        }
        fence(Ordering::Acquire); // rmb_after_owner: entry body after the owner byte
        let mut e = [0u8; EQE_SIZE];
        slot.read(0, &mut e);
        self.ci = self.ci.wrapping_add(1);
        Some(e)
    }

    /// Tells the device how far we consumed, re-arming the EQ if `arm`.
    pub fn update_ci(&self, bar: &Bar, arm: bool) {
        let off = self.uar as usize * UAR_SIZE
            + if arm {
                EQ_DOORBELL_ARM
            } else {
                EQ_DOORBELL_NOARM
            };
        fence(Ordering::SeqCst); // entries consumed before the index is published
        bar.write32_be(off, eq_doorbell_word(self.eqn, self.ci));
        bar.doorbell_rung();
    }
}

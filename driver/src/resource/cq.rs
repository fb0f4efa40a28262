//! Completion queues (prm-subset.md §6.5 CREATE_CQ/DESTROY_CQ, §7.2 `cqc`, §9.3 arming,
//! §9.7 CQEs).
//!
//! A [`Cq`] is polled by one thread at a time (`&mut self`, no lock): [`Cq::poll`] yields
//! the completions available now and publishes the consumer index once per batch. CQs that
//! want to sleep are created with [`CqConfig::events`]: they get their own completion EQ,
//! MSI-X vector and eventfd, and [`Cq::req_notify`] + [`Cq::wait`] block until the device
//! posts a completion event. Polled-only CQs share one never-armed completion EQ per device.
//!
//! Thread contract: `Cq` is `Send` (move it to the polling thread) but not shareable for
//! polling; the firmware object lives until the `Cq` and every QP using it are dropped.

#![deny(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use uhca_layout::caps::CmdHcaCap;
use uhca_layout::cmds::{MODIFY_CQ_COUNT, MODIFY_CQ_PERIOD, MODIFY_CQ_PERIOD_MODE};
use uhca_layout::cqc::{CQ_PERIOD_FROM_CQE, CQ_PERIOD_FROM_EQE, Cqc};
use uhca_layout::cqe::CQE_SIZE;
use uhca_layout::eqe::{EqeComp, EventType};
use uhca_layout::uar::{CQ_DBR_ARM, CQ_DOORBELL, UAR_SIZE, cq_arm_word};
use vmm_sys_util::epoll::EpollEvent;

use super::comp_eq::CompEq;
use super::queue_error::QueueError;
use crate::cmd::queue_ops;
use crate::datapath::cq::{CqRing, Poll, QpRegistry};
use crate::datapath::ring::RingSize;
use crate::device::DeviceInner;
use crate::dma::DmaRegion;
use crate::handle::Device;
use crate::pci::Iova;

/// Options of [`Device::create_cq`].
#[derive(Clone, Copy, Debug)]
pub struct CqConfig {
    /// Minimum number of CQEs (rounded up to a power of two).
    pub entries: u32,
    /// Give the CQ its own completion EQ and eventfd, for [`Cq::wait`].
    pub events: bool,
}

impl Default for CqConfig {
    fn default() -> Self {
        CqConfig {
            entries: 256,
            events: false,
        }
    }
}

/// The CQ's error status as the device reports it (`cqc.status`, prm-subset.md §7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqStatus {
    /// 0: no error.
    Ok,
    /// 0x9: the CQ overran (CQ_OVERFLOW).
    Overflow,
    /// 0xA: a CQE could not be written (CQ_WRITE_FAIL).
    WriteFail,
    /// Any other value.
    Other(u8),
}

/// The CQ's arming state (`cqc.st`, prm-subset.md §7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqArmState {
    /// 0x6: armed for the next solicited (or error) completion.
    Solicited,
    /// 0x9: armed for the next completion.
    Armed,
    /// 0xA: not armed (the event fired, or the CQ was never armed).
    Fired,
    /// Any other value.
    Other(u8),
}

/// What QUERY_CQ reports about a CQ ([`Cq::query`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqInfo {
    /// Number of CQEs (`2^log_cq_size`).
    pub entries: u32,
    /// Consumer counter (24 bits): CQEs the driver has consumed, from the doorbell record.
    pub consumer_counter: u32,
    /// Producer counter (24 bits): CQEs the device has written.
    pub producer_counter: u32,
    /// Error status.
    pub status: CqStatus,
    /// Arming state.
    pub arm: CqArmState,
    /// Moderation period (`cq_period`, 12 bits; 0 = off).
    pub period: u16,
    /// Moderation count (`cq_max_count`; 0 = off).
    pub max_count: u16,
    /// Where the moderation period starts (`cq_period_mode`).
    pub period_mode: CqPeriodMode,
    /// Overrun ignore (`oi`).
    pub overrun_ignore: bool,
}

/// Where a CQ's moderation period starts (`cq_period_mode`; Linux's DIM calls the two
/// "EQE" and "CQE" modes). Either way the count, when set, raises the event as soon as that
/// many CQEs are held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CqPeriodMode {
    /// From the CQ's last completion event: events come at most once a period, and a CQE
    /// after a longer quiet raises its event at once. The device's default.
    #[default]
    FromEvent,
    /// From the last CQE: every CQE restarts the period, so during a burst only the count
    /// raises events, and the event comes a period after the burst ends.
    FromCqe,
}

/// The firmware CQ; QPs keep it alive (a CQ is destroyed after the QPs that use it).
#[derive(Debug)]
pub(crate) struct CqObj {
    pub(crate) cqn: u32,
    pub(crate) dev: Arc<DeviceInner>,
    pub(crate) registry: Arc<QpRegistry>,
    /// The CQE ring and doorbell record: freed only after the firmware CQ is gone.
    buf: Arc<DmaRegion>,
    eq: Arc<CompEq>,
}

impl Drop for CqObj {
    fn drop(&mut self) {
        if self.dev.is_open()
            && let Err(e) = queue_ops::destroy_cq(&*self.dev, self.cqn)
        {
            // The device may still write CQEs: keep the memory (leak) rather than free it
            // under the device.
            tracing::warn!(cqn = self.cqn, error = %e, "DESTROY_CQ failed; leaking its buffer");
            std::mem::forget(self.buf.clone());
        }
        let _ = &self.eq; // the EQ goes after the CQ that names it
    }
}

/// A completion queue. See the module docs for the threading contract.
#[derive(Debug)]
pub struct Cq {
    ring: CqRing,
    /// Completion events seen (the arm sequence number is this mod 4, §9.3).
    events_seen: u32,
    obj: Arc<CqObj>,
}

/// Byte offset of the doorbell record after `entries` CQEs.
fn dbr_offset(size: RingSize) -> usize {
    size.entries() as usize * CQE_SIZE
}

impl Device {
    /// Creates a completion queue (prm-subset.md §6.5, §7.2).
    pub fn create_cq(&self, cfg: &CqConfig) -> Result<Cq, QueueError> {
        let dev = &self.inner;
        if dev.is_lost() {
            return Err(QueueError::DeviceLost);
        }
        if !dev.is_open() {
            return Err(QueueError::Closed);
        }
        let log_max = CmdHcaCap::new_unchecked(&self.caps().general[..]).log_max_cq_sz();
        let want = cfg.entries.max(2).checked_next_power_of_two().unwrap_or(0);
        let size = RingSize::new(want, log_max).ok_or(QueueError::Size {
            what: "CQ entries",
            requested: cfg.entries,
            log_max,
        })?;
        let eq = if cfg.events {
            self.comp_eqs.with_events(dev)?
        } else {
            self.comp_eqs.shared(dev)?
        };
        let dbr = dbr_offset(size);
        let buf = Arc::new(dev.dma.alloc(dbr + 64)?);
        let registry = Arc::new(QpRegistry::default());
        let ring = CqRing::new(buf.clone(), size, dbr, registry.clone())
            .ok_or(QueueError::Config("CQ ring does not fit its buffer"))?;
        let region = ring.region();
        let pages: Vec<Iova> = (0..region.len().div_ceil(4096))
            .map(|i| region.iova().add(i as u64 * 4096))
            .collect();
        let uar = *dev.driver_uar.get().ok_or(QueueError::Closed)?;
        let eqn = eq.eqn();
        let dbr_iova = region.iova().add(dbr as u64).0;
        let cqn = queue_ops::create_cq(&**dev, &pages, |c| {
            c.set_cqe_sz(0); // 64-byte CQEs
            c.set_log_cq_size(size.log());
            c.set_uar_page(uar);
            c.set_c_eqn_or_apu_element(eqn);
            c.set_log_page_size(0); // 4 KiB pages
            c.set_page_offset(0);
            c.set_dbr_addr(dbr_iova);
        })?;
        Ok(Cq {
            ring,
            events_seen: 0,
            obj: Arc::new(CqObj {
                cqn,
                dev: dev.clone(),
                registry,
                buf,
                eq,
            }),
        })
    }
}

impl Cq {
    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.obj.cqn
    }

    /// Number of CQEs.
    pub fn entries(&self) -> u32 {
        1 << self.ring_log()
    }

    fn ring_log(&self) -> u32 {
        (self.ring.dbr_offset() / CQE_SIZE).trailing_zeros()
    }

    pub(crate) fn obj(&self) -> &Arc<CqObj> {
        &self.obj
    }

    /// QUERY_CQ: the device's view of this CQ (size, counters, status, arming, moderation).
    pub fn query(&self) -> Result<CqInfo, QueueError> {
        if !self.obj.dev.is_open() {
            return Err(QueueError::Closed);
        }
        let raw = queue_ops::query_cq(&*self.obj.dev, self.obj.cqn)?;
        let c = Cqc::new_unchecked(&raw[..]);
        Ok(CqInfo {
            entries: 1 << c.log_cq_size(),
            consumer_counter: c.consumer_counter(),
            producer_counter: c.producer_counter(),
            status: match c.status() {
                0 => CqStatus::Ok,
                0x9 => CqStatus::Overflow,
                0xA => CqStatus::WriteFail,
                v => CqStatus::Other(v as u8),
            },
            arm: match c.st() {
                0x6 => CqArmState::Solicited,
                0x9 => CqArmState::Armed,
                0xA => CqArmState::Fired,
                v => CqArmState::Other(v as u8),
            },
            period: c.cq_period() as u16,
            max_count: c.cq_max_count() as u16,
            // 2 and 3 are not defined; the device refuses them.
            period_mode: if c.cq_period_mode() == CQ_PERIOD_FROM_CQE {
                CqPeriodMode::FromCqe
            } else {
                CqPeriodMode::FromEvent
            },
            overrun_ignore: c.oi() != 0,
        })
    }

    /// MODIFY_CQ: sets the completion-event moderation (`cq_period` in µs up to 4095,
    /// `cq_max_count`; 0 and 0 turn it off): an armed CQ's event waits until that many CQEs
    /// are held or the period is over ([`CqPeriodMode`] says from when). Turning it off
    /// raises an event held meanwhile.
    pub fn modify_moderation(&mut self, period: u16, count: u16) -> Result<(), QueueError> {
        if period > 0xFFF {
            return Err(QueueError::Config("CQ moderation period above 4095"));
        }
        if !self.obj.dev.is_open() {
            return Err(QueueError::Closed);
        }
        queue_ops::modify_cq(
            &*self.obj.dev,
            self.obj.cqn,
            MODIFY_CQ_PERIOD | MODIFY_CQ_COUNT,
            |c| {
                c.set_cq_period(u32::from(period));
                c.set_cq_max_count(u32::from(count));
            },
        )?;
        Ok(())
    }

    /// MODIFY_CQ: sets where the moderation period starts (`cq_period_mode`).
    pub fn modify_period_mode(&mut self, mode: CqPeriodMode) -> Result<(), QueueError> {
        if !self.obj.dev.is_open() {
            return Err(QueueError::Closed);
        }
        let raw = match mode {
            CqPeriodMode::FromEvent => CQ_PERIOD_FROM_EQE,
            CqPeriodMode::FromCqe => CQ_PERIOD_FROM_CQE,
        };
        queue_ops::modify_cq(&*self.obj.dev, self.obj.cqn, MODIFY_CQ_PERIOD_MODE, |c| {
            c.set_cq_period_mode(raw)
        })?;
        Ok(())
    }

    /// The completions available now, as an iterator (no syscall, lock or allocation).
    /// Dropping the iterator publishes the consumer index (§9.7). Items are `Err` only for
    /// CQEs the device should never have written; those are consumed and reported.
    #[inline]
    pub fn poll(&mut self) -> Poll<'_> {
        Poll::new(&mut self.ring)
    }

    /// Arms the CQ (§9.3): the next completion (or the next solicited one) posts an event
    /// to the CQ's EQ. Poll once more after arming: a completion that arrived before the
    /// arm raises no event.
    pub fn req_notify(&mut self, solicited_only: bool) {
        let word = cq_arm_word(self.events_seen, solicited_only, self.ring.ci());
        let s = self.ring.region().slice();
        s.store_be32(self.ring.dbr_offset() + CQ_DBR_ARM, word);
        crate::barrier::wmb_before_doorbell(); // arm record before the doorbell
        let uar = self.obj.dev.driver_uar.get().copied().unwrap_or(0);
        let mut db = [0u8; 8];
        db[..4].copy_from_slice(&word.to_be_bytes());
        db[4..].copy_from_slice(&self.obj.cqn.to_be_bytes());
        self.obj
            .dev
            .bar
            .write64_raw(uar as usize * UAR_SIZE + CQ_DOORBELL, db);
        self.obj.dev.bar.doorbell_rung();
    }

    /// Blocks until the device posts a completion event for this CQ (after
    /// [`req_notify`](Self::req_notify)) or `timeout` passes. Returns whether an event came.
    /// Only for CQs created with [`CqConfig::events`].
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool, QueueError> {
        let eq = self.obj.eq.clone();
        let Some((_, fd, ep)) = &eq.irq else {
            return Err(QueueError::NoEvents);
        };
        // The wait is cut into slices of at most the health interval, each preceded by a
        // health check, so a device lost meanwhile ends it with `DeviceLost`, not a hang.
        let slice = self
            .obj
            .dev
            .config
            .health_interval
            .max(Duration::from_millis(1));
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if self.obj.dev.is_lost() || self.obj.dev.check_health().is_err() {
                return Err(QueueError::DeviceLost);
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            let ms = left
                .unwrap_or(slice)
                .min(slice)
                .as_millis()
                .min(i32::MAX as u128) as i32;
            let got = {
                let mut ring = eq.ring.lock().unwrap_or_else(|e| e.into_inner());
                let mut got = 0;
                while let Some(e) = ring.next_event() {
                    let cqn = EqeComp::new_unchecked(&e[..]).cqn();
                    if EventType::from(e[1]) == EventType::Comp && cqn == self.obj.cqn {
                        got += 1;
                    }
                }
                ring.update_ci(&self.obj.dev.bar, true);
                got
            };
            if got > 0 {
                self.events_seen = self.events_seen.wrapping_add(got);
                return Ok(true);
            }
            let mut evs = [EpollEvent::default()];
            let n = loop {
                match ep.wait(ms, &mut evs) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r.map_err(QueueError::Io)?,
                }
            };
            if n == 0 {
                if left.is_some_and(|l| l.as_millis() <= ms as u128) {
                    return Ok(false);
                }
                continue;
            }
            let _ = fd.read(); // non-blocking: clears the counter
        }
    }
}

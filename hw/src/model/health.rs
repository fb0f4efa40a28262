//! Init-segment registers the firmware owns (prm-subset.md §2): revision, command queue
//! geometry, `initializing`, timeouts, the free-running timer, the health counter and the
//! health buffer.

use std::time::Instant;

use crate::layout::init_seg::{HealthBuffer, InitSeg, encode_timeout_ms, reg};

use super::Shared;
use super::mem::BarMem;

/// `cmd_interface_rev` Linux and rdma-core require.
pub(crate) const CMD_INTERFACE_REV: u32 = 5;
/// `log_cmdq_size`: 32 entries.
pub(crate) const LOG_CMDQ_SIZE: u32 = 5;
/// `log_cmdq_stride`: 64 bytes per entry.
pub(crate) const LOG_CMDQ_STRIDE: u32 = 6;
/// The read-only low byte of `cmdq_addr_l_sz`.
pub(crate) const CMDQ_SZ_BYTE: u32 = (LOG_CMDQ_SIZE << 4) | LOG_CMDQ_STRIDE;
/// `cmd_exec_to` the model reports (ms).
pub(crate) const CMD_EXEC_TO_MS: u32 = 60_000;
/// `cmd_q_init_to` the model reports (ms).
pub(crate) const CMD_Q_INIT_TO_MS: u32 = 2_000;
/// Health buffer `fw_ver` (any value but all-ones, which means "link dead").
pub(crate) const HEALTH_FW_VER: u32 = 0x0010_0023;
/// Health buffer `hw_id` (ConnectX-5 device id).
pub(crate) const HEALTH_HW_ID: u32 = 0x0000_020d;
/// `initializing` word bit 31.
const INITIALIZING_BIT: u32 = 1 << 31;

/// Writes the power-on init segment: clears it, sets revisions, geometry, timeouts,
/// health buffer, and raises `initializing` for `boot_delay`.
pub(crate) fn power_on(sh: &Shared) {
    let bar = &sh.bar;
    bar.zero(0, reg::INIT_SEG_SIZE.next_multiple_of(4));
    let mut seg = InitSeg::new_unchecked(bar.window(0, reg::INIT_SEG_SIZE));
    let (maj, min, sub) = sh.cfg.fw_rev;
    seg.set_fw_rev_major(maj.into());
    seg.set_fw_rev_minor(min.into());
    seg.set_cmd_interface_rev(CMD_INTERFACE_REV);
    seg.set_fw_rev_subminor(sub.into());
    seg.set_cmdq_addr_l_sz(CMDQ_SZ_BYTE);
    seg.set_cmd_exec_to(encode_timeout_ms(CMD_EXEC_TO_MS));
    seg.set_cmd_q_init_to(encode_timeout_ms(CMD_Q_INIT_TO_MS));
    let mut hb = HealthBuffer::new_unchecked(bar.window(reg::HEALTH_BUFFER, 64));
    hb.set_fw_ver(HEALTH_FW_VER);
    hb.set_hw_id(HEALTH_HW_ID);
    let done = sh.now_ns() + sh.cfg.boot_delay.as_nanos() as u64;
    sh.boot_done_ns
        .store(done, std::sync::atomic::Ordering::Release);
    if !sh.cfg.boot_delay.is_zero() {
        bar.write_be32(reg::INITIALIZING, INITIALIZING_BIT);
    }
}

/// Sets the health buffer syndrome (and `rfr` when non-zero).
pub(crate) fn set_syndrome(bar: &BarMem, synd: u8) {
    let mut hb = HealthBuffer::new_unchecked(bar.window(reg::HEALTH_BUFFER, 64));
    hb.set_synd(synd.into());
    hb.set_rfr(u32::from(synd != 0));
    hb.set_valid(u32::from(synd != 0));
}

/// The device thread's health clock.
pub(crate) struct Health {
    counter: u32,
    next_tick: Instant,
}

impl Health {
    pub(crate) fn new() -> Health {
        Health {
            counter: 0,
            next_tick: Instant::now(),
        }
    }

    /// Advances the timer, the health counter (every `health_period` unless stalled), drops
    /// `initializing` after the boot delay and re-asserts the read-only queue geometry bits.
    /// Returns the time until the next health event, for the idle sleep.
    pub(crate) fn tick(&mut self, sh: &Shared) -> std::time::Duration {
        let bar = &sh.bar;
        // One clock read per tick: the timer is derived from the same instant.
        let now = Instant::now();
        let now_ns = now.saturating_duration_since(sh.epoch).as_nanos() as u64;
        // Free-running timer in ns (device_frequency_khz = 1 GHz in caps.rs). Written low
        // then high; Linux reads h, l, h and retries when h changed.
        bar.write_be32(reg::INTERNAL_TIMER_L, now_ns as u32);
        bar.write_be32(reg::INTERNAL_TIMER_H, (now_ns >> 32) as u32);
        if bar.read_be32(reg::INITIALIZING) & INITIALIZING_BIT != 0
            && now_ns >= sh.boot_done_ns.load(std::sync::atomic::Ordering::Acquire)
        {
            bar.write_be32(reg::INITIALIZING, 0);
        }
        // The driver writes address bits over the whole word; keep [7:0] reading 5/6.
        let l = bar.read_be32(reg::CMDQ_ADDR_L_SZ);
        if l & 0xFF != CMDQ_SZ_BYTE {
            bar.cmpxchg_be32(reg::CMDQ_ADDR_L_SZ, l, (l & !0xFF) | CMDQ_SZ_BYTE);
        }
        if now >= self.next_tick {
            if !sh.faults.health_stalled() {
                self.counter = (self.counter + 1) & 0xFF_FFFF;
                let synd = bar.read_be32(reg::HEALTH_SYND) >> 16 & 0xFF;
                bar.write_be32(reg::HEALTH_COUNTER, (synd << 24) | self.counter);
            }
            self.next_tick = now + sh.cfg.health_period;
        }
        self.next_tick.saturating_duration_since(now)
    }
}

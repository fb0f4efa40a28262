//! The command interface (prm-subset.md §3): a 32-entry queue in host memory, mailbox
//! chains for long messages, doorbells through BAR0.
//!
//! All regular slots (0..=30) are usable at once from any number of threads; a caller owns
//! one slot from posting to completion, so results always reach the thread that asked.
//! The last slot is kept for firmware-page commands, so a page request can always be
//! answered even while every regular slot waits on the device.
//!
//! Completion is detected by polling the entry's ownership bit. While waiting, the caller
//! runs a hook (the device uses it to service its control EQ and check health), so a
//! stalled or dead device turns into an error, never a hang.

mod mailbox;
pub mod ops;
pub mod queue_ops;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering, fence};
use std::time::{Duration, Instant};

use uhca_layout::Buf;
use uhca_layout::cmd::{
    CMD_XPORT, CmdEntry, CmdStatus, DeliveryStatus, InHeader, OWN_HW, Opcode, OutHeader,
    mailbox_blocks,
};
use uhca_layout::init_seg::reg;

use crate::dma::{DmaError, DmaRegion, DmaSpace};
use crate::pci::Bar;
use mailbox::MailboxChain;

/// Mailbox blocks preallocated per slot and direction: enough for a 4 KiB capability page
/// (QUERY_HCA_CAP / SET_HCA_CAP, 4112 bytes = 8 blocks). Longer messages get a chain of
/// their own for the one command.
const PREALLOC_BLOCKS: usize = 8;

/// Errors of the command interface. [`CmdError::Failed`] keeps what identifies a firmware
/// refusal exactly: opcode, op_mod, status and syndrome.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// The device executed the command and refused it.
    #[error("{opcode:?} (op_mod {op_mod:#x}) failed: status {status:?}, syndrome {syndrome:#010x}")]
    Failed {
        /// Command opcode.
        opcode: Opcode,
        /// Command op_mod.
        op_mod: u16,
        /// Output status byte.
        status: CmdStatus,
        /// Output syndrome.
        syndrome: u32,
    },
    /// The device could not deliver the command (bad mailbox, token, length...).
    #[error("{opcode:?} not delivered: {status:?}")]
    Delivery {
        /// Command opcode.
        opcode: Opcode,
        /// Delivery status from `status_own`.
        status: DeliveryStatus,
    },
    /// The device did not complete the command in time.
    #[error("{opcode:?} timed out after {after:?}")]
    Timeout {
        /// Command opcode.
        opcode: Opcode,
        /// How long we waited.
        after: Duration,
    },
    /// The device is dead or gone (health failure, surprise removal).
    #[error("device unusable: {0}")]
    DeviceDead(String),
    /// The input message is malformed (shorter than a command header).
    #[error("command input of {0} bytes is shorter than the 8-byte header")]
    ShortInput(usize),
    /// Command memory could not be allocated.
    #[error(transparent)]
    Dma(#[from] DmaError),
}

impl CmdError {
    /// The status and syndrome of a firmware refusal, if this is one.
    pub fn status(&self) -> Option<(CmdStatus, u32)> {
        match self {
            CmdError::Failed {
                status, syndrome, ..
            } => Some((*status, *syndrome)),
            _ => None,
        }
    }
}

/// Which slots a command may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotClass {
    /// Any regular slot.
    Regular,
    /// The slot reserved for firmware-page commands.
    Pages,
}

struct Slot {
    input: MailboxChain,
    output: MailboxChain,
}

/// The command queue of one device.
pub struct CmdIf {
    bar: Bar,
    space: Arc<DmaSpace>,
    queue: DmaRegion,
    stride: usize,
    slots: Vec<Slot>,
    /// Bit i set = regular slot i is free.
    free: AtomicU32,
    page_slot: Mutex<()>,
    token: AtomicU8,
    timeout: Duration,
    dead: AtomicBool,
    /// Run to completion while waiting ([`driving`](CmdIf::driving)).
    drive: bool,
}

impl std::fmt::Debug for CmdIf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmdIf")
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// Geometry and timeouts read from the init segment.
#[derive(Clone, Copy, Debug)]
pub struct CmdIfParams {
    /// log2 of the number of entries.
    pub log_size: u32,
    /// log2 of bytes per entry.
    pub log_stride: u32,
    /// Command execution timeout.
    pub timeout: Duration,
}

impl CmdIf {
    /// Allocates the queue and per-slot mailboxes and programs the queue address into
    /// BAR0 (prm-subset.md §2 "Firmware-ready wait" step 2: high word, then low word).
    pub fn new(bar: Bar, space: &Arc<DmaSpace>, p: CmdIfParams) -> Result<CmdIf, CmdError> {
        let n = 1usize << p.log_size;
        let queue = space.alloc(4096)?;
        // One region for every slot's preallocated chains (2 x 8 KiB per slot).
        let per_chain = PREALLOC_BLOCKS * uhca_layout::cmd::MAILBOX_ALIGN;
        let boxes = Arc::new(space.alloc(2 * n * per_chain)?);
        let slots = (0..n)
            .map(|i| Slot {
                input: MailboxChain::carve(&boxes, 2 * i * per_chain, PREALLOC_BLOCKS),
                output: MailboxChain::carve(&boxes, (2 * i + 1) * per_chain, PREALLOC_BLOCKS),
            })
            .collect();
        let regular = (n - 1) as u32;
        let free = if regular >= 32 {
            u32::MAX
        } else {
            (1u32 << regular) - 1
        };
        let iova = queue.iova().0;
        bar.write32_be(reg::CMDQ_ADDR_H, (iova >> 32) as u32);
        // nic_interface [10:8] = 0 (full driver); the low bits are read-only sizes.
        bar.write32_be(reg::CMDQ_ADDR_L_SZ, iova as u32 & 0xFFFF_F000);
        fence(Ordering::SeqCst);
        Ok(CmdIf {
            bar,
            space: space.clone(),
            queue,
            stride: 1 << p.log_stride,
            slots,
            free: AtomicU32::new(free),
            page_slot: Mutex::new(()),
            token: AtomicU8::new(0),
            timeout: p.timeout,
            dead: AtomicBool::new(false),
            drive: false,
        })
    }

    /// Run to completion (`on`): while a command is outstanding, the waiting thread makes
    /// the device's passes itself ([`PciFunction::drive`](crate::pci::PciFunction::drive):
    /// only a software device in this process does anything), so a command completes
    /// without a handoff to the device's own thread. Off by default.
    pub fn driving(mut self, on: bool) -> CmdIf {
        self.drive = on;
        self
    }

    /// Marks the interface dead: every later command fails at once.
    pub fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// Number of regular slots.
    pub fn regular_slots(&self) -> usize {
        self.slots.len() - 1
    }

    fn next_token(&self) -> u8 {
        // Linux: an 8-bit counter per command, skipping 0 (§3.3).
        loop {
            let t = self.token.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if t != 0 {
                return t;
            }
        }
    }

    fn acquire_regular(
        &self,
        wait: &mut dyn FnMut() -> Result<(), CmdError>,
    ) -> Result<usize, CmdError> {
        let mut spins = 0u32;
        loop {
            let f = self.free.load(Ordering::Acquire);
            if f != 0 {
                let bit = f.trailing_zeros();
                if self
                    .free
                    .compare_exchange_weak(f, f & !(1 << bit), Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return Ok(bit as usize);
                }
                continue;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                wait()?;
            }
            backoff(spins);
        }
    }

    /// Executes one command: `input` is the whole input message, `out_len` the output
    /// length to accept. Returns the output message (`out_len` bytes) on success.
    ///
    /// `wait` runs repeatedly while the command is outstanding; an error from it abandons
    /// the wait (the slot is then retired, since the device may still write to it).
    pub fn exec(
        &self,
        input: &[u8],
        out_len: usize,
        class: SlotClass,
        wait: &mut dyn FnMut() -> Result<(), CmdError>,
    ) -> Result<Vec<u8>, CmdError> {
        if input.len() < 8 {
            return Err(CmdError::ShortInput(input.len()));
        }
        let hdr = InHeader::new_unchecked(input);
        let opcode = Opcode::from(hdr.opcode() as u16);
        let op_mod = hdr.op_mod() as u16;
        if self.dead.load(Ordering::Acquire) {
            return Err(CmdError::DeviceDead(
                "the device was declared dead earlier".into(),
            ));
        }
        let out_len = out_len.max(16);
        let (slot, _page_guard) = match class {
            SlotClass::Regular => (self.acquire_regular(wait)?, None),
            SlotClass::Pages => {
                let g = self.page_slot.lock().unwrap_or_else(|e| e.into_inner());
                (self.slots.len() - 1, Some(g))
            }
        };
        let result = self.run_in_slot(slot, opcode, op_mod, input, out_len, wait);
        let retire = matches!(
            result,
            Err(CmdError::Timeout { .. } | CmdError::DeviceDead(_))
        );
        if class == SlotClass::Regular && !retire {
            self.free.fetch_or(1 << slot, Ordering::AcqRel);
        }
        result
    }

    fn run_in_slot(
        &self,
        slot: usize,
        opcode: Opcode,
        op_mod: u16,
        input: &[u8],
        out_len: usize,
        wait: &mut dyn FnMut() -> Result<(), CmdError>,
    ) -> Result<Vec<u8>, CmdError> {
        let token = self.next_token();
        let s = &self.slots[slot];
        // Long messages get a chain of their own for this command.
        let in_blocks = mailbox_blocks(input.len());
        let out_blocks = mailbox_blocks(out_len);
        let own_in;
        let in_chain = if in_blocks > s.input.capacity() {
            own_in = MailboxChain::new(&self.space, in_blocks)?;
            &own_in
        } else {
            &s.input
        };
        let own_out;
        let out_chain = if out_blocks > s.output.capacity() {
            own_out = MailboxChain::new(&self.space, out_blocks)?;
            &own_out
        } else {
            &s.output
        };
        let in_ptr = in_chain.write_message(&input[input.len().min(16)..], token);
        let out_ptr = out_chain.prepare_output(out_blocks, token);

        let entry = self.queue.sub(slot * self.stride, 64);
        let mut e = [0u8; 64];
        {
            let mut v = CmdEntry::new_unchecked(&mut e[..]);
            v.set_type(CMD_XPORT);
            v.set_inlen(input.len() as u32);
            v.set_in_ptr(in_ptr);
            let mut inl = [0u8; 16];
            let n = input.len().min(16);
            inl[..n].copy_from_slice(&input[..n]);
            v.set_in(&inl);
            v.set_out_ptr(out_ptr);
            v.set_outlen(out_len as u32);
            v.set_token(u32::from(token));
            v.set_status_own(0);
        }
        // Everything but the ownership byte first, then hand the entry to the device.
        entry.write(0, &e[..63]);
        fence(Ordering::Release); // wmb: entry and mailboxes before the ownership bit
        entry.write_u8(0x3f, OWN_HW);
        fence(Ordering::SeqCst); // wmb_before_doorbell: ownership visible before the ring
        self.bar.write32_be(reg::CMD_DBELL, 1 << slot);
        self.bar.doorbell_rung();

        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if entry.read_u8(0x3f) & OWN_HW == 0 {
                break;
            }
            spins += 1;
            if spins.is_multiple_of(32) {
                wait()?;
                if start.elapsed() > self.timeout {
                    return Err(CmdError::Timeout {
                        opcode,
                        after: start.elapsed(),
                    });
                }
            }
            if self.drive && self.bar.drive() {
                continue;
            }
            backoff(spins);
        }
        fence(Ordering::Acquire); // rmb_after_owner: output written before ownership returned
        let delivery = DeliveryStatus::from(entry.read_u8(0x3f) >> 1);
        if delivery != DeliveryStatus::Ok {
            return Err(CmdError::Delivery {
                opcode,
                status: delivery,
            });
        }
        let mut out = vec![0u8; out_len];
        entry.read(0x20, &mut out[..16]);
        out_chain.read_message(&mut out[16..], out_blocks);
        let oh = OutHeader::new_unchecked(&out[..]);
        let status = CmdStatus::from(oh.status() as u8);
        if status != CmdStatus::Ok {
            return Err(CmdError::Failed {
                opcode,
                op_mod,
                status,
                syndrome: oh.syndrome(),
            });
        }
        Ok(out)
    }

    /// Reads the BAR0 health counter word (for the health monitor).
    pub fn bar(&self) -> &Bar {
        &self.bar
    }
}

/// Polling back-off: spin first, then yield, then sleep a little (never a hot loop forever).
fn backoff(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else if spins < 256 {
        std::thread::yield_now();
    } else {
        let us = (u64::from(spins - 256) * 2).min(200);
        std::thread::sleep(Duration::from_micros(us.max(10)));
    }
}

/// Builds a command input buffer of `len` bytes with the header filled in.
pub fn input(opcode: Opcode, op_mod: u16, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len.max(16)];
    let mut h = InHeader::new_unchecked(&mut buf[..]);
    h.set_opcode(u32::from(u16::from(opcode)));
    h.set_op_mod(u32::from(op_mod));
    buf
}

/// Reads the `status` byte of an output message (for tests and diagnostics).
pub fn out_status(out: &[u8]) -> CmdStatus {
    CmdStatus::from(out.get_bits(0, 31, 24) as u8)
}

//! The model's command interface driven through its real command queue entry point
//! (`Hca::fuzz_run_command_queue`, what the device thread runs on a command doorbell),
//! with the device thread stopped so one input is one deterministic run.
//!
//! Memory: the command queue page and each slot's mailbox area at [`QUEUE_IOVA`]; 8 MiB
//! of data memory at [`DATA_IOVA`] = 0x1000, where the driver's own allocations land on a
//! fresh device, so addresses in commands recorded from a real boot point at mapped memory;
//! firmware pages of the canned boot at [`PAGES_IOVA`]. One model serves every input:
//! before each, the model goes back to its power-on state (`Hca::fuzz_reset`) and all
//! three memories to zeros ([`AnonMem::clear`]): commands make the device write there
//! (EQEs, firmware page tags) and read there (a CQ's doorbell record in QUERY_CQ, an
//! SRQ's in QUERY_SRQ), so an input could otherwise see what an earlier one left.
//!
//! Input: a flags byte (bit 0: boot the HCA first with ENABLE_HCA, SET_ISSI, the boot and
//! init pages and INIT_HCA), then records until the input ends:
//! `slot u8, fault u8, ring u8, inlen u32, outlen u32, body blob`. The body is the command
//! input from its first byte (opcode, op_mod, ...), zero-extended to `inlen`; lengths over
//! [`MAX_LEN`] are kept in the entry only if `fault` asks for a length error, else cut.
//! `ring` bit 0: run the queue after this record (else the record waits for the next
//! doorbell, so several slots run in one pass).

use uhca_hw::layout::cmd::{
    CMD_XPORT, CmdEntry, CmdPas, MAILBOX_ALIGN, MAILBOX_DATA, MailboxBlock, OWN_HW,
    STATUS_OWN_OFFSET, mailbox_blocks,
};
use uhca_hw::layout::cmds::{ManagePagesIn, QueryPagesIn, QueryPagesOut, SetIssiIn};
use uhca_hw::layout::init_seg::reg;
use uhca_hw::model::{Hca, ModelConfig};

use crate::Reader;
use crate::anon::AnonMem;

/// IOVA of the command queue page; each slot's mailboxes follow it.
pub const QUEUE_IOVA: u64 = 1 << 40;
/// IOVA of the data memory (where a fresh driver's allocations land).
pub const DATA_IOVA: u64 = 0x1000;
/// Bytes of data memory.
pub const DATA_LEN: usize = 8 << 20;
/// IOVA of the canned boot's firmware pages.
pub const PAGES_IOVA: u64 = 1 << 41;
/// Firmware pages available to the canned boot.
const PAGES: usize = 512;
/// Longest message with real mailboxes in this harness (32 blocks each way per slot).
pub const MAX_LEN: usize = 16 + 32 * MAILBOX_DATA;
/// Bytes of mailbox area per slot: 32 input and 32 output blocks, 1 KiB apart.
const SLOT_AREA: usize = 64 * MAILBOX_ALIGN;
/// Slots of the queue (log size 5).
pub const SLOTS: usize = 32;

/// How a record's entry or chains are broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A well-formed entry.
    None,
    /// Wrong token in input block `n`.
    InToken(u8),
    /// Wrong token in output block `n`.
    OutToken(u8),
    /// Wrong block number in input block `n`.
    InBlockNum(u8),
    /// A misaligned input pointer.
    InMisaligned,
    /// A misaligned output pointer.
    OutMisaligned,
    /// An input chain pointer to unmapped memory.
    InUnmapped,
    /// An output chain pointer to unmapped memory.
    OutUnmapped,
    /// The input chain's second block points back at the first.
    InLoop,
    /// A type other than CMD_XPORT.
    BadType,
    /// `inlen` and `outlen` as given, even past the model's `MAX_MSG` (no chain is built
    /// past [`MAX_LEN`]).
    RawLengths,
    /// The entry is left software-owned: the device must not run it.
    NotOwned,
}

impl Fault {
    fn decode(b: u8) -> Fault {
        let n = b >> 4;
        match b & 0xF {
            1 => Fault::InToken(n),
            2 => Fault::OutToken(n),
            3 => Fault::InBlockNum(n),
            4 => Fault::InMisaligned,
            5 => Fault::OutMisaligned,
            6 => Fault::InUnmapped,
            7 => Fault::OutUnmapped,
            8 => Fault::InLoop,
            9 => Fault::BadType,
            10 => Fault::RawLengths,
            11 => Fault::NotOwned,
            _ => Fault::None,
        }
    }
}

/// One command record.
#[derive(Clone, Debug)]
pub struct Cmd {
    /// Queue slot (0..32).
    pub slot: usize,
    /// What is broken.
    pub fault: Fault,
    /// Run the queue after this record.
    pub ring: bool,
    /// `inlen` of the entry.
    pub inlen: u32,
    /// `outlen` of the entry.
    pub outlen: u32,
    /// The input message (zero-extended to `inlen`).
    pub input: Vec<u8>,
}

impl Cmd {
    /// Decodes one record.
    pub fn decode(r: &mut Reader<'_>) -> Cmd {
        let slot = usize::from(r.u8()) % SLOTS;
        let fault = Fault::decode(r.u8());
        let ring = r.u8() & 1 == 0;
        let mut inlen = r.u32();
        let mut outlen = r.u32();
        if fault != Fault::RawLengths {
            inlen = inlen.min(MAX_LEN as u32);
            outlen = outlen.min(MAX_LEN as u32);
        }
        let input = r.blob(MAX_LEN).to_vec();
        Cmd {
            slot,
            fault,
            ring,
            inlen,
            outlen,
            input,
        }
    }
}

/// The model with its command queue, mailboxes and memory mapped.
pub struct Harness {
    hca: Hca,
    queue: AnonMem,
    data: AnonMem,
    /// The canned boot's firmware pages (mapped; the device keeps their addresses).
    pages: AnonMem,
    token: u8,
    /// Each slot's entry as last posted (`status_own` clear), to tell the device's
    /// completion of it from other writes of the device over it ([`Harness::overwritten`]).
    posted: [[u8; 64]; SLOTS],
}

impl Harness {
    /// A model (device thread stopped) with its queue programmed and memory mapped.
    pub fn new() -> Harness {
        let mut hca = Hca::new(ModelConfig {
            boot_delay: std::time::Duration::ZERO,
            name: "fuzz".into(),
            ..ModelConfig::default()
        })
        .expect("model");
        hca.fuzz_stop_device_thread();
        let queue = AnonMem::new(4096 + SLOTS * SLOT_AREA);
        let data = AnonMem::new(DATA_LEN);
        let pages = AnonMem::new(PAGES * 4096);
        // SAFETY: the buffers live in the harness, which owns the model and unmaps (drops)
        // it first: fields drop in declaration order, `hca` before the buffers.
        unsafe {
            hca.dma_map(QUEUE_IOVA, queue.as_mut_ptr(), queue.len())
                .expect("map queue");
            hca.dma_map(DATA_IOVA, data.as_mut_ptr(), data.len())
                .expect("map data");
            hca.dma_map(PAGES_IOVA, pages.as_mut_ptr(), pages.len())
                .expect("map pages");
        }
        let mut h = Harness {
            hca,
            queue,
            data,
            pages,
            token: 0,
            posted: [[0; 64]; SLOTS],
        };
        h.reset();
        h
    }

    /// The model.
    pub fn hca(&self) -> &Hca {
        &self.hca
    }

    /// The data memory (mapped at [`DATA_IOVA`]).
    pub fn data(&self) -> &AnonMem {
        &self.data
    }

    /// Whether the queue, data and page memories are all zeros (as after [`reset`](Self::reset)).
    pub fn memory_is_zero(&self) -> bool {
        self.queue.is_zero() && self.data.is_zero() && self.pages.is_zero()
    }

    fn bar_write(&self, off: usize, v: u32) {
        let bar = self.hca.bar0();
        assert!(off + 4 <= bar.len);
        // SAFETY: inside the model's BAR0 mapping (checked), which lives as long as `hca`;
        // a volatile 32-bit store, as the driver's BAR writes.
        unsafe { std::ptr::write_volatile(bar.ptr.add(off).cast::<u32>(), v.to_be()) }
    }

    fn program_queue(&self) {
        self.bar_write(reg::CMDQ_ADDR_H, (QUEUE_IOVA >> 32) as u32);
        self.bar_write(reg::CMDQ_ADDR_L_SZ, QUEUE_IOVA as u32);
    }

    /// Back to the state of a fresh harness: the model as just created
    /// (`Hca::fuzz_reset`), every memory zeros, memory space and bus mastering on, the
    /// queue programmed.
    pub fn reset(&mut self) {
        self.hca.fuzz_reset();
        self.queue.clear();
        self.data.clear();
        self.pages.clear();
        self.token = 0;
        self.hca
            .config_write(4, &6u16.to_le_bytes())
            .expect("config");
        self.program_queue();
    }

    fn slot_base(slot: usize) -> (u64, usize) {
        let off = 4096 + slot * SLOT_AREA;
        (QUEUE_IOVA + off as u64, off)
    }

    /// Writes the entry and mailbox chains of `c` into its slot (not run yet).
    pub fn post(&mut self, c: &Cmd) {
        self.token = self.token.wrapping_add(1).max(1);
        let token = self.token;
        let (mbox_iova, mbox_off) = Self::slot_base(c.slot);
        let mut input = c.input.clone();
        input.resize((c.inlen as usize).min(MAX_LEN).max(input.len()), 0);
        let in_blocks = mailbox_blocks((c.inlen as usize).min(MAX_LEN)).min(32);
        let out_blocks = mailbox_blocks((c.outlen as usize).min(MAX_LEN)).min(32);
        let q = &self.queue;
        let block_off = |i: usize| mbox_off + i * MAILBOX_ALIGN;
        let block_iova = |i: usize| mbox_iova + (i * MAILBOX_ALIGN) as u64;
        for i in 0..in_blocks {
            let mut blk = [0u8; MailboxBlock::<()>::SIZE];
            let start = 16 + i * MAILBOX_DATA;
            let end = (start + MAILBOX_DATA).min(input.len());
            if start < end {
                blk[..end - start].copy_from_slice(&input[start..end]);
            }
            let mut b = MailboxBlock::new_unchecked(&mut blk[..]);
            let next = match c.fault {
                Fault::InLoop if i == 1 => block_iova(0),
                _ if i + 1 < in_blocks => block_iova(i + 1),
                _ => 0,
            };
            b.set_next(next);
            let num = match c.fault {
                Fault::InBlockNum(n) if usize::from(n) == i => i as u32 + 1,
                _ => i as u32,
            };
            b.set_block_num(num);
            let tok = match c.fault {
                Fault::InToken(n) if usize::from(n) == i => token ^ 0x80,
                _ => token,
            };
            b.set_token(tok.into());
            q.write(block_off(i), &blk);
        }
        for i in 0..out_blocks {
            let j = 32 + i;
            let mut blk = [0u8; MailboxBlock::<()>::SIZE];
            let mut b = MailboxBlock::new_unchecked(&mut blk[..]);
            b.set_next(if i + 1 < out_blocks {
                block_iova(j + 1)
            } else {
                0
            });
            b.set_block_num(i as u32);
            let tok = match c.fault {
                Fault::OutToken(n) if usize::from(n) == i => token ^ 0x80,
                _ => token,
            };
            b.set_token(tok.into());
            q.write(block_off(j), &blk);
        }
        let mut raw = [0u8; 64];
        let mut e = CmdEntry::new_unchecked(&mut raw[..]);
        e.set_type(if c.fault == Fault::BadType {
            3
        } else {
            CMD_XPORT
        });
        e.set_inlen(c.inlen);
        e.set_outlen(c.outlen);
        let mut inline = [0u8; 16];
        let n = input.len().min(16);
        inline[..n].copy_from_slice(&input[..n]);
        e.set_in(&inline);
        let in_ptr = match c.fault {
            Fault::InMisaligned => block_iova(0) + 0x40,
            Fault::InUnmapped => 1 << 45,
            _ if in_blocks > 0 => block_iova(0),
            _ => 0,
        };
        let out_ptr = match c.fault {
            Fault::OutMisaligned => block_iova(32) + 0x200,
            Fault::OutUnmapped => 3 << 44,
            _ if out_blocks > 0 => block_iova(32),
            _ => 0,
        };
        e.set_in_ptr(in_ptr);
        e.set_out_ptr(out_ptr);
        e.set_token(token.into());
        let own = if c.fault == Fault::NotOwned {
            0
        } else {
            OWN_HW
        };
        e.set_status_own(0);
        let at = c.slot * 64;
        q.write(at, &raw);
        self.posted[c.slot] = raw;
        // Ownership last, as the driver hands an entry over.
        q.store_u8_release(at + STATUS_OWN_OFFSET, own);
    }

    /// Runs the command queue once.
    pub fn run_queue(&self) {
        self.hca.fuzz_run_command_queue();
    }

    /// Whether the device wrote over `slot`'s entry beyond what completing it writes (the
    /// output's inline bytes 0x20-0x2F and `status_own`): an input may give the device a
    /// queue whose buffer is the command queue page (an EQ whose PAS is [`QUEUE_IOVA`]),
    /// and the device then writes its EQEs or CQEs there, as hardware would. Such an entry
    /// holds no command's output, and nothing is checked of it.
    pub fn overwritten(&self, slot: usize) -> bool {
        let mut now = [0u8; 64];
        self.queue.read(slot * 64, &mut now);
        let posted = &self.posted[slot];
        now[..0x20] != posted[..0x20]
            || now[0x30..STATUS_OWN_OFFSET] != posted[0x30..STATUS_OWN_OFFSET]
    }

    /// The `status_own` byte of `slot`.
    pub fn status_own(&self, slot: usize) -> u8 {
        self.queue.load_u8_acquire(slot * 64 + STATUS_OWN_OFFSET)
    }

    /// The output of the command in `slot` (`outlen` bytes, at most [`MAX_LEN`]).
    pub fn output(&self, slot: usize, outlen: usize) -> Vec<u8> {
        let outlen = outlen.min(MAX_LEN);
        let mut out = vec![0u8; outlen.max(16)];
        self.queue.read(slot * 64 + 0x20, &mut out[..16]);
        let (_, mbox_off) = Self::slot_base(slot);
        for i in 0..mailbox_blocks(outlen).min(32) {
            let start = 16 + i * MAILBOX_DATA;
            let end = (start + MAILBOX_DATA).min(outlen);
            self.queue
                .read(mbox_off + (32 + i) * MAILBOX_ALIGN, &mut out[start..end]);
        }
        out.truncate(outlen.max(16));
        out
    }

    /// Posts and runs one well-formed command in slot 0; the output, or the delivery
    /// status if the command was not delivered.
    pub fn exec(&mut self, input: &[u8], outlen: usize) -> Result<Vec<u8>, u8> {
        let c = Cmd {
            slot: 0,
            fault: Fault::None,
            ring: true,
            inlen: input.len() as u32,
            outlen: outlen as u32,
            input: input.to_vec(),
        };
        self.post(&c);
        self.run_queue();
        let own = self.status_own(0);
        assert_eq!(own & OWN_HW, 0, "the device did not complete a command");
        if own >> 1 != 0 {
            return Err(own >> 1);
        }
        Ok(self.output(0, outlen))
    }

    /// The canned boot: ENABLE_HCA, SET_ISSI 1, the boot and init pages, INIT_HCA. True if
    /// every step succeeded.
    pub fn boot(&mut self) -> bool {
        let ok = |r: &Result<Vec<u8>, u8>| matches!(r, Ok(o) if o[0] == 0);
        let cmd = |op: u16, op_mod: u16, len: usize| {
            let mut v = vec![0u8; len];
            v[..2].copy_from_slice(&op.to_be_bytes());
            v[6..8].copy_from_slice(&op_mod.to_be_bytes());
            v
        };
        if !ok(&self.exec(&cmd(0x104, 0, 16), 16)) {
            return false;
        }
        let mut issi = cmd(0x10B, 0, 16);
        SetIssiIn::new_unchecked(&mut issi[..]).set_current_issi(1);
        if !ok(&self.exec(&issi, 16)) {
            return false;
        }
        let mut next_page = 0usize;
        for op_mod in [1u16, 2] {
            let mut q = cmd(0x107, op_mod, 16);
            QueryPagesIn::new_unchecked(&mut q[..]).set_function_id(0);
            let Ok(out) = self.exec(&q, 16) else {
                return false;
            };
            if out[0] != 0 {
                return false;
            }
            let n = QueryPagesOut::new_unchecked(&out[..]).num_pages() as i32;
            let n = n.max(0) as usize;
            if next_page + n > PAGES {
                return false;
            }
            let mut m = cmd(0x108, 1, 16 + 8 * n);
            ManagePagesIn::new_unchecked(&mut m[..]).set_input_num_entries(n as u32);
            for k in 0..n {
                let iova = PAGES_IOVA + ((next_page + k) * 4096) as u64;
                let mut p = CmdPas::new_unchecked(&mut m[16 + 8 * k..24 + 8 * k]);
                p.set_pa_h((iova >> 32) as u32);
                p.set_pa_l((iova as u32) >> 12);
            }
            next_page += n;
            if !ok(&self.exec(&m, 16)) {
                return false;
            }
        }
        ok(&self.exec(&cmd(0x102, 0, 32), 16))
    }

    /// Runs one input (see the module docs); panics on a broken invariant: an entry the
    /// device owned and did not give back, or a refusal without a syndrome.
    pub fn run_input(&mut self, data: &[u8]) {
        self.run(data, None);
    }

    /// Runs one input and returns what it observed: each command's slot, `status_own`
    /// and output (`outlen` bytes, at most [`MAX_LEN`]), in the order they completed
    /// (the determinism test).
    pub fn run_recorded(&mut self, data: &[u8]) -> Vec<(usize, u8, Vec<u8>)> {
        let mut rec = Vec::new();
        self.run(data, Some(&mut rec));
        rec
    }

    fn run(&mut self, data: &[u8], mut rec: Option<&mut Vec<(usize, u8, Vec<u8>)>>) {
        self.reset();
        let mut r = Reader::new(data);
        if r.u8() & 1 != 0 {
            self.boot();
        }
        let mut pending: Vec<Cmd> = Vec::new();
        let mut n = 0;
        while !r.done() && n < 64 {
            n += 1;
            let c = Cmd::decode(&mut r);
            self.post(&c);
            let ring = c.ring;
            pending.retain(|p| p.slot != c.slot);
            pending.push(c);
            if ring {
                self.run_queue();
                self.check(&pending, rec.as_deref_mut());
                pending.clear();
            }
        }
        self.run_queue();
        self.check(&pending, rec);
    }

    fn check(&self, cmds: &[Cmd], mut rec: Option<&mut Vec<(usize, u8, Vec<u8>)>>) {
        for c in cmds {
            let own = self.status_own(c.slot);
            if let Some(r) = rec.as_deref_mut() {
                r.push((c.slot, own, self.output(c.slot, c.outlen as usize)));
            }
            if self.overwritten(c.slot) {
                continue;
            }
            if c.fault == Fault::NotOwned {
                assert_eq!(
                    own, 0,
                    "slot {}: the device ran a software-owned entry",
                    c.slot
                );
                continue;
            }
            assert_eq!(own & OWN_HW, 0, "slot {}: never completed", c.slot);
            if own >> 1 != 0 || c.outlen < 8 {
                continue;
            }
            let out = self.output(c.slot, 16); // status and syndrome are inline
            let status = out[0];
            let syndrome = u32::from_be_bytes([out[4], out[5], out[6], out[7]]);
            let opcode = c
                .input
                .get(..2)
                .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
            assert!(
                status == 0 || syndrome != 0,
                "opcode {opcode:#x}: status {status:#x} without a syndrome (status_own {own:#x}, slot {}, inlen {:#x}, outlen {:#x}, fault {:?}, output {:02x?})",
                c.slot,
                c.inlen,
                c.outlen,
                c.fault,
                out
            );
        }
    }
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

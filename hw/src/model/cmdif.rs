//! The command engine (prm-subset.md §3): reads entries from the command queue in host
//! memory, gathers the input message from the entry and its mailbox chain, dispatches it,
//! scatters the output, writes `status_own` last and posts command-completion EQEs.

use crate::layout::cmd::{
    CMD_XPORT, CmdEntry, DeliveryStatus, INLINE_BYTES, MAILBOX_ALIGN, MAILBOX_DATA, MailboxBlock,
    OWN_HW, STATUS_OWN_OFFSET, mailbox_blocks,
};
use crate::layout::eqe::{EqePageReq, EventType};
use crate::layout::init_seg::{cmdq_addr_l_sz, reg};

use super::health::{LOG_CMDQ_SIZE, LOG_CMDQ_STRIDE};
use super::state::Core;
use super::{Counters, DmaFault, Shared, cmd, eq};

/// Entries in the queue.
pub(crate) const SLOTS: u32 = 1 << LOG_CMDQ_SIZE;
/// Bytes per entry.
const STRIDE: u64 = 1 << LOG_CMDQ_STRIDE;
/// Largest message the model accepts in either direction: CREATE_MKEY with 2^20 MTT
/// entries (a 4 GiB MR of 4 KiB pages, 8 MiB of mailboxes) fits, and so does MANAGE_PAGES
/// of 64 Ki pages; longer `inlen`/`outlen` get IN/OUT_LENGTH_ERR.
pub const MAX_MSG: usize = 0x110 + 8 * (1 << 20);

/// Base IOVA of the command queue as programmed in BAR0.
fn queue_base(sh: &Shared) -> u64 {
    let h = u64::from(sh.bar.read_be32(reg::CMDQ_ADDR_H));
    let l = u64::from(sh.bar.read_be32(reg::CMDQ_ADDR_L_SZ) & cmdq_addr_l_sz::ADDR_MASK);
    (h << 32) | l
}

/// Runs the hardware-owned entries of the doorbell bits `rung` (every hardware-owned entry
/// while doorbell writes reach the model through shared memory, where writes of several
/// threads coalesce); posts a completion EQE per command to each EQ subscribed to event
/// 0x0A before the command ran; then balances firmware pages.
///
/// Firmware runs an entry when its doorbell bit is written, not when its ownership bit is
/// set: Linux sets `status_own` to hardware before it marks the entry pending and rings, so
/// an entry run early completes a command Linux does not expect yet ("Command completion
/// arrived after timeout"; firmware-behaviour.md §Commands).
pub(crate) fn run_queue(sh: &Shared, core: &mut Core, rung: u32) {
    // IOVA 0 is a valid queue address: run on the doorbell whatever the address.
    let base = queue_base(sh);
    let exact = sh.cmd_db_exact.load(std::sync::atomic::Ordering::Acquire);
    for slot in 0..SLOTS {
        if exact && rung >> slot & 1 == 0 {
            continue;
        }
        let at = base + u64::from(slot) * STRIDE;
        match sh.iommu.read_u8_acquire(at + STATUS_OWN_OFFSET as u64) {
            Ok(own) if own & OWN_HW != 0 => {}
            Ok(_) => continue,
            // With bus mastering off nothing of the queue can be fetched, and that is no
            // fault of the queue: the driver turns it off at teardown once its last
            // command completed. A scan runs every slot whose owner bit is set (doorbell
            // writes may coalesce, so any doorbell scans all), so it can run a command
            // before that command's doorbell lands (a stale doorbell then comes after
            // teardown), and a scan can still be going over the later slots when the
            // driver, having seen its last completion, turns bus mastering off: both used
            // to log "command queue unreachable" on ordinary runs. Stop fetching.
            Err(DmaFault::BusMasterOff) => {
                tracing::debug!(slot, "command queue not fetched: bus mastering is off");
                return;
            }
            // The queue page itself is unreachable: nothing can be completed.
            Err(e) => {
                Counters::inc(&sh.stats.cmdq_unreachable);
                tracing::warn!(%e, "command queue unreachable");
                return;
            }
        }
        // The completion goes to the EQs mapped to command events when the command was
        // posted: not to an EQ the command itself creates (Linux creates its command EQ in
        // polling mode and would take that EQE for a stale completion;
        // firmware-behaviour.md §Events).
        let cmd_eqs: Vec<u32> = core
            .eqs
            .values()
            .filter(|e| e.wants(EventType::Cmd.into()))
            .map(|e| e.eqn)
            .collect();
        let ds = execute(sh, core, at);
        Counters::inc(&sh.stats.commands_done);
        if ds != DeliveryStatus::Ok {
            Counters::inc(&sh.stats.delivery_errors);
        }
        // Ownership back to software last; release orders every output write before it.
        let own = u8::from(ds) << 1;
        if sh
            .iommu
            .write_u8_release(at + STATUS_OWN_OFFSET as u64, own)
            .is_err()
        {
            tracing::warn!(slot, "cannot complete command: queue unmapped");
            continue;
        }
        let mut data = [0u8; 28];
        data[..4].copy_from_slice(&(1u32 << slot).to_be_bytes());
        for eqn in cmd_eqs {
            if core
                .eqs
                .get(&eqn)
                .is_some_and(|e| e.wants(EventType::Cmd.into()))
            {
                eq::post_to(sh, &mut core.eqs, eqn, EventType::Cmd.into(), 0, &data);
            }
        }
    }
    balance_pages(sh, core);
}

/// After a batch of commands: one PAGE_REQUEST event per change of the firmware-page demand
/// (`Pages::rebalance`).
fn balance_pages(sh: &Shared, core: &mut Core) {
    let objects = core.icm_objects();
    let Some(want) = core.pages.rebalance(core.life, objects) else {
        return;
    };
    let mut eqe = [0u8; 64];
    EqePageReq::new_unchecked(&mut eqe[..]).set_num_pages(want as i32 as u32);
    let mut data = [0u8; 28];
    data.copy_from_slice(&eqe[0x20..0x3c]);
    // Counted as outstanding only once an EQ took it (none subscribed yet: asked later).
    if eq::post_event(sh, &mut core.eqs, EventType::PageRequest, 0, &data) > 0 {
        tracing::debug!(
            want,
            held = core.pages.held(),
            objects,
            "PAGE_REQUEST posted"
        );
        Counters::inc(&sh.stats.page_requests);
        core.pages.posted(want);
    }
}

/// Reads one block header's `(next, block_num, token)`.
fn block_header(sh: &Shared, iova: u64) -> Result<(u64, u32, u32), DeliveryStatus> {
    let mut hdr = [0u8; 16];
    sh.iommu
        .read(iova + 0x230, &mut hdr)
        .map_err(|_| DeliveryStatus::FwErr)?;
    let mut full = [0u8; MailboxBlock::<()>::SIZE];
    full[0x230..0x240].copy_from_slice(&hdr);
    let b = MailboxBlock::new_unchecked(&full[..]);
    Ok((b.next(), b.block_num(), b.token()))
}

/// Walks a mailbox chain of `n` blocks from `first`, checking alignment, block numbers and
/// tokens (§3.3, §3.7); returns the block IOVAs.
fn walk_chain(
    sh: &Shared,
    first: u64,
    n: usize,
    token: u32,
    misaligned: DeliveryStatus,
) -> Result<Vec<u64>, DeliveryStatus> {
    let mut blocks = Vec::with_capacity(n);
    let mut ptr = first;
    for i in 0..n {
        if !ptr.is_multiple_of(MAILBOX_ALIGN as u64) {
            return Err(misaligned);
        }
        let (next, num, tok) = block_header(sh, ptr)?;
        if num != i as u32 {
            return Err(DeliveryStatus::BadBlkNumErr);
        }
        if tok != token {
            return Err(DeliveryStatus::TokErr);
        }
        blocks.push(ptr);
        ptr = next;
    }
    Ok(blocks)
}

/// Runs the entry at `at`; returns its delivery status. The output is written unless the
/// delivery failed.
fn execute(sh: &Shared, core: &mut Core, at: u64) -> DeliveryStatus {
    let mut raw = [0u8; 64];
    if sh.iommu.read(at, &mut raw).is_err() {
        return DeliveryStatus::FwErr;
    }
    let e = CmdEntry::new_unchecked(&raw[..]);
    if e.r#type() != CMD_XPORT {
        return DeliveryStatus::CmdDescrErr;
    }
    let (inlen, outlen) = (e.inlen() as usize, e.outlen() as usize);
    if inlen > MAX_MSG {
        return DeliveryStatus::InLengthErr;
    }
    if outlen > MAX_MSG {
        return DeliveryStatus::OutLengthErr;
    }
    let token = e.token();
    // Validate both chains before running anything: a delivery error has no side effects.
    let in_blocks = match walk_chain(
        sh,
        e.in_ptr(),
        mailbox_blocks(inlen),
        token,
        DeliveryStatus::InPtrAlignErr,
    ) {
        Ok(b) => b,
        Err(ds) => return ds,
    };
    let out_blocks = match walk_chain(
        sh,
        e.out_ptr(),
        mailbox_blocks(outlen),
        token,
        DeliveryStatus::OutPtrAlignErr,
    ) {
        Ok(b) => b,
        Err(ds) => return ds,
    };
    // Gather: 16 inline bytes, then 512 data bytes per block.
    let mut input = vec![0u8; inlen.max(INLINE_BYTES)];
    input[..INLINE_BYTES].copy_from_slice(&e.r#in());
    for (i, blk) in in_blocks.iter().enumerate() {
        let start = INLINE_BYTES + i * MAILBOX_DATA;
        let end = (start + MAILBOX_DATA).min(inlen);
        if sh.iommu.read(*blk, &mut input[start..end]).is_err() {
            return DeliveryStatus::FwErr;
        }
    }
    input.truncate(inlen.max(INLINE_BYTES));
    tracing::trace!(
        at = format_args!("{at:#x}"),
        opcode = format_args!("{:#06x}", u16::from_be_bytes([input[0], input[1]])),
        inlen,
        outlen,
        "command"
    );
    #[cfg_attr(not(feature = "fuzzing"), allow(unused_mut))]
    let mut output = cmd::dispatch(sh, core, &input, inlen, outlen);
    #[cfg(feature = "fuzzing")]
    let lie = rewrite_output(&input, &mut output);
    // Scatter: at most `outlen` bytes; the inline part always holds status and syndrome.
    let mut inline = [0u8; INLINE_BYTES];
    let n = output.len().min(INLINE_BYTES);
    inline[..n].copy_from_slice(&output[..n]);
    if sh.iommu.write(at + 0x20, &inline).is_err() {
        return DeliveryStatus::FwErr;
    }
    for (i, blk) in out_blocks.iter().enumerate() {
        let start = INLINE_BYTES + i * MAILBOX_DATA;
        let end = (start + MAILBOX_DATA).min(outlen);
        let mut chunk = vec![0u8; end - start];
        if start < output.len() {
            let m = output.len().min(end) - start;
            chunk[..m].copy_from_slice(&output[start..start + m]);
        }
        if sh.iommu.write(*blk, &chunk).is_err() {
            return DeliveryStatus::FwErr;
        }
    }
    #[cfg(feature = "fuzzing")]
    if let Some(ds) = lie {
        return ds;
    }
    DeliveryStatus::Ok
}

// The fuzz targets' output hook (feature `fuzzing`; `fuzzing::set_output_hook`).

/// A rewrite of a command's output: gets the gathered input and the output the model
/// computed; may change the output (any length) and return a delivery status to report
/// instead of the real one.
#[cfg(feature = "fuzzing")]
pub type OutputHook = Box<dyn FnMut(&[u8], &mut Vec<u8>) -> Option<DeliveryStatus> + Send>;

/// The process-wide hook (fuzz targets run one model at a time).
#[cfg(feature = "fuzzing")]
static OUTPUT_HOOK: std::sync::Mutex<Option<OutputHook>> = std::sync::Mutex::new(None);

/// Installs (`Some`) or removes (`None`) the output hook of every model in the process.
#[cfg(feature = "fuzzing")]
pub fn set_output_hook(hook: Option<OutputHook>) {
    *OUTPUT_HOOK.lock().unwrap_or_else(|e| e.into_inner()) = hook;
}

/// Runs the hook, if any, on one command's output (called by `execute`).
#[cfg(feature = "fuzzing")]
fn rewrite_output(input: &[u8], output: &mut Vec<u8>) -> Option<DeliveryStatus> {
    let mut hook = OUTPUT_HOOK.lock().unwrap_or_else(|e| e.into_inner());
    hook.as_mut().and_then(|h| h(input, output))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::layout::BufMut;
    use crate::layout::cmd::{CMD_XPORT, CmdEntry, OWN_HW, Opcode, STATUS_OWN_OFFSET};
    use crate::layout::init_seg::reg;
    use crate::model::tests::{Rig, model};

    /// With doorbells arriving one by one (a trapped page), an entry runs when its bit is
    /// rung, not when its ownership bit is set: Linux hands an entry to hardware before it
    /// is ready for the completion and rings after.
    #[test]
    fn only_rung_entries_run_once_doorbells_arrive_by_message() {
        let hca = model(71);
        let mut r = Rig::new(&hca);
        let q = r.alloc(4096);
        for slot in 0..2 {
            let mut e = [0u8; 64];
            let mut c = CmdEntry::new_unchecked(&mut e[..]);
            c.set_type(CMD_XPORT);
            c.set_inlen(16);
            c.set_outlen(16);
            let mut i = [0u8; 16];
            i[..2].copy_from_slice(&u16::from(Opcode::Nop).to_be_bytes());
            c.set_in(&i);
            c.set_status_own(OWN_HW.into());
            r.buf(q.idx).write_bytes(slot * 64, &e);
        }
        let bar = &hca.shared.bar;
        bar.write_be32(reg::CMDQ_ADDR_H, (q.iova >> 32) as u32);
        bar.write_be32(reg::CMDQ_ADDR_L_SZ, q.iova as u32);
        let own = |slot: usize| r.buf(q.idx).load_u8_acquire(slot * 64 + STATUS_OWN_OFFSET);
        let wait_done = |slot: usize| {
            let start = Instant::now();
            while own(slot) & OWN_HW != 0 {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "slot {slot} never ran"
                );
                std::thread::sleep(Duration::from_micros(100));
            }
        };
        assert!(hca.doorbell_write(reg::CMD_DBELL, &1u32.to_be_bytes()));
        wait_done(0);
        // The pass that ran slot 0 held the core lock; once we hold it, that pass is over.
        drop(hca.shared.core());
        assert_eq!(
            own(1) & OWN_HW,
            OWN_HW,
            "slot 1 is hardware-owned but was not rung"
        );
        assert!(hca.doorbell_write(reg::CMD_DBELL, &2u32.to_be_bytes()));
        wait_done(1);
    }
}

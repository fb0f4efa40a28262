//! Mailbox chains (prm-subset.md §3.3): 576-byte blocks, each 1 KiB aligned, linked by
//! `next`, numbered by `block_num`, stamped with the command's token.

use std::sync::Arc;

use uhca_layout::cmd::{MAILBOX_ALIGN, MAILBOX_DATA, MailboxBlock};

use super::CmdError;
use crate::dma::{DmaRegion, DmaSpace};

/// A chain of mailbox blocks inside a DMA region (block i at `offset + i * 1024`).
pub(super) struct MailboxChain {
    region: Arc<DmaRegion>,
    offset: usize,
    blocks: usize,
}

impl MailboxChain {
    /// A chain with room for `blocks` blocks (at least one) in a region of its own.
    pub(super) fn new(space: &Arc<DmaSpace>, blocks: usize) -> Result<MailboxChain, CmdError> {
        let blocks = blocks.max(1);
        let region = Arc::new(space.alloc(blocks * MAILBOX_ALIGN)?);
        Ok(MailboxChain {
            region,
            offset: 0,
            blocks,
        })
    }

    /// A chain of `blocks` blocks at `offset` of a shared region.
    pub(super) fn carve(region: &Arc<DmaRegion>, offset: usize, blocks: usize) -> MailboxChain {
        assert!(offset + blocks * MAILBOX_ALIGN <= region.len());
        MailboxChain {
            region: region.clone(),
            offset,
            blocks,
        }
    }

    fn block(&self, i: usize) -> crate::dma::DmaSlice<'_> {
        self.region.sub(self.offset + i * MAILBOX_ALIGN, 0x240)
    }

    /// How many blocks the chain holds.
    pub(super) fn capacity(&self) -> usize {
        self.blocks
    }

    fn block_iova(&self, i: usize) -> u64 {
        self.region.iova().0 + (self.offset + i * MAILBOX_ALIGN) as u64
    }

    /// Links the first `n` blocks and stamps them with `token` (clearing their data when
    /// `clear` is set). Returns the first block's IOVA, or 0 for `n == 0`.
    fn link(&self, n: usize, token: u8, clear: bool) -> u64 {
        for i in 0..n {
            let mut b = MailboxBlock::new_unchecked(self.block(i));
            if clear {
                b.buf().fill(0, MAILBOX_DATA, 0);
            }
            b.set_next(if i + 1 < n { self.block_iova(i + 1) } else { 0 });
            b.set_block_num(i as u32);
            b.set_token(u32::from(token));
            b.set_ctrl_sig(0);
            b.set_sig(0);
        }
        if n == 0 { 0 } else { self.block_iova(0) }
    }

    /// Writes `data` (the message bytes past the 16 inline ones) into the chain; returns
    /// the `in_ptr` for the entry.
    pub(super) fn write_message(&self, data: &[u8], token: u8) -> u64 {
        let n = data.len().div_ceil(MAILBOX_DATA);
        assert!(n <= self.blocks, "mailbox chain too short");
        for (i, chunk) in data.chunks(MAILBOX_DATA).enumerate() {
            let blk = self.block(i);
            blk.write(0, chunk);
            if chunk.len() < MAILBOX_DATA {
                blk.fill(chunk.len(), MAILBOX_DATA - chunk.len(), 0);
            }
        }
        self.link(n, token, false)
    }

    /// Clears and links `n` output blocks; returns the `out_ptr` for the entry.
    pub(super) fn prepare_output(&self, n: usize, token: u8) -> u64 {
        assert!(n <= self.blocks, "mailbox chain too short");
        self.link(n, token, true)
    }

    /// Copies the output message bytes past the 16 inline ones out of the chain.
    pub(super) fn read_message(&self, out: &mut [u8], n: usize) {
        for (i, chunk) in out.chunks_mut(MAILBOX_DATA).take(n).enumerate() {
            self.block(i).read(0, chunk);
        }
    }
}

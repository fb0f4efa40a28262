//! Posting a send work request of a connected (RC) QP: the straight one-SGE path and the
//! general one that builds the WQE segment by segment (prm-subset.md §9.5). Datagram
//! sends are built in `resource::ud`.

#![deny(unsafe_code)]

use uhca_layout::wqe::{ATOMIC_SIZE, WqeOpcode};

use super::shadow::WqShadow;
use super::sq::SendRing;
use super::wqe::{PostError, Remote, Sge, WqeBuf};
use super::wr::{Local, SendOp, SendWr};

/// Per-QP limits of send work requests (from [`QpConfig`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendLimits {
    /// Most data segments.
    pub(crate) max_sge: usize,
    /// Most inline bytes.
    pub(crate) max_inline: usize,
}

/// Writes the WQE of `wr` into `sq` (the body of [`Qp::post_send`](crate::resource::Qp::post_send) after the state check;
/// the benchmark rig runs it too). A WRITE or SEND (with or without immediate) of one
/// SGE takes the straight path ([`SendRing::post_one_sge`]); the rest is built
/// segment by segment.
#[inline(always)]
pub(crate) fn post_wr(
    sq: &mut SendRing,
    sh: &WqShadow,
    lim: SendLimits,
    wr: &SendWr<'_>,
) -> Result<(), PostError> {
    let (id, f) = (wr.wr_id, wr.flags.bits());
    if lim.max_sge >= 1 {
        let none = Remote::default();
        match wr.op {
            SendOp::Write {
                local: Local::Sges([sge]),
                remote,
            } => {
                return sq.post_one_sge::<true>(sh, id, WqeOpcode::RdmaWrite, f, 0, remote, sge);
            }
            SendOp::WriteImm {
                local: Local::Sges([sge]),
                remote,
                imm,
            } => {
                return sq.post_one_sge::<true>(
                    sh,
                    id,
                    WqeOpcode::RdmaWriteImm,
                    f,
                    imm,
                    remote,
                    sge,
                );
            }
            SendOp::Send {
                local: Local::Sges([sge]),
            } => {
                return sq.post_one_sge::<false>(sh, id, WqeOpcode::Send, f, 0, none, sge);
            }
            SendOp::SendImm {
                local: Local::Sges([sge]),
                imm,
            } => {
                return sq.post_one_sge::<false>(sh, id, WqeOpcode::SendImm, f, imm, none, sge);
            }
            _ => {}
        }
    }
    post_built(sq, sh, lim, wr)
}

/// Every other send work request: segments built in the stack buffer, then copied.
#[inline(never)]
fn post_built(
    sq: &mut SendRing,
    sh: &WqShadow,
    lim: SendLimits,
    wr: &SendWr<'_>,
) -> Result<(), PostError> {
    let (max_sge, max_inline) = (lim.max_sge, lim.max_inline);
    let local = |w: &mut WqeBuf, l: &Local<'_>| match *l {
        Local::Sges(s) if s.len() > max_sge => Err(PostError::TooManySges),
        Local::Sges(s) => w.data(s),
        Local::Inline(d) if d.len() > max_inline => Err(PostError::InlineTooLong),
        Local::Inline(d) => w.inline(d),
    };
    let (id, f) = (wr.wr_id, wr.flags.bits());
    match wr.op {
        SendOp::Write { local: l, remote } => sq.post(sh, id, WqeOpcode::RdmaWrite, f, 0, |w| {
            w.raddr(remote);
            local(w, &l)
        }),
        SendOp::WriteImm {
            local: l,
            remote,
            imm,
        } => sq.post(sh, id, WqeOpcode::RdmaWriteImm, f, imm, |w| {
            w.raddr(remote);
            local(w, &l)
        }),
        SendOp::Read { local: l, remote } => {
            if l.len() > max_sge {
                return Err(PostError::TooManySges);
            }
            sq.post(sh, id, WqeOpcode::RdmaRead, f, 0, |w| {
                w.raddr(remote);
                w.data(l)
            })
        }
        SendOp::Send { local: l } => sq.post(sh, id, WqeOpcode::Send, f, 0, |w| local(w, &l)),
        SendOp::SendImm { local: l, imm } => {
            sq.post(sh, id, WqeOpcode::SendImm, f, imm, |w| local(w, &l))
        }
        SendOp::CompareSwap {
            local: l,
            remote,
            compare,
            swap,
        } => {
            check_atomic(&l, &remote)?;
            sq.post(sh, id, WqeOpcode::AtomicCs, f, 0, |w| {
                w.raddr(remote);
                w.atomic(swap, compare);
                w.data(&[l])
            })
        }
        SendOp::FetchAdd {
            local: l,
            remote,
            add,
        } => {
            check_atomic(&l, &remote)?;
            sq.post(sh, id, WqeOpcode::AtomicFa, f, 0, |w| {
                w.raddr(remote);
                w.atomic(add, 0);
                w.data(&[l])
            })
        }
    }
}

fn check_atomic(l: &Sge, r: &Remote) -> Result<(), PostError> {
    if l.len != ATOMIC_SIZE || !r.addr.is_multiple_of(8) {
        return Err(PostError::BadAtomic);
    }
    Ok(())
}

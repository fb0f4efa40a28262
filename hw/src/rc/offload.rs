//! The loopback offload seam: how the engine sends a [`Burst`], a frame that stands for
//! several packets whose payload stays in the sender's memory.
//!
//! A feature of the port, not of a link: only frames that stay inside the device (to the
//! port's own MAC, through its loopback queue) may go as bursts, and only the port knows
//! which those are and whether the offload is on. The engine asks through [`Env::offload`];
//! with none it sends every packet as a packet. [`Loopback`] carries a burst beside its
//! frame as its side record ([`Loopback::send_with_side`]); the port's receive side takes it
//! with [`Loopback::recv_local`].

use super::Burst;
#[cfg(doc)]
use super::Env;
use crate::link::{LinkError, Loopback};

/// A port's loopback offload: it takes bursts for the frames that stay inside the device.
pub trait Offload {
    /// Whether a frame to `dst_mac` may go as a burst: it stays inside the device (the
    /// port's own loopback queue) and the offload is on.
    fn takes_bursts(&self, dst_mac: &[u8; 6]) -> bool;
    /// Sends a frame that `build` writes in place (as for
    /// [`Link::send_with`](crate::link::Link::send_with)) with `burst` beside it: the
    /// packets it stands for and where their payload is. A frame the offload does not take
    /// ([`takes_bursts`](Self::takes_bursts) false for its destination) is refused with
    /// [`LinkError::NoBursts`].
    fn send_burst(
        &self,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        burst: &Burst,
    ) -> Result<(), LinkError>;
}

/// A loopback queue used as a port's whole link (the engine's tests): every frame stays
/// inside, so it takes every burst.
impl Offload for Loopback<Burst> {
    fn takes_bursts(&self, _dst_mac: &[u8; 6]) -> bool {
        true
    }

    fn send_burst(
        &self,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        burst: &Burst,
    ) -> Result<(), LinkError> {
        self.send_with_side(build, burst)
    }
}

//! Host API for port 1's link: attach any [`Link`] (a UDP link later), or join two models'
//! ports with an in-process pair. Frames to the port's own MAC never use the link: they
//! loop back inside the model (prm-subset.md §7.4 `rmac`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::link::{self, Link, LinkConfig};

use super::{Hca, ModelError};

impl Hca {
    /// Attaches `link` to port 1, replacing any link attached before. Frames whose
    /// destination MAC is not the port's own go out on it; frames it delivers are taken by
    /// the device thread.
    pub fn attach_link(&self, link: Box<dyn Link + Send + Sync>) {
        let a = &self.shared.link;
        *a.link.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(link));
        a.generation.fetch_add(1, Ordering::Release);
    }

    /// Detaches port 1's link (frames for other MACs are then lost, as on an unplugged port).
    pub fn detach_link(&self) {
        let a = &self.shared.link;
        *a.link.lock().unwrap_or_else(|e| e.into_inner()) = None;
        a.generation.fetch_add(1, Ordering::Release);
    }

    /// Joins the ports of `a` and `b` with an in-process link of the default shape
    /// ([`LinkConfig::default`]). The models need distinct MACs
    /// ([`ModelConfig::mac`](super::ModelConfig::mac)).
    pub fn link_pair(a: &Hca, b: &Hca) -> Result<(), ModelError> {
        Hca::link_pair_with(a, b, LinkConfig::default())
    }

    /// [`link_pair`](Self::link_pair) with a given link shape (depth, frame size, seeded
    /// fault injection).
    pub fn link_pair_with(a: &Hca, b: &Hca, cfg: LinkConfig) -> Result<(), ModelError> {
        if a.shared.cfg.mac == b.shared.cfg.mac {
            return Err(ModelError::Config("linked models need distinct MACs"));
        }
        let (ea, eb) = link::pair(cfg);
        a.attach_link(Box::new(ea));
        b.attach_link(Box::new(eb));
        Ok(())
    }
}

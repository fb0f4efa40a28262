//! [`KeyedMem`]: memory for the RC engine without a device: registered regions found by
//! their key, as the engine's tests and the `rc_receive` fuzz target give it (compiled for
//! them only: `cfg(test)` or the `fuzzing` feature).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::memory::{AccessError, AccessKind, AtomicOp, Memory};

/// A registered region: `data` at `va`, reachable through its key.
struct Region {
    va: u64,
    data: Vec<u8>,
    remote: bool,
}

/// Keyed memory: L_Key = R_Key = the region's key. Remote access only where registered
/// so; atomics operate on little-endian u64s. Checks that fail are counted
/// ([`KeyedMem::refused`]: what a device counts as faults).
#[derive(Default)]
pub struct KeyedMem {
    regions: RefCell<HashMap<u32, Region>>,
    refused: Cell<u64>,
}

impl KeyedMem {
    /// The bytes a region of `key` starts with ([`register`](Self::register)): distinct
    /// per key and offset, so a copy from the wrong place shows.
    pub fn pattern(key: u32, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32 ^ key).wrapping_mul(2_654_435_761) as u8)
            .collect()
    }

    /// Registers `len` bytes at `va` under `key`, filled with [`pattern`](Self::pattern).
    pub fn register(&self, key: u32, va: u64, len: usize, remote: bool) {
        self.register_bytes(key, va, Self::pattern(key, len), remote);
    }

    /// Registers `data` at `va` under `key` (replacing a region of that key).
    pub fn register_bytes(&self, key: u32, va: u64, data: Vec<u8>, remote: bool) {
        self.regions
            .borrow_mut()
            .insert(key, Region { va, data, remote });
    }

    /// Forgets the region of `key` (a deregistered MR).
    pub fn deregister(&self, key: u32) {
        self.regions.borrow_mut().remove(&key);
    }

    /// A copy of `len` bytes at `va` of the region of `key`.
    ///
    /// # Panics
    /// If the range is not inside that region (a test's own mistake).
    pub fn bytes(&self, key: u32, va: u64, len: usize) -> Vec<u8> {
        let r = self.regions.borrow();
        let r = r.get(&key).expect("a registered key");
        let at = (va - r.va) as usize;
        r.data[at..at + len].to_vec()
    }

    /// Writes `data` at `va` of the region of `key`.
    ///
    /// # Panics
    /// If the range is not inside that region (a test's own mistake).
    pub fn fill(&self, key: u32, va: u64, data: &[u8]) {
        let mut r = self.regions.borrow_mut();
        let r = r.get_mut(&key).expect("a registered key");
        let at = (va - r.va) as usize;
        r.data[at..at + data.len()].copy_from_slice(data);
    }

    /// How many checks failed so far.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Where `len` bytes at `va` start in the region of `key`, if `access` may reach them.
    fn span(&self, key: u32, va: u64, len: u64, access: AccessKind) -> Result<usize, AccessError> {
        let r = self.regions.borrow();
        let r = r.get(&key).ok_or(AccessError::InvalidKey { key })?;
        let remote = matches!(
            access,
            AccessKind::RemoteRead | AccessKind::RemoteWrite | AccessKind::RemoteAtomic
        );
        if remote && !r.remote {
            return Err(AccessError::Denied);
        }
        let end = va.checked_add(len).ok_or(AccessError::OutOfRange)?;
        if va < r.va || end > r.va + r.data.len() as u64 {
            return Err(AccessError::OutOfRange);
        }
        Ok((va - r.va) as usize)
    }

    /// The bytes of the region of `key`, given to `f`.
    fn with_mut<T>(&self, key: u32, f: impl FnOnce(&mut Vec<u8>) -> T) -> Result<T, AccessError> {
        let mut regions = self.regions.borrow_mut();
        let r = regions
            .get_mut(&key)
            .ok_or(AccessError::InvalidKey { key })?;
        Ok(f(&mut r.data))
    }
}

impl Memory for KeyedMem {
    fn check(&self, key: u32, va: u64, len: u64, access: AccessKind) -> Result<(), AccessError> {
        let res = self.span(key, va, len, access).map(drop);
        if res.is_err() {
            self.refused.set(self.refused.get() + 1);
        }
        res
    }
    fn read(
        &self,
        key: u32,
        va: u64,
        buf: &mut [u8],
        access: AccessKind,
    ) -> Result<(), AccessError> {
        let at = self.span(key, va, buf.len() as u64, access)?;
        self.with_mut(key, |d| buf.copy_from_slice(&d[at..at + buf.len()]))
    }
    fn write(&self, key: u32, va: u64, data: &[u8], access: AccessKind) -> Result<(), AccessError> {
        let at = self.span(key, va, data.len() as u64, access)?;
        self.with_mut(key, |d| d[at..at + data.len()].copy_from_slice(data))
    }
    fn atomic(&self, key: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        if !va.is_multiple_of(8) {
            return Err(AccessError::Misaligned);
        }
        let at = self.span(key, va, 8, AccessKind::RemoteAtomic)?;
        self.with_mut(key, |d| {
            let mut cell = [0u8; 8];
            cell.copy_from_slice(&d[at..at + 8]);
            let orig = u64::from_le_bytes(cell);
            let new = match op {
                AtomicOp::CompareSwap { compare, swap } => {
                    if orig == compare {
                        swap
                    } else {
                        orig
                    }
                }
                AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
            };
            d[at..at + 8].copy_from_slice(&new.to_le_bytes());
            orig
        })
    }
}

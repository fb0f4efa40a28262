//! Host memory that a harness maps for the model's DMA and clears between inputs
//! ([`AnonMem::clear`]): only the pages an input may have touched cost anything (clearing
//! 8 MiB per input would cost more than most inputs).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

/// An anonymous mapping of whole pages, zero-filled.
#[derive(Debug)]
pub struct AnonMem {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an owned mapping; the harness accesses it from one thread at a time, the model's
// DMA (through its IOMMU) only while the harness runs the device on that thread.
unsafe impl Send for AnonMem {}
// SAFETY: as for Send.
unsafe impl Sync for AnonMem {}

impl AnonMem {
    /// Maps `len` bytes (rounded up to 4 KiB) of zeros.
    pub fn new(len: usize) -> AnonMem {
        let len = len.max(1).next_multiple_of(4096);
        // SAFETY: a fresh private anonymous mapping at an address the kernel chooses; the
        // result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert!(
            p != libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned a non-null pointer");
        AnonMem { ptr, len }
    }

    /// Maps `len` bytes of zeros at `addr` if that range is free (`MAP_FIXED_NOREPLACE`),
    /// else wherever the kernel chooses: memory whose address an input must not depend
    /// on (a registered buffer's address is part of the commands that register it).
    pub fn at(addr: usize, len: usize) -> AnonMem {
        let len = len.max(1).next_multiple_of(4096);
        // SAFETY: a fresh private anonymous mapping; MAP_FIXED_NOREPLACE never replaces an
        // existing mapping (it fails instead, and then the hint is dropped below).
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return AnonMem::new(len);
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned a non-null pointer");
        AnonMem { ptr, len }
    }

    /// Host address of the first byte (what `dma_map` takes).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (at least one page).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Every byte zero again, touching only what an input may have written: each page in
    /// memory (`mincore`) that is not all zeros is cleared in place (so that it need not be
    /// faulted in and zeroed by the kernel again on the next input); each run of pages not
    /// in memory is given back to the kernel (`madvise(MADV_DONTNEED)`: a no-op for a page
    /// never touched, and a swapped-out page reads zeros again).
    pub fn clear(&self) {
        const PAGE: usize = 4096;
        static ZERO: [u8; PAGE] = [0; PAGE];
        let pages = self.len / PAGE;
        let mut resident = vec![0u8; pages];
        // SAFETY: our own mapping, whole; `resident` has one byte per page.
        let r = unsafe { libc::mincore(self.ptr.as_ptr().cast(), self.len, resident.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        let base = self.ptr.as_ptr();
        let mut i = 0;
        while i < pages {
            let start = i;
            let here = resident[i] & 1 != 0;
            while i < pages && (resident[i] & 1 != 0) == here {
                i += 1;
            }
            if here {
                for k in start..i {
                    // SAFETY: page `k` lies inside our mapping; nothing else accesses it now
                    // (the model's DMA runs only on the harness's thread).
                    unsafe {
                        let p = base.add(k * PAGE);
                        if libc::memcmp(p.cast(), ZERO.as_ptr().cast(), PAGE) != 0 {
                            std::ptr::write_bytes(p, 0, PAGE);
                        }
                    }
                }
            } else {
                // SAFETY: pages `start..i` lie inside our mapping; MADV_DONTNEED on private
                // anonymous memory makes them read zeros; nothing references them.
                let r = unsafe {
                    libc::madvise(
                        base.add(start * PAGE).cast(),
                        (i - start) * PAGE,
                        libc::MADV_DONTNEED,
                    )
                };
                assert_eq!(r, 0, "madvise: {}", std::io::Error::last_os_error());
            }
        }
    }

    /// Copies `src` to `off`.
    pub fn write(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.len, "write past the mapping");
        // SAFETY: inside the mapping (checked); the model's DMA does not run concurrently
        // (the harness runs the device itself, on this thread).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        }
    }

    /// Copies `dst.len()` bytes from `off`.
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= self.len, "read past the mapping");
        // SAFETY: as for `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    fn byte(&self, off: usize) -> &AtomicU8 {
        assert!(off < self.len, "access past the mapping");
        // SAFETY: inside the mapping (checked), which lives as long as `self`; AtomicU8
        // has the layout of u8.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }
    }

    /// Loads the byte at `off` (acquire: an ownership byte the device writes last).
    pub fn load_u8_acquire(&self, off: usize) -> u8 {
        self.byte(off).load(Ordering::Acquire)
    }

    /// Stores the byte at `off` (release: an ownership byte handed over last).
    pub fn store_u8_release(&self, off: usize, v: u8) {
        self.byte(off).store(v, Ordering::Release)
    }

    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        let mut page = vec![0u8; 4096];
        (0..self.len).step_by(4096).all(|off| {
            self.read(off, &mut page);
            page.iter().all(|&b| b == 0)
        })
    }
}

impl Drop for AnonMem {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once here (the model unmaps it from its
        // IOMMU first: the harness drops the model before its memory).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

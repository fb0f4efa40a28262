//! The system calls of the VFIO backend: ioctl, mmap/munmap, getrlimit, sysconf, adopting a
//! fresh fd. Each is a thin wrapper that turns `-1` into `io::Error::last_os_error()`.

use std::fs::OpenOptions;
use std::io;
use std::path::Path;

use super::VfioError;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Issues `ioctl(fd, req, arg)` with a pointer argument.
///
/// # Safety
/// `arg` must point at a live, writable buffer laid out as `req` expects and at least as
/// long as the size the buffer announces in its `argsz`/`size` field.
pub unsafe fn ioctl_ptr<T>(fd: BorrowedFd<'_>, req: u64, arg: *mut T) -> io::Result<i32> {
    // SAFETY: the caller guarantees `arg` matches what `req` reads and writes.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Issues `ioctl(fd, req, val)` for a request that takes an integer by value (or nothing).
///
/// # Safety
/// `req` must be a request that does not dereference its argument (e.g.
/// `VFIO_CHECK_EXTENSION`, `VFIO_SET_IOMMU`, `VFIO_GET_API_VERSION`, `VFIO_DEVICE_RESET`,
/// `VFIO_GROUP_UNSET_CONTAINER`).
pub unsafe fn ioctl_val(fd: BorrowedFd<'_>, req: u64, val: libc::c_ulong) -> io::Result<i32> {
    // SAFETY: the caller guarantees the kernel reads no memory through `val`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, val) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Takes ownership of an fd that an ioctl returned.
///
/// # Safety
/// `fd` must be a fresh descriptor that nothing else owns or will close.
pub unsafe fn adopt_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the caller guarantees exclusive ownership of `fd`.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Reserves `len` bytes of address space with no access (`PROT_NONE`, nothing backing it).
pub fn reserve(len: usize) -> io::Result<usize> {
    // SAFETY: an anonymous PROT_NONE mapping at a kernel-chosen address touches no existing
    // memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p as usize)
    }
}

/// Maps `len` bytes of `fd` at file offset `off` over `addr` (`MAP_SHARED | MAP_FIXED`).
///
/// # Safety
/// `[addr, addr + len)` must lie inside a reservation this backend owns ([`reserve`]), so
/// that replacing its pages destroys nothing anyone else uses.
pub unsafe fn map_fixed(
    addr: usize,
    len: usize,
    prot: i32,
    fd: BorrowedFd<'_>,
    off: u64,
) -> io::Result<()> {
    // SAFETY: the caller guarantees the target range is our own reservation.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Unmaps `[addr, addr + len)`.
///
/// # Safety
/// The range must be a mapping this backend created and nothing may use it afterwards.
pub unsafe fn unmap(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller guarantees the range is ours and no longer used.
    let r = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `RLIMIT_MEMLOCK` soft limit in bytes; `None` = unlimited.
pub fn memlock_limit() -> io::Result<Option<u64>> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid, writable rlimit the call fills.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur))
}

/// The base page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf reads no memory of ours.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// Opens a VFIO or iommufd node read-write; the error names the node and a hint.
pub(super) fn open_rw(path: &Path, hint: &'static str) -> Result<OwnedFd, VfioError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|source| VfioError::Open {
            path: path.to_path_buf(),
            hint: open_hint(&source, hint),
            source,
        })
}

/// The fix to show for a failed open: EBUSY always means another open holder (a VFIO group
/// node, a device cdev and a bound device each admit one opener: another uhca instance, QEMU,
/// or this process's own earlier open), whatever the caller's setup hint says.
fn open_hint(e: &std::io::Error, setup_hint: &'static str) -> &'static str {
    if e.raw_os_error() == Some(libc::EBUSY) {
        "already open: a VFIO group or device admits one user at a time; close the other user \
         (another uhca process, QEMU, DPDK) or reuse this process's open handle"
    } else {
        setup_hint
    }
}

#[cfg(test)]
mod open_hint_tests {
    use super::open_hint;

    #[test]
    fn ebusy_names_the_other_user_and_others_keep_the_setup_hint() {
        let busy = std::io::Error::from_raw_os_error(libc::EBUSY);
        assert!(open_hint(&busy, "setup").starts_with("already open"));
        let perm = std::io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(open_hint(&perm, "setup"), "setup");
    }
}

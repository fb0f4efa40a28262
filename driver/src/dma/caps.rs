//! The process's capabilities, asked of the kernel: what the pinning accounting
//! ([`super::MemlockPolicy`]) and the VFIO backends (no-IOMMU mode needs CAP_SYS_RAWIO) check.
//! Its own module, under both `dma` and `pci`, so that neither imports the other for it.

/// The process's effective capability set (bit `n` = capability `n`), asked of the kernel
/// with `capget(2)`. It needs no file descriptor, so it cannot fail for want of one:
/// reading `/proc/self/status` failed with EMFILE when descriptors ran out, and that was
/// taken as "no capability".
pub fn effective_capabilities() -> std::io::Result<u64> {
    /// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
    const VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget reads the header and writes two `Data` words for version 3, both
    // locals of the layout linux/capability.h defines; pid 0 is this thread.
    let r = unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// Whether the process has CAP_IPC_LOCK (14, linux/capability.h) in its effective set
/// ([`effective_capabilities`]).
pub fn has_cap_ipc_lock() -> std::io::Result<bool> {
    const CAP_IPC_LOCK: u32 = 14;
    Ok(effective_capabilities()? & (1 << CAP_IPC_LOCK) != 0)
}

//! The kernel VFIO backend of [`PciFunction`]: a ConnectX function bound to vfio-pci.
//!
//! Three modes, chosen by [`open`] in this order unless [`VfioOptions::mode`] forces one:
//! - [`VfioMode::Iommufd`]: `/dev/iommu` + the device cdev `/dev/vfio/devices/vfioN` (6.6+),
//!   an IOAS per function (vfio-kernel.md §7.B);
//! - [`VfioMode::Container`]: the legacy container/group API with type1v2 (§7.A);
//! - [`VfioMode::NoIommu`] (opt-in, [`VfioOptions::allow_noiommu`]): a legacy `noiommu-N`
//!   group, no translation; the device sees physical addresses from `/proc/self/pagemap`
//!   (§1.5). Needs CAP_SYS_RAWIO and CAP_SYS_ADMIN and is refused without them.
//!
//! # Why own ioctl shims rather than vfio-ioctls
//! dependencies.md lists vfio-ioctls 0.10's gaps, and each one hits a requirement here:
//! config-space and reset errors are swallowed (we must report them), `Drop` panics on a
//! failed detach (teardown must never panic), there is no `VFIO_IOMMU_GET_INFO` nor
//! `IOMMU_IOAS_IOVA_RANGES` (we must return the kernel's IOVA ranges), no no-IOMMU mode, no
//! per-vector MSI-X, and `vfio_cdev` drags in kvm-ioctls and vm-memory. The subset of the
//! uAPI we need is ~25 ioctls on a dozen fixed-layout structs, so [`uapi`] defines them
//! (sizes const-asserted against the kernel's) and `sys` issues them through `libc::ioctl`:
//! no new dependency, full errno on every failure, and a teardown we control.
//!
//! # Teardown
//! [`VfioFunction::quiesce`] (also run by `Drop`) clears bus master, disables interrupts and
//! unmaps every DMA mapping, returning the errors. `Drop` then unmaps the BARs and closes in
//! the order the kernel wants (iommufd: detach, close device, destroy IOAS, close iommufd;
//! legacy: close device, unset container, close group, close container), logging errors with
//! `tracing` instead of panicking.

mod container;
mod device;
mod dmabuf;
mod iommufd;
pub mod iova;
pub mod noiommu;
mod sys;
use sys::open_rw;
#[cfg(test)]
mod tests;
pub mod uapi;
#[cfg(test)]
mod uapi_check;

use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::EventFd;

use super::sysfs::{self, Sysfs};
use super::{BarRegion, DmaMapping, Iova, IovaRange, PciError, PciFunction};

/// Errors of the VFIO backend (wrapped in [`PciError::Vfio`]).
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// An ioctl failed.
    #[error("{what}: {source}")]
    Ioctl {
        /// The ioctl.
        what: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// Another system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was attempted.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A device node could not be opened.
    #[error("cannot open {path}: {source} ({hint})")]
    Open {
        /// The node.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
        /// How to fix it.
        hint: &'static str,
    },
    /// Discovery failed.
    #[error(transparent)]
    Sysfs(#[from] sysfs::SysfsError),
    /// The kernel returned something that does not parse.
    #[error("malformed {what} from the kernel: {why}")]
    Malformed {
        /// Which structure.
        what: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// The function is not bound to vfio-pci.
    #[error("{bdf} is bound to {driver}, not vfio-pci: run `uhca-bind bind {bdf}`")]
    NotVfio {
        /// The function.
        bdf: String,
        /// Its driver (or "no driver").
        driver: String,
    },
    /// The function has no IOMMU group.
    #[error(
        "{bdf} has no IOMMU group: turn the IOMMU on (intel_iommu=on / amd_iommu=on on the kernel command line), \
         or allow no-IOMMU mode explicitly"
    )]
    NoGroup {
        /// The function.
        bdf: String,
    },
    /// The group is not viable.
    #[error(
        "IOMMU group {group} is not viable: every function in it must be bound to vfio-pci or have no driver \
         (see `uhca-bind status`)"
    )]
    NotViable {
        /// The group node.
        group: String,
    },
    /// No-IOMMU mode was refused.
    #[error("no-IOMMU mode refused: {0}")]
    NoIommuRefused(String),
    /// Pagemap translation failed.
    #[error("physical address lookup failed: {0}")]
    Pagemap(&'static str),
    /// Pinning the requested DMA memory would exceed RLIMIT_MEMLOCK.
    #[error(
        "{need} bytes of DMA memory must be pinned but RLIMIT_MEMLOCK is {limit} bytes: raise the memlock limit by \
         {short} bytes: ulimit -l {kib} (KiB; or LimitMEMLOCK=infinity for a systemd unit, or grant CAP_IPC_LOCK)"
    )]
    Memlock {
        /// Bytes that must be pinned.
        need: u64,
        /// The soft limit.
        limit: u64,
        /// How much is missing.
        short: u64,
        /// The limit to set, in KiB.
        kib: u64,
    },
    /// The kernel unmapped a different length than asked.
    #[error("DMA unmap at {iova:#x}: asked for {len:#x} bytes, the kernel unmapped {done:#x}")]
    PartialUnmap {
        /// IOVA.
        iova: u64,
        /// Asked.
        len: u64,
        /// Done.
        done: u64,
    },
    /// Not available on this kernel or device.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// No BAR with that index can be mapped.
    #[error("BAR {0} is not mmap-able")]
    NoBar(u8),
    /// The vector does not exist.
    #[error("interrupt vector {0} does not exist")]
    NoVector(u32),
    /// No mode could open the function.
    #[error("cannot open {bdf} through VFIO: {tried}")]
    NoPath {
        /// The function.
        bdf: String,
        /// What was tried and why it failed.
        tried: String,
    },
    /// The function was already torn down.
    #[error("the VFIO function is closed")]
    Closed,
}

impl VfioError {
    fn ioctl(what: &'static str) -> impl Fn(io::Error) -> VfioError {
        move |source| VfioError::Ioctl { what, source }
    }
    fn os(what: &'static str) -> impl Fn(io::Error) -> VfioError {
        move |source| VfioError::Os { what, source }
    }
}

impl From<VfioError> for PciError {
    fn from(e: VfioError) -> PciError {
        match e {
            VfioError::NoBar(i) => PciError::NoBar(i),
            VfioError::NoVector(v) => PciError::NoVector(v),
            e => PciError::Vfio(Box::new(e)),
        }
    }
}

/// How a function is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VfioMode {
    /// iommufd + device cdev.
    Iommufd,
    /// Legacy container/group, type1v2.
    Container,
    /// Legacy no-IOMMU group (unsafe: no isolation).
    NoIommu,
}

/// Options of [`open`].
#[derive(Debug, Clone)]
pub struct VfioOptions {
    /// sysfs root (`/sys`).
    pub sysfs_root: PathBuf,
    /// devtmpfs root (`/dev`).
    pub dev_root: PathBuf,
    /// Force a mode instead of trying iommufd, then the legacy container.
    pub mode: Option<VfioMode>,
    /// Allow no-IOMMU mode when the function has no IOMMU behind it.
    pub allow_noiommu: bool,
    /// Bytes of DMA memory the caller will map, checked against RLIMIT_MEMLOCK at open.
    pub dma_budget: u64,
    /// Reset the function at open (if it supports reset).
    pub reset: bool,
    /// Enable memory decode and bus mastering at open.
    pub bus_master: bool,
}

impl Default for VfioOptions {
    fn default() -> Self {
        VfioOptions {
            sysfs_root: "/sys".into(),
            dev_root: "/dev".into(),
            mode: None,
            allow_noiommu: false,
            dma_budget: 0,
            reset: true,
            bus_master: true,
        }
    }
}

enum Domain {
    Container(container::Container),
    Iommufd(iommufd::Iommufd),
}

/// A PCI function opened through VFIO.
pub struct VfioFunction {
    bdf: String,
    mode: VfioMode,
    device: Option<device::VfioDevice>,
    domain: Domain,
    ranges: Vec<IovaRange>,
    page: u64,
    dma_limit: Option<u32>,
    maps: Mutex<iova::MapTable>,
    quiesced: Mutex<bool>,
    /// Whether `IOMMU_IOAS_MAP_FILE` is worth trying (cleared when the kernel lacks it).
    map_file_ok: AtomicBool,
}

impl std::fmt::Debug for VfioFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VfioFunction({}, {:?})", self.bdf, self.mode)
    }
}

/// Opens `bdf` (bound to vfio-pci) through the best available mode.
pub fn open(bdf: &str, opts: &VfioOptions) -> Result<Arc<dyn PciFunction>, PciError> {
    Ok(Arc::new(VfioFunction::open(bdf, opts)?))
}

/// The `RLIMIT_MEMLOCK` soft limit in bytes (`None` = unlimited): all DMA memory mapped
/// through an IOMMU is pinned and counts against it unless the process has CAP_IPC_LOCK.
pub fn memlock_limit() -> io::Result<Option<u64>> {
    sys::memlock_limit()
}

/// Whether this process has CAP_IPC_LOCK (pinned memory is then not limited).
pub fn has_ipc_lock() -> io::Result<bool> {
    noiommu::has_cap(noiommu::CAP_IPC_LOCK)
}

fn memlock_check(more: u64, pinned: u64) -> Result<(), VfioError> {
    let limit = sys::memlock_limit().map_err(VfioError::os("getrlimit(RLIMIT_MEMLOCK)"))?;
    let cap = has_ipc_lock().map_err(VfioError::os("capget"))?;
    iova::check_memlock(pinned, more, limit, cap)
}

impl VfioFunction {
    /// Opens `bdf` as [`open`] does, returning the concrete type.
    pub fn open(bdf: &str, opts: &VfioOptions) -> Result<VfioFunction, VfioError> {
        let bdf = sysfs::normalize_bdf(bdf)?;
        let sys = Sysfs::new(&opts.sysfs_root);
        if !sys.device_dir(&bdf).exists() {
            return Err(sysfs::SysfsError::NoFunction {
                path: sys.device_dir(&bdf),
                bdf,
            }
            .into());
        }
        match sys.driver_of(&bdf) {
            Some(d) if d == "vfio-pci" => {}
            d => {
                return Err(VfioError::NotVfio {
                    driver: d.unwrap_or_else(|| "no driver".into()),
                    bdf,
                });
            }
        }
        memlock_check(opts.dma_budget, 0)?;
        let group = sys.iommu_group_of(&bdf);
        let noiommu_group = group
            .as_deref()
            .map(|g| opts.dev_root.join(format!("vfio/noiommu-{g}")));
        let is_noiommu =
            noiommu_group.as_deref().is_some_and(Path::exists) && sys.noiommu_enabled();
        let modes: Vec<VfioMode> = match opts.mode {
            Some(m) => vec![m],
            None if is_noiommu => vec![VfioMode::NoIommu],
            None => vec![VfioMode::Iommufd, VfioMode::Container],
        };
        let mut tried = Vec::new();
        for mode in modes {
            let r = match mode {
                VfioMode::Iommufd => match sys.vfio_cdev_of(&bdf) {
                    Some(c) => {
                        Self::open_iommufd(&bdf, &opts.dev_root.join("vfio/devices").join(c), opts)
                    }
                    None => Err(VfioError::Unsupported(
                        "no VFIO device cdev (kernel without CONFIG_VFIO_DEVICE_CDEV)",
                    )),
                },
                VfioMode::Container => match &group {
                    Some(g) => {
                        Self::open_container(&bdf, &opts.dev_root.join("vfio").join(g), opts, false)
                    }
                    None => Err(VfioError::NoGroup { bdf: bdf.clone() }),
                },
                VfioMode::NoIommu => {
                    if !opts.allow_noiommu {
                        Err(VfioError::NoIommuRefused(
                            "the function has no IOMMU; set VfioOptions::allow_noiommu to accept no isolation".into(),
                        ))
                    } else if let Some(g) =
                        noiommu_group.as_deref().filter(|_| sys.noiommu_enabled())
                    {
                        crate::dma::effective_capabilities()
                            .map_err(VfioError::os("capget"))
                            .and_then(noiommu::check_caps)
                            .and_then(|()| Self::open_container(&bdf, g, opts, true))
                    } else {
                        Err(VfioError::NoIommuRefused(
                            "vfio's enable_unsafe_noiommu_mode is off or the group is not a noiommu group".into(),
                        ))
                    }
                }
            };
            match r {
                Ok(f) => return f.start(opts),
                Err(e) => tried.push((mode, e)),
            }
        }
        if tried.len() == 1 {
            return Err(tried.pop().expect("one").1);
        }
        let tried = tried
            .iter()
            .map(|(m, e)| format!("{m:?}: {e}"))
            .collect::<Vec<_>>()
            .join("; ");
        Err(VfioError::NoPath { bdf, tried })
    }

    fn open_container(
        bdf: &str,
        group: &Path,
        opts: &VfioOptions,
        noiommu: bool,
    ) -> Result<VfioFunction, VfioError> {
        let (c, dev) = container::Container::open(group, &opts.dev_root, bdf, noiommu)?;
        let (ranges, page, limit) = if noiommu {
            (
                vec![IovaRange {
                    start: 0,
                    end: (1 << 52) - 1,
                }],
                sys::page_size() as u64,
                None,
            )
        } else {
            (
                c.info.ranges.clone(),
                iova::min_page(c.info.pgsizes),
                c.info.dma_avail,
            )
        };
        Ok(VfioFunction {
            bdf: bdf.to_string(),
            mode: if noiommu {
                VfioMode::NoIommu
            } else {
                VfioMode::Container
            },
            device: Some(device::VfioDevice::new(dev)?),
            domain: Domain::Container(c),
            ranges,
            page,
            dma_limit: limit,
            maps: Mutex::default(),
            quiesced: Mutex::new(false),
            map_file_ok: AtomicBool::new(true),
        })
    }

    fn open_iommufd(bdf: &str, cdev: &Path, opts: &VfioOptions) -> Result<VfioFunction, VfioError> {
        let (i, dev) = iommufd::Iommufd::open(cdev, &opts.dev_root)?;
        let device = device::VfioDevice::new(dev)?;
        Ok(VfioFunction {
            bdf: bdf.to_string(),
            mode: VfioMode::Iommufd,
            ranges: i.ranges.clone(),
            page: i.alignment.max(sys::page_size() as u64),
            dma_limit: None,
            device: Some(device),
            domain: Domain::Iommufd(i),
            maps: Mutex::default(),
            quiesced: Mutex::new(false),
            map_file_ok: AtomicBool::new(true),
        })
    }

    /// §7.A steps 8-9: optional reset, then memory decode + bus master.
    fn start(self, opts: &VfioOptions) -> Result<VfioFunction, VfioError> {
        let dev = self.dev()?;
        if opts.reset && dev.info.flags & uapi::VFIO_DEVICE_FLAGS_RESET != 0 {
            dev.reset()?;
        }
        if opts.bus_master {
            let mut b = [0u8; 2];
            dev.config_read(super::config::COMMAND, &mut b)
                .map_err(pci_to_vfio)?;
            let cmd = u16::from_le_bytes(b)
                | super::config::COMMAND_MEMORY
                | super::config::COMMAND_MASTER;
            dev.config_write(super::config::COMMAND, &cmd.to_le_bytes())
                .map_err(pci_to_vfio)?;
        }
        Ok(self)
    }

    fn dev(&self) -> Result<&device::VfioDevice, VfioError> {
        self.device.as_ref().ok_or(VfioError::Closed)
    }

    /// The mode in use.
    pub fn mode(&self) -> VfioMode {
        self.mode
    }

    /// Supported IOMMU page granule (the smallest mapping unit).
    pub fn page_size(&self) -> u64 {
        self.page
    }

    /// Routes MSI (IRQ index 1, not MSI-X) to `fd` (devices without MSI-X, e.g. QEMU's edu).
    pub fn set_msi(&self, fd: Option<&EventFd>) -> Result<(), PciError> {
        Ok(self.dev()?.set_irq(1, 0, fd)?)
    }

    /// Physical address of `[vaddr, vaddr + len)` (no-IOMMU mode: the IOVA to pass to
    /// [`PciFunction::dma_map`] and to program into the device).
    pub fn phys_addr(vaddr: *const u8, len: usize) -> Result<Iova, PciError> {
        Ok(Iova(noiommu::virt_to_phys(vaddr as usize, len)?))
    }

    /// Stops the function's DMA and interrupts: clears bus master, disables MSI/MSI-X and
    /// unmaps every DMA mapping. Idempotent; returns every error met (it goes on after each).
    pub fn quiesce(&self) -> Result<(), Vec<VfioError>> {
        let mut done = self.quiesced.lock().unwrap_or_else(|e| e.into_inner());
        if *done {
            return Ok(());
        }
        *done = true;
        let mut errs = Vec::new();
        if let Ok(dev) = self.dev() {
            let mut b = [0u8; 2];
            let r = dev
                .config_read(super::config::COMMAND, &mut b)
                .and_then(|()| {
                    let cmd = u16::from_le_bytes(b) & !super::config::COMMAND_MASTER;
                    dev.config_write(super::config::COMMAND, &cmd.to_le_bytes())
                });
            if let Err(e) = r {
                errs.push(pci_to_vfio(e));
            }
            if let Err(e) = dev.disable_irqs() {
                errs.push(e);
            }
        }
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        for (iova, len) in maps.all() {
            match self.domain_unmap(iova, len) {
                Ok(()) => maps.remove(iova),
                Err(e) => errs.push(e),
            }
        }
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }

    /// iommufd: maps a file-backed [`DmaMapping`] with `IOMMU_IOAS_MAP_FILE` (§7.B step 6).
    /// Returns `false` when the mapping has no file or the kernel has no `MAP_FILE` (before
    /// 6.13: `ENOTTY`; a file type it does not take: `EOPNOTSUPP`/`EINVAL`), so the caller
    /// maps by address instead.
    fn map_by_file(&self, i: &iommufd::Iommufd, m: &DmaMapping) -> Result<bool, VfioError> {
        let Some(b) = m
            .backing
            .filter(|_| self.map_file_ok.load(Ordering::Relaxed))
        else {
            return Ok(false);
        };
        // SAFETY: the caller of dma_map keeps the backing file open for the call (it backs
        // the memory being mapped); the kernel takes its own reference.
        let fd = unsafe { BorrowedFd::borrow_raw(b.fd) };
        match i.map_file(fd, b.offset, m.len as u64, m.iova.0) {
            Ok(()) => Ok(true),
            Err(VfioError::Ioctl { source, .. })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL)
                ) =>
            {
                tracing::debug!(error = %source, "IOMMU_IOAS_MAP_FILE unavailable; mapping by address");
                self.map_file_ok.store(false, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Maps `len` bytes of a dma-buf (a peer device's BAR exported with
    /// `VFIO_DEVICE_FEATURE_DMA_BUF`) at `iova`, so this function can DMA to it
    /// (iommufd mode only; kernel 6.19+; vfio-kernel.md §2, §7.B step 9). Undo with
    /// [`PciFunction::dma_unmap`]. A revoked dma-buf fails with `ENODEV`.
    pub fn map_dmabuf(
        &self,
        dmabuf: BorrowedFd<'_>,
        offset: u64,
        len: u64,
        iova: Iova,
    ) -> Result<(), PciError> {
        let Domain::Iommufd(i) = &self.domain else {
            return Err(VfioError::Unsupported(
                "dma-buf import needs iommufd mode (IOMMU_IOAS_MAP_FILE)",
            )
            .into());
        };
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.check(&self.ranges, self.page, iova.0, len, 0, self.dma_limit)
            .map_err(|reason| PciError::DmaMap {
                iova,
                len: len as usize,
                reason,
            })?;
        i.map_file(dmabuf, offset, len, iova.0)?;
        maps.insert(iova.0, len, 0);
        Ok(())
    }

    fn domain_unmap(&self, iova: u64, len: u64) -> Result<(), VfioError> {
        match &self.domain {
            Domain::Container(c) if c.noiommu => Ok(()),
            Domain::Container(c) => c.unmap(iova, len),
            Domain::Iommufd(i) => i.unmap(iova, len),
        }
    }
}

fn pci_to_vfio(e: PciError) -> VfioError {
    match e {
        PciError::Os { what, source } => VfioError::Os { what, source },
        PciError::Vfio(v) => *v,
        _ => VfioError::Unsupported("config space access out of range"),
    }
}

// SAFETY: BAR mappings live until Drop (VfioDevice::unmap_bars runs only there), so a BarRegion
// stays valid while the function object lives; dma_unmap returns only after the kernel's
// UNMAP ioctl removed the IOMMU mapping (type1 and iommufd unmap synchronously). In no-IOMMU
// mode nothing is mapped; the trait's promise holds vacuously and the caller owns the
// memory's lifetime, as documented on `phys_addr`.
unsafe impl PciFunction for VfioFunction {
    fn name(&self) -> String {
        self.bdf.clone()
    }

    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError> {
        self.dev()?.config_read(offset, buf)
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError> {
        self.dev()?.config_write(offset, data)
    }

    fn map_bar(&self, index: u8) -> Result<BarRegion, PciError> {
        let m = self.dev()?.map_bar(index)?;
        Ok(BarRegion {
            ptr: m.addr as *mut u8,
            len: m.len,
        })
    }

    fn iova_ranges(&self) -> Vec<IovaRange> {
        self.ranges.clone()
    }

    unsafe fn dma_map(&self, m: &DmaMapping) -> Result<(), PciError> {
        let (vaddr, len, iova) = (m.vaddr as usize, m.len as u64, m.iova.0);
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.check(&self.ranges, self.page, iova, len, vaddr, self.dma_limit)
            .map_err(|reason| PciError::DmaMap {
                iova: m.iova,
                len: m.len,
                reason,
            })?;
        match &self.domain {
            Domain::Container(c) if c.noiommu => {
                let pa = noiommu::virt_to_phys(vaddr, m.len)?;
                if pa != iova {
                    return Err(PciError::DmaMap {
                        iova: m.iova,
                        len: m.len,
                        reason: "no-IOMMU mode: the IOVA must be the physical address (VfioFunction::phys_addr)",
                    });
                }
            }
            Domain::Container(c) => {
                memlock_check(len, maps.bytes())?;
                // SAFETY: the caller keeps the memory allocated until dma_unmap (trait contract).
                unsafe { c.map(vaddr, len, iova) }?
            }
            Domain::Iommufd(i) => {
                memlock_check(len, maps.bytes())?;
                if !self.map_by_file(i, m)? {
                    // SAFETY: as above.
                    unsafe { i.map(vaddr, len, iova) }?
                }
            }
        }
        maps.insert(iova, len, vaddr);
        Ok(())
    }

    fn dma_unmap(&self, iova: Iova, len: usize) -> Result<(), PciError> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if !maps.contains_exact(iova.0, len as u64) {
            return Err(PciError::NotMapped { iova, len });
        }
        self.domain_unmap(iova.0, len as u64)?;
        maps.remove(iova.0);
        Ok(())
    }

    fn reset(&self) -> Result<(), PciError> {
        Ok(self.dev()?.reset()?)
    }

    fn dma_map_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
        iova: Iova,
    ) -> Result<(), PciError> {
        dmabuf::import(self, fd, offset, len, iova)
    }

    fn export_dmabuf(
        &self,
        bar: u8,
        offset: u64,
        len: u64,
    ) -> Result<std::os::fd::OwnedFd, PciError> {
        dmabuf::export(self.dev()?.fd(), bar, offset, len)
    }

    fn num_irqs(&self) -> u32 {
        self.dev().map_or(0, |d| d.num_msix())
    }

    fn set_irq(&self, vector: u32, fd: Option<&EventFd>) -> Result<(), PciError> {
        Ok(self
            .dev()?
            .set_irq(uapi::VFIO_PCI_MSIX_IRQ_INDEX, vector, fd)?)
    }
}

impl Drop for VfioFunction {
    fn drop(&mut self) {
        let mut errs = self.quiesce().err().unwrap_or_default();
        if let Some(dev) = &self.device {
            // SAFETY: we are being dropped; every Bar holds an Arc to us, so none is left.
            if let Err(e) = unsafe { dev.unmap_bars() } {
                errs.push(e);
            }
            if let Domain::Iommufd(i) = &mut self.domain
                && let Err(e) = i.detach(dev.fd())
            {
                errs.push(e);
            }
        }
        self.device.take(); // closes the device fd
        errs.extend(match &mut self.domain {
            Domain::Container(c) => c.close(),
            Domain::Iommufd(i) => i.close(),
        });
        for e in errs {
            tracing::error!(function = %self.bdf, error = %e, "VFIO teardown");
        }
    }
}

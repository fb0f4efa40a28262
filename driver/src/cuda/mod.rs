//! The CUDA client for peer memory (feature `gpu`): GPU memory that the NIC can reach as a
//! dma-buf.
//!
//! libcuda is loaded at run time (cudarc's dynamic loading), so a build with this feature
//! needs no CUDA toolkit, and a machine with no NVIDIA driver, no GPU or a failing driver gets
//! a typed [`CudaError`] (or `false` from [`Cuda::is_present`]), never a panic: before the first
//! call, every driver symbol this module uses is looked up, because cudarc panics on a missing
//! one.
//!
//! - [`Cuda`]: one GPU (its primary context), its facts ([`GpuFacts`]: name, PCI address,
//!   compute capability, dma-buf and GPUDirect RDMA attributes) and raw dma-buf export.
//! - [`GpuBuffer`]: `cuMemAlloc` memory sized and aligned for dma-buf export, freed on drop,
//!   with host copies for checking bytes, its pointer attributes ([`PointerAttributes`]) and
//!   [`GpuBuffer::export_dmabuf`] (`cuMemGetHandleForAddressRange` with
//!   `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`). Every export range is checked here against the
//!   bounds of its allocation (`cuMemGetAddressRange`) before the driver sees it: a real
//!   H100 exported past the allocation when asked to.
//! - [`DmaBufInfo`]: what the kernel says about a dma-buf fd (`/proc/self/fdinfo`).
//!
//! What the exported dma-buf is good for (docs/spec/vfio-kernel.md §2.2, §2.4): NVIDIA's
//! exporter is static (the memory stays mapped while exported, no revocation), so a client
//! needs no invalidation callback. iommufd's `IOMMU_IOAS_MAP_FILE` accepts only VFIO
//! dma-bufs and refuses this one (`EOPNOTSUPP`); the kernel RDMA stack
//! (`ibv_reg_dmabuf_mr`) can import it. CUDA only exports when
//! `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` is set (open GPU kernel modules).
//!
//! This is an FFI module: its `unsafe` blocks are calls into libcuda, each with the contract
//! it relies on.

mod buffer;
mod dmabuf;

pub use buffer::{DevicePtr, GPU_PAGE_SIZE, GpuBuffer, MemoryType, PointerAttributes};
pub use dmabuf::{DmaBufError, DmaBufInfo};

use std::ffi::{CStr, c_char, c_int};
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

/// Errors of the CUDA client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No libcuda could be loaded.
    #[error("libcuda could not be loaded (no NVIDIA driver installed, or not on the library path)")]
    NoLibrary,
    /// libcuda lacks a call this client needs.
    #[error("libcuda has no symbol {0} (NVIDIA driver too old for this client)")]
    MissingSymbol(&'static str),
    /// A driver call failed.
    #[error("{call} failed: {name} ({code}): {description}")]
    Driver {
        /// The CUDA driver call.
        call: &'static str,
        /// The raw `CUresult`.
        code: u32,
        /// The `CUresult` name (`CUDA_ERROR_INVALID_VALUE`).
        name: String,
        /// The driver's description of it.
        description: String,
    },
    /// The ordinal names no GPU.
    #[error("CUDA device {ordinal} does not exist ({count} visible)")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// How many devices the driver sees.
        count: u32,
    },
    /// The GPU cannot export dma-bufs.
    #[error(
        "CUDA device {ordinal} cannot export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED \
         is 0; it needs the open GPU kernel modules and a 5.12+ kernel)"
    )]
    DmaBufUnsupported {
        /// The device.
        ordinal: u32,
    },
    /// A zero-length allocation or range.
    #[error("a GPU buffer or range cannot be empty")]
    ZeroLength,
    /// The length does not fit after rounding to the export alignment.
    #[error("{len:#x} bytes cannot be rounded up to a multiple of {align:#x}")]
    TooLarge {
        /// Requested length.
        len: usize,
        /// Alignment.
        align: usize,
    },
    /// A range reaches past the end of its buffer.
    #[error("range {offset:#x}+{len:#x} is outside the buffer of {size:#x} bytes")]
    OutOfRange {
        /// Offset in the buffer.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the buffer.
        size: usize,
    },
    /// A raw export's range does not lie inside the one allocation that holds its first byte
    /// (`cuMemGetAddressRange`). Checked here, not left to the driver: a real H100 (driver
    /// 580) exported a range running 64 pages past its allocation (docs/spec/cuda.md).
    #[error("range {ptr}+{len:#x} runs outside its allocation {base}+{size:#x}")]
    OutsideAllocation {
        /// First byte of the range.
        ptr: DevicePtr,
        /// Length of the range.
        len: usize,
        /// Start of the allocation holding `ptr`.
        base: DevicePtr,
        /// Size of that allocation.
        size: u64,
    },
    /// A dma-buf range whose offset or length is not a multiple of the host page size.
    #[error("dma-buf range {offset:#x}+{len:#x} is not aligned to the host page size {align:#x}")]
    Misaligned {
        /// Offset in the buffer.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Required alignment.
        align: usize,
    },
}

/// The driver calls this module makes. They are all looked up before the first call, because
/// cudarc's dynamic loader panics on a missing symbol.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemsetD8_v2",
    "cuMemGetInfo_v2",
    "cuMemGetAddressRange_v2",
    "cuMemGetHandleForAddressRange",
    "cuPointerGetAttribute",
    "cuPointerSetAttribute",
];

/// Loads libcuda, checks its symbols and runs `cuInit` once per process.
fn driver() -> Result<(), CudaError> {
    static INIT: OnceLock<Result<(), CudaError>> = OnceLock::new();
    INIT.get_or_init(init_driver).clone()
}

fn init_driver() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the candidate names and drops what it opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoLibrary);
    }
    // SAFETY: a candidate loaded just above, so `culib` finds it again instead of panicking;
    // loading runs libcuda's initialisers as in any CUDA program.
    let lib = unsafe { sys::culib() };
    for &name in SYMBOLS {
        // SAFETY: a symbol lookup only; the pointer is not used.
        if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
            return Err(CudaError::MissingSymbol(name));
        }
    }
    // SAFETY: cuInit takes only flags (must be 0); its symbol was checked above.
    check("cuInit", unsafe { sys::cuInit(0) })
}

/// Turns a `CUresult` into `Ok` or a [`CudaError::Driver`] naming `call`.
fn check(call: &'static str, r: sys::CUresult) -> Result<(), CudaError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(CudaError::Driver {
        call,
        code: r as u32,
        name: driver_string(r, sys::cuGetErrorName).unwrap_or_else(|| format!("{r:?}")),
        description: driver_string(r, sys::cuGetErrorString).unwrap_or_default(),
    })
}

/// Calls `cuGetErrorName` or `cuGetErrorString`.
fn driver_string(
    r: sys::CUresult,
    f: unsafe fn(sys::CUresult, *mut *const c_char) -> sys::CUresult,
) -> Option<String> {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: both calls only store a pointer to a static string in `p`; they are called only
    // after `init_driver` checked their symbols (every `check` follows it).
    let ok = unsafe { f(r, &mut p) };
    if ok != sys::CUresult::CUDA_SUCCESS || p.is_null() {
        return None;
    }
    // SAFETY: on success the driver returns a NUL-terminated string that lives as long as
    // the library.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// How the GPU orders its view of GPUDirect RDMA writes
/// (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritesOrdering {
    /// No ordering guarantee: a flush (`cuFlushGPUDirectRDMAWrites`) is needed.
    None,
    /// The owning device sees the writes in order.
    Owner,
    /// All devices see the writes in order.
    AllDevices,
    /// A value this client does not know.
    Unknown(i32),
}

impl WritesOrdering {
    /// From the attribute's raw value.
    pub fn from_raw(v: i32) -> Self {
        match v {
            0 => Self::None,
            100 => Self::Owner,
            200 => Self::AllDevices,
            v => Self::Unknown(v),
        }
    }

    /// A short name for tools.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Owner => "owner",
            Self::AllDevices => "all_devices",
            Self::Unknown(_) => "unknown",
        }
    }
}

/// Facts about one GPU that matter for peer memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFacts {
    /// CUDA device ordinal.
    pub ordinal: u32,
    /// Marketing name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// PCI address as sysfs writes it (`0000:1b:00.0`), to relate the GPU to the NIC's
    /// topology; the driver's own string if it cannot be parsed.
    pub pci_bus_id: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Device memory in bytes.
    pub total_mem: u64,
    /// CUDA driver API version (`13000` = 13.0).
    pub driver_version: u32,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub dma_buf_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gpu_direct_rdma_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`.
    pub gpu_direct_rdma_with_vmm: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`: bit 0 = host
    /// (`cuFlushGPUDirectRDMAWrites`), bit 1 = memops.
    pub gpu_direct_rdma_flush_writes_options: u32,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`.
    pub gpu_direct_rdma_writes_ordering: WritesOrdering,
}

/// Rewrites the driver's PCI bus id (`0000:1B:00.0`, or an 8-digit domain) in sysfs form
/// (`0000:1b:00.0`); `None` if it is not `domain:bus:device.function` in hex.
pub fn normalize_bdf(s: &str) -> Option<String> {
    let mut parts = s.trim().split(':');
    let (dom, bus, devfn) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (dev, func) = devfn.split_once('.')?;
    let hex = |t: &str| u32::from_str_radix(t, 16).ok();
    let (dom, bus, dev, func) = (hex(dom)?, hex(bus)?, hex(dev)?, hex(func)?);
    if dom > 0xffff || bus > 0xff || dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// A retained primary context of one device; released when the last user drops.
struct Context {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    ordinal: u32,
    dma_buf_supported: bool,
}

// SAFETY: a CUcontext is a driver handle, not memory this process touches; the driver API
// lets any thread make a context current, and every use here pushes it on the calling thread
// first (`Context::current`).
unsafe impl Send for Context {}
// SAFETY: as for Send; the driver serialises calls on one context internally.
unsafe impl Sync for Context {}

impl Context {
    /// Makes the context current on this thread until the guard drops.
    fn current(&self) -> Result<Current<'_>, CudaError> {
        // SAFETY: `ctx` is a primary context retained for this object's life.
        check("cuCtxPushCurrent_v2", unsafe {
            sys::cuCtxPushCurrent_v2(self.ctx)
        })?;
        Ok(Current {
            _ctx: PhantomData,
            _not_send: PhantomData,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Cuda::open`; every buffer of the context holds an
        // `Arc` to it, so none is left. A failure cannot be reported from drop and leaves
        // only a reference the process exit drops.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// Keeps a context current on this thread; pops it on drop. Not `Send`: the pop must run on
/// the thread that pushed.
struct Current<'a> {
    _ctx: PhantomData<&'a Context>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context that `Context::current` pushed on this thread (the guard
        // is not Send). A failure leaves the context current,
        // which is harmless.
        unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    }
}

/// One GPU through the CUDA driver API. Cloning shares the context.
#[derive(Clone)]
pub struct Cuda {
    ctx: Arc<Context>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("ordinal", &self.ctx.ordinal)
            .finish()
    }
}

impl Cuda {
    /// Whether a usable GPU exists: libcuda loads, has every call this client needs, `cuInit`
    /// succeeds and at least one device is visible. Never panics.
    pub fn is_present() -> bool {
        matches!(Self::device_count(), Ok(n) if n > 0)
    }

    /// How many GPUs the driver sees, or why the driver cannot be used.
    pub fn device_count() -> Result<u32, CudaError> {
        driver()?;
        let mut n: c_int = 0;
        // SAFETY: writes one int; the driver is initialised.
        check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// Opens GPU `ordinal`: retains its primary context (the one the CUDA runtime shares).
    pub fn open(ordinal: u32) -> Result<Self, CudaError> {
        let count = Self::device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let dev = device_handle(ordinal)?;
        let dma_buf_supported = attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
        )? != 0;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `dev` is a valid device handle; the call writes one context handle.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        Ok(Self {
            ctx: Arc::new(Context {
                dev,
                ctx,
                ordinal,
                dma_buf_supported,
            }),
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ctx.ordinal
    }

    /// Facts about device `ordinal`, without opening a context.
    pub fn facts_of(ordinal: u32) -> Result<GpuFacts, CudaError> {
        let count = Self::device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let dev = device_handle(ordinal)?;
        use sys::CUdevice_attribute as A;
        let attr = |a| attribute(dev, a);
        let mut name = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL included, into `name`.
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev)
        })?;
        let mut bus = [0 as c_char; 64];
        // SAFETY: as above, at most `len` bytes into `bus`.
        check("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, dev)
        })?;
        let mut total: usize = 0;
        // SAFETY: writes one size_t.
        check("cuDeviceTotalMem_v2", unsafe {
            sys::cuDeviceTotalMem_v2(&mut total, dev)
        })?;
        let mut version: c_int = 0;
        // SAFETY: writes one int.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut version)
        })?;
        let bus = c_string(&bus);
        Ok(GpuFacts {
            ordinal,
            name: c_string(&name),
            pci_bus_id: normalize_bdf(&bus).unwrap_or(bus),
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            total_mem: total as u64,
            driver_version: version as u32,
            dma_buf_supported: attr(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)? != 0,
            gpu_direct_rdma_supported: attr(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)? != 0,
            gpu_direct_rdma_with_vmm: attr(
                A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
            )? != 0,
            gpu_direct_rdma_flush_writes_options: attr(
                A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
            )? as u32,
            gpu_direct_rdma_writes_ordering: WritesOrdering::from_raw(attr(
                A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
            )?),
        })
    }

    /// Facts about this device.
    pub fn facts(&self) -> Result<GpuFacts, CudaError> {
        Self::facts_of(self.ctx.ordinal)
    }

    /// Whether this device exports dma-bufs (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`).
    pub fn dma_buf_supported(&self) -> bool {
        self.ctx.dma_buf_supported
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        let _cur = self.ctx.current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t; the context is current.
        check("cuMemGetInfo_v2", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }
}

/// The handle of device `ordinal` (checked in range by the caller).
fn device_handle(ordinal: u32) -> Result<sys::CUdevice, CudaError> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one device handle; the driver checks the ordinal.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as c_int)
    })?;
    Ok(dev)
}

/// One device attribute. The peer-memory attributes are newer than some drivers: one the
/// driver does not know (`CUDA_ERROR_INVALID_VALUE`) reads as 0, "not supported".
fn attribute(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32, CudaError> {
    use sys::CUdevice_attribute as A;
    let optional = matches!(
        a,
        A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
            | A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
            | A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
            | A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS
            | A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING
    );
    let mut v: c_int = 0;
    // SAFETY: writes one int; `dev` is a valid handle and the driver checks `a`.
    let r = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
    if optional && r == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(0);
    }
    check("cuDeviceGetAttribute", r)?;
    Ok(v)
}

/// The NUL-terminated string in `buf` (all of it if there is no NUL).
fn c_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_is_normalized_to_sysfs_form() {
        assert_eq!(
            normalize_bdf("0000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(
            normalize_bdf("00000000:C3:1f.7").as_deref(),
            Some("0000:c3:1f.7")
        );
        assert_eq!(normalize_bdf("0000:1b:00"), None);
        assert_eq!(normalize_bdf("0000:1b:20.0"), None);
        assert_eq!(normalize_bdf("0000:1b:00.0:1"), None);
        assert_eq!(normalize_bdf("zz:1b:00.0"), None);
    }

    #[test]
    fn writes_ordering_is_lossless() {
        assert_eq!(WritesOrdering::from_raw(0), WritesOrdering::None);
        assert_eq!(WritesOrdering::from_raw(100), WritesOrdering::Owner);
        assert_eq!(WritesOrdering::from_raw(200), WritesOrdering::AllDevices);
        assert_eq!(WritesOrdering::from_raw(7), WritesOrdering::Unknown(7));
        assert_eq!(WritesOrdering::from_raw(100).name(), "owner");
    }

    #[test]
    fn c_string_stops_at_nul() {
        let buf = [b'H' as c_char, b'1' as c_char, 0, b'x' as c_char];
        assert_eq!(c_string(&buf), "H1");
        assert_eq!(c_string(&[b'a' as c_char; 3]), "aaa");
    }

    #[test]
    fn driver_error_names_call_and_result() {
        let e = CudaError::Driver {
            call: "cuMemGetHandleForAddressRange",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
            description: "invalid argument".into(),
        };
        let s = e.to_string();
        assert!(s.contains("cuMemGetHandleForAddressRange"), "{s}");
        assert!(s.contains("CUDA_ERROR_INVALID_VALUE"), "{s}");
    }
}

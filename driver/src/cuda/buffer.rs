//! GPU memory for peer access: [`GpuBuffer`], its dma-buf export and pointer attributes.
//!
//! Alignment rules (CUDA driver API reference, `cuMemGetHandleForAddressRange`): the address
//! and size of an exported range must be multiples of the host page size. GPUDirect RDMA pins
//! GPU memory in 64 KiB GPU pages (the GPUDirect RDMA guide, "GPU page size"), so a buffer is
//! aligned and sized to the larger of the two: a peer never shares a GPU page with another
//! allocation, and the whole buffer exports as one dma-buf.

use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::{Context, Cuda, CudaError, check};

/// The GPU page size of GPUDirect RDMA: 64 KiB.
pub const GPU_PAGE_SIZE: usize = 64 << 10;

/// An address in a GPU's virtual address space (a `CUdeviceptr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(pub u64);

impl std::fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Where a pointer's memory lives (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryType {
    /// Host memory.
    Host,
    /// Device memory.
    Device,
    /// A CUDA array.
    Array,
    /// Unified (managed) memory.
    Unified,
    /// A value this client does not know.
    Unknown(u32),
}

impl MemoryType {
    /// From the attribute's raw value.
    pub fn from_raw(v: u32) -> Self {
        match v {
            1 => Self::Host,
            2 => Self::Device,
            3 => Self::Array,
            4 => Self::Unified,
            v => Self::Unknown(v),
        }
    }
}

/// Attributes of a device pointer (`cuPointerGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerAttributes {
    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
    pub memory_type: MemoryType,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
    pub device_ordinal: i32,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique per allocation in the process; a peer-memory
    /// client compares it to notice that an address range was freed and reallocated.
    pub buffer_id: u64,
    /// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`: memory operations on the range are synchronous,
    /// as GPUDirect RDMA needs (set on every [`GpuBuffer`]).
    pub sync_memops: bool,
    /// `CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE`.
    pub gpu_direct_rdma_capable: bool,
    /// `CU_POINTER_ATTRIBUTE_MAPPED`.
    pub mapped: bool,
    /// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`: start of the allocation.
    pub range_start: DevicePtr,
    /// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`: size of the allocation.
    pub range_size: u64,
}

impl Cuda {
    /// Allocates at least `len` bytes of device memory, zeroed, aligned and sized for dma-buf
    /// export ([`GpuBuffer::align`]).
    pub fn alloc(&self, len: usize) -> Result<GpuBuffer, CudaError> {
        if len == 0 {
            return Err(CudaError::ZeroLength);
        }
        let align = export_align();
        let size = len
            .checked_next_multiple_of(align)
            .ok_or(CudaError::TooLarge { len, align })?;
        let _cur = self.ctx.current()?;
        // cuMemAlloc aligns large allocations generously (2 MiB in practice) but promises only
        // 256 bytes: if the first try is not aligned, allocate one alignment more and start
        // at the first aligned address inside.
        let mut base = mem_alloc(size)?;
        let mut ptr = base;
        if !base.is_multiple_of(align as u64) {
            mem_free(base);
            let padded = size
                .checked_add(align)
                .ok_or(CudaError::TooLarge { len, align })?;
            base = mem_alloc(padded)?;
            ptr = base.next_multiple_of(align as u64);
        }
        let buf = GpuBuffer {
            ctx: self.ctx.clone(),
            base,
            ptr,
            len: size,
        };
        drop(_cur);
        buf.set_sync_memops()?;
        buf.fill(0)?;
        Ok(buf)
    }

    /// Exports `len` bytes of device memory at `ptr` as a dma-buf fd
    /// (`cuMemGetHandleForAddressRange`, `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`). `ptr` may be
    /// any device address of this context, from any allocator. The range must lie inside the
    /// one allocation that holds `ptr`: this client checks it against that allocation's bounds
    /// (`cuMemGetAddressRange`) and refuses with [`CudaError::OutsideAllocation`], because the
    /// driver does not (a real H100 with driver 580 exported a range running 64 pages past
    /// its allocation). An address that is not device memory of this context is the
    /// driver's [`CudaError::Driver`] from `cuMemGetAddressRange_v2`; page alignment is left to
    /// the driver, whose refusal is a [`CudaError::Driver`] naming
    /// `cuMemGetHandleForAddressRange`. Prefer [`GpuBuffer::export_dmabuf`].
    pub fn export_dmabuf_raw(&self, ptr: DevicePtr, len: usize) -> Result<OwnedFd, CudaError> {
        if !self.ctx.dma_buf_supported {
            return Err(CudaError::DmaBufUnsupported {
                ordinal: self.ctx.ordinal,
            });
        }
        if len == 0 {
            return Err(CudaError::ZeroLength);
        }
        let _cur = self.ctx.current()?;
        let (base, size) = address_range(ptr)?;
        // `ptr` is inside [base, base + size) by the driver's answer; the range must end
        // there too (computed without overflow).
        let inside = ptr
            .0
            .checked_sub(base.0)
            .and_then(|off| size.checked_sub(off))
            .is_some_and(|room| len as u64 <= room);
        if !inside {
            return Err(CudaError::OutsideAllocation {
                ptr,
                len,
                base,
                size,
            });
        }
        let mut fd: i32 = -1;
        // SAFETY: for the dma-buf handle type the driver writes one int (the new fd) through
        // `handle`; the range was checked against its allocation above, and the driver reads no
        // host memory.
        check("cuMemGetHandleForAddressRange", unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut i32).cast::<c_void>(),
                ptr.0,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(CudaError::Driver {
                call: "cuMemGetHandleForAddressRange",
                code: 0,
                name: "CUDA_SUCCESS".into(),
                description: format!("success but no fd ({fd})"),
            });
        }
        // SAFETY: the driver just created this fd for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The attributes of any device pointer of this context.
    pub fn pointer_attributes(&self, ptr: DevicePtr) -> Result<PointerAttributes, CudaError> {
        use sys::CUpointer_attribute as P;
        let _cur = self.ctx.current()?;
        let word = |a| pointer_attribute(ptr, a);
        let int = |a| word(a).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        // Booleans are written as an int or a byte: any non-zero byte of the first four.
        let flag = |a| word(a).map(|b| b[..4].iter().any(|&x| x != 0));
        let long = |a| word(a).map(u64::from_ne_bytes);
        Ok(PointerAttributes {
            memory_type: MemoryType::from_raw(int(P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)? as u32),
            device_ordinal: int(P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?,
            buffer_id: long(P::CU_POINTER_ATTRIBUTE_BUFFER_ID)?,
            sync_memops: flag(P::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)?,
            gpu_direct_rdma_capable: flag(P::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE)?,
            mapped: flag(P::CU_POINTER_ATTRIBUTE_MAPPED)?,
            range_start: DevicePtr(long(P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)?),
            range_size: long(P::CU_POINTER_ATTRIBUTE_RANGE_SIZE)?,
        })
    }
}

/// One pointer attribute as the 8 bytes the driver may write (every attribute read here is
/// an int, a bool, a `size_t`, a `CUdeviceptr` or an `unsigned long long`). The caller has
/// made the context current.
fn pointer_attribute(ptr: DevicePtr, a: sys::CUpointer_attribute) -> Result<[u8; 8], CudaError> {
    let mut v = [0u8; 8];
    // SAFETY: the attributes asked for write at most 8 bytes into `v` (see above).
    check("cuPointerGetAttribute", unsafe {
        sys::cuPointerGetAttribute(v.as_mut_ptr().cast::<c_void>(), a, ptr.0)
    })?;
    Ok(v)
}

/// The allocation holding `ptr`: its start and size (`cuMemGetAddressRange`). The caller has
/// made the context current.
fn address_range(ptr: DevicePtr) -> Result<(DevicePtr, u64), CudaError> {
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: writes one device pointer and one size_t; the driver checks `ptr`.
    check("cuMemGetAddressRange_v2", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr.0)
    })?;
    Ok((DevicePtr(base), size as u64))
}

/// The alignment of every [`GpuBuffer`]: the larger of the GPU page and the host page.
fn export_align() -> usize {
    GPU_PAGE_SIZE.max(crate::dma::system_page_size())
}

/// `cuMemAlloc`; the caller has made the context current.
fn mem_alloc(size: usize) -> Result<sys::CUdeviceptr, CudaError> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer.
    check("cuMemAlloc_v2", unsafe { sys::cuMemAlloc_v2(&mut p, size) })?;
    Ok(p)
}

/// `cuMemFree` of an allocation nothing uses any more; the caller has made the context
/// current. A failure cannot be reported from drop; it leaks device memory only.
fn mem_free(p: sys::CUdeviceptr) {
    // SAFETY: `p` came from `cuMemAlloc` and is freed once; no copy or export is in flight
    // (they are synchronous and borrow the buffer).
    unsafe { sys::cuMemFree_v2(p) };
}

/// Device memory from `cuMemAlloc`, aligned and sized for dma-buf export and GPUDirect RDMA
/// (see the module docs). Freed on drop; exported dma-bufs keep their own reference to the
/// memory in the NVIDIA driver.
pub struct GpuBuffer {
    ctx: Arc<Context>,
    /// What `cuMemAlloc` returned (freed on drop).
    base: sys::CUdeviceptr,
    /// The aligned start given out.
    ptr: sys::CUdeviceptr,
    /// Usable (and exported) length, a multiple of [`GpuBuffer::align`].
    len: usize,
}

impl std::fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("ordinal", &self.ctx.ordinal)
            .field("ptr", &DevicePtr(self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl GpuBuffer {
    /// The device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }

    /// Length in bytes: the requested length rounded up to [`GpuBuffer::align`].
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The alignment of the address and length: the larger of [`GPU_PAGE_SIZE`] and the host
    /// page size.
    pub fn align() -> usize {
        export_align()
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ctx.ordinal
    }

    fn range(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.ptr + offset as u64),
            _ => Err(CudaError::OutOfRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Copies `src` to the buffer at `offset` (synchronous).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<(), CudaError> {
        let dst = self.range(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let _cur = self.ctx.current()?;
        // SAFETY: `src` is readable for its length; `dst..dst+len` is inside this allocation
        // (checked above). The copy from pageable memory returns when `src` may be reused.
        check("cuMemcpyHtoD_v2", unsafe {
            sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast::<c_void>(), src.len())
        })
    }

    /// Copies bytes at `offset` of the buffer into `dst` (synchronous).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), CudaError> {
        let src = self.range(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let _cur = self.ctx.current()?;
        // SAFETY: `dst` is writable for its length and borrowed mutably; the source range is
        // inside this allocation (checked above); the copy is complete on return.
        check("cuMemcpyDtoH_v2", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len())
        })
    }

    /// Sets every byte of the buffer to `byte` and waits for it.
    pub fn fill(&self, byte: u8) -> Result<(), CudaError> {
        let _cur = self.ctx.current()?;
        // SAFETY: the whole range is this allocation's.
        check("cuMemsetD8_v2", unsafe {
            sys::cuMemsetD8_v2(self.ptr, byte, self.len)
        })?;
        // SAFETY: no arguments; waits for the memset on the current context.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Exports the whole buffer as a dma-buf fd.
    pub fn export_dmabuf(&self) -> Result<OwnedFd, CudaError> {
        self.export_dmabuf_range(0, self.len)
    }

    /// Exports `len` bytes at `offset` as a dma-buf fd. Both must be multiples of the host
    /// page size ([`CudaError::Misaligned`]) and inside the buffer
    /// ([`CudaError::OutOfRange`]); the device must support dma-buf
    /// ([`CudaError::DmaBufUnsupported`]).
    pub fn export_dmabuf_range(&self, offset: usize, len: usize) -> Result<OwnedFd, CudaError> {
        if len == 0 {
            return Err(CudaError::ZeroLength);
        }
        let ptr = self.range(offset, len)?;
        let page = crate::dma::system_page_size();
        if !offset.is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(CudaError::Misaligned {
                offset,
                len,
                align: page,
            });
        }
        self.cuda().export_dmabuf_raw(DevicePtr(ptr), len)
    }

    /// The attributes of the buffer's first byte.
    pub fn attributes(&self) -> Result<PointerAttributes, CudaError> {
        self.cuda().pointer_attributes(self.ptr())
    }

    /// The GPU the buffer lives on.
    pub fn cuda(&self) -> Cuda {
        Cuda {
            ctx: self.ctx.clone(),
        }
    }

    /// Marks the allocation for synchronous memory operations
    /// (`CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`), as the GPUDirect RDMA guide asks of memory a
    /// peer device reads or writes.
    fn set_sync_memops(&self) -> Result<(), CudaError> {
        let _cur = self.ctx.current()?;
        let one: u32 = 1;
        // SAFETY: SYNC_MEMOPS reads one unsigned int from `value`; `ptr` is our allocation.
        check("cuPointerSetAttribute", unsafe {
            sys::cuPointerSetAttribute(
                (&one as *const u32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                self.ptr,
            )
        })
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        // Without a current context the free cannot run; the memory goes with the context.
        if let Ok(_cur) = self.ctx.current() {
            mem_free(self.base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_type_is_lossless() {
        assert_eq!(MemoryType::from_raw(1), MemoryType::Host);
        assert_eq!(MemoryType::from_raw(2), MemoryType::Device);
        assert_eq!(MemoryType::from_raw(3), MemoryType::Array);
        assert_eq!(MemoryType::from_raw(4), MemoryType::Unified);
        assert_eq!(MemoryType::from_raw(9), MemoryType::Unknown(9));
    }

    #[test]
    fn export_alignment_covers_gpu_and_host_pages() {
        let a = GpuBuffer::align();
        assert!(a.is_power_of_two());
        assert_eq!(a % GPU_PAGE_SIZE, 0);
        assert_eq!(a % crate::dma::system_page_size(), 0);
    }

    #[test]
    fn device_ptr_prints_hex() {
        assert_eq!(DevicePtr(0x7f00_0000).to_string(), "0x7f000000");
    }
}

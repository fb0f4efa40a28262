/* A stand-in libcuda for driver/tests/cuda_fake.rs: the calls uhca::cuda makes, with the
 * CUDA driver API's C signatures, over host memory. Written for uhca's tests; it copies no
 * NVIDIA code. FAKE_CUDA_MODE picks the behaviour:
 *   gpu       one device that exports dma-bufs (exported as a memfd of the range's size)
 *   nodmabuf  the same device, but CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0
 *   olddriver the same device, but the peer-memory attributes are unknown (INVALID_VALUE)
 *   noinit    cuInit fails with CUDA_ERROR_NO_DEVICE
 *   nodevice  cuInit works, no device
 * Built with -DOMIT_EXPORT it lacks cuMemGetHandleForAddressRange (a too-old driver).
 * The exporter checks the flags, the page alignment and that the range STARTS in an
 * allocation, but not that it ends there: it over-exports, as a real H100 (driver 580) did
 * for a range running 64 pages past its allocation, so the client's own range check
 * (cuMemGetAddressRange) is what the tests see refuse it.
 * Device memory: 64 MiB in all; the first allocation is returned 256 bytes past a 64 KiB
 * boundary, as the real driver may do for small allocations. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef unsigned long long dptr_t;
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
       INVALID_DEVICE = 101, NOT_FOUND = 500, NOT_SUPPORTED = 801 };
#define TOTAL (64ull << 20)
#define MAX_ALLOCS 64

struct alloc { dptr_t base; size_t size; void *host; unsigned long long id; int sync; };
static struct alloc allocs[MAX_ALLOCS];
static unsigned long long next_id = 1, used, n_allocs;
static int inited, ctx_depth;

static const char *mode(void) { const char *m = getenv("FAKE_CUDA_MODE"); return m ? m : "gpu"; }
static int has_device(void) { return strcmp(mode(), "nodevice") != 0; }

int cuInit(unsigned flags) {
    if (flags) return INVALID_VALUE;
    if (!strcmp(mode(), "noinit")) return NO_DEVICE;
    inited = 1;
    return OK;
}
int cuGetErrorName(int r, const char **s) {
    switch (r) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
    case NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
    case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return OK;
    case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
    case NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; return OK;
    default: *s = 0; return INVALID_VALUE;
    }
}
int cuGetErrorString(int r, const char **s) { return cuGetErrorName(r, s) ? INVALID_VALUE : (*s = "fake", OK); }
int cuDriverGetVersion(int *v) { *v = 13000; return OK; }
int cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = has_device(); return OK; }
int cuDeviceGet(int *d, int ord) { if (!inited) return NOT_INITIALIZED; if (ord != 0 || !has_device()) return INVALID_DEVICE; *d = 0; return OK; }
int cuDeviceGetName(char *s, int len, int d) { if (d) return INVALID_DEVICE; strncpy(s, "Fake GPU", len); s[len - 1] = 0; return OK; }
int cuDeviceGetPCIBusId(char *s, int len, int d) { if (d) return INVALID_DEVICE; strncpy(s, "0000:3B:00.0", len); s[len - 1] = 0; return OK; }
int cuDeviceGetAttribute(int *v, int a, int d) {
    if (d) return INVALID_DEVICE;
    if (!strcmp(mode(), "olddriver") && (a == 110 || (a >= 116 && a <= 118) || a == 124))
        return INVALID_VALUE;
    switch (a) {
    case 75: *v = 9; return OK;                                  /* compute capability major */
    case 76: *v = 0; return OK;                                  /* minor */
    case 110: *v = 1; return OK;                                 /* GPUDirect RDMA with VMM */
    case 116: *v = 1; return OK;                                 /* GPUDirect RDMA */
    case 117: *v = 1; return OK;                                 /* flush options: host */
    case 118: *v = 100; return OK;                               /* writes ordering: owner */
    case 124: *v = strcmp(mode(), "nodmabuf") != 0; return OK;   /* dma-buf */
    default: return INVALID_VALUE;
    }
}
int cuDeviceTotalMem_v2(size_t *b, int d) { if (d) return INVALID_DEVICE; *b = TOTAL; return OK; }
static int ctx_token;
int cuDevicePrimaryCtxRetain(void **c, int d) { if (d) return INVALID_DEVICE; *c = &ctx_token; return OK; }
int cuDevicePrimaryCtxRelease_v2(int d) { return d ? INVALID_DEVICE : OK; }
int cuCtxPushCurrent_v2(void *c) { if (c != &ctx_token) return INVALID_VALUE; __atomic_add_fetch(&ctx_depth, 1, __ATOMIC_SEQ_CST); return OK; }
int cuCtxPopCurrent_v2(void **c) { __atomic_sub_fetch(&ctx_depth, 1, __ATOMIC_SEQ_CST); if (c) *c = &ctx_token; return OK; }
int cuCtxSynchronize(void) { return OK; }

/* The allocation containing [p, p+n), or 0. */
static struct alloc *find(dptr_t p, size_t n) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        struct alloc *a = &allocs[i];
        if (a->size && p >= a->base && n <= a->size && p - a->base <= a->size - n) return a;
    }
    return 0;
}

/* Calls come from parallel test threads: one lock around the table. */
static int lock_word;
static void lock(void) { while (__atomic_exchange_n(&lock_word, 1, __ATOMIC_ACQUIRE)) ; }
static void unlock(void) { __atomic_store_n(&lock_word, 0, __ATOMIC_RELEASE); }

int cuMemAlloc_v2(dptr_t *p, size_t size) {
    if (!size) return INVALID_VALUE;
    lock();
    int r = OUT_OF_MEMORY;
    if (used + size <= TOTAL) {
        for (int i = 0; i < MAX_ALLOCS; i++) {
            if (allocs[i].size) continue;
            size_t skew = n_allocs == 0 ? 256 : 0; /* first one misaligned on purpose */
            void *h = aligned_alloc(1 << 16, ((size + skew + 0xffff) >> 16) << 16);
            if (!h) break;
            allocs[i] = (struct alloc){ (dptr_t)(uintptr_t)h + skew, size, h, next_id++, 0 };
            used += size;
            n_allocs++;
            *p = allocs[i].base;
            r = OK;
            break;
        }
    }
    unlock();
    return r;
}
int cuMemFree_v2(dptr_t p) {
    lock();
    int r = INVALID_VALUE;
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].size && allocs[i].base == p) {
            free(allocs[i].host);
            used -= allocs[i].size;
            allocs[i].size = 0;
            r = OK;
        }
    }
    unlock();
    return r;
}
int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = TOTAL - used; *t = TOTAL; return OK; }
int cuMemcpyHtoD_v2(dptr_t d, const void *s, size_t n) {
    if (!ctx_depth) return NOT_INITIALIZED;
    if (!find(d, n)) return INVALID_VALUE;
    memcpy((void *)(uintptr_t)d, s, n);
    return OK;
}
int cuMemcpyDtoH_v2(void *d, dptr_t s, size_t n) {
    if (!ctx_depth) return NOT_INITIALIZED;
    if (!find(s, n)) return INVALID_VALUE;
    memcpy(d, (void *)(uintptr_t)s, n);
    return OK;
}
int cuMemsetD8_v2(dptr_t d, unsigned char b, size_t n) {
    if (!ctx_depth) return NOT_INITIALIZED;
    if (!find(d, n)) return INVALID_VALUE;
    memset((void *)(uintptr_t)d, b, n);
    return OK;
}
/* The allocation holding p: its base and size; NOT_FOUND for any other address. */
int cuMemGetAddressRange_v2(dptr_t *base, size_t *size, dptr_t p) {
    if (!ctx_depth) return NOT_INITIALIZED;
    lock();
    struct alloc *al = find(p, 1);
    struct alloc c = al ? *al : (struct alloc){ 0 };
    unlock();
    if (!al) return NOT_FOUND;
    if (base) *base = c.base;
    if (size) *size = c.size;
    return OK;
}
#ifndef OMIT_EXPORT
int cuMemGetHandleForAddressRange(void *h, dptr_t p, size_t n, int type, unsigned long long flags) {
    long page = sysconf(_SC_PAGESIZE);
    if (!ctx_depth) return NOT_INITIALIZED;
    /* Only the start is checked (find(p, 1)): the range may run past the allocation. */
    lock();
    int starts_in_one = find(p, 1) != 0;
    unlock();
    if (type != 1 || flags || !n || p % page || n % page || !starts_in_one) return INVALID_VALUE;
    if (strcmp(mode(), "nodmabuf") == 0) return NOT_SUPPORTED;
    int fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, n)) return OUT_OF_MEMORY;
    *(int *)h = fd;
    return OK;
}
#endif
int cuPointerGetAttribute(void *v, int a, dptr_t p) {
    if (!ctx_depth) return NOT_INITIALIZED;
    lock();
    struct alloc *al = find(p, 1);
    struct alloc c = al ? *al : (struct alloc){ 0 };
    unlock();
    if (!al) return INVALID_VALUE;
    switch (a) {
    case 2: *(unsigned *)v = 2; return OK;               /* memory type: device */
    case 6: *(int *)v = c.sync; return OK;               /* sync memops (written as an int) */
    case 7: *(unsigned long long *)v = c.id; return OK;  /* buffer id */
    case 9: *(int *)v = 0; return OK;                    /* device ordinal */
    case 11: *(dptr_t *)v = c.base; return OK;           /* range start */
    case 12: *(size_t *)v = c.size; return OK;           /* range size */
    case 13: *(unsigned char *)v = 1; return OK;         /* mapped (written as a byte) */
    case 15: *(int *)v = 1; return OK;                   /* GPUDirect RDMA capable */
    default: return INVALID_VALUE;
    }
}
int cuPointerSetAttribute(const void *v, int a, dptr_t p) {
    if (!ctx_depth) return NOT_INITIALIZED;
    lock();
    struct alloc *al = find(p, 1);
    int r = INVALID_VALUE;
    if (al && a == 6) { al->sync = *(const unsigned *)v != 0; r = OK; }
    unlock();
    return r;
}

/*
 * fake_libcudart.c: the stand-in CUDA runtime, built as libcudart.so.13, for testing gpumemhook without a
 * GPU.
 *
 * It reaches the driver only the way the real runtime does (docs/measured-facts.md, "Which entry points frameworks reach"): on
 * first use it dlopen()s "libcuda.so.1", looks up "cuGetProcAddress_v2" with dlsym, asks that function for
 * "cuGetProcAddress" at versions 11030 and 12000 (getting the v1 and the v2 function), and from then on
 * obtains every driver function through the v2 cuGetProcAddress at version 12000, by base name, with the
 * per-thread-default-stream flag for the _ptsz entry points. It never calls a driver symbol by direct
 * linking, so a hook that only interposes exported driver symbols misses everything below this library.
 * The contract is tests/sim/README.md.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

#define EXPORT __attribute__((visibility("default")))
#define RUNTIME_VERSION 13000
#define LOOKUP_VERSION 12000

/* Driver functions, all obtained through cuGetProcAddress_v2 (filled once by load()). */
static struct {
    cudaError_t load_err; /* cudaErrorInsufficientDriver when the driver could not be reached */
    PFN_cuGetProcAddress_v2 gpa;   /* "cuGetProcAddress" at 12000: the v2 function */
    PFN_cuGetProcAddress_v1 gpa_v1; /* "cuGetProcAddress" at 11030: asked for, as the real runtime does */
    CUresult (*init)(unsigned int);
    CUresult (*device_get_count)(int *);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_get_device)(CUdevice *);
    PFN_cuMemAlloc_v2 mem_alloc;
    PFN_cuMemFree_v2 mem_free;
    PFN_cuMemAllocAsync mem_alloc_async, mem_alloc_async_ptsz;
    PFN_cuMemFreeAsync mem_free_async, mem_free_async_ptsz;
    PFN_cuMemAllocFromPoolAsync mem_alloc_from_pool_async, mem_alloc_from_pool_async_ptsz;
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*mem_alloc_host)(void **, size_t);
    CUresult (*mem_host_alloc)(void **, size_t, unsigned int);
    CUresult (*mem_free_host)(void *);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*stream_create)(CUstream *, unsigned int);
    CUresult (*device_get_default_mem_pool)(CUmemoryPool *, CUdevice);
    PFN_fakecuda_hidden_alloc hidden_alloc; /* non-NULL only with FAKECUDART_HIDDEN=1 */
} drv;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static int get(const char *name, cuuint64_t flags, void *out) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return drv.gpa(name, (void **)out, LOOKUP_VERSION, flags, &st) == CUDA_SUCCESS && st == 0;
}

static void load(void) {
    drv.load_err = cudaErrorInsufficientDriver;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    PFN_cuGetProcAddress_v2 gpa2 = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa2) return;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    void *v1 = NULL, *v2 = NULL;
    gpa2("cuGetProcAddress", &v1, 11030, 0, &st);
    if (gpa2("cuGetProcAddress", &v2, LOOKUP_VERSION, 0, &st) != CUDA_SUCCESS || !v2) return;
    drv.gpa_v1 = (PFN_cuGetProcAddress_v1)v1;
    drv.gpa = (PFN_cuGetProcAddress_v2)v2;
    const cuuint64_t PTDS = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    int ok = get("cuInit", 0, &drv.init) && get("cuDeviceGetCount", 0, &drv.device_get_count) &&
             get("cuDevicePrimaryCtxRetain", 0, &drv.primary_ctx_retain) &&
             get("cuCtxSetCurrent", 0, &drv.ctx_set_current) && get("cuCtxGetCurrent", 0, &drv.ctx_get_current) &&
             get("cuCtxGetDevice", 0, &drv.ctx_get_device) && get("cuMemAlloc", 0, &drv.mem_alloc) &&
             get("cuMemFree", 0, &drv.mem_free) && get("cuMemAllocAsync", 0, &drv.mem_alloc_async) &&
             get("cuMemAllocAsync", PTDS, &drv.mem_alloc_async_ptsz) &&
             get("cuMemFreeAsync", 0, &drv.mem_free_async) &&
             get("cuMemFreeAsync", PTDS, &drv.mem_free_async_ptsz) &&
             get("cuMemAllocFromPoolAsync", 0, &drv.mem_alloc_from_pool_async) &&
             get("cuMemAllocFromPoolAsync", PTDS, &drv.mem_alloc_from_pool_async_ptsz) &&
             get("cuMemAllocManaged", 0, &drv.mem_alloc_managed) &&
             get("cuMemAllocPitch", 0, &drv.mem_alloc_pitch) && get("cuMemAllocHost", 0, &drv.mem_alloc_host) &&
             get("cuMemHostAlloc", 0, &drv.mem_host_alloc) && get("cuMemFreeHost", 0, &drv.mem_free_host) &&
             get("cuMemGetInfo", 0, &drv.mem_get_info) && get("cuStreamCreate", 0, &drv.stream_create) &&
             get("cuDeviceGetDefaultMemPool", 0, &drv.device_get_default_mem_pool);
    if (!ok) return;
    const char *hidden = getenv("FAKECUDART_HIDDEN");
    if (hidden && strcmp(hidden, "1") == 0) {
        drv.hidden_alloc = (PFN_fakecuda_hidden_alloc)dlsym(h, "fakecuda_hidden_alloc");
        if (!drv.hidden_alloc) return;
    }
    /* From here on the driver answers for itself (e.g. no device: CUDA_ERROR_NO_DEVICE). */
    drv.load_err = drv.init(0);
}

/* Driver codes map to runtime codes: 2 -> cudaErrorMemoryAllocation (2), 1 -> cudaErrorInvalidValue (1),
 * everything else unchanged. With these values the mapping is the identity; it is kept as a function so
 * that the one place to change is obvious. */
static cudaError_t rt_err(CUresult r) { return (cudaError_t)r; }

static cudaError_t loaded(void) {
    pthread_once(&load_once, load);
    return drv.load_err;
}

/* Like the real runtime: without a current context, device 0's primary context becomes current. */
static cudaError_t enter(void) {
    cudaError_t e = loaded();
    if (e) return e;
    CUcontext c = NULL;
    CUresult r = drv.ctx_get_current(&c);
    if (r == CUDA_SUCCESS && c == NULL) {
        r = drv.primary_ctx_retain(&c, 0);
        if (r == CUDA_SUCCESS) r = drv.ctx_set_current(c);
    }
    return rt_err(r);
}

EXPORT cudaError_t cudaSetDevice(int device) {
    cudaError_t e = loaded();
    if (e) return e;
    CUcontext c;
    CUresult r = drv.primary_ctx_retain(&c, device);
    if (r == CUDA_SUCCESS) r = drv.ctx_set_current(c);
    return rt_err(r);
}

EXPORT cudaError_t cudaGetDevice(int *device) {
    cudaError_t e = loaded();
    if (e) return e;
    if (!device) return cudaErrorInvalidValue;
    CUcontext c = NULL;
    CUresult r = drv.ctx_get_current(&c);
    if (r) return rt_err(r);
    if (!c) {
        *device = 0; /* what the runtime would select on first use */
        return cudaSuccess;
    }
    return rt_err(drv.ctx_get_device(device));
}

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
    cudaError_t e = loaded();
    if (e) return e;
    return rt_err(drv.device_get_count(count));
}

/* cudaMalloc of 0 bytes succeeds with NULL without reaching the driver, as the real runtime does. */
EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) {
    cudaError_t e = enter();
    if (e) return e;
    if (!devPtr) return cudaErrorInvalidValue;
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    CUresult r = drv.hidden_alloc ? drv.hidden_alloc(&p, size) : drv.mem_alloc(&p, size);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return rt_err(r);
}

/* cudaFree(NULL) succeeds without reaching the driver (beyond the one-time load). */
EXPORT cudaError_t cudaFree(void *devPtr) {
    cudaError_t e = loaded();
    if (e) return e;
    if (!devPtr) return cudaSuccess;
    return rt_err(drv.mem_free((CUdeviceptr)(uintptr_t)devPtr));
}

static cudaError_t malloc_async(PFN_cuMemAllocAsync fn, void **devPtr, size_t size, cudaStream_t s) {
    cudaError_t e = enter();
    if (e) return e;
    if (!devPtr) return cudaErrorInvalidValue;
    CUdeviceptr p = 0;
    CUresult r = fn(&p, size, s);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return rt_err(r);
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s) {
    cudaError_t e = loaded();
    return e ? e : malloc_async(drv.mem_alloc_async, devPtr, size, s);
}

EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s) {
    cudaError_t e = loaded();
    return e ? e : malloc_async(drv.mem_alloc_async_ptsz, devPtr, size, s);
}

static cudaError_t free_async(PFN_cuMemFreeAsync fn, void *devPtr, cudaStream_t s) {
    cudaError_t e = enter();
    if (e) return e;
    return rt_err(fn((CUdeviceptr)(uintptr_t)devPtr, s));
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s) {
    cudaError_t e = loaded();
    return e ? e : free_async(drv.mem_free_async, devPtr, s);
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s) {
    cudaError_t e = loaded();
    return e ? e : free_async(drv.mem_free_async_ptsz, devPtr, s);
}

static cudaError_t malloc_from_pool(PFN_cuMemAllocFromPoolAsync fn, void **ptr, size_t size, cudaMemPool_t pool,
                                    cudaStream_t s) {
    cudaError_t e = enter();
    if (e) return e;
    if (!ptr) return cudaErrorInvalidValue;
    CUdeviceptr p = 0;
    CUresult r = fn(&p, size, pool, s);
    if (r == CUDA_SUCCESS) *ptr = (void *)(uintptr_t)p;
    return rt_err(r);
}

EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t s) {
    cudaError_t e = loaded();
    return e ? e : malloc_from_pool(drv.mem_alloc_from_pool_async, ptr, size, pool, s);
}

EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t s) {
    cudaError_t e = loaded();
    return e ? e : malloc_from_pool(drv.mem_alloc_from_pool_async_ptsz, ptr, size, pool, s);
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    cudaError_t e = enter();
    if (e) return e;
    if (!devPtr) return cudaErrorInvalidValue;
    CUdeviceptr p = 0;
    CUresult r = drv.mem_alloc_managed(&p, size, flags);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return rt_err(r);
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    cudaError_t e = enter();
    if (e) return e;
    if (!devPtr) return cudaErrorInvalidValue;
    CUdeviceptr p = 0;
    CUresult r;
    if (drv.hidden_alloc) {
        /* Out of the hook's sight, rows padded to 512 bytes as the stand-in driver pads them. */
        if (!pitch || width == 0 || height == 0) return cudaErrorInvalidValue;
        size_t padded = (width + 511) & ~(size_t)511;
        if (height > SIZE_MAX / padded) return cudaErrorMemoryAllocation;
        r = drv.hidden_alloc(&p, padded * height);
        if (r == CUDA_SUCCESS) *pitch = padded;
    } else {
        r = drv.mem_alloc_pitch(&p, pitch, width, height, 4);
    }
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return rt_err(r);
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size) {
    cudaError_t e = enter();
    return e ? e : rt_err(drv.mem_alloc_host(ptr, size));
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    cudaError_t e = enter();
    return e ? e : rt_err(drv.mem_host_alloc(pHost, size, flags));
}

EXPORT cudaError_t cudaFreeHost(void *ptr) {
    cudaError_t e = loaded();
    return e ? e : rt_err(drv.mem_free_host(ptr));
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    cudaError_t e = enter();
    return e ? e : rt_err(drv.mem_get_info(free_bytes, total));
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    cudaError_t e = enter();
    return e ? e : rt_err(drv.stream_create(pStream, 0));
}

EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
    cudaError_t e = loaded();
    return e ? e : rt_err(drv.device_get_default_mem_pool(memPool, device));
}

/* Hands the request to the driver's (v2) cuGetProcAddress at the runtime's own version. */
EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                           int *driverStatus) {
    cudaError_t e = loaded();
    if (e) return e;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = drv.gpa(symbol, funcPtr, RUNTIME_VERSION, flags, &st);
    if (driverStatus) *driverStatus = st;
    return rt_err(r); /* CUDA_ERROR_NOT_FOUND (500) is cudaErrorSymbolNotFound (500) */
}

EXPORT const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case 100: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case 201: return "invalid device context";
    case 400: return "invalid resource handle";
    case 500: return "named symbol not found";
    default: return "unrecognized error code";
    }
}

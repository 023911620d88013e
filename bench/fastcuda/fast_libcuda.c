/*
 * fast_libcuda.c: a minimal, fast stand-in CUDA driver (built as libcuda.so.1) for measuring what the
 * hook adds to an allocation, and nothing else.
 *
 * Why not the test driver of tests/sim: that one is the slow truth the tests compare against (a global
 * mutex, a chained hash table, malloc per allocation). Its own cost per alloc+free pair is several times
 * the hook's and varies with the number of live allocations, so the hook's addition would drown in it.
 * Here an allocation is a pop from a per-thread stack of freed addresses or a bump of a per-thread pointer:
 * no lock, no table, a few nanoseconds, the same at any number of live allocations.
 *
 * It exports what the benchmark and the hook call (cuInit, cuDriverGetVersion, cuCtxGetDevice,
 * cuStreamGetDevice, cuMemAlloc_v2, cuMemFree_v2, cuMemAllocAsync(_ptsz), cuMemFreeAsync(_ptsz),
 * cuMemGetInfo_v2, cuGetProcAddress, cuGetProcAddress_v2), the context calls the simulated runtime
 * (tests/sim/fake_libcudart.c) makes on every cudaMalloc (cuCtxGetCurrent, cuDevicePrimaryCtxRetain,
 * cuCtxSetCurrent, cuDeviceGetCount), and stubs answering CUDA_ERROR_NOT_SUPPORTED for the other names
 * that runtime resolves at load (it refuses to start without them). cuGetProcAddress answers as the real
 * driver does for these names (base names to _v2, "cuGetProcAddress" to v1 or v2 by version, _ptsz with
 * flag 2), so the simulated runtime built beside this library benchmarks the cudaMalloc path.
 *
 * Every entry point is a static impl_NAME exported under NAME as an alias, so that the library's own
 * address-taking never goes through the PLT (where the preloaded hook's shadows would be found instead):
 * cuGetProcAddress hands out the driver's own addresses, as the real driver does.
 *
 * There is one implicit context on device 0 in every thread (the benchmark never switches devices).
 * Addresses are never backed and never checked: freeing an address that was not allocated here corrupts
 * nothing but this thread's stack of reusable addresses.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

#define EXPORT(name) \
    extern __typeof__(impl_##name) name __attribute__((alias("impl_" #name), visibility("default")));

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801

#define BASE 0x100000000000ULL
#define THREAD_RANGE 0x1000000000ULL /* 64 GiB of address space per thread */
#define ALIGN 512ULL
#define CAPACITY (80ULL << 30)

/* Each thread bumps in a range of its own, claimed once with an atomic add: no shared cache line on the
 * allocation path. */
static uint64_t next_range = BASE;

struct thread_heap {
    uint64_t bump, end;
    uint64_t *stack; /* freed addresses, reused last-in first-out */
    size_t depth, cap;
};
static __thread struct thread_heap heap;

static CUresult impl_cuInit(unsigned int flags) { return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
EXPORT(cuInit)

static CUresult impl_cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}
EXPORT(cuDriverGetVersion)

/*
 * Settings, read once at load:
 *   FASTCUDA_FRESH=1       never reuse a freed address (a fresh one every time, as real drivers often do);
 *   FASTCUDA_DEVICES=N     what cuDeviceGetCount answers (default 1; work still goes to device 0);
 *   FASTCUDA_QUERY_NS=N    what a device query (cuCtxGetDevice, cuStreamGetDevice) costs, spent spinning
 *                          (default 20: on an H100, cuCtxGetDevice took 15 ns and cuStreamGetDevice 23 ns).
 */
static int fresh_addresses;
static int device_count = 1;
static uint64_t query_ns = 20;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

__attribute__((constructor)) static void read_settings(void) {
    const char *s = getenv("FASTCUDA_FRESH");
    fresh_addresses = s && *s == '1';
    s = getenv("FASTCUDA_DEVICES");
    if (s && *s) device_count = atoi(s) > 0 ? atoi(s) : 1;
    s = getenv("FASTCUDA_QUERY_NS");
    if (s && *s) query_ns = strtoull(s, NULL, 10);
}

/* A device query: the driver looks the context up. Spins for query_ns (clock reads included). */
static void spend_query_time(void) {
    if (!query_ns) return;
    uint64_t end = now_ns() + query_ns;
    while (now_ns() < end) {
    }
}

static CUresult impl_cuCtxGetDevice(int *device) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    spend_query_time();
    *device = 0;
    return CUDA_SUCCESS;
}
EXPORT(cuCtxGetDevice)

static CUresult impl_cuStreamGetDevice(CUstream s, int *device) {
    (void)s;
    return impl_cuCtxGetDevice(device);
}
EXPORT(cuStreamGetDevice)

static CUresult impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    struct thread_heap *h = &heap;
    if (h->depth) {
        *dptr = h->stack[--h->depth];
        return CUDA_SUCCESS;
    }
    uint64_t rounded = (bytes + ALIGN - 1) & ~(ALIGN - 1);
    if (rounded == 0) rounded = ALIGN;
    if (h->bump + rounded > h->end) {
        if (rounded > THREAD_RANGE) return CUDA_ERROR_OUT_OF_MEMORY;
        h->bump = __atomic_fetch_add(&next_range, THREAD_RANGE, __ATOMIC_RELAXED);
        h->end = h->bump + THREAD_RANGE;
    }
    *dptr = h->bump;
    h->bump += rounded;
    return CUDA_SUCCESS;
}
EXPORT(cuMemAlloc_v2)

static CUresult impl_cuMemFree_v2(CUdeviceptr p) {
    if (!p || fresh_addresses) return CUDA_SUCCESS;
    struct thread_heap *h = &heap;
    if (h->depth == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 1024;
        uint64_t *s = realloc(h->stack, cap * sizeof *s);
        if (!s) return CUDA_SUCCESS; /* the address is simply not reused */
        h->stack = s;
        h->cap = cap;
    }
    h->stack[h->depth++] = p;
    return CUDA_SUCCESS;
}
EXPORT(cuMemFree_v2)

static CUresult impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    (void)s;
    return impl_cuMemAlloc_v2(dptr, bytes);
}
EXPORT(cuMemAllocAsync)

static CUresult impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    (void)s;
    return impl_cuMemAlloc_v2(dptr, bytes);
}
EXPORT(cuMemAllocAsync_ptsz)

static CUresult impl_cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    (void)s;
    return impl_cuMemFree_v2(p);
}
EXPORT(cuMemFreeAsync)

static CUresult impl_cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    (void)s;
    return impl_cuMemFree_v2(p);
}
EXPORT(cuMemFreeAsync_ptsz)

static CUresult impl_cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    *free_bytes = CAPACITY;
    *total = CAPACITY;
    return CUDA_SUCCESS;
}
EXPORT(cuMemGetInfo_v2)

/* ---- contexts: one per device-0 primary context, current per thread ------------------------------ */

static int primary_ctx; /* its address is the context handle */
static __thread void *current_ctx;

static CUresult impl_cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}
EXPORT(cuDeviceGetCount)

static CUresult impl_cuDevicePrimaryCtxRetain(void **ctx, int device) {
    if (!ctx || device != 0) return CUDA_ERROR_INVALID_VALUE;
    *ctx = &primary_ctx;
    return CUDA_SUCCESS;
}
EXPORT(cuDevicePrimaryCtxRetain)

static CUresult impl_cuCtxSetCurrent(void *ctx) {
    current_ctx = ctx;
    return CUDA_SUCCESS;
}
EXPORT(cuCtxSetCurrent)

static CUresult impl_cuCtxGetCurrent(void **ctx) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = current_ctx;
    return CUDA_SUCCESS;
}
EXPORT(cuCtxGetCurrent)

/* Resolvable but unsupported: the simulated runtime looks these up at load and never calls them here. */
#define STUB(name)                                                         \
    static CUresult impl_##name(void) { return CUDA_ERROR_NOT_SUPPORTED; } \
    EXPORT(name)
STUB(cuMemAllocFromPoolAsync)
STUB(cuMemAllocManaged)
STUB(cuMemAllocPitch_v2)
STUB(cuMemAllocHost_v2)
STUB(cuMemHostAlloc)
STUB(cuMemFreeHost)
STUB(cuStreamCreate)
STUB(cuDeviceGetDefaultMemPool)

/* ---- cuGetProcAddress ---------------------------------------------------------------------------- */

static CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);
static CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                                         int *status);

struct sym {
    const char *name;
    void *fn;
};

#define SYM(name) {#name, (void *)impl_##name}
static const struct sym exported[] = {
    SYM(cuInit),          SYM(cuDriverGetVersion), SYM(cuCtxGetDevice),  SYM(cuStreamGetDevice),
    SYM(cuMemAlloc_v2),   SYM(cuMemFree_v2),       SYM(cuMemAllocAsync), SYM(cuMemFreeAsync),
    SYM(cuMemGetInfo_v2), SYM(cuGetProcAddress_v2), SYM(cuDeviceGetCount), SYM(cuDevicePrimaryCtxRetain),
    SYM(cuCtxSetCurrent), SYM(cuCtxGetCurrent), SYM(cuMemAllocFromPoolAsync), SYM(cuMemAllocManaged),
    SYM(cuMemAllocHost_v2), SYM(cuMemHostAlloc), SYM(cuMemFreeHost), SYM(cuStreamCreate),
    SYM(cuDeviceGetDefaultMemPool), SYM(cuMemAllocPitch_v2),
};
static const struct sym versioned[] = {
    {"cuMemAlloc", (void *)impl_cuMemAlloc_v2},
    {"cuMemFree", (void *)impl_cuMemFree_v2},
    {"cuMemGetInfo", (void *)impl_cuMemGetInfo_v2},
    {"cuMemAllocPitch", (void *)impl_cuMemAllocPitch_v2},
    {"cuMemAllocHost", (void *)impl_cuMemAllocHost_v2},
};
static const struct sym per_thread[] = {
    {"cuMemAllocAsync", (void *)impl_cuMemAllocAsync_ptsz},
    {"cuMemFreeAsync", (void *)impl_cuMemFreeAsync_ptsz},
};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void *find_sym(const struct sym *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return t[i].fn;
    return NULL;
}

static CUresult lookup(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    void *fn = NULL;
    if (strcmp(symbol, "cuGetProcAddress") == 0)
        fn = version < 12000 ? (void *)impl_cuGetProcAddress : (void *)impl_cuGetProcAddress_v2;
    else if ((flags & 2) && (fn = find_sym(per_thread, N_OF(per_thread), symbol)) != NULL)
        ;
    else if ((fn = find_sym(versioned, N_OF(versioned), symbol)) == NULL)
        fn = find_sym(exported, N_OF(exported), symbol);
    *pfn = fn;
    if (status) *status = fn ? 0 : 1;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    return lookup(symbol, pfn, version, flags, NULL);
}
EXPORT(cuGetProcAddress)

static CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                                         int *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    return lookup(symbol, pfn, version, flags, status);
}
EXPORT(cuGetProcAddress_v2)

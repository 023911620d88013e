/*
 * fake_libcuda.c: the stand-in CUDA driver, built as libcuda.so.1, for testing gpumemhook without a GPU.
 *
 * It hands out unbacked device addresses from per-device ranges, keeps its own exact table of live
 * allocations (the slow truth that tests compare the hook against), tracks per-thread contexts, streams and
 * memory pools, and answers cuGetProcAddress / cuGetProcAddress_v2 the way the real driver does (different
 * functions for different versions, _ptsz variants for per-thread default streams). The contract is
 * tests/sim/README.md; the measurements behind it are in docs/measured-facts.md.
 *
 * Symbol binding. Every exported entry point is written as a static function impl_NAME and exported
 * under NAME as an alias (EXPORT below). Inside this library, calls and address-taking then refer to
 * impl_NAME directly, never through the PLT/GOT. That matters because the hook (LD_PRELOADed) exports
 * the same names: without this, the driver's own internal calls would be interposed by the hook (double
 * counting) and cuGetProcAddress would hand out the hook's shadow instead of the driver's address,
 * which is not what the real driver does.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

#define EXPORT(name) \
    extern __typeof__(impl_##name) name __attribute__((alias("impl_" #name), visibility("default")));

#define DRIVER_VERSION 13000
#define MAX_DEVICES 64
#define DEFAULT_DEVICES 2
#define DEFAULT_CAPACITY 17179869184ULL /* 16 GiB */

#define DEVICE_BASE 0x100000000000ULL  /* device d: DEVICE_BASE + d * RANGE_SIZE */
#define MANAGED_BASE 0x600000000000ULL /* managed memory: its own range */
#define VA_BASE 0x700000000000ULL      /* cuMemAddressReserve */
#define RANGE_SIZE 0x10000000000ULL    /* 1 TiB per range */
#define ALLOC_ALIGN 512ULL
#define VA_ALIGN (2ULL << 20)

/* Arena indices: devices first, then the two special ranges. */
#define ARENA_MANAGED MAX_DEVICES
#define ARENA_VA (MAX_DEVICES + 1)
#define N_ARENAS (MAX_DEVICES + 2)

/* ---- a small chained hash map keyed by uint64_t (callers hold the driver lock) ------------------- */

struct hnode {
    uint64_t key;
    struct hnode *next;
};

struct hmap {
    struct hnode **buckets;
    size_t nbuckets; /* power of two, or 0 before first insert */
    size_t count;
};

static size_t hmap_slot(const struct hmap *m, uint64_t key) {
    /* splitmix64 finalizer: addresses are 512-aligned, handles sequential; mix them all */
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ULL;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebULL;
    key ^= key >> 31;
    return (size_t)key & (m->nbuckets - 1);
}

static struct hnode *hmap_find(const struct hmap *m, uint64_t key) {
    if (m->nbuckets == 0) return NULL;
    for (struct hnode *n = m->buckets[hmap_slot(m, key)]; n; n = n->next)
        if (n->key == key) return n;
    return NULL;
}

/* Returns 0 on success, -1 if the table could not grow (host out of memory). */
static int hmap_insert(struct hmap *m, struct hnode *node) {
    if (m->count + 1 > m->nbuckets) {
        size_t nb = m->nbuckets ? m->nbuckets * 2 : 1024;
        struct hnode **b = calloc(nb, sizeof *b);
        if (!b) return -1;
        struct hmap grown = {b, nb, m->count};
        for (size_t i = 0; i < m->nbuckets; i++) {
            struct hnode *n = m->buckets[i];
            while (n) {
                struct hnode *next = n->next;
                size_t s = hmap_slot(&grown, n->key);
                n->next = b[s];
                b[s] = n;
                n = next;
            }
        }
        free(m->buckets);
        *m = grown;
    }
    if (hmap_find(m, node->key)) {
        /* The driver handed out the same key twice: the simulation itself is broken. */
        fprintf(stderr, "fake libcuda: internal error: key 0x%llx already live\n", (unsigned long long)node->key);
        abort();
    }
    size_t s = hmap_slot(m, node->key);
    node->next = m->buckets[s];
    m->buckets[s] = node;
    m->count++;
    return 0;
}

static struct hnode *hmap_remove(struct hmap *m, uint64_t key) {
    if (m->nbuckets == 0) return NULL;
    for (struct hnode **p = &m->buckets[hmap_slot(m, key)]; *p; p = &(*p)->next) {
        if ((*p)->key == key) {
            struct hnode *n = *p;
            *p = n->next;
            m->count--;
            return n;
        }
    }
    return NULL;
}

/* ---- driver state -------------------------------------------------------------------------------- */

enum alloc_kind { K_DEVICE, K_MANAGED, K_HOST, K_VA };

struct alloc { /* one live allocation, keyed by address */
    struct hnode node;
    size_t bytes;   /* requested bytes (what `used` counts) */
    size_t rounded; /* bytes taken from the arena */
    int arena;      /* -1 for host memory */
    int device;
    enum alloc_kind kind;
    /* The context whose teardown frees it (cuMemAlloc*, cuMemAllocManaged: the current one); NULL for
     * memory no context owns (stream-ordered and pool allocations, VA reservations, host memory). */
    const struct CUctx_st *owner;
};

struct physical { /* one cuMemCreate handle */
    struct hnode node;
    size_t bytes;
    int device; /* -1: host location */
};

struct freeclass { /* freed blocks of one rounded size in one arena, reused LIFO */
    struct hnode node; /* key: rounded << 7 | arena */
    uint64_t *addrs;
    size_t n, cap;
};

struct arena {
    uint64_t next, limit;
};

struct CUctx_st {
    int device;
    int refs;                   /* primary contexts: cuDevicePrimaryCtxRetain minus releases */
    int live;                   /* created contexts: 1 from cuCtxCreate_v2 to cuCtxDestroy */
    unsigned long long modules; /* modules loaded in it (cuModuleLoad*, cuLibraryLoad*) */
};

struct CUstream_st {
    struct hnode node; /* key: the handle's own address */
    int device;
    const struct CUctx_st *owner; /* the context it was created in, whose teardown destroys it */
};

struct CUmemPoolHandle_st {
    struct hnode node; /* key: the handle's own address (created pools only) */
    int device;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int n_devices;
static unsigned long long capacity;
static unsigned long long used[MAX_DEVICES];
static int contexts_made[MAX_DEVICES]; /* 1 once a context was made on the device */
static struct arena arenas[N_ARENAS];
static struct hmap allocs, physicals, freeclasses, streams, pools;
static CUmemGenericAllocationHandle last_handle;
static struct CUctx_st primary[MAX_DEVICES];
#define MAX_CREATED 64
static struct CUctx_st created[MAX_CREATED]; /* cuCtxCreate_v2's contexts; a destroyed slot is reused */
static struct CUmemPoolHandle_st default_pools[MAX_DEVICES]; /* immutable after init: no lock needed */

/* The current context is per thread: the top of a small per-thread stack. */
#define CTX_STACK_MAX 64
static __thread CUcontext ctx_stack[CTX_STACK_MAX];
static __thread int ctx_depth;

static CUcontext current_ctx(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

/* FAKECUDA_FRESH=1: never reuse a freed address (a fresh one every time, as real drivers often do). */
static int fresh_addresses;
/* FAKECUDA_NULL_ADDRESS=1: a faulty driver whose cuMemAlloc_v2 answers success with address 0 and
   allocates nothing (the hook must count such an answer the same way in every figure). */
static int null_addresses;

/* FAKECUDA_DELAY_US=N: every device allocation and free takes N µs more (a slow driver: real ones take
   tens of µs), slept outside the driver's lock. */
static unsigned long delay_us;

static void driver_delay(void) {
    if (delay_us) {
        struct timespec t = {(time_t)(delay_us / 1000000), (long)(delay_us % 1000000) * 1000};
        nanosleep(&t, NULL);
    }
}

static void read_env(void) {
    const char *s = getenv("FAKECUDA_DELAY_US");
    delay_us = s && *s ? strtoul(s, NULL, 10) : 0;
    s = getenv("FAKECUDA_DEVICES");
    long d = s && *s ? strtol(s, NULL, 10) : DEFAULT_DEVICES;
    n_devices = d < 0 ? 0 : d > MAX_DEVICES ? MAX_DEVICES : (int)d;
    s = getenv("FAKECUDA_MEM_BYTES");
    capacity = s && *s ? strtoull(s, NULL, 10) : DEFAULT_CAPACITY;
    s = getenv("FAKECUDA_FRESH");
    fresh_addresses = s && *s == '1';
    s = getenv("FAKECUDA_NULL_ADDRESS");
    null_addresses = s && *s == '1';
    for (int i = 0; i < MAX_DEVICES; i++) {
        arenas[i].next = DEVICE_BASE + (uint64_t)i * RANGE_SIZE;
        arenas[i].limit = arenas[i].next + RANGE_SIZE;
        primary[i].device = i;
        default_pools[i].device = i;
    }
    arenas[ARENA_MANAGED] = (struct arena){MANAGED_BASE, MANAGED_BASE + RANGE_SIZE};
    arenas[ARENA_VA] = (struct arena){VA_BASE, VA_BASE + RANGE_SIZE};
}

static void ensure_init(void) { pthread_once(&init_once, read_env); }

/*
 * Fork. The real driver refuses every call in a child forked after the parent initialised it (the
 * child's copy of the driver is unusable), so the stand-in does too: otherwise a test would pass on
 * allocations a real child can never make. FAKECUDA_FORK_OK=1 lets a child keep working (the old
 * behaviour), for tests of the hook's own bookkeeping across fork.
 */
static volatile int forked_child;
#define REFUSE_IN_FORKED_CHILD()                          \
    do {                                                  \
        if (forked_child) return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

/* fork() while another thread holds the lock would leave the child's copy locked forever. */
static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&lock); }
static void after_fork_child(void) {
    pthread_mutex_unlock(&lock);
    const char *ok = getenv("FAKECUDA_FORK_OK");
    if (n_devices > 0 && !(ok && *ok == '1')) forked_child = 1;
}
__attribute__((constructor)) static void register_fork_handlers(void) {
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* Driver device queries made (cuCtxGetDevice, cuStreamGetDevice), for tests of the hook's shortcuts. */
static unsigned long long device_queries;
unsigned long long fakecuda_device_queries(void) { return __atomic_load_n(&device_queries, __ATOMIC_RELAXED); }


static int valid_device(int d) { return d >= 0 && d < n_devices; }

static int is_primary(CUcontext c) { return c >= primary && c < primary + n_devices; }

static int valid_ctx(CUcontext c) {
    return is_primary(c) || (c >= created && c < created + MAX_CREATED && __atomic_load_n(&c->live, __ATOMIC_ACQUIRE));
}

/* Device that work on stream s goes to. 0, legacy and per-thread mean the current context's device. */
static CUresult stream_device(CUstream s, int *dev) {
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        CUcontext c = current_ctx();
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        *dev = c->device;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&lock);
    struct hnode *n = hmap_find(&streams, (uint64_t)(uintptr_t)s);
    if (n) *dev = ((struct CUstream_st *)n)->device;
    pthread_mutex_unlock(&lock);
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult pool_device(CUmemoryPool p, int *dev) {
    if (p >= default_pools && p < default_pools + n_devices) {
        *dev = p->device;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&lock);
    struct hnode *n = hmap_find(&pools, (uint64_t)(uintptr_t)p);
    if (n) *dev = ((struct CUmemPoolHandle_st *)n)->device;
    pthread_mutex_unlock(&lock);
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Takes `rounded` bytes from an arena: a freed block of the same size if there is one, else fresh
 * address space. Returns 0 when the range is exhausted. Lock held. */
static uint64_t arena_take(int a, size_t rounded, uint64_t align) {
    struct freeclass *fc = (struct freeclass *)hmap_find(&freeclasses, (uint64_t)rounded << 7 | (uint64_t)a);
    if (fc && fc->n) return fc->addrs[--fc->n];
    uint64_t p = (arenas[a].next + align - 1) & ~(align - 1);
    if (p > arenas[a].limit || arenas[a].limit - p < rounded) return 0;
    arenas[a].next = p + rounded;
    return p;
}

/* Returns a block to its arena's free list so that the next request of the same size reuses it. */
static void arena_give_back(int a, uint64_t p, size_t rounded) {
    if (fresh_addresses) return;
    uint64_t key = (uint64_t)rounded << 7 | (uint64_t)a;
    struct freeclass *fc = (struct freeclass *)hmap_find(&freeclasses, key);
    if (!fc) {
        fc = calloc(1, sizeof *fc);
        if (!fc) return; /* host OOM: the address space is simply not reused */
        fc->node.key = key;
        if (hmap_insert(&freeclasses, &fc->node)) {
            free(fc);
            return;
        }
    }
    if (fc->n == fc->cap) {
        size_t cap = fc->cap ? fc->cap * 2 : 16;
        uint64_t *a2 = realloc(fc->addrs, cap * sizeof *a2);
        if (!a2) return;
        fc->addrs = a2;
        fc->cap = cap;
    }
    fc->addrs[fc->n++] = p;
}

/*
 * The one allocation path for device, managed and VA-reserved memory. Device allocations (kind K_DEVICE)
 * count in used[device] and fail with CUDA_ERROR_OUT_OF_MEMORY, changing nothing, past the capacity.
 */
static CUresult arena_alloc(int a, int device, enum alloc_kind kind, const struct CUctx_st *owner, size_t bytes,
                            uint64_t align, CUdeviceptr *out) {
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (bytes > RANGE_SIZE) return CUDA_ERROR_OUT_OF_MEMORY;
    driver_delay();
    size_t rounded = (bytes + align - 1) & ~(size_t)(align - 1);
    struct alloc *e = malloc(sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (kind == K_DEVICE && bytes > capacity - used[device]) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        uint64_t p = arena_take(a, rounded, align);
        if (!p) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *e = (struct alloc){{p, NULL}, bytes, rounded, a, device, kind, owner};
            if (hmap_insert(&allocs, &e->node)) {
                arena_give_back(a, p, rounded);
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                if (kind == K_DEVICE) used[device] += bytes;
                *out = p;
                e = NULL;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    free(e); /* NULL when it went into the table */
    return r;
}

/* Frees a device or managed allocation (kinds_mask of 1 << kind). Unknown addresses: INVALID_VALUE. */
static CUresult free_by_addr(uint64_t p, unsigned kinds_mask) {
    driver_delay();
    pthread_mutex_lock(&lock);
    struct alloc *e = (struct alloc *)hmap_find(&allocs, p);
    if (!e || !(kinds_mask & (1u << e->kind))) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    hmap_remove(&allocs, p);
    if (e->kind == K_DEVICE) used[e->device] -= e->bytes;
    /* Device and managed blocks are reused; VA reservations are not (reuse could break their alignment). */
    if (e->kind == K_DEVICE || e->kind == K_MANAGED) arena_give_back(e->arena, p, e->rounded);
    pthread_mutex_unlock(&lock);
    free(e);
    return CUDA_SUCCESS;
}

#define DEVICE_KINDS ((1u << K_DEVICE) | (1u << K_MANAGED))

/* Destroyed streams, most recent first: the next stream created gets the last destroyed handle, as
 * real drivers recycle stream handles (a hook caching anything per stream must forget it). */
static struct CUstream_st *dead_streams;

static void stream_dies_locked(struct CUstream_st *s) {
    s->node.next = (struct hnode *)dead_streams;
    dead_streams = s;
}

/*
 * Context teardown (cuCtxDestroy*, cuDevicePrimaryCtxReset*, the last cuDevicePrimaryCtxRelease*), as
 * the real driver documents it: every allocation the context owns (cuMemAlloc*, cuMemAllocPitch*,
 * cuMemAllocManaged, pinned host memory) is freed without a free call, its streams are destroyed and
 * its modules unloaded. Stream-ordered and pool allocations and cuMemCreate handles belong to no
 * context and survive. Lock held.
 */
static void teardown_locked(struct CUctx_st *ctx) {
    for (size_t i = 0; i < allocs.nbuckets; i++) {
        struct hnode **at = &allocs.buckets[i];
        while (*at) {
            struct alloc *e = (struct alloc *)*at;
            if (e->owner != ctx) {
                at = &(*at)->next;
                continue;
            }
            *at = e->node.next;
            allocs.count--;
            if (e->kind == K_DEVICE) used[e->device] -= e->bytes;
            if (e->kind == K_HOST)
                free((void *)(uintptr_t)e->node.key);
            else
                arena_give_back(e->arena, e->node.key, e->rounded);
            free(e);
        }
    }
    for (size_t i = 0; i < streams.nbuckets; i++) {
        struct hnode **at = &streams.buckets[i];
        while (*at) {
            struct CUstream_st *st = (struct CUstream_st *)*at;
            if (st->owner != ctx) {
                at = &(*at)->next;
                continue;
            }
            *at = st->node.next;
            streams.count--;
            stream_dies_locked(st);
        }
    }
    ctx->modules = 0;
}

/* Device of the current context, or INVALID_CONTEXT. */
static CUresult ctx_device(int *dev) {
    CUcontext c = current_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->device;
    return CUDA_SUCCESS;
}

/* ---- initialization, devices, contexts ------------------------------------------------------------ */

static CUresult impl_cuInit(unsigned int flags) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return n_devices ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}
EXPORT(cuInit)

static CUresult impl_cuDriverGetVersion(int *v) {
    REFUSE_IN_FORKED_CHILD();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = DRIVER_VERSION;
    return CUDA_SUCCESS;
}
EXPORT(cuDriverGetVersion)

static CUresult impl_cuDeviceGet(CUdevice *device, int ordinal) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
EXPORT(cuDeviceGet)

static CUresult impl_cuDeviceGetCount(int *count) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = n_devices;
    return CUDA_SUCCESS;
}
EXPORT(cuDeviceGetCount)

static CUresult impl_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = capacity;
    return CUDA_SUCCESS;
}
EXPORT(cuDeviceTotalMem_v2)

static CUresult impl_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    primary[dev].refs++;
    contexts_made[dev] = 1;
    pthread_mutex_unlock(&lock);
    *pctx = &primary[dev];
    return CUDA_SUCCESS;
}
EXPORT(cuDevicePrimaryCtxRetain)

static CUresult impl_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (primary[dev].refs == 0)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--primary[dev].refs == 0)
        teardown_locked(&primary[dev]); /* the last reference: the context is destroyed */
    pthread_mutex_unlock(&lock);
    return r;
}
EXPORT(cuDevicePrimaryCtxRelease_v2)

/* The pre-11.0 ABI of the same function, still exported by the real driver for old binaries. */
static CUresult impl_cuDevicePrimaryCtxRelease(CUdevice dev) { return impl_cuDevicePrimaryCtxRelease_v2(dev); }
EXPORT(cuDevicePrimaryCtxRelease)

/* Frees everything the primary context holds; its references stay (the application still releases
 * them), and the context comes back at its next use. */
static CUresult impl_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    teardown_locked(&primary[dev]);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
EXPORT(cuDevicePrimaryCtxReset_v2)

static CUresult impl_cuDevicePrimaryCtxReset(CUdevice dev) { return impl_cuDevicePrimaryCtxReset_v2(dev); }
EXPORT(cuDevicePrimaryCtxReset)

/* A context of its own on `dev`, pushed onto the calling thread's stack (current until popped). */
static CUresult impl_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    (void)flags;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_depth == CTX_STACK_MAX) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CREATED && !c; i++)
        if (!created[i].live) c = &created[i];
    if (c) {
        *c = (struct CUctx_st){dev, 0, 0, 0};
        __atomic_store_n(&c->live, 1, __ATOMIC_RELEASE);
        contexts_made[dev] = 1;
    }
    pthread_mutex_unlock(&lock);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}
EXPORT(cuCtxCreate_v2)

/* Destroys a context made by cuCtxCreate_v2 and everything it owns, and pops it when it is the calling
 * thread's current one. A primary context is not destroyed this way (INVALID_CONTEXT): its owner is
 * the device, reset or released through the cuDevicePrimaryCtx* functions. */
static CUresult impl_cuCtxDestroy_v2(CUcontext ctx) {
    REFUSE_IN_FORKED_CHILD();
    if (!ctx || is_primary(ctx) || !valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    teardown_locked(ctx);
    __atomic_store_n(&ctx->live, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    if (current_ctx() == ctx) ctx_depth--;
    return CUDA_SUCCESS;
}
EXPORT(cuCtxDestroy_v2)

static CUresult impl_cuCtxDestroy(CUcontext ctx) { return impl_cuCtxDestroy_v2(ctx); }
EXPORT(cuCtxDestroy)

/* As documented: replaces the top of the thread's context stack; NULL pops it (no-op when empty). */
static CUresult impl_cuCtxSetCurrent(CUcontext ctx) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (ctx == NULL) {
        if (ctx_depth) ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0) ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}
EXPORT(cuCtxSetCurrent)

static CUresult impl_cuCtxGetCurrent(CUcontext *pctx) {
    REFUSE_IN_FORKED_CHILD();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_ctx();
    return CUDA_SUCCESS;
}
EXPORT(cuCtxGetCurrent)

static CUresult impl_cuCtxGetDevice(CUdevice *device) {
    REFUSE_IN_FORKED_CHILD();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&device_queries, 1, __ATOMIC_RELAXED);
    return ctx_device(device);
}
EXPORT(cuCtxGetDevice)

static CUresult impl_cuCtxPushCurrent_v2(CUcontext ctx) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == CTX_STACK_MAX) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}
EXPORT(cuCtxPushCurrent_v2)

static CUresult impl_cuCtxPopCurrent_v2(CUcontext *pctx) {
    REFUSE_IN_FORKED_CHILD();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    *pctx = ctx_stack[--ctx_depth];
    return CUDA_SUCCESS;
}
EXPORT(cuCtxPopCurrent_v2)

static CUresult impl_cuCtxSynchronize(void) {
    REFUSE_IN_FORKED_CHILD();
    return current_ctx() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }
EXPORT(cuCtxSynchronize)

/* ---- streams and pools ---------------------------------------------------------------------------- */

static CUresult impl_cuStreamCreate(CUstream *ph, unsigned int flags) {
    REFUSE_IN_FORKED_CHILD();
    (void)flags;
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = ctx_device(&dev);
    if (r) return r;
    pthread_mutex_lock(&lock);
    struct CUstream_st *s = dead_streams;
    if (s) dead_streams = (struct CUstream_st *)s->node.next;
    pthread_mutex_unlock(&lock);
    if (!s && !(s = malloc(sizeof *s))) return CUDA_ERROR_OUT_OF_MEMORY;
    *s = (struct CUstream_st){{(uint64_t)(uintptr_t)s, NULL}, dev, current_ctx()};
    pthread_mutex_lock(&lock);
    int bad = hmap_insert(&streams, &s->node);
    if (bad) stream_dies_locked(s);
    pthread_mutex_unlock(&lock);
    if (bad) return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = s;
    return CUDA_SUCCESS;
}
EXPORT(cuStreamCreate)

static CUresult impl_cuStreamDestroy_v2(CUstream h) {
    REFUSE_IN_FORKED_CHILD();
    pthread_mutex_lock(&lock);
    struct hnode *n = h ? hmap_remove(&streams, (uint64_t)(uintptr_t)h) : NULL;
    if (n) stream_dies_locked((struct CUstream_st *)n);
    pthread_mutex_unlock(&lock);
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
EXPORT(cuStreamDestroy_v2)

static CUresult impl_cuStreamDestroy(CUstream h) { return impl_cuStreamDestroy_v2(h); }
EXPORT(cuStreamDestroy)

static CUresult impl_cuStreamGetDevice(CUstream h, CUdevice *device) {
    REFUSE_IN_FORKED_CHILD();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&device_queries, 1, __ATOMIC_RELAXED);
    return stream_device(h, device);
}
EXPORT(cuStreamGetDevice)

static CUresult impl_cuStreamSynchronize(CUstream h) {
    REFUSE_IN_FORKED_CHILD();
    int dev;
    return stream_device(h, &dev);
}
EXPORT(cuStreamSynchronize)

static CUresult impl_cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!pool_out) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = &default_pools[dev];
    return CUDA_SUCCESS;
}
EXPORT(cuDeviceGetDefaultMemPool)

/* The current pool of a device: always its default pool here (cuDeviceSetMemPool is not simulated). */
static CUresult impl_cuDeviceGetMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    REFUSE_IN_FORKED_CHILD();
    return impl_cuDeviceGetDefaultMemPool(pool_out, dev);
}
EXPORT(cuDeviceGetMemPool)

static CUresult impl_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    p->node.key = (uint64_t)(uintptr_t)p;
    p->device = props->location.id;
    pthread_mutex_lock(&lock);
    int bad = hmap_insert(&pools, &p->node);
    pthread_mutex_unlock(&lock);
    if (bad) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pool = p;
    return CUDA_SUCCESS;
}
EXPORT(cuMemPoolCreate)

static CUresult impl_cuMemPoolDestroy(CUmemoryPool pool) {
    REFUSE_IN_FORKED_CHILD();
    pthread_mutex_lock(&lock);
    struct hnode *n = pool ? hmap_remove(&pools, (uint64_t)(uintptr_t)pool) : NULL;
    pthread_mutex_unlock(&lock);
    if (!n) return CUDA_ERROR_INVALID_VALUE; /* unknown, or a device's default pool */
    free(n);
    return CUDA_SUCCESS;
}
EXPORT(cuMemPoolDestroy)

/* ---- memory --------------------------------------------------------------------------------------- */

static CUresult device_alloc_current(CUdeviceptr *dptr, size_t bytes) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = ctx_device(&dev);
    if (r) return r;
    return arena_alloc(dev, dev, K_DEVICE, current_ctx(), bytes, ALLOC_ALIGN, dptr);
}

static CUresult impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    REFUSE_IN_FORKED_CHILD();
    if (null_addresses && dptr) {
        *dptr = 0;
        return CUDA_SUCCESS;
    }
    return device_alloc_current(dptr, bytes); }
EXPORT(cuMemAlloc_v2)

/* Simulation only: the same allocation, on a path cuGetProcAddress never hands out. */
static CUresult impl_fakecuda_hidden_alloc(CUdeviceptr *dptr, size_t bytes) {
    REFUSE_IN_FORKED_CHILD();
    return device_alloc_current(dptr, bytes);
}
EXPORT(fakecuda_hidden_alloc)

/* Frees need no current context: the table knows each allocation's device. 0 is a no-op. */
static CUresult impl_cuMemFree_v2(CUdeviceptr p) {
    REFUSE_IN_FORKED_CHILD();
    return p ? free_by_addr(p, DEVICE_KINDS) : CUDA_SUCCESS; }
EXPORT(cuMemFree_v2)

/* Rows are padded to a multiple of 512 bytes, as on current GPUs; used counts pitch * height. */
static CUresult impl_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height,
                                        unsigned int elem) {
    REFUSE_IN_FORKED_CHILD();
    if (!dptr || !pPitch) return CUDA_ERROR_INVALID_VALUE;
    if (width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    if (width > RANGE_SIZE) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t pitch = (width + ALLOC_ALIGN - 1) & ~(size_t)(ALLOC_ALIGN - 1);
    if (height > RANGE_SIZE / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = device_alloc_current(dptr, pitch * height);
    if (r == CUDA_SUCCESS) *pPitch = pitch;
    return r;
}
EXPORT(cuMemAllocPitch_v2)

/* Managed memory has its own range and never counts in a device's used bytes. */
static CUresult impl_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    REFUSE_IN_FORKED_CHILD();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = ctx_device(&dev);
    if (r) return r;
    return arena_alloc(ARENA_MANAGED, dev, K_MANAGED, current_ctx(), bytes, ALLOC_ALIGN, dptr);
}
EXPORT(cuMemAllocManaged)

/* `null_means` is what stream 0 stands for: the legacy stream, or the per-thread one for _ptsz. Both
 * resolve to the current context's device; passing it keeps the two entry points distinct functions. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUstream s, CUstream null_means) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = stream_device(s ? s : null_means, &dev);
    if (r) return r;
    return arena_alloc(dev, dev, K_DEVICE, NULL, bytes, ALLOC_ALIGN, dptr);
}

static CUresult free_async(CUdeviceptr p, CUstream s, CUstream null_means) {
    int dev;
    CUresult r = stream_device(s ? s : null_means, &dev);
    if (r) return r;
    return p ? free_by_addr(p, DEVICE_KINDS) : CUDA_SUCCESS;
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s,
                                CUstream null_means) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    int dev, sdev;
    CUresult r = pool_device(pool, &dev);
    if (r) return r;
    r = stream_device(s ? s : null_means, &sdev);
    if (r) return r;
    return arena_alloc(dev, dev, K_DEVICE, NULL, bytes, ALLOC_ALIGN, dptr);
}

static CUresult impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    REFUSE_IN_FORKED_CHILD();
    return alloc_async(dptr, bytes, s, CU_STREAM_LEGACY);
}
EXPORT(cuMemAllocAsync)

static CUresult impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    REFUSE_IN_FORKED_CHILD();
    return alloc_async(dptr, bytes, s, CU_STREAM_PER_THREAD);
}
EXPORT(cuMemAllocAsync_ptsz)

static CUresult impl_cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    REFUSE_IN_FORKED_CHILD();
    return free_async(p, s, CU_STREAM_LEGACY); }
EXPORT(cuMemFreeAsync)

static CUresult impl_cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    REFUSE_IN_FORKED_CHILD();
    return free_async(p, s, CU_STREAM_PER_THREAD);
}
EXPORT(cuMemFreeAsync_ptsz)

static CUresult impl_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
    REFUSE_IN_FORKED_CHILD();
    return alloc_from_pool(dptr, bytes, pool, s, CU_STREAM_LEGACY);
}
EXPORT(cuMemAllocFromPoolAsync)

static CUresult impl_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                                  CUstream s) {
    REFUSE_IN_FORKED_CHILD();
    return alloc_from_pool(dptr, bytes, pool, s, CU_STREAM_PER_THREAD);
}
EXPORT(cuMemAllocFromPoolAsync_ptsz)

/* Physical allocation: on prop->location's device (counted in used), or host-pinned (not counted). */
static CUresult impl_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!handle || !prop || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (!valid_device(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        dev = prop->location.id;
    } else if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST) {
        dev = -1;
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct physical *ph = malloc(sizeof *ph);
    if (!ph) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (dev >= 0 && size > capacity - used[dev]) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *ph = (struct physical){{last_handle + 1, NULL}, size, dev};
        if (hmap_insert(&physicals, &ph->node)) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            last_handle++; /* handles never repeat */
            if (dev >= 0) used[dev] += size;
            *handle = ph->node.key;
            ph = NULL;
        }
    }
    pthread_mutex_unlock(&lock);
    free(ph);
    return r;
}
EXPORT(cuMemCreate)

/* Released at once, even while mapped (the real driver defers the release to the last unmap). */
static CUresult impl_cuMemRelease(CUmemGenericAllocationHandle handle) {
    REFUSE_IN_FORKED_CHILD();
    pthread_mutex_lock(&lock);
    struct physical *ph = (struct physical *)hmap_remove(&physicals, handle);
    if (ph && ph->device >= 0) used[ph->device] -= ph->bytes;
    pthread_mutex_unlock(&lock);
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    free(ph);
    return CUDA_SUCCESS;
}
EXPORT(cuMemRelease)

static CUresult impl_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                         unsigned long long flags) {
    REFUSE_IN_FORKED_CHILD();
    (void)addr; /* a hint only */
    ensure_init();
    if (!ptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
    uint64_t align = alignment > VA_ALIGN ? alignment : VA_ALIGN;
    return arena_alloc(ARENA_VA, -1, K_VA, NULL, size, align, ptr);
}
EXPORT(cuMemAddressReserve)

static CUresult impl_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    REFUSE_IN_FORKED_CHILD();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    return free_by_addr(ptr, 1u << K_VA);
}
EXPORT(cuMemAddressFree)

/* Mappings are checked, not tracked: they change no byte counts. */
static CUresult impl_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                              unsigned long long flags) {
    REFUSE_IN_FORKED_CHILD();
    (void)offset;
    if (!ptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct hnode *n = hmap_find(&physicals, handle);
    pthread_mutex_unlock(&lock);
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT(cuMemMap)

static CUresult impl_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    REFUSE_IN_FORKED_CHILD();
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT(cuMemUnmap)

static CUresult impl_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    REFUSE_IN_FORKED_CHILD();
    return ptr && size && desc && count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT(cuMemSetAccess)

static CUresult impl_cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    REFUSE_IN_FORKED_CHILD();
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = ctx_device(&dev);
    if (r) return r;
    pthread_mutex_lock(&lock);
    *free_bytes = capacity - used[dev];
    pthread_mutex_unlock(&lock);
    *total = capacity;
    return CUDA_SUCCESS;
}
EXPORT(cuMemGetInfo_v2)

/* Pinned host memory: real, writable malloc memory, tracked so that cuMemFreeHost can check it. */
static CUresult host_alloc(void **pp, size_t bytes) {
    if (!pp || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult r = ctx_device(&dev);
    if (r) return r;
    void *p = malloc(bytes);
    struct alloc *e = malloc(sizeof *e);
    if (!p || !e) {
        free(p);
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *e = (struct alloc){{(uint64_t)(uintptr_t)p, NULL}, bytes, bytes, -1, dev, K_HOST, current_ctx()};
    pthread_mutex_lock(&lock);
    int bad = hmap_insert(&allocs, &e->node);
    pthread_mutex_unlock(&lock);
    if (bad) {
        free(p);
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

static CUresult impl_cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags) {
    REFUSE_IN_FORKED_CHILD();
    (void)flags;
    return host_alloc(pp, bytes);
}
EXPORT(cuMemHostAlloc)

static CUresult impl_cuMemAllocHost_v2(void **pp, size_t bytes) {
    REFUSE_IN_FORKED_CHILD();
    return host_alloc(pp, bytes); }
EXPORT(cuMemAllocHost_v2)

static CUresult impl_cuMemFreeHost(void *p) {
    REFUSE_IN_FORKED_CHILD();
    if (!p) return CUDA_SUCCESS;
    CUresult r = free_by_addr((uint64_t)(uintptr_t)p, 1u << K_HOST);
    if (r == CUDA_SUCCESS) free(p);
    return r;
}
EXPORT(cuMemFreeHost)

/* ---- errors --------------------------------------------------------------------------------------- */

static CUresult impl_cuGetErrorString(CUresult error, const char **pStr) {
    REFUSE_IN_FORKED_CHILD();
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    const char *s;
    switch (error) {
    case CUDA_SUCCESS: s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: s = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: s = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: s = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: s = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: s = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: s = "invalid device context"; break;
    case CUDA_ERROR_INVALID_HANDLE: s = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: s = "named symbol not found"; break;
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = s;
    return CUDA_SUCCESS;
}
EXPORT(cuGetErrorString)

/* ---- device identity and modules ------------------------------------------------------------------ */

/* Device d's UUID: fa ce 00 .. 00 d (NVML's stand-in derives the same bytes). */
static CUresult impl_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    ensure_init();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    uuid->bytes[0] = (char)0xfa;
    uuid->bytes[1] = (char)0xce;
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}
EXPORT(cuDeviceGetUuid)

/* Modules are never executed: loading one only grows the current context, and so its device's
 * overhead (see fakecuda_overhead), by FAKECUDA_MODULE_BYTES, as loading kernels grows a real context;
 * the context's teardown unloads them. */
static CUresult load_module(void **out, const void *image) {
    REFUSE_IN_FORKED_CHILD();
    ensure_init();
    if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = current_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    c->modules++;
    pthread_mutex_unlock(&lock);
    *out = (void *)(uintptr_t)(0x10000 + c->device);
    return CUDA_SUCCESS;
}

/* An image read from a file: the file must exist and be readable, as for the real driver
 * (CUDA_ERROR_FILE_NOT_FOUND otherwise); its content is not read. */
static CUresult load_module_file(void **out, const char *path) {
    REFUSE_IN_FORKED_CHILD();
    if (!out || !path) return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(path, "rb");
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    fclose(f);
    return load_module(out, path);
}

static CUresult impl_cuModuleLoadData(CUmodule *module, const void *image) {
    return load_module((void **)module, image);
}
EXPORT(cuModuleLoadData)

static CUresult impl_cuModuleLoad(CUmodule *module, const char *fname) {
    return load_module_file((void **)module, fname);
}
EXPORT(cuModuleLoad)

/* JIT options change nothing the simulation counts. */
static CUresult impl_cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                        int *options, void **optionValues) {
    (void)numOptions, (void)options, (void)optionValues;
    return load_module((void **)module, image);
}
EXPORT(cuModuleLoadDataEx)

static CUresult impl_cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    return load_module((void **)module, fatCubin);
}
EXPORT(cuModuleLoadFatBinary)

static CUresult impl_cuLibraryLoadData(CUlibrary *library, const void *code, void *jitOptions,
                                       void **jitOptionsValues, unsigned int numJitOptions,
                                       void *libraryOptions, void **libraryOptionValues,
                                       unsigned int numLibraryOptions) {
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    return load_module((void **)library, code);
}
EXPORT(cuLibraryLoadData)

static CUresult impl_cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, void *jitOptions,
                                           void **jitOptionsValues, unsigned int numJitOptions,
                                           void *libraryOptions, void **libraryOptionValues,
                                           unsigned int numLibraryOptions) {
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    return load_module_file((void **)library, fileName);
}
EXPORT(cuLibraryLoadFromFile)

/* ---- cuGetProcAddress ----------------------------------------------------------------------------- */

static CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
static CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *status);

struct sym {
    const char *name;
    void *fn;
};

/* Every CUDA entry point resolves to itself (the fakecuda_* functions are deliberately absent). */
#define SYM(name) {#name, (void *)impl_##name}
static const struct sym exported[] = {
    SYM(cuInit), SYM(cuDriverGetVersion), SYM(cuDeviceGet), SYM(cuDeviceGetCount), SYM(cuDeviceTotalMem_v2),
    SYM(cuDevicePrimaryCtxRetain), SYM(cuDevicePrimaryCtxRelease_v2), SYM(cuCtxSetCurrent), SYM(cuCtxGetCurrent),
    SYM(cuCtxGetDevice), SYM(cuCtxPushCurrent_v2), SYM(cuCtxPopCurrent_v2), SYM(cuCtxSynchronize),
    SYM(cuStreamCreate), SYM(cuStreamDestroy_v2), SYM(cuStreamGetDevice), SYM(cuStreamSynchronize),
    SYM(cuDeviceGetDefaultMemPool), SYM(cuDeviceGetMemPool), SYM(cuMemPoolCreate), SYM(cuMemPoolDestroy), SYM(cuMemAlloc_v2),
    SYM(cuMemFree_v2), SYM(cuMemAllocPitch_v2), SYM(cuMemAllocManaged), SYM(cuMemAllocAsync),
    SYM(cuMemAllocAsync_ptsz), SYM(cuMemFreeAsync), SYM(cuMemFreeAsync_ptsz), SYM(cuMemAllocFromPoolAsync),
    SYM(cuMemAllocFromPoolAsync_ptsz), SYM(cuMemCreate), SYM(cuMemRelease), SYM(cuMemAddressReserve),
    SYM(cuMemAddressFree), SYM(cuMemMap), SYM(cuMemUnmap), SYM(cuMemSetAccess), SYM(cuMemGetInfo_v2),
    SYM(cuMemHostAlloc), SYM(cuMemAllocHost_v2), SYM(cuMemFreeHost), SYM(cuGetErrorString),
    SYM(cuGetProcAddress_v2), SYM(cuDeviceGetUuid), SYM(cuModuleLoadData), SYM(cuLibraryLoadData),
    SYM(cuModuleLoad), SYM(cuModuleLoadDataEx), SYM(cuModuleLoadFatBinary), SYM(cuLibraryLoadFromFile),
    SYM(cuCtxCreate_v2),
    /* "cuGetProcAddress" itself is version-dependent: handled in lookup() */
};

/* Base names with a _v2 ABI: the _v2 function from the version that introduced it on (`since`),
 * the v1 function below it where this driver has one, else VERSION_NOT_SUFFICIENT. */
static const struct versioned_sym {
    const char *name;
    void *v2, *v1;
    int since;
} versioned[] = {
    {"cuMemAlloc", (void *)impl_cuMemAlloc_v2, NULL, 3020},
    {"cuMemFree", (void *)impl_cuMemFree_v2, NULL, 3020},
    {"cuMemAllocPitch", (void *)impl_cuMemAllocPitch_v2, NULL, 3020},
    {"cuMemGetInfo", (void *)impl_cuMemGetInfo_v2, NULL, 3020},
    {"cuDeviceTotalMem", (void *)impl_cuDeviceTotalMem_v2, NULL, 3020},
    {"cuMemAllocHost", (void *)impl_cuMemAllocHost_v2, NULL, 3020},
    {"cuCtxCreate", (void *)impl_cuCtxCreate_v2, NULL, 3020},
    {"cuCtxPushCurrent", (void *)impl_cuCtxPushCurrent_v2, NULL, 4000},
    {"cuCtxPopCurrent", (void *)impl_cuCtxPopCurrent_v2, NULL, 4000},
    {"cuCtxDestroy", (void *)impl_cuCtxDestroy_v2, (void *)impl_cuCtxDestroy, 4000},
    {"cuStreamDestroy", (void *)impl_cuStreamDestroy_v2, (void *)impl_cuStreamDestroy, 4000},
    {"cuDevicePrimaryCtxRelease", (void *)impl_cuDevicePrimaryCtxRelease_v2,
     (void *)impl_cuDevicePrimaryCtxRelease, 11000},
    {"cuDevicePrimaryCtxReset", (void *)impl_cuDevicePrimaryCtxReset_v2, (void *)impl_cuDevicePrimaryCtxReset,
     11000},
};

/* Per-thread-default-stream variants, given for flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. */
static const struct sym per_thread[] = {
    {"cuMemAllocAsync", (void *)impl_cuMemAllocAsync_ptsz},
    {"cuMemFreeAsync", (void *)impl_cuMemFreeAsync_ptsz},
    {"cuMemAllocFromPoolAsync", (void *)impl_cuMemAllocFromPoolAsync_ptsz},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void *find_sym(const struct sym *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return t[i].fn;
    return NULL;
}

static const struct versioned_sym *find_versioned(const char *name) {
    for (size_t i = 0; i < N_OF(versioned); i++)
        if (strcmp(versioned[i].name, name) == 0) return &versioned[i];
    return NULL;
}

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    void *fn = NULL;
    const struct versioned_sym *v;
    int st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        fn = version < 12000 ? (void *)impl_cuGetProcAddress : (void *)impl_cuGetProcAddress_v2;
    } else if ((v = find_versioned(symbol)) != NULL) {
        fn = version >= v->since ? v->v2 : v->v1;
        if (!fn) st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    } else if (!((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) &&
                 (fn = find_sym(per_thread, N_OF(per_thread), symbol)) != NULL)) {
        fn = find_sym(exported, N_OF(exported), symbol);
    }
    *pfn = fn;
    *status = fn ? CU_GET_PROC_ADDRESS_SUCCESS : st;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    REFUSE_IN_FORKED_CHILD();
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    CUdriverProcAddressQueryResult st;
    return lookup(symbol, pfn, cudaVersion, flags, &st);
}
EXPORT(cuGetProcAddress)

/* symbolStatus is optional, as documented for the real driver. */
static CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus) {
    REFUSE_IN_FORKED_CHILD();
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    CUdriverProcAddressQueryResult st;
    CUresult r = lookup(symbol, pfn, cudaVersion, flags, &st);
    if (symbolStatus) *symbolStatus = st;
    return r;
}
EXPORT(cuGetProcAddress_v2)

/* ---- simulation only ------------------------------------------------------------------------------ */

static unsigned long long impl_fakecuda_used(int device) {
    ensure_init();
    if (!valid_device(device)) return 0;
    pthread_mutex_lock(&lock);
    unsigned long long u = used[device];
    pthread_mutex_unlock(&lock);
    return u;
}
EXPORT(fakecuda_used)

/* Device memory of this process that no allocation accounts for: FAKECUDA_CONTEXT_BYTES once a
 * context was made on the device, plus FAKECUDA_MODULE_BYTES per module loaded there. What the
 * stand-in NVML adds to fakecuda_used() for this process, as real NVML counts a context. */
static unsigned long long impl_fakecuda_overhead(int device) {
    ensure_init();
    if (!valid_device(device)) return 0;
    const char *c = getenv("FAKECUDA_CONTEXT_BYTES");
    const char *m = getenv("FAKECUDA_MODULE_BYTES");
    unsigned long long context_bytes = c && *c ? strtoull(c, NULL, 10) : 0;
    unsigned long long module_bytes = m && *m ? strtoull(m, NULL, 10) : 0;
    pthread_mutex_lock(&lock);
    unsigned long long loaded = primary[device].modules;
    for (int i = 0; i < MAX_CREATED; i++)
        if (created[i].live && created[i].device == device) loaded += created[i].modules;
    unsigned long long o = (contexts_made[device] ? context_bytes : 0) + loaded * module_bytes;
    pthread_mutex_unlock(&lock);
    return o;
}
EXPORT(fakecuda_overhead)

/* 1 once a context was made on the device (the stand-in NVML lists the process only then). */
static int impl_fakecuda_has_context(int device) {
    ensure_init();
    if (!valid_device(device)) return 0;
    pthread_mutex_lock(&lock);
    int made = contexts_made[device];
    pthread_mutex_unlock(&lock);
    return made;
}
EXPORT(fakecuda_has_context)

/*
 * simrun.c: a scenario interpreter for the simulated CUDA stack. Each argv word is one CUDA operation
 * (see the op table in tests/sim/README.md), so that tests can drive every door into the driver (runtime
 * symbols, directly linked driver symbols, dlsym, cuGetProcAddress v1/v2, cudaGetDriverEntryPoint) from a
 * real process, under LD_PRELOAD, and compare the hook's counters with the driver's own truth.
 *
 * Built twice: `simrun`, linked to libcudart.so.13 and libcuda.so.1, and `simrun_rtonly` (-DSIMRUN_RTONLY),
 * linked only to the runtime, like a PyTorch process, where the drv.* operations are refused (exit 3).
 * Operations that reach the driver through dlopen/dlsym (dl.*, gpa1.*, gpa2.*, print.used) work in both.
 *
 * Exit status: 0 when every operation returned what it expected, 1 on a mismatch (or a failed forked
 * child, or a wait that timed out), 2 on a malformed scenario, 3 for a driver operation in simrun_rtonly.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "cuda_sim.h"

/* Messages start "simrun:" in both builds, so that tests match them the same way. */
#define PROG "simrun"

typedef unsigned long long ull;

/* ---- helpers --------------------------------------------------------------------------------------- */

static const char *cur_word; /* the word being run, for messages */

__attribute__((noreturn)) static void usage_error(const char *why) {
    fprintf(stderr, "%s: bad operation '%s': %s\n", PROG, cur_word, why);
    exit(2);
}

static ull num(const char *s) {
    char *end;
    errno = 0;
    ull v = strtoull(s, &end, 0);
    if (!*s || *end || errno) usage_error("expected a number");
    return v;
}

/* Variables: name -> value (device pointer, host pointer, stream, or handle). */
static struct var {
    char *name;
    ull val;
} *vars;
static size_t n_vars, cap_vars;

static void set_var(const char *name, ull val) {
    for (size_t i = 0; i < n_vars; i++)
        if (strcmp(vars[i].name, name) == 0) {
            vars[i].val = val;
            return;
        }
    if (n_vars == cap_vars) {
        cap_vars = cap_vars ? cap_vars * 2 : 64;
        vars = realloc(vars, cap_vars * sizeof *vars);
        if (!vars) abort();
    }
    vars[n_vars].name = strdup(name);
    vars[n_vars++].val = val;
}

/* An operand naming an existing allocation: "0" (NULL), a hex literal "0x..." or a variable. */
static ull operand(const char *s) {
    if (strcmp(s, "0") == 0) return 0;
    if (strncmp(s, "0x", 2) == 0 || strncmp(s, "0X", 2) == 0) return num(s);
    for (size_t i = 0; i < n_vars; i++)
        if (strcmp(vars[i].name, s) == 0) return vars[i].val;
    usage_error("unknown variable");
}

static void *ptr(ull v) { return (void *)(uintptr_t)v; }

/* The driver as the runtime finds it: dlopen("libcuda.so.1"). */
static void *driver(void) {
    static void *h;
    if (!h) {
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "%s: dlopen(libcuda.so.1): %s\n", PROG, dlerror());
            exit(2);
        }
    }
    return h;
}

static void *driver_sym(const char *name) {
    void *f = dlsym(driver(), name);
    if (!f) {
        fprintf(stderr, "%s: dlsym(libcuda.so.1, %s) found nothing\n", PROG, name);
        exit(2);
    }
    return f;
}

/* NVML, loaded as pynvml loads it (sym = 0) or into the global scope as if the program were linked
 * to it (sym = 1). */
static void *nvml_handle(int global) {
    /* Opened again each time: a later RTLD_GLOBAL promotes an earlier local opening. */
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
    if (!h) {
        fprintf(stderr, "%s: dlopen(libnvidia-ml.so.1): %s\n", PROG, dlerror());
        exit(2);
    }
    return h;
}

static void *nvml_sym(void *h, int global, const char *name) {
    void *f = dlsym(global ? RTLD_DEFAULT : h, name);
    if (!f) {
        fprintf(stderr, "%s: dlsym(%s) found nothing\n", PROG, name);
        exit(2);
    }
    return f;
}

static CUresult gpa2(const char *symbol, void **fn, int version, cuuint64_t flags) {
    PFN_cuGetProcAddress_v2 g = (PFN_cuGetProcAddress_v2)driver_sym("cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult st;
    return g(symbol, fn, version, flags, &st);
}

static void sleep_ms(ull ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* ---- the threads op ------------------------------------------------------------------------------- */

/*
 * Each thread runs ITERS steps of xorshift64 seeded SEED + thread index (a zero state is replaced by a
 * fixed constant). A step draws r; it allocates when no block is live, or when fewer than 16 are and r is
 * odd (size 1 + next draw % MAXBYTES); otherwise it frees the live block at index (next draw % live).
 * Allocations alternate cudaMalloc / cuMemAlloc_v2, frees cudaFree / cuMemFree_v2, each starting with the
 * runtime (simrun_rtonly: runtime only). Starting with the runtime also gives the new thread a context.
 */
struct worker {
    pthread_t tid;
    ull seed, iters, maxbytes;
    int device; /* made current first (cudaSetDevice), -1 for none */
    ull allocs, frees, live, total;
    int err;
};

static uint64_t xorshift64(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    uint64_t x = w->seed ? w->seed : 0x9e3779b97f4a7c15ULL;
    if (w->device >= 0 && cudaSetDevice(w->device)) {
        w->err = 1;
        return NULL;
    }
    ull blocks[16];
    int n = 0;
    ull n_alloc = 0, n_free = 0;
    for (ull it = 0; it < w->iters; it++) {
        uint64_t r = xorshift64(&x);
        if (n == 0 || (n < 16 && (r & 1))) {
            size_t size = (size_t)(1 + xorshift64(&x) % w->maxbytes);
            int rc;
#ifndef SIMRUN_RTONLY
            if (n_alloc % 2) {
                CUdeviceptr p = 0;
                rc = cuMemAlloc_v2(&p, size);
                blocks[n] = p;
            } else
#endif
            {
                void *p = NULL;
                rc = cudaMalloc(&p, size);
                blocks[n] = (ull)(uintptr_t)p;
            }
            n_alloc++;
            if (rc) {
                w->err = rc;
                break;
            }
            n++;
            w->allocs++;
            w->total += size;
        } else {
            int k = (int)(xorshift64(&x) % (uint64_t)n);
            int rc;
#ifndef SIMRUN_RTONLY
            if (n_free % 2)
                rc = cuMemFree_v2(blocks[k]);
            else
#endif
                rc = cudaFree(ptr(blocks[k]));
            n_free++;
            if (rc) {
                w->err = rc;
                break;
            }
            blocks[k] = blocks[--n];
            w->frees++;
        }
    }
    w->live = (ull)n; /* the live blocks are kept */
    return NULL;
}

/* threads (devices 0: each thread on the device current when it starts) and churn (thread i on
 * device i % devices). */
static int op_threads(ull nthreads, ull iters, ull seed, ull maxbytes, ull devices) {
    if (nthreads == 0 || nthreads > 1024 || maxbytes == 0) usage_error("threads:N:ITERS:SEED:MAXBYTES");
    struct worker *w = calloc(nthreads, sizeof *w);
    if (!w) abort();
    for (ull i = 0; i < nthreads; i++) {
        w[i].device = devices ? (int)(i % devices) : -1;
        w[i].seed = seed + i;
        w[i].iters = iters;
        w[i].maxbytes = maxbytes;
        if (pthread_create(&w[i].tid, NULL, worker_main, &w[i])) {
            fprintf(stderr, "%s: pthread_create failed\n", PROG);
            exit(2);
        }
    }
    ull a = 0, f = 0, l = 0, t = 0;
    int err = 0;
    for (ull i = 0; i < nthreads; i++) {
        pthread_join(w[i].tid, NULL);
        a += w[i].allocs;
        f += w[i].frees;
        l += w[i].live;
        t += w[i].total;
        if (!err) err = w[i].err;
    }
    free(w);
    printf("threads allocs=%llu frees=%llu live=%llu total=%llu\n", a, f, l, t);
    return err;
}

/* ---- the race op: threads competing for the last bytes under a ceiling ---------------------------- */

struct racer {
    pthread_t tid;
    pthread_barrier_t *start;
    ull bytes, ok;
    int last; /* the code that stopped the thread */
};

/* Allocates `bytes` again and again (keeping every block) until an allocation fails. */
static void *racer_main(void *arg) {
    struct racer *r = arg;
    pthread_barrier_wait(r->start);
    for (;;) {
        void *p = NULL;
        int rc = cudaMalloc(&p, r->bytes);
        if (rc) {
            r->last = rc;
            return NULL;
        }
        r->ok++;
    }
}

/* race:N:BYTES: N threads start together and allocate BYTES each until refused; prints
 * "race ok=K refused=R last=C" (C: the first thread's stopping code). Fails unless every thread
 * stopped with the same code. */
static int op_race(ull nthreads, ull bytes) {
    if (nthreads == 0 || nthreads > 1024 || bytes == 0) usage_error("race:N:BYTES");
    struct racer *r = calloc(nthreads, sizeof *r);
    pthread_barrier_t start;
    if (!r || pthread_barrier_init(&start, NULL, (unsigned)nthreads)) abort();
    for (ull i = 0; i < nthreads; i++) {
        r[i].start = &start;
        r[i].bytes = bytes;
        if (pthread_create(&r[i].tid, NULL, racer_main, &r[i])) abort();
    }
    ull ok = 0;
    int same = 1;
    for (ull i = 0; i < nthreads; i++) {
        pthread_join(r[i].tid, NULL);
        ok += r[i].ok;
        same &= r[i].last == r[0].last;
    }
    printf("race ok=%llu refused=%llu last=%d\n", ok, nthreads, r[0].last);
    pthread_barrier_destroy(&start);
    free(r);
    return same ? 0 : 1;
}

/* ---- the brief op: many short-lived threads, one after another --------------------------------- */

/* One thread's life: cudaMalloc of `*bytes`, then cudaFree of it; the code of the first failure. */
static void *brief_main(void *arg) {
    ull bytes = *(ull *)arg;
    void *p = NULL;
    int rc = cudaMalloc(&p, bytes);
    if (!rc) rc = cudaFree(p);
    return (void *)(intptr_t)rc;
}

/* brief:N:BYTES: N threads, started one after another (each joined before the next starts), each
 * allocating BYTES and freeing them (two events a thread); prints "brief threads=N". */
static int op_brief(ull nthreads, ull bytes) {
    if (nthreads == 0 || bytes == 0) usage_error("brief:N:BYTES");
    for (ull i = 0; i < nthreads; i++) {
        pthread_t tid;
        void *rc = NULL;
        if (pthread_create(&tid, NULL, brief_main, &bytes)) abort();
        pthread_join(tid, &rc);
        if (rc) {
            fprintf(stderr, "%s: brief thread %llu failed: %d\n", PROG, i, (int)(intptr_t)rc);
            return 1;
        }
    }
    printf("brief threads=%llu\n", nthreads);
    return 0;
}

/* ---- the handoff op: frees on other threads, before and after their owners exit ---------------------- */

/*
 * handoff:N:COUNT:BYTES: N threads each allocate COUNT blocks of BYTES (alternating cudaMalloc and
 * cuMemAlloc_v2); after a barrier each frees the even-numbered blocks of its neighbour (a free of an
 * allocation another, living, thread made), then, after a second barrier, allocates and frees COUNT
 * blocks of its own again (with a reusing driver, at the addresses just freed), and exits keeping its
 * odd-numbered blocks. The main thread then frees those (allocations of threads that have exited).
 * Prints "handoff allocs=A frees=F"; fails on the first error.
 */
struct handoff {
    pthread_t tid;
    pthread_barrier_t *phase;
    ull count, bytes, index, nthreads;
    ull *blocks; /* nthreads * count, shared */
    int err;
};

static int alloc_alternating(ull i, ull bytes, ull *out) {
    (void)i;
#ifndef SIMRUN_RTONLY
    if (i % 2) {
        CUdeviceptr p = 0;
        int rc = cuMemAlloc_v2(&p, bytes);
        *out = p;
        return rc;
    }
#endif
    void *p = NULL;
    int rc = cudaMalloc(&p, bytes);
    *out = (ull)(uintptr_t)p;
    return rc;
}

static int free_alternating(ull i, ull p) {
    (void)i;
#ifndef SIMRUN_RTONLY
    if (i % 2) return cuMemFree_v2(p);
#endif
    return cudaFree(ptr(p));
}

static void *handoff_main(void *arg) {
    struct handoff *h = arg;
    ull *mine = h->blocks + h->index * h->count;
    ull *next = h->blocks + ((h->index + 1) % h->nthreads) * h->count;
    for (ull i = 0; i < h->count && !h->err; i++) h->err = alloc_alternating(i, h->bytes, &mine[i]);
    pthread_barrier_wait(h->phase);
    for (ull i = 0; i < h->count && !h->err; i += 2) h->err = free_alternating(i + 1, next[i]);
    pthread_barrier_wait(h->phase);
    for (ull i = 0; i < h->count && !h->err; i++) {
        ull p = 0;
        h->err = alloc_alternating(i, h->bytes, &p);
        if (!h->err) h->err = free_alternating(i + 1, p);
    }
    return NULL;
}

static int op_handoff(ull nthreads, ull count, ull bytes) {
    if (nthreads < 2 || nthreads > 256 || count == 0 || bytes == 0) usage_error("handoff:N:COUNT:BYTES");
    struct handoff *h = calloc(nthreads, sizeof *h);
    ull *blocks = calloc(nthreads * count, sizeof *blocks);
    pthread_barrier_t phase;
    if (!h || !blocks || pthread_barrier_init(&phase, NULL, (unsigned)nthreads)) abort();
    for (ull i = 0; i < nthreads; i++) {
        h[i] = (struct handoff){.phase = &phase, .count = count, .bytes = bytes, .index = i,
                                .nthreads = nthreads, .blocks = blocks};
        if (pthread_create(&h[i].tid, NULL, handoff_main, &h[i])) abort();
    }
    int err = 0;
    for (ull i = 0; i < nthreads; i++) {
        pthread_join(h[i].tid, NULL);
        if (!err) err = h[i].err;
    }
    ull frees = 0;
    for (ull t = 0; t < nthreads && !err; t++)
        for (ull i = 1; i < count && !err; i += 2, frees++) err = free_alternating(i, blocks[t * count + i]);
    printf("handoff allocs=%llu frees=%llu\n", 2 * nthreads * count,
           nthreads * (count + (count + 1) / 2) + frees);
    pthread_barrier_destroy(&phase);
    free(blocks);
    free(h);
    return err;
}

/* ---- hold / release.held: a large live set, freed in random order ------------------------------------- */

static ull *held;
static size_t n_held;

/* hold:N:BYTES: allocates N blocks of BYTES (alternately cuMemAlloc_v2 and cudaMalloc) and keeps them. */
static int op_hold(ull n, ull bytes) {
    if (n == 0 || bytes == 0) usage_error("hold:N:BYTES");
    ull *grown = realloc(held, (n_held + n) * sizeof *held);
    if (!grown) abort();
    held = grown;
    for (ull i = 0; i < n; i++) {
        int rc;
#ifndef SIMRUN_RTONLY
        if (i % 2) {
            CUdeviceptr p = 0;
            rc = cuMemAlloc_v2(&p, (size_t)bytes);
            held[n_held] = p;
        } else
#endif
        {
            void *p = NULL;
            rc = cudaMalloc(&p, (size_t)bytes);
            held[n_held] = (ull)(uintptr_t)p;
        }
        if (rc) return rc;
        n_held++;
    }
    return 0;
}

/* release.held:SEED: frees every held block, in an order shuffled by SEED (alternately cuMemFree_v2
 * and cudaFree). */
static int op_release_held(ull seed) {
    uint64_t x = seed ? seed : 1;
    for (size_t i = n_held; i > 1; i--) {
        size_t j = (size_t)(xorshift64(&x) % i);
        ull t = held[i - 1];
        held[i - 1] = held[j];
        held[j] = t;
    }
    for (size_t i = 0; i < n_held; i++) {
        int rc;
#ifndef SIMRUN_RTONLY
        if (i % 2)
            rc = cuMemFree_v2(held[i]);
        else
#endif
            rc = cudaFree(ptr(held[i]));
        if (rc) return rc;
    }
    n_held = 0;
    return 0;
}

/* release.held.failing:SEED:BYTES: release.held:SEED while another thread asks for BYTES (cudaMalloc,
 * which reaches the driver) again and again; an allocation that succeeds is freed at once. Prints
 * `failing asked=K failed=F`. */
struct failer {
    pthread_t tid;
    volatile int stop;
    ull bytes, asked, failed;
};

static void *failer_main(void *arg) {
    struct failer *f = arg;
    while (!f->stop) {
        void *p = NULL;
        __atomic_add_fetch(&f->asked, 1, __ATOMIC_RELAXED);
        if (cudaMalloc(&p, (size_t)f->bytes))
            f->failed++;
        else
            cudaFree(p);
    }
    return NULL;
}

static int op_release_held_failing(ull seed, ull bytes) {
    struct failer f = {0};
    f.bytes = bytes;
    if (pthread_create(&f.tid, NULL, failer_main, &f)) {
        fprintf(stderr, "%s: pthread_create failed\n", PROG);
        exit(2);
    }
    /* Let the other thread start asking before the frees begin. */
    while (__atomic_load_n(&f.asked, __ATOMIC_RELAXED) < 2) sched_yield();
    int rc = op_release_held(seed);
    f.stop = 1;
    pthread_join(f.tid, NULL);
    printf("failing asked=%llu failed=%llu\n", f.asked, f.failed);
    return rc;
}

/* ---- the forkstorm op: fork while other threads allocate ------------------------------------------- */

struct stormer {
    pthread_t tid;
    volatile int *stop;
    ull seed, ops;
};

/* Allocates and frees small blocks until told to stop, keeping up to 64 live. */
static void *stormer_main(void *arg) {
    struct stormer *w = arg;
    void *live[64] = {0};
    ull x = w->seed | 1;
    while (!__atomic_load_n(w->stop, __ATOMIC_RELAXED)) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int k = (int)(x % 64);
        if (live[k]) {
            cudaFree(live[k]);
            live[k] = NULL;
        } else {
            cudaMalloc(&live[k], 512 + (size_t)(x >> 40) % 65536);
        }
        w->ops++;
    }
    for (int k = 0; k < 64; k++)
        if (live[k]) cudaFree(live[k]);
    return NULL;
}

/* forkstorm:N:THREADS: THREADS threads allocate and free without pause while the main thread forks N
 * children, one after another. Each child frees a block its parent allocated and allocates one of its
 * own (a real driver refuses both in a forked child), then exits; a child that has not exited after 10 s
 * is counted as hung and killed. Prints "forkstorm children=N hung=H"; fails when H > 0. */
static int op_forkstorm(ull children, ull nthreads) {
    if (children == 0 || nthreads == 0 || nthreads > 64) usage_error("forkstorm:N:THREADS");
    void *inherited = NULL;
    if (cudaMalloc(&inherited, 4096)) usage_error("the parent cannot allocate");
    volatile int stop = 0;
    struct stormer w[64];
    for (ull i = 0; i < nthreads; i++) {
        w[i] = (struct stormer){.stop = &stop, .seed = 0x9e3779b97f4a7c15ULL * (i + 1)};
        if (pthread_create(&w[i].tid, NULL, stormer_main, &w[i])) abort();
    }
    ull hung = 0;
    for (ull c = 0; c < children; c++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            perror(PROG ": fork");
            return 2;
        }
        if (pid == 0) {
            void *mine = NULL;
            cudaFree(inherited);
            cudaMalloc(&mine, 1024);
            if (c % 2) _exit(0);
            exit(0); /* half the children run atexit handlers, half do not */
        }
        int status = 0, done = 0;
        for (int i = 0; i < 10000 && !done; i++) {
            pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid) done = 1;
            else sleep_ms(1);
        }
        if (!done) {
            hung++;
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        }
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    ull ops = 0;
    for (ull i = 0; i < nthreads; i++) {
        pthread_join(w[i].tid, NULL);
        ops += w[i].ops;
    }
    cudaFree(inherited);
    printf("forkstorm children=%llu hung=%llu thread_ops=%llu\n", children, hung, ops);
    return hung ? 1 : 0;
}

/* ---- one operation --------------------------------------------------------------------------------- */

#define MAX_FIELDS 8

/* Runs the operation split into f[0..nf); returns the CUDA code it got. *dflt is the code it expects
 * when the word has no "=N" (0 unless the operation says otherwise). */
static int run_op(char **f, int nf, int *dflt) {
    const char *op = f[0];
#define ARGS(n) \
    if (nf != (n) + 1) usage_error("wrong number of fields")
#define IS(name) (strcmp(op, name) == 0)

    /* runtime */
    if (IS("rt.setdev")) {
        ARGS(1);
        return cudaSetDevice((int)num(f[1]));
    }
    if (IS("rt.malloc") || IS("rt.malloc_async") || IS("rt.malloc_async_ptsz") || IS("rt.malloc_managed") ||
        IS("rt.malloc_host") || IS("rt.host_alloc") || IS("rt.malloc_pool") || IS("rt.malloc_pool_ptsz")) {
        ARGS(2);
        size_t bytes = (size_t)num(f[2]);
        void *p = NULL;
        int r;
        if (IS("rt.malloc")) {
            r = cudaMalloc(&p, bytes);
        } else if (IS("rt.malloc_async")) {
            r = cudaMallocAsync(&p, bytes, NULL);
        } else if (IS("rt.malloc_async_ptsz")) {
            r = cudaMallocAsync_ptsz(&p, bytes, NULL);
        } else if (IS("rt.malloc_managed")) {
            r = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
        } else if (IS("rt.malloc_host")) {
            r = cudaMallocHost(&p, bytes);
            if (r == 0) memset(p, 0xab, bytes); /* host memory must be real and writable */
        } else if (IS("rt.host_alloc")) {
            r = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
            if (r == 0) memset(p, 0xab, bytes);
        } else { /* rt.malloc_pool, rt.malloc_pool_ptsz */
            int dev = 0;
            cudaMemPool_t pool = NULL;
            r = cudaGetDevice(&dev);
            if (r == 0) r = cudaDeviceGetDefaultMemPool(&pool, dev);
            if (r == 0 && IS("rt.malloc_pool")) r = cudaMallocFromPoolAsync(&p, bytes, pool, NULL);
            if (r == 0 && IS("rt.malloc_pool_ptsz")) r = cudaMallocFromPoolAsync_ptsz(&p, bytes, pool, NULL);
        }
        if (r == 0) set_var(f[1], (ull)(uintptr_t)p);
        return r;
    }
    if (IS("rt.malloc_pitch")) {
        ARGS(3);
        void *p = NULL;
        size_t pitch = 0;
        int r = cudaMallocPitch(&p, &pitch, (size_t)num(f[2]), (size_t)num(f[3]));
        if (r == 0) set_var(f[1], (ull)(uintptr_t)p);
        return r;
    }
    if (IS("rt.free") || IS("rt.free_async") || IS("rt.free_async_ptsz") || IS("rt.free_host")) {
        ARGS(1);
        void *p = ptr(operand(f[1]));
        if (IS("rt.free")) return cudaFree(p);
        if (IS("rt.free_async")) return cudaFreeAsync(p, NULL);
        if (IS("rt.free_async_ptsz")) return cudaFreeAsync_ptsz(p, NULL);
        return cudaFreeHost(p);
    }
    if (IS("rt.meminfo")) {
        ARGS(0);
        size_t fr = 0, tot = 0;
        int r = cudaMemGetInfo(&fr, &tot);
        if (r == 0) printf("rt.meminfo free=%zu total=%zu\n", fr, tot);
        return r;
    }

    /* driver, by direct linking */
    if (strncmp(op, "drv.", 4) == 0) {
#ifdef SIMRUN_RTONLY
        (void)dflt;
        fprintf(stderr, "%s: '%s' needs the driver linked; refused in simrun_rtonly\n", PROG, cur_word);
        exit(3);
#else
        if (IS("drv.init")) {
            ARGS(0);
            return cuInit(0);
        }
        if (IS("drv.ctx")) {
            ARGS(1);
            CUcontext c;
            int r = cuDevicePrimaryCtxRetain(&c, (int)num(f[1]));
            return r ? r : cuCtxSetCurrent(c);
        }
        if (IS("drv.alloc") || IS("drv.alloc_managed") || IS("drv.alloc_async") || IS("drv.alloc_async_ptsz")) {
            ARGS(2);
            size_t bytes = (size_t)num(f[2]);
            CUdeviceptr p = 0;
            int r;
            if (IS("drv.alloc"))
                r = cuMemAlloc_v2(&p, bytes);
            else if (IS("drv.alloc_managed"))
                r = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
            else if (IS("drv.alloc_async"))
                r = cuMemAllocAsync(&p, bytes, NULL);
            else
                r = cuMemAllocAsync_ptsz(&p, bytes, NULL);
            if (r == 0) set_var(f[1], p);
            return r;
        }
        if (IS("drv.free") || IS("drv.free_async") || IS("drv.free_async_ptsz")) {
            ARGS(1);
            CUdeviceptr p = operand(f[1]);
            if (IS("drv.free")) return cuMemFree_v2(p);
            if (IS("drv.free_async")) return cuMemFreeAsync(p, NULL);
            return cuMemFreeAsync_ptsz(p, NULL);
        }
        if (IS("drv.alloc_pitch")) {
            ARGS(4);
            CUdeviceptr p = 0;
            size_t pitch = 0;
            int r = cuMemAllocPitch_v2(&p, &pitch, (size_t)num(f[2]), (size_t)num(f[3]), (unsigned)num(f[4]));
            if (r == 0) set_var(f[1], p);
            return r;
        }
        if (IS("drv.stream")) {
            ARGS(2);
            CUcontext c, prev = NULL;
            CUstream s = NULL;
            int r = cuDevicePrimaryCtxRetain(&c, (int)num(f[2]));
            if (r == 0) r = cuCtxGetCurrent(&prev);
            if (r == 0) r = cuCtxSetCurrent(c);
            if (r == 0) {
                r = cuStreamCreate(&s, 0);
                cuCtxSetCurrent(prev); /* NULL pops what the switch pushed: back to no context */
            }
            if (r == 0) set_var(f[1], (ull)(uintptr_t)s);
            return r;
        }
        if (IS("drv.stream_destroy") || IS("drv.stream_destroy_v1")) {
            ARGS(1);
            CUstream s = (CUstream)ptr(operand(f[1]));
            if (IS("drv.stream_destroy")) return cuStreamDestroy_v2(s);
            if (IS("drv.stream_destroy_v1")) return cuStreamDestroy(s);
        }
        if (IS("drv.ctx_release") || IS("drv.ctx_release_v1") || IS("drv.ctx_reset") || IS("drv.ctx_reset_v1")) {
            ARGS(1);
            int d = (int)num(f[1]);
            if (IS("drv.ctx_release")) return cuDevicePrimaryCtxRelease_v2(d);
            if (IS("drv.ctx_release_v1")) return cuDevicePrimaryCtxRelease(d);
            if (IS("drv.ctx_reset")) return cuDevicePrimaryCtxReset_v2(d);
            if (IS("drv.ctx_reset_v1")) return cuDevicePrimaryCtxReset(d);
        }
        if (IS("drv.ctx_create")) {
            ARGS(2);
            CUcontext c = NULL;
            int r = cuCtxCreate_v2(&c, 0, (int)num(f[2]));
            if (r == 0) set_var(f[1], (ull)(uintptr_t)c);
            return r;
        }
        if (IS("drv.ctx_destroy") || IS("drv.ctx_destroy_v1")) {
            ARGS(1);
            CUcontext c = (CUcontext)ptr(operand(f[1]));
            if (IS("drv.ctx_destroy")) return cuCtxDestroy_v2(c);
            if (IS("drv.ctx_destroy_v1")) return cuCtxDestroy(c);
        }
        if (IS("drv.pool_create")) {
            ARGS(2);
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = (int)num(f[2]);
            CUmemoryPool pool = NULL;
            int r = cuMemPoolCreate(&pool, &props);
            if (r == 0) set_var(f[1], (ull)(uintptr_t)pool);
            return r;
        }
        if (IS("drv.pool_destroy")) {
            ARGS(1);
            return cuMemPoolDestroy((CUmemoryPool)ptr(operand(f[1])));
        }
        if (IS("drv.pool_get")) {
            ARGS(2);
            CUmemoryPool pool = NULL;
            int r = cuDeviceGetMemPool(&pool, (int)num(f[2]));
            if (r == 0) set_var(f[1], (ull)(uintptr_t)pool);
            return r;
        }
        if (IS("drv.alloc_from") || IS("drv.alloc_from_ptsz")) {
            ARGS(3);
            CUmemoryPool pool = (CUmemoryPool)ptr(operand(f[3]));
            size_t bytes = (size_t)num(f[2]);
            CUdeviceptr p = 0;
            int r = 0;
            if (IS("drv.alloc_from")) r = cuMemAllocFromPoolAsync(&p, bytes, pool, NULL);
            if (IS("drv.alloc_from_ptsz")) r = cuMemAllocFromPoolAsync_ptsz(&p, bytes, pool, NULL);
            if (r == 0) set_var(f[1], p);
            return r;
        }
        if (IS("drv.alloc_async_on")) {
            ARGS(3);
            CUdeviceptr p = 0;
            int r = cuMemAllocAsync(&p, (size_t)num(f[2]), (CUstream)ptr(operand(f[3])));
            if (r == 0) set_var(f[1], p);
            return r;
        }
        if (IS("drv.alloc_pool")) {
            ARGS(3);
            CUmemoryPool pool = NULL;
            CUdeviceptr p = 0;
            int r = cuDeviceGetDefaultMemPool(&pool, (int)num(f[3]));
            if (r == 0) r = cuMemAllocFromPoolAsync(&p, (size_t)num(f[2]), pool, NULL);
            if (r == 0) set_var(f[1], p);
            return r;
        }
        if (IS("drv.create") || IS("drv.create_host")) {
            ARGS(IS("drv.create") ? 3 : 2);
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = IS("drv.create") ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
            prop.location.id = IS("drv.create") ? (int)num(f[3]) : 0;
            CUmemGenericAllocationHandle h = 0;
            int r = cuMemCreate(&h, (size_t)num(f[2]), &prop, 0);
            if (r == 0) set_var(f[1], h);
            return r;
        }
        if (IS("drv.release")) {
            ARGS(1);
            return cuMemRelease(operand(f[1]));
        }
        if (IS("drv.host_alloc") || IS("drv.alloc_host")) {
            ARGS(2);
            size_t bytes = (size_t)num(f[2]);
            void *p = NULL;
            int r = IS("drv.host_alloc") ? cuMemHostAlloc(&p, bytes, 0) : cuMemAllocHost_v2(&p, bytes);
            if (r == 0) {
                memset(p, 0xab, bytes);
                set_var(f[1], (ull)(uintptr_t)p);
            }
            return r;
        }
        if (IS("drv.free_host")) {
            ARGS(1);
            return cuMemFreeHost(ptr(operand(f[1])));
        }
        if (IS("drv.meminfo")) {
            ARGS(0);
            size_t fr = 0, tot = 0;
            int r = cuMemGetInfo_v2(&fr, &tot);
            if (r == 0) printf("drv.meminfo free=%zu total=%zu\n", fr, tot);
            return r;
        }
        if (IS("drv.meminfo_null")) {
            ARGS(0);
            *dflt = CUDA_ERROR_INVALID_VALUE;
            return cuMemGetInfo_v2(NULL, NULL);
        }
        if (IS("drv.alloc_null")) {
            ARGS(1);
            *dflt = CUDA_ERROR_INVALID_VALUE;
            return cuMemAlloc_v2(NULL, (size_t)num(f[1]));
        }
        if (IS("drv.module")) {
            ARGS(0);
            CUmodule m = NULL;
            return cuModuleLoadData(&m, "module image");
        }
        if (IS("drv.library")) {
            ARGS(0);
            CUlibrary l = NULL;
            return cuLibraryLoadData(&l, "library image", NULL, NULL, 0, NULL, NULL, 0);
        }
        if (IS("drv.module_ex") || IS("drv.module_fatbin")) {
            ARGS(0);
            CUmodule m = NULL;
            if (IS("drv.module_ex")) return cuModuleLoadDataEx(&m, "module image", 0, NULL, NULL);
            if (IS("drv.module_fatbin")) return cuModuleLoadFatBinary(&m, "fat binary");
        }
        if (IS("drv.module_file") || IS("drv.library_file")) {
            ARGS(1);
            CUmodule m = NULL;
            CUlibrary l = NULL;
            if (IS("drv.module_file")) return cuModuleLoad(&m, f[1]);
            if (IS("drv.library_file")) return cuLibraryLoadFromFile(&l, f[1], NULL, NULL, 0, NULL, NULL, 0);
        }
        if (IS("drv.total")) {
            ARGS(1);
            int d = (int)num(f[1]);
            size_t t = 0;
            int r = cuDeviceTotalMem_v2(&t, d);
            if (r == 0) printf("drv.total dev=%d total=%zu\n", d, t);
            return r;
        }
        usage_error("unknown operation");
#endif
    }

    /* NVML, through a door: "sym" (the name as a program linked to NVML binds it: the first
     * definition in the global scope, after dlopen(RTLD_GLOBAL)) or "dl" (dlsym on NVML's handle,
     * as pynvml and PyTorch look it up) */
    if (IS("nvml.mem") || IS("nvml.mem2") || IS("nvml.procs")) {
        int procs = IS("nvml.procs");
        ARGS(procs ? 3 : 2);
        const char *door = f[procs ? 3 : 2];
        int sym = strcmp(door, "sym") == 0;
        if (!sym && strcmp(door, "dl") != 0) usage_error("the door is sym or dl");
        void *h = nvml_handle(sym);
        int (*init)(void) = (int (*)(void))nvml_sym(h, sym, "nvmlInit_v2");
        int r = init();
        if (r) return r;
        int (*by_index)(unsigned, void **) =
            (int (*)(unsigned, void **))nvml_sym(h, sym, "nvmlDeviceGetHandleByIndex_v2");
        unsigned d = (unsigned)num(f[1]);
        void *dev = NULL;
        if ((r = by_index(d, &dev)) != 0) return r;
        if (IS("nvml.mem")) {
            struct { ull total, free, used; } m;
            int (*get)(void *, void *) = (int (*)(void *, void *))nvml_sym(h, sym, "nvmlDeviceGetMemoryInfo");
            if ((r = get(dev, &m)) == 0)
                printf("nvml.mem dev=%u total=%llu free=%llu used=%llu\n", d, m.total, m.free, m.used);
            return r;
        }
        if (IS("nvml.mem2")) {
            struct { unsigned version; ull total, reserved, free, used; } m = {(unsigned)(sizeof m | 2u << 24), 0, 0, 0, 0};
            int (*get)(void *, void *) = (int (*)(void *, void *))nvml_sym(h, sym, "nvmlDeviceGetMemoryInfo_v2");
            if ((r = get(dev, &m)) == 0)
                printf("nvml.mem2 dev=%u total=%llu reserved=%llu free=%llu used=%llu\n", d, m.total, m.reserved,
                       m.free, m.used);
            return r;
        }
        ull v = num(f[2]);
        const char *name = v == 1 ? "nvmlDeviceGetComputeRunningProcesses"
                         : v == 2 ? "nvmlDeviceGetComputeRunningProcesses_v2"
                                  : "nvmlDeviceGetComputeRunningProcesses_v3";
        int (*get)(void *, unsigned *, void *) = (int (*)(void *, unsigned *, void *))nvml_sym(h, sym, name);
        /* Entries of either layout, read through their own stride. */
        unsigned char buf[8 * 24];
        unsigned count = 8;
        if ((r = get(dev, &count, buf)) != 0) return r;
        size_t stride = v == 1 ? 16 : 24;
        ull self = 0, others = 0;
        for (unsigned i = 0; i < count; i++) {
            unsigned pid;
            ull bytes;
            memcpy(&pid, buf + i * stride, sizeof pid);
            memcpy(&bytes, buf + i * stride + 8, sizeof bytes);
            if (pid == (unsigned)getpid())
                self = bytes;
            else
                others += bytes;
        }
        printf("nvml.procs dev=%u version=%llu count=%u self=%llu others=%llu\n", d, v, count, self, others);
        return 0;
    }

    /* a library that allocates on its own (tests/sim/fake_collective.c) */
    if (IS("lib.alloc") || IS("lib.rt_alloc") || IS("lib.free")) {
        ARGS(IS("lib.free") ? 1 : 2);
        void *h = dlopen("libfakecollective.so", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "%s: dlopen(libfakecollective.so): %s\n", PROG, dlerror());
            exit(2);
        }
        if (IS("lib.free")) {
            int (*fn)(CUdeviceptr) = (int (*)(CUdeviceptr))dlsym(h, "fakecollective_free");
            return fn(operand(f[1]));
        }
        CUdeviceptr p = 0;
        int r;
        if (IS("lib.alloc")) {
            int (*fn)(CUdeviceptr *, size_t) = (int (*)(CUdeviceptr *, size_t))dlsym(h, "fakecollective_alloc");
            r = fn(&p, (size_t)num(f[2]));
        } else {
            int (*fn)(void **, size_t) = (int (*)(void **, size_t))dlsym(h, "fakecollective_rt_alloc");
            void *q = NULL;
            r = fn(&q, (size_t)num(f[2]));
            p = (CUdeviceptr)q;
        }
        if (r == 0) set_var(f[1], p);
        return r;
    }

    /* driver, through dlsym / cuGetProcAddress / cudaGetDriverEntryPoint */
    if (IS("dl.alloc") || IS("gpa1.alloc") || IS("gpa2.alloc") || IS("ep.alloc")) {
        ARGS(2);
        PFN_cuMemAlloc_v2 fn = NULL;
        int r = 0;
        if (IS("dl.alloc")) {
            fn = (PFN_cuMemAlloc_v2)driver_sym("cuMemAlloc_v2");
        } else if (IS("gpa1.alloc")) {
            PFN_cuGetProcAddress_v1 v1 = NULL;
            r = gpa2("cuGetProcAddress", (void **)&v1, 11030, 0);
            if (r == 0) r = v1("cuMemAlloc", (void **)&fn, 12000, 0);
        } else if (IS("gpa2.alloc")) {
            r = gpa2("cuMemAlloc", (void **)&fn, 12000, 0);
        } else {
            int st = 0;
            r = cudaGetDriverEntryPoint("cuMemAlloc", (void **)&fn, 0, &st);
        }
        if (r) return r;
        CUdeviceptr p = 0;
        r = fn(&p, (size_t)num(f[2]));
        if (r == 0) set_var(f[1], p);
        return r;
    }
    if (IS("gpa2.free")) {
        ARGS(1);
        PFN_cuMemFree_v2 fn = NULL;
        int r = gpa2("cuMemFree", (void **)&fn, 12000, 0);
        return r ? r : fn(operand(f[1]));
    }
    if (IS("gpa2.alloc_async_ptsz") || IS("gpa2.free_async_ptsz")) {
        int alloc = IS("gpa2.alloc_async_ptsz");
        ARGS(alloc ? 2 : 1);
        const char *base = alloc ? "cuMemAllocAsync" : "cuMemFreeAsync";
        const char *want = alloc ? "cuMemAllocAsync_ptsz" : "cuMemFreeAsync_ptsz";
        void *fn = NULL;
        int r = gpa2(base, &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        if (r) return r;
        /* Under the hook, dlsym hands out the same wrapper for the _ptsz function as cuGetProcAddress. */
        if (fn != driver_sym(want)) {
            fprintf(stderr, "%s: %s: cuGetProcAddress_v2(%s, flag 2) did not give %s\n", PROG, cur_word, base,
                    want);
            exit(1);
        }
        if (!alloc) return ((PFN_cuMemFreeAsync)fn)(operand(f[1]), NULL);
        CUdeviceptr p = 0;
        r = ((PFN_cuMemAllocAsync)fn)(&p, (size_t)num(f[2]), NULL);
        if (r == 0) set_var(f[1], p);
        return r;
    }
    if (IS("gpa2.create")) {
        ARGS(3);
        PFN_cuMemCreate fn = NULL;
        int r = gpa2("cuMemCreate", (void **)&fn, 12000, 0);
        if (r) return r;
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = (int)num(f[3]);
        CUmemGenericAllocationHandle h = 0;
        r = fn(&h, (size_t)num(f[2]), &prop, 0);
        if (r == 0) set_var(f[1], h);
        return r;
    }
    if (IS("gpa2.release")) {
        ARGS(1);
        PFN_cuMemRelease fn = NULL;
        int r = gpa2("cuMemRelease", (void **)&fn, 12000, 0);
        return r ? r : fn(operand(f[1]));
    }

    /* process-level operations */
    if (IS("threads")) {
        ARGS(4);
        return op_threads(num(f[1]), num(f[2]), num(f[3]), num(f[4]), 0);
    }
    if (IS("churn")) {
        ARGS(5);
        if (num(f[5]) == 0) usage_error("churn:N:ITERS:SEED:MAXBYTES:DEVICES");
        return op_threads(num(f[1]), num(f[2]), num(f[3]), num(f[4]), num(f[5]));
    }
    if (IS("race")) {
        ARGS(2);
        return op_race(num(f[1]), num(f[2]));
    }
    if (IS("brief")) {
        ARGS(2);
        return op_brief(num(f[1]), num(f[2]));
    }
    if (IS("handoff")) {
        ARGS(3);
        return op_handoff(num(f[1]), num(f[2]), num(f[3]));
    }
    if (IS("hold")) {
        ARGS(2);
        return op_hold(num(f[1]), num(f[2]));
    }
    if (IS("release.held")) {
        ARGS(1);
        return op_release_held(num(f[1]));
    }
    if (IS("release.held.failing")) {
        ARGS(2);
        return op_release_held_failing(num(f[1]), num(f[2]));
    }
    if (IS("forkstorm")) {
        ARGS(2);
        return op_forkstorm(num(f[1]), num(f[2]));
    }
    if (IS("exec.unhooked")) {
        /* exec.unhooked:PROGRAM[:ARG]: replaces this process with PROGRAM, without the hook. */
        if (nf < 2 || nf > 3) usage_error("exec.unhooked:PROGRAM[:ARG]");
        fflush(stdout);
        fflush(stderr);
        unsetenv("LD_PRELOAD");
        execl(f[1], f[1], nf == 3 ? f[2] : (char *)NULL, (char *)NULL);
        fprintf(stderr, "%s: exec %s: %s\n", PROG, f[1], strerror(errno));
        exit(1);
    }
    if (IS("chdir")) {
        ARGS(1);
        if (chdir(f[1]) != 0) {
            fprintf(stderr, "%s: chdir %s: %s\n", PROG, f[1], strerror(errno));
            exit(1);
        }
        return 0;
    }
    if (IS("print.partial")) {
        /* print.partial:TEXT: TEXT on stdout without a newline, so that it stays in stdio's buffer
         * until exit flushes it (stdout is line-buffered here) */
        ARGS(1);
        printf("%s", f[1]);
        return 0;
    }
    if (IS("print.var")) {
        ARGS(1);
        printf("%s=%#llx\n", f[1], operand(f[1]));
        return 0;
    }
    if (IS("scopes")) {
        /* scopes:N: marks N scopes "scope-0".. opened and closed on the hook's timeline, as an
         * in-process reader does (slot i % 256). */
        ARGS(1);
        void (*mark)(int, unsigned, const char *) =
            (void (*)(int, unsigned, const char *))dlsym(RTLD_DEFAULT, "gpumemhook_trace_scope");
        if (!mark) usage_error("no hook loaded");
        char name[32];
        for (ull i = 0; i < num(f[1]); i++) {
            snprintf(name, sizeof name, "scope-%llu", i);
            mark(1, (unsigned)(i % 256), name);
            mark(0, (unsigned)(i % 256), name);
        }
        return 0;
    }
    if (IS("print.queries")) {
        ARGS(0);
        ull (*q)(void) = (ull(*)(void))driver_sym("fakecuda_device_queries");
        printf("queries=%llu\n", q ? q() : 0);
        return 0;
    }
    if (IS("print.used")) {
        ARGS(1);
        int d = (int)num(f[1]);
#ifdef SIMRUN_RTONLY
        ull u = ((PFN_fakecuda_used)driver_sym("fakecuda_used"))(d);
#else
        ull u = fakecuda_used(d);
#endif
        printf("used dev=%d bytes=%llu\n", d, u);
        return 0;
    }
    if (IS("print.segment")) {
        ARGS(0);
        const char *(*seg)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "gpumemhook_segment_path");
        const char *path = seg ? seg() : NULL;
        printf("segment=%s\n", path ? path : "none");
        return 0;
    }
    if (IS("touch")) {
        ARGS(1);
        int fd = open(f[1], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "%s: touch %s: %s\n", PROG, f[1], strerror(errno));
            exit(1);
        }
        close(fd);
        return 0;
    }
    if (IS("wait")) {
        ARGS(1);
        for (int i = 0; access(f[1], F_OK) != 0; i++) {
            if (i >= 120000 / 5) {
                fprintf(stderr, "%s: wait %s: timed out after 120 s\n", PROG, f[1]);
                exit(1);
            }
            sleep_ms(5);
        }
        return 0;
    }
    if (IS("sleep")) {
        ARGS(1);
        sleep_ms(num(f[1]));
        return 0;
    }
    if (IS("closefds")) {
        /* A daemon's habit: every descriptor above the standard ones closed. */
        ARGS(0);
        return syscall(SYS_close_range, 3u, ~0u, 0u) == 0 ? 0 : 1;
    }
    if (IS("clone.raw")) {
        /* A child made by the raw system call, so no atfork handler runs (the hook's neither):
         * it sleeps MS and exits, outliving a parent that ends first. */
        ARGS(1);
        ull ms = num(f[1]);
        long child = syscall(SYS_clone, (unsigned long)SIGCHLD, 0UL, 0UL, 0UL, 0UL);
        if (child < 0) return 1;
        if (child == 0) {
            struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
            syscall(SYS_nanosleep, &ts, NULL);
            syscall(SYS_exit_group, 0);
        }
        return 0;
    }
    if (IS("setenv")) {
        ARGS(2);
        return setenv(f[1], f[2], 1) == 0 ? 0 : 1;
    }
    usage_error("unknown operation");
#undef ARGS
#undef IS
}

/* ---- the scenario ---------------------------------------------------------------------------------- */

/* Index of the endfork matching the fork at argv[i], or -1. */
static int matching_endfork(int argc, char **argv, int i) {
    int depth = 0;
    for (int j = i; j < argc; j++) {
        if (strcmp(argv[j], "fork") == 0 || strcmp(argv[j], "fork.sigkill") == 0) depth++;
        if (strcmp(argv[j], "endfork") == 0 && --depth == 0) return j;
    }
    return -1;
}

/* Runs argv[from, to); returns the exit status. */
static int run(int argc, char **argv, int from, int to) {
    for (int i = from; i < to; i++) {
        cur_word = argv[i];
        if (strcmp(argv[i], "endfork") == 0) usage_error("endfork without fork");
        int killable = strcmp(argv[i], "fork.sigkill") == 0;
        if (strcmp(argv[i], "fork") == 0 || killable) {
            int j = matching_endfork(argc, argv, i);
            if (j < 0 || j >= to) usage_error("fork without endfork");
            fflush(stdout); /* or the child would print the parent's buffered output again */
            fflush(stderr);
            pid_t pid = fork();
            if (pid < 0) {
                perror(PROG ": fork");
                return 2;
            }
            if (pid == 0) exit(run(argc, argv, i + 1, j) ? 1 : 0); /* exit(): atexit handlers run */
            int status;
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            if (killable && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
                printf("forked child killed\n");
            } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "%s: forked child failed (status 0x%x)\n", PROG, status);
                return 1;
            }
            i = j;
            continue;
        }

        /* split "name:a:b=N" */
        char *word = strdup(argv[i]);
        if (!word) abort();
        int expect = 0, has_expect = 0;
        char *eq = strrchr(word, '=');
        if (eq) {
            *eq = '\0';
            char *end;
            long e = strtol(eq + 1, &end, 10);
            if (!eq[1] || *end) usage_error("expected =N");
            expect = (int)e;
            has_expect = 1;
        }
        char *f[MAX_FIELDS + 1];
        int nf = 0;
        for (char *s = word, *tok; (tok = strsep(&s, ":")) != NULL;) {
            if (nf == MAX_FIELDS) usage_error("too many fields");
            f[nf++] = tok;
        }
        int dflt = 0;
        int got = run_op(f, nf, &dflt);
        if (!has_expect) expect = dflt;
        free(word);
        if (got != expect) {
            fprintf(stderr, "%s: %s returned %d, expected %d\n", PROG, argv[i], got, expect);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines appear in order with stderr and across fork */
    if (argc < 2) {
        fprintf(stderr, "usage: %s OP [OP ...]   (operations: tests/sim/README.md)\n", PROG);
        return 2;
    }
    return run(argc, argv, 1, argc);
}

/*
 * next_probe.c: libnextprobe.so, a second LD_PRELOADed library that chains with dlsym(RTLD_NEXT, ...),
 * as many real preloaded tools do. It exports cudaMalloc and cuMemAlloc_v2; each counts its calls and
 * forwards to the next definition of the same name.
 *
 * It exists to catch a hook whose dlsym is not transparent: glibc decides what RTLD_NEXT means from the
 * caller's return address, so if the hook's dlsym calls the real one (instead of tail-jumping to it), the
 * hook becomes "the caller" and this probe can be handed its own function back, which would recurse
 * forever. The probe detects that and aborts with a clear message instead (docs/architecture.md,
 * "A transparent dlsym").
 *
 * The exported names are aliases of static functions so that "its own function" is compared by the
 * probe's own address, not by whatever the GOT resolves the name to when the hook exports it too.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_sim.h"

#define EXPORT(name) \
    extern __typeof__(probe_##name) name __attribute__((alias("probe_" #name), visibility("default")));

static atomic_ullong calls;

static cudaError_t probe_cudaMalloc(void **devPtr, size_t size);
static CUresult probe_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);

static cudaError_t (*next_cudaMalloc)(void **, size_t);
static CUresult (*next_cuMemAlloc_v2)(CUdeviceptr *, size_t);
static pthread_once_t once_cudaMalloc = PTHREAD_ONCE_INIT, once_cuMemAlloc_v2 = PTHREAD_ONCE_INIT;

/* Called from this object, so RTLD_NEXT means "after libnextprobe.so" unless someone interposes dlsym
 * non-transparently. */
static void *next_of(const char *name, void *self) {
    void *f = dlsym(RTLD_NEXT, name);
    if (f == self) {
        fprintf(stderr, "nextprobe: RTLD_NEXT returned itself\n");
        abort();
    }
    if (!f) fprintf(stderr, "nextprobe: RTLD_NEXT found nothing\n");
    return f;
}

static void resolve_cudaMalloc(void) {
    next_cudaMalloc = (cudaError_t(*)(void **, size_t))next_of("cudaMalloc", (void *)probe_cudaMalloc);
}

static void resolve_cuMemAlloc_v2(void) {
    next_cuMemAlloc_v2 = (CUresult(*)(CUdeviceptr *, size_t))next_of("cuMemAlloc_v2", (void *)probe_cuMemAlloc_v2);
}

static cudaError_t probe_cudaMalloc(void **devPtr, size_t size) {
    atomic_fetch_add(&calls, 1);
    pthread_once(&once_cudaMalloc, resolve_cudaMalloc);
    return next_cudaMalloc ? next_cudaMalloc(devPtr, size) : 999;
}
EXPORT(cudaMalloc)

static CUresult probe_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    atomic_fetch_add(&calls, 1);
    pthread_once(&once_cuMemAlloc_v2, resolve_cuMemAlloc_v2);
    return next_cuMemAlloc_v2 ? next_cuMemAlloc_v2(dptr, bytesize) : 999;
}
EXPORT(cuMemAlloc_v2)

__attribute__((visibility("default"))) unsigned long long nextprobe_calls(void) { return atomic_load(&calls); }

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "nextprobe calls=%llu\n", (unsigned long long)atomic_load(&calls));
}

/* libfakecollective.so: a library that allocates device memory the way NCCL, cuBLAS and XLA do:
 * through driver functions obtained from cuGetProcAddress_v2 (found with dlsym in libcuda.so.1), and
 * through the runtime's cudaMalloc. The hook must charge its allocations to this library, not to the
 * program that called it nor to the runtime. See tests/sim/README.md. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_sim.h"

typedef CUresult (*PFN_gpa2)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_free)(CUdeviceptr);
typedef int (*PFN_cudaMalloc)(void **, size_t);

/* Like NCCL's and cuBLAS's, every call's result is checked after it returns (here, kept): the call is
 * never a tail call, so the library's own code is what the driver function returns to. (A library
 * that tail-calls into CUDA is charged to its caller's module: see docs/architecture.md.) */
static volatile int last_error;

static int checked(int r) {
    if (r != 0) last_error = r;
    return r;
}

static void *driver_fn(const char *name) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return NULL;
    PFN_gpa2 gpa = (PFN_gpa2)dlsym(h, "cuGetProcAddress_v2");
    void *fn = NULL;
    int status = 0;
    if (!gpa || gpa(name, &fn, 12000, 0, &status) != 0) return NULL;
    return fn;
}

/* cuMemAlloc through cuGetProcAddress_v2, as NCCL does. */
int fakecollective_alloc(CUdeviceptr *p, size_t bytes) {
    PFN_alloc fn = (PFN_alloc)driver_fn("cuMemAlloc");
    if (!fn) return 999;
    int r = fn(p, bytes);
    return checked(r);
}

int fakecollective_free(CUdeviceptr p) {
    PFN_free fn = (PFN_free)driver_fn("cuMemFree");
    if (!fn) return 999;
    int r = fn(p);
    return checked(r);
}

/* cudaMalloc of the runtime the program loaded, as cuBLAS does for its workspace. */
int fakecollective_rt_alloc(void **p, size_t bytes) {
    PFN_cudaMalloc fn = (PFN_cudaMalloc)dlsym(RTLD_DEFAULT, "cudaMalloc");
    if (!fn) return 999;
    int r = fn(p, bytes);
    return checked(r);
}

/* cudaMalloc on a thread of this library's own, named `name`, that runs no Python: as autograd's
 * backward thread and NCCL's threads allocate. Waits for it. */
struct on_thread {
    void *p;
    size_t bytes;
    const char *name;
    int result;
};

static void *allocate_on_thread(void *arg) {
    struct on_thread *job = arg;
    pthread_setname_np(pthread_self(), job->name);
    job->result = fakecollective_rt_alloc(&job->p, job->bytes);
    return NULL;
}

int fakecollective_alloc_on_thread(void **p, size_t bytes, const char *name) {
    struct on_thread job = {NULL, bytes, name, 999};
    pthread_t t;
    if (pthread_create(&t, NULL, allocate_on_thread, &job) != 0) return 998;
    pthread_join(t, NULL);
    *p = job.p;
    return job.result;
}

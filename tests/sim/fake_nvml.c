/*
 * fake_nvml.c: a stand-in for NVIDIA's management library (libnvidia-ml.so.1), built by
 * scripts/build/sim next to the stand-in driver. It serves the few NVML calls that fastai-style
 * memory helpers make (count devices, get a handle, read total/free/used), and reports what the
 * stand-in driver holds, the way real NVML reports what the real driver holds.
 *
 * Like real NVML (and unlike cuMemGetInfo), it is not affected by gpumemhook's ceiling: NVML talks to
 * the kernel driver, not through the CUDA driver API the hook wraps. That is why it reads the
 * capacity from the environment rather than calling cuDeviceTotalMem_v2 (which the preloaded hook
 * shadows), and the live bytes from fakecuda_used() (which the hook never wraps).
 *
 * Environment (read at every call, so a test may change it between calls):
 *   FAKECUDA_DEVICES, FAKECUDA_MEM_BYTES   as for the stand-in driver (same defaults: 2, 16 GiB);
 *   FAKENVML_OTHER_USED                   bytes that "other processes" hold on every device: added
 *                                         to used, taken from free (NVML's view is device-wide);
 *   FAKENVML_PROCESSES=PID:BYTES,...      more processes on every device, as NVML lists processes
 *                                         this one cannot know of (others, unhooked ones, or a
 *                                         pod's seen by their node pids): listed after the others,
 *                                         their bytes added to used (at most 16 of them);
 *   FAKENVML_UTILIZATION=PERCENT          nvmlDeviceGetUtilizationRates gives PERCENT for the GPU
 *                                         and its memory; unset, it is NVML_ERROR_NOT_SUPPORTED, as
 *                                         on devices that do not report it;
 *   FAKENVML_FAIL=1                       nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED;
 *   FAKENVML_REVERSED=1                   NVML's index i is CUDA device (count - 1 - i), as when
 *                                         CUDA orders devices differently (CUDA_VISIBLE_DEVICES,
 *                                         CUDA_DEVICE_ORDER): only UUIDs tell them apart.
 *
 * Per process (nvmlDeviceGetComputeRunningProcesses, all three versions): the calling process is
 * listed once it made a context on the device, using fakecuda_used() plus fakecuda_overhead() (its
 * context, FAKECUDA_CONTEXT_BYTES, and loaded modules, FAKECUDA_MODULE_BYTES each); with
 * FAKENVML_OTHER_USED set, a second process (pid 1) holding that much is listed after it. Device-wide
 * used includes the overhead too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_sim.h"

#define EXPORT __attribute__((visibility("default")))

/* Same defaults as fake_libcuda.c (DEFAULT_DEVICES, DEFAULT_CAPACITY). */
#define SIM_DEFAULT_DEVICES 2
#define SIM_DEFAULT_CAPACITY 17179869184ULL
#define SIM_MAX_DEVICES 64
/* FAKENVML_PROCESSES entries read at most. */
#define SIM_MAX_LISTED 16

typedef int nvmlReturn_t; /* a plain int on the wire, as CUresult */
typedef struct nvmlDevice_st *nvmlDevice_t;

/* Same layout as the real nvmlMemory_t (v1). */
typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* Same layout as the real nvmlMemory_v2_t. */
typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* Same layouts as the real nvmlProcessInfo_v1_t and nvmlProcessInfo_t (= _v2_t). */
typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_VALUE_NOT_AVAILABLE 0xffffffffffffffffULL

struct nvmlDevice_st {
    unsigned int index;
};

static struct nvmlDevice_st devices[SIM_MAX_DEVICES];
static int init_count; /* nvmlInit_v2 minus nvmlShutdown calls, as real NVML counts them */

static unsigned long long env_u64(const char *name, unsigned long long fallback) {
    const char *s = getenv(name);
    return s && *s ? strtoull(s, NULL, 10) : fallback;
}

static unsigned int device_count(void) {
    unsigned long long n = env_u64("FAKECUDA_DEVICES", SIM_DEFAULT_DEVICES);
    return n > SIM_MAX_DEVICES ? SIM_MAX_DEVICES : (unsigned int)n;
}

/* FAKENVML_PROCESSES as (pid, bytes) pairs, up to SIM_MAX_LISTED; returns how many. */
static unsigned int listed_processes(unsigned int *pids, unsigned long long *bytes) {
    const char *s = getenv("FAKENVML_PROCESSES");
    unsigned int n = 0;
    while (s && *s && n < SIM_MAX_LISTED) {
        char *end;
        unsigned long pid = strtoul(s, &end, 10);
        if (*end != ':') break;
        bytes[n] = strtoull(end + 1, &end, 10);
        pids[n++] = (unsigned int)pid;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* The sum of FAKENVML_PROCESSES's bytes. */
static unsigned long long listed_bytes(void) {
    unsigned int pids[SIM_MAX_LISTED];
    unsigned long long bytes[SIM_MAX_LISTED], sum = 0;
    unsigned int n = listed_processes(pids, bytes);
    for (unsigned int i = 0; i < n; i++) sum += bytes[i];
    return sum;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    const char *fail = getenv("FAKENVML_FAIL");
    if (fail && fail[0] == '1') return NVML_ERROR_DRIVER_NOT_LOADED;
    __atomic_add_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    int n = __atomic_load_n(&init_count, __ATOMIC_SEQ_CST);
    if (n <= 0) return NVML_ERROR_UNINITIALIZED;
    __atomic_sub_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

static int initialised(void) { return __atomic_load_n(&init_count, __ATOMIC_SEQ_CST) > 0; }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    devices[index].index = index;
    *device = &devices[index];
    return NVML_SUCCESS;
}

/* Turns a handle back into its ordinal; -1 for anything that is not one of ours. */
static int ordinal(nvmlDevice_t device) {
    if (device < &devices[0] || device >= &devices[SIM_MAX_DEVICES]) return -1;
    int d = (int)(device - &devices[0]);
    return (unsigned int)d < device_count() ? d : -1;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    int d = ordinal(device);
    if (d < 0 || !index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)d;
    return NVML_SUCCESS;
}

/* The CUDA ordinal of NVML index d. */
static int cuda_of(int d) {
    const char *r = getenv("FAKENVML_REVERSED");
    return r && r[0] == '1' ? (int)device_count() - 1 - d : d;
}

/* This process's bytes on NVML device d: its allocations plus its context and modules. */
static unsigned long long own_bytes(int d) {
    return fakecuda_used(cuda_of(d)) + fakecuda_overhead(cuda_of(d));
}

static void device_memory(int d, unsigned long long *total, unsigned long long *free,
                          unsigned long long *used) {
    *total = env_u64("FAKECUDA_MEM_BYTES", SIM_DEFAULT_CAPACITY);
    *used = own_bytes(d) + env_u64("FAKENVML_OTHER_USED", 0) + listed_bytes();
    if (*used > *total) *used = *total;
    *free = *total - *used;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    int d = ordinal(device);
    if (d < 0 || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    device_memory(d, &memory->total, &memory->free, &memory->used);
    return NVML_SUCCESS;
}

/* v2 reports FAKENVML_RESERVED bytes (default 0) as reserved, out of free, as real NVML separates
 * what the driver sets aside. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    int d = ordinal(device);
    if (d < 0 || !memory || memory->version == 0) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long reserved = env_u64("FAKENVML_RESERVED", 0);
    device_memory(d, &memory->total, &memory->free, &memory->used);
    if (reserved > memory->free) reserved = memory->free;
    memory->reserved = reserved;
    memory->free -= reserved;
    return NVML_SUCCESS;
}

/* Fills up to *count entries of the listed processes (ours once it has a context, then pid 1 when
 * FAKENVML_OTHER_USED is set, then FAKENVML_PROCESSES), through `put`; NVML_ERROR_INSUFFICIENT_SIZE with the needed count
 * when they do not fit, as real NVML does. */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *count, void *infos,
                                   void (*put)(void *, unsigned int, unsigned int, unsigned long long)) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    int d = ordinal(device);
    if (d < 0 || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int pids[2 + SIM_MAX_LISTED];
    unsigned long long bytes[2 + SIM_MAX_LISTED];
    unsigned int n = 0;
    if (fakecuda_has_context(cuda_of(d))) {
        pids[n] = (unsigned int)getpid();
        bytes[n++] = own_bytes(d);
    }
    unsigned long long other = env_u64("FAKENVML_OTHER_USED", 0);
    if (other) {
        pids[n] = 1;
        bytes[n++] = other;
    }
    n += listed_processes(pids + n, bytes + n);
    if (*count < n || (n && !infos)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) put(infos, i, pids[i], bytes[i]);
    *count = n;
    return NVML_SUCCESS;
}

static void put_v1(void *infos, unsigned int i, unsigned int pid, unsigned long long bytes) {
    nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
    p->pid = pid;
    p->usedGpuMemory = bytes;
}

static void put_v2(void *infos, unsigned int i, unsigned int pid, unsigned long long bytes) {
    nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
    p->pid = pid;
    p->usedGpuMemory = bytes;
    p->gpuInstanceId = 0xffffffffu;
    p->computeInstanceId = 0xffffffffu;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, count, infos, put_v1);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, put_v2);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, put_v2);
}

/* Same layout as the real nvmlUtilization_t. */
typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    int d = ordinal(device);
    if (d < 0 || !rates) return NVML_ERROR_INVALID_ARGUMENT;
    const char *percent = getenv("FAKENVML_UTILIZATION");
    if (!percent || !*percent) return NVML_ERROR_NOT_SUPPORTED;
    rates->gpu = rates->memory = (unsigned int)strtoul(percent, NULL, 10);
    return NVML_SUCCESS;
}

/* The UUID of NVML device d, written from the CUDA device's bytes (fa ce 00 .. 00 ordinal), as the
 * stand-in driver's cuDeviceGetUuid gives them. */
static void uuid_of(int d, char *out, size_t len) {
    snprintf(out, len, "GPU-face0000-0000-0000-0000-0000000000%02x", (unsigned int)cuda_of(d) & 0xff);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    int d = ordinal(device);
    if (d < 0 || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < 41) return NVML_ERROR_INSUFFICIENT_SIZE;
    uuid_of(d, uuid, length);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < device_count(); i++) {
        char text[64];
        uuid_of((int)i, text, sizeof text);
        if (strcmp(text, uuid) == 0) {
            devices[i].index = i;
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

/*
 * fake_nvml.c: a stand-in for NVIDIA's management library (libnvidia-ml.so.1), built by
 * scripts/build-sim next to the stand-in driver. It serves the few NVML calls that fastai-style
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
 *   FAKENVML_FAIL=1                       nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED.
 */
#include <stdlib.h>

#include "cuda_sim.h"

#define EXPORT __attribute__((visibility("default")))

/* Same defaults as fake_libcuda.c (DEFAULT_DEVICES, DEFAULT_CAPACITY). */
#define SIM_DEFAULT_DEVICES 2
#define SIM_DEFAULT_CAPACITY 17179869184ULL
#define SIM_MAX_DEVICES 64

typedef int nvmlReturn_t; /* a plain int on the wire, as CUresult */
typedef struct nvmlDevice_st *nvmlDevice_t;

/* Same layout as the real nvmlMemory_t (v1). */
typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_DRIVER_NOT_LOADED 9

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

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    int d = ordinal(device);
    if (d < 0 || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total = env_u64("FAKECUDA_MEM_BYTES", SIM_DEFAULT_CAPACITY);
    unsigned long long used = fakecuda_used(d) + env_u64("FAKENVML_OTHER_USED", 0);
    if (used > total) used = total;
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

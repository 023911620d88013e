#!/usr/bin/env python3
"""The demo workload on the simulated CUDA stack (no GPU): the fastai-style API, an exact scope and an
out-of-memory error reproduced with a ceiling, all through real cudaMalloc/cudaFree calls into the
stand-in runtime of tests/sim (run under the hook, with LD_LIBRARY_PATH pointing at the built stack).
"""

import ctypes

import gpumemhook
from gpumemhook.mem import GPUMemTrace, gpu_mem_leave_free_mbs
from gpumemhook.zeta import print_cuda_memory_usage

MB = 1 << 20
runtime = ctypes.CDLL("libcudart.so.13")


def malloc(nbytes):
    p = ctypes.c_void_p()
    rc = runtime.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes))
    return p if rc == 0 else rc


def free(p):
    runtime.cudaFree(p)


print("1. fastai's GPUMemTrace, exact: keep 150 MB, with a 300 MB blip freed inside")
with GPUMemTrace(ctx="forward"):
    kept = [malloc(100 * MB), malloc(50 * MB)]
    blip = malloc(300 * MB)
    free(blip)

print("\n2. a scope: three 1-microsecond spikes of 64 MiB, each one caught")
with gpumemhook.scope("spikes") as s:
    for _ in range(3):
        free(malloc(64 * MB))
print(f"   {s!r}")

print("\n3. zeta's print_cuda_memory_usage, exact")
with print_cuda_memory_usage():
    kept.append(malloc(512 * MB))

print("\n4. an out-of-memory error reproduced: leave 200 MB free, then ask for 150 MB twice")
hold = gpu_mem_leave_free_mbs(200)
first, second = malloc(150 * MB), malloc(150 * MB)
print(f"   first 150 MB: {'ok' if isinstance(first, ctypes.c_void_p) else first}; "
      f"second: error {second} (cudaErrorMemoryAllocation)" if isinstance(second, int) else "   second: ok (unexpected)")
del hold  # lifts the ceiling

print("\n5. the exact figures of this process:", gpumemhook.stats(0))

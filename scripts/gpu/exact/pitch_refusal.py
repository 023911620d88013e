#!/usr/bin/env python3
"""Checks on a real GPU that a pitched allocation on an emulated card is judged like a plain one
(issue 33, item 2): under GPUMEMHOOK_EMULATE (T4 by default), for each door (cuMemAlloc_v2,
cuMemAllocPitch_v2, and cudaMallocPitch when a CUDA runtime is found), a fresh process asks the
ceiling's view for its free memory F (cuMemGetInfo_v2), then allocates F - 64 MiB (must be
admitted) and, after freeing it, F + 1 MiB (must be refused with out-of-memory, 2, and counted in
`denied`). Pitched allocations use width 513 bytes (padded by the driver), so the padding, known
only after the call, decides near the boundary. Prints a table last (and writes
$OUT/gpu_pitch_refusal.json when OUT is set).

    GPUMEMHOOK_LIB=dist/libgpumemhook.so PYTHONPATH=<gpumemhook package> \\
        python3 scripts/gpu/exact/pitch_refusal.py [CARD]
"""

import json
import os
import subprocess
import sys

CHILD = r"""
import ctypes, ctypes.util, json, sys
import gpumemhook
door = sys.argv[1]
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
ctx = ctypes.c_void_p()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
rt = None
for name in ("libcudart.so", "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0"):
    try:
        rt = ctypes.CDLL(name)
        break
    except OSError:
        pass
WIDTH = 513

def alloc(nbytes):
    # -> (rc, free function)
    if door == "cuMemAlloc_v2":
        p = ctypes.c_uint64()
        rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes))
        return rc, lambda: cu.cuMemFree_v2(p)
    pitch = ctypes.c_size_t()
    rows = max(1, nbytes // 1024)  # the pitch of 513 bytes is at least 1024 on current GPUs
    if door == "cuMemAllocPitch_v2":
        p = ctypes.c_uint64()
        rc = cu.cuMemAllocPitch_v2(ctypes.byref(p), ctypes.byref(pitch), ctypes.c_size_t(WIDTH),
                                   ctypes.c_size_t(rows), ctypes.c_uint(4))
        return rc, lambda: cu.cuMemFree_v2(p)
    p = ctypes.c_void_p()
    rc = rt.cudaMallocPitch(ctypes.byref(p), ctypes.byref(pitch), ctypes.c_size_t(WIDTH),
                            ctypes.c_size_t(rows))
    return rc, lambda: rt.cudaFree(p)

if door == "cudaMallocPitch" and rt is None:
    print("RESULT " + json.dumps({"door": door, "skipped": "no CUDA runtime"}))
    sys.exit(0)
if door == "cudaMallocPitch":
    rt.cudaSetDevice(0)
def denied_now():
    # A device appears in the snapshot once it is used or has a ceiling.
    devices = gpumemhook.snapshot()["devices"]
    return devices[0]["denied"] if devices else 0

denied0 = denied_now()
rc_fit, free_it = alloc(free.value - (64 << 20))
if rc_fit == 0:
    free_it()
rc_past, free_it = alloc(free.value + (1 << 20))
if rc_past == 0:
    free_it()
denied = denied_now() - denied0
print("RESULT " + json.dumps({"door": door, "free": free.value, "total": total.value,
                             "fit_rc": rc_fit, "past_rc": rc_past, "denied": denied}))
"""


def main():
    card = sys.argv[1] if len(sys.argv) > 1 else "t4"
    lib = os.environ.get("GPUMEMHOOK_LIB", "dist/libgpumemhook.so")
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(lib), GPUMEMHOOK_EMULATE=card)
    results = []
    for door in ("cuMemAlloc_v2", "cuMemAllocPitch_v2", "cudaMallocPitch"):
        out = subprocess.run([sys.executable, "-c", CHILD, door], env=env, capture_output=True,
                             text=True, timeout=300)
        line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        r = json.loads(line[-1][7:]) if line else {"door": door, "error": out.stderr[-400:]}
        if "fit_rc" in r:
            r["ok"] = r["fit_rc"] == 0 and r["past_rc"] == 2 and r["denied"] == 1
        results.append(r)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_pitch_refusal.json"), "w") as f:
            json.dump(results, f, indent=1)
    print(f"\nemulated card {card}: F - 64 MiB admitted, F + 1 MiB refused, by every door")
    print(f"{'door':<20} {'free F (MiB)':>12} {'fit rc':>6} {'past rc':>7} {'denied':>6}  ok")
    for r in results:
        if "fit_rc" not in r:
            print(f"{r['door']:<20} {r.get('skipped') or r.get('error')}")
            continue
        print(f"{r['door']:<20} {r['free'] >> 20:>12} {r['fit_rc']:>6} {r['past_rc']:>7} "
              f"{r['denied']:>6}  {'yes' if r['ok'] else 'NO'}")
    return 0 if all(r.get("ok", "skipped" in r) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Per-device exactness on a machine with two or more GPUs: PyTorch allocates on cuda:0 and cuda:1
(switching devices between allocations, in each allocator mode); the hook's used/peak of each device
is printed beside PyTorch's own counters of that device.

    GPUMEMHOOK_LIB=... PYTHONPATH=<dir with the gpumemhook package> python3 scripts/gpu/exact/multi.py
"""

import json
import os
import subprocess
import sys

WORKLOAD = r"""
import json, sys, torch, gpumemhook
mode = sys.argv[1]
held = []
for i, mib in enumerate([64, 300, 17, 512, 128, 3]):
    d = i % 2
    with torch.cuda.device(d):
        held.append(torch.empty(mib * 2**20, dtype=torch.uint8, device=f"cuda:{d}"))
spike = torch.empty(1024 * 2**20, dtype=torch.uint8, device="cuda:1"); del spike
for d in (0, 1):
    torch.cuda.synchronize(d)
rows = []
for d in (0, 1):
    s = gpumemhook.stats(d)
    rows.append(dict(device=d, hook_used=s.used, hook_peak=s.peak,
                     reserved=torch.cuda.memory_reserved(d), max_reserved=torch.cuda.max_memory_reserved(d),
                     allocated=torch.cuda.memory_allocated(d), max_allocated=torch.cuda.max_memory_allocated(d)))
print("RESULT " + json.dumps(rows))
"""

MODES = {
    "default": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
}


def main():
    lib = os.environ.get("GPUMEMHOOK_LIB") or (sys.argv[1] if len(sys.argv) > 1 else None)
    if not lib:
        sys.exit("set GPUMEMHOOK_LIB")
    print(f"{'mode':<17}{'dev':>4}{'hook used':>12}{'torch':>12}{'diff':>9}{'hook peak':>12}{'torch peak':>12}{'diff':>9}  (MiB)")
    for mode, extra in MODES.items():
        env = dict(os.environ, LD_PRELOAD=lib, **extra)
        p = subprocess.run([sys.executable, "-c", WORKLOAD, mode], env=env, capture_output=True, text=True)
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not lines:
            print(f"{mode}: failed ({p.returncode})\n{p.stderr[-2000:]}")
            continue
        for r in json.loads(lines[-1][7:]):
            key, peak = ("allocated", "max_allocated") if mode == "cudaMallocAsync" else ("reserved", "max_reserved")
            m = lambda b: b / 2**20
            print(f"{mode:<17}{r['device']:>4}{m(r['hook_used']):>12.3f}{m(r[key]):>12.3f}{m(r['hook_used'] - r[key]):>9.3f}"
                  f"{m(r['hook_peak']):>12.3f}{m(r[peak]):>12.3f}{m(r['hook_peak'] - r[peak]):>9.3f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks gpumemhook on a real GPU against the frameworks' own counters (issue 2) and reproduces
PyTorch out-of-memory errors under a ceiling (issue 4).

Each workload runs in its own process under LD_PRELOAD of the hook (allocator settings must be in
place before CUDA starts), reads the hook's exact figures in-process through the Python package, and
prints one `RESULT {json}` line. The parent prints a table last and writes everything to
$OUT/gpu_check.json when OUT is set.

    GPUMEMHOOK_LIB=dist/libgpumemhook.so PYTHONPATH=/tmp/site python3 scripts/gpu/exact/frameworks.py
"""

import json
import os
import subprocess
import sys
import textwrap

MIB = 1 << 20
GIB = 1 << 30

# The hook's figures for device 0, read in-process: shared by every workload below.
PRELUDE = textwrap.dedent(
    """
    import json, os, sys
    import gpumemhook

    def hook(device=0):
        s = gpumemhook.stats(device)
        get = (lambda k: s[k]) if isinstance(s, dict) else (lambda k: getattr(s, k))
        return get("used"), get("peak")

    def result(**fields):
        print("RESULT " + json.dumps(fields), flush=True)
    """
)

TORCH_WORKLOAD = PRELUDE + textwrap.dedent(
    """
    import torch
    mode = sys.argv[1]
    x = torch.randn(4096, 4096, device="cuda")          # 64 MiB
    y = x @ x                                             # cuBLAS and its workspace
    held = [torch.empty(m * 2**20, dtype=torch.uint8, device="cuda") for m in (1, 3, 17, 100, 513)]
    del held[2]
    spike = torch.empty(2**30, dtype=torch.uint8, device="cuda")  # a 1 GiB spike, freed at once
    del spike
    torch.cuda.synchronize()
    used, peak = hook()
    trace = None
    if mode == "no-caching":
        # fastai's API, exact: a trace around a temporary 1 GiB tensor reports its peak to the MB.
        from gpumemhook.mem import GPUMemTrace
        with GPUMemTrace(on_exit_report=False) as t:
            tmp = torch.empty(2**30, dtype=torch.uint8, device="cuda")
            del tmp
        trace = list(t.data())
    result(
        workload="torch " + mode,
        hook_used=used,
        hook_peak=peak,
        reserved=torch.cuda.memory_reserved(),
        max_reserved=torch.cuda.max_memory_reserved(),
        allocated=torch.cuda.memory_allocated(),
        max_allocated=torch.cuda.max_memory_allocated(),
        trace_1gib=trace,
    )
    """
)

CUPY_WORKLOAD = PRELUDE + textwrap.dedent(
    """
    import cupy as cp
    pool = cp.get_default_memory_pool()
    a = cp.ones((64, 2**20), dtype=cp.uint8)
    b = cp.ones((300, 2**20), dtype=cp.uint8)
    c = a.sum()
    del b
    cp.cuda.Device(0).synchronize()
    used, peak = hook()
    result(workload="cupy", hook_used=used, hook_peak=peak, pool_total=pool.total_bytes(), pool_used=pool.used_bytes())
    """
)

JAX_WORKLOAD = PRELUDE + textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    x = jnp.ones((8192, 8192), dtype=jnp.float32)  # 256 MiB
    y = (x @ x).block_until_ready()
    del x
    stats = jax.devices()[0].memory_stats()
    used, peak = hook()
    result(workload="jax", hook_used=used, hook_peak=peak, pool_bytes=stats.get("pool_bytes"),
           peak_pool_bytes=stats.get("peak_pool_bytes"), bytes_in_use=stats.get("bytes_in_use"))
    """
)

OOM_WORKLOAD = PRELUDE + textwrap.dedent(
    """
    import torch
    chunk = 256 * 2**20
    # Kept alive: a freed block would sit in PyTorch's cache, which it empties and retries on
    # out-of-memory, and the prediction below must count what stays held.
    keep = torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    base, _ = hook()
    if sys.argv[1].startswith("leave-free"):
        # ipyexperiments' gpu_mem_leave_free_mbs: under the hook a ceiling, not an allocation.
        from gpumemhook.mem import gpu_mem_leave_free_mbs
        hold = gpu_mem_leave_free_mbs(600)
        limit = base + 600 * 2**20
    else:
        limit = gpumemhook.parse_size(os.environ["GPUMEMHOOK_LIMIT"])
    expected = (limit - base) // chunk      # computed before the first chunk is asked for
    held, message, kind = [], "", None
    try:
        while len(held) < 64:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except Exception as e:                  # the type is part of the result
        kind, message = type(e).__name__, str(e)
    used, peak = hook()
    free, total = torch.cuda.mem_get_info()
    result(workload="oom " + sys.argv[1], base=base, expected=expected, got=len(held), error=kind,
           message=message.splitlines()[0] if message else "", hook_used=used, hook_peak=peak,
           mem_get_info=[free, total], limit=limit,
           internal_assert="INTERNAL ASSERT" in message)
    """
)

TORCH_MODES = {
    "default": {},
    "no-caching": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
}


def run(code, args, extra_env, hooked=True, timeout=240):
    env = dict(os.environ)
    env.update(extra_env)
    if hooked:
        env["LD_PRELOAD"] = os.environ["GPUMEMHOOK_LIB"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"workload": " ".join(args), "error_exit": proc.returncode, "stderr": proc.stderr[-3000:]}
    return json.loads(lines[-1][len("RESULT "):])


def mib(b):
    return "-" if b is None else f"{b / MIB:.3f}"


def main():
    if "GPUMEMHOOK_LIB" not in os.environ and len(sys.argv) > 1:
        os.environ["GPUMEMHOOK_LIB"] = os.path.abspath(sys.argv[1])
    lib = os.environ.get("GPUMEMHOOK_LIB")
    if not lib or not os.path.exists(lib):
        sys.exit("set GPUMEMHOOK_LIB to libgpumemhook.so (or pass it as the first argument)")
    results = []
    for mode, env in TORCH_MODES.items():
        results.append(run(TORCH_WORKLOAD, [mode], env))
    results.append(run(CUPY_WORKLOAD, ["cupy"], {}))
    results.append(run(JAX_WORKLOAD, ["jax"], {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}))
    for mode, env in TORCH_MODES.items():
        if mode == "no-caching":
            continue
        results.append(run(OOM_WORKLOAD, [mode], dict(env, GPUMEMHOOK_LIMIT="{}B".format(2 * GIB))))
    results.append(run(OOM_WORKLOAD, ["leave-free 600 MB"], {}))

    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_check.json"), "w") as f:
            json.dump(results, f, indent=1)
    for r in results:
        if "error_exit" in r:
            print(f"FAILED {r['workload']} (exit {r['error_exit']}):\n{r['stderr']}\n")

    print("\nExactness (MiB; hook = gpumemhook's used/peak of device 0, read in-process)")
    print(f"{'workload':<22}{'hook used':>12}{'framework':>12}{'diff':>10}{'hook peak':>12}{'fw peak':>12}{'diff':>10}  counters")
    for r in results:
        w = r.get("workload", "?")
        if "error_exit" in r or w.startswith("oom"):
            continue
        if w.startswith("torch"):
            pair = ("reserved", "max_reserved")
            if w.endswith("cudaMallocAsync"):
                pair = ("allocated", "max_allocated")
        elif w == "cupy":
            pair = ("pool_total", None)
        else:
            pair = ("pool_bytes", "peak_pool_bytes")
        fw, fwp = r.get(pair[0]), r.get(pair[1]) if pair[1] else None
        d = None if fw is None else r["hook_used"] - fw
        dp = None if fwp is None else r["hook_peak"] - fwp
        print(f"{w:<22}{mib(r['hook_used']):>12}{mib(fw):>12}{mib(d):>10}{mib(r['hook_peak']):>12}{mib(fwp):>12}{mib(dp):>10}  {pair[0]}/{pair[1]}")
        if r.get("trace_1gib") is not None:
            print(f"{'':<22}GPUMemTrace around a temporary 1 GiB tensor: data() = {tuple(r['trace_1gib'])}")

    print("\nOut of memory under GPUMEMHOOK_LIMIT=2GiB (last row: gpu_mem_leave_free_mbs(600)), 256 MiB tensors")
    print(f"{'mode':<26}{'base MiB':>9}{'expected':>9}{'got':>5}  {'error':<22}{'assert':>7}  mem_get_info (free/total MiB)")
    for r in results:
        w = r.get("workload", "?")
        if not w.startswith("oom") or "error_exit" in r:
            continue
        free, total = r["mem_get_info"]
        print(f"{w:<26}{mib(r['base']):>9}{r['expected']:>9}{r['got']:>5}  {str(r['error']):<22}{str(r['internal_assert']):>7}  {mib(free)}/{mib(total)}")
        print(f"{'':<4}{r['message'][:150]}")


if __name__ == "__main__":
    main()

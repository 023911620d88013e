#!/usr/bin/env python3
"""gpu/attribution/modules.py: the GPU machine's checks of who holds the memory (issue 11), in one run.

Each check runs in a child process under the hook (LD_PRELOAD=$GPUMEMHOOK_LIB) and prints one JSON
line; this script prints a short table last.

  1. PyTorch, default caching allocator, a few training steps of a small MLP (cuBLAS) and a conv
     (cuDNN): the module holding the caching allocator's bytes (libc10_cuda.so) against
     torch.cuda.memory_reserved(), and the rest by name;
  2. a single-rank NCCL process group (world size 1, backend nccl) and an all_reduce: NCCL's own
     memory under its library;
  3. JAX: a matmul; XLA's memory under its module;
  4. an out-of-memory under GPUMEMHOOK_LIMIT in PyTorch: the forensic report
     (GPUMEMHOOK_OOM_REPORT) names the refused request and the modules holding memory;
  5. GPUMEMHOOK_STACKS=python:1MiB with PyTorch: how many live allocations carry a Python site.

Usage: GPUMEMHOOK_LIB=/path/libgpumemhook.so PYTHONPATH=<site with gpumemhook> python3 scripts/gpu/attribution/modules.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

LIB = os.environ["GPUMEMHOOK_LIB"]
MIB = 1 << 20

TORCH = r"""
import json, torch, gpumemhook
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048)).cuda()
conv = torch.nn.Conv2d(64, 128, 3, padding=1).cuda()
opt = torch.optim.AdamW(list(model.parameters()) + list(conv.parameters()), lr=1e-3)
for step in range(5):
    x = torch.randn(512, 2048, device="cuda")
    img = torch.randn(32, 64, 64, 64, device="cuda")
    loss = model(x).square().mean() + conv(img).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
rows = gpumemhook.breakdown(0)
print(json.dumps({"rows": rows, "reserved": torch.cuda.memory_reserved(0),
                  "used": gpumemhook.used(0)}))
"""

NCCL = r"""
import json, os, torch, torch.distributed as dist, gpumemhook
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
t = torch.ones(64 * 1024 * 1024 // 4, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
rows = gpumemhook.breakdown(0)
print(json.dumps({"rows": rows, "reserved": torch.cuda.memory_reserved(0),
                  "used": gpumemhook.used(0), "sum": float(t[0].item())}))
dist.destroy_process_group()
"""

JAX = r"""
import json, os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp, gpumemhook
x = jnp.ones((4096, 4096), dtype=jnp.float32)
y = (x @ x).block_until_ready()
rows = gpumemhook.breakdown(0)
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"rows": rows, "used": gpumemhook.used(0), "backend": jax.default_backend(),
                  "jax_in_use": stats.get("bytes_in_use"), "jax_reserved": stats.get("bytes_reserved")}))
"""

OOM = r"""
import json, torch, gpumemhook
keep = []
asked = None
try:
    for i in range(64):
        asked = 256 * 1024 * 1024
        keep.append(torch.empty(asked, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    print(json.dumps({"oom": True, "held": len(keep), "reserved": torch.cuda.memory_reserved(0),
                      "message": str(e).splitlines()[0][:200]}))
"""

STACKS = r"""
import json, torch, gpumemhook
def build():
    return [torch.empty(8 * 1024 * 1024, dtype=torch.uint8, device="cuda") for _ in range(4)]
kept = build()
import cupy
c = cupy.empty(16 * 1024 * 1024, dtype=cupy.uint8)
print(json.dumps({"ok": True}))
"""


def run(code: str, extra_env: dict, timeout: int = 240) -> tuple[dict, str]:
    env = dict(os.environ, LD_PRELOAD=LIB, **extra_env)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(code))
    done = subprocess.run([sys.executable, f.name], env=env, capture_output=True, text=True,
                          timeout=timeout)
    line = next((l for l in reversed(done.stdout.splitlines()) if l.startswith("{")), None)
    if done.returncode != 0 or line is None:
        return {"error": (done.stderr or done.stdout)[-1500:]}, done.stderr
    return json.loads(line), done.stderr


def show_rows(rows) -> None:
    for module, used, peak, allocs in rows:
        print(f"    {module:40s} used {used / MIB:10.2f} MiB  peak {peak / MIB:10.2f} MiB  allocs {allocs}")


def main() -> int:
    table = []
    work = tempfile.mkdtemp(prefix="gpu_attr_")

    print("== 1. PyTorch (default caching allocator): training steps")
    r, _ = run(TORCH, {})
    if "error" in r:
        print(r["error"])
        table.append(("torch: libc10_cuda.so == memory_reserved()", "ERROR"))
    else:
        show_rows(r["rows"])
        c10 = next((row for row in r["rows"] if row[0].startswith("libc10_cuda")), None)
        rest = [row for row in r["rows"] if row is not c10]
        ok = c10 is not None and c10[1] == r["reserved"]
        print(f"    memory_reserved() = {r['reserved']}, libc10_cuda used = {c10[1] if c10 else None}, "
              f"hook used = {r['used']}, sum of modules = {sum(row[1] for row in r['rows'])}")
        table.append(("torch: libc10_cuda.so == memory_reserved()",
                      f"{'EXACT' if ok else 'DIFFERS'} ({r['reserved']} B)"))
        table.append(("torch: the rest, by module",
                      ", ".join(f"{m} {u / MIB:.2f} MiB" for m, u, _, _ in rest if u) or "none"))
        table.append(("torch: modules add up to used",
                      "yes" if sum(row[1] for row in r["rows"]) == r["used"] else "NO"))

    print("== 2. NCCL, one rank")
    r, _ = run(NCCL, {"NCCL_DEBUG": "WARN"})
    if "error" in r:
        print(r["error"])
        table.append(("nccl: its own memory under its library", "ERROR"))
    else:
        show_rows(r["rows"])
        nccl = [row for row in r["rows"] if "nccl" in row[0].lower()]
        table.append(("nccl: its own memory under its library",
                      ", ".join(f"{m} used {u / MIB:.2f} MiB peak {p / MIB:.2f} MiB" for m, u, p, _ in nccl)
                      or "NOT FOUND"))

    print("== 3. JAX")
    r, _ = run(JAX, {})
    if "error" in r:
        print(r["error"])
        table.append(("jax: XLA's memory by module", "ERROR"))
    else:
        show_rows(r["rows"])
        print(f"    jax bytes_in_use {r['jax_in_use']}, bytes_reserved {r['jax_reserved']}, hook used {r['used']}")
        table.append(("jax: XLA's memory by module",
                      ", ".join(f"{m} {u / MIB:.2f} MiB" for m, u, _, _ in r["rows"] if u) or "none"))

    print("== 4. out of memory under GPUMEMHOOK_LIMIT=2GiB")
    report = os.path.join(work, "oom.%p.json")
    r, _ = run(OOM, {"GPUMEMHOOK_LIMIT": "2GiB", "GPUMEMHOOK_OOM_REPORT": report,
                     "GPUMEMHOOK_TRACE": os.path.join(work, "oom.trace")})
    files = [f for f in os.listdir(work) if f.startswith("oom.") and f.endswith(".json") and "trace" not in f]
    if "error" in r or len(files) != 1:
        print(r.get("error"), files)
        table.append(("oom: forensic report", "ERROR"))
    else:
        rep = json.load(open(os.path.join(work, files[0])))
        oom = rep["oom"]
        print("    " + json.dumps(oom))
        for d in rep["devices"]:
            for m in d.get("by_module", []):
                print(f"    device {d['device']}: {m['module']:30s} used {m['used'] / MIB:.2f} MiB")
        live = rep.get("live", [])
        print(f"    live allocations listed: {len(live)}; first: {live[0] if live else None}")
        print(f"    timeline tail: {len(rep.get('timeline') or [])} events, last {(rep.get('timeline') or [None])[-1]}")
        print(f"    torch said: {r.get('message')}")
        table.append(("oom: forensic report",
                      f"{oom['bytes'] / MIB:.0f} MiB asked by {oom['module']} via {oom['entry']}, "
                      f"{oom['reason']}, {oom['used'] / MIB:.0f} MiB in use of {oom['limit'] / MIB:.0f} MiB; "
                      f"{len(live)} live listed"))

    print("== 5. Python sites (GPUMEMHOOK_STACKS=python:1MiB), PyTorch and CuPy")
    rep_path = os.path.join(work, "stacks.json")
    r, _ = run(STACKS, {"GPUMEMHOOK_STACKS": "python:1MiB", "GPUMEMHOOK_REPORT": rep_path})
    if "error" in r or not os.path.exists(rep_path):
        print(r.get("error"))
        table.append(("stacks: live allocations with a site", "ERROR"))
    else:
        live = json.load(open(rep_path)).get("live", [])
        with_site = [a for a in live if a.get("site")]
        for a in live[:8]:
            print(f"    {a['bytes'] / MIB:8.2f} MiB {a['module']:25s} {a.get('site')}")
        table.append(("stacks: live allocations with a site",
                      f"{len(with_site)} of {len(live)} ({', '.join(sorted({a['module'] for a in with_site})) or '-'})"))

    print()
    print("== summary")
    for name, value in table:
        print(f"  {name:45s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

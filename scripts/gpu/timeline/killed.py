#!/usr/bin/env python3
"""Checks the flight recorder on a real GPU (issue 43): a PyTorch training loop under plain
`LD_PRELOAD` with `GPUMEMHOOK_TRACE`, killed mid-run by SIGKILL (the OOM killer's signal) and, in a
second run, by SIGTERM (Slurm's time limit). Right before the kill, `gpumemhook ls --json` gives the
process's peak and allocation count; after it, `gpumemhook export --chrome` of the timeline it left
must replay to that peak, to the byte, and hold every allocation, and `gpumemhook report` must say
the timeline was cut short.

    GPUMEMHOOK_LIB=.../libgpumemhook.so GPUMEMHOOK_CLI=.../gpumemhook python3 scripts/gpu/timeline/killed.py

Prints a short table last; exit 0 when every check holds.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

LOOP = textwrap.dedent(
    """
    import os, sys, time
    import torch

    ready = sys.argv[1]
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
    opt = torch.optim.Adam(model.parameters())
    for step in range(10**6):
        x = torch.randn(512 + 64 * (step % 7), 4096, device="cuda")
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step == 20:
            open(ready, "w").close()
    """
)

cli = os.environ["GPUMEMHOOK_CLI"]
lib = os.environ["GPUMEMHOOK_LIB"]
work = tempfile.mkdtemp(prefix="killed-timeline-")
program = os.path.join(work, "loop.py")
with open(program, "w") as f:
    f.write(LOOP)


def live(pid):
    out = subprocess.run([cli, "ls", "--json"], capture_output=True, text=True, check=True).stdout
    return next(p for p in json.loads(out) if p["pid"] == pid)


rows, failed = [], False
for sig in (signal.SIGKILL, signal.SIGTERM):
    trace = os.path.join(work, "t.%s" % sig.name)
    ready = os.path.join(work, "ready.%s" % sig.name)
    env = dict(os.environ, LD_PRELOAD=lib, GPUMEMHOOK_TRACE=trace,
               PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    p = subprocess.Popen([sys.executable, program, ready], env=env)
    while not os.path.exists(ready):
        if p.poll() is not None:
            raise SystemExit("the loop ended before it was ready (status %s)" % p.returncode)
        time.sleep(0.05)
    time.sleep(1.0)
    os.kill(p.pid, signal.SIGSTOP)  # hold it still between the read and the kill
    before = live(p.pid)
    os.kill(p.pid, sig)
    os.kill(p.pid, signal.SIGCONT)
    p.wait()
    events = json.loads(subprocess.run([cli, "export", trace, "--chrome", "/dev/stdout"],
                                       capture_output=True, check=True).stdout)["traceEvents"]
    used = [e["args"]["used"] for e in events if e.get("name") == "device 0 used"]
    allocs = sum(1 for e in events if e.get("cat") == "alloc" and e.get("args", {}).get("kind") is None
                 and e["args"].get("device") == 0)
    report = subprocess.run([cli, "report", trace], capture_output=True, text=True).stdout
    device = next(d for d in before["devices"] if d["device"] == 0)
    ok = (max(used) == device["peak"] and allocs == device["allocs"] and "cut short" in report
          and p.returncode == -sig)
    failed |= not ok
    rows.append((sig.name, device["peak"], max(used), device["allocs"], allocs,
                 os.path.getsize(trace), "ok" if ok else "MISMATCH"))

print("%-8s %14s %14s %8s %8s %10s" % ("signal", "live peak", "timeline peak", "allocs", "in file", "bytes"))
for r in rows:
    print("%-8s %14d %14d %8d %8d %10d  %s" % r)
sys.exit(1 if failed else 0)

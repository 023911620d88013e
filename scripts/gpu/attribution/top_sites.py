#!/usr/bin/env python3
"""gpu/attribution/top_sites.py: Python call sites in `gpumemhook top` on the GPU (issue 22): while a GPT-2
training run (transformers' `GPT2Config()`, random weights, AdamW) waits after its third step,
another process runs `gpumemhook top --once --by-site` and `gpumemhook ls --json`, which read the
sites and the counters from the run's segment.

The run records every device allocation's site (`GPUMEMHOOK_STACKS=python:0`, depth 3), so the
sites' bytes must add up to the device's `used`. Prints top's output and a short table last.

    PYTHONPATH=/tmp/site python3 scripts/gpu/attribution/top_sites.py [--caching|--no-caching]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def child(ready: str, go: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (4, 256), device="cuda")
    for step in range(5):
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step == 2:
            open(ready, "w").close()
            while not os.path.exists(go):
                time.sleep(0.05)


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return 0
    import gpumemhook

    cli = os.path.join(os.path.dirname(gpumemhook.__file__), "bin", "gpumemhook")
    rows = []
    for caching in (True, False):
        scratch = tempfile.mkdtemp()
        ready, go = os.path.join(scratch, "ready"), os.path.join(scratch, "go")
        env = dict(os.environ, LD_PRELOAD=os.environ.get("GPUMEMHOOK_LIB") or gpumemhook.library_path(),
                   GPUMEMHOOK_STACKS="python:0")
        if not caching:
            env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        proc = subprocess.Popen([sys.executable, __file__, "--child", ready, go], env=env)
        deadline = time.time() + 240
        while not os.path.exists(ready) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        top = subprocess.run([cli, "top", "--once", "--by-site"], capture_output=True, text=True)
        ls = subprocess.run([cli, "ls", "--json", str(proc.pid)], capture_output=True, text=True)
        open(go, "w").close()
        rc = proc.wait(timeout=240)
        label = "caching allocator" if caching else "PYTORCH_NO_CUDA_MEMORY_CACHING=1"
        print("== %s: gpumemhook top --once --by-site, after step 3 (exit %d)" % (label, top.returncode))
        print(top.stdout + top.stderr)
        snap = json.loads(ls.stdout)[0] if ls.returncode == 0 and ls.stdout.strip() else {}
        used = sum(d["used"] for d in snap.get("devices", []))
        sites = snap.get("by_site") or []
        ours = [s for s in sites if "gpu/attribution/top_sites.py" in s["site"] or "transformers" in s["site"]]
        rows.append((label, rc, len(sites), len(ours), sum(s["used"] for s in sites), used))
    print("== summary (gpu/attribution/top_sites.py)")
    print("  %-34s %4s %6s %18s %14s %14s" % ("run", "exit", "sites", "naming the script", "sites' used", "device used"))
    ok = True
    for label, rc, n, ours, site_used, used in rows:
        print("  %-34s %4d %6d %18d %14d %14d" % (label, rc, n, ours, site_used, used))
        ok &= rc == 0 and n > 0 and ours > 0 and site_used == used
    print("  " + ("every site read from the segment; sites add up to the device's used" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

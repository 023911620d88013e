#!/usr/bin/env python3
"""Checks process and group scopes on a real GPU after they came to run one protocol
(reader/segment/src/window.rs; issue 40, item 7). PyTorch's caching allocator is the only thing
that takes device memory inside each window, so each scope's figures must equal what PyTorch's own
counters say of the same window, to the byte:

1. a process scope around a 1 GiB spike that is freed again (`empty_cache`) and a 256 MiB tensor
   kept: `delta_peak` = the rise of `max_memory_reserved`, `delta_used` = the rise of
   `memory_reserved`;
2. the same scope reset, then a 512 MiB spike: `delta_peak` = 512 MiB, the old 1 GiB forgotten;
3. 64 scopes open at once (the floor word's case) and 200 spikes of 2 MiB to 128 MiB, each freed at
   once: every scope's peak = the largest spike above its start;
4. a scope of this process opened, reset and closed by another process (`gpumemhook.attach(pid)`)
   while this one allocates: its peak = PyTorch's;
5. a group scope (`scope(group=...)`, run under `gpumemhook run --group`) over two processes: the
   group's peak above its start = the sum of both processes' spikes held at once.

    GPUMEMHOOK_LIB=.gpu/libgpumemhook.so GPUMEMHOOK_CLI=.gpu/gpumemhook python3 scripts/gpu/jobs/scopes.py

Prints a short table last; exit 0 when every check holds.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

MIB = 1 << 20

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, gpumemhook
    MIB = 1 << 20
    torch.cuda.init()
    x = torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    out = {}

    def window():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_reserved()

    def spike(mib, keep=False):
        t = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        if keep:
            return t
        del t
        torch.cuda.empty_cache()

    # 1. a spike freed, a tensor kept.
    start = window()
    with gpumemhook.scope("one") as s:
        spike(1024)
        kept = spike(256, keep=True)
        torch.cuda.synchronize()
        out["1"] = dict(delta_peak=s.delta_peak, delta_used=s.delta_used,
                        torch_peak=torch.cuda.max_memory_reserved() - start,
                        torch_used=torch.cuda.memory_reserved() - start)
        # 2. reset, then a smaller spike.
        start = window()
        s.reset()
        spike(512)
        out["2"] = dict(delta_peak=s.delta_peak, torch_peak=torch.cuda.max_memory_reserved() - start)
    del kept
    torch.cuda.empty_cache()

    # 3. 64 scopes at once, spikes of many sizes.
    start = window()
    scopes = [gpumemhook.scope(f"s{i}") for i in range(64)]
    for s in scopes:
        s.__enter__()
    for i in range(200):
        spike(2 + (i * 37) % 127)
    peaks = [s.delta_peak for s in scopes]
    for s in reversed(scopes):
        s.__exit__(None, None, None)
    out["3"] = dict(peaks=sorted(set(peaks)), torch_peak=torch.cuda.max_memory_reserved() - start)

    # 4. a scope opened by another process.
    start = window()
    ready, go, done = sys.argv[1:4]
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    spike(768)
    torch.cuda.synchronize()
    open(done, "w").close()
    time.sleep(float(sys.argv[4]))
    out["4"] = dict(torch_peak=torch.cuda.max_memory_reserved() - start)
    print("RESULT " + json.dumps(out), flush=True)
    """
)

GROUP_MEMBER = textwrap.dedent(
    """
    import os, sys, time, torch
    MIB = 1 << 20
    d, mib = sys.argv[1], int(sys.argv[2])
    x = torch.empty(1, device="cuda"); torch.cuda.synchronize()
    open(os.path.join(d, f"ready.{mib}"), "w").close()
    while not os.path.exists(os.path.join(d, "go")):
        time.sleep(0.01)
    t = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
    open(os.path.join(d, f"holding.{mib}"), "w").close()
    while not os.path.exists(os.path.join(d, "release")):
        time.sleep(0.01)
    del t
    torch.cuda.empty_cache()
    open(os.path.join(d, f"done.{mib}"), "w").close()
    while not os.path.exists(os.path.join(d, "end")):
        time.sleep(0.01)
    """
)


def wait_for(*paths, timeout=120):
    import time

    until = time.time() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.time() > until:
            raise SystemExit(f"timed out waiting for {paths}")
        time.sleep(0.01)


def process_scopes(lib, d):
    """Checks 1-4; rows of (check, expected, measured, ok)."""
    import gpumemhook

    ready, go, done = (os.path.join(d, n) for n in ("ready", "go", "done"))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, ready, go, done, "2"],
        env=dict(os.environ, LD_PRELOAD=lib),
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_for(ready)
    remote = gpumemhook.attach(child.pid).open_scope("from another process", 0)
    remote.reset()
    open(go, "w").close()
    wait_for(done)
    remote_peak = remote.reading(0).delta_peak
    remote.close()
    out, _ = child.communicate(timeout=300)
    result = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:])
    r1, r2, r3, r4 = result["1"], result["2"], result["3"], result["4"]
    return [
        ("1. scope: peak of a freed 1 GiB spike", r1["torch_peak"], r1["delta_peak"]),
        ("1. scope: used after it, 256 MiB kept", r1["torch_used"], r1["delta_used"]),
        ("2. reset, then 512 MiB: peak", r2["torch_peak"], r2["delta_peak"]),
        ("3. 64 scopes, 200 spikes: every peak", [r3["torch_peak"]], r3["peaks"]),
        ("4. scope of another process: peak", r4["torch_peak"], remote_peak),
    ]


def group_scope(lib, cli, d):
    """Check 5; one row."""
    import gpumemhook

    group = f"scopes-{os.getpid()}"
    members = [
        subprocess.Popen(
            [cli, "run", "-q", "--group", group, "--", sys.executable, "-c", GROUP_MEMBER, d, str(mib)],
            env=dict(os.environ, GPUMEMHOOK_LIB=lib),
        )
        for mib in (1024, 3072)
    ]
    try:
        wait_for(*(os.path.join(d, f"ready.{m}") for m in (1024, 3072)))
        with gpumemhook.scope(group=group) as s:
            open(os.path.join(d, "go"), "w").close()
            wait_for(*(os.path.join(d, f"holding.{m}") for m in (1024, 3072)))
            open(os.path.join(d, "release"), "w").close()
            wait_for(*(os.path.join(d, f"done.{m}") for m in (1024, 3072)))
            peak = s.delta_peak
        open(os.path.join(d, "end"), "w").close()
    finally:
        for m in members:
            m.wait(timeout=120)
    return [("5. group scope: 1 GiB + 3 GiB held at once", 4096 * MIB, peak)]


def main():
    lib = os.environ.get("GPUMEMHOOK_LIB") or ".gpu/libgpumemhook.so"
    cli = os.environ.get("GPUMEMHOOK_CLI") or ".gpu/gpumemhook"
    lib, cli = os.path.abspath(lib), os.path.abspath(cli)
    with tempfile.TemporaryDirectory() as d:
        rows = process_scopes(lib, d)
    with tempfile.TemporaryDirectory() as d:
        rows += group_scope(lib, cli, d)
    failed = 0
    print(f"{'check':46} {'expected':>22} {'measured':>22}  ok")
    for name, expected, measured in rows:
        ok = expected == measured
        failed += not ok
        print(f"{name:46} {str(expected):>22} {str(measured):>22}  {'yes' if ok else 'NO'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

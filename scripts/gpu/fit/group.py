#!/usr/bin/env python3
"""`fit` of a program of two processes, on a real GPU (issue 34: each trial is its own group, so the
processes of a trial share one emulated card):

    PYTHONPATH=/tmp/site python3 scripts/gpu/fit/group.py

Runs `gpumemhook fit --card t4 --param n=1..10` over two versions of one program that holds n x 3 GiB
with PyTorch until every part of it has allocated:

* `single`: one process allocates n x 3 GiB;
* `pair`: the program starts two processes that each allocate half (n x 1.5 GiB) and wait for each
  other (a file each), so both halves are held at once.

A T4 has 15 GiB and a PyTorch context takes about half a GiB of it, so both answers should be 4
(12 GiB); were each process judged on a T4 of its own, as before groups, the pair would answer 9.
The table comes last (and $OUT/gpu_fit_group.json when OUT is set).
"""

import json
import os
import subprocess
import sys
import tempfile
import time

UNIT = 3 << 30
PROGRAM = r"""
import os, subprocess, sys, time

n, parts = int(sys.argv[1]), int(sys.argv[2])
if len(sys.argv) > 3:
    # One part: allocate, say so, wait until every part has, then end.
    import torch
    me, barrier = int(sys.argv[3]), sys.argv[4]
    held = torch.empty(n * UNIT // parts, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    open(os.path.join(barrier, str(me)), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(barrier)) < parts:
        if time.monotonic() > deadline:
            sys.exit("the other part never allocated")
        time.sleep(0.05)
    sys.exit(0)
import tempfile
barrier = tempfile.mkdtemp()
children = [subprocess.Popen([sys.executable, __file__, str(n), str(parts), str(i), barrier])
            for i in range(parts)]
# A part that fails (out of memory) ends the others at once, as a real job's launcher would.
while True:
    codes = [c.poll() for c in children]
    if None not in codes:
        break
    if any(code not in (None, 0) for code in codes):
        for c in children:
            if c.poll() is None:
                c.kill()
    time.sleep(0.05)
sys.exit(max(abs(c.returncode) for c in children))
""".replace("UNIT", str(UNIT))


def fit(program, parts, tmp):
    out = os.path.join(tmp, "fit-%d.json" % parts)
    cmd = [sys.executable, "-m", "gpumemhook", "fit", "--card", "t4", "--param", "n=1..10",
           "--json", out, "--", sys.executable, program, "{n}", str(parts)]
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    status = subprocess.call(cmd)
    seconds = time.monotonic() - start
    doc = json.load(open(out)) if os.path.exists(out) else None
    return {"parts": parts, "status": status, "seconds": round(seconds, 1), "json": doc}


def answer(run):
    """The largest n that fits (`results[0].largest` of fit's --json, docs/fit.md)."""
    results = (run["json"] or {}).get("results") or [{}]
    return results[0].get("largest")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        program = os.path.join(tmp, "fit_pair.py")
        with open(program, "w") as f:
            f.write(PROGRAM)
        runs = [fit(program, 1, tmp), fit(program, 2, tmp)]
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_fit_group.json"), "w") as f:
            json.dump(runs, f, indent=1)
    for run in runs:
        print(json.dumps(run["json"])[:2000])
    print()
    print("| version | processes | fit's answer on a T4 (units of 3 GiB) | exit | seconds |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for run, name in zip(runs, ["single", "pair"]):
        print("| %s | %d | %s | %d | %s |" % (name, run["parts"], answer(run), run["status"],
                                              run["seconds"]))


if __name__ == "__main__":
    main()

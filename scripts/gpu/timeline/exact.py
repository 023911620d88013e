#!/usr/bin/env python3
"""Checks on a real GPU that a timeline replays to the counters exactly (issue 48, item 1).

Three PyTorch programs under plain `LD_PRELOAD` with `GPUMEMHOOK_TRACE` and `GPUMEMHOOK_REPORT`, on
`PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync` (every tensor an allocation the hook sees):

- `threads`: four Python threads train small models at once (their backward passes run on
  PyTorch's autograd thread) while a fifth asks again and again for 4 TiB, which the driver refuses;
- `restart`: the same, with `gpumemhook reset-peak PID` from this script while they run;
- `gpt2`: GPT-2 (124M, random weights) training steps.

For each, `gpumemhook report --json TIMELINE` must give every device's peak and `used` at the end
that the exit report states, to the byte, and count as many allocations and frees. The `-ring`
runs do it again with `GPUMEMHOOK_TRACE_MAX` far below the full timeline (issue 48, item 4): the
file must stay within it, and `report` must say where its full detail starts.

    GPUMEMHOOK_LIB=.../libgpumemhook.so GPUMEMHOOK_CLI=.../gpumemhook python3 scripts/gpu/timeline/exact.py

Prints a short table last; exit 0 when every check holds.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

THREADS = textwrap.dedent(
    """
    import sys, threading, torch

    ready = sys.argv[1]
    stop = threading.Event()

    def train(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
        opt = torch.optim.Adam(model.parameters())
        for step in range(80):
            x = torch.randn(256 + 32 * (step % 5), 2048, device="cuda")
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if seed == 0 and step == 20:
                open(ready, "w").close()
        torch.cuda.synchronize()

    def greedy():
        while not stop.is_set():
            try:
                torch.empty(1 << 42, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                pass

    refuser = threading.Thread(target=greedy)
    refuser.start()
    workers = [threading.Thread(target=train, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    refuser.join()
    """
)

GPT2 = textwrap.dedent(
    """
    import sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel

    open(sys.argv[1], "w").close()
    torch.manual_seed(0)
    config = GPT2Config()
    model = GPT2LMHeadModel(config).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, config.vocab_size, (8, 1024), device="cuda")
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 4):
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    """
)

cli = os.environ["GPUMEMHOOK_CLI"]
lib = os.environ["GPUMEMHOOK_LIB"]
work = tempfile.mkdtemp(prefix="exact-timeline-")


def figures(devices):
    """{device: (peak, used, allocs, frees)} of a report's devices list."""
    return {
        d["device"]: (d["peak"], d["used"], d.get("allocs"), d.get("frees")) for d in devices
    }


def run(name, source, restart, ring=None, steps=None):
    program = os.path.join(work, name + ".py")
    with open(program, "w") as f:
        f.write(source)
    trace = os.path.join(work, name + ".trace")
    report = os.path.join(work, name + ".report.json")
    ready = os.path.join(work, name + ".ready")
    env = dict(
        os.environ,
        LD_PRELOAD=lib,
        GPUMEMHOOK_TRACE=trace,
        GPUMEMHOOK_REPORT=report,
        PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync",
    )
    if ring:
        env["GPUMEMHOOK_TRACE_MAX"] = "%dB" % ring
    started = time.time()
    extra = [str(steps)] if steps else []
    child = subprocess.Popen([sys.executable, program, ready] + extra, env=env)
    resets = 0
    if restart:
        while not os.path.exists(ready) and child.poll() is None:
            time.sleep(0.05)
        while child.poll() is None and resets < 3:
            out = subprocess.run([cli, "reset-peak", str(child.pid)], capture_output=True, text=True)
            resets += out.returncode == 0
            time.sleep(0.3)
    if child.wait() != 0:
        return name, "program failed", False
    with open(report) as f:
        counted = figures(json.load(f)["devices"])
    out = subprocess.run([cli, "report", "--json", trace], capture_output=True, text=True)
    if out.returncode != 0:
        return name, "report --json failed: " + out.stderr.strip(), False
    # One process per timeline: report --json prints a list of the exit report's shape.
    replayed = figures(json.loads(out.stdout)[0]["devices"])
    same = replayed == counted
    detail = "%d device(s), %d restart(s), %.0f s; counted %s, replayed %s" % (
        len(counted), resets, time.time() - started, counted, replayed)
    if ring:
        size = os.path.getsize(trace)
        text = subprocess.run([cli, "report", trace], capture_output=True, text=True).stdout
        said = [line.strip() for line in text.splitlines() if "full detail from" in line]
        same = same and size <= ring and bool(said)
        detail += "; file %d bytes (ring %d); %s" % (size, ring, said[0] if said else "NOT SAID")
    return name, detail, same


rows = [
    run("threads", THREADS, False),
    run("restart", THREADS, True),
    run("gpt2", GPT2, False),
    run("threads-ring", THREADS, True, ring=2 << 20),
    # 60 steps: some 140,000 events, 4.5 MB of records, in a ring of 2 MiB.
    run("gpt2-ring", GPT2, False, ring=2 << 20, steps=60),
]
print()
print("| run | same figures | detail |")
print("| --- | --- | --- |")
for name, detail, same in rows:
    print("| %s | %s | %s |" % (name, "yes" if same else "NO", detail))
sys.exit(0 if all(same for _, _, same in rows) else 1)

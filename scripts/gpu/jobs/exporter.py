#!/usr/bin/env python3
"""gpu/jobs/exporter.py: the exporter on a real GPU, with a real 2-rank torchrun job.

Starts `gpumemhook exporter`, then a 2-rank torchrun job under the hook (`gpumemhook run -- python -m
torch.distributed.run --standalone --nproc-per-node 2 ...`): with 2 or more GPUs, NCCL and one GPU
per rank; with one, gloo and both ranks on GPU 0. Each rank allocates a tensor of its own size
(`--mib` MiB, plus 64 MiB per rank), synchronises, records `torch.cuda.memory_reserved()`,
`memory_allocated()` and the hook's own `gpumemhook.used()` from inside, and waits. The script then
scrapes `/metrics` once, while both ranks hold their memory, and prints per rank: the scraped
`gpumemhook_used_bytes`, PyTorch's reserved bytes and the hook's in-process figure, plus the
job labels of the series.

It fails (exit 1) when a rank has no series, when the scraped bytes differ from the hook's own
figure in that rank (the exporter must serve exactly what the hook counts), when they are below
PyTorch's reserved bytes (PyTorch's pool is made of allocations the hook counts), or when the rank
labels are wrong. Above the reserved bytes is expected with NCCL, whose buffers are allocated
outside PyTorch's pool: the difference is printed.

Needs: python3 with torch (CUDA) and the gpumemhook wheel installed (`gpumemhook` on PATH). No
network (everything listens on 127.0.0.1), no Rust. Usage: `python3 scripts/gpu/jobs/exporter.py [--mib
N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MiB = 1 << 20


def worker(args: argparse.Namespace) -> int:
    import gpumemhook
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    device = local_rank if args.backend == "nccl" else 0
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    held = torch.empty((args.mib + 64 * rank) * MiB, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    token = torch.ones(1024, device="cuda")
    dist.all_reduce(token)
    torch.cuda.synchronize()
    dist.barrier()
    figures = {
        "rank": rank,
        "local_rank": local_rank,
        "pid": os.getpid(),
        "device": device,
        "reserved": torch.cuda.memory_reserved(device),
        "allocated": torch.cuda.memory_allocated(device),
        "hook_used": gpumemhook.used(device),
        "all_reduce": float(token[0].item()),
    }
    out = Path(args.dir)
    tmp = out / "ready.{}.tmp".format(rank)
    tmp.write_text(json.dumps(figures))
    tmp.rename(out / "ready.{}".format(rank))
    deadline = time.time() + 600
    while not (out / "go").exists():
        if time.time() > deadline:
            print("rank {}: never told to go".format(rank), file=sys.stderr)
            return 1
        time.sleep(0.05)
    del held
    dist.barrier()
    dist.destroy_process_group()
    return 0


def parse_used(text: str) -> dict:
    """pid -> (labels, value) of every `gpumemhook_used_bytes` sample of a text exposition."""
    found = {}
    for line in text.splitlines():
        if not line.startswith("gpumemhook_used_bytes{"):
            continue
        inside, value = line[len("gpumemhook_used_bytes{") :].rsplit("} ", 1)
        labels = {}
        for m in re.finditer(r'(\w+)="((?:[^"\\]|\\.)*)"', inside):
            labels[m.group(1)] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), m.group(2))
        found[int(labels["pid"])] = (labels, int(float(value)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB rank 0 holds (rank 1: 64 more)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    cli = shutil.which("gpumemhook")
    if cli is None:
        print("gpu_exporter: no gpumemhook on PATH: pip install the wheel first", file=sys.stderr)
        return 2
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 1:
        print("gpu_exporter: no CUDA device", file=sys.stderr)
        return 2
    backend = "nccl" if gpus >= 2 else "gloo"
    work = Path(tempfile.mkdtemp(prefix="gpumemhook-gpu-exporter."))
    shm = work / "shm"
    shm.mkdir()
    env = dict(os.environ, GPUMEMHOOK_SHM_DIR=str(shm))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_PROCID"):
        env.pop(k, None)
    started = []
    try:
        exporter = subprocess.Popen(
            [cli, "exporter", "--listen", "127.0.0.1:0"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(exporter)
        line = exporter.stderr.readline()
        address = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", line)
        if not address:
            print("gpu_exporter: the exporter did not start: {}".format(line), file=sys.stderr)
            return 1
        job = subprocess.Popen(
            [cli, "run", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", "2", os.path.abspath(__file__), "--worker", "--dir", str(work),
             "--backend", backend, "--mib", str(args.mib)],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        started.append(job)
        deadline = time.time() + 600
        while not all((work / "ready.{}".format(r)).exists() for r in (0, 1)):
            if job.poll() is not None or time.time() > deadline:
                print("gpu_exporter: the torchrun job ended or hung before both ranks were ready",
                      file=sys.stderr)
                return 1
            time.sleep(0.1)
        ranks = [json.loads((work / "ready.{}".format(r)).read_text()) for r in (0, 1)]
        t0 = time.time()
        with urllib.request.urlopen("http://{}/metrics".format(address.group(1)), timeout=30) as r:
            text = r.read().decode()
        scrape_ms = (time.time() - t0) * 1e3
        (work / "go").touch()
        job_status = job.wait(timeout=600)
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()

    series = parse_used(text)
    print("\nbackend {}, {} GPU(s); one scrape of {} bytes in {:.1f} ms; job exit status {}".format(
        backend, gpus, len(text), scrape_ms, job_status))
    header = "{:>4} {:>7} {:>3} {:>14} {:>14} {:>14} {:>14}  {}".format(
        "rank", "pid", "dev", "scraped used", "hook in rank", "torch reserved", "scraped-resvd", "job_id")
    print(header)
    failures = []
    for r in ranks:
        labels, scraped = series.get(r["pid"], ({}, None))
        print("{:>4} {:>7} {:>3} {:>14} {:>14} {:>14} {:>14}  {}".format(
            r["rank"], r["pid"], r["device"], "-" if scraped is None else scraped, r["hook_used"],
            r["reserved"], "-" if scraped is None else scraped - r["reserved"], labels.get("job_id", "-")))
        if scraped is None:
            failures.append("rank {} (pid {}) has no gpumemhook_used_bytes series".format(r["rank"], r["pid"]))
            continue
        if labels.get("device") != str(r["device"]):
            failures.append("rank {}: series of device {}, expected {}".format(r["rank"], labels.get("device"), r["device"]))
        if scraped != r["hook_used"]:
            failures.append("rank {}: scraped {} != the hook's own {}".format(r["rank"], scraped, r["hook_used"]))
        if scraped < r["reserved"]:
            failures.append("rank {}: scraped {} < torch reserved {}".format(r["rank"], scraped, r["reserved"]))
        if (labels.get("rank"), labels.get("local_rank"), labels.get("world_size")) != (
            str(r["rank"]), str(r["local_rank"]), "2"
        ):
            failures.append("rank {}: labels {}".format(r["rank"], labels))
        if not labels.get("job_id", "").startswith("torchrun:"):
            failures.append("rank {}: no torchrun job_id label: {}".format(r["rank"], labels))
    if len({series.get(r["pid"], ({},))[0].get("job_id") for r in ranks}) != 1:
        failures.append("the two ranks have different job_id labels")
    shutil.rmtree(work, ignore_errors=True)
    if job_status != 0:
        failures.append("the torchrun job exited with status {}".format(job_status))
    for f in failures:
        print("FAILED: " + f)
    print("gpu_exporter: " + ("FAILED" if failures else "passed: every rank's scraped used is the hook's exact figure"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

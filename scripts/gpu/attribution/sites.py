#!/usr/bin/env python3
"""gpu/attribution/sites.py: Python call sites on the GPU (issue 22): which lines of a GPT-2 training script hold
the memory, read without the GIL, and what recording them costs per step.

GPT-2 (transformers' `GPT2Config()`, random weights, no network) trains a few steps with AdamW in
child processes, each a re-run of this script under the hook (`gpumemhook.library_path()` in
`LD_PRELOAD`; `GPUMEMHOOK_LIB` names another build), whether or not this one was started under it:

  sites      GPUMEMHOOK_STACKS=python:0 (every device allocation records its site, depth 3) and an
             exit report: the live allocations of libc10_cuda.so with their sites, whether they
             name lines of this script or of transformers' modeling code, whether the per-site
             breakdown adds up to the module's bytes, and the sites of the backward thread;
  hooked     the hook without sites;
  history    the hook without sites, with PyTorch's own `torch.cuda.memory._record_memory_history()`
             (its defaults: Python and C++ stacks of every allocation);
  each with the default caching allocator and with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor
  is a driver allocation: the worst case for a per-allocation cost).

Prints the time per step (median of the steps after the warm-up) of each, and a short table last.

Usage, after installing the wheel (`pip install --no-index --target /tmp/site .whl/*.whl`):
    PYTHONPATH=/tmp/site python3 scripts/gpu/attribution/sites.py [--steps 12] [--batch 8] [--seq 512]
or, to look at one exit report written by a `sites` run:
    python3 scripts/gpu/attribution/sites.py --analyze report.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

MODULE = "libc10_cuda.so"
MODES = ("sites", "hooked", "history")
CHILD_FLAG = "--child"


def child(mode: str, steps: int, batch: int, seq: int) -> None:
    """One training run in this (hooked) process; prints one JSON line."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import gpumemhook

    torch.manual_seed(0)
    if mode == "history":
        torch.cuda.memory._record_memory_history()
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")
    times: List[float] = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if mode == "history":
        torch.cuda.memory._record_memory_history(enabled=None)
    out: Dict[str, Any] = {
        "mode": mode,
        "hooked": gpumemhook.is_hooked(),
        "step_times": times,
        "modules": gpumemhook.breakdown(0) if gpumemhook.is_hooked() else [],
        "reserved": torch.cuda.memory_reserved(0),
    }
    if mode == "sites":
        out["by_site"] = gpumemhook.breakdown(by="site")
    print("RESULT " + json.dumps(out), flush=True)


def run_child(mode: str, caching: bool, args: argparse.Namespace, report: str) -> Dict[str, Any]:
    import gpumemhook
    from gpumemhook import _native

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEMHOOK_") or k == "GPUMEMHOOK_LIB"}
    lib = os.environ.get("GPUMEMHOOK_LIB") or gpumemhook.library_path()
    env["LD_PRELOAD"] = _native.preload_value(os.environ.get("LD_PRELOAD"), lib)
    if mode == "sites":
        env["GPUMEMHOOK_STACKS"] = "python:0"
        env["GPUMEMHOOK_REPORT"] = report
    if caching:
        env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    else:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    command = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, mode,
               "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit("the {} run ({}) failed with exit status {}".format(
            mode, "caching" if caching else "no caching", done.returncode))
    said = [line for line in done.stderr.splitlines() if line.startswith("gpumemhook:")]
    result = json.loads(lines[-1][len("RESULT "):])
    result["stderr"] = said
    return result


def analyze(report_path: str, script_hint: str = "gpu/attribution/sites.py") -> Dict[str, Any]:
    """What an exit report of a `sites` run says: prints the live allocations of libc10_cuda.so with
    their sites and the checks; returns the figures for the table."""
    with open(report_path) as f:
        report = json.load(f)
    live = report.get("live") or []
    device0 = next((d for d in report.get("devices", []) if d.get("device") == 0), {})
    module_used = sum(m["used"] for m in device0.get("by_module", []) if m["module"] == MODULE)
    ours = [a for a in live if a.get("module") == MODULE]
    print("live allocations of {} at exit ({} listed, {} omitted from the report):".format(
        MODULE, len(ours), report.get("live_omitted", 0)))
    for a in ours[:15]:
        print("  {:>12} B  {}".format(a["bytes"], a.get("site") or "(no site)"))
    if len(ours) > 15:
        print("  ... and {} more".format(len(ours) - 15))
    with_site = [a for a in ours if a.get("site")]
    named_lines = [a for a in with_site
                   if script_hint in a["site"] or "modeling_gpt2.py" in a["site"]
                   or "/transformers/" in a["site"] or "/torch/" in a["site"]]
    no_python = [a for a in with_site if a["site"].startswith("no Python frame")]
    by_site_live = sum(a["bytes"] for a in with_site)
    complete = report.get("live_omitted", 0) == 0
    by_site = report.get("by_site") or []
    print("per-site breakdown of the exit report (all modules, all devices), largest first:")
    for s in by_site[:10]:
        print("  used {:>12}  peak {:>12}  live {:>4}  {}".format(s["used"], s["peak"], s["live_allocs"], s["site"]))
    sites_used = sum(s["used"] for s in by_site)
    device_used = device0.get("used", 0)
    checks = {
        "module_live": len(ours),
        "with_site": len(with_site),
        "python_lines": len(named_lines),
        "no_python_frame": len(no_python),
        "module_used": module_used,
        "module_sites_sum": by_site_live,
        "adds_up_module": complete and by_site_live == module_used,
        "sites_used": sites_used,
        "device_used": device_used,
        "adds_up_device": sites_used == device_used,
    }
    print("{} of {} live {} allocations carry a site; {} name a line of this script, of transformers "
          "or of torch; {} were made on a thread without Python frames".format(
              len(with_site), len(ours), MODULE, len(named_lines), len(no_python)))
    print("the sites of {}'s live allocations add up to its bytes: {} ({} of {} bytes{})".format(
        MODULE, checks["adds_up_module"], by_site_live, module_used,
        "" if complete else "; the report omits some live allocations"))
    print("the per-site breakdown adds up to device 0's used: {} ({} of {} bytes)".format(
        checks["adds_up_device"], sites_used, device_used))
    return checks


def median_ms(result: Dict[str, Any], warmup: int) -> float:
    times = result["step_times"][warmup:] or result["step_times"]
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(CHILD_FLAG, choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--analyze", metavar="REPORT", help="only look at one exit report of a sites run")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.batch, args.seq)
        return
    if args.analyze:
        analyze(args.analyze)
        return
    import gpumemhook

    rows = []
    checks: Optional[Dict[str, Any]] = None
    with tempfile.TemporaryDirectory() as scratch:
        for caching in (True, False):
            for mode in MODES:
                report = os.path.join(scratch, "report-{}-{}.json".format(mode, int(caching)))
                result = run_child(mode, caching, args, report)
                if not result["hooked"]:
                    raise SystemExit("the {} run was not hooked: is the wheel installed?".format(mode))
                allocator = "caching" if caching else "no caching"
                print("== {} ({}): {:.1f} ms per step; libc10_cuda.so {} bytes, reserved {}{}".format(
                    mode, allocator, median_ms(result, args.warmup),
                    sum(r[1] for r in result["modules"] if r[0] == MODULE), result["reserved"],
                    "; said: " + " | ".join(result["stderr"]) if result["stderr"] else ""))
                if mode == "sites" and caching:
                    print("in-process breakdown(by='site'), largest first:")
                    for site, used, peak, allocs in result["by_site"][:8]:
                        print("  used {:>12}  peak {:>12}  allocs {:>4}  {}".format(used, peak, allocs, site))
                    checks = analyze(report)
                    cli = gpumemhook.cli_path()
                    if cli:
                        print("gpumemhook report --by-site (modules by package, sites):")
                        shown = subprocess.run([str(cli), "report", "--by-site", report],
                                               capture_output=True, text=True)
                        print(shown.stdout + shown.stderr)
                rows.append((mode, allocator, median_ms(result, args.warmup)))
    print()
    print("| run | allocator | ms per step (median) | vs hooked without sites |")
    print("| --- | --- | ---: | ---: |")
    base = {allocator: ms for mode, allocator, ms in rows if mode == "hooked"}
    for mode, allocator, ms in rows:
        print("| {} | {} | {:.2f} | {:+.1f}% |".format(mode, allocator, ms, (ms / base[allocator] - 1) * 100))
    if checks:
        print("| sites of {}'s live allocations | | {} of {} ({} Python lines, {} threads without Python) | |".format(
            MODULE, checks["with_site"], checks["module_live"], checks["python_lines"], checks["no_python_frame"]))
        print("| per-site sums = module bytes / device used | | {} / {} | |".format(
            checks["adds_up_module"], checks["adds_up_device"]))


if __name__ == "__main__":
    main()

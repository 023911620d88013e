#!/usr/bin/env python3
"""`gpumemhook export --pytorch` on a real GPU (issue 43, item 5): a few GPT-2 training steps
(`scripts/gpu/workloads/gpt2_step.py`: transformers' GPT2LMHeadModel, random weights, no network) with
PyTorch's allocator on `cudaMallocAsync`, so that each tensor is an allocation the hook sees, run
under `gpumemhook run --trace`; the timeline exported as PyTorch's memory snapshot and as a Perfetto
trace; the snapshot loaded with `pickle`, replayed to its peak (which must be the exit report's),
and handed to `torch.cuda._memory_viz.trace_plot` and `segment_plot` (pages written under $OUT).

    GPUMEMHOOK_CLI=.gpu/gpumemhook python3 scripts/gpu/timeline/pytorch_export.py [--steps 3] [--batch 8]

Prints one result line last; exit 0 when the snapshot replays to the report's peak and both plots
are made.
"""

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

MIB = 1 << 20

# The GPT-2 program `fit` and the page use (transformers' GPT2LMHeadModel, random weights).
GPT2_STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workloads", "gpt2_step.py")


def replay(trace):
    """The peak and the end of what the entries hold: alloc adds, free_completed takes away."""
    held = peak = 0
    for e in trace:
        if e["action"] == "alloc":
            held += e["size"]
            peak = max(peak, held)
        elif e["action"] == "free_completed":
            held -= e["size"]
    return peak, held


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    out = os.environ.get("OUT", "/tmp/gpu_pytorch_export")
    os.makedirs(out, exist_ok=True)
    cli = os.environ.get("GPUMEMHOOK_CLI") or subprocess.check_output(
        [sys.executable, "-c", "import gpumemhook; print(gpumemhook.cli_path())"], text=True).strip()
    work = tempfile.mkdtemp()
    trace, report = os.path.join(work, "t.json"), os.path.join(work, "report.json")
    snapshot, perfetto = os.path.join(out, "snapshot.pickle"), os.path.join(out, "trace.pftrace")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    subprocess.run([cli, "run", "--quiet", "--stacks", "python:1MiB", "--trace", trace, "--report",
                    report, "--", sys.executable, GPT2_STEP, "--steps", str(args.steps), "--batch",
                    str(args.batch)],
                   env=env, check=True)
    subprocess.run([cli, "export", trace, "--pytorch", snapshot, "--perfetto", perfetto], check=True)
    with open(snapshot, "rb") as f:
        data = pickle.load(f)
    rep = json.load(open(report))
    failures = []
    for d in rep["devices"]:
        if d["device"] >= len(data["device_traces"]):
            failures.append("device {}: no trace".format(d["device"]))
            continue
        peak, held = replay(data["device_traces"][d["device"]])
        if (peak, held) != (d["peak"], d["used"]):
            failures.append("device {}: snapshot peak {} held {}, report peak {} used {}".format(
                d["device"], peak, held, d["peak"], d["used"]))
    from torch.cuda import _memory_viz

    pages = {}
    for name, plot in (("trace_plot", _memory_viz.trace_plot), ("segment_plot", _memory_viz.segment_plot)):
        try:
            html = plot(data)
        except Exception as e:  # the check's point: say which plot failed and why
            failures.append("{}: {!r}".format(name, e))
            continue
        pages[name] = len(html)
        with open(os.path.join(out, name + ".html"), "w") as f:
            f.write(html)
    events = sum(len(t) for t in data["device_traces"])
    peak = max((d["peak"] for d in rep["devices"]), default=0)
    with_site = sum(1 for t in data["device_traces"] for e in t if e["action"] == "alloc"
                    and any(f["filename"].endswith(".py") for f in e["frames"]))
    allocs = sum(1 for t in data["device_traces"] for e in t if e["action"] == "alloc")
    print("pytorch-export: {}: {} entries ({} allocations, {} with a Python site), peak {:.1f} MiB "
          "(report's), {} segments at the end, trace_plot {} bytes, segment_plot {} bytes{}".format(
              "FAIL" if failures else "ok", events, allocs, with_site, peak / MIB, len(data["segments"]),
              pages.get("trace_plot", 0), pages.get("segment_plot", 0),
              "; " + "; ".join(failures) if failures else ""))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

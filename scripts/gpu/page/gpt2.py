#!/usr/bin/env python3
"""The GPU machine's check of `gpumemhook view` (issue 35): the page of a GPT-2 training run
(scripts/gpu/workloads/gpt2_step.py, PyTorch without its caching allocator so that each tensor is an allocation
of its own) recorded with `gpumemhook run --stacks python:1MiB --report R --html P`. Reads the page's
embedded data back the way the page does (cli/src/page/data.rs: delta-encoded columns) and checks:
the page's peak, top module and top site equal the exit report's; what was live at the peak (the
flame graph the page opens on) names lines of transformers and a cuBLAS module. Copies the page and
the report into $OUT (default /tmp/gpu_view) and, where chromium is installed, a screenshot
(view.png). Prints a short table last; exits 1 when a check fails.

    python3 scripts/gpu/page/gpt2.py [--batch 4] [--steps 2]
"""

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile


def page_data(path):
    text = open(path, encoding="utf-8").read()
    start = text.index('<script id="gmh-data" type="application/json">') + len(
        '<script id="gmh-data" type="application/json">')
    return json.loads(text[start:text.index("</script>", start)].replace("<\\/", "</"))


def live_at_peak(run):
    """What the page's flame graph shows first: allocations live at the peak of the peak device."""
    s = run["summary"]
    a = run["allocs"]
    starts = list(itertools.accumulate(a["t"]))
    for i, start in enumerate(starts):
        end = float("inf") if a["e"][i] < 0 else start + a["e"][i]
        if a["d"][i] == s["peak_device"] and start <= s["peak_t"] < end:
            yield a["b"][i], run["modules"][a["m"][i]], run["sites"][a["s"][i]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    out = os.environ.get("OUT", "/tmp/gpu_view")
    os.makedirs(out, exist_ok=True)
    cli = os.environ.get("GPUMEMHOOK_CLI") or subprocess.check_output(
        [sys.executable, "-c", "import gpumemhook; print(gpumemhook.cli_path())"], text=True).strip()
    work = tempfile.mkdtemp()
    report, page = os.path.join(work, "report.json"), os.path.join(out, "view.html")
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    subprocess.run([cli, "run", "--stacks", "python:1MiB", "--report", report, "--html", page, "--",
                    sys.executable, "scripts/gpu/workloads/gpt2_step.py", "--batch", str(args.batch),
                    "--steps", str(args.steps)], env=env, check=True)
    shutil.copy(report, os.path.join(out, "report.json"))
    run = page_data(page)["runs"][0]
    rep = json.load(open(report))
    peak = max(d["peak"] for d in rep["devices"])
    modules = [m for d in rep["devices"] for m in d.get("by_module", [])]
    top_module = max(modules, key=lambda m: m["peak"])["module"]
    top_site = max(rep.get("by_site") or [{"site": "", "peak": 0}], key=lambda s: s["peak"])["site"]
    live = list(live_at_peak(run))
    held = sum(b for b, _, _ in live)
    transformers = {f for _, _, site in live for f in site.split(" < ") if "transformers/" in f}
    cublas = sum(b for b, m, _ in live if "cublas" in m.lower())
    cublas_run = [m for m in run["modules"] if "cublas" in m.lower()]
    shot = "no chromium"
    if shutil.which("chromium"):
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--user-data-dir=" + tempfile.mkdtemp(), "--window-size=1400,900",
                        "--virtual-time-budget=5000", "--screenshot=" + os.path.join(out, "view.png"),
                        "file://" + page], check=False, capture_output=True)
        shot = os.path.join(out, "view.png")
    events = sum(len(d["t"]) for d in run["devices"])
    checks = [
        ("page peak = report peak", run["summary"]["peak"], peak),
        ("page top module = report's", run["summary"]["top_module"], top_module),
        ("page top site = report's", run["summary"]["top_site"], top_site),
        ("live at the peak = the peak", held, run["summary"]["peak"]),
    ]
    print("\n== summary (gpu/page/gpt2.py)")
    failed = False
    for name, got, want in checks:
        ok = got == want
        failed |= not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: {str(got)[:90]}" + ("" if ok else f" (want {want})"))
    ok = bool(transformers)
    failed |= not ok
    print(f"  {'ok  ' if ok else 'FAIL'} the peak's flame graph names {len(transformers)} transformers lines, e.g. "
          f"{sorted(transformers)[:2]}")
    ok = bool(cublas_run)
    failed |= not ok
    print(f"  {'ok  ' if ok else 'FAIL'} cuBLAS modules in the run: {cublas_run}; held at the peak: {cublas} B")
    size = os.path.getsize(page)
    print(f"  page {size} B for {events} used changes ({size / max(events, 1):.1f} B each, fixed part included); "
          f"screenshot: {shot}; files in {out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

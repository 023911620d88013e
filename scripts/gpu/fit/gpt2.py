#!/usr/bin/env python3
"""Will it fit, on a real GPU (issue 20): the largest GPT-2 (124M, sequence 1024, AdamW) training
batch on a T4, an L4, an A100 40 GB and an H100, found by `gpumemhook fit` on this machine's GPU,

1. side by side (as many trials at once as the GPU holds), and
2. one trial at a time (`--jobs 1`),

timing both whole searches, and beside each card what `accelerate estimate-memory` says where it
runs (it fetches the model's config from the hub, so offline it may not; then the same estimate is
taken from accelerate's own functions on a model built from the config, when accelerate is
installed, and the table says which). The table comes last.

The CLI is run as `python -m gpumemhook` (the bundled binary of the installed wheel):

    PYTHONPATH=/tmp/site python3 scripts/gpu/fit/gpt2.py                 # both searches, then the table
    PYTHONPATH=/tmp/site python3 scripts/gpu/fit/gpt2.py --mode side --save side.json
    PYTHONPATH=/tmp/site python3 scripts/gpu/fit/gpt2.py --mode serial --save serial.json
    python3 scripts/gpu/fit/gpt2.py --table side.json serial.json        # the table from saved runs

With OUT set, the results are also written to $OUT/gpu_fit.json.

Issue 32's comparison: the peak-guided search against bisection, side by side, on a T4, an L4 and
an A100 40 GB over batch 1..64 (it should answer 7, 11 and 20; before the peaks, the search took 24
trials and 3 min 43 s on an H100):

    PYTHONPATH=/tmp/site python3 scripts/gpu/fit/gpt2.py --mode search     # both searches, then the table
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Preset names as `gpumemhook cards` lists them (reader/src/cards.rs).
CARDS = ["t4", "l4", "a100-40gb", "h100"]
GIB = 1 << 30


def fit(jobs, cards, batch_range, search=None):
    """Runs one whole search; returns (seconds, the --json document, exit status)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fit.json")
        cmd = [sys.executable, "-m", "gpumemhook", "fit", "--card", ",".join(cards),
               "--param", "batch=" + batch_range, "--json", out]
        if jobs:
            cmd += ["--jobs", str(jobs)]
        if search:
            cmd += ["--search", search]
        cmd += ["--", sys.executable, os.path.join(HERE, "..", "workloads", "gpt2_step.py"), "--batch", "{batch}"]
        print("$ " + " ".join(cmd), flush=True)
        start = time.monotonic()
        status = subprocess.call(cmd)
        seconds = time.monotonic() - start
        doc = json.load(open(out)) if os.path.exists(out) else None
        return {"seconds": seconds, "status": status, "json": doc}


def accelerate_estimate():
    """What accelerate says GPT-2 training with Adam needs (fp32), and how it was learned."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    try:
        done = subprocess.run(
            ["accelerate", "estimate-memory", "openai-community/gpt2", "--library_name",
             "transformers", "--dtypes", "float32"],
            capture_output=True, text=True, timeout=120, env=env)
        if done.returncode == 0:
            for line in done.stdout.splitlines():
                cells = [c.strip() for c in line.split("│") if c.strip()]
                if cells and cells[0] == "float32" and len(cells) >= 4:
                    return {"via": "accelerate estimate-memory", "training": cells[3]}
            return {"via": "accelerate estimate-memory", "training": None,
                    "why": "its output had no float32 row: " + done.stdout[-300:]}
        why = (done.stderr or done.stdout).strip().splitlines()
        cli_why = why[-1] if why else "exit status %d" % done.returncode
    except FileNotFoundError:
        cli_why = "accelerate is not installed"
    except subprocess.TimeoutExpired:
        cli_why = "it did not finish in 120 s"
    print("accelerate estimate-memory cannot run here (%s)" % cli_why, flush=True)
    try:
        from accelerate import init_empty_weights
        from accelerate.utils import calculate_maximum_sizes
        from transformers import GPT2Config, GPT2LMHeadModel

        with init_empty_weights():
            model = GPT2LMHeadModel(GPT2Config())
        total, _largest = calculate_maximum_sizes(model)
        try:
            from accelerate.commands.estimate import estimate_training_usage
            training = max(estimate_training_usage(total, "float32").values())
        except ImportError:
            # What estimate-memory prints for Adam in fp32: weights, gradients, two moments.
            training = 4 * total
        return {"via": "accelerate's functions (offline)", "training": "%.2f GiB" % (training / GIB),
                "why": cli_why}
    except Exception as e:  # noqa: BLE001 - any reason it cannot run is reported, not raised
        print("accelerate's functions cannot run either (%s)" % e, flush=True)
        return {"via": None, "training": None, "why": cli_why}


def by_card(run):
    if not run or not run.get("json"):
        return {}
    return {r["card"]: r for r in run["json"]["results"]}


def table(side, serial, accel):
    s, q = by_card(side), by_card(serial)
    rows = [("card", "total", "largest (side by side)", "largest (one at a time)", "peak",
             "fails at", "trials side/serial", "accelerate: training needs")]
    for card in CARDS:
        a, b = s.get(card, {}), q.get(card, {})
        r = a or b
        peak = r.get("peak")
        rows.append((
            card,
            "%.1f GiB" % (r["total"] / GIB) if r else "-",
            str(a.get("largest", "-")) + (" (error)" if a.get("error") else ""),
            str(b.get("largest", "-")) + (" (error)" if b.get("error") else ""),
            "%.2f GiB" % (peak / GIB) if peak else "-",
            str(r.get("smallest_failing", "-")),
            "%s/%s" % (a.get("trials", "-"), b.get("trials", "-")),
            accel.get("training") or "n/a",
        ))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    for name, run in (("side by side", side), ("one at a time", serial)):
        if run:
            lines.append("whole search %s: %.1f s (exit status %d)" % (name, run["seconds"],
                                                                      run["status"]))
    if side and serial and side["seconds"] > 0:
        lines.append("speed-up: %.2fx" % (serial["seconds"] / side["seconds"]))
    lines.append("accelerate: %s%s" % (accel.get("via") or "not available",
                                       " (estimate-memory: %s)" % accel["why"]
                                       if accel.get("why") else ""))
    lines.append("accelerate's figure counts weights, gradients and Adam's state only, for any "
                 "batch: activations are not in it.")
    return "\n".join(lines)


# Issue 32's comparison: the cards, what fit answered before the peak-guided search, and its cost.
SEARCH_CARDS = ["t4", "l4", "a100-40gb"]
BEFORE = {"answers": {"t4": 7, "l4": 11, "a100-40gb": 20}, "trials": 24, "seconds": 223}


def search_table(peaks, bisection):
    """The peak-guided search beside bisection and beside the figures before it (last)."""
    p, b = by_card(peaks), by_card(bisection)
    rows = [("card", "expected", "peaks", "bisection", "peak", "trials peaks (+stopped)",
             "trials bisection")]
    for card in SEARCH_CARDS:
        x, y = p.get(card, {}), b.get(card, {})
        peak = x.get("peak") or y.get("peak")
        rows.append((card, str(BEFORE["answers"][card]),
                     str(x.get("largest", "-")) + (" (error)" if x.get("error") else ""),
                     str(y.get("largest", "-")) + (" (error)" if y.get("error") else ""),
                     "%.2f GiB" % (peak / GIB) if peak else "-",
                     "%s (+%s)" % (x.get("trials", "-"), x.get("stopped", 0)),
                     str(y.get("trials", "-"))))

    def total(run, key):
        return sum(r.get(key, 0) for r in by_card(run).values())

    rows.append(("all", "", "", "", "", "%d (+%d)" % (total(peaks, "trials"),
                 total(peaks, "stopped")), str(total(bisection, "trials"))))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    for name, run in (("peaks", peaks), ("bisection", bisection)):
        lines.append("whole search, %s: %.0f s (exit status %d)" % (name, run["seconds"], run["status"]))
    same = all(by_card(peaks).get(c, {}).get("largest") == v for c, v in BEFORE["answers"].items())
    lines.append("before (issue 32): %d trials, %d s; same answers as before: %s"
                 % (BEFORE["trials"], BEFORE["seconds"], "yes" if same else "NO"))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description="gpumemhook fit on GPT-2, side by side and serial")
    parser.add_argument("--mode", choices=["both", "side", "serial", "search"], default="both")
    parser.add_argument("--range", default="1..64", help="the batch range, LO..HI")
    parser.add_argument("--save", help="write this run's results (JSON) here")
    parser.add_argument("--table", nargs="+", metavar="SAVED",
                        help="print the table from saved runs (side, then serial) and stop")
    args = parser.parse_args()
    if args.table:
        saved = [json.load(open(p)) for p in args.table]
        side = next((d.get("side") for d in saved if d.get("side")), None)
        serial = next((d.get("serial") for d in saved if d.get("serial")), None)
        accel = next((d.get("accelerate") for d in saved if d.get("accelerate")), {})
        print(table(side, serial, accel))
        return 0
    if args.mode == "search":
        peaks = fit(None, SEARCH_CARDS, args.range, "peaks")
        bisection = fit(None, SEARCH_CARDS, args.range, "bisection")
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "gpu_fit_search.json"), "w") as f:
                json.dump({"peaks": peaks, "bisection": bisection}, f, indent=1)
        print()
        print(search_table(peaks, bisection))
        return 0 if peaks["status"] == 0 and bisection["status"] == 0 else 1
    side = fit(None, CARDS, args.range) if args.mode in ("both", "side") else None
    serial = fit(1, CARDS, args.range) if args.mode in ("both", "serial") else None
    accel = accelerate_estimate()
    results = {"side": side, "serial": serial, "accelerate": accel}
    for path in filter(None, [args.save, os.path.join(os.environ["OUT"], "gpu_fit.json")
                              if os.environ.get("OUT") else None]):
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    print()
    print(table(side, serial, accel))
    failed = [r for r in (side, serial) if r and r["status"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

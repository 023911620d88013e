#!/usr/bin/env python3
"""Checks groups on a real GPU (issue 34, docs/groups.md): two PyTorch processes in one group under
`--emulate t4` (GPUMEMHOOK_GROUP, GPUMEMHOOK_EMULATE=t4):

1. one card for the group: the first process holds 9 GiB; the second's `torch.cuda.mem_get_info()`
   then shows the T4's total and a free figure that counts the first one's 9 GiB (and its context);
2. the group's out-of-memory where a real T4 runs out: the second then asks for 6 GiB more (fits a
   T4 alone, not beside the first) and is refused, with PyTorch's out-of-memory error;
3. the group's joint peak beside PEAK SUM: two processes without emulation, each a 10 GiB spike at a
   different time above 1 GiB it keeps: the group's peak is 12 GiB, the sum of their peaks 22 GiB.

Each process runs under LD_PRELOAD of the hook and prints one `RESULT {json}` line; the parent reads
the group with the `gpumemhook` CLI (`gpumemhook group NAME --json`) and prints a table last (and
writes $OUT/gpu_group.json when OUT is set).

    GPUMEMHOOK_LIB=dist/libgpumemhook.so GPUMEMHOOK_CLI=target/release/gpumemhook \\
        PYTHONPATH=/tmp/site python3 scripts/gpu/jobs/group.py
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

GIB = 1 << 30
T4 = 15360 << 20

MEMBER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch

    def result(**fields):
        print("RESULT " + json.dumps(fields), flush=True)

    def wait_for(path):
        while not os.path.exists(path):
            time.sleep(0.01)

    d, role = sys.argv[1], sys.argv[2]
    torch.cuda.init()
    if role == "first":
        held = torch.empty(9 << 30, dtype=torch.uint8, device="cuda")
        free, total = torch.cuda.mem_get_info()
        result(role=role, free=free, total=total)
        open(d + "/first.ready", "w").close()
        wait_for(d + "/end")
    elif role == "second":
        wait_for(d + "/first.ready")
        free, total = torch.cuda.mem_get_info()
        try:
            more = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
            refused = False
        except torch.OutOfMemoryError as e:
            refused = True
        result(role=role, free=free, total=total, refused=refused)
        open(d + "/end", "w").close()
    else:
        turn, nxt = sys.argv[3], sys.argv[4]
        kept = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        wait_for(d + "/" + turn)
        spike = torch.empty(10 << 30, dtype=torch.uint8, device="cuda")
        del spike
        torch.cuda.empty_cache()
        open(d + "/" + nxt, "w").close()
        wait_for(d + "/spikes.done")
        result(role=role)
    """
)


def cli() -> str:
    return os.environ.get("GPUMEMHOOK_CLI", "gpumemhook")


def member(d: str, group: str, args, emulate: bool) -> subprocess.Popen:
    env = dict(os.environ)
    env["LD_PRELOAD"] = os.environ["GPUMEMHOOK_LIB"]
    env["GPUMEMHOOK_GROUP"] = group
    env["GPUMEMHOOK_JOB"] = group
    env["GPUMEMHOOK_REPORT"] = os.path.join(d, "report.%p.json")
    env.pop("GPUMEMHOOK_EMULATE", None)
    if emulate:
        env["GPUMEMHOOK_EMULATE"] = "t4"
    script = os.path.join(d, "member.py")
    with open(script, "w") as f:
        f.write(MEMBER)
    return subprocess.Popen(
        [sys.executable, script, d] + list(args), env=env, stdout=subprocess.PIPE, text=True
    )


def result_of(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=300)
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    assert lines, out
    return json.loads(lines[-1][len("RESULT "):])


def group_figures(group: str) -> dict:
    out = subprocess.run([cli(), "group", group, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["devices"][0]


def emulated_card(d: str) -> dict:
    group = "gpu-group-t4-{}".format(os.getpid())
    first = member(d, group, ["first"], True)
    second = member(d, group, ["second"], True)
    b = result_of(second)
    a = result_of(first)
    return {"first": a, "second": b, "group": group_figures(group)}


def joint_peak(d: str) -> dict:
    group = "gpu-group-peak-{}".format(os.getpid())
    procs = [member(d, group, ["spike", "turn.{}".format(i), "turn.{}".format(i + 1)], False) for i in range(2)]
    open(os.path.join(d, "turn.0"), "w").close()
    while not os.path.exists(os.path.join(d, "turn.2")):
        time.sleep(0.01)
    figures = group_figures(group)
    ls = subprocess.run([cli(), "ls", "--by-job", "--json"], capture_output=True, text=True)
    open(os.path.join(d, "spikes.done"), "w").close()
    for p in procs:
        result_of(p)
    peaks = []
    for name in os.listdir(d):
        if name.startswith("report."):
            with open(os.path.join(d, name)) as f:
                devices = json.load(f)["devices"]
                peaks.extend(x["peak"] for x in devices if x["device"] == 0)
    rows = [r for r in json.loads(ls.stdout or "[]") if r.get("group") == group]
    return {"group": figures, "peak_sum": sum(peaks), "ls_row": rows[0] if rows else None}


def main() -> int:
    checks = []
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        card = emulated_card(d1)
        peak = joint_peak(d2)
    first, second = card["first"], card["second"]
    checks.append(("second's total is the T4's", second["total"] == T4, "{:.2f} GiB".format(second["total"] / GIB)))
    checks.append(
        (
            "second's free counts the first's 9 GiB",
            second["free"] <= T4 - 9 * GIB,
            "free {:.2f} GiB of {:.2f}".format(second["free"] / GIB, second["total"] / GIB),
        )
    )
    checks.append(("6 GiB more is refused (T4 full)", second["refused"], "refusals {}".format(card["group"]["refusals"])))
    g = peak["group"]
    checks.append(
        (
            "joint peak 12 GiB, not PEAK SUM 22 GiB",
            g["peak"] == 12 * GIB and peak["peak_sum"] == 22 * GIB,
            "peak {:.2f} GiB, PEAK SUM {:.2f} GiB".format(g["peak"] / GIB, peak["peak_sum"] / GIB),
        )
    )
    row = peak["ls_row"]
    checks.append(
        (
            "ls --by-job shows the joint peak",
            bool(row) and row["peak"] == g["peak"],
            "peak {} / peak_sum {}".format(row and row["peak"], row and row["peak_sum"]),
        )
    )
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_group.json"), "w") as f:
            json.dump({"card": card, "peak": peak}, f, indent=2)
    width = max(len(c[0]) for c in checks)
    print("{:<{w}}  {:<4}  {}".format("check", "ok", "figures", w=width))
    for name, ok, figures in checks:
        print("{:<{w}}  {:<4}  {}".format(name, "yes" if ok else "NO", figures, w=width))
    return 0 if all(c[1] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

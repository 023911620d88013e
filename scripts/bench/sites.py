#!/usr/bin/env python3
"""What a recorded Python call site costs (BENCHMARKS.md, issue 22), over the simulated CUDA stack:
`cudaMalloc`+`cudaFree` of 1 MiB from Python through `ctypes.CDLL` (which releases the GIL, as
PyTorch's operators do), PAIRS pairs, fastest of REPEATS repeats, in a fresh process per setting,
settings alternated ROUNDS times. Needs `cargo build --release` and `scripts/build/sim target/sim`.

    python3 scripts/bench/sites.py [--rounds 2] [--python /path/to/python3] [--instructions]

Prints ns per pair for each setting; a recorded site's cost is `python:0` minus `unset`. With
`--instructions`, counts instructions instead, under valgrind's callgrind (a machine too busy for
wall-clock differences of 100 ns): each setting at N and 2N pairs, one repeat, per pair the
difference divided by N, so that start-up cancels out."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAIRS = 20000
REPEATS = 7

CHILD = """
import ctypes, time
rt = ctypes.CDLL("libcudart.so.13")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]
p = ctypes.c_void_p()
malloc, free, ref = rt.cudaMalloc, rt.cudaFree, ctypes.byref(p)

def step():
    # Three frames deep, as a site of the default depth reads.
    def inner():
        for _ in range({pairs}):
            malloc(ref, 1 << 20)
            free(p)
    inner()

best = min(
    (lambda t0: (step(), time.perf_counter_ns() - t0)[1])(time.perf_counter_ns())
    for _ in range({repeats})
)
print(best / {pairs})
"""

SETTINGS = [
    ("no hook", None),
    ("hook, GPUMEMHOOK_STACKS unset", ""),
    ("hook, python:2MiB (every allocation below the threshold)", "python:2MiB"),
    ("hook, python:0 (every allocation records its site, depth 3)", "python:0"),
    ("hook, python:0:depth=1", "python:0:depth=1"),
]


def run(python: str, stacks, pairs: int = PAIRS, repeats: int = REPEATS, valgrind: bool = False) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEMHOOK_")}
    env["LD_LIBRARY_PATH"] = str(ROOT / "target" / "sim")
    env["GPUMEMHOOK_SHM_DIR"] = "/tmp"
    if stacks is not None:
        env["LD_PRELOAD"] = str(ROOT / "target" / "release" / "libgpumemhook.so")
        if stacks:
            env["GPUMEMHOOK_STACKS"] = stacks
    else:
        env.pop("LD_PRELOAD", None)
    command = [python, "-c", CHILD.format(pairs=pairs, repeats=repeats)]
    if valgrind:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + command
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    if valgrind:
        collected = [line for line in out.stderr.splitlines() if "Collected :" in line]
        return float(collected[-1].split(":")[-1])
    return float(out.stdout.split()[-1])


def instructions(python: str, stacks, n: int = 2000) -> float:
    """Instructions per pair: the difference between 2n and n pairs, over n."""
    return (run(python, stacks, 2 * n, 1, True) - run(python, stacks, n, 1, True)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--instructions", action="store_true")
    args = parser.parse_args()
    if args.instructions:
        print("| setting | instructions per pair |")
        print("| --- | --- |")
        for name, stacks in SETTINGS:
            print("| {} | {:.0f} |".format(name, instructions(args.python, stacks)))
        return
    results = {name: [] for name, _ in SETTINGS}
    for _ in range(args.rounds):
        for name, stacks in SETTINGS:
            results[name].append(run(args.python, stacks))
    print("| setting | ns per pair ({}) |".format(", ".join("run {}".format(i + 1) for i in range(args.rounds))))
    print("| --- | --- |")
    for name, values in results.items():
        print("| {} | {} |".format(name, ", ".join("{:.0f}".format(v) for v in values)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The pytest plugin on a real GPU (issue 21): `pytest --gpumem --gpumem-empty-cache` over a small
convolutional network's forward and backward at two batch sizes (scripts/gpu/plugin/cases/), each
test's exact peak beside PyTorch's own `max_memory_reserved()` growth in the same test.

pytest is started *without* the hook, as a user would start it: the plugin restarts it under the
hook (the script checks that the session says so). Then a budget run (budget_demo.py): one test
within its budget, one over it, whose failure message is shown.

Prints a table last: per test, the hook's peak, PyTorch's reserved growth, their difference, and
the modules other than PyTorch's allocator (libc10_cuda.so) holding memory at the test's end, which
should account for it (cuBLAS/cuDNN). Writes everything to $OUT/gpu_pytest.json when OUT is set.

    pip install --no-index --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 scripts/gpu/plugin/pytest_plugin.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = Path(__file__).resolve().parent / "cases"
MIB = 1 << 20
# The module PyTorch's caching allocator allocates from: its memory is what max_memory_reserved sees.
TORCH_ALLOCATOR_MODULE = "libc10_cuda.so"


def pytest_run(args, env):
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *args]
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done


def mib(n):
    return "{:.3f}".format(n / MIB)


def main() -> int:
    try:
        import torch
    except ImportError:
        print("gpu/plugin/pytest_plugin.py: PyTorch is not installed here; this script needs it and a CUDA GPU")
        return 2
    if not torch.cuda.is_available():
        print("gpu/plugin/pytest_plugin.py: no CUDA GPU visible to PyTorch; this script needs one")
        return 2
    import gpumemhook  # noqa: F401  (the plugin's package must be importable by the child pytest)

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    with tempfile.TemporaryDirectory() as tmp:
        hook_json = os.path.join(tmp, "gpumem.json")
        torch_json = os.path.join(tmp, "torch.json")
        done = pytest_run(
            [
                str(CASES / "test_convnet.py"),
                "--gpumem",
                "--gpumem-empty-cache",
                "--gpumem-json",
                hook_json,
                "--torch-figures",
                torch_json,
            ],
            env,
        )
        if done.returncode != 0:
            print("gpu/plugin/pytest_plugin.py: the convnet run failed (exit status {})".format(done.returncode))
            return 1
        restarted = "pytest restarted under the hook" in done.stdout
        hook = json.loads(Path(hook_json).read_text())
        figures = json.loads(Path(torch_json).read_text())

        budget = pytest_run(
            [str(CASES / "budget_demo.py"), "--gpumem", "--gpumem-empty-cache", "--gpumem-json", hook_json],
            env,
        )
        budget_rows = json.loads(Path(hook_json).read_text())["tests"]
    budget_message = [line for line in budget.stdout.splitlines() if line.startswith(("gpumem:", "  "))]

    rows = []
    for row in hook["tests"]:
        if row["device"] != 0:
            continue
        t = figures.get(row["nodeid"], {})
        others = [m for m in t.get("modules", []) if m["module"] != TORCH_ALLOCATOR_MODULE and m["used"]]
        rows.append(
            {
                "test": row["nodeid"].split("::")[-1],
                "hook_peak": row["peak"],
                "hook_leaked": row["leaked"],
                "torch_max_reserved_growth": t.get("max_reserved_growth"),
                "difference": row["peak"] - t.get("max_reserved_growth", 0),
                "other_modules": others,
                "outcome": row["outcome"],
            }
        )
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "restarted_under_the_hook": restarted,
        "convnet": rows,
        "budget_run_exit_status": budget.returncode,
        "budget_rows": budget_rows,
        "budget_message": budget_message,
    }
    if os.environ.get("OUT"):
        from gpumemhook import _native

        _native.write_file(os.path.join(os.environ["OUT"], "gpu_pytest.json"), json.dumps(result, indent=1).encode())

    print()
    print("budget run (budget_demo.py): exit status {} (1 expected: one test over its budget)".format(
        budget.returncode))
    for r in budget_rows:
        print("  {:<28} peak {:>10} MiB  leaked {:>8} MiB  {}".format(
            r["nodeid"].split("::")[-1], mib(r["peak"]), mib(r["leaked"]), r["outcome"]))
    for line in budget_message[:6]:
        print("  | " + line)
    print()
    print("{} ({}), PyTorch {}; pytest started without the hook, {}".format(
        result["device"], "device 0", result["torch"],
        "restarted under it by the plugin" if restarted else "NOT restarted under it (unexpected)"))
    print("{:<28} {:>14} {:>18} {:>12} {:>12}  {}".format(
        "test", "hook peak MiB", "torch reserved MiB", "diff MiB", "leaked MiB",
        "other modules holding memory at the end (MiB, growth in the test)"))
    for r in rows:
        others = ", ".join(
            "{} {} ({:+.3f})".format(m["module"], mib(m["used"]), m["growth"] / MIB) for m in r["other_modules"]
        ) or "-"
        growth = r["torch_max_reserved_growth"]
        print("{:<28} {:>14} {:>18} {:>12} {:>12}  {}".format(
            r["test"], mib(r["hook_peak"]), "?" if growth is None else mib(growth),
            mib(r["difference"]), mib(r["hook_leaked"]), others))
    return 0 if restarted and budget.returncode == 1 else 1


if __name__ == "__main__":
    sys.exit(main())

"""`gpumemhook kernel install | list | remove`: a real Jupyter kernel, installed by the CLI into a
prefix, started through jupyter_client from its spec (no LD_PRELOAD set by the test), runs cells
that allocate over the simulated stack; the cells read exact figures through the API, the fastai
layer and ``%load_ext gpumemhook``, and `gpumemhook ls` run from outside shows the kernel's pid with
the same bytes. Then `kernel list` shows the kernel and `kernel remove` removes it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import PRELUDE

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

MiB = 1 << 20


def _cli(cli_bin: Path, env: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(cli_bin), *args], env=env, capture_output=True, text=True, timeout=120
    )


def _execute(client, code: str) -> str:
    """Runs one cell in the kernel; returns what it printed; fails the test on an error in it."""
    printed: List[str] = []
    errors: List[str] = []

    def collect(msg) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            printed.append(content["text"])
        elif kind == "error":
            errors.append("\n".join(content["traceback"]))

    reply = client.execute_interactive(code, timeout=60, output_hook=collect)
    assert reply["content"]["status"] == "ok", "".join(printed) + "\n".join(errors)
    return "".join(printed)


def test_a_kernel_installed_by_the_cli_runs_cells_under_the_hook(runner, cli_bin, hook_lib, tmp_path):
    env = runner.env(hooked=False, extra={"GPUMEMHOOK_LIB": str(hook_lib), "NO_COLOR": "1"})
    prefix = tmp_path / "prefix"
    name = "gmh-test"
    done = _cli(
        cli_bin, env, "kernel", "install", "--prefix", str(prefix), "--python", sys.executable,
        "--name", name, "--limit", "64MiB",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'Installed kernel {} ("Python 3 (gpumemhook)")'.format(name) in done.stdout
    kernels = prefix / "share" / "jupyter" / "kernels"
    spec = json.loads((kernels / name / "kernel.json").read_text())
    assert spec["argv"][1:] == ["-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert spec["env"] == {"LD_PRELOAD": str(Path(hook_lib).resolve()), "GPUMEMHOOK_LIMIT": "{}B".format(64 * MiB)}

    # Jupyter finds the kernel by its name in the prefix; the hook comes from the spec alone.
    manager = KernelManager(
        kernel_name=name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)])
    )
    assert "LD_PRELOAD" not in env
    manager.start_kernel(env=env, cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        out = _execute(
            client,
            PRELUDE
            + "\nimport gpumemhook\n"
            + "held = [malloc(3 * MiB), malloc(5000)]\n"
            + "s = gpumemhook.stats(0)\n"
            + "print(os.getpid(), s.used, s.peak, s.limit, driver_used())\n",
        )
        pid, used, peak, limit, truth = (int(v) for v in out.split())
        assert (used, peak, limit) == (3 * MiB + 5000, 3 * MiB + 5000, 64 * MiB)
        assert used == truth

        # From outside: the kernel's process, its exact bytes.
        listing = _cli(cli_bin, env, "ls", "--json")
        assert listing.returncode == 0, listing.stderr
        mine = [p for p in json.loads(listing.stdout) if p["pid"] == pid]
        assert len(mine) == 1, listing.stdout
        assert (mine[0]["devices"][0]["used"], mine[0]["devices"][0]["limit"]) == (3 * MiB + 5000, 64 * MiB)
        table = _cli(cli_bin, env, "ls")
        assert re.search(r"^\s*{}\s".format(pid), table.stdout, re.M), table.stdout

        # The fastai/ipyexperiments layer and the per-cell reports, with no restart by hand.
        out = _execute(
            client,
            "from gpumemhook.mem import gpu_mem_get_used\n"
            "held.append(malloc(10 * MiB))\n"
            "print(gpu_mem_get_used())\n",
        )
        assert int(out) == 13  # MB, as fastai rounds: 13 MiB and 5000 bytes
        _execute(client, "%load_ext gpumemhook")
        out = _execute(client, "spike = malloc(40 * MiB); free(spike); held.append(malloc(2 * MiB))")
        # ipygpulogger's report: consumed, peaked above that, used (MB).
        assert re.search(r"GPU:\s+2\s+38\s+15 MB", out), out
        # The ceiling from the spec holds: 64 MiB, 15 MiB used.
        _execute(client, "malloc(60 * MiB, expect=2)")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)

    listed = _cli(cli_bin, env, "kernel", "list", "--prefix", str(prefix))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[:4] == [
        '{}  "Python 3 (gpumemhook)"'.format(name),
        "  spec:    {}".format(kernels / name / "kernel.json"),
        "  python:  {}".format(sys.executable),
        "  library: {}".format(Path(hook_lib).resolve()),
    ], listed.stdout
    assert "  GPUMEMHOOK_LIMIT={}B".format(64 * MiB) in listed.stdout.splitlines()

    removed = _cli(cli_bin, env, "kernel", "remove", "--prefix", str(prefix), "--name", name)
    assert removed.returncode == 0, removed.stderr
    assert not (kernels / name).exists()
    listed = _cli(cli_bin, env, "kernel", "list", "--prefix", str(prefix))
    assert listed.stdout.startswith("no gpumemhook kernels"), listed.stdout

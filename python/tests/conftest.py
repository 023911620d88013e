"""pytest fixtures for the Python package, over the simulated CUDA stack (tests/sim/README.md).

Every scenario runs as a separate Python process (the real interpreter, `sys.executable`) with
``LD_PRELOAD=<hook>``, ``LD_LIBRARY_PATH=<sim>`` (the stand-in libcuda/libcudart/NVML) and a
``GPUMEMHOOK_SHM_DIR`` of its own, so that tests never see each other's segments, and allocates
through ctypes on the stand-in ``libcudart.so.13``. The stand-in driver's ``fakecuda_used`` is the
truth the hook's numbers are compared with.

Needs the package importable in this interpreter (``maturin develop --release`` or ``pip install
.``); builds the simulated stack (``scripts/build/sim``) and, when missing, the hook
(``cargo build --release -p gpumemhook``). ``GPUMEMHOOK_LIB`` names another hook to test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")

try:
    import gpumemhook  # noqa: F401  (checked here so that a missing build says what to do)
except ImportError as e:  # pragma: no cover - a setup error, reported once
    pytest.exit(
        "gpumemhook is not importable ({}): build it into this interpreter first with "
        "`maturin develop --release` (or `pip install .`) at the repository root".format(e),
        returncode=4,
    )

# Where the package under test lives, so that child processes import the very same one.
PACKAGE_PARENT = str(Path(gpumemhook.__file__).resolve().parent.parent)

# Prepended to every scenario: allocation helpers over the stand-in runtime, and the driver's truth.
PRELUDE = '''
import ctypes, os, sys, threading, time
_rt = ctypes.CDLL("libcudart.so.13")
_rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
_rt.cudaFree.argtypes = [ctypes.c_void_p]
_rt.cudaSetDevice.argtypes = [ctypes.c_int]
_drv = ctypes.CDLL("libcuda.so.1")
_drv.fakecuda_used.restype = ctypes.c_ulonglong
_drv.fakecuda_used.argtypes = [ctypes.c_int]
MiB = 1 << 20

def malloc(nbytes, device=0, expect=0):
    assert _rt.cudaSetDevice(device) == 0
    p = ctypes.c_void_p()
    rc = _rt.cudaMalloc(ctypes.byref(p), nbytes)
    assert rc == expect, "cudaMalloc({}) returned {}, expected {}".format(nbytes, rc, expect)
    return p.value

def free(p):
    assert _rt.cudaFree(ctypes.c_void_p(p)) == 0

def driver_used(device=0):
    return _drv.fakecuda_used(device)

def touch(path):
    open(path, "w").close()

def wait_for(path, timeout=20.0):
    end = time.time() + timeout
    while not os.path.exists(path):
        assert time.time() < end, "timed out waiting for " + path
        time.sleep(0.005)
'''


def _run_checked(args, what: str) -> None:
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.exit("{} failed:\n{}{}".format(what, done.stdout, done.stderr), returncode=4)


@pytest.fixture(scope="session")
def sim_dir() -> Path:
    """The simulated CUDA stack, built once per session (idempotent, atomic)."""
    out = TARGET / "sim"
    _run_checked([str(ROOT / "scripts" / "build" / "sim"), str(out)], "scripts/build/sim")
    return out


@pytest.fixture(scope="session")
def hook_lib() -> Path:
    """The preload library under test: $GPUMEMHOOK_LIB, or target/release/libgpumemhook.so."""
    override = os.environ.get("GPUMEMHOOK_LIB")
    if override:
        return Path(override)
    lib = TARGET / "release" / "libgpumemhook.so"
    if not lib.is_file():
        _run_checked(
            ["cargo", "build", "--release", "--quiet", "-p", "gpumemhook"],
            "cargo build --release -p gpumemhook",
        )
    return lib


# A pod without hostPID, as far as pids go: a pid namespace of its own with its own /proc, the files
# (and the segment directory) shared with the node. Needs root.
POD = ["unshare", "--pid", "--fork", "--mount-proc"]


def pods_supported() -> bool:
    """Whether `POD` runs here (root, and a kernel that allows it)."""
    done = subprocess.run(POD + ["true"], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return done.returncode == 0


class Runner:
    """Runs Python scenarios in child processes, hooked or not, over the simulated stack."""

    def __init__(self, sim: Path, hook: Path, shm: Path, scratch: Path) -> None:
        self.sim = sim
        self.hook = hook
        self.shm = shm
        self.scratch = scratch
        self._count = 0

    def env(self, hooked: bool = True, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUMEMHOOK_", "FAKECUDA_", "FAKENVML_", "FAKECUDART_"))
            and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH")
        }
        env["LD_LIBRARY_PATH"] = str(self.sim)
        env["GPUMEMHOOK_SHM_DIR"] = str(self.shm)
        # Always the stand-in NVML, by path: a real one on the host must not leak in.
        env["GPUMEMHOOK_NVML_LIB"] = str(self.sim / "libnvidia-ml.so.1")
        env["PYTHONPATH"] = PACKAGE_PARENT
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONWARNINGS"] = "default"
        if hooked:
            env["LD_PRELOAD"] = str(self.hook)
        env.update(extra or {})
        return env

    def script(self, code: str) -> Path:
        self._count += 1
        path = self.scratch / "scenario{}.py".format(self._count)
        path.write_text(PRELUDE + textwrap.dedent(code))
        return path

    def start(
        self, code: str, hooked: bool = True, env: Optional[Dict[str, str]] = None, pod: bool = False
    ) -> subprocess.Popen:
        args = [sys.executable, str(self.script(code))]
        child_env = self.env(hooked, env)
        if pod:
            # The hook on the pod's program only: `unshare`, like a container runtime, runs without.
            preload = child_env.pop("LD_PRELOAD", None)
            args = POD + ["env"] + (["LD_PRELOAD=" + preload] if preload else []) + args
        return subprocess.Popen(
            args,
            cwd=str(self.scratch),
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(
        self,
        code: str,
        hooked: bool = True,
        env: Optional[Dict[str, str]] = None,
        expect_rc: int = 0,
        timeout: float = 60,
        pod: bool = False,
    ) -> subprocess.CompletedProcess:
        proc = self.start(code, hooked, env, pod)
        out, err = proc.communicate(timeout=timeout)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert done.returncode == expect_rc, "exit {} (expected {})\n--- stdout\n{}--- stderr\n{}".format(
            done.returncode, expect_rc, out, err
        )
        return done


@pytest.fixture
def runner(sim_dir: Path, hook_lib: Path, tmp_path: Path) -> Runner:
    shm = tmp_path / "shm"
    shm.mkdir()
    return Runner(sim_dir, hook_lib, shm, tmp_path)


@pytest.fixture(scope="session")
def cli_bin() -> Path:
    """The `gpumemhook` command of this checkout, built (or brought up to date) once."""
    done = subprocess.run(
        ["cargo", "build", "--release", "--quiet", "-p", "gpumemhook-cli"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return TARGET / "release" / "gpumemhook"


@pytest.fixture
def timeline_events(cli_bin):
    """Reads a recorded timeline as the events of its Chrome JSON (`gpumemhook export --chrome`)."""

    def read(trace: Path) -> list:
        done = subprocess.run(
            [str(cli_bin), "export", str(trace), "--chrome", "/dev/stdout"],
            capture_output=True,
            check=True,
        )
        return json.loads(done.stdout)["traceEvents"]

    return read


def pytest_terminal_summary(terminalreporter) -> None:
    """Says how many of the pages' command blocks ran and how many were skipped, by reason."""
    docs = sys.modules.get("test_docs")
    if docs is None or not (docs.RAN or docs.SKIPPED):
        return
    skipped = ", ".join("{} {}".format(n, reason) for reason, n in sorted(docs.SKIPPED.items()))
    terminalreporter.write_line(
        "docs: {} command blocks of README.md and docs/ ran; {} skipped ({})".format(
            len(docs.RAN), sum(docs.SKIPPED.values()), skipped or "none"
        )
    )
    docs.write_updates()

"""Python call sites with the GIL released: `GPUMEMHOOK_STACKS=python:<bytes>[:depth=<n>]` reads the
allocating thread's own frames from CPython's memory (interceptor/src/cpython.rs), so allocations
made through `ctypes.CDLL`, which releases the GIL as PyTorch's operators do, name their line, over
the simulated CUDA stack. Every CPython that pyenv installed on this machine is tried too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

# `ctypes.CDLL` releases the GIL during the call, as PyTorch, JAX and CuPy do before they allocate.
ALLOCATE = """
lib = ctypes.CDLL("libfakecollective.so")
lib.fakecollective_rt_alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
lib.fakecollective_alloc_on_thread.argtypes = [
    ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_char_p]

def allocate(nbytes):
    p = ctypes.c_void_p()
    assert lib.fakecollective_rt_alloc(ctypes.byref(p), nbytes) == 0  # ALLOCATE
    return p.value
"""


def live_sites(report: Path) -> Dict[int, Optional[str]]:
    return {a["bytes"]: a.get("site") for a in json.loads(report.read_text())["live"]}


def line_of(script: Path, marker: str) -> int:
    """The line of `script` that carries `# <marker>`: what a site must name."""
    lines = script.read_text().splitlines()
    hits = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith("# " + marker)]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def frames(site: str) -> List[str]:
    return site.split(" < ")


def run_with_sites(runner, code: str, tmp_path: Path, setting: str, python: Optional[str] = None):
    """Runs `code` hooked with `GPUMEMHOOK_STACKS=setting` (under `python`, default this interpreter);
    returns (script, completed process, live sites)."""
    report = tmp_path / "report.json"
    script = runner.script(ALLOCATE + code)
    env = runner.env(True, {"GPUMEMHOOK_STACKS": setting, "GPUMEMHOOK_REPORT": str(report)})
    if python is not None:
        env.pop("PYTHONPATH", None)  # the package is built for this interpreter only
    done = subprocess.run(
        [python or sys.executable, str(script)],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return script, done, live_sites(report)


def test_the_exact_line_and_function_with_the_gil_released_on_the_main_thread_and_another(
    runner, tmp_path
):
    script, done, sites = run_with_sites(
        runner,
        """
def build_model():
    return allocate(2 * MiB)  # BUILD

model = build_model()
worker = threading.Thread(target=lambda: keep.append(allocate(3 * MiB)), name="loader")  # THREAD
keep = []
worker.start()
worker.join()
""",
        tmp_path,
        "python:1MiB:depth=2",
    )
    at = line_of(script, "ALLOCATE")
    assert frames(sites[2 << 20]) == [
        "{}:{} in allocate".format(script, at),
        "{}:{} in build_model".format(script, line_of(script, "BUILD")),
    ], sites
    assert frames(sites[3 << 20]) == [
        "{}:{} in allocate".format(script, at),
        "{}:{} in <lambda>".format(script, line_of(script, "THREAD")),
    ], sites
    assert "gpumemhook" not in done.stderr, done.stderr


def test_nested_calls_are_kept_to_the_configured_depth_and_small_ones_not_at_all(runner, tmp_path):
    code = """
def a(): return allocate(1 * MiB)  # A
def b(): return a()  # B
def c(): return b()  # C
def d(): return c()  # D
def e(): return d()
e()
allocate(1000)
"""
    for depth, expected in ((4, ["allocate", "a", "b", "c"]), (1, ["allocate"])):
        script, _, sites = run_with_sites(runner, code, tmp_path, "python:4096B:depth={}".format(depth))
        got = frames(sites[1 << 20])
        assert [f.rsplit(" in ", 1)[1] for f in got] == expected, got
        lines = [line_of(script, m) for m in ("ALLOCATE", "A", "B", "C")][:depth]
        assert [int(f.rsplit(" in ", 1)[0].rsplit(":", 1)[1]) for f in got] == lines, got
        assert sites[1000] is None, "below the threshold: no site"


def test_a_thread_without_python_frames_is_named(runner, tmp_path):
    _, _, sites = run_with_sites(
        runner,
        """
p = ctypes.c_void_p()
assert lib.fakecollective_alloc_on_thread(ctypes.byref(p), 5 * MiB, b"nccl-proxy") == 0
""",
        tmp_path,
        "python:1MiB",
    )
    assert sites[5 << 20] == "no Python frame, thread 'nccl-proxy'", sites


def test_an_interpreter_whose_layout_is_unknown_is_said_once_and_records_no_site(runner, tmp_path):
    _, done, sites = run_with_sites(
        runner,
        "allocate(1 * MiB)\nallocate(2 * MiB)\n",
        tmp_path,
        "python:0",
    )
    assert sites[1 << 20] is not None
    env = {"GPUMEMHOOK_TEST_PYTHON_VERSION": "3.99.0"}
    report = tmp_path / "unknown.json"
    env.update({"GPUMEMHOOK_STACKS": "python:0", "GPUMEMHOOK_REPORT": str(report)})
    done = runner.run(ALLOCATE + "allocate(1 * MiB)\nallocate(2 * MiB)\nprint('ran')\n", env=env)
    assert done.stdout == "ran\n"
    said = [line for line in done.stderr.splitlines() if "GPUMEMHOOK_STACKS" in line]
    assert len(said) == 1 and "3.99" in said[0] and "no call sites" in said[0], done.stderr
    assert set(live_sites(report).values()) == {None}


def pyenv_pythons(minors) -> List[str]:
    found = []
    for minor in minors:
        versions = sorted(Path("/root/.pyenv/versions").glob("3.{}.*".format(minor)))
        found += [str(v / "bin" / "python3") for v in versions if (v / "bin" / "python3").exists()]
    return found


@pytest.mark.parametrize("python", pyenv_pythons(range(9, 14)) or [None])
def test_every_installed_cpython_names_the_line(runner, tmp_path, python):
    if python is None:
        pytest.skip("no pyenv CPython on this machine (only the running interpreter is tried)")
    script, done, sites = run_with_sites(
        runner,
        "def step():\n    return allocate(2 * MiB)  # STEP\nstep()\n",
        tmp_path,
        "python:1MiB",
        python=python,
    )
    assert frames(sites[2 << 20])[:2] == [
        "{}:{} in allocate".format(script, line_of(script, "ALLOCATE")),
        "{}:{} in step".format(script, line_of(script, "STEP")),
    ], (python, sites, done.stderr)


@pytest.mark.parametrize("python", pyenv_pythons(range(6, 9)) or [None])
def test_an_older_cpython_is_said_once_and_runs_on(runner, tmp_path, python):
    if python is None:
        pytest.skip("no CPython older than 3.9 on this machine")
    _, done, sites = run_with_sites(
        runner, "allocate(2 * MiB)\nallocate(3 * MiB)\n", tmp_path, "python:1MiB", python=python
    )
    assert done.stderr.count("no call sites will be recorded") == 1, done.stderr
    assert set(sites.values()) == {None}


def test_sites_on_the_timeline_and_in_the_out_of_memory_report(runner, tmp_path, timeline_events):
    trace, oom = tmp_path / "trace.json", tmp_path / "oom.json"
    done = runner.run(
        ALLOCATE
        + """
def grow():
    return allocate(2 * MiB)  # GROW

def too_much():
    p = ctypes.c_void_p()
    assert lib.fakecollective_rt_alloc(ctypes.byref(p), 8 * MiB) == 2  # REFUSED

grow()
too_much()
""",
        env={
            "GPUMEMHOOK_STACKS": "python:1MiB:depth=1",
            "GPUMEMHOOK_TRACE": str(trace),
            "GPUMEMHOOK_OOM_REPORT": str(oom),
            "GPUMEMHOOK_LIMIT": "4MiB",
        },
    )
    script = Path(done.args[1])
    events = timeline_events(trace)
    allocs = [e for e in events if e.get("cat") == "alloc"]
    assert [e["args"].get("site") for e in allocs] == [
        "{}:{} in allocate".format(script, line_of(script, "ALLOCATE"))
    ], allocs
    failed = json.loads(oom.read_text())["oom"]
    assert failed["site"] == "{}:{} in too_much".format(script, line_of(script, "REFUSED")), failed
    denied = [e for e in events if e.get("cat") == "denied"]
    assert [e["args"].get("site") for e in denied] == [failed["site"]], denied


def test_the_per_site_breakdown_holds_each_sites_bytes_and_peak_and_adds_up(runner, tmp_path):
    report = tmp_path / "report.json"
    done = runner.run(
        ALLOCATE
        + """
import gpumemhook

def weights():
    held = []
    for _ in range(3):
        held.append(allocate(2 * MiB))  # WEIGHTS
    return held

def scratch():
    return allocate(4 * MiB)  # SCRATCH

w = weights()
s = scratch()
_rt.cudaFree(ctypes.c_void_p(s))
rows = gpumemhook.breakdown(by="site")
modules = dict((m, used) for m, used, _, _ in gpumemhook.breakdown(0))
print(repr(rows))
print(repr(modules))
try:
    gpumemhook.breakdown(0, by="site")
except ValueError as e:
    print("ValueError", e)
""",
        env={"GPUMEMHOOK_STACKS": "python:1MiB:depth=2", "GPUMEMHOOK_REPORT": str(report)},
    )
    lines = done.stdout.splitlines()
    rows, modules = eval(lines[0]), eval(lines[1])
    script = Path(done.args[1])
    at = "{}:{} in allocate".format(script, line_of(script, "ALLOCATE"))
    weights = "{} < {}:{} in weights".format(at, script, line_of(script, "WEIGHTS"))
    by_site = {site: (used, peak, allocs) for site, used, peak, allocs in rows}
    assert len(by_site) == 2, rows
    assert by_site[weights] == (6 << 20, 6 << 20, 3), rows
    scratch_site = "{} < {}:{} in scratch".format(at, script, line_of(script, "SCRATCH"))
    assert by_site[scratch_site] == (0, 4 << 20, 0), rows
    # Every allocation here is at or above the threshold: the sites add up to the module's bytes.
    assert sum(used for _, used, _, _ in rows) == modules["libfakecollective.so"], (rows, modules)
    assert lines[2].startswith("ValueError"), lines
    r = json.loads(report.read_text())
    assert [(s["site"], s["used"], s["peak"], s["live_allocs"]) for s in r["by_site"]] == [
        (weights, 6 << 20, 6 << 20, 3), (scratch_site, 0, 4 << 20, 0)], r["by_site"]
    cli = runner.hook.parent / "gpumemhook"
    text = subprocess.run([str(cli), "report", "--by-site", str(report)], capture_output=True,
                          text=True, check=True).stdout
    assert "by Python call site" in text and scratch_site in text, text


def test_another_process_reads_the_sites_from_the_segment_in_top(runner, tmp_path, cli_bin):
    # `top` runs in another process: the sites' texts and figures come from the hooked process's
    # segment (layout 2.2), not from a report it writes at exit.
    go = tmp_path / "go"
    proc = runner.start(
        ALLOCATE
        + """
def load_weights():
    held = []
    for _ in range(3):
        held.append(allocate(2 * MiB))  # WEIGHTS
    return held

def activations():
    return allocate(5 * MiB)  # ACTIVATIONS

w = load_weights()
a = activations()
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
""".replace("sys.argv[1]", repr(str(go))),
        env={"GPUMEMHOOK_STACKS": "python:1MiB:depth=2"},
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        script = Path(proc.args[1])
        at = "{}:{} in allocate".format(script, line_of(script, "ALLOCATE"))
        env = runner.env(hooked=False)
        done = subprocess.run([str(cli_bin), "top", "--once", "--by-site"], env=env,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        weights = "{} < {}:{} in load_weights".format(at, script, line_of(script, "WEIGHTS"))
        acts = "{} < {}:{} in activations".format(at, script, line_of(script, "ACTIVATIONS"))
        weights_row = [l for l in lines if l.rstrip().endswith(weights)]
        acts_row = [l for l in lines if l.rstrip().endswith(acts)]
        assert len(weights_row) == 1 and len(acts_row) == 1, done.stdout
        assert weights_row[0].split()[:5] == ["6.00", "MiB", "6.00", "MiB", "3"], weights_row
        assert acts_row[0].split()[:5] == ["5.00", "MiB", "5.00", "MiB", "1"], acts_row
        # Largest first, under the process's own line.
        assert lines.index(weights_row[0]) < lines.index(acts_row[0]), done.stdout
        assert "pid {}:".format(proc.pid) in lines, done.stdout
    finally:
        go.touch()
        proc.communicate(timeout=30)

"""The pytest plugin (`pytest --gpumem`, the `gpumem` marker), run as the user runs it: a pytest
session in a child process (pytester) over the simulated CUDA stack, its tests allocating through
ctypes, started under the hook or restarting itself under it, alone or with 2 xdist workers."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import PRELUDE

import gpumemhook

pytest_plugins = ["pytester"]

XDIST_INSTALLED = importlib.util.find_spec("xdist") is not None

MiB = 1 << 20

# The stand-in allocator of the simulated tests, with a "framework" whose caching allocator keeps
# what it frees until `torch.cuda.empty_cache()`: the module is named `torch` in sys.modules, which
# is all the plugin looks at.
HELPERS = PRELUDE + '''
import types

class _Cuda:
    def __init__(self):
        self.cached = []
    def is_initialized(self):
        return True
    def synchronize(self):
        pass
    def empty_cache(self):
        while self.cached:
            free(self.cached.pop())
    def cache(self, nbytes):
        """A block the program freed and the caching allocator keeps."""
        self.cached.append(malloc(nbytes))

torch = types.ModuleType("torch")
torch.cuda = _Cuda()
sys.modules["torch"] = torch

def collective_alloc(nbytes):
    """An allocation made with the GIL held (ctypes.PyDLL), so that its Python site is recorded."""
    assert _rt.cudaSetDevice(0) == 0
    lib = ctypes.PyDLL("libfakecollective.so")
    lib.fakecollective_alloc.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    p = ctypes.c_uint64()
    assert lib.fakecollective_alloc(ctypes.byref(p), nbytes) == 0
    return p.value
'''


@pytest.fixture
def session(pytester, runner, monkeypatch):
    """A pytester whose child sessions run over the simulated stack with a segment directory of
    their own, not under the hook: `hooked()` puts them under it."""
    env = runner.env(hooked=False, extra={"GPUMEMHOOK_LIB": str(runner.hook)})
    for key in list(os.environ):
        if key not in env:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile(gpu=HELPERS)
    pytester.hooked = lambda: monkeypatch.setenv("LD_PRELOAD", str(runner.hook))
    return pytester


def run(pytester, *args: str) -> Tuple[pytest.RunResult, Dict]:
    """Runs pytest with `args` (and --gpumem-json); its outcome and the JSON document."""
    out = pytester.path / "gpumem.json"
    if out.exists():
        out.unlink()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gpumem-json", str(out), *args)
    doc = json.loads(out.read_text()) if out.exists() else {}
    return result, doc


def rows(doc: Dict) -> Dict[Tuple[str, int], Tuple[int, int, str]]:
    return {
        (r["nodeid"].split("::")[-1], r["device"]): (r["peak"], r["leaked"], r["outcome"])
        for r in doc["tests"]
    }


FIGURES = """
import pytest
from gpu import malloc, free, MiB

kept = []

@pytest.fixture
def workspace():
    w = malloc(2 * MiB)           # setup: 2 MiB, held through the call
    yield
    spike = malloc(5 * MiB)       # teardown: a 5 MiB spike above the 2 MiB
    free(spike)
    free(w)

def test_spike_then_keep():
    a = malloc(3 * MiB)
    free(a)
    kept.append(malloc(1 * MiB))  # left behind

def test_setup_and_teardown_count(workspace):
    b = malloc(1 * MiB)
    free(b)

def test_two_devices():
    a = malloc(4 * MiB, device=1)
    b = malloc(1 * MiB, device=0)
    free(a)
    kept.append(b)

def test_frees_what_an_earlier_test_kept():
    free(kept.pop(0))

def test_no_gpu():
    import os
    # A restarted pytest keeps its restart to itself: what the tests start is no restart.
    assert "GPUMEMHOOK_PYTEST_RESTARTED" not in os.environ

@pytest.mark.skip(reason="not today")
def test_skipped():
    malloc(MiB)
"""

EXPECTED = {
    ("test_spike_then_keep", 0): (3 * MiB, 1 * MiB, "passed"),
    # 2 MiB from setup on, then 5 MiB more in teardown: 7 MiB above the start, nothing left.
    ("test_setup_and_teardown_count", 0): (7 * MiB, 0, "passed"),
    ("test_two_devices", 0): (1 * MiB, 1 * MiB, "passed"),
    ("test_two_devices", 1): (4 * MiB, 0, "passed"),
    # Freed what it did not make: no peak above its start, nothing left behind.
    ("test_frees_what_an_earlier_test_kept", 0): (0, 0, "passed"),
}


def test_exact_peaks_and_leaks_per_test_and_device_started_under_the_hook(session):
    session.hooked()
    session.makepyfile(test_figures=FIGURES)
    result, doc = run(session, "--gpumem", "-v")
    result.assert_outcomes(passed=5, skipped=1)
    assert rows(doc) == EXPECTED
    assert doc["format"] == "gpumemhook-pytest" and doc["version"] == gpumemhook.__version__
    assert sorted(n.split("::")[-1] for n in doc["without_activity"]) == ["test_no_gpu", "test_skipped"]
    result.stdout.fnmatch_lines(["gpumem: exact GPU memory per test; pytest started under the hook"])
    # The summary: largest peak first, with the note on caches.
    result.stdout.fnmatch_lines(
        [
            "*gpumem: largest GPU memory peaks per test*",
            "*PEAK*LEAKED*DEVICE*OUTCOME*TEST",
            "*7.00 MiB*0 B*0*passed*test_setup_and_teardown_count",
            "*4.00 MiB*0 B*1*passed*test_two_devices",
            "cached memory counts:*--gpumem-empty-cache*",
        ]
    )


def test_started_without_the_hook_pytest_restarts_under_it_with_the_same_figures(session):
    session.makepyfile(test_figures=FIGURES)
    result, doc = run(session, "--gpumem", "-v")
    result.assert_outcomes(passed=5, skipped=1)
    assert rows(doc) == EXPECTED
    result.stdout.fnmatch_lines(
        ["gpumem: exact GPU memory per test; pytest restarted under the hook (LD_PRELOAD=*libgpumemhook.so*)"]
    )
    # Restarted once, before anything ran: the session's header appears once.
    assert result.stdout.str().count("test session starts") == 1
    # In its own group, alone: the session's peak is pytest's own, which the summary leaves out.
    # Its name ends in a random token (no other user can make a file there first), and the group
    # file goes with the session.
    assert re.fullmatch(r"pytest-\d+-[0-9a-f]{16}", doc["session"]["group"]), doc["session"]
    shm = Path(os.environ["GPUMEMHOOK_SHM_DIR"])
    assert not [p for p in shm.iterdir() if "-pytest-" in p.name and p.name.startswith("gpumemhook-group-")]
    assert [d["device"] for d in doc["session"]["devices"]] == [0, 1]
    assert all(d["joint"] and d["peak"] > 0 for d in doc["session"]["devices"])
    assert "session peak" not in result.stdout.str()


def test_a_file_planted_at_the_old_predictable_group_name_changes_nothing(session):
    """Another user could make `pytest-<pid>` first (the pid is easy to guess): a directory there,
    made by the shell that then becomes pytest (`exec` keeps the pid), does not stop the session."""
    session.makepyfile(test_figures=FIGURES)
    shm = os.environ["GPUMEMHOOK_SHM_DIR"]
    out = session.path / "gpumem.json"
    planted = 'mkdir "{}/gpumemhook-group-{}-pytest-$$" && exec "$@"'.format(shm, os.getuid())
    result = session.run(
        "sh", "-c", planted, "sh", sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
        "--gpumem", "--gpumem-json", str(out), "test_figures.py",
    )
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    doc = json.loads(out.read_text())
    assert re.fullmatch(r"pytest-\d+-[0-9a-f]{16}", doc["session"]["group"]), doc["session"]


def test_without_the_hook_and_no_way_to_restart_one_line_says_how(session, monkeypatch):
    session.makepyfile(test_figures=FIGURES)
    # pytest called as a function from another program: its process is not pytest's to restart.
    script = session.makepyfile(
        runner_script="import sys, pytest\nsys.exit(pytest.main(['--gpumem', 'test_figures.py']))\n"
    )
    result = session.run(sys.executable, str(script))
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        ["ERROR: gpumemhook: --gpumem needs the hook in this process*gpumemhook run -- pytest*"]
    )
    # Restarted, but the hook counts nothing (disabled): stops instead of restarting again.
    monkeypatch.setenv("GPUMEMHOOK_DISABLE", "1")
    result, _ = run(session, "--gpumem")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: gpumemhook: pytest was restarted under the hook*GPUMEMHOOK_DISABLE*"])


def test_without_the_option_the_plugin_does_nothing(session):
    session.makepyfile(test_figures=FIGURES)
    result = session.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, skipped=1)
    assert "gpumem:" not in result.stdout.str()  # no header line, no summary


BUDGETS = """
import pytest
from gpu import malloc, free, collective_alloc, MiB

kept = []

@pytest.mark.gpumem(peak="3MiB", leak="0B")
def test_within_budget():
    free(malloc(3 * MiB))

@pytest.mark.gpumem(peak="2MiB")
def test_over_the_peak_budget():
    free(malloc(3 * MiB))

def build_weights():
    return collective_alloc(2 * MiB)

@pytest.mark.gpumem(leak="1MiB")
def test_over_the_leak_budget():
    kept.append(build_weights())
    kept.append(malloc(MiB // 2))

@pytest.mark.gpumem(peak="1MiB", device=1)
def test_budget_of_another_device():
    free(malloc(3 * MiB, device=0))
"""


def test_budgets_pass_and_fail_naming_figure_budget_modules_and_allocations(session, monkeypatch):
    session.hooked()
    session.makepyfile(test_budgets=BUDGETS)
    monkeypatch.setenv("GPUMEMHOOK_STACKS", "python:1MiB")
    result, doc = run(session, "--gpumem")
    # A peak over its budget fails the test when its call ends; what a test leaves behind is known
    # only once its teardown ran, so a leak over its budget is an error at teardown.
    result.assert_outcomes(passed=3, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_over_the_leak_budget*"])
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "gpumem: peak on device 0 was 3.00 MiB (3145728 bytes), over the budget of 2.00 MiB "
            '(peak="2MiB" in the gpumem marker)',
            "  held on device 0 when the call ended, by module (change during the test): nothing",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "gpumem: leaked on device 0 was 2.50 MiB (2621440 bytes), over the budget of 1.00 MiB "
            '(leak="1MiB" in the gpumem marker)',
            "  held on device 0 at the end, by module (change during the test): "
            "libfakecollective.so 2.00 MiB (+2.00 MiB), libcudart.so.13 512.0 KiB (+512.0 KiB)",
            "  largest allocations still held on device 0:",
            # The innermost frame first, then its callers (GPUMEMHOOK_STACKS' depth).
            "*2.00 MiB  libfakecollective.so  0x*  made during this test  at *gpu.py:* in "
            "collective_alloc < *test_budgets.py:* in build_weights < *",
            "*512.0 KiB  libcudart.so.13  0x*  made during this test",
        ]
    )
    assert "test_budget_of_another_device" not in out.split("short test summary")[-1]
    figures = rows(doc)
    assert figures[("test_over_the_peak_budget", 0)] == (3 * MiB, 0, "failed")
    assert figures[("test_over_the_leak_budget", 0)] == (2 * MiB + MiB // 2, 2 * MiB + MiB // 2, "failed")
    assert figures[("test_within_budget", 0)] == (3 * MiB, 0, "passed")


PEAK_AT_A_LINE = """
import ctypes
import pytest
from gpu import collective_alloc, MiB

def build_weights():
    return collective_alloc(3 * MiB)

def release(p):
    assert ctypes.PyDLL("libfakecollective.so").fakecollective_free(ctypes.c_uint64(p)) == 0

@pytest.mark.gpumem(peak="2MiB")
def test_peak_at_a_line():
    release(build_weights())

@pytest.mark.gpumem(peak="2MiB")
@pytest.mark.parametrize("run", [1, 2])
def test_twice(run):
    release(build_weights())
"""


def test_a_peak_over_budget_names_the_python_lines_that_held_it_or_the_flag_that_would(session):
    session.makepyfile(test_peak=PEAK_AT_A_LINE)
    # --gpumem-sites: pytest restarts under the hook recording sites, and the failure names the line
    # behind the peak, though nothing is held any more when the call ends.
    result, _ = run(session, "--gpumem-sites")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*_ test_peak_at_a_line _*",
            "gpumem: peak on device 0 was 3.00 MiB (3145728 bytes), over the budget of 2.00 MiB*",
            "  held on device 0 when the call ended, by module (change during the test): nothing",
            "  Python lines that held the most during the test (all devices; their most, above "
            "what they held at its start):",
            "*3.00 MiB  *gpu.py:* in collective_alloc < *test_peak.py:* in build_weights < "
            "*test_peak.py:* in test_peak_at_a_line",
            # A line's most is kept from the start of the process: the same lines (the same test,
            # parametrized) reaching the same most again are not told apart from lines that did not
            # run, and the failure says so.
            "*_ test_twice?1? _*",
            "*3.00 MiB  *gpu.py:* in collective_alloc < *test_peak.py:* in build_weights < "
            "*test_peak.py:* in test_twice",
            "*_ test_twice?2? _*",
            "  held on device 0 when the call ended, by module (change during the test): nothing",
            "  no Python line held more during the test than it had held before it*",
        ]
    )
    # Without sites recorded: the failure says which flag would name the lines.
    result, _ = run(session, "--gpumem")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "  held on device 0 when the call ended, by module (change during the test): nothing",
            "  the Python lines behind it are not recorded: --gpumem-sites (or "
            "GPUMEMHOOK_STACKS=python:1MiB) names them",
        ]
    )
    # Started under the hook without sites, --gpumem-sites cannot record them: a usage error.
    session.hooked()
    result, _ = run(session, "--gpumem-sites")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: gpumemhook: --gpumem-sites: *GPUMEMHOOK_STACKS*"])


UNCHECKED = "gpumem: 4 budgets not checked (this pytest runs without the hook); `pytest --gpumem` checks them"


def test_a_marker_without_the_hook_runs_its_test_unchecked_and_says_so_once(session):
    session.makepyfile(test_budgets=BUDGETS)
    # Plain pytest: the budgets cannot be checked, the run goes on, and the summary says so once.
    result = session.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0
    result.assert_outcomes(passed=4)
    assert result.stdout.str().count("not checked") == 1
    result.stdout.fnmatch_lines([UNCHECKED])
    assert "largest GPU memory peaks" not in result.stdout.str()
    # The same over xdist workers: the count reaches the controller.
    if XDIST_INSTALLED:
        result = session.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
        assert result.ret == 0
        result.stdout.fnmatch_lines([UNCHECKED])
    # --gpumem-strict: CI that wants every budget checked stops, before any test runs.
    result = session.runpytest_subprocess("-p", "no:cacheprovider", "--gpumem-strict")
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        [
            "ERROR: gpumemhook: test_budgets.py::test_within_budget has a gpumem marker, whose "
            "budget needs the hook in this process (--gpumem-strict): run `pytest --gpumem ...`*"
        ]
    )
    # Only the tests that run need the hook.
    result = session.runpytest_subprocess("-p", "no:cacheprovider", "--gpumem-strict", "-k", "not budget")
    result.assert_outcomes(deselected=4)
    # Under the hook the markers are checked, --gpumem or not: two budgets fail.
    session.hooked()
    result = session.runpytest_subprocess("-p", "no:cacheprovider", "--gpumem-strict")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    assert "not checked" not in result.stdout.str()


@pytest.mark.parametrize(
    "marker, complaint",
    [
        ('peak="1.5 parsecs"', 'peak="1.5 parsecs" is not a size (unknown unit)*'),
        ("leak=-1", "leak=-1 is not a number of bytes*"),
        ('peak="100"', "peak=100 what? write 100GiB, or 100B for bytes*"),
        ('peek="1GiB"', "unknown argument peek*"),
        ('"1GiB"', "positional arguments*"),
        ('peak="1GiB", device="0"', "device='0' is not a device number*"),
    ],
)
def test_a_bad_marker_is_a_usage_error_naming_it(session, marker, complaint):
    session.hooked()
    session.makepyfile(
        test_bad="import pytest\n@pytest.mark.gpumem({})\ndef test_it():\n    pass\n".format(marker)
    )
    result, _ = run(session, "--gpumem")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: gpumem marker of test_bad.py::test_it: " + complaint])


def test_bad_options_are_usage_errors_naming_them(session, tmp_path):
    session.hooked()
    session.makepyfile(test_figures=FIGURES)
    result = session.runpytest_subprocess("--gpumem", "--gpumem-tolerance", "ten")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --gpumem-tolerance 'ten' is not a percentage*"])
    result = session.runpytest_subprocess("--gpumem-json", str(tmp_path / "missing" / "x.json"))
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --gpumem-json *: cannot be written: the directory * does not exist"])
    for name, text in (("report.json", '{"tests": []}'), ("junk.json", "not json")):
        (session.path / name).write_text(text)
        result = session.runpytest_subprocess("--gpumem-compare", name)
        assert result.ret == 4
        result.stderr.fnmatch_lines(
            ["ERROR: --gpumem-compare {}: not a gpumemhook pytest baseline*".format(name)]
        )


def test_a_baseline_fails_the_tests_whose_peak_grew_and_lists_the_new_ones(session):
    session.hooked()
    make = lambda grown: session.makepyfile(  # noqa: E731
        test_base=textwrap.dedent(
            """
            from gpu import malloc, free, MiB

            def test_steady():
                free(malloc(4 * MiB))

            def test_grows():
                free(malloc({} * MiB))

            def test_grows_a_little():
                free(malloc({} * MiB))
            """
        ).format(8 if grown else 4, 42 if grown else 40)
    )
    make(grown=False)
    result = session.runpytest_subprocess("-p", "no:cacheprovider", "--gpumem-save", "base.json")
    result.assert_outcomes(passed=3)
    make(grown=True)
    session.makepyfile(test_new="from gpu import malloc, free, MiB\ndef test_new():\n    free(malloc(MiB))\n")
    result, doc = run(session, "--gpumem-compare", "base.json")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "gpumem: peak on device 0 grew from 4.00 MiB (4194304 bytes) to 8.00 MiB (8388608 bytes), "
            "past the tolerance of 10% over the baseline *base.json",
        ]
    )
    result.stdout.fnmatch_lines(["not in the baseline *base.json (not compared): 1 test", "  test_new.py::test_new"])
    assert rows(doc)[("test_grows", 0)] == (8 * MiB, 0, "failed")
    assert rows(doc)[("test_grows_a_little", 0)] == (42 * MiB, 0, "passed")  # 5% < 10%
    result, _ = run(session, "--gpumem-compare", "base.json", "--gpumem-tolerance", "0%")
    result.assert_outcomes(passed=2, failed=2)


EMPTY_CACHE = """
from gpu import malloc, free, torch, MiB

def test_uses_the_cache():
    torch.cuda.cache(4 * MiB)   # a freed block the framework keeps
"""


def test_empty_cache_gives_the_frameworks_cache_back_around_each_test(session):
    session.hooked()
    session.makepyfile(test_cache=EMPTY_CACHE)
    result, doc = run(session, "--gpumem")
    assert rows(doc) == {("test_uses_the_cache", 0): (4 * MiB, 4 * MiB, "passed")}
    result.stdout.fnmatch_lines(["cached memory counts:*"])
    result, doc = run(session, "--gpumem", "--gpumem-empty-cache")
    assert rows(doc) == {("test_uses_the_cache", 0): (4 * MiB, 0, "passed")}
    result.stdout.fnmatch_lines(["caches emptied before and after each test (--gpumem-empty-cache): PyTorch"])


XDIST = """
import os
import gpumemhook
import pytest
from gpu import malloc, free, MiB

@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_in_a_worker(n):
    assert os.environ["PYTEST_XDIST_WORKER"] in ("gw0", "gw1")
    assert gpumemhook.is_hooked()
    free(malloc(n * MiB))

@pytest.mark.gpumem(peak="1MiB")
def test_over_budget_in_a_worker():
    free(malloc(2 * MiB))
"""


@pytest.mark.parametrize("hooked", [True, False], ids=["started-hooked", "restarted"])
def test_xdist_workers_are_hooked_and_the_controller_merges_their_figures(session, hooked):
    pytest.importorskip("xdist")
    if hooked:
        session.hooked()
    session.makepyfile(test_xdist=XDIST)
    result, doc = run(session, "--gpumem", "-n", "2")
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(["created: 2/2 workers"])
    expected = {("test_in_a_worker[{}]".format(n), 0): (n * MiB, 0, "passed") for n in range(1, 7)}
    expected[("test_over_budget_in_a_worker", 0)] = (2 * MiB, 0, "failed")
    assert rows(doc) == expected
    result.stdout.fnmatch_lines(
        ["*gpumem: largest GPU memory peaks per test*", "*PEAK*", "*6.00 MiB*test_in_a_worker?6?"]
    )
    result.stdout.fnmatch_lines(["*over the budget of 1.00 MiB*"])


TOGETHER = """
import os
from pathlib import Path
from gpu import malloc, free, touch, wait_for, MiB

def test_together():
    me = os.environ["PYTEST_XDIST_WORKER"]
    other = {"gw0": "gw1", "gw1": "gw0"}[me]
    meet = str(Path(__file__).parent) + "/"
    held = malloc(2 * MiB)                  # both workers hold 2 MiB at once...
    touch(meet + me + ".holds")
    wait_for(meet + other + ".holds", timeout=60)
    if me == "gw1":
        wait_for(meet + "gw0.spiked", timeout=60)
    free(malloc(6 * MiB))                   # ...and spike 6 MiB one after the other
    touch(meet + me + ".spiked")
    wait_for(meet + other + ".spiked", timeout=60)
    free(held)
"""


def _session_groups() -> List[str]:
    """The group files the sessions left in their segment directory."""
    shm = Path(os.environ["GPUMEMHOOK_SHM_DIR"])
    return sorted(p.name.split("-", 3)[-1] for p in shm.glob("gpumemhook-group-*"))


@pytest.mark.parametrize("how", ["started-hooked", "restarted", "users-group", "no-group"])
def test_xdist_workers_share_the_sessions_group_and_the_summary_gives_its_joint_peak(session, monkeypatch, how):
    pytest.importorskip("xdist")
    if how == "started-hooked":
        session.hooked()
    if how in ("users-group", "no-group"):
        monkeypatch.setenv("GPUMEMHOOK_GROUP", "mine" if how == "users-group" else "")
    session.makepyfile(test_together=TOGETHER)
    result, doc = run(session, "--gpumem", "-n", "2", "--dist", "each")
    result.assert_outcomes(passed=2)
    # Each worker peaked at 8 MiB (16 MiB summed); at once they held at most 2 + 2 + 6 MiB.
    assert [r["peak"] for r in doc["tests"]] == [8 * MiB, 8 * MiB]
    if how == "no-group":
        # Set empty: no group, no session peak.
        assert doc["session"] == {"group": None, "devices": []}
        assert "session peak" not in result.stdout.str()
        assert _session_groups() == []
        return
    group = doc["session"]["group"]
    assert group == "mine" if how == "users-group" else group.startswith("pytest-"), doc
    assert doc["session"]["devices"] == [{"device": 0, "peak": 10 * MiB, "joint": True}]
    result.stdout.fnmatch_lines(
        ["session peak on device 0: 10.00 MiB (all its processes at once: group {})".format(group)]
    )
    # The session's own group goes with it; the user's stays.
    assert _session_groups() == (["mine"] if how == "users-group" else [])


WITH_A_CHILD = """
import subprocess, sys
from gpu import malloc, free, MiB

def test_with_a_child():
    held = malloc(3 * MiB)
    # A hooked child of the test, allocating 5 MiB while the test holds its 3 MiB.
    code = "from gpu import malloc, MiB; malloc(5 * MiB)"
    subprocess.run([sys.executable, "-c", code], check=True)
    free(held)
"""


@pytest.mark.parametrize("hooked", [False, True], ids=["restarted", "started-hooked"])
def test_a_tests_child_joins_the_sessions_group_and_a_pytest_outside_it_is_said(session, hooked):
    if hooked:
        session.hooked()
    session.makepyfile(test_child=WITH_A_CHILD)
    result, doc = run(session, "--gpumem")
    result.assert_outcomes(passed=1)
    group = doc["session"]["group"]
    if not hooked:
        # Restarted with the group in its environment: pytest and its child, at once.
        assert doc["session"]["devices"] == [{"device": 0, "peak": 8 * MiB, "joint": True}]
        result.stdout.fnmatch_lines(["session peak on device 0: 8.00 MiB (all its processes*"])
    else:
        # Hooked before the plugin could set the group: only the child is in it.
        assert doc["session"]["devices"] == [{"device": 0, "peak": None, "joint": False}]
        result.stdout.fnmatch_lines(
            [
                "session peak on device 0: not known: this pytest process, started under the hook "
                "without GPUMEMHOOK_GROUP, is outside the session's group {} (its own peak 3.00 MiB; "
                "the group's, its workers' and children's at once, 5.00 MiB)*".format(group)
            ]
        )
    assert _session_groups() == []


RAN = """
from pathlib import Path

def test_leaves_a_mark():
    Path(__file__).with_name("ran").write_text("yes")
"""


def test_an_output_that_cannot_be_written_stops_the_run_before_any_test(session, tmp_path):
    session.hooked()
    session.makepyfile(test_ran=RAN)
    block = next((d for d in sorted(Path("/dev").glob("loop*")) if d.is_block_device()), None)
    cases = [
        ("--gpumem-json", str(tmp_path), "--gpumem-json *: cannot be written: * is a directory; give a file name"),
        (
            "--gpumem-save",
            str(tmp_path / "no" / "base.json"),
            "--gpumem-save *: cannot be written: the directory * does not exist",
        ),
        ("--gpumem-compare", str(tmp_path), "--gpumem-compare *: cannot be read: Is a directory"),
    ]
    if block is not None:
        cases.append(("--gpumem-json", str(block), "--gpumem-json *: cannot be written: * is a block device*"))
    if os.geteuid() != 0:  # root may write any file
        read_only = tmp_path / "read-only.json"
        read_only.write_text("{}")
        read_only.chmod(0o444)
        cases.append(("--gpumem-save", str(read_only), "--gpumem-save *: exists and is not writable"))
    for option, value, line in cases:
        result = session.runpytest_subprocess("-p", "no:cacheprovider", option, value)
        assert result.ret == 4, (option, value)
        result.stderr.fnmatch_lines(["ERROR: " + line])
        assert len([text for text in result.stderr.lines if text.strip()]) == 1, result.stderr.lines
        assert not (session.path / "ran").exists(), "a test ran before the option was refused"


def test_a_write_that_fails_at_the_end_is_one_line_after_the_table_and_exit_status_1(session):
    session.hooked()
    session.makepyfile(test_figures=FIGURES)
    # /dev/full opens and then refuses every write (ENOSPC): a device that fills up mid-run.
    result = session.runpytest_subprocess("-p", "no:cacheprovider", "--gpumem", "--gpumem-json", "/dev/full")
    assert result.ret == 1
    result.assert_outcomes(passed=5, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*gpumem: largest GPU memory peaks per test*",
            "*7.00 MiB*test_setup_and_teardown_count",
            "cached memory counts:*",
            "gpumem: --gpumem-json not written: /dev/full: No space left on device*",
        ]
    )
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert out.count("not written") == 1


RERUNS = """
import pytest
from gpu import malloc, free, MiB

runs = {"budget": 0, "assert": 0}

@pytest.mark.gpumem(peak="1536KiB")
def test_over_its_budget_once():
    runs["budget"] += 1
    free(malloc((3 - runs["budget"]) * MiB))   # 2 MiB, then 1 MiB

def test_fails_once():
    runs["assert"] += 1
    free(malloc((2 + runs["assert"]) * MiB))   # 3 MiB, then 4 MiB
    assert runs["assert"] > 1
"""


def test_rerunfailures_reruns_and_each_run_is_measured(session):
    pytest.importorskip("pytest_rerunfailures")
    session.hooked()
    session.makepyfile(test_reruns=RERUNS)
    result, doc = run(session, "--gpumem", "--reruns", "2")
    assert result.parseoutcomes() == {"passed": 2, "rerun": 2}
    runs = [(r["nodeid"].split("::")[-1], r["peak"], r["outcome"]) for r in doc["tests"]]
    assert runs == [
        ("test_over_its_budget_once", 2 * MiB, "rerun"),
        ("test_over_its_budget_once", 1 * MiB, "passed"),
        ("test_fails_once", 3 * MiB, "rerun"),
        ("test_fails_once", 4 * MiB, "passed"),
    ]


STOP = """
import pytest
from gpu import malloc, free, MiB

@pytest.mark.gpumem(peak=1048576)  # a number from Python: bytes
def test_first_over_its_budget():
    free(malloc(2 * MiB))

def test_second():
    pass
"""


def test_x_stops_at_the_first_test_over_its_budget(session):
    session.hooked()
    session.makepyfile(test_stop=STOP)
    result, doc = run(session, "--gpumem", "-x")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*over the budget of 1.00 MiB (peak=1048576 in the gpumem marker)"])
    assert [r["nodeid"].split("::")[-1] for r in doc["tests"]] == ["test_first_over_its_budget"]

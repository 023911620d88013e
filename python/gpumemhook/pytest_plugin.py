"""The pytest plugin (entry point ``pytest11``): exact GPU memory per test, budgets, leak checks
and regression baselines.

Inert unless asked for: ``--gpumem`` (or any other ``--gpumem-*`` option) measures every test; a
``@pytest.mark.gpumem(peak=..., leak=..., device=...)`` marker measures and checks that test when
pytest runs under the hook (without it the test runs unchecked and the summary says so, once;
``--gpumem-strict`` makes that a usage error).

It measures around pytest's own test protocol (hook wrappers), never instead of it: each run of a
test, setup to teardown, is one measurement, so other plugins that run the protocol themselves
(pytest-rerunfailures) and ``-x`` work as they do without this one.

Per test and device, over its setup, call and teardown together:

* ``peak``: the most the process held above what it held when the test started (a scope of the
  hook: every allocation of every thread, spikes included);
* ``leaked``: what it held at the end beyond what it held at the start (never negative).

The session is a group of its own (``GPUMEMHOOK_GROUP=pytest-<pid>-<token>``, docs/groups.md) unless
``GPUMEMHOOK_GROUP`` is set already (the user's group, or none when set empty): every process of the
session that starts under the hook (xdist workers, programs the tests start) joins it, and the
JSON and the summary give the session's exact joint peak.

Counting needs the hook in this process. ``pytest --gpumem`` started without it restarts pytest
under it at once (the same command line, ``LD_PRELOAD`` as ``gpumemhook run`` sets it), before any
conftest or test module is imported; where that is impossible (pytest called as a function, an
xdist worker, no hook library) it stops with one line saying how (exit status 4, a usage error).
docs/pytest-plugin.md has the whole story.
"""

from __future__ import annotations

import gc
import json
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Generator, Iterator, List, Optional, Set, Tuple

import pytest

from . import _native
from ._api import group
from ._core import library_path, process

MARKER = "gpumem"
# The document --gpumem-json and --gpumem-save write, and --gpumem-compare reads back.
FORMAT = "gpumemhook-pytest"
# Largest peaks the terminal summary lists.
SUMMARY_ROWS = 10
# Largest live allocations a budget failure lists, and most Python lines behind a peak over budget.
LIVE_ROWS = 5
# What --gpumem-sites records, unless GPUMEMHOOK_STACKS is set already: the Python lines of every
# allocation of 1 MiB or more.
SITES_SETTING = "python:1MiB"
DEFAULT_TOLERANCE = "10%"
# The attribute of a run's last logged report that carries its figures to the controller: xdist
# serialises a report's attributes, so workers need no channel of their own.
REPORT_ATTR = "gpumem"
# The outcome pytest-rerunfailures gives a failed run it will run again.
RERUN = "rerun"


# -- options and markers -------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpumem", "exact GPU memory per test (gpumemhook)")
    group.addoption(
        "--gpumem",
        action="store_true",
        default=False,
        help="measure every test's exact GPU memory peak and leak (restarts pytest under the "
        "hook when it was started without it)",
    )
    group.addoption(
        "--gpumem-sites",
        action="store_true",
        default=False,
        help="as --gpumem, and record the Python lines of each allocation of 1 MiB or more "
        "({}={} unless it is set), so that a peak over its budget names the lines that held "
        "the most".format(_native.ENV_STACKS, SITES_SETTING),
    )
    group.addoption(
        "--gpumem-empty-cache",
        action="store_true",
        default=False,
        help="empty the caches of the GPU frameworks already imported (PyTorch, CuPy, JAX) "
        "before and after each test, so that a test's figures are its own",
    )
    group.addoption(
        "--gpumem-json",
        metavar="FILE",
        default=None,
        help="write every test's figures to FILE as JSON: "
        '{"tests": [{"nodeid", "device", "peak", "leaked", "outcome"}]}',
    )
    group.addoption(
        "--gpumem-save",
        metavar="FILE",
        default=None,
        help="write a baseline of every test's figures to FILE (for --gpumem-compare)",
    )
    group.addoption(
        "--gpumem-compare",
        metavar="FILE",
        default=None,
        help="fail each test whose peak grew past the tolerance over the baseline FILE",
    )
    group.addoption(
        "--gpumem-strict",
        action="store_true",
        default=False,
        help="a gpumem marker in a run without the hook stops the run (exit status 4) instead of "
        "running its test unchecked",
    )
    group.addoption(
        "--gpumem-tolerance",
        metavar="PERCENT",
        default=None,
        help="growth of a peak over the baseline that still passes (default {})".format(
            DEFAULT_TOLERANCE
        ),
    )


# Options that ask for the plugin by themselves (--gpumem-tolerance only tunes --gpumem-compare;
# --gpumem-strict only says what a marker without the hook does).
_ACTIVATING = (
    "gpumem", "gpumem_sites", "gpumem_empty_cache", "gpumem_json", "gpumem_save", "gpumem_compare"
)


def _asked(options: Any) -> bool:
    return any(getattr(options, name, None) for name in _ACTIVATING)


# -- starting under the hook ---------------------------------------------------------------------


def _restart_command(config: pytest.Config) -> Optional[List[str]]:
    """The command line that started this pytest, when this process is that pytest (not one called
    as a function from another program, whose arguments are not the process's)."""
    if list(config.invocation_params.args) != sys.argv[1:]:
        return None
    orig = getattr(sys, "orig_argv", None)  # Python 3.10+: interpreter options included
    if orig:
        return [sys.executable] + list(orig[1:])
    if sys.argv[0].endswith("__main__.py"):  # python -m pytest, on Python 3.9
        return [sys.executable, "-m", "pytest"] + sys.argv[1:]
    return [sys.executable] + sys.argv


def _not_hooked(why: str, restartable: bool = False) -> pytest.UsageError:
    """The one line that stops a run needing the hook without it, saying how to start it."""
    return pytest.UsageError(
        "gpumemhook: {}: {}start pytest under the hook: `gpumemhook run -- pytest ...` or "
        "`LD_PRELOAD=$(python -c 'import gpumemhook; print(gpumemhook.library_path())') "
        "pytest ...`".format(
            why,
            "run `pytest --gpumem ...`, which restarts itself under the hook, or "
            if restartable
            else "",
        )
    )


# Whether this pytest is one the plugin restarted under the hook.
_RESTARTED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: List[str]
) -> None:
    """Restarts pytest under the hook when ``--gpumem`` was asked for without it: here, before any
    conftest or test module (or framework) is imported."""
    # Taken out of the environment at once: programs the tests start (a pytest of their own, say)
    # are not restarts.
    restarted = os.environ.pop(_native.ENV_PYTEST_RESTARTED, None) is not None
    early_config.stash[_RESTARTED] = restarted
    if not _asked(early_config.known_args_namespace):
        return
    sites = bool(getattr(early_config.known_args_namespace, "gpumem_sites", False))
    if process() is not None:
        if sites and not os.environ.get(_native.ENV_STACKS):
            raise pytest.UsageError(
                "gpumemhook: --gpumem-sites: this pytest was started under the hook without {0}, "
                "which the hook reads when it loads: set {0}={1}, or start pytest without the hook "
                "(`pytest --gpumem-sites` restarts itself under it, recording them)".format(
                    _native.ENV_STACKS, SITES_SETTING
                )
            )
        _give_the_session_a_group()
        return
    if restarted:
        raise _not_hooked(
            "pytest was restarted under the hook ({}) but the hook is not counting in it "
            "(is {}=1 set?)".format(os.environ.get("LD_PRELOAD", ""), _native.ENV_DISABLE)
        )
    if os.environ.get("PYTEST_XDIST_WORKER"):
        raise _not_hooked("this xdist worker was started without the hook")
    command = _restart_command(early_config)
    if command is None:
        raise _not_hooked(
            "--gpumem needs the hook in this process, and pytest was called from another "
            "program, which cannot be restarted"
        )
    try:
        # As `gpumemhook run` finds it: $GPUMEMHOOK_LIB, else the package's own.
        lib = os.environ.get(_native.ENV_LIB) or library_path()
    except FileNotFoundError as e:
        raise _not_hooked(str(e))
    # Capturing is on by now (pytest redirects fds 1 and 2 into files): the restarted pytest
    # must write to the real terminal.
    capture = early_config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()
    _give_the_session_a_group()
    if sites:
        os.environ.setdefault(_native.ENV_STACKS, SITES_SETTING)
    env = dict(os.environ)
    env["LD_PRELOAD"] = os.fsdecode(_native.preload_value(env.get("LD_PRELOAD"), lib))
    env[_native.ENV_PYTEST_RESTARTED] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)


def _new_own_group() -> str:
    """A name for the session's own group: ``pytest-<pid>-<token>`` of the pytest that reports
    (xdist's workers and a restarted pytest inherit the variable). The token is random, so that no
    other user can make a file at the group's name first: the segment directory is everyone's."""
    return "pytest-{}-{}".format(os.getpid(), secrets.token_hex(8))


def _is_own_group(name: Optional[str]) -> bool:
    """Whether ``name`` is a group this very pytest made for its session (not a user's)."""
    prefix = "pytest-{}-".format(os.getpid())
    if name is None or not name.startswith(prefix):
        return False
    token = name[len(prefix):]
    return len(token) == 16 and all(c in "0123456789abcdef" for c in token)


def _give_the_session_a_group() -> None:
    """Puts ``GPUMEMHOOK_GROUP`` in the environment, so that every hooked process the session
    starts from here on (the restarted pytest, xdist's workers, the tests' own programs) joins the
    session's group; unless it is set already: the user's group (or none, set empty), or this
    session's, inherited by a worker or a restarted pytest. The hook reads it once, when it loads:
    a pytest started under the hook without it stays out of the group (the summary says so when it
    matters)."""
    if _native.ENV_GROUP in os.environ:
        return
    os.environ[_native.ENV_GROUP] = _new_own_group()


# -- budgets and settings ------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """A test's `gpumem` marker: the most it may peak and leave behind (bytes), on `device` (None:
    on every device)."""

    peak: Optional[int] = None
    leak: Optional[int] = None
    device: Optional[int] = None
    # The marker's argument as written (`peak="2MiB"`, `peak=4096`), for messages.
    peak_text: str = ""
    leak_text: str = ""


_MARKER_ARGS = ("peak", "leak", "device")


def _budget(item: pytest.Item) -> Optional[Budget]:
    """The test's budget from its (closest) `gpumem` marker; a usage error naming the marker and
    the test for anything it cannot honour."""
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return None

    def bad(what: str) -> pytest.UsageError:
        return pytest.UsageError(
            "gpumem marker of {}: {} (it takes peak=SIZE, leak=SIZE, device=N, e.g. "
            '@pytest.mark.gpumem(peak="1.5GiB", leak="0B"))'.format(item.nodeid, what)
        )

    if mark.args:
        raise bad("positional arguments {!r}: name them".format(mark.args))
    unknown = sorted(set(mark.kwargs) - set(_MARKER_ARGS))
    if unknown:
        raise bad("unknown argument {}".format(", ".join(unknown)))
    sizes: Dict[str, Optional[int]] = {}
    for key in ("peak", "leak"):
        value = mark.kwargs.get(key)
        if value is None:
            sizes[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise bad("{}={!r} is not a size".format(key, value))
        if isinstance(value, int):
            # A number from Python is bytes, as everywhere in the API; only text needs a unit.
            if not 0 <= value <= _native.MAX_SIZE:
                raise bad("{}={} is not a number of bytes (0 to {})".format(key, value, _native.MAX_SIZE))
            sizes[key] = value
            continue
        try:
            sizes[key] = _native.parse_size(value, allow_zero=True)
        except ValueError as e:
            raise bad("{}={}".format(key, e))
    device = mark.kwargs.get("device")
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, int):
            raise bad("device={!r} is not a device number".format(device))
        try:
            _native.check_device(device)
        except (ValueError, OverflowError) as e:
            raise bad("device={}: {}".format(device, e))
    return Budget(
        sizes["peak"],
        sizes["leak"],
        device,
        _as_written("peak", mark.kwargs.get("peak")),
        _as_written("leak", mark.kwargs.get("leak")),
    )


def _as_written(key: str, value: Any) -> str:
    """A size argument as the marker spells it: text quoted, a number of bytes bare."""
    return '{}="{}"'.format(key, value) if isinstance(value, str) else "{}={}".format(key, value)


def _tolerance(text: Optional[str]) -> float:
    """``10%`` (or ``10``) as 0.10; a usage error naming the option otherwise."""
    raw = (text or DEFAULT_TOLERANCE).strip()
    try:
        value = float(raw[:-1] if raw.endswith("%") else raw) / 100.0
    except ValueError:
        value = -1.0
    if not value >= 0.0 or value == float("inf"):
        raise pytest.UsageError(
            "--gpumem-tolerance {!r} is not a percentage (e.g. 10%, 0%, 2.5%)".format(text)
        )
    return value


def _output_path(config: pytest.Config, option: str) -> Optional[Path]:
    """A file the plugin will write at the end, resolved against the directory pytest started in
    and checked now by the CLI's rule (a directory, a block device, a missing or unwritable
    directory, a file this user cannot write), so that it stops the run before the tests do."""
    value = config.getoption(option.lstrip("-").replace("-", "_"))
    if value is None:
        return None
    path = Path(config.invocation_params.dir, value)
    try:
        _native.check_writable(str(path))
    except ValueError as e:
        raise pytest.UsageError("{} {}: {}".format(option, value, e))
    return path


@dataclass
class Baseline:
    path: Path
    # (nodeid, device) -> peak
    peaks: Dict[Tuple[str, int], int]
    # Every test the baseline measured, devices or not.
    nodeids: Set[str]


def _load_baseline(config: pytest.Config) -> Optional[Baseline]:
    value = config.getoption("gpumem_compare")
    if value is None:
        return None
    path = Path(config.invocation_params.dir, value)
    try:
        # Read at once, at configure time: a directory, a missing file or one this user cannot
        # read stops the run before any test does.
        doc = json.loads(path.read_bytes())
    except OSError as e:
        raise pytest.UsageError(
            "--gpumem-compare {}: cannot be read: {}".format(value, e.strerror or e)
        )
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise pytest.UsageError(
            "--gpumem-compare {}: not a gpumemhook pytest baseline (one written by "
            "--gpumem-save or --gpumem-json has \"format\": \"{}\")".format(value, FORMAT)
        )
    try:
        peaks = {(str(r["nodeid"]), int(r["device"])): int(r["peak"]) for r in doc["tests"]}
        nodeids = {n for n, _ in peaks} | {str(n) for n in doc.get("without_activity", [])}
    except (KeyError, TypeError, ValueError) as e:
        raise pytest.UsageError(
            "--gpumem-compare {}: a test row lacks a field or has a bad one ({!r})".format(value, e)
        )
    return Baseline(path, peaks, nodeids)


# -- caches of the frameworks --------------------------------------------------------------------


def _empty_torch() -> bool:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return True


def _empty_cupy() -> bool:
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return False
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    return True


def _empty_jax() -> bool:
    # JAX's own allocator keeps what it took (by default it takes 75% of the card at start):
    # nothing in JAX gives that back. Its compilation caches, and the device buffers only they
    # keep alive, go; XLA_PYTHON_CLIENT_ALLOCATOR=platform makes JAX free memory when done with it.
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(jax, "clear_caches"):
        return False
    jax.clear_caches()
    return True


# Whose caches --gpumem-empty-cache empties, each only when the program already imported it.
_FRAMEWORKS = (("PyTorch", _empty_torch), ("CuPy", _empty_cupy), ("JAX", _empty_jax))


def _empty_caches() -> List[str]:
    """Collects garbage, then empties each imported framework's cache; the frameworks emptied."""
    gc.collect()
    emptied = []
    for name, empty in _FRAMEWORKS:
        try:
            if empty():
                emptied.append(name)
        except Exception:  # a framework without a GPU (or a broken one) has nothing cached
            pass
    return emptied


# -- one test's measurement ----------------------------------------------------------------------


@dataclass
class Figures:
    """One test's figures on one device."""

    device: int
    peak: int
    leaked: int


class Measurement:
    """A scope of the hook around one test, with what the failure messages compare against."""

    def __init__(self, proc: _native.Process, name: str, budgeted: bool) -> None:
        self.proc = proc
        # A test with a budget may have to list what it left behind: the addresses held at its
        # start tell those apart (only the hook's own memory knows them, so only asked for then).
        self.live_at_start: Set[str] = (
            {a["address"] for a in _live(proc)} if budgeted else set()
        )
        # A test with a budget may have to name the Python lines behind its peak: what each held,
        # and the most it ever held, when the test started (sites are recorded: GPUMEMHOOK_STACKS).
        self.sites_at_start: Dict[str, Tuple[int, int]] = (
            {site: (used, peak) for (site, used, peak, _) in proc.site_breakdown()}
            if budgeted and _sites_recorded()
            else {}
        )
        self.counters = {d: self._counters(d) for d in proc.active_devices()}
        self.modules = {
            d: {m: used for (m, used, _, _) in proc.breakdown(d)} for d in proc.active_devices()
        }
        # Named after the test, as the timeline (GPUMEMHOOK_TRACE) then shows its span.
        self.scope = proc.open_scope(name, None)

    def _counters(self, device: int) -> Tuple[int, int, int, int]:
        s = self.proc.device_stats(device)
        return (s.allocs, s.frees, s.denied, s.failed)

    def so_far(self) -> List[Figures]:
        """The figures until now, the scope left open (after the call, before teardown)."""
        return self._figures(self.scope.readings(self.proc.active_devices()))

    def finish(self) -> List[Figures]:
        """Closes the scope: the figures of every device that saw activity during the test."""
        try:
            devices = self.proc.active_devices()
            readings = self.scope.readings(devices)
        finally:
            self.scope.close()
        return self._figures(readings)

    def _figures(self, readings: List[_native.ScopeReading]) -> List[Figures]:
        figures = []
        for r in readings:
            leaked = max(r.delta_used, 0)
            changed = self._counters(r.device) != self.counters.get(r.device, (0, 0, 0, 0))
            if changed or r.delta_peak or leaked:
                figures.append(Figures(r.device, r.delta_peak, leaked))
        return figures

    def held_by_module(self, device: int) -> str:
        """``module size (+growth)`` of the modules holding memory on `device` now."""
        before = self.modules.get(device, {})
        parts = []
        for module, used, _, _ in self.proc.breakdown(device):
            if used == 0:
                continue
            growth = used - before.get(module, 0)
            parts.append(
                "{} {} ({}{})".format(
                    module,
                    _native.format_size(used),
                    "+" if growth >= 0 else "-",
                    _native.format_size(abs(growth)),
                )
            )
        return ", ".join(parts) if parts else "nothing"

    def lines_behind_the_peak(self) -> List[str]:
        """The lines of a peak over its budget: the Python sites whose most held rose during the
        test, by that most above what they held at its start (exact: a site's most is kept since
        the process started, so one that rose reached it during the test); or the flag that
        records them."""
        if not _sites_recorded():
            return [
                "  the Python lines behind it are not recorded: --gpumem-sites (or {}={}) names "
                "them".format(_native.ENV_STACKS, SITES_SETTING)
            ]
        rose = []
        for site, _, peak, _ in self.proc.site_breakdown():
            used_then, peak_then = self.sites_at_start.get(site, (0, 0))
            if peak > peak_then:
                rose.append((peak - used_then, site))
        if not rose:
            return [
                "  no Python line held more during the test than it had held before it: a line's "
                "most is kept from the start of the process, so a line that held as much in an "
                "earlier test is not named; only allocations that {}={} records have a line"
                "".format(_native.ENV_STACKS, os.environ.get(_native.ENV_STACKS, ""))
            ]
        rose.sort(key=lambda r: (-r[0], r[1]))
        return [
            "  Python lines that held the most during the test (all devices; their most, above "
            "what they held at its start):"
        ] + ["    {:>12}  {}".format(_native.format_size(b), site) for b, site in rose[:LIVE_ROWS]]

    def largest_live(self, device: int) -> List[str]:
        """The largest allocations still held on `device`, those made during the test marked."""
        lines = []
        for a in [a for a in _live(self.proc) if a.get("device") == device][:LIVE_ROWS]:
            lines.append(
                "{:>12}  {}  {}{}{}".format(
                    _native.format_size(a["bytes"]),
                    a.get("module", "?"),
                    a.get("address", ""),
                    "" if a.get("address") in self.live_at_start else "  made during this test",
                    "  at " + a["site"] if a.get("site") else "",
                )
            )
        return lines


def _sites_recorded() -> bool:
    """Whether this process records the Python lines of its allocations (the hook read
    GPUMEMHOOK_STACKS when it loaded)."""
    return bool(os.environ.get(_native.ENV_STACKS))


def _live(proc: _native.Process) -> List[Dict[str, Any]]:
    """The device allocations the process holds now, largest first (the exit report's `live`)."""
    return json.loads(proc.report_json()).get("live") or []


# -- the plugin ----------------------------------------------------------------------------------


@dataclass
class Row:
    nodeid: str
    device: int
    peak: int
    leaked: int
    outcome: str

    def as_dict(self) -> Dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "device": self.device,
            "peak": self.peak,
            "leaked": self.leaked,
            "outcome": self.outcome,
        }


@dataclass
class SessionPeak:
    """The session's peak on one device: the joint peak of its group (``peak``), which is the
    session's unless this pytest process, outside the group, used the device too (``own``, its own
    peak, not 0: then the two are apart, never summed)."""

    device: int
    peak: int
    own: int = 0
    # The session's peak is this pytest process's own: no other process added to it.
    alone: bool = False

    def as_dict(self) -> Dict[str, Any]:
        joint = self.own == 0
        return {"device": self.device, "peak": self.peak if joint else None, "joint": joint}


@dataclass
class Session:
    """What the process that reports (the only one, or xdist's controller) gathers."""

    rows: List[Row] = field(default_factory=list)
    # The session's group (GPUMEMHOOK_GROUP) and its peaks, per device any test used.
    group: Optional[str] = None
    peaks: List[SessionPeak] = field(default_factory=list)
    quiet: List[str] = field(default_factory=list)  # tests measured without activity
    emptied: Set[str] = field(default_factory=set)
    missing_from_baseline: List[str] = field(default_factory=list)
    # Tests whose budget was not checked: their marker ran in a pytest without the hook.
    unchecked: int = 0
    # Option -> the one line saying why its file could not be written at the end.
    unwritten: Dict[str, str] = field(default_factory=dict)


@dataclass
class Run:
    """One run of one test, setup to teardown (pytest-rerunfailures makes several of a test)."""

    budget: Optional[Budget]
    # None: the test has a budget but this pytest runs without the hook (unchecked).
    measurement: Optional[Measurement]
    # The run's reports so far, setup first.
    reports: List[pytest.TestReport] = field(default_factory=list)
    # (what, device) of the problems already reported on the call: not reported again at teardown.
    reported: Set[Tuple[str, int]] = field(default_factory=set)


# The run of a test in progress, from its setup to its teardown's report.
_RUN = pytest.StashKey[Run]()


class Plugin:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.everything = _asked(config.option)
        self.strict = bool(config.getoption("gpumem_strict"))
        self.empty_cache = bool(config.getoption("gpumem_empty_cache"))
        self.json_path = _output_path(config, "--gpumem-json")
        self.save_path = _output_path(config, "--gpumem-save")
        self.baseline = _load_baseline(config)
        self.tolerance = _tolerance(config.getoption("gpumem_tolerance"))
        self.is_worker = hasattr(config, "workerinput")
        self.restarted = config.stash.get(_RESTARTED, False)
        self.session = Session()
        # The reports logged since the current run began (by id): what is not among them when the
        # run ends is still to be logged, by whoever runs the protocol (pytest-rerunfailures).
        # Kept only where tests run (not in xdist's controller, which only logs).
        self.logged: Set[int] = set()
        self.runs_tests = False

    # -- collection: every marker checked before anything runs --

    @pytest.hookimpl(trylast=True)  # after -k and -m deselected what will not run
    def pytest_collection_modifyitems(self, items: List[pytest.Item]) -> None:
        marked = [item for item in items if _budget(item) is not None]
        if marked and self.strict and process() is None:
            raise _not_hooked(
                "{} has a gpumem marker, whose budget needs the hook in this process "
                "(--gpumem-strict)".format(marked[0].nodeid),
                restartable=not os.environ.get("PYTEST_XDIST_WORKER"),
            )

    def pytest_report_header(self, config: pytest.Config) -> Optional[str]:
        if not self.everything:
            return None
        how = (
            "restarted under the hook (LD_PRELOAD={})".format(os.environ.get("LD_PRELOAD", ""))
            if self.restarted
            else "started under the hook"
        )
        return "gpumem: exact GPU memory per test; pytest {}".format(how)

    # -- one run of a test: around pytest's protocol, whoever runs it --

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, None]:
        """Opens the run's measurement before anything of its setup runs."""
        self.logged.clear()
        self.runs_tests = True
        budget = _budget(item)
        if self.everything or budget is not None:
            proc = process()
            measurement = None
            if proc is not None:  # else a marker in a run without the hook: unchecked
                if self.empty_cache:
                    self.session.emptied.update(_empty_caches())
                measurement = Measurement(proc, item.name, budget is not None)
            item.stash[_RUN] = Run(budget, measurement)
        yield

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        """Judges the peak when the call ends (so that a test over its budget fails as a test),
        and everything when its teardown ends, when the run's figures are complete."""
        run = item.stash.get(_RUN, None)
        if run is None:
            yield
            return
        final: Optional[List[Figures]] = None
        if call.when == "teardown" and run.measurement is not None:
            try:
                if self.empty_cache:
                    self.session.emptied.update(_empty_caches())
            finally:
                final = run.measurement.finish()
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        run.reports.append(report)
        if run.measurement is not None and call.when in ("call", "teardown"):
            figures = final if final is not None else run.measurement.so_far()
            problems = self._judge(item, run, figures, final is not None)
            # A run that already failed (or was skipped) keeps its own outcome.
            if problems and all(r.passed for r in run.reports):
                report.outcome = "failed"
                report.longrepr = "\n".join(problems)
        if call.when == "teardown":
            del item.stash[_RUN]
            self._hand_over(run, final)

    def _hand_over(self, run: Run, figures: Optional[List[Figures]]) -> None:
        """Puts the run's figures on the last report of the run that will be logged: the teardown's
        under pytest's own protocol; under pytest-rerunfailures, which logs a run it will repeat
        only up to its first failed report, that one."""
        pending = [r for r in run.reports if id(r) not in self.logged]
        carrier = next((r for r in pending if r.failed), run.reports[-1])
        setattr(carrier, REPORT_ATTR, {
            "rows": [[f.device, f.peak, f.leaked] for f in figures or []],
            "outcome": _outcome(run.reports),
            "emptied": sorted(self.session.emptied),
            "unchecked": run.measurement is None,
        })

    def _judge(
        self,
        item: pytest.Item,
        run: Run,
        figures: List[Figures],
        final: bool,
    ) -> List[str]:
        """Why the run fails on its memory: budgets, then the baseline; empty when it passes. Before
        teardown (`final` false) only peaks, which can only grow, are judged; each problem is
        reported once."""
        budget, measurement = run.budget, run.measurement
        assert measurement is not None
        problems = []
        over_devices = set()
        peak_over = False

        def new(what: str, device: int) -> bool:
            if (what, device) in run.reported:
                return False
            run.reported.add((what, device))
            return True

        for f in figures:
            if budget is not None and budget.device in (None, f.device):
                for what, figure, limit, text in (
                    ("peak", f.peak, budget.peak, budget.peak_text),
                    ("leak", f.leaked, budget.leak, budget.leak_text),
                ):
                    if (what == "leak" and not final) or limit is None or figure <= limit:
                        continue
                    if not new(what, f.device):
                        continue
                    problems.append(
                        "gpumem: {} on device {} was {} ({} bytes), over the budget of {} "
                        "({} in the gpumem marker)".format(
                            "peak" if what == "peak" else "leaked",
                            f.device,
                            _native.format_size(figure),
                            figure,
                            _native.format_size(limit),
                            text,
                        )
                    )
                    over_devices.add(f.device)
                    peak_over = peak_over or what == "peak"
            if self.baseline is not None and item.nodeid in self.baseline.nodeids:
                old = self.baseline.peaks.get((item.nodeid, f.device), 0)
                if f.peak > old * (1.0 + self.tolerance) and new("baseline", f.device):
                    problems.append(
                        "gpumem: peak on device {} grew from {} ({} bytes) to {} ({} bytes), "
                        "past the tolerance of {:g}% over the baseline {}".format(
                            f.device,
                            _native.format_size(old),
                            old,
                            _native.format_size(f.peak),
                            f.peak,
                            self.tolerance * 100,
                            self.baseline.path,
                        )
                    )
        for device in sorted(over_devices):
            problems.append(
                "  held on device {} {}, by module (change during the test): {}".format(
                    device,
                    "at the end" if final else "when the call ended",
                    measurement.held_by_module(device),
                )
            )
            live = measurement.largest_live(device)
            if live:
                problems.append("  largest allocations still held on device {}:".format(device))
                problems.extend("    " + line for line in live)
        if peak_over:
            problems.extend(measurement.lines_behind_the_peak())
        return problems

    # -- gathering (in the reporting process) --

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.runs_tests:
            self.logged.add(id(report))
        data = getattr(report, REPORT_ATTR, None)
        if self.is_worker or not isinstance(data, dict):
            return
        if data.get("unchecked"):
            self.session.unchecked += 1
            return
        self.session.emptied.update(data.get("emptied", []))
        rows = data.get("rows", [])
        if not rows:
            self.session.quiet.append(report.nodeid)
        outcome = RERUN if report.outcome == RERUN else data["outcome"]
        for device, peak, leaked in rows:
            self.session.rows.append(Row(report.nodeid, device, peak, leaked, outcome))
        if self.baseline is not None and report.nodeid not in self.baseline.nodeids:
            if report.nodeid not in self.session.missing_from_baseline:
                self.session.missing_from_baseline.append(report.nodeid)

    def _session_peaks(self) -> None:
        """Reads the session's group: its joint peak on each device the tests used."""
        name = os.environ.get(_native.ENV_GROUP)
        if not self.everything or not name:
            return
        self.session.group = name
        proc, me = process(), os.getpid()
        for device in sorted({r.device for r in self.session.rows}):
            try:
                stats = group(name).stats(device)
                peak, member = stats.peak, any(m.pid == me for m in stats.members)
            except _native.GpuMemHookError:  # no process of the session joined it
                peak, member = 0, False
            mine = proc.device_stats(device).peak if proc is not None else 0
            own = 0 if member else mine
            if peak == 0:  # no other process of the session used the device
                peak, own = mine, 0
            self.session.peaks.append(SessionPeak(device, peak, own, own == 0 and peak == mine))

    def _document(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": _native.__version__,
            "tests": [r.as_dict() for r in self.session.rows],
            "without_activity": self.session.quiet,
            "session": {
                "group": self.session.group,
                "devices": [p.as_dict() for p in self.session.peaks],
            },
        }
        return (json.dumps(doc, indent=1) + "\n").encode()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.is_worker:
            return
        self._session_peaks()
        for option, path in (("--gpumem-json", self.json_path), ("--gpumem-save", self.save_path)):
            if path is None:
                continue
            try:
                _native.write_file(str(path), self._document())
            except OSError as e:
                # Checked at the start, and still failing now (a full device): one line in the
                # summary and a failed session, never a traceback.
                self.session.unwritten[option] = "gpumem: {} not written: {}".format(option, e)
        if self.session.unwritten and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.is_worker:
            return
        tr = terminalreporter
        if self.everything or self.session.rows:
            self._summary(tr)
        unchecked = self.session.unchecked
        if unchecked:
            tr.write_line(
                "gpumem: {} budget{} not checked (this pytest runs without the hook); "
                "`pytest --gpumem` checks them".format(unchecked, "" if unchecked == 1 else "s"),
                yellow=True,
            )
        for line in self.session.unwritten.values():
            tr.write_line(line, red=True)

    def _summary(self, tr: Any) -> None:
        tr.write_sep("=", "gpumem: largest GPU memory peaks per test")
        for line in _table(self.session.rows):
            tr.write_line(line)
        for line in _session_lines(self.session):
            tr.write_line(line)
        if self.empty_cache:
            whose = ", ".join(sorted(self.session.emptied)) or "none was imported"
            tr.write_line(
                "caches emptied before and after each test (--gpumem-empty-cache): " + whose
            )
        else:
            tr.write_line(
                "cached memory counts: memory a framework's caching allocator keeps (PyTorch, "
                "CuPy, JAX) is held, and left behind, as far as the hook sees; "
                "--gpumem-empty-cache empties those caches around each test"
            )
        missing = self.session.missing_from_baseline
        if missing:
            tr.write_line(
                "not in the baseline {} (not compared): {} test{}".format(
                    self.baseline.path if self.baseline else "", len(missing),
                    "" if len(missing) == 1 else "s",
                )
            )
            for nodeid in missing:
                tr.write_line("  " + nodeid)
        for option, path in (("--gpumem-json", self.json_path), ("--gpumem-save", self.save_path)):
            if path is not None and option not in self.session.unwritten:
                tr.write_line("{}: {}".format(option, path))


def _session_lines(session: Session) -> Iterator[str]:
    """The session's peak on each device where other processes made it more than this pytest's
    own: their joint peak, or why it cannot be given."""
    for p in session.peaks:
        if p.alone:
            continue
        if p.own == 0:
            yield "session peak on device {}: {} (all its processes at once: group {})".format(
                p.device, _native.format_size(p.peak), session.group
            )
            continue
        yield (
            "session peak on device {}: not known: this pytest process, started under the hook "
            "without {}, is outside the session's group {} (its own peak {}; the group's, its "
            "workers' and children's at once, {}); `pytest --gpumem` started without the hook "
            "puts them all in it".format(
                p.device,
                _native.ENV_GROUP,
                session.group,
                _native.format_size(p.own),
                _native.format_size(p.peak),
            )
        )


def _outcome(reports: List[pytest.TestReport]) -> str:
    if any(r.failed for r in reports):
        return "failed"
    if any(r.skipped for r in reports):
        return "skipped"
    return "passed"


def _table(rows: List[Row]) -> Iterator[str]:
    if not rows:
        yield "no test used the GPU"
        return
    top = sorted(rows, key=lambda r: (-r.peak, r.nodeid, r.device))[:SUMMARY_ROWS]
    yield "{:>12}  {:>12}  {:>6}  {:<8}  {}".format("PEAK", "LEAKED", "DEVICE", "OUTCOME", "TEST")
    for r in top:
        yield "{:>12}  {:>12}  {:>6}  {:<8}  {}".format(
            _native.format_size(r.peak), _native.format_size(r.leaked), r.device, r.outcome,
            r.nodeid,
        )
    if len(rows) > len(top):
        yield "({} more rows in --gpumem-json)".format(len(rows) - len(top))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Removes the session's own group once the session is over (xdist's controller's, or the only
    pytest's: the one whose pid names it), so that it never outlives the session; a user's group
    is the user's, and stays."""
    name = os.environ.get(_native.ENV_GROUP)
    if _is_own_group(name) and not hasattr(config, "workerinput"):
        try:
            _native.remove_group(name)
        except (OSError, _native.GpuMemHookError) as e:  # the directory went, say
            sys.stderr.write("gpumemhook: cannot remove the session's group {}: {}\n".format(name, e))
        # pytest called as a function: the program that called it is not in the session.
        del os.environ[_native.ENV_GROUP]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        '{}(peak="1.5GiB", leak="0B", device=None): fail the test when its exact GPU memory '
        "peak (above its start, setup to teardown) or what it leaves held passes the budget "
        "(gpumemhook)".format(MARKER),
    )
    config.pluginmanager.register(Plugin(config), "gpumemhook-plugin")

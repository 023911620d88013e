"""gpumemhook: exactly how much GPU memory a program holds, and held at its peak.

Start the program under the preload library (its path is `library_path()`)::

    LD_PRELOAD=$(python -c 'import gpumemhook; print(gpumemhook.library_path())') python train.py

and, inside it:

* the exact API, in bytes: `scope` (context manager and decorator: used and peak deltas of a block,
  any number at once), `stats`, `used`, `peak`, `breakdown`, `reset_peak`, `set_limit`, `snapshot`,
  `processes`, `attach` (another process: read its counters, read and reset its scopes), `cards`
  and `emulate` (a card is chosen before start: ``GPUMEMHOOK_EMULATE=t4``);
* `gpumemhook.mem`: fastai's ``fastai.utils.mem`` and ipyexperiments' ``utils.mem``, same names, exact;
* `gpumemhook.zeta`: zeta's ``print_cuda_memory_usage``;
* ``%load_ext gpumemhook``: per-cell reports in IPython/Jupyter, like ipygpulogger;
* ``pytest --gpumem`` and ``@pytest.mark.gpumem(peak=..., leak=...)``: the pytest plugin
  (`gpumemhook.pytest_plugin`), exact per-test peaks, budgets and baselines.

Errors are `GpuMemHookError` and its subclasses `NotHookedError`, `ProcessGoneError`,
`LayoutVersionError`, `ScopeClosedError`.
"""

from __future__ import annotations

from typing import Any

from ._native import (
    DeviceStats,
    GpuMemHookError,
    LayoutVersionError,
    NotHookedError,
    Process,
    ProcessGoneError,
    Scope,
    ScopeClosedError,
    ScopeReading,
    __version__,
    format_size,
    parse_size,
)
from ._core import NotHookedWarning, cli_path, library_path
from ._api import (
    arm_oom_report,
    attach,
    breakdown,
    cards,
    current,
    emulate,
    group,
    is_hooked,
    peak,
    processes,
    reset_peak,
    scope,
    set_limit,
    snapshot,
    stats,
    used,
)
from .mem import GPUMemTrace, gpu_mem_leave_free_mbs, gpu_mem_trace
from .zeta import print_cuda_memory_usage

__all__ = [
    "__version__",
    "library_path",
    "cli_path",
    "is_hooked",
    "group",
    "current",
    "attach",
    "processes",
    "stats",
    "used",
    "peak",
    "breakdown",
    "arm_oom_report",
    "snapshot",
    "reset_peak",
    "set_limit",
    "emulate",
    "cards",
    "scope",
    "GPUMemTrace",
    "gpu_mem_trace",
    "gpu_mem_leave_free_mbs",
    "print_cuda_memory_usage",
    "format_size",
    "parse_size",
    "Process",
    "Scope",
    "ScopeReading",
    "DeviceStats",
    "GpuMemHookError",
    "NotHookedError",
    "ProcessGoneError",
    "LayoutVersionError",
    "ScopeClosedError",
    "NotHookedWarning",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext gpumemhook`: report GPU memory, its exact peak, RAM and time after every cell."""
    from .ipython import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext gpumemhook`."""
    from .ipython import unload_ipython_extension as unload

    unload(ipython)

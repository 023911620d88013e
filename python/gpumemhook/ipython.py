"""The IPython/Jupyter extension: after each cell, the GPU memory the cell consumed, the exact peak
above that, the total used, the time, and general RAM, as ipygpulogger reports them::

    %load_ext gpumemhook

    RAM: Consumed Peaked  Used Total | Exec time 0.004s
    Gen:        0      0      170 MB |
    GPU:     2467   1437     5465 MB |

``%gpumemhook compact`` switches to one line per cell, ``%gpumemhook full`` back, ``%gpumemhook
stop``/``start`` turn the reports off and on; ``%unload_ext gpumemhook`` removes the extension.

Under the hook the GPU peak is exact: the cell runs inside a scope of the segment, so a spike of a
millisecond is seen (ipygpulogger polled NVML from a thread every millisecond and could miss it),
and "used" is this process's memory, not the device's. The kernel must run under the hook
(``gpumemhook kernel install`` writes such a kernel, "Python 3 (gpumemhook)": docs/notebooks.md);
without it the extension says so once and shows sampled figures without peaks.

General RAM is measured as ipygpulogger does: ``tracemalloc`` for what Python allocated and peaked
during the cell, the resident set size for the total.
"""

from __future__ import annotations

import gc
import os
import time
import tracemalloc
from collections import namedtuple
from typing import Any, Optional

from ._core import Window, empty_caches

__all__ = [
    "GPUMemLogger",
    "IPyGPULogger",
    "IPyGPULoggerData",
    "load_ipython_extension",
    "unload_ipython_extension",
]

IPyGPULoggerData = namedtuple(
    "IPyGPULoggerData",
    [
        "gen_mem_used_delta",
        "gen_mem_peaked",
        "gen_mem_used",
        "gpu_mem_used_delta",
        "gpu_mem_peaked",
        "gpu_mem_used",
        "time_delta",
    ],
)

_MB = 2**20


def _rss_bytes() -> int:
    """Resident set size of this process (no psutil needed on Linux)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class GPUMemLogger:
    """Reports memory and time after every cell of an IPython shell (ipygpulogger's
    ``IPyGPULogger``, with an exact GPU peak under the hook).

    `compact`: one line per cell. `gc_collect`: collect garbage (and empty torch's cache) before the
    end-of-cell measurement, so that freed-but-uncollected objects do not count; turn it off when
    hunting reference cycles.
    """

    def __init__(self, ipython: Any = None, compact: bool = False, gc_collect: bool = True) -> None:
        if ipython is None:
            ipython = _current_shell()
        self.ipython = ipython
        self.compact = compact
        self.gc_collect = gc_collect
        self.running = False
        self._window: Optional[Window] = None
        self._time_start = 0.0
        self._traced_by_us = False
        self._gen_base = 0
        self._data = IPyGPULoggerData(0, 0, 0, 0, 0, 0, 0.0)

    @property
    def data(self) -> IPyGPULoggerData:
        """The last cell's figures: RAM in MB (general RAM as floats, GPU as whole MBs), time in s."""
        return self._data

    def start(self) -> "GPUMemLogger":
        """Start reporting after every cell (from the current cell on)."""
        if self.running:
            return self
        self.running = True
        self.ipython.events.register("pre_run_cell", self.pre_run_cell)
        self.ipython.events.register("post_run_cell", self.post_run_cell)
        # The cell that started us is already running: begin its measurement now.
        self.pre_run_cell()
        return self

    def stop(self) -> None:
        """Stop reporting."""
        if not self.running:
            return
        self.running = False
        for event, callback in (
            ("pre_run_cell", self.pre_run_cell),
            ("post_run_cell", self.post_run_cell),
        ):
            try:
                self.ipython.events.unregister(event, callback)
            except ValueError:
                pass
        if self._traced_by_us and tracemalloc.is_tracing():
            tracemalloc.stop()
        self._traced_by_us = False
        if self._window is not None:
            self._window.close()
            self._window = None

    # IPython passes an `info`/`result` argument since 7.0 and none before; accept both.
    def pre_run_cell(self, *_: Any) -> None:
        if not self.running:
            return
        if tracemalloc.is_tracing():
            if not self._traced_by_us:
                tracemalloc.reset_peak()
        else:
            tracemalloc.start()
            self._traced_by_us = True
        self._gen_base = tracemalloc.get_traced_memory()[0]
        if self._window is None:
            self._window = Window("ipython cell", what="the gpumemhook IPython extension")
        else:
            self._window.reset()
        self._time_start = time.time()

    def post_run_cell(self, *_: Any) -> None:
        if not self.running or self._window is None:
            return
        time_delta = time.time() - self._time_start
        if self.gc_collect:
            gc.collect()
            empty_caches()
        current, peak = tracemalloc.get_traced_memory()
        if self._traced_by_us:
            tracemalloc.stop()
            self._traced_by_us = False
        gen_delta = (current - self._gen_base) / _MB
        gen_peaked = max(0, peak - current) / _MB
        gen_used = _rss_bytes() // _MB

        reading = self._window.reading()
        gpu_delta = int(reading.delta_used / _MB)
        gpu_peaked = reading.peak_above_used // _MB
        gpu_total = reading.used // _MB

        self._data = IPyGPULoggerData(
            gen_delta, gen_peaked, gen_used, gpu_delta, gpu_peaked, gpu_total, time_delta
        )
        print(self.format())

    def format(self) -> str:
        """The report of the last cell, compact or not."""
        d = self._data
        if self.compact:
            return (
                f"Gen: {d.gen_mem_used_delta:0.0f}/{d.gen_mem_peaked:0.0f}/{d.gen_mem_used:0.0f} MB"
                f" | GPU: {d.gpu_mem_used_delta:0.0f}/{d.gpu_mem_peaked:0.0f}/{d.gpu_mem_used:0.0f} MB"
                f" | Time {d.time_delta:0.3f}s | (Consumed/Peaked/Used Total)"
            )
        return (
            f"RAM: Consumed Peaked  Used Total | Exec time {d.time_delta:0.3f}s\n"
            f"Gen:    {d.gen_mem_used_delta:5.0f}  {d.gen_mem_peaked:5.0f}    {d.gen_mem_used:5.0f} MB |\n"
            f"GPU:    {d.gpu_mem_used_delta:5.0f}  {d.gpu_mem_peaked:5.0f}    {d.gpu_mem_used:5.0f} MB |"
        )


def _current_shell() -> Any:
    """The running IPython shell, found as ipygpulogger finds it, or a clear error outside one."""
    try:
        from IPython import get_ipython  # only when used outside `%load_ext`
    except ImportError:
        get_ipython = None
    shell = get_ipython() if get_ipython is not None else None
    if shell is None:
        raise RuntimeError(
            "IPyGPULogger reports after every cell of an IPython shell or Jupyter kernel, and none "
            "is running here; use it inside IPython/Jupyter (or `%load_ext gpumemhook` there)"
        )
    return shell


class IPyGPULogger(GPUMemLogger):
    """ipygpulogger's ``IPyGPULogger``, with its signature: ``IPyGPULogger(compact=False,
    gc_collect=True)``, the shell found by itself. Change one import::

        from ipygpulogger import IPyGPULogger        # before
        from gpumemhook.ipython import IPyGPULogger  # after
        IPyGPULogger(compact=True).start()

    Same reports and `data`; the GPU peak is exact under the hook."""

    def __init__(self, compact: bool = False, gc_collect: bool = True) -> None:
        super().__init__(None, compact=compact, gc_collect=gc_collect)


_logger: Optional[GPUMemLogger] = None


def _magic(line: str) -> None:
    """%gpumemhook [start|stop|compact|full]: control the per-cell report."""
    global _logger
    word = line.strip().lower()
    if _logger is None:
        print("gpumemhook: the extension is not loaded; run %load_ext gpumemhook")
        return
    if word in ("", "start", "on"):
        _logger.start()
    elif word in ("stop", "off"):
        _logger.stop()
    elif word == "compact":
        _logger.compact = True
    elif word in ("full", "long"):
        _logger.compact = False
    else:
        print("usage: %gpumemhook [start|stop|compact|full]")


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext gpumemhook`: start reporting after every cell."""
    global _logger
    if _logger is not None:
        _logger.stop()
    _logger = GPUMemLogger(ipython)
    register = getattr(ipython, "register_magic_function", None)
    if register is not None:
        register(_magic, magic_kind="line", magic_name="gpumemhook")
    _logger.start()


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext gpumemhook`: stop reporting."""
    global _logger
    if _logger is not None:
        _logger.stop()
        _logger = None

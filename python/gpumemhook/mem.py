"""Drop-in replacements for fastai's ``fastai.utils.mem`` and ipyexperiments' ``utils.mem``, exact
under the hook.

Change one import::

    from fastai.utils.mem import *            # before
    from gpumemhook.mem import *              # after

Same names, signatures, return types and report lines. What changes under the hook:

* ``used`` is this process's exact device bytes (every allocation through the CUDA driver,
  caching allocators' reserves and library workspaces included), not NVML's device-wide figure
  that mixes in other processes;
* ``GPUMemTrace`` reads its peak from a scope of the segment: exact, every spike of every thread,
  no polling thread;
* ``total``/``free`` are NVML's device-wide figures (as fastai reads them), seen through the ceiling
  when one is set (``GPUMEMHOOK_LIMIT``, ``gpumemhook.set_limit``, ``gpu_mem_leave_free_mbs``);
* ``gpu_mem_leave_free_mbs`` sets a ceiling instead of allocating memory.

Without NVML (no NVIDIA driver) the functions give fastai's CPU answers: ``GPUMemory(0, 0, 0)``,
``[]``, ``(None, 0)``. Without the hook, the tracing functions say once how to start the program with
it and fall back to approximate figures instead of failing.

This module is the facade, fastai's and ipyexperiments' names; its helpers live apart: the CUDA
runtime binding that allocates without a framework in `_cudart`, the stack of ceilings that
`gpu_mem_leave_free_mbs` sets and lifts in `_ceiling`.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import traceback
import warnings
from collections import namedtuple
from typing import Any, Callable, List, Optional, Tuple

from . import _native, _nvml
from ._ceiling import CeilingHold
from ._core import (
    Window,
    current_device,
    empty_caches,
    hint_once,
    is_counted_device,
    process,
    torch_cuda,
)
from ._cudart import CudaBuffer

__all__ = [
    # fastai.utils.mem
    "GPUMemory",
    "b2mb",
    "preload_pytorch",
    "gpu_mem_get",
    "gpu_mem_get_all",
    "gpu_mem_get_free",
    "gpu_mem_get_free_no_cache",
    "gpu_mem_get_used",
    "gpu_mem_get_used_no_cache",
    "gpu_mem_get_used_fast",
    "gpu_with_max_free_mem",
    "GPUMemTrace",
    "gpu_mem_trace",
    "gpu_mem_restore",
    "gpu_mem_restore_ctx",
    "get_ref_free_exc_info",
    # what `from fastai.utils.mem import *` brings along from fastai's own imports
    "use_gpu",
    "is_osx",
    "IS_IN_IPYTHON",
    "torch",
    "np",
    # ipyexperiments.utils.mem
    "gpu_mem_get_mbs",
    "gpu_mem_get_total_mbs",
    "gpu_mem_get_free_mbs",
    "gpu_mem_get_free_no_cache_mbs",
    "gpu_mem_get_used_mbs",
    "gpu_mem_get_used_no_cache_mbs",
    "gpu_mem_allocate_mbs",
    "gpu_mem_leave_free_mbs",
]

GPUMemory = namedtuple("GPUMemory", ["total", "free", "used"])


# ---- names fastai's star import brings along --------------------------------------------------------
#
# `from fastai.utils.mem import *` also gives `use_gpu`, `is_osx`, `IS_IN_IPYTHON`, `torch` and `np`
# (from fastai's own imports), and scripts use them. The cheap ones are computed here; `torch`,
# `np` and `use_gpu` are resolved on first access (module `__getattr__`, which a star import goes
# through too), so that `import gpumemhook` imports no framework. Importing torch does not
# initialise CUDA, and `use_gpu` asks NVML rather than `torch.cuda.is_available()`, which would.


def _is_in_ipython() -> bool:
    """fastai's ``is_in_ipython``: started by ipython/jupyter-notebook, or in a notebook kernel
    (or, beyond fastai's test, inside an IPython shell that is already running)."""
    program_name = os.path.basename(os.getenv("_", ""))
    if (
        "jupyter-notebook" in program_name
        or "ipython" in program_name
        or "JPY_PARENT_PID" in os.environ
    ):
        return True
    return _in_ipython()


is_osx = sys.platform == "darwin"


def _optional_module(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        return None


def _use_gpu() -> bool:
    """Whether a CUDA GPU can be used: NVML sees one, and torch (when installed) was built with
    CUDA. Unlike ``torch.cuda.is_available()`` this never initialises CUDA."""
    if _nvml.device_count() == 0:
        return False
    torch = _module_attr("torch")
    if torch is None:
        return True
    backends = getattr(torch, "backends", None)
    is_built = getattr(getattr(backends, "cuda", None), "is_built", None)
    if is_built is not None:
        return bool(is_built())
    return getattr(getattr(torch, "version", None), "cuda", None) is not None


_LAZY = {
    "torch": lambda: _optional_module("torch"),
    "np": lambda: _optional_module("numpy"),
    "use_gpu": _use_gpu,
}


def _module_attr(name: str) -> Any:
    if name not in globals():
        globals()[name] = _LAZY[name]()
    return globals()[name]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return _module_attr(name)
    raise AttributeError("module {!r} has no attribute {!r}".format(__name__, name))


def b2mb(num: float) -> int:
    """convert Bs to MBs and round down"""
    return int(num / 2**20)


def preload_pytorch() -> None:
    """Do a small operation on CUDA to get the pytorch/cuda structures in place (a no-op without
    torch or without a GPU). Under the hook, what CUDA's first use costs is counted exactly, so this
    matters only for comparing numbers taken before and after that first use."""
    torch = torch_cuda()
    if torch is not None:
        torch.ones((1, 1)).cuda()


# ---- point-in-time figures ------------------------------------------------------------------------


def _device_or_none(id: Any) -> Optional[int]:
    if id is None:
        return current_device()
    try:
        index = int(id)
    except (TypeError, ValueError):
        return None
    return index if index >= 0 else None


def _gpu_mem_get_bytes(device: Optional[int]) -> Optional[Tuple[int, int, int]]:
    """(total, free, used) in bytes, or None when NVML does not know the device."""
    if device is None:
        return None
    info = _nvml.memory_info(device)
    if info is None:
        return None
    total, free, used = info
    p = process()
    if p is not None and is_counted_device(device):
        free, total = p.ceiling_view(device, free, total)
        # Allocations, plus the context charged inside an emulated card (GPUMEMHOOK_EMULATE).
        used = p.own_use(device, total)
    return total, free, used


def gpu_mem_get(id: Optional[int] = None) -> GPUMemory:
    """get total, used and free memory (in MBs) for gpu `id`. if `id` is not passed, currently
    selected torch device is used

    * for gpu returns `GPUMemory(total, free, used)`; under the hook `used` is this process's exact
      use and `total`/`free` are seen through the ceiling
    * for cpu (no NVML) returns `GPUMemory(0, 0, 0)`
    * for invalid gpu id returns `GPUMemory(0, 0, 0)`
    """
    figures = _gpu_mem_get_bytes(_device_or_none(id))
    if figures is None:
        return GPUMemory(0, 0, 0)
    return GPUMemory(*map(b2mb, figures))


def gpu_mem_get_all() -> List[GPUMemory]:
    """get total, used and free memory (in MBs) for each available gpu; `[]` for cpu"""
    return [gpu_mem_get(i) for i in range(_nvml.device_count())]


def gpu_mem_get_free() -> int:
    """get free memory (in MBs) for the currently selected gpu id, w/o emptying the cache"""
    return gpu_mem_get().free


def gpu_mem_get_free_no_cache() -> int:
    """get free memory (in MBs) for the currently selected gpu id, after emptying the cache"""
    empty_caches()
    return gpu_mem_get().free


def gpu_mem_get_used() -> int:
    """get used memory (in MBs) for the currently selected gpu id, w/o emptying the cache; exact
    (this process's bytes) under the hook, even without NVML"""
    p = process()
    if p is not None:
        return b2mb(p.used(current_device()))
    return gpu_mem_get().used


def gpu_mem_get_used_no_cache() -> int:
    """get used memory (in MBs) for the currently selected gpu id, after emptying the cache"""
    empty_caches()
    return gpu_mem_get_used()


def gpu_mem_get_used_fast(gpu_handle: Any) -> int:
    """get used memory (in MBs) for the gpu of `gpu_handle`, w/o emptying the cache.

    `gpu_handle` is an NVML handle (pynvml's ``nvmlDeviceGetHandleByIndex(id)``) or a CUDA device
    index. Under the hook this is one atomic load of this process's exact use on that very GPU
    (an NVML handle is mapped to this process's CUDA ordinal through ``CUDA_VISIBLE_DEVICES``); a
    GPU the process cannot see, or a handle that cannot be mapped, gets NVML's figure for that
    handle, as fastai returns it."""
    if isinstance(gpu_handle, int) and not isinstance(gpu_handle, bool):
        device: Optional[int] = gpu_handle
    else:
        device = _nvml.cuda_ordinal_of_handle(gpu_handle)
        if device is None:
            info = _nvml.memory_info_of_handle(gpu_handle)
            return b2mb(info[2]) if info is not None else 0
    p = process()
    if p is not None and device is not None and is_counted_device(device):
        return b2mb(p.used(device))
    if device is not None:
        info = _nvml.memory_info(device)
    else:
        info = _nvml.memory_info_of_handle(gpu_handle)
    return b2mb(info[2]) if info is not None else 0


def gpu_with_max_free_mem() -> Tuple[Optional[int], int]:
    """get [gpu_id, its_free_ram] for the first gpu with highest available RAM; `(None, 0)` for cpu"""
    mem_all = gpu_mem_get_all()
    if not mem_all:
        return None, 0
    best = max(range(len(mem_all)), key=lambda i: (mem_all[i].free, -i))
    return best, mem_all[best].free


# ---- ipyexperiments.utils.mem -----------------------------------------------------------------------


def gpu_mem_get_mbs(id: Optional[int] = None) -> GPUMemory:
    """Query nvidia for total, used and free memory for gpu in MBs. if id is not passed, currently
    selected torch device is used"""
    return gpu_mem_get(id)


def gpu_mem_get_total_mbs() -> int:
    """Return the amount of total memory (in rounded MBs)"""
    return gpu_mem_get().total


def gpu_mem_get_free_mbs() -> int:
    """Return the amount of free memory (in rounded MBs)"""
    return gpu_mem_get_free()


def gpu_mem_get_free_no_cache_mbs() -> int:
    """Return the amount of free memory after flushing caching (in rounded MBs)"""
    return gpu_mem_get_free_no_cache()


def gpu_mem_get_used_mbs() -> int:
    """Return the amount of used memory (in rounded MBs)"""
    return gpu_mem_get_used()


def gpu_mem_get_used_no_cache_mbs() -> int:
    """Return the amount of used memory after flushing caching (in rounded MBs)"""
    return gpu_mem_get_used_no_cache()


def _allocate_bytes(nbytes: int, device: int) -> Any:
    torch = torch_cuda()
    if torch is not None:
        # What ipyexperiments allocates: float32 elements, 4 bytes each.
        return torch.ones((nbytes // 4,), device="cuda:{}".format(device)).contiguous()
    return CudaBuffer(nbytes, device)


def gpu_mem_allocate_mbs(n: int, fatal: bool = False) -> Any:
    """Try to allocate `n` MBs.

    Return the variable holding the allocated memory on success (a torch tensor, or without torch
    a `CudaBuffer` from the CUDA runtime), `None` on failure. Delete the variable to free up the
    memory. `fatal=True` will throw an exception on failure to allocate (default is `False`)."""
    try:
        return _allocate_bytes(int(n) * 2**20, current_device())
    except Exception:
        if fatal:
            raise
        return None


class LessMemoryThanAskedError(AssertionError):
    """`gpu_mem_leave_free_mbs(n)` was asked to leave more free than the GPU has (or a negative
    amount). An `AssertionError`, as ipyexperiments raises it, so code catching that still does."""


def gpu_mem_leave_free_mbs(n: int) -> Any:
    """Make the current GPU look like it has only `n` MBs free, to reproduce an out-of-memory error
    anywhere.

    Under the hook no memory is taken: a ceiling is set at this process's used bytes + `n` MiB
    (never above what the device really has free plus used), and a `CeilingHold` is returned;
    deleting it (or `.release()`) lifts the ceiling. Like ipyexperiments it refuses to leave more
    free than there is available, or a negative amount: `LessMemoryThanAskedError`, an
    `AssertionError` worded as ipyexperiments words it. Without the hook it allocates like
    ipyexperiments does (through torch) and returns the tensor holding the memory, or None without
    torch."""
    device = current_device()
    n = int(n)
    keep_free = n * 2**20
    p = process()
    if p is not None:
        info = _nvml.memory_info(device)
        # ipyexperiments refuses to leave more free than there is (its assertion, its words); the
        # same when NVML cannot tell what is free but a ceiling already bounds it. A negative n
        # asks for less than nothing: refused alike.
        avail = None
        if info is not None:
            avail = gpu_mem_get_free_mbs()
        else:
            limit = p.limit(device) if is_counted_device(device) else None
            if limit is not None:
                avail = b2mb(max(0, limit - p.used(device)))
        if n < 0 or (avail is not None and not avail > n) or keep_free > _native.MAX_SIZE:
            raise LessMemoryThanAskedError(
                "already have less available mem than desired {}MBs".format(n)
                + (" ({}MBs available)".format(avail) if avail is not None else "")
            )
        return CeilingHold(p, device, keep_free, None if info is None else info[1])
    hint_once("gpu_mem_leave_free_mbs")
    torch = torch_cuda()
    if torch is None:
        return None
    avail = gpu_mem_get_free_mbs()
    assert avail > n, "already have less available mem than desired {}MBs".format(n)
    consume = avail - n
    buf = gpu_mem_allocate_mbs(consume)
    assert buf is not None, "failed to allocate {}MB".format(consume)
    return buf


# ---- exception helpers (fastai) --------------------------------------------------------------------


def _in_ipython() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        return ipython.get_ipython() is not None
    except Exception:
        return False


IS_IN_IPYTHON = _is_in_ipython()


def get_ref_free_exc_info() -> Tuple[Any, Any, Any]:
    """Free traceback from references to locals() in each frame to avoid circular reference leading
    to gc.collect() unable to reclaim memory"""
    type_, val, tb = sys.exc_info()
    traceback.clear_frames(tb)
    return (type_, val, tb)


def gpu_mem_restore(func: Callable[..., Any]) -> Callable[..., Any]:
    """Reclaim GPU RAM if CUDA out of memory happened, or execution was interrupted.

    Under IPython, strips the traceback's frames (which hold the locals, and through them GPU
    memory) for "CUDA out of memory" and "device-side assert triggered" errors; the environment
    variable ``FASTAI_TB_CLEAR_FRAMES`` set to "0" never strips, "1" always does. Outside IPython it
    does nothing."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tb_clear_frames = os.environ.get("FASTAI_TB_CLEAR_FRAMES", None)
        if not _in_ipython() or tb_clear_frames == "0":
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        except Exception as e:
            message = str(e)
            if (
                "CUDA out of memory" in message
                or "device-side assert triggered" in message
                or tb_clear_frames == "1"
            ):
                _, val, tb = get_ref_free_exc_info()  # must!
                gc.collect()
                if "device-side assert triggered" in message:
                    warnings.warn(
                        "When 'device-side assert triggered' error happens, it's not possible to "
                        "recover and you must restart the kernel to continue. Use "
                        "os.environ['CUDA_LAUNCH_BLOCKING']=\"1\" before restarting to debug"
                    )
                raise val.with_traceback(tb) from None
            raise  # re-raises the exact last exception

    return wrapper


class gpu_mem_restore_ctx:
    """context manager to reclaim RAM if an exception happened under ipython"""

    def __enter__(self) -> "gpu_mem_restore_ctx":
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> bool:
        if not exc_val:
            return True
        traceback.clear_frames(exc_tb)
        gc.collect()
        raise exc_val.with_traceback(exc_tb) from None


# ---- tracing ------------------------------------------------------------------------------------


class _Silent:
    """The value of `GPUMemTrace.silent`: fastai documents both ``mtrace.silent(silent=False)`` and
    ``mtrace.silent = False``, so it is a truth value that can also be called."""

    __slots__ = ("_trace",)

    def __init__(self, trace: "GPUMemTrace") -> None:
        self._trace = trace

    def __call__(self, silent: bool = True) -> None:
        self._trace._silent = bool(silent)

    def __bool__(self) -> bool:
        return self._trace._silent

    def __eq__(self, other: object) -> bool:
        return bool(self) == other

    def __hash__(self) -> int:
        return hash(bool(self))

    def __repr__(self) -> str:
        return repr(bool(self))


class GPUMemTrace:
    """Trace allocated and peaked GPU memory usage (deltas), in MBs.

    * **Delta Used** is the difference between current used memory and used memory at the start
      of the counter.
    * **Delta Peaked** is the memory overhead if any: the peak minus the used memory at the start,
      minus delta used when that is positive. It indicates the size of the blip.

    Under the hook the peak comes from a scope of the segment: exact (every allocation of every
    thread folds into it), resettable, and any number of traces may run at once. There is no
    polling thread. Without the hook it says once how to start with it and reports deltas of
    sampled figures (no peaks).

    Arguments: `silent` makes `report`/`report_n_reset` print nothing; `ctx` is the default context
    note in reports; `on_exit_report` reports automatically on context-manager exit (default True).
    """

    def __init__(self, silent: bool = False, ctx: Optional[str] = None, on_exit_report: bool = True):
        self._silent = bool(silent)
        self.ctx = ctx
        self.on_exit_report = on_exit_report
        self._window: Optional[Window] = None
        # The reading at the last stop, what a stopped trace reports.
        self._frozen = _native.ScopeReading(0, 0, 0, 0)
        self.is_running = False
        self.delta_used = 0
        self.delta_peaked = 0
        self.start()

    silent = property(
        lambda self: _Silent(self),
        lambda self, value: setattr(self, "_silent", bool(value)),
        doc="Truthy when reports are silenced; call it (`silent(True)`) or assign it to change.",
    )

    def reset(self) -> None:
        """Restart the counters: used at start and the peak become the current used."""
        if self._window is not None:
            self._window.reset()
        self.delta_used = 0
        self.delta_peaked = 0

    def data_set(self) -> None:
        """Compute `delta_used` and `delta_peaked` (MBs) from the trace's window."""
        if self._window is None:
            return
        reading = self._window.reading()
        self.delta_used = b2mb(reading.delta_used)
        self.delta_peaked = b2mb(reading.delta_peaked)

    def data(self) -> Tuple[int, int]:
        """(delta_used, delta_peaked) in MBs; frozen once the trace is stopped."""
        if self.is_running:
            self.data_set()
        return self.delta_used, self.delta_peaked

    def data_bytes(self) -> Tuple[int, int]:
        """(delta_used, delta_peaked) in bytes, exact under the hook; frozen once stopped."""
        reading = self._window.reading() if self._window is not None else self._frozen
        return reading.delta_used, reading.delta_peaked

    def start(self) -> None:
        """Start (or restart) tracing from now."""
        if self._window is None:
            self._window = Window(self.ctx or "GPUMemTrace", what="GPUMemTrace")
        else:
            self._window.reset()
        self.is_running = True
        self.delta_used = 0
        self.delta_peaked = 0

    def stop(self) -> None:
        """Stop tracing and freeze the data (`data()` then returns what it measured)."""
        if not self.is_running:
            return
        self.is_running = False
        window, self._window = self._window, None
        if window is not None:
            self._frozen = window.close()
            self.delta_used = b2mb(self._frozen.delta_used)
            self.delta_peaked = b2mb(self._frozen.delta_peaked)

    def __enter__(self) -> "GPUMemTrace":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self.on_exit_report:
            self.report("exit")

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass

    def __repr__(self) -> str:
        used, peaked = self.data()
        return "△Used Peaked MB: %6d %6d" % (used, peaked)

    def _get_ctx(self, subctx: Optional[str] = None) -> str:
        """Return ' (ctx: subctx)' or ' (ctx)' or ' (subctx)' or '' depending on this and
        constructor arguments"""
        parts = [str(p) for p in (self.ctx, subctx) if p is not None]
        return " ({})".format(": ".join(parts)) if parts else ""

    def report(self, subctx: Optional[str] = None) -> None:
        """Print delta used+peaked, and an optional context note, which can also be preset in
        constructor"""
        if self._silent:
            return
        print("{}{}".format(self.__repr__(), self._get_ctx(subctx)))

    def report_n_reset(self, subctx: Optional[str] = None) -> None:
        """Print delta used+peaked, and an optional context note. Then reset counters"""
        self.report(subctx)
        self.reset()

    # fastai's thread-based monitor, kept as no-ops for code that calls them: the scope measures
    # every allocation, so there is nothing to poll.
    def peak_monitor_start(self) -> None:
        """No-op (kept for compatibility): peaks come from the hook, not from a thread."""

    def peak_monitor_stop(self) -> None:
        """No-op (kept for compatibility)."""

    def peak_monitor_func(self) -> None:
        """No-op (kept for compatibility)."""


def gpu_mem_trace(func: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator that runs `GPUMemTrace` w/ report on func"""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with GPUMemTrace(ctx=func.__qualname__, on_exit_report=True):
            return func(*args, **kwargs)

    return wrapper

"""The exact API: scopes, counters, peak resets, ceilings and other processes, in bytes.

Unlike the compatibility layers (`gpumemhook.mem`, `gpumemhook.zeta`, the IPython extension),
which fall back to approximate numbers without the hook, these functions are exact or raise
`NotHookedError`: a wrong number that looks exact is worse than an error that says how to fix it.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union

from . import _native
from ._core import current_device, process, require_process

F = TypeVar("F", bound=Callable[..., Any])


def _device(device: Optional[int]) -> int:
    return current_device() if device is None else int(device)


def is_hooked() -> bool:
    """True when the preload library is loaded in this process (and counting)."""
    return process() is not None


def current() -> _native.Process:
    """This process's segment; raises `NotHookedError` without the hook."""
    return require_process()


def attach(pid: int) -> _native.Process:
    """The segment of another hooked process of this user: read its counters, open, read, reset or
    close its scopes, change its ceiling. Raises `NotHookedError` (no segment: not started under
    the hook), `ProcessGoneError` or `LayoutVersionError`."""
    return _native.Process.attach(int(pid))


def processes() -> List[_native.Process]:
    """Every live hooked process of this user on this machine, by pid. Segment files left by
    processes that died are removed on the way."""
    return _native.list_processes()


def stats(device: Optional[int] = None) -> _native.DeviceStats:
    """All counters of this process on `device` (default: the current device): used, peak, limit,
    allocs, frees, denied, failed, total_allocated, managed, managed_peak."""
    return require_process().device_stats(_device(device))


def used(device: Optional[int] = None) -> int:
    """Device bytes this process holds now on `device` (default: the current device)."""
    return require_process().used(_device(device))


def peak(device: Optional[int] = None) -> int:
    """The largest `used` since start or the last `reset_peak` on `device` (default: current)."""
    return require_process().peak(_device(device))


def breakdown(device: Optional[int] = None, by: str = "module") -> List[Tuple[str, int, int, int]]:
    """Who holds the memory of `device` (default: the current device): `(module, used, peak,
    live_allocs)` rows, largest `used` first, one per shared object that called into CUDA (its file
    name, such as ``libc10_cuda.so``; the executable's name for the program itself; ``other`` past
    the 32 named ones). `peak` is since the process started; `live_allocs` counts the allocations
    held now (`stats().allocs` counts every one made).

    ``by="site"``: `(site, used, peak, live_allocs)` rows per Python call site instead (a program run
    with ``GPUMEMHOOK_STACKS=python:<min bytes>``; empty before any site was recorded), all devices
    together: `device` must then be left out. A site is its frames, innermost first, joined by
    ``" < "``."""
    if by == "site":
        if device is not None:
            raise ValueError("breakdown(by='site') counts all devices together: leave out device")
        return require_process().site_breakdown()
    if by != "module":
        raise ValueError("breakdown(by=...) is 'module' or 'site', not {!r}".format(by))
    return require_process().breakdown(_device(device))


def arm_oom_report() -> bool:
    """Lets the next out-of-memory write a `GPUMEMHOOK_OOM_REPORT` again (the hook writes one per
    process otherwise): call it at the start of each step for one report per step, with ``%n`` in
    the path to number them. Returns False when `GPUMEMHOOK_OOM_REPORT` is not set."""
    return require_process().arm_oom_report()


def snapshot(pid: Optional[int] = None) -> Dict[str, Any]:
    """Everything the segment of this process (or of `pid`) holds, as the exit report's dict."""
    proc = require_process() if pid is None else attach(pid)
    return json.loads(proc.snapshot_json())


def reset_peak(device: Optional[int] = None) -> None:
    """Restarts the peak of `device` from the current `used`; `None` (default) resets every
    device, as `GPUMEMHOOK_LIMIT` without an index means every device."""
    require_process().reset_peak(None if device is None else int(device))


def set_limit(limit: Union[int, str, None], device: Optional[int] = None) -> None:
    """Sets this process's allocation ceiling, effective at the next allocation: `limit` in bytes
    (an int) or a size with its unit (``"8GiB"``, ``"4096B"``: a bare ``"8"`` is refused), `None`
    to lift it; `device=None` means every device.

    Allocations that would pass the ceiling fail with CUDA's out-of-memory error without reaching
    the driver, and `cudaMemGetInfo` reports the ceiling's view, so an 80 GB card behaves like a
    smaller one."""
    if isinstance(limit, bool) or not (limit is None or isinstance(limit, (int, str))):
        # A float is no byte count: set_limit(1.9) would be a 1-byte ceiling, set_limit(0.5) "0B".
        raise TypeError(
            "limit must be a whole number of bytes (int), a size string such as '1.5GiB', or None; "
            "got {} {!r}".format(type(limit).__name__, limit)
        )
    if limit is not None:
        # A number is bytes: read as the same size written out in bytes ("4096B"), so that 0, a
        # negative number or one past what the segment can hold is refused with the words of
        # GPUMEMHOOK_LIMIT=0B and `gpumemhook limit PID 0B`. A string must carry its unit.
        limit = _native.parse_size(limit if isinstance(limit, str) else "{}B".format(int(limit)))
    require_process().set_limit(limit, None if device is None else int(device))


EMULATE_ENV = _native.ENV_EMULATE


def cards() -> List[Dict[str, Any]]:
    """The cards `emulate` and ``GPUMEMHOOK_EMULATE`` know, smallest first: each a dict with
    ``name``, ``total`` (bytes, as ``nvidia-smi`` shows the card) and ``full_name``."""
    return [{"name": n, "total": t, "full_name": f} for (n, t, f) in _native.cards()]


def emulate(card: str) -> None:
    """Would make this process's devices behave like `card` (a name from `cards()` or a size such as
    ``"12GiB"``): its total memory everywhere, with the process's context charged inside it.

    The hook reads its settings once, when the program starts, and a card's context overhead is
    measured from the first allocation on, so a card cannot be chosen from inside a running
    program: set ``GPUMEMHOOK_EMULATE=<card>`` before it starts (or ``gpumemhook run --emulate``).
    This raises `GpuMemHookError` saying so, except when the process already runs on that card,
    where it does nothing. An unknown card or a zero size raises `ValueError` listing the cards."""
    label, total = _native.parse_card(str(card))
    started = os.environ.get(EMULATE_ENV)
    if started is not None and is_hooked():
        try:
            if _native.parse_card(started) == (label, total):
                return
        except ValueError:
            pass
    raise _native.GpuMemHookError(
        f"cannot emulate {label} from inside a running program: the hook reads its settings when "
        f"the program starts. Set {EMULATE_ENV}={card} before starting it, or run it with "
        f"`gpumemhook run --emulate {card} -- ...`"
        + (f" (this process started with {EMULATE_ENV}={started})" if started else "")
    )


class scope:
    """Exact used and peak deltas, in bytes, of a block or of each call of a function.

    As a context manager::

        with gpumemhook.scope("forward") as s:
            y = model(x)
        print(s.delta_used, s.delta_peak)   # bytes; exact, spikes included

    As a decorator (each call opens its own scope; the object keeps the last call's reading)::

        @gpumemhook.scope()
        def step(batch): ...
        step(b)
        print(step.scope.delta_peak)

    Readings while open are live; after the block they are frozen. Any number of scopes may be open
    at once, nested or in other threads, each with its own exact peak. Needs the hook (raises
    `NotHookedError` otherwise). `device` defaults to the current device.

    ``group="job"`` measures the group ``job`` instead (docs/groups.md, group scopes): the most all
    its processes held at once above what they held at entry, ``used`` the group's. It needs no
    hook in this process (any process of the user may measure a group), and takes one of the
    group's 16 scope slots until the block ends.
    """

    def __init__(
        self, name: Optional[str] = None, device: Optional[int] = None, group: Optional[str] = None
    ) -> None:
        self.name = name
        self.device = device
        self.group = group
        self._lock = threading.Lock()
        self._native: Optional[Union[_native.Scope, _GroupScope]] = None
        self._device_used: Optional[int] = None
        self._last: Optional[_native.ScopeReading] = None

    # -- context manager -------------------------------------------------------------------------

    def __enter__(self) -> "scope":
        device = _device(self.device)
        with self._lock:
            if self._native is not None:
                raise RuntimeError(
                    "this scope is already open; use a new gpumemhook.scope() for a nested or "
                    "concurrent measurement"
                )
            if self.group is not None:
                self._native = _GroupScope(self.group, self.name or "scope", device)
            else:
                self._native = require_process().open_scope(self.name or "scope", device)
            self._device_used = device
            self._last = None
        return self

    def __exit__(self, *exc: Any) -> bool:
        with self._lock:
            native, self._native = self._native, None
        if native is not None:
            try:
                self._last = native.reading(self._device_used)
            except _native.ScopeClosedError:
                pass  # closed from outside: the last reading taken (if any) stays
            finally:
                native.close()
        return False

    # -- decorator -------------------------------------------------------------------------------

    def __call__(self, func: F) -> F:
        name = self.name or getattr(func, "__qualname__", None) or "scope"

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            inner = scope(name, self.device, self.group)
            try:
                with inner:
                    return func(*args, **kwargs)
            finally:
                if inner._last is not None:
                    self._last = inner._last
                    self._device_used = inner._device_used

        wrapper.scope = self  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    # -- readings --------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._native is not None

    def reading(self) -> _native.ScopeReading:
        """The live reading while open, the final one after (RuntimeError before any use)."""
        native = self._native
        if native is not None:
            return native.reading(self._device_used)
        if self._last is None:
            raise RuntimeError("this scope has not measured anything yet")
        return self._last

    def reset(self) -> None:
        """Starts a new window inside the open scope: the base and the peak drop to `used` now."""
        native = self._native
        if native is None:
            raise RuntimeError("reset() needs an open scope")
        native.reset()

    @property
    def delta_used(self) -> int:
        """`used` now (or at exit) minus `used` at entry; negative when memory was given back."""
        return self.reading().delta_used

    @property
    def delta_peak(self) -> int:
        """The most the block ever held above `used` at entry."""
        return self.reading().delta_peak

    @property
    def delta_peaked(self) -> int:
        """fastai's "peaked": `delta_peak` minus `delta_used` when that is positive."""
        return self.reading().delta_peaked

    @property
    def peak(self) -> int:
        """The largest `used` of the process while the block ran (absolute bytes)."""
        return self.reading().peak

    @property
    def used(self) -> int:
        """`used` of the process now (or at exit), absolute bytes."""
        return self.reading().used

    def __repr__(self) -> str:
        try:
            r = self.reading()
        except (RuntimeError, _native.GpuMemHookError):
            return "scope({!r}, device={!r})".format(self.name, self.device)
        return "scope({!r}, device={}{}): delta_used={} delta_peak={} ({} peak above start)".format(
            self.name,
            "" if self.group is None else ", group={!r}".format(self.group),
            r.device,
            r.delta_used,
            r.delta_peak,
            _native.format_size(r.delta_peak),
        )


class _GroupScope:
    """An open scope of a group, with the methods of a process's `_native.Scope` that `scope`
    uses: its slot is the group segment's, taken at construction and given back by `close`."""

    def __init__(self, group: str, label: str, device: int) -> None:
        self.group = group
        self.id = _native.group_scope_open(group, label, device)

    def reading(self, device: Optional[int] = None) -> _native.ScopeReading:
        return _native.group_scope_read(self.group, self.id)

    def reset(self) -> None:
        _native.group_scope_reset(self.group, self.id)

    def close(self) -> bool:
        try:
            _native.group_scope_close(self.group, self.id)
        except _native.ScopeClosedError:
            return False
        return True


class GroupMember:
    """A live member of a group and the bytes it holds on the device read."""

    def __init__(self, pid: int, bytes: int) -> None:
        self.pid = pid
        self.bytes = bytes

    def __repr__(self) -> str:
        return f"GroupMember(pid={self.pid}, bytes={self.bytes})"


class GroupStats:
    """One device's figures of a group (docs/groups.md): ``used`` and ``peak`` (the exact joint
    peak) of all its processes together, its ``limit`` (None when none), ``allocs``, ``frees``,
    ``refusals``, the ``emulated_total`` of its card (None when none), and its live ``members``."""

    def __init__(self, fields: Dict[str, Any]) -> None:
        self.used: int = fields["used"]
        self.peak: int = fields["peak"]
        self.limit: Optional[int] = fields["limit"]
        self.allocs: int = fields["allocs"]
        self.frees: int = fields["frees"]
        self.refusals: int = fields["refusals"]
        self.emulated_total: Optional[int] = fields["emulated_total"]
        self.members: List[GroupMember] = [GroupMember(m["pid"], m["bytes"]) for m in fields["members"]]

    def __repr__(self) -> str:
        return (
            f"GroupStats(used={self.used}, peak={self.peak}, limit={self.limit}, "
            f"allocs={self.allocs}, frees={self.frees}, refusals={self.refusals}, "
            f"members={self.members})"
        )


class group:
    """This user's group ``name`` (``GPUMEMHOOK_GROUP``, ``gpumemhook run --group``), read from any
    process: ``gpumemhook.group("job").stats(0).peak`` is the most all its processes held at once."""

    def __init__(self, name: str) -> None:
        self.name = name

    def stats(self, device: Optional[int] = None) -> GroupStats:
        """The group's figures on ``device`` (default: the current device); members found dead
        give their bytes back first."""
        text = _native.group_stats_json(self.name, _device(device))
        return GroupStats(json.loads(text))

    def scope(self, label: Optional[str] = None, device: Optional[int] = None) -> "scope":
        """A scope on this group: ``with gpumemhook.group("job").scope("eval") as s: ...`` gives
        `s.delta_peak`, the most all the group's processes held at once above their use at entry."""
        return scope(label, device, group=self.name)

    def __repr__(self) -> str:
        return f"group({self.name!r})"

"""Internals shared by every gpumemhook API: is the hook loaded, which device is current, the
one-time hint when it is not loaded, and a measuring window that is exact under the hook and a
best-effort fallback without it.

Nothing here imports a framework: torch (or cupy) is consulted only when the program already
imported it, so that importing gpumemhook never initialises CUDA or costs seconds.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path
from typing import List, Optional

from . import _native, _nvml

_PACKAGE_DIR = Path(__file__).resolve().parent
_HOOK_NAME = _native.HOOK_LIB_NAME
_CLI_NAME = "gpumemhook"

_lock = threading.Lock()
_process: Optional[_native.Process] = None
_process_checked = False
_hinted = False


class NotHookedWarning(UserWarning):
    """Issued once per process when an API that falls back (fastai/ipyexperiments/zeta/IPython
    compatible) runs without the hook: its numbers are then approximate."""


def _dev_checkout_root() -> Optional[Path]:
    """The workspace root when running from a source checkout (python/gpumemhook/ inside it)."""
    root = _PACKAGE_DIR.parent.parent
    return root if (root / "Cargo.toml").is_file() and (root / "interceptor").is_dir() else None


def _candidates(bundled: Path, built_name: str) -> List[Path]:
    """Where an artifact may be: bundled in the package, and (in a checkout) cargo's release build."""
    candidates = [bundled]
    root = _dev_checkout_root()
    if root is not None:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or root / "target")
        candidates.append(target / "release" / built_name)
    return candidates


def library_path() -> str:
    """Absolute path of the preload library, ``libgpumemhook.so``.

    An installed package answers with the copy inside it. In a development checkout (an editable
    install: scripts/build/python-env) the package holds none and it is
    ``target/release/libgpumemhook.so`` (``cargo build --release -p gpumemhook``); where a bare
    ``maturin develop`` did copy one into ``python/gpumemhook/``, the newer of the two, so that a
    rebuilt hook is never shadowed by an older copy. Raises ``FileNotFoundError`` with the build
    command when there is none.
    """
    candidates = [p for p in _candidates(_PACKAGE_DIR / _HOOK_NAME, _HOOK_NAME) if p.is_file()]
    if candidates:
        return str(max(candidates, key=lambda p: p.stat().st_mtime))
    raise FileNotFoundError(
        "libgpumemhook.so is not in the gpumemhook package ({}) nor built in a checkout; "
        "reinstall with `pip install .` from the repository, or build it with "
        "`cargo build --release -p gpumemhook`".format(_PACKAGE_DIR)
    )


def cli_path() -> Optional[str]:
    """Absolute path of the ``gpumemhook`` CLI binary, chosen as `library_path` chooses, or None."""
    candidates = [
        p
        for p in _candidates(_PACKAGE_DIR / "bin" / _CLI_NAME, _CLI_NAME)
        if p.is_file() and os.access(p, os.X_OK)
    ]
    return str(max(candidates, key=lambda p: p.stat().st_mtime)) if candidates else None


def how_to_hook() -> str:
    """The sentence that tells a user how to start a program under the hook, with the real path."""
    try:
        lib = library_path()
    except FileNotFoundError:
        return "start the program under the hook: " + _native.HOW_TO_HOOK.split(": ", 1)[-1]
    return (
        "start the program under the hook: `LD_PRELOAD={lib} python your_script.py` "
        "(or `gpumemhook run -- python your_script.py`; in Jupyter, `gpumemhook kernel install` "
        "and pick the kernel \"Python 3 (gpumemhook)\")".format(lib=lib)
    )


def process() -> Optional[_native.Process]:
    """This process's segment, or None when the hook is not loaded. Looked up once: a hook is
    loaded at start-up or never."""
    global _process, _process_checked
    if _process_checked:
        return _process
    with _lock:
        if not _process_checked:
            try:
                _process = _native.Process.current()
            except _native.NotHookedError:
                _process = None
            _process_checked = True
    return _process


def _forget_process() -> None:
    # A forked child gets a segment of its own from the hook; the parent's, inherited as a shared
    # mapping, must not be read as the child's.
    global _process, _process_checked
    _process = None
    _process_checked = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_process)


def require_process() -> _native.Process:
    """This process's segment; raises NotHookedError (saying how to start the program) without it."""
    p = process()
    if p is None:
        raise _native.NotHookedError(
            "gpumemhook is not loaded in this process: " + how_to_hook()
        )
    return p


def hint_once(what: str) -> None:
    """Tells the user, once per process, that `what` runs without the hook and how to fix that."""
    global _hinted
    with _lock:
        if _hinted:
            return
        _hinted = True
    warnings.warn(
        "gpumemhook: {what} runs without the hook, so GPU memory figures are approximate and "
        "peaks are not measured. To get exact numbers, {how}.".format(
            what=what, how=how_to_hook()
        ),
        NotHookedWarning,
        stacklevel=3,
    )


def is_counted_device(device: int) -> bool:
    """True when a segment counts `device`: the reader's check (`_native.check_device`), so that
    the number of devices is known in one place."""
    try:
        _native.check_device(device)
    except (ValueError, OverflowError, TypeError):
        return False
    return True


def current_device() -> int:
    """The device the program works on: torch's (or cupy's) current device when that framework is
    imported and has initialised CUDA, else 0. Never initialises CUDA itself."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:  # a broken or CPU-only torch must not break measuring
            pass
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return int(cupy.cuda.runtime.getDevice())
        except Exception:
            pass
    return 0


def torch_cuda():
    """The torch module when it is importable and sees a GPU, else None (imports torch: only for
    the functions whose fastai and ipyexperiments originals use torch themselves)."""
    try:
        import torch  # noqa: PLC0415 - deliberately lazy
    except Exception:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def empty_caches() -> None:
    """What fastai's `*_no_cache` functions do before measuring: collect garbage, then give
    torch's cached blocks back to the driver (only if torch is already in use)."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:
            pass


def fallback_used_bytes(device: int) -> int:
    """Best guess of the bytes this process holds on `device` without the hook: torch's reserved
    memory when torch is in use (the hook counts that plus library workspaces), else the device-wide
    `used` of NVML (other processes included, as fastai measured), else 0."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.memory_reserved(device))
        except Exception:
            pass
    info = _nvml.memory_info(device)
    return info[2] if info is not None else 0


class Window:
    """A measuring window on one device: base (used at start or last reset), peak, used now.

    Under the hook it is a scope of the segment, exact for every allocation of every thread.
    Without it, `what` is hinted once and the window samples `fallback_used_bytes` whenever it is
    read, which sees no spike between two readings: there is no polling thread, by design.
    """

    def __init__(self, name: str, device: Optional[int] = None, what: str = "") -> None:
        self.device = current_device() if device is None else int(device)
        self._scope: Optional[_native.Scope] = None
        p = process()
        if p is not None:
            self._scope = p.open_scope(name, self.device)
        else:
            hint_once(what or name)
            used = fallback_used_bytes(self.device)
            self._base = used
            self._peak = used
        self._final: Optional[_native.ScopeReading] = None

    @property
    def exact(self) -> bool:
        return self._scope is not None

    def reset(self) -> None:
        self._final = None
        if self._scope is not None:
            self._scope.reset()
        else:
            used = fallback_used_bytes(self.device)
            self._base = used
            self._peak = used

    def reading(self) -> _native.ScopeReading:
        """Base, peak and used in bytes, with the reader's deltas (`delta_used`, `delta_peaked`,
        `peak_above_used`); frozen once the window is closed."""
        if self._final is not None:
            return self._final
        if self._scope is not None:
            return self._scope.reading(self.device)
        used = fallback_used_bytes(self.device)
        self._peak = max(self._peak, used)
        return _native.ScopeReading(self.device, self._base, self._peak, used)

    def close(self) -> _native.ScopeReading:
        """Takes the final reading and releases the scope. Idempotent."""
        if self._final is None:
            try:
                self._final = self.reading()
            except _native.ScopeClosedError:
                # Closed from outside (another process, say): keep what is knowable.
                self._final = _native.ScopeReading(self.device, 0, 0, 0)
            if self._scope is not None:
                self._scope.close()
        return self._final


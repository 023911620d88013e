"""The ceiling stack behind `gpumemhook.mem.gpu_mem_leave_free_mbs`: each call under the hook sets a
ceiling and returns a `CeilingHold`; holds may overlap and be released in any order, and when the
last goes the ceiling from before the first comes back.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, List, Optional, Tuple

from . import _native


class CeilingHold:
    """What `gpu_mem_leave_free_mbs` returns under the hook: a ceiling that leaves `n` MB
    allocatable. Deleting the object (or `release()`) lifts it: the ceiling that was there before
    comes back. Holds may overlap and be released in any order."""

    # Per device: (token, limit) of the holds alive, oldest first, and the ceiling there was before
    # the first. Tokens, not the holds themselves: a reference here would keep `del hold` from
    # ever releasing it.
    _holds: Dict[int, List[Tuple[int, int]]] = {}
    _base: Dict[int, Optional[int]] = {}
    _tokens = itertools.count()
    _lock = threading.Lock()

    def __init__(self, proc: _native.Process, device: int, keep_free: int, device_free: Optional[int]):
        self._proc = proc
        self.device = device
        self.keep_free = keep_free
        with CeilingHold._lock:
            self.limit, self.previous = proc.leave_free(keep_free, device, device_free)
            self._token = next(CeilingHold._tokens)
            stack = CeilingHold._holds.setdefault(device, [])
            if not stack:
                CeilingHold._base[device] = self.previous
            stack.append((self._token, self.limit))
        self.released = False

    def release(self) -> None:
        """Lifts this ceiling: the newest hold still alive applies, or, with none, the ceiling
        from before the first. Idempotent."""
        with CeilingHold._lock:
            if getattr(self, "released", True):
                return
            self.released = True
            stack = CeilingHold._holds.get(self.device, [])
            stack[:] = [entry for entry in stack if entry[0] != self._token]
            restore = stack[-1][1] if stack else CeilingHold._base.pop(self.device, None)
            self._proc.set_limit(restore, self.device)

    def __enter__(self) -> "CeilingHold":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.release()
        return False

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self) -> str:
        return "CeilingHold(device={}, limit={}, keep_free={}, previous={}{})".format(
            self.device,
            self.limit,
            self.keep_free,
            self.previous,
            ", released" if self.released else "",
        )

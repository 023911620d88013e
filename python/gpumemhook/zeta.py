"""A drop-in replacement for zeta's ``print_cuda_memory_usage`` (``zeta.utils``), exact under the
hook::

    from zeta.utils import print_cuda_memory_usage      # before
    from gpumemhook.zeta import print_cuda_memory_usage # after

It prints the change of this process's device memory over the block, in GB, when the block ends,
also when it ends with an exception; blocks nest. Under the hook the change counts every
allocation (torch's reserve, cuBLAS workspaces, other libraries), and the context manager yields a
`gpumemhook.scope` whose `delta_peak` says how far above the start the block went. Without the hook
it says once how to start with it and measures ``torch.cuda.memory_allocated()`` as zeta does.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator, Optional

from ._api import scope
from ._core import current_device, fallback_used_bytes, hint_once, process

__all__ = ["print_cuda_memory_usage"]


def _fallback_bytes(device: int) -> int:
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.memory_allocated(device))
        except Exception:
            pass
    return fallback_used_bytes(device)


@contextmanager
def print_cuda_memory_usage() -> Iterator[Optional[scope]]:
    """Print the CUDA memory used by the block: ``CUDA memory usage: 1.23 GB``."""
    if process() is not None:
        s = scope("print_cuda_memory_usage")
        try:
            with s:
                yield s
        finally:
            # The scope's reading was frozen at its exit, exceptions included.
            try:
                used = s.delta_used
            except RuntimeError:
                used = 0
            print(f"CUDA memory usage: {used / (1024**3):.2f} GB")
        return
    hint_once("print_cuda_memory_usage")
    device = current_device()
    initial = _fallback_bytes(device)
    try:
        yield None
    finally:
        memory_usage = _fallback_bytes(device) - initial
        print(f"CUDA memory usage: {memory_usage / (1024**3):.2f} GB")

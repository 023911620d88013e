"""The CUDA runtime through ctypes, for `gpumemhook.mem.gpu_mem_allocate_mbs` when no framework is
there to allocate with: `CudaBuffer` holds device memory from ``cudaMalloc`` until it is deleted.

Nothing is loaded at import: the runtime is opened when a buffer is made (the one already loaded
into the process if any, so that the hook in it counts the allocation).
"""

from __future__ import annotations

import ctypes
from typing import Optional

_CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


def _cudart() -> Optional[ctypes.CDLL]:
    """The CUDA runtime, for allocating without a framework: the one already loaded if any."""
    for name in _CUDART_NAMES:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaMalloc.restype = ctypes.c_int
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.restype = ctypes.c_int
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaSetDevice.restype = ctypes.c_int
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        return lib
    return None


class CudaBuffer:
    """Device memory allocated with ``cudaMalloc`` (when torch is not there to hold it); freed when
    the object is deleted or `free()`d."""

    def __init__(self, nbytes: int, device: int) -> None:
        lib = _cudart()
        if lib is None:
            raise RuntimeError("no CUDA runtime (libcudart) could be loaded to allocate memory")
        self._lib = lib
        self.nbytes = int(nbytes)
        self.device = int(device)
        ptr = ctypes.c_void_p()
        rc = lib.cudaSetDevice(self.device)
        if rc == 0:
            rc = lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(self.nbytes))
        if rc != 0:
            raise RuntimeError(
                "CUDA out of memory: cudaMalloc of {} bytes on device {} returned {}".format(
                    self.nbytes, self.device, rc
                )
            )
        self.ptr: Optional[int] = ptr.value

    def free(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            self._lib.cudaFree(ctypes.c_void_p(ptr))

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:
            pass

    def __repr__(self) -> str:
        return "CudaBuffer(nbytes={}, device={}, ptr={})".format(
            self.nbytes, self.device, hex(self.ptr) if self.ptr else None
        )

"""NVML (the NVIDIA management library), loaded at run time with ctypes: device count and the
device-wide total/free/used that fastai and ipyexperiments read through pynvml.

No pynvml dependency and no import-time cost: the library is opened on first use. When it cannot
be opened or initialised (a machine without an NVIDIA driver), every query answers "no GPU"
(0 devices, None), and the callers give fastai's CPU answers.

`GPUMEMHOOK_NVML_LIB` names another library file to open instead of NVML's own
(``_native.NVML_LIB_NAME``: an NVML in an unusual place); set to ``none`` it disables NVML.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Optional, Tuple

from . import _native

_NVML_SUCCESS = 0


class _Memory(ctypes.Structure):
    # nvmlMemory_t (version 1): the layout every NVML since CUDA 5 accepts.
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_loaded = False


def _load() -> Optional[ctypes.CDLL]:
    global _lib, _loaded
    if _loaded:
        return _lib
    with _lock:
        if _loaded:
            return _lib
        name = os.environ.get(_native.ENV_NVML_LIB) or _native.NVML_LIB_NAME
        lib = None
        if name.lower() not in ("none", "0", "off"):
            try:
                lib = ctypes.CDLL(name)
                lib.nvmlInit_v2.restype = ctypes.c_int
                lib.nvmlInit_v2.argtypes = []
                lib.nvmlDeviceGetCount_v2.restype = ctypes.c_int
                lib.nvmlDeviceGetCount_v2.argtypes = [ctypes.POINTER(ctypes.c_uint)]
                lib.nvmlDeviceGetHandleByIndex_v2.restype = ctypes.c_int
                lib.nvmlDeviceGetHandleByIndex_v2.argtypes = [
                    ctypes.c_uint,
                    ctypes.POINTER(ctypes.c_void_p),
                ]
                lib.nvmlDeviceGetMemoryInfo.restype = ctypes.c_int
                lib.nvmlDeviceGetMemoryInfo.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Memory)]
                if lib.nvmlInit_v2() != _NVML_SUCCESS:
                    lib = None
            except (OSError, AttributeError):
                lib = None
        _lib = lib
        _loaded = True
        return _lib


def available() -> bool:
    """True when NVML could be opened and initialised."""
    return _load() is not None


def device_count() -> int:
    lib = _load()
    if lib is None:
        return 0
    count = ctypes.c_uint(0)
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != _NVML_SUCCESS:
        return 0
    return int(count.value)


def handle(index: int) -> Optional[ctypes.c_void_p]:
    """The NVML handle of device `index`, or None."""
    lib = _load()
    if lib is None or index < 0:
        return None
    h = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)) != _NVML_SUCCESS:
        return None
    return h


def memory_info_of_handle(h: Any) -> Optional[Tuple[int, int, int]]:
    """(total, free, used) in bytes for an NVML handle (ours, or pynvml's), or None."""
    lib = _load()
    if lib is None or h is None:
        return None
    mem = _Memory()
    try:
        rc = lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem))
    except ctypes.ArgumentError:
        return None
    if rc != _NVML_SUCCESS:
        return None
    return (int(mem.total), int(mem.free), int(mem.used))


def memory_info(index: int) -> Optional[Tuple[int, int, int]]:
    """(total, free, used) in bytes of device `index`, device-wide, or None (no NVML, no device)."""
    return memory_info_of_handle(handle(index))


def index_of_handle(h: Any) -> Optional[int]:
    """The ordinal of an NVML handle, or None."""
    lib = _load()
    if lib is None or h is None:
        return None
    try:
        fn = lib.nvmlDeviceGetIndex
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]
    index = ctypes.c_uint(0)
    try:
        if fn(h, ctypes.byref(index)) != _NVML_SUCCESS:
            return None
    except ctypes.ArgumentError:
        return None
    return int(index.value)


def _uuid_of_handle(h: Any) -> Optional[str]:
    """The UUID (``GPU-...``) of an NVML handle, or None."""
    lib = _load()
    if lib is None:
        return None
    try:
        fn = lib.nvmlDeviceGetUUID
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint]
    buf = ctypes.create_string_buffer(96)
    try:
        if fn(h, buf, ctypes.c_uint(len(buf))) != _NVML_SUCCESS:
            return None
    except ctypes.ArgumentError:
        return None
    return buf.value.decode("ascii", "replace")


def cuda_ordinal_of_handle(h: Any) -> Optional[int]:
    """The CUDA device ordinal, in this process, of the GPU an NVML handle names, or None when it
    cannot be told or the GPU is not visible to this process.

    NVML numbers every GPU of the machine; CUDA numbers only those ``CUDA_VISIBLE_DEVICES`` lets
    the process see, in that list's order (entries are NVML indices or ``GPU-`` UUID prefixes; CUDA
    stops at the first it cannot read). Without the variable the two numberings are taken to be
    the same, as fastai takes them."""
    index = index_of_handle(h)
    if index is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return index
    uuid: Optional[str] = None
    for ordinal, entry in enumerate(e.strip() for e in visible.split(",")):
        if entry.isdigit():
            if int(entry) == index:
                return ordinal
        elif entry.startswith("GPU-"):
            if uuid is None:
                uuid = _uuid_of_handle(h) or ""
            if uuid and uuid.startswith(entry):
                return ordinal
        else:
            break
    return None

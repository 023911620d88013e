"""Type stubs of gpumemhook._native, the PyO3 bindings of the reader crate (python/src/lib.rs)."""

from os import PathLike
from types import TracebackType
from typing import ClassVar, List, Optional, Tuple, Type, Union, final

__version__: str
LAYOUT_MAJOR: int
LAYOUT_MINOR: int
SEGMENT_SIZE: int
MAX_DEVICES: int
MAX_SCOPES: int
HOW_TO_HOOK: str
HOOK_LIB_NAME: str
MAX_SIZE: int
ENV_LIMIT: str
ENV_LIMIT_DEVICE_PREFIX: str
ENV_REPORT: str
ENV_TRACE: str
ENV_TRACE_EVENTS: str
ENV_SHM_DIR: str
ENV_DISABLE: str
ENV_LIB: str
ENV_NVML_LIB: str
ENV_PYTHON_CLI: str

class GpuMemHookError(Exception):
    """Base class of every gpumemhook error."""

class NotHookedError(GpuMemHookError):
    """The process was not started under the hook (the message says how to start it)."""
    pid: int
    path: str

class ProcessGoneError(GpuMemHookError):
    """The process whose segment was asked for has exited."""
    pid: int

class LayoutVersionError(GpuMemHookError):
    """The segment was written by a gpumemhook with another layout version than this reader's."""
    path: str
    found: int
    expected: int

class ScopeClosedError(GpuMemHookError):
    """The scope was closed (possibly by another process) since the handle was made."""

@final
class DeviceStats:
    FIELDS: ClassVar[List[str]]
    device: int
    used: int
    peak: int
    limit: Optional[int]
    allocs: int
    frees: int
    denied: int
    failed: int
    total_allocated: int
    managed: int
    managed_peak: int

@final
class ScopeReading:
    device: int
    base: int
    peak: int
    used: int
    def __new__(cls, device: int, base: int, peak: int, used: int) -> "ScopeReading": ...
    @property
    def delta_used(self) -> int: ...
    @property
    def delta_peak(self) -> int: ...
    @property
    def delta_peaked(self) -> int: ...
    @property
    def peak_above_used(self) -> int: ...

@final
class Scope:
    @property
    def name(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def device(self) -> Optional[int]: ...
    @property
    def owned(self) -> bool: ...
    @property
    def is_open(self) -> bool: ...
    def reading(self, device: Optional[int] = None) -> ScopeReading: ...
    def readings(self, devices: List[int]) -> List[ScopeReading]: ...
    def reset(self) -> None: ...
    def close(self) -> bool: ...
    def __enter__(self) -> "Scope": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

@final
class Process:
    @staticmethod
    def current() -> "Process": ...
    @staticmethod
    def attach(pid: int) -> "Process": ...
    @staticmethod
    def open(path: Union[str, "PathLike[str]"]) -> "Process": ...
    @property
    def pid(self) -> int: ...
    @property
    def path(self) -> Optional[str]: ...
    @property
    def command(self) -> str: ...
    def is_alive(self) -> bool: ...
    def used(self, device: int = 0) -> int: ...
    def peak(self, device: int = 0) -> int: ...
    def limit(self, device: int = 0) -> Optional[int]: ...
    def device_stats(self, device: int = 0) -> DeviceStats: ...
    def active_devices(self) -> List[int]: ...
    def snapshot_json(self) -> str: ...
    def reset_peak(self, device: Optional[int] = None) -> None: ...
    def set_limit(self, limit: Optional[int], device: Optional[int] = None) -> None: ...
    def leave_free(
        self, keep_free: int, device: int = 0, device_free: Optional[int] = None
    ) -> Tuple[int, Optional[int]]: ...
    def ceiling_view(self, device: int, real_free: int, real_total: int) -> Tuple[int, int]: ...
    def open_scope(self, name: str = "", device: Optional[int] = None) -> Scope: ...
    def scopes(self) -> List[Scope]: ...
    def find_scope(self, name: str) -> Optional[Scope]: ...

def list_processes() -> List[Process]: ...
def parse_size(text: str) -> int: ...
def format_size(bytes: int) -> str: ...
def preload_value(existing: Optional[str], lib: Union[str, "PathLike[str]"]) -> str: ...
def check_device(device: int) -> int: ...

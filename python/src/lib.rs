//! `gpumemhook._native`: the Python bindings of the reader crate, a private module under the
//! pure-Python package `gpumemhook` (which builds the fastai/ipyexperiments/zeta-compatible API on
//! top of it).
//!
//! It exposes the reader as it is: [`Process`] (this process or another, found by pid), its
//! counters, scopes ([`Scope`], [`ScopeReading`]), ceilings, plus `list_processes`, size parsing and
//! the layout constants. Reader errors become Python exceptions of one family, rooted at
//! `GpuMemHookError`, each carrying the reader's message (which says what to do).
//!
//! Modules: this file (the classes and functions Python sees) and [`logic`] (the decisions that
//! need no Python, unit-tested with plain `cargo test`).
//!
//! Nothing here may panic: the release profile aborts on panic, and an abort would take the user's
//! Python process (their training run, their notebook) with it. Every fallible path returns a
//! `PyResult`.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use gpumemhook_reader as reader;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use reader::HOW_TO_HOOK;
use reader::{LAYOUT_MAJOR, LAYOUT_MINOR, MAX_DEVICES, MAX_SCOPES, SEGMENT_SIZE};

mod logic;

create_exception!(
    gpumemhook,
    GpuMemHookError,
    PyException,
    "Base class of every gpumemhook error."
);
create_exception!(
    gpumemhook,
    NotHookedError,
    GpuMemHookError,
    "The process was not started under the hook (the message says how to start it)."
);
create_exception!(
    gpumemhook,
    ProcessGoneError,
    GpuMemHookError,
    "The process whose segment was asked for has exited."
);
create_exception!(
    gpumemhook,
    LayoutVersionError,
    GpuMemHookError,
    "The segment was written by a gpumemhook with another layout version than this reader's."
);
create_exception!(
    gpumemhook,
    ScopeClosedError,
    GpuMemHookError,
    "The scope was closed (possibly by another process) since the handle was made."
);

/// Turns a reader error into the matching Python exception, with the facts as attributes
/// (`pid`, `path`, `found`, `expected`) so that callers need not parse messages.
fn py_err(e: reader::Error) -> PyErr {
    let message = e.to_string();
    Python::with_gil(|py| {
        let err = match logic::classify(&e) {
            logic::ErrorKind::NotHooked => NotHookedError::new_err(message),
            logic::ErrorKind::ProcessGone => ProcessGoneError::new_err(message),
            logic::ErrorKind::LayoutVersion => LayoutVersionError::new_err(message),
            logic::ErrorKind::ScopeClosed => ScopeClosedError::new_err(message),
            logic::ErrorKind::Other => GpuMemHookError::new_err(message),
        };
        let value = err.value(py);
        // Attribute setting on a fresh exception instance cannot fail in practice; if it ever did,
        // the exception with its message is still the right thing to raise.
        match &e {
            reader::Error::NoSegment { pid, path } => {
                let _ = value.setattr("pid", *pid);
                let _ = value.setattr("path", path.display().to_string());
            }
            reader::Error::ProcessGone { pid } => {
                let _ = value.setattr("pid", *pid);
            }
            reader::Error::LayoutVersion {
                path,
                found,
                expected,
            } => {
                let _ = value.setattr("path", path.display().to_string());
                let _ = value.setattr("found", *found);
                let _ = value.setattr("expected", *expected);
            }
            reader::Error::WrongMagic { path }
            | reader::Error::Truncated { path, .. }
            | reader::Error::ReadOnly { path }
            | reader::Error::Refused { path, .. }
            | reader::Error::Io { path, .. } => {
                let _ = value.setattr("path", path.display().to_string());
            }
            reader::Error::OtherUser { pid, uid } => {
                let _ = value.setattr("pid", *pid);
                let _ = value.setattr("uid", *uid);
            }
            _ => {}
        }
        err
    })
}

/// `device` when a segment counts it, else `ValueError` with the reader's words.
fn check_device(device: u32) -> PyResult<u32> {
    reader::check_device(device).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Defines the `DeviceStats` class from the reader's list of fields
/// ([`reader::for_device_stats_fields`]): the fields, their conversion and `__repr__` are never
/// written out by hand here.
macro_rules! py_device_stats {
    ($($(#[$doc:meta])* $name:ident: $ty:ty $(= $default:ident)?,)*) => {
        /// All counters of one device of one process.
        #[pyclass(module = "gpumemhook", name = "DeviceStats", frozen, get_all, eq)]
        #[derive(Clone, PartialEq, Eq)]
        pub struct DeviceStats {
            $($(#[$doc])* $name: $ty,)*
        }

        impl From<reader::DeviceStats> for DeviceStats {
            fn from(d: reader::DeviceStats) -> Self {
                DeviceStats { $($name: d.$name,)* }
            }
        }

        impl DeviceStats {
            /// `name=value` for every field, in order, values as Python writes them.
            fn field_reprs(&self) -> Vec<String> {
                vec![$(format!("{}={}", stringify!($name), PyRepr::py_repr(&self.$name))),*]
            }
        }
    };
}

reader::for_device_stats_fields!(py_device_stats);

/// A field value as Python's `repr` writes it.
trait PyRepr {
    fn py_repr(&self) -> String;
}

impl PyRepr for u32 {
    fn py_repr(&self) -> String {
        self.to_string()
    }
}

impl PyRepr for u64 {
    fn py_repr(&self) -> String {
        self.to_string()
    }
}

impl<T: PyRepr> PyRepr for Option<T> {
    fn py_repr(&self) -> String {
        self.as_ref()
            .map_or_else(|| "None".to_string(), PyRepr::py_repr)
    }
}

#[pymethods]
impl DeviceStats {
    /// The field names, in order (the keys of a device in the exit report).
    #[classattr]
    #[allow(non_snake_case)]
    fn FIELDS() -> Vec<&'static str> {
        reader::DeviceStats::FIELDS.to_vec()
    }

    fn __repr__(&self) -> String {
        format!("DeviceStats({})", self.field_reprs().join(", "))
    }
}

/// What a scope measured on one device, in bytes.
#[pyclass(module = "gpumemhook", name = "ScopeReading", frozen, get_all, eq)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ScopeReading {
    /// Device ordinal.
    device: u32,
    /// `used` when the scope was opened or last reset.
    base: u64,
    /// Largest `used` since then.
    peak: u64,
    /// `used` when the reading was taken.
    used: u64,
}

impl From<reader::ScopeReading> for ScopeReading {
    fn from(r: reader::ScopeReading) -> Self {
        ScopeReading {
            device: r.device,
            base: r.base,
            peak: r.peak,
            used: r.used,
        }
    }
}

impl ScopeReading {
    fn as_reader(&self) -> reader::ScopeReading {
        reader::ScopeReading {
            device: self.device,
            base: self.base,
            peak: self.peak,
            used: self.used,
        }
    }
}

#[pymethods]
impl ScopeReading {
    #[new]
    #[pyo3(signature = (device, base, peak, used))]
    fn new(device: u32, base: u64, peak: u64, used: u64) -> Self {
        ScopeReading {
            device,
            base,
            peak,
            used,
        }
    }

    /// `used - base`: negative when memory was given back.
    #[getter]
    fn delta_used(&self) -> i64 {
        self.as_reader().delta_used()
    }

    /// `peak - base`: the most the window ever held above where it started.
    #[getter]
    fn delta_peak(&self) -> u64 {
        self.as_reader().delta_peak()
    }

    /// fastai's "delta peaked": the blip above the end state, `delta_peak - max(delta_used, 0)`.
    #[getter]
    fn delta_peaked(&self) -> u64 {
        self.as_reader().delta_peaked()
    }

    /// `peak - used`: how far above the current use the window went (ipygpulogger's "peaked").
    #[getter]
    fn peak_above_used(&self) -> u64 {
        self.as_reader().peak_above_used()
    }

    fn __repr__(&self) -> String {
        format!(
            "ScopeReading(device={}, base={}, peak={}, used={})",
            self.device, self.base, self.peak, self.used
        )
    }
}

/// A hooked process's segment: this process's (`Process.current()`) or another's
/// (`Process.attach(pid)`).
#[pyclass(module = "gpumemhook", name = "Process", frozen)]
pub struct Process {
    inner: reader::Process,
}

#[pymethods]
impl Process {
    /// This process's own segment. Raises `NotHookedError` when the hook is not loaded.
    #[staticmethod]
    fn current() -> PyResult<Process> {
        reader::Process::current()
            .map(|inner| Process { inner })
            .map_err(py_err)
    }

    /// The segment of process `pid` (same user, same `GPUMEMHOOK_SHM_DIR`).
    #[staticmethod]
    fn attach(pid: u32) -> PyResult<Process> {
        reader::Process::attach(pid)
            .map(|inner| Process { inner })
            .map_err(py_err)
    }

    /// A segment file by path (checked: magic and layout version).
    #[staticmethod]
    fn open(path: PathBuf) -> PyResult<Process> {
        reader::Process::open(&path)
            .map(|inner| Process { inner })
            .map_err(py_err)
    }

    /// The pid that wrote the segment.
    #[getter]
    fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// The segment file, `None` for a private (in-process only) segment.
    #[getter]
    fn path(&self) -> Option<String> {
        self.inner.path().map(|p| p.display().to_string())
    }

    /// The command line of the process, as the hook recorded it.
    #[getter]
    fn command(&self) -> String {
        self.inner.segment().command()
    }

    /// True while the process that wrote the segment runs (not a later one with its pid).
    fn is_alive(&self) -> bool {
        self.inner.is_alive()
    }

    /// Device bytes held now (one atomic load).
    #[pyo3(signature = (device=0))]
    fn used(&self, device: u32) -> u64 {
        self.inner.used(device)
    }

    /// Largest `used` since start or the last `reset_peak` (one atomic load).
    #[pyo3(signature = (device=0))]
    fn peak(&self, device: u32) -> u64 {
        self.inner.peak(device)
    }

    /// The ceiling of `device` in bytes, `None` when there is none.
    #[pyo3(signature = (device=0))]
    fn limit(&self, device: u32) -> PyResult<Option<u64>> {
        Ok(self
            .inner
            .device(check_device(device)?)
            .map_err(py_err)?
            .limit)
    }

    /// All counters of one device.
    #[pyo3(signature = (device=0))]
    fn device_stats(&self, device: u32) -> PyResult<DeviceStats> {
        Ok(self
            .inner
            .device(check_device(device)?)
            .map_err(py_err)?
            .into())
    }

    /// Device memory of `device` by the shared object that asked for it: `(module, used, peak,
    /// live_allocs)` rows, largest `used` first; `module` is the file name, `other` past the named
    /// ones; `live_allocs` counts the allocations held now.
    #[pyo3(signature = (device=0))]
    fn breakdown(&self, device: u32) -> PyResult<Vec<(String, u64, u64, u64)>> {
        Ok(self
            .inner
            .breakdown(check_device(device)?)
            .map_err(py_err)?
            .into_iter()
            .map(|m| (m.module, m.used, m.peak, m.live_allocs))
            .collect())
    }

    /// Device memory by Python call site (`GPUMEMHOOK_STACKS`), all devices together: `(site,
    /// used, peak, live_allocs)` rows, largest `used` first, read from the process's segment (any
    /// process; the first 256 sites it recorded).
    fn site_breakdown(&self) -> PyResult<Vec<(String, u64, u64, u64)>> {
        Ok(self
            .inner
            .site_breakdown()
            .map_err(py_err)?
            .into_iter()
            .map(|s| (s.site, s.used, s.peak, s.live_allocs))
            .collect())
    }

    /// Lets the next out-of-memory write a report again (this process only); False when
    /// `GPUMEMHOOK_OOM_REPORT` is not set.
    fn arm_oom_report(&self) -> PyResult<bool> {
        self.inner.arm_oom_report().map_err(py_err)
    }

    /// The exit report's contents now, as JSON text: the snapshot plus `live`, the allocations
    /// still held (largest first, with module and Python site). This process's own segment only.
    fn report_json(&self) -> PyResult<String> {
        let report = self.inner.report().map_err(py_err)?;
        serde_json::to_string(&report).map_err(|e| GpuMemHookError::new_err(format!("report: {e}")))
    }

    /// Ordinals of the devices that saw activity or carry a ceiling of their own.
    fn active_devices(&self) -> Vec<u32> {
        self.inner.segment().active_devices()
    }

    /// Everything at once, as the JSON text of the exit report (`GPUMEMHOOK_REPORT`).
    fn snapshot_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.inner.snapshot())
            .map_err(|e| GpuMemHookError::new_err(format!("snapshot: {e}")))
    }

    /// Restarts the peak of `device` (`None`: every device) from the current `used`.
    #[pyo3(signature = (device=None))]
    fn reset_peak(&self, device: Option<u32>) -> PyResult<()> {
        if let Some(d) = device {
            check_device(d)?;
        }
        self.inner.reset_peak(device).map_err(py_err)
    }

    /// Sets the ceiling of `device` (`None`: every device) to `limit` bytes; `None` lifts it.
    /// Takes effect at the next allocation.
    #[pyo3(signature = (limit, device=None))]
    fn set_limit(&self, limit: Option<u64>, device: Option<u32>) -> PyResult<()> {
        if let Some(d) = device {
            check_device(d)?;
        }
        if let Some(bytes) = limit {
            // Zero and the "no ceiling" sentinel are refused with parse_size's words.
            reader::check_limit(bytes).map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        self.inner.set_limit(device, limit).map_err(py_err)
    }

    /// Sets a ceiling on `device` that leaves `keep_free` bytes allocatable above what the process
    /// holds now, never above `device_free` (the device's real free bytes, when known) plus what it
    /// holds. Returns `(new_limit, previous_limit)`.
    #[pyo3(signature = (keep_free, device=0, device_free=None))]
    fn leave_free(
        &self,
        keep_free: u64,
        device: u32,
        device_free: Option<u64>,
    ) -> PyResult<(u64, Option<u64>)> {
        let device = check_device(device)?;
        let previous = self.inner.device(device).map_err(py_err)?.limit;
        let limit = logic::leave_free_ceiling(self.inner.used(device), keep_free, device_free);
        self.inner
            .set_limit(Some(device), Some(limit))
            .map_err(py_err)?;
        Ok((limit, previous))
    }

    /// What `cudaMemGetInfo` reports inside the process for a device whose real (device-wide)
    /// figures are `real_free`/`real_total`: the ceiling's view, `(free, total)`.
    fn ceiling_view(&self, device: u32, real_free: u64, real_total: u64) -> PyResult<(u64, u64)> {
        let device = check_device(device)?;
        Ok(self
            .inner
            .segment()
            .device(device)
            .map_or((real_free, real_total), |c| {
                c.ceiling_view(real_free, real_total)
            }))
    }

    /// This process's own use of a device as its views count it (NVML's per-process figure under
    /// the hook): `used`, plus the charged overhead on an emulated card; at most `total`.
    fn own_use(&self, device: u32, total: u64) -> PyResult<u64> {
        let device = check_device(device)?;
        Ok(self
            .inner
            .segment()
            .device(device)
            .map_or(0, |c| c.process_view(total)))
    }

    /// Opens a scope: an exact, resettable peak marker, closed by `Scope.close()` (or when the
    /// handle is garbage-collected). `device` is the device its readings default to.
    #[pyo3(signature = (name="", device=None))]
    fn open_scope(&self, name: &str, device: Option<u32>) -> PyResult<Scope> {
        if let Some(d) = device {
            check_device(d)?;
        }
        let scope = self.inner.open_scope(name, device).map_err(py_err)?;
        Ok(Scope::new(scope, true))
    }

    /// The open scopes of the process (from any process), as handles that do not close them
    /// when garbage-collected.
    fn scopes(&self) -> Vec<Scope> {
        self.inner
            .scopes()
            .into_iter()
            .map(|s| Scope::new(s, false))
            .collect()
    }

    /// An open scope by name (the first in slot order), or `None`; not closed when collected.
    fn find_scope(&self, name: &str) -> Option<Scope> {
        self.inner.find_scope(name).map(|s| Scope::new(s, false))
    }

    fn __repr__(&self) -> String {
        format!(
            "Process(pid={}, command={:?})",
            self.inner.pid(),
            self.inner.segment().command()
        )
    }
}

/// A handle to an open scope. Thread-safe: the reader's handle sits behind a mutex so that a
/// close from one thread and a reading from another never race on the handle itself.
#[pyclass(module = "gpumemhook", name = "Scope", frozen)]
pub struct Scope {
    inner: Mutex<Option<reader::Scope>>,
    index: u32,
    generation: u64,
    name: String,
    default_device: Option<u32>,
    owned: bool,
}

impl Scope {
    fn new(scope: reader::Scope, owned: bool) -> Scope {
        let id = scope.id();
        Scope {
            index: id.index,
            generation: id.generation,
            name: scope.name(),
            default_device: scope.device(),
            owned,
            inner: Mutex::new(Some(scope)),
        }
    }

    /// The handle, even if a thread panicked while holding the lock (it cannot, but a poisoned
    /// mutex must not turn into a panic here).
    fn lock(&self) -> MutexGuard<'_, Option<reader::Scope>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn closed_error() -> PyErr {
        py_err(reader::Error::ScopeClosed)
    }
}

#[pymethods]
impl Scope {
    /// The name given at opening.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Slot index in the segment.
    #[getter]
    fn index(&self) -> u32 {
        self.index
    }

    /// Generation of the slot: with the index, names this scope and no later one.
    #[getter]
    fn generation(&self) -> u64 {
        self.generation
    }

    /// The device readings default to (`None`: opened for every device; readings then default
    /// to device 0).
    #[getter]
    fn device(&self) -> Option<u32> {
        self.default_device
    }

    /// True when closing this handle's object closes the scope (it was opened through it).
    #[getter]
    fn owned(&self) -> bool {
        self.owned
    }

    /// True while the scope is open (closing it from another process counts).
    #[getter]
    fn is_open(&self) -> bool {
        self.lock().as_ref().is_some_and(|s| s.reading(0).is_ok())
    }

    /// What the scope measured on `device` (default: the scope's device).
    #[pyo3(signature = (device=None))]
    fn reading(&self, device: Option<u32>) -> PyResult<ScopeReading> {
        let device = check_device(logic::reading_device(device, self.default_device))?;
        match self.lock().as_ref() {
            Some(s) => s.reading(device).map(Into::into).map_err(py_err),
            None => Err(Self::closed_error()),
        }
    }

    /// Readings of several devices at once, taken under one lock of the handle.
    fn readings(&self, devices: Vec<u32>) -> PyResult<Vec<ScopeReading>> {
        let guard = self.lock();
        let Some(s) = guard.as_ref() else {
            return Err(Self::closed_error());
        };
        devices
            .into_iter()
            .map(|d| s.reading(check_device(d)?).map(Into::into).map_err(py_err))
            .collect()
    }

    /// Starts a new window: the peak drops to the current `used`, which becomes the base.
    fn reset(&self) -> PyResult<()> {
        match self.lock().as_ref() {
            Some(s) => s.reset().map_err(py_err),
            None => Err(Self::closed_error()),
        }
    }

    /// Closes the scope now. Returns True when this call closed it, False when it was already
    /// closed (by this handle, or from elsewhere): closing twice is harmless, so cleanup code
    /// never has to guard it.
    fn close(&self) -> bool {
        match self.lock().take() {
            Some(s) => s.close().is_ok(),
            None => false,
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Scope(name={:?}, index={}, generation={}, device={})",
            self.name,
            self.index,
            self.generation,
            self.default_device
                .map_or_else(|| "None".to_string(), |d| d.to_string())
        )
    }
}

/// Every live hooked process of this user (in `GPUMEMHOOK_SHM_DIR`), by pid. Segment files of
/// processes that have exited are removed on the way; unreadable ones are skipped.
#[pyfunction]
fn list_processes() -> PyResult<Vec<Process>> {
    Ok(reader::list_processes()
        .map_err(py_err)?
        .into_iter()
        .map(|e| Process { inner: e.process })
        .collect())
}

/// Parses a size as people write it, with its unit (`8GiB`, `8G`, `8000MB`, `1.5 GiB`, `4096B`)
/// into bytes (a bare number is refused: `8 what? write 8GiB, or 8B for bytes`);
/// zero is refused (a ceiling of nothing) unless `allow_zero` (an amount such as a leak budget).
#[pyfunction]
#[pyo3(signature = (text, allow_zero=false))]
fn parse_size(text: &str, allow_zero: bool) -> PyResult<u64> {
    let parsed = if allow_zero {
        reader::parse_amount(text)
    } else {
        reader::parse_size(text)
    };
    parsed.map_err(|e| PyValueError::new_err(e.to_string()))
}

/// This user's group `name` (`GPUMEMHOOK_GROUP`, docs/groups.md): its figures on `device` as JSON
/// (`gpumemhook_reader::GroupStats`), members found dead given back first.
#[pyfunction]
fn group_stats_json(name: &str, device: u32) -> PyResult<String> {
    let device = check_device(device)?;
    let mapping = group_mapping(name)?;
    serde_json::to_string(&mapping.stats(device))
        .map_err(|e| GpuMemHookError::new_err(format!("group: {e}")))
}

/// Removes this user's group `name` from the segment directory (the pytest plugin's own session
/// group, at the session's end); gone already is no error.
#[pyfunction]
fn remove_group(name: &str) -> PyResult<()> {
    let dir = reader::segment_dir();
    reader::remove_group(&dir, reader::current_uid(), name).map_err(py_err)
}

/// This user's group `name`, mapped for its scopes.
fn group_mapping(name: &str) -> PyResult<reader::GroupMapping> {
    let dir = reader::segment_dir();
    reader::open_group(&dir, reader::current_uid(), name).map_err(py_err)
}

/// Opens a scope on `device` of group `name` (docs/groups.md, group scopes); its id. It lives
/// until closed, whoever opened it.
#[pyfunction]
fn group_scope_open(name: &str, label: &str, device: u32) -> PyResult<u64> {
    group_mapping(name)?
        .open_scope(label, device)
        .map_err(py_err)
}

/// The reading of scope `id` of group `name` now (`ScopeClosedError` once it is closed).
#[pyfunction]
fn group_scope_read(name: &str, id: u64) -> PyResult<ScopeReading> {
    let scope = group_mapping(name)?.read_scope(id).map_err(py_err)?;
    Ok(scope.reading.into())
}

/// Restarts scope `id` of group `name` from the group's `used` now.
#[pyfunction]
fn group_scope_reset(name: &str, id: u64) -> PyResult<()> {
    group_mapping(name)?.reset_scope(id).map_err(py_err)
}

/// Closes scope `id` of group `name`; its final reading.
#[pyfunction]
fn group_scope_close(name: &str, id: u64) -> PyResult<ScopeReading> {
    let scope = group_mapping(name)?.close_scope(id).map_err(py_err)?;
    Ok(scope.reading.into())
}

/// Formats bytes for people: `0 B`, `1.50 KiB`, `64.00 MiB`, `200.0 GiB`.
#[pyfunction]
fn format_size(bytes: u64) -> String {
    reader::format_size(bytes)
}

/// Writes `data` to `path` by the one rule for every file gpumemhook writes (`docs/output-files.md`):
/// a regular file or a new path atomically, a device, FIFO or socket (or `/dev/stdout`) written
/// through, a symlink another user planted never followed. `OSError` when it cannot be written.
#[pyfunction]
fn write_file(path: PathBuf, data: &[u8]) -> PyResult<()> {
    reader::write_file(&path, |out| out.write_all(data))
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display())))
}

/// `ValueError` saying why when `path` cannot be written (a directory or a block device in its
/// place, a missing or unwritable directory, a file this user cannot write): the check the CLI
/// makes of `--report` and `--trace` before the program starts, for files written at the end.
#[pyfunction]
fn check_writable(path: PathBuf) -> PyResult<()> {
    reader::check_writable(&path).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `LD_PRELOAD` for a program started under the hook `lib`: the hook first, then `existing`
/// (the current value) minus any other copy of the hook, as `gpumemhook run` sets it.
#[pyfunction]
#[pyo3(signature = (existing, lib))]
fn preload_value(existing: Option<std::ffi::OsString>, lib: PathBuf) -> std::ffi::OsString {
    reader::env::preload_value(existing.as_deref(), &lib)
}

/// `device` when a segment counts it; `ValueError` otherwise.
#[pyfunction(name = "check_device")]
fn check_device_py(device: u32) -> PyResult<u32> {
    check_device(device)
}

/// The facts the Python package takes from the reader rather than spelling them again: the hook's
/// file name, the largest size a ceiling may be, the environment variables' names
/// (`ENV_<NAME>`: `ENV_LIMIT` is `"GPUMEMHOOK_LIMIT"`) and the variables the hook records as job
/// labels (`JOB_VARIABLES`, in order of precedence).
fn add_facts(m: &Bound<'_, PyModule>) -> PyResult<()> {
    use reader::env;
    m.add("HOOK_LIB_NAME", env::HOOK_LIB_NAME)?;
    m.add("MAX_SIZE", reader::MAX_SIZE)?;
    let job_variables = reader::JOB_VARIABLES.map(|(variable, _)| variable);
    m.add(
        "JOB_VARIABLES",
        pyo3::types::PyTuple::new(m.py(), job_variables)?,
    )?;
    m.add(
        "NVML_LIB_NAME",
        env::NVML_LIB_NAME.to_string_lossy().into_owned(),
    )?;
    // Every variable of the reader's one list, by the name of its constant there.
    for (name, _) in env::ALL {
        m.add(env::attribute_name(name).as_str(), *name)?;
    }
    m.add_function(wrap_pyfunction!(preload_value, m)?)?;
    m.add_function(wrap_pyfunction!(check_writable, m)?)?;
    m.add_function(wrap_pyfunction!(check_device_py, m)?)?;
    Ok(())
}

/// Every card `emulate` and `GPUMEMHOOK_EMULATE` know: `(name, total bytes, NVIDIA's name)`,
/// smallest first (the reader's one table).
#[pyfunction]
fn cards() -> Vec<(&'static str, u64, &'static str)> {
    reader::CARDS
        .iter()
        .map(|c| (c.name, c.total_bytes(), c.full_name))
        .collect()
}

/// Reads a card name or a size as `GPUMEMHOOK_EMULATE` does: `(label, total bytes)`; a ValueError
/// listing the cards otherwise.
#[pyfunction]
fn parse_card(text: &str) -> PyResult<(String, u64)> {
    reader::parse_card(text)
        .map(|e| (e.label(), e.total))
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LAYOUT_MAJOR", LAYOUT_MAJOR)?;
    m.add("LAYOUT_MINOR", LAYOUT_MINOR)?;
    m.add("SEGMENT_SIZE", SEGMENT_SIZE)?;
    m.add("MAX_DEVICES", MAX_DEVICES)?;
    m.add("MAX_SCOPES", MAX_SCOPES)?;
    m.add("HOW_TO_HOOK", HOW_TO_HOOK)?;
    m.add("GpuMemHookError", py.get_type::<GpuMemHookError>())?;
    m.add("NotHookedError", py.get_type::<NotHookedError>())?;
    m.add("ProcessGoneError", py.get_type::<ProcessGoneError>())?;
    m.add("LayoutVersionError", py.get_type::<LayoutVersionError>())?;
    m.add("ScopeClosedError", py.get_type::<ScopeClosedError>())?;
    m.add_class::<Process>()?;
    m.add_class::<Scope>()?;
    m.add_class::<ScopeReading>()?;
    m.add_class::<DeviceStats>()?;
    m.add_function(wrap_pyfunction!(list_processes, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(format_size, m)?)?;
    m.add_function(wrap_pyfunction!(group_stats_json, m)?)?;
    m.add_function(wrap_pyfunction!(remove_group, m)?)?;
    m.add_function(wrap_pyfunction!(group_scope_open, m)?)?;
    m.add_function(wrap_pyfunction!(group_scope_read, m)?)?;
    m.add_function(wrap_pyfunction!(group_scope_reset, m)?)?;
    m.add_function(wrap_pyfunction!(group_scope_close, m)?)?;
    m.add_function(wrap_pyfunction!(write_file, m)?)?;
    add_facts(m)?;
    m.add_function(wrap_pyfunction!(cards, m)?)?;
    m.add_function(wrap_pyfunction!(parse_card, m)?)?;
    Ok(())
}

//! Attaching to a hooked process (this one or another), reading its counters, and the scopes and
//! ceilings a reader may change.

use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::layout::{ScopeId, ScopeSlotError, Segment, MAX_DEVICES};
use crate::process;
use crate::shm::{self, Mapping};
use crate::snapshot::{DeviceStats, ScopeDeviceStats, Snapshot};

/// The hook's `gpumemhook_trace_scope(open, slot, name)`: marks scope spans on the timeline.
type TraceScopeFn = unsafe extern "C" fn(std::ffi::c_int, u32, *const std::ffi::c_char);

/// A hooked process's segment, mapped. Cheap to clone.
#[derive(Clone)]
pub struct Process {
    mapping: Arc<Mapping>,
    /// Present when attached in-process: scopes then also appear on the hook's timeline.
    trace_scope: Option<TraceScopeFn>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.pid())
            .field("path", &self.mapping.path())
            .finish()
    }
}

impl Process {
    /// This process's own segment, found through the hook loaded into it (no file needed, so it
    /// also works when the hook counts in private memory).
    ///
    /// ```
    /// // In a process started without the hook there is nothing to attach to:
    /// let err = gpumemhook_reader::Process::current().unwrap_err();
    /// assert!(err.to_string().contains("LD_PRELOAD"));
    /// ```
    pub fn current() -> Result<Process> {
        let this = libloading::os::unix::Library::this();
        // SAFETY: the symbol, when present, is the hook's `gpumemhook_segment`, of this signature.
        let segment_fn = unsafe {
            this.get::<unsafe extern "C" fn() -> *const Segment>(b"gpumemhook_segment\0")
        }
        .map_err(|_| Error::NotLoaded)?;
        // SAFETY: as above.
        let path_fn = unsafe {
            this.get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(
                b"gpumemhook_segment_path\0",
            )
        }
        .map_err(|_| Error::NotLoaded)?;
        // SAFETY: both functions take no arguments and return pointers owned by the hook.
        let (segment, path) = unsafe { (segment_fn(), path_fn()) };
        let segment = NonNull::new(segment.cast_mut()).ok_or(Error::NotLoaded)?;
        let path = (!path.is_null()).then(|| {
            // SAFETY: a non-null path is a NUL-terminated string the hook never frees.
            PathBuf::from(
                unsafe { std::ffi::CStr::from_ptr(path) }
                    .to_string_lossy()
                    .into_owned(),
            )
        });
        // SAFETY: the hook keeps its segment mapped for the life of the process.
        let mapping = unsafe { Mapping::from_static(segment, path) };
        // SAFETY: when present, the hook's function of exactly this signature.
        let trace_scope = unsafe { this.get::<TraceScopeFn>(b"gpumemhook_trace_scope\0") }
            .ok()
            .map(|f| *f);
        Ok(Process {
            mapping: Arc::new(mapping),
            trace_scope,
        })
    }

    /// The segment of `pid` (same user, same `GPUMEMHOOK_SHM_DIR`).
    ///
    /// ```
    /// use gpumemhook_reader::{Error, Process};
    /// // pid 1 was not started under the hook: a typed error says so, and how to fix it.
    /// match Process::attach(1) {
    ///     Err(Error::NoSegment { pid, .. }) => assert_eq!(pid, 1),
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    pub fn attach(pid: u32) -> Result<Process> {
        let path = shm::segment_path(&shm::segment_dir(), process::current_uid(), pid);
        if !path.exists() {
            return Err(Error::NoSegment { pid, path });
        }
        let p = Process::open(&path)?;
        if !p.is_alive() {
            return Err(Error::ProcessGone { pid });
        }
        Ok(p)
    }

    /// A segment file by path (validated: magic and layout version).
    pub fn open(path: &Path) -> Result<Process> {
        Ok(Process {
            mapping: Arc::new(shm::open(path)?),
            trace_scope: None,
        })
    }

    /// The segment itself, for direct atomic reads.
    pub fn segment(&self) -> &Segment {
        self.mapping.segment()
    }

    pub fn path(&self) -> Option<&Path> {
        self.mapping.path()
    }

    pub fn pid(&self) -> u32 {
        self.segment().header.pid.load(Relaxed)
    }

    /// True while the process that wrote the segment runs (not a later one with its pid).
    pub fn is_alive(&self) -> bool {
        let ticks = self.segment().header.proc_start_ticks.load(Relaxed);
        process::is_same_process_alive(self.pid(), (ticks != 0).then_some(ticks))
    }

    /// Everything at once.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::read(self.segment(), self.path())
    }

    /// Device bytes held now: one atomic load.
    #[inline]
    pub fn used(&self, device: u32) -> u64 {
        self.segment()
            .device(device)
            .map_or(0, |c| c.used.load(Relaxed))
    }

    /// Largest `used` since start or the last [`Process::reset_peak`]: one atomic load.
    #[inline]
    pub fn peak(&self, device: u32) -> u64 {
        self.segment()
            .device(device)
            .map_or(0, |c| c.peak.load(Relaxed))
    }

    /// All counters of one device.
    pub fn device(&self, device: u32) -> Result<DeviceStats> {
        check_device(device)?;
        Ok(DeviceStats::read(self.segment(), device))
    }

    fn writable(&self) -> Result<&Segment> {
        if self.mapping.is_writable() {
            Ok(self.segment())
        } else {
            Err(Error::ReadOnly {
                path: self.path().map(Path::to_path_buf).unwrap_or_default(),
            })
        }
    }

    /// Restarts the peak of one device, or of all, from the current `used`.
    pub fn reset_peak(&self, device: Option<u32>) -> Result<()> {
        let segment = self.writable()?;
        match device {
            Some(d) => {
                check_device(d)?;
                segment.devices[d as usize].reset_peak();
            }
            None => segment.devices.iter().for_each(|c| c.reset_peak()),
        }
        Ok(())
    }

    /// Sets the ceiling of one device, or of all; `None` lifts it. Takes effect at the next
    /// allocation.
    pub fn set_limit(&self, device: Option<u32>, limit: Option<u64>) -> Result<()> {
        if let Some(d) = device {
            check_device(d)?;
        }
        self.writable()?.set_limit(device, limit);
        Ok(())
    }

    /// Opens a scope: an exact, resettable peak marker. It closes when the returned [`Scope`] is
    /// dropped (or [`Scope::close`]d).
    pub fn open_scope(&self, name: &str, device: Option<u32>) -> Result<Scope> {
        if let Some(d) = device {
            check_device(d)?;
        }
        let segment = self.writable()?;
        let open =
            |s: &Segment| s.open_scope(name, device, std::process::id(), process::unix_now_ns());
        let id = match open(segment) {
            Err(ScopeSlotError::Full) if segment.reap_scopes(process::is_alive) > 0 => {
                open(segment)
            }
            other => other,
        }
        .map_err(|_| Error::ScopesFull)?;
        self.mark_scope(true, id, name);
        Ok(Scope {
            process: self.clone(),
            id,
            owned: true,
        })
    }

    /// The open scopes of the process, as handles that do not close them when dropped.
    pub fn scopes(&self) -> Vec<Scope> {
        self.segment()
            .open_scopes()
            .map(|(id, _)| Scope {
                process: self.clone(),
                id,
                owned: false,
            })
            .collect()
    }

    /// An open scope by name (the first in slot order), not closed when dropped.
    pub fn find_scope(&self, name: &str) -> Option<Scope> {
        self.scopes().into_iter().find(|s| s.name() == name)
    }
}

impl Process {
    /// Marks a scope opening or closing on the hook's timeline (in-process only).
    fn mark_scope(&self, open: bool, id: ScopeId, name: &str) {
        if let (Some(f), Ok(name)) = (self.trace_scope, std::ffi::CString::new(name)) {
            // SAFETY: the hook's function; `name` outlives the call.
            unsafe { f(std::ffi::c_int::from(open), id.index, name.as_ptr()) };
        }
    }
}

/// `device` when a segment counts it (below [`MAX_DEVICES`]), else [`Error::NoSuchDevice`]: the
/// one check of a device number given by a user (the bindings and the CLI call it too).
pub fn check_device(device: u32) -> Result<u32> {
    if (device as usize) < MAX_DEVICES {
        Ok(device)
    } else {
        Err(Error::NoSuchDevice { device })
    }
}

fn scope_error(e: ScopeSlotError) -> Error {
    match e {
        ScopeSlotError::Full => Error::ScopesFull,
        ScopeSlotError::Stale => Error::ScopeClosed,
    }
}

/// A handle to an open scope.
pub struct Scope {
    process: Process,
    id: ScopeId,
    owned: bool,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("id", &self.id)
            .field("name", &self.name())
            .finish()
    }
}

/// What a scope measured on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeReading {
    pub device: u32,
    /// `used` when the scope was opened or last reset.
    pub base: u64,
    /// Largest `used` since then.
    pub peak: u64,
    /// `used` now.
    pub used: u64,
}

impl ScopeReading {
    /// `used - base`, negative when memory was given back.
    pub fn delta_used(&self) -> i64 {
        self.used as i64 - self.base as i64
    }

    /// `peak - base`: the most the scope's window ever held above where it started.
    pub fn delta_peak(&self) -> u64 {
        self.peak.saturating_sub(self.base)
    }

    /// fastai's "delta peaked": the blip above the end state, `peak - base - max(delta_used, 0)`.
    pub fn delta_peaked(&self) -> u64 {
        self.delta_peak()
            .saturating_sub(self.delta_used().max(0) as u64)
    }

    /// `peak - used`: how far above the current use the window went (ipygpulogger's "peaked").
    pub fn peak_above_used(&self) -> u64 {
        self.peak.saturating_sub(self.used)
    }
}

impl From<ScopeReading> for ScopeDeviceStats {
    fn from(r: ScopeReading) -> Self {
        ScopeDeviceStats {
            device: r.device,
            base: r.base,
            peak: r.peak,
            used: r.used,
        }
    }
}

impl Scope {
    pub fn id(&self) -> ScopeId {
        self.id
    }

    pub fn name(&self) -> String {
        self.process
            .segment()
            .scope(self.id)
            .map(|s| s.name())
            .unwrap_or_default()
    }

    /// The device the scope reports by default (`None`: opened for all devices).
    pub fn device(&self) -> Option<u32> {
        self.process
            .segment()
            .scope(self.id)
            .ok()
            .and_then(|s| s.default_device())
    }

    /// What the scope measured on `device`.
    ///
    /// ```no_run
    /// let me = gpumemhook_reader::Process::current()?;
    /// let scope = me.open_scope("forward", Some(0))?;
    /// // ... run the code to measure ...
    /// let r = scope.reading(0)?;
    /// println!("{} bytes above the start at the peak", r.delta_peak());
    /// # Ok::<(), gpumemhook_reader::Error>(())
    /// ```
    pub fn reading(&self, device: u32) -> Result<ScopeReading> {
        check_device(device)?;
        let segment = self.process.segment();
        let slot = segment.scope(self.id).map_err(scope_error)?;
        let d = device as usize;
        let reading = ScopeReading {
            device,
            base: slot.base[d].load(Relaxed),
            peak: slot.peak[d].load(Relaxed),
            used: segment.devices[d].used.load(Relaxed),
        };
        // The slot may have been closed while it was read.
        segment.scope(self.id).map_err(scope_error)?;
        Ok(reading)
    }

    /// Starts a new window: the peak drops to the current `used`, which becomes the base.
    pub fn reset(&self) -> Result<()> {
        self.process
            .writable()?
            .reset_scope(self.id)
            .map_err(scope_error)
    }

    /// Closes the scope now.
    pub fn close(mut self) -> Result<()> {
        self.owned = false;
        let name = self.name();
        self.process
            .writable()?
            .close_scope(self.id)
            .map_err(scope_error)?;
        self.process.mark_scope(false, self.id, &name);
        Ok(())
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.owned {
            let name = self.name();
            if let Ok(segment) = self.process.writable() {
                if segment.close_scope(self.id).is_ok() {
                    self.process.mark_scope(false, self.id, &name);
                }
            }
        }
    }
}

/// A live hooked process found by [`list_processes`].
#[derive(Debug, Clone)]
pub struct ProcessEntry {
    pub pid: u32,
    pub path: PathBuf,
    pub process: Process,
}

/// Every live hooked process of this user on this machine (in `GPUMEMHOOK_SHM_DIR`), by pid.
/// Segment files of processes that have exited are removed on the way. Files that cannot be
/// read (another layout version, say) are skipped.
pub fn list_processes() -> Result<Vec<ProcessEntry>> {
    let dir = shm::segment_dir();
    let uid = process::current_uid();
    let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io {
        path: dir.clone(),
        source,
    })?;
    let mut found: Vec<ProcessEntry> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid = shm::pid_of_file_name(&name, uid)?;
            let path = e.path();
            match Process::open(&path) {
                Ok(p) if p.is_alive() => Some(ProcessEntry {
                    pid,
                    path,
                    process: p,
                }),
                Ok(_) => {
                    let _ = std::fs::remove_file(&path);
                    None
                }
                Err(Error::WrongMagic { .. }) | Err(Error::Truncated { .. }) => {
                    if !process::is_alive(pid) {
                        let _ = std::fs::remove_file(&path);
                    }
                    None
                }
                Err(_) => None,
            }
        })
        .collect();
    found.sort_by_key(|e| e.pid);
    Ok(found)
}

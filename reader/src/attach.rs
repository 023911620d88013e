//! Attaching to a hooked process (this one or another), reading its counters, and the scopes and
//! ceilings a reader may change; listing every hooked process ([`list_segments`]).
//!
//! Every segment file is opened through `shm::open_checked` (see `shm` for what a planted file
//! can and cannot do to a reader) and judged live by `shm::is_live`: the pid runs with the start
//! time the header records, and the creator's lock is still held. Files that fail are never shown
//! as live; the ones this user owns are removed on the way. Writes (ceilings, peak resets, scopes)
//! to a process that is gone fail with [`Error::ProcessGone`].

use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::exports::{self, lookup_export, Export};
use crate::labels::JobLabels;
use crate::shm::{self, Expect, SegmentMapping};
use crate::snapshot::{DeviceStats, ModuleStats, ScopeDeviceStats, SiteStats, Snapshot};
use gpumemhook_segment::layout::{ScopeId, ScopeSlotError, Segment, MAX_DEVICES};
use gpumemhook_segment::process;

/// The hook's `gpumemhook_trace_scope(open, slot, name)`: marks scope spans on the timeline.
type TraceScopeFn = <exports::export_rows::TraceScope as Export>::Fn;

/// The signature of the hook's JSON exports (`gpumemhook_report_json`).
type JsonFn = <exports::export_rows::ReportJson as Export>::Fn;

/// A hooked process's segment, mapped. Cheap to clone.
#[derive(Clone)]
pub struct Process {
    mapping: Arc<SegmentMapping>,
    /// The pid the segment belongs to, read when it was opened (stable even if the file shrinks).
    pid: u32,
    /// Attached in-process through the hook: always alive.
    in_process: bool,
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
        let segment_fn =
            lookup_export::<exports::export_rows::Segment>().ok_or(Error::NotLoaded)?;
        let path_fn =
            lookup_export::<exports::export_rows::SegmentPath>().ok_or(Error::NotLoaded)?;
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
        let mapping = unsafe { SegmentMapping::from_static(segment, path) };
        let trace_scope = lookup_export::<exports::export_rows::TraceScope>();
        let pid = mapping.segment().header.pid.load(Relaxed);
        Ok(Process {
            mapping: Arc::new(mapping),
            pid,
            in_process: true,
            trace_scope,
        })
    }

    /// The segment of `pid` (same user, or any user's for root; same `GPUMEMHOOK_SHM_DIR`),
    /// checked (see the module docs) and live.
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
        let me = process::current_uid();
        let runs_as = process::real_uid_of(pid);
        if let Some(uid) = runs_as.filter(|&uid| me != 0 && uid != me) {
            return Err(Error::OtherUser { pid, uid });
        }
        let owner = runs_as.unwrap_or(me);
        // The process names its segment by the pid it sees itself by, in its own pid namespace
        // (a container's process seen from the node has another pid there).
        let namespace = process::pid_namespace_of(pid).or_else(process::own_pid_namespace);
        let inner = process::namespace_pids(pid)
            .and_then(|pids| pids.last().copied())
            .unwrap_or(pid);
        let path = shm::segment_path_in(&shm::segment_dir(), owner, inner, namespace);
        if std::fs::symlink_metadata(&path).is_err() {
            return Err(match runs_as {
                Some(_) => Error::NoSegment { pid, path },
                None => Error::ProcessGone { pid },
            });
        }
        let here = namespace == process::own_pid_namespace();
        let mut found = inspect(&path, owner, inner, me, here)?;
        found.pid = pid;
        Ok(found)
    }

    /// A segment file by path, checked like any other (owned by this user, mode 0600, a
    /// segment's size and header), live or not.
    pub fn open(path: &Path) -> Result<Process> {
        let mapping = shm::open_segment_file(path)?;
        let pid = mapping.segment().header.pid.load(Relaxed);
        Ok(Process {
            mapping: Arc::new(mapping),
            pid,
            in_process: false,
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
        self.pid
    }

    /// The uid owning the segment file (the process's user).
    pub fn uid(&self) -> u32 {
        self.mapping.owner()
    }

    /// True while the process that wrote the segment runs (not a later one with its pid, not an
    /// `exec`'d image without the hook): see `shm::is_live`. Always true in-process.
    pub fn is_alive(&self) -> bool {
        self.in_process || shm::is_live(&self.mapping)
    }

    /// Everything at once, under the pid this reader sees the process by (a container's process
    /// seen from the node: the node's pid, and the one it sees itself by in `pid_in_namespace`).
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::read(self.segment(), self.path());
        snapshot.job = self.job();
        snapshot.pid_in_namespace = self.pid_in_namespace();
        snapshot.pid = self.pid;
        snapshot
    }

    /// Where the process belongs: the job labels its hook recorded, and where they name no pod,
    /// the pod of its cgroup path as this reader sees it ([`JobLabels::with_pod_of`]).
    pub fn job(&self) -> JobLabels {
        JobLabels::read_from(self.segment()).with_pod_of(self.pid)
    }

    /// The pid the process sees itself by, where that differs from [`Process::pid`] (a process of
    /// another pid namespace, seen from the node).
    pub fn pid_in_namespace(&self) -> Option<u32> {
        let header = &self.segment().header;
        shm::is_of_other_namespace(header).then(|| header.pid.load(Relaxed))
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
        self.segment().device(device).map_or(0, |c| c.peak_bytes())
    }

    /// All counters of one device.
    pub fn device(&self, device: u32) -> Result<DeviceStats> {
        check_device(device)?;
        Ok(DeviceStats::read(self.segment(), device))
    }

    /// Lets the next out-of-memory of this process write a report again (`GPUMEMHOOK_OOM_REPORT`,
    /// whose `%n` numbers the reports): one report per training step, say. Only for the process's
    /// own segment ([`Process::current`]); `Ok(false)` when no out-of-memory report was asked for.
    pub fn arm_oom_report(&self) -> Result<bool> {
        if !self.in_process {
            return Err(Error::NotLoaded);
        }
        let arm = lookup_export::<exports::export_rows::ArmOomReport>().ok_or(Error::NotLoaded)?;
        // SAFETY: takes no arguments; only stores a flag in the hook.
        Ok(unsafe { arm() } != 0)
    }

    /// The exit report's contents now: the snapshot with the allocations still held (`live`,
    /// largest first, with modules and Python sites), which only the hook's own memory knows. Only
    /// for the process's own segment ([`Process::current`]); [`Error::NotLoaded`] otherwise.
    pub fn report(&self) -> Result<Snapshot> {
        let text = self.hook_json::<exports::export_rows::ReportJson>()?;
        serde_json::from_slice(&text).map_err(|e| Error::Report {
            reason: e.to_string(),
        })
    }

    /// Device memory by Python call site (`GPUMEMHOOK_STACKS`), all devices together, largest
    /// `used` first, read from the segment: the first [`gpumemhook_segment::layout::SITE_SLOTS`] sites the
    /// process recorded. Empty when it recorded none.
    pub fn site_breakdown(&self) -> Result<Vec<SiteStats>> {
        Ok(SiteStats::read(self.segment()).unwrap_or_default())
    }

    /// The JSON text the hook's export `E` (`fn(buf, cap) -> len`: writes the text when it fits,
    /// returns its length either way, 0 while not counting) gives now. In-process only.
    fn hook_json<E: Export<Fn = JsonFn>>(&self) -> Result<Vec<u8>> {
        if !self.in_process {
            return Err(Error::NotLoaded);
        }
        let get = lookup_export::<E>().ok_or(Error::NotLoaded)?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is writable for `buf.len()` bytes; the hook writes at most that many.
            let len = unsafe { get(buf.as_mut_ptr(), buf.len()) };
            if len == 0 {
                return Err(Error::NotLoaded);
            }
            if len <= buf.len() {
                buf.truncate(len);
                return Ok(buf);
            }
            // Grown since the last call (allocations of other threads): ask again with room to spare.
            buf.resize(len + len / 4, 0);
        }
    }

    /// Device memory of one device by the shared object that asked for it, largest `used` first
    /// (see [`ModuleStats`]).
    pub fn breakdown(&self, device: u32) -> Result<Vec<ModuleStats>> {
        check_device(device)?;
        Ok(ModuleStats::read(self.segment(), device))
    }

    /// The segment, for a write to a live process.
    fn writable(&self) -> Result<&Segment> {
        let segment = self.writable_even_if_gone()?;
        if !self.is_alive() {
            return Err(Error::ProcessGone { pid: self.pid });
        }
        Ok(segment)
    }

    /// The segment for a write that is harmless after the process is gone (closing a scope).
    fn writable_even_if_gone(&self) -> Result<&Segment> {
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
        let actor = process::actor_token();
        // Scopes whose opener died (a killed reader) would fold forever: close them first. Our own
        // pid needs no `/proc` read.
        let me = std::process::id();
        segment.reap_scopes(|pid| pid == me || process::is_alive(pid), actor);
        let open = |s: &Segment| {
            s.open_scope(
                name,
                device,
                std::process::id(),
                process::unix_now_ns(),
                actor,
            )
        };
        let id = open(segment).map_err(scope_error)?;
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
        ScopeSlotError::Busy => Error::ScopeBusy,
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
            .reset_scope(self.id, process::actor_token())
            .map_err(scope_error)
    }

    /// Closes the scope now.
    pub fn close(mut self) -> Result<()> {
        self.owned = false;
        let name = self.name();
        self.process
            .writable_even_if_gone()?
            .close_scope(self.id, process::actor_token())
            .map_err(scope_error)?;
        self.process.mark_scope(false, self.id, &name);
        Ok(())
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.owned {
            let name = self.name();
            if let Ok(segment) = self.process.writable_even_if_gone() {
                if segment.close_scope(self.id, process::actor_token()).is_ok() {
                    self.process.mark_scope(false, self.id, &name);
                }
            }
        }
    }
}

/// A live hooked process found by [`list_segments`].
#[derive(Debug, Clone)]
pub struct ProcessEntry {
    pub pid: u32,
    /// The process's user (the owner of its segment file).
    pub uid: u32,
    pub path: PathBuf,
    pub process: Process,
}

/// Whose segment files [`list_segments`] looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owners {
    /// Files named for this user.
    Me,
    /// Every user's files: all of them for root; for anyone else, the other users' files are
    /// listed as skipped (they cannot be read).
    Everyone,
}

/// A file at a segment's name that was not listed as live, and why.
#[derive(Debug)]
pub struct Skipped {
    pub path: PathBuf,
    /// The pid its name claims, when the name parses.
    pub pid: Option<u32>,
    /// Why: a refusal ([`Error::Refused`]), [`Error::ProcessGone`] for a stale file (removed when
    /// this user owns it), another layout version, an I/O error.
    pub reason: Error,
}

/// What [`list_segments`] found.
#[derive(Debug, Default)]
pub struct Listing {
    /// Live hooked processes, by pid.
    pub live: Vec<ProcessEntry>,
    /// Everything else at a segment's name, by path.
    pub skipped: Vec<Skipped>,
}

/// Every hooked process whose segment is in `GPUMEMHOOK_SHM_DIR` (or `/dev/shm`), checked and
/// judged live as the module docs say. Stale files this user owns are removed on the way. Never
/// blocks on what another user planted, never writes to a file it did not check.
pub fn list_segments(owners: Owners) -> Result<Listing> {
    list_segments_in(&shm::segment_dir(), owners)
}

/// [`list_segments`] over the segment files in `dir`.
pub fn list_segments_in(dir: &Path, owners: Owners) -> Result<Listing> {
    let me = process::current_uid();
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut listing = Listing::default();
    let mut elsewhere = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let Some(name) = entry.file_name().to_str().and_then(shm::parse_segment_name) else {
            continue;
        };
        if owners == Owners::Me && name.uid != me {
            continue;
        }
        let path = entry.path();
        if !name.is_of_this_namespace() {
            elsewhere.push((name, path));
            continue;
        }
        let (named_uid, pid) = (name.uid, name.pid);
        let owner = if me == 0 {
            process::real_uid_of(pid).unwrap_or(named_uid)
        } else {
            me
        };
        let found = if me != 0 && named_uid != me {
            // Another user's file (listed by `Owners::Everyone`): not ours to read.
            Err(Error::OtherUser {
                pid,
                uid: named_uid,
            })
        } else if named_uid != owner {
            Err(Error::Refused {
                path: path.clone(),
                refusal: crate::error::Refusal::WrongUser {
                    named: named_uid,
                    runs_as: owner,
                },
            })
        } else {
            inspect(&path, owner, pid, me, true)
        };
        listing.add(found, pid, owner, path);
    }
    list_other_namespaces(&mut listing, elsewhere, me);
    listing.live.sort_by_key(|e| e.pid);
    listing.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(listing)
}

impl Listing {
    /// Files the listing of `pid` (a pid of this reader's namespace) found, live or skipped.
    fn add(&mut self, found: Result<Process>, pid: u32, uid: u32, path: PathBuf) {
        match found {
            Ok(process) => self.live.push(ProcessEntry {
                pid,
                uid,
                path,
                process,
            }),
            Err(reason) => self.skipped.push(Skipped {
                path,
                pid: Some(pid),
                reason,
            }),
        }
    }
}

/// The segments of processes of other pid namespaces than this reader's: judged live by their
/// lock alone (`shm::is_live`), owned by the user their name says, and listed under the pid this
/// reader sees them by, where it sees them (the node looking into a container, through `NSpid`).
/// A live one this reader cannot see at all (a container looking at the node, or at another
/// container) is skipped as [`Error::OtherNamespace`], never removed.
fn list_other_namespaces(listing: &mut Listing, found: Vec<(shm::SegmentName, PathBuf)>, me: u32) {
    let mut namespaces: Vec<u64> = found.iter().filter_map(|(n, _)| n.namespace).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let visible = process::visible_in(&namespaces);
    for (name, path) in found {
        let found = if me != 0 && name.uid != me {
            Err(Error::OtherUser {
                pid: name.pid,
                uid: name.uid,
            })
        } else {
            inspect(&path, name.uid, name.pid, me, false)
        };
        let namespace = name.namespace.unwrap_or(process::INITIAL_PID_NAMESPACE);
        let here = visible.get(&(namespace, name.pid)).copied();
        let found = found.and_then(|mut process| match here {
            Some(pid) => {
                process.pid = pid;
                Ok(process)
            }
            None => Err(Error::OtherNamespace {
                pid: name.pid,
                namespace,
            }),
        });
        listing.add(found, here.unwrap_or(name.pid), name.uid, path);
    }
}

/// Every live hooked process of this user on this machine (in `GPUMEMHOOK_SHM_DIR`), by pid:
/// the live part of `list_segments(Owners::Me)`.
pub fn list_processes() -> Result<Vec<ProcessEntry>> {
    Ok(list_segments(Owners::Me)?.live)
}

/// Opens the segment file of `pid` at `path`, expected to be owned by `owner`, and decides whether
/// it is live. A stale file (or a leftover that is no segment) is removed when the reader (`me`)
/// owns it and its process is gone. `here`: `pid` is a pid of this reader's namespace (else a
/// leftover that is no segment is never removed: nothing here can prove its process gone).
fn inspect(path: &Path, owner: u32, pid: u32, me: u32, here: bool) -> Result<Process> {
    match shm::open_checked(
        path,
        Expect {
            owner,
            pid: Some(pid),
        },
    ) {
        Ok(mapping) if shm::is_live(&mapping) => Ok(Process {
            mapping: Arc::new(mapping),
            pid,
            in_process: false,
            trace_scope: None,
        }),
        Ok(mapping) => {
            if owner == me {
                shm::remove_if_same(path, &mapping);
            }
            Err(Error::ProcessGone { pid })
        }
        // Owned by `owner` (the checks before these passed) but not a whole segment: a file its
        // process died while making, or of another release.
        Err(
            e @ (Error::WrongMagic { .. }
            | Error::Truncated { .. }
            | Error::LayoutVersion { .. }
            | Error::Refused {
                refusal:
                    crate::error::Refusal::SizeMismatch { .. }
                    | crate::error::Refusal::PidMismatch { .. },
                ..
            }),
        ) => {
            if owner == me && here && !process::is_alive(pid) {
                let _ = std::fs::remove_file(path);
                return Err(Error::ProcessGone { pid });
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_shows_the_live_skips_the_planted_and_removes_the_stale() {
        let dir = std::env::temp_dir().join(format!("gpumemhook-list-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let me = process::current_uid();
        let pid = std::process::id();
        let live = shm::create_segment(&dir, me, pid).unwrap();
        live.segment()
            .initialise(pid, process::start_ticks(pid).unwrap(), 0, "live", 0);
        // A segment whose process has exited (its creator's lock is still held here, the pid
        // rule alone makes it stale).
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let stale = shm::create_segment(&dir, me, gone_pid).unwrap();
        stale.segment().initialise(gone_pid, 1, 0, "gone", 0);
        let stale_path = stale.path().unwrap().to_path_buf();
        // A FIFO under this user's name, and a copy of the live segment named for another user.
        let fifo = shm::segment_path(&dir, me, 999_999_999);
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let other = shm::segment_path(&dir, me + 1, pid);
        std::fs::copy(live.path().unwrap(), &other).unwrap();

        let mine = list_segments_in(&dir, Owners::Me).unwrap();
        assert_eq!(
            mine.live.iter().map(|e| (e.pid, e.uid)).collect::<Vec<_>>(),
            vec![(pid, me)]
        );
        let mut reasons: Vec<String> = mine
            .skipped
            .iter()
            .map(|s| format!("{:?}", s.reason))
            .collect();
        reasons.sort();
        assert_eq!(mine.skipped.len(), 2, "{reasons:?}");
        assert!(
            reasons.iter().any(|r| r.contains("ProcessGone")),
            "{reasons:?}"
        );
        assert!(
            reasons.iter().any(|r| r.contains("NotRegular")),
            "{reasons:?}"
        );
        assert!(!stale_path.exists(), "the stale file was removed");
        assert!(fifo.exists(), "a FIFO is never removed");

        let everyone = list_segments_in(&dir, Owners::Everyone).unwrap();
        assert_eq!(everyone.live.len(), 1);
        let foreign = everyone
            .skipped
            .iter()
            .find(|s| s.path == other)
            .expect("the other user's file is listed as skipped");
        assert!(
            matches!(
                foreign.reason,
                Error::OtherUser { .. }
                    | Error::Refused {
                        refusal: crate::error::Refusal::WrongUser { .. },
                        ..
                    }
            ),
            "{:?}",
            foreign.reason
        );
        drop((live, stale));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

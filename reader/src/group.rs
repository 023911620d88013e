//! Groups (`GPUMEMHOOK_GROUP`, `docs/groups.md`): processes of one user that share one exact count,
//! one peak, one ceiling and one emulated card. The group's file: its name, its checks, creating,
//! opening and joining it, and reading it. Its format and the protocols its members run on it are
//! the segment crate's (`gpumemhook_segment::group`), named here too.
//!
//! A group is a file `<dir>/gpumemhook-group-<uid>-<name>` beside the process segments, under the
//! same rules (`crate::shm`): created `O_EXCL | O_NOFOLLOW | O_CLOEXEC`, mode 0600, space reserved;
//! opened by anyone else through [`crate::shm`]'s checks (regular file, this user's, mode 0600) and
//! then a `pread` of its header (magic, layout, size) before anything is mapped. A planted or
//! forged file is refused, never read or written.
//!
//! Group scopes ([`scope`]): up to [`MAX_GROUP_SCOPES`] windows on one device of the group, opened,
//! reset, read and closed by any process of the user; each measures the group's peak above its
//! start.
//!
//! Liveness: a member holds an open-file-description write lock (`F_OFD_SETLK`) on one byte of the
//! file per slot, taken at join on a description pinned to its process image
//! ([`shm::LockAnchor`]): death and `exec` drop it; closing descriptors and forking children do not.
//! Whoever finds a live slot whose byte nobody locks ([`GroupSegment::sweep`]: any member at join,
//! at a refusal and at a memory query; any reader of its own user's group before it reads) gives
//! its bytes back by recomputing the group's tallies from the live members ([`gpumemhook_segment::tally`]), so a
//! member or a sweeper killed at any instruction loses and doubles nothing.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod scope;

use crate::error::{Error, Result};
use crate::shm::{self, c_path, io_error};
use crate::sigbus;
use gpumemhook_segment::layout::NO_LIMIT;
use gpumemhook_segment::process::{own_pid_namespace, visible_in};
use gpumemhook_segment::tally::{NoSteps, Steps};

use gpumemhook_segment::group::{
    GroupScopeSlot, GroupSegment, GroupSlots, MemberSlot, GROUP_LAYOUT, GROUP_MAGIC,
    GROUP_NAME_LEN, GROUP_SIZE, MAX_MEMBERS,
};

/// Prefix of every group file name (a process segment's name never has it: its uid is a number).
pub const GROUP_FILE_PREFIX: &str = "gpumemhook-group-";
/// How long a joiner waits for the creator of a group file to publish its header.
const READY_WAIT: Duration = Duration::from_secs(2);

/// Checks a group name: 1 to [`GROUP_NAME_LEN`] bytes of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
pub fn check_group_name(name: &str) -> Result<()> {
    let fine = !name.is_empty()
        && name.len() <= GROUP_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if fine {
        Ok(())
    } else {
        Err(Error::GroupName {
            name: name.to_string(),
            max_len: GROUP_NAME_LEN,
        })
    }
}

/// The file of group `name` of `uid` in `dir`.
pub fn group_path(dir: &Path, uid: u32, name: &str) -> PathBuf {
    dir.join(format!("{GROUP_FILE_PREFIX}{uid}-{name}"))
}

/// Removes the file of group `name` of `uid` in `dir`, so that the group starts afresh (a link
/// planted under its name is removed, never followed); a file already gone is no error.
pub fn remove_group(dir: &Path, uid: u32, name: &str) -> Result<()> {
    check_group_name(name)?;
    let path = group_path(dir, uid, name);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io { path, source: e }),
        _ => Ok(()),
    }
}

/// A mapped group file and its descriptor (a member's holds its slot's lock).
pub struct GroupMapping {
    ptr: NonNull<GroupSegment>,
    fd: OwnedFd,
    path: PathBuf,
    /// Mapped read-write: only then may a read sweep out dead members.
    writable: bool,
    /// Whether the file is this process's user's: only then does a read sweep (a reader never
    /// writes into another user's file, whatever it holds).
    own: bool,
    guard: Option<sigbus::Guarded>,
}

// SAFETY: the mapping is plain memory holding only atomics; it may be used from any thread.
unsafe impl Send for GroupMapping {}
// SAFETY: as above, every access goes through atomics.
unsafe impl Sync for GroupMapping {}

impl GroupMapping {
    pub fn group(&self) -> &GroupSegment {
        // SAFETY: `ptr` is a live shared mapping of GROUP_SIZE bytes, page-aligned, made only of
        // atomics (any bit pattern is valid); a reader's is guarded against shrinking.
        unsafe { self.ptr.as_ref() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sweeps out dead members (see the module docs), then gives the figures of `device`.
    pub fn stats(&self, device: u32) -> GroupStats {
        self.sweep();
        group_stats(self.group(), device)
    }

    /// Gives back the bytes of dead members, where this reader may write the file (its own
    /// user's, mapped read-write, not shrunk under it); how many it swept out.
    pub fn sweep(&self) -> usize {
        self.sweep_with(&mut NoSteps)
    }

    /// [`GroupMapping::sweep`] with an observer of its steps (the crash-point tests').
    pub fn sweep_with<S: Steps>(&self, steps: &mut S) -> usize {
        let may =
            self.writable && self.own && !self.guard.as_ref().is_some_and(sigbus::Guarded::tripped);
        if !may {
            return 0;
        }
        let fd = self.fd.as_raw_fd();
        self.group().sweep(&|slot| slot_locked(fd, slot), steps)
    }

    /// Joins as process `pid` (started at `ticks`): claims a free slot, its lock pinned to this
    /// process image, and keeps the mapping for the rest of the process. [`Error::GroupFull`] when
    /// every slot is held by a live member; [`Error::GroupNoWideAtomic`] on a CPU whose 16-byte
    /// compare-and-swap is not lock-free (its fallback lock is this process's alone, so the
    /// group's tally would not be atomic between members); an I/O error when no description of the
    /// file for the lock can be had.
    pub fn join(self, pid: u32, ticks: u64) -> Result<Membership> {
        if !gpumemhook_segment::sync::Word128::is_lock_free() {
            return Err(Error::GroupNoWideAtomic {
                path: self.path.clone(),
            });
        }
        let anchor = shm::LockAnchor::new(self.fd.as_raw_fd(), &self.path)
            .ok_or_else(|| io_error(&self.path))?;
        let file = shm::dev_ino(anchor.raw()).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        let lock = |slot: usize, take: bool| {
            let kind = if take { libc::F_WRLCK } else { libc::F_UNLCK };
            anchor.try_lock(&slot_lock(kind, slot)) || !take
        };
        let alive = |slot: usize| slot_locked(anchor.raw(), slot);
        let (slot, alone) = self
            .group()
            .claim(&lock, &alive, pid, ticks, own_pid_namespace().unwrap_or(0))
            .ok_or_else(|| Error::GroupFull {
                path: self.path.clone(),
                slots: MAX_MEMBERS,
            })?;
        if let Err(fd) = anchor.pin() {
            // The lock then lives as long as this descriptor, kept open for good.
            let _ = fd.into_raw_fd();
        }
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: the value is never dropped (ManuallyDrop), so the mapping is never unmapped and
        // the reference lives forever; the descriptor, path and guard are moved out of it once each.
        let (fd, path, guard) = unsafe {
            (
                std::ptr::read(&me.fd),
                std::ptr::read(&me.path),
                std::ptr::read(&me.guard),
            )
        };
        std::mem::forget(guard);
        drop(fd);
        Ok(Membership {
            // SAFETY: as above, the mapping stays for the rest of the process.
            group: unsafe { &*me.ptr.as_ptr() },
            slot,
            alone,
            path,
            file,
        })
    }
}

/// A process's membership of a group: the mapping, kept for the rest of the process, and its slot.
/// It keeps no descriptor: a program may close them all, and a sweep opens the file afresh.
pub struct Membership {
    pub group: &'static GroupSegment,
    pub slot: usize,
    /// Whether no other member was live when this one joined: a group whose members had all
    /// ended, which this member starts afresh.
    pub alone: bool,
    path: PathBuf,
    /// `(st_dev, st_ino)` of the file joined: a file at the name that is not this one (removed,
    /// and another made there) is not swept from here.
    file: (u64, u64),
}

impl Membership {
    /// Gives back the bytes of dead members (through a description of the file opened now:
    /// a lock request needs one, and this member keeps none); how many it swept out.
    pub fn sweep(&self) -> usize {
        let Ok((fd, true, _)) =
            shm::open_trusted(&self.path, gpumemhook_segment::process::current_uid())
        else {
            return 0;
        };
        if shm::dev_ino(fd.as_raw_fd()).ok() != Some(self.file) {
            return 0;
        }
        let fd = fd.as_raw_fd();
        self.group
            .sweep(&|slot| slot_locked(fd, slot), &mut NoSteps)
    }

    /// This member's slot.
    pub fn slot(&self) -> &'static MemberSlot {
        &self.group.members[self.slot]
    }
}

impl Drop for GroupMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping this value made; nothing refers to it past `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), GROUP_SIZE) };
    }
}

/// One device's figures of a group, read at one time.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupStats {
    pub used: u64,
    pub peak: u64,
    pub limit: Option<u64>,
    pub allocs: u64,
    pub frees: u64,
    pub refusals: u64,
    /// The emulated card's total, when the group emulates one.
    pub emulated_total: Option<u64>,
    pub members: Vec<MemberStats>,
}

/// A live member and what it holds on the device read.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberStats {
    /// The pid the reader sees the member by; 0 for a member of another pid namespace that the
    /// reader cannot see (a container's reader, and a member on the node or in another container).
    pub pid: u32,
    pub bytes: u64,
    /// For a member of another pid namespace than the reader's: the pid it sees itself by there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_in_namespace: Option<u32>,
}

/// The group in an out-of-memory report: its name, `used` and ceiling on the device, and the
/// other live members with what each held.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupOom {
    pub name: String,
    pub used: u64,
    pub limit: Option<u64>,
    pub others: Vec<MemberStats>,
}

/// The figures of `device` of `group` (zeroes past `MAX_DEVICES`) and the live members holding
/// on it.
pub fn group_stats(group: &GroupSegment, device: u32) -> GroupStats {
    let Some(d) = group.devices.get(device as usize) else {
        return GroupStats::default();
    };
    let load = |a: &AtomicU64| a.load(Ordering::Acquire);
    GroupStats {
        used: d.used.get(),
        peak: load(&d.peak),
        limit: Some(load(&d.limit)).filter(|&l| l != NO_LIMIT),
        allocs: load(&d.allocs),
        frees: load(&d.frees),
        refusals: load(&d.refusals),
        emulated_total: Some(load(&d.emulated_total)).filter(|&t| t != 0),
        members: members(group, device as usize),
    }
}

/// The live members of `group` and what each holds on `device`, each under the pid this reader
/// sees it by (a member of another pid namespace through `NSpid`, where this reader sees it).
fn members(group: &GroupSegment, device: usize) -> Vec<MemberStats> {
    let here = own_pid_namespace().unwrap_or(0);
    let elsewhere = |m: &MemberSlot| {
        let namespace = m.pid_namespace.load(Ordering::Relaxed);
        (namespace != 0 && namespace != here).then_some(namespace)
    };
    let mut namespaces: Vec<u64> = group.live_members().filter_map(elsewhere).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let visible = visible_in(&namespaces);
    group
        .live_members()
        .map(|m| {
            let pid = m.pid.load(Ordering::Relaxed);
            let bytes = m.bytes.get(device).map_or(0, |b| b.load(Ordering::Acquire));
            match elsewhere(m) {
                None => MemberStats {
                    pid,
                    bytes,
                    pid_in_namespace: None,
                },
                Some(namespace) => MemberStats {
                    pid: visible.get(&(namespace, pid)).copied().unwrap_or(0),
                    bytes,
                    pid_in_namespace: Some(pid),
                },
            }
        })
        .collect()
}

/// Maps `fd` (GROUP_SIZE bytes) shared.
fn map(fd: libc::c_int, writable: bool, path: &Path) -> Result<NonNull<GroupSegment>> {
    let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
    // SAFETY: a fresh shared mapping of an open descriptor; the result is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            GROUP_SIZE,
            prot,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io_error(path));
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io_error(path))
}

/// Joins (creating it when it does not exist) group `name` of `uid` in `dir`, for a member: the
/// file mapped read-write. Claiming a slot is [`GroupSegment::claim`].
pub fn open_or_create_group(dir: &Path, uid: u32, name: &str) -> Result<GroupMapping> {
    check_group_name(name)?;
    let path = group_path(dir, uid, name);
    let cpath = c_path(&path)?;
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `cpath` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(cpath.as_ptr(), flags, shm::SEGMENT_MODE as libc::c_uint) };
    if fd < 0 {
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
            // A member's own mapping is not guarded: the hook installs no signal handler.
            let mapping = open_mapped(dir, uid, name, false)?;
            if !mapping.writable {
                return Err(Error::ReadOnly { path });
            }
            return Ok(mapping);
        }
        return Err(io_error(&path));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let made = create_in(&fd, uid, name, &path);
    if made.is_err() {
        // SAFETY: removes the half-made file under the group's name, which this call created.
        unsafe { libc::unlink(cpath.as_ptr()) };
    }
    made.map(|ptr| GroupMapping {
        ptr,
        fd,
        path,
        writable: true,
        own: true,
        guard: None,
    })
}

/// Sizes, maps and publishes a group file this process just created.
fn create_in(fd: &OwnedFd, uid: u32, name: &str, path: &Path) -> Result<NonNull<GroupSegment>> {
    let raw = fd.as_raw_fd();
    // SAFETY: `raw` is open; the umask may have taken bits away and readers accept exactly 0600.
    if unsafe { libc::fchmod(raw, shm::SEGMENT_MODE as libc::mode_t) } != 0 {
        return Err(io_error(path));
    }
    shm::reserve_file_range(raw, 0, GROUP_SIZE).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let ptr = map(raw, true, path)?;
    // SAFETY: the mapping was just made, GROUP_SIZE bytes of atomics.
    let group = unsafe { ptr.as_ref() };
    let h = &group.header;
    h.layout.store(GROUP_LAYOUT, Ordering::Relaxed);
    h.uid.store(uid, Ordering::Relaxed);
    h.size.store(GROUP_SIZE as u64, Ordering::Relaxed);
    h.created_unix_ns.store(
        gpumemhook_segment::process::unix_now_ns(),
        Ordering::Relaxed,
    );
    gpumemhook_segment::text::write_text(&h.name, name);
    for device in &group.devices {
        device.limit.store(NO_LIMIT, Ordering::Relaxed);
    }
    h.tickets.store(0, Ordering::Relaxed);
    h.magic.store(GROUP_MAGIC, Ordering::Release);
    Ok(ptr)
}

/// Opens an existing group file that may have been planted or forged: [`crate::shm`]'s descriptor
/// checks, then its header read with `pread` (magic, layout, size: a creator that has not
/// published yet is waited for, briefly), and only then mapped, read-write where allowed.
pub fn open_group(dir: &Path, uid: u32, name: &str) -> Result<GroupMapping> {
    open_mapped(dir, uid, name, true)
}

/// [`open_group`], its mapping registered with the SIGBUS guard when `guarded` (a reader's).
fn open_mapped(dir: &Path, uid: u32, name: &str, guarded: bool) -> Result<GroupMapping> {
    check_group_name(name)?;
    let path = group_path(dir, uid, name);
    let (fd, writable, stat) = shm::open_trusted(&path, uid)?;
    let mut len = stat.st_size.max(0) as u64;
    let deadline = Instant::now() + READY_WAIT;
    loop {
        match check_header(fd.as_raw_fd(), &path, len) {
            // A creator between `open` and publishing: the file may still be empty (not yet
            // reserved) or its header zero; or the magic was read torn while being stored (a
            // `pread` copies bytes, not words): it is whole now. The length is read again each time.
            Err(Error::Truncated { .. }) if Instant::now() < deadline && header_word(&fd) == 0 => {
                std::thread::sleep(Duration::from_millis(5));
                len = file_len(&fd).unwrap_or(len);
            }
            Err(Error::WrongMagic { .. })
                if Instant::now() < deadline && matches!(header_word(&fd), 0 | GROUP_MAGIC) =>
            {
                std::thread::sleep(Duration::from_millis(5));
                len = file_len(&fd).unwrap_or(len);
            }
            Err(e) => return Err(e),
            Ok(()) => break,
        }
    }
    let ptr = map(fd.as_raw_fd(), writable, &path)?;
    let guard = guarded.then(|| sigbus::Guarded::new(ptr.as_ptr() as usize, GROUP_SIZE));
    Ok(GroupMapping {
        ptr,
        fd,
        path,
        writable,
        own: uid == gpumemhook_segment::process::effective_uid(),
        guard,
    })
}

/// The file's length now.
fn file_len(fd: &OwnedFd) -> Option<u64> {
    // SAFETY: `stat` is plain old data, filled in by fstat on an open descriptor.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the result is checked.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } == 0).then(|| stat.st_size.max(0) as u64)
}

/// The first word of the file, 0 while it is zero or not there yet (a creator between `open` and
/// publishing).
fn header_word(fd: &OwnedFd) -> u64 {
    let mut word = [0u8; 8];
    // SAFETY: reads 8 bytes into a live buffer from an open descriptor.
    let n = unsafe { libc::pread(fd.as_raw_fd(), word.as_mut_ptr().cast(), 8, 0) };
    if n == 8 {
        u64::from_ne_bytes(word)
    } else {
        0
    }
}

/// Reads the header with `pread` (nothing mapped, so no SIGBUS) and checks magic, layout and size.
fn check_header(fd: libc::c_int, path: &Path, len: u64) -> Result<()> {
    let mut bytes = [0u8; 24];
    // SAFETY: reads into a live buffer of that length from an open descriptor.
    let n = unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(Error::Truncated {
            path: path.to_path_buf(),
            len,
        });
    }
    let word = |o: usize| u64::from_ne_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
    if word(0) != GROUP_MAGIC {
        return Err(Error::WrongMagic {
            path: path.to_path_buf(),
        });
    }
    let layout = u32::from_ne_bytes(bytes[8..12].try_into().unwrap_or([0; 4]));
    if layout != GROUP_LAYOUT {
        return Err(Error::LayoutVersion {
            path: path.to_path_buf(),
            found: layout,
            expected: GROUP_LAYOUT,
        });
    }
    if word(16) != len || len != GROUP_SIZE as u64 {
        return Err(shm::refused(
            path,
            crate::error::Refusal::SizeMismatch {
                file: len,
                header: word(16),
            },
        ));
    }
    Ok(())
}

/// The lock request on slot `slot`'s byte.
fn slot_lock(kind: libc::c_int, slot: usize) -> libc::flock {
    // SAFETY: `flock` is plain old data; all-zero is valid (l_pid must be 0 for OFD locks).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = slot as libc::off_t;
    lock.l_len = 1;
    lock
}

/// Whether another open file description holds slot `slot`'s lock; `None` when it cannot be asked.
fn slot_locked(fd: libc::c_int, slot: usize) -> Option<bool> {
    let mut lock = slot_lock(libc::F_WRLCK, slot);
    // SAFETY: `fd` is open and `lock` a valid, writable flock.
    if unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut lock) } != 0 {
        return None;
    }
    Some(i32::from(lock.l_type) != libc::F_UNLCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["job", "a.b-c_1", &"x".repeat(GROUP_NAME_LEN)] {
            assert!(check_group_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(GROUP_NAME_LEN + 1)] {
            assert!(check_group_name(bad).is_err(), "{bad}");
        }
    }
}

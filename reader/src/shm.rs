//! Segment files: where they live, creating one (the interceptor), and opening one safely (readers).
//!
//! A segment is `<dir>/gpumemhook-<uid>-<pid>`, `<dir>` being `$GPUMEMHOOK_SHM_DIR` or `/dev/shm`,
//! for a process of the initial pid namespace (the node's), and `<dir>/gpumemhook-<uid>-<pid>-<ns>`
//! for a process of any other (a container's), `<ns>` being its pid namespace
//! ([`gpumemhook_segment::process::pid_namespace_of`]): two containers' processes with the same
//! pid never share a name, and a reader of an older release, which cannot read such a name, leaves
//! the file alone.
//!
//! Creating (the hook): `O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC`, mode 0600 (set explicitly,
//! whatever the umask), its space reserved with `posix_fallocate` (zeros written where the
//! filesystem cannot reserve), so a full filesystem fails `create` cleanly instead of raising SIGBUS
//! at some later first touch of a page. A second open file description of the file (not the one the
//! mapping holds: [`lock_description`]) holds an open-file-description read lock on the whole file
//! (`F_OFD_SETLK`, `F_RDLCK`), and is pinned to this process image ([`LockAnchor`]): the lock lives
//! exactly as long as the image, so `exec` and death drop it, while closing every descriptor
//! (a daemon's habit) or forking a child, with or without atfork handlers, does not touch it. That
//! is the liveness signal readers use, next to the pid and its start time ([`is_live`]).
//!
//! Opening (readers): segment directories are writable by every local user (`/dev/shm` is 1777),
//! so whatever sits at a segment's name may have been planted: a FIFO (opening it would block), a
//! symlink, a file of another user (forged figures, a target for writes, a file its owner can
//! shrink under our mapping). [`open_checked`] opens with `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC |
//! O_NOCTTY` (so neither a FIFO nor a lease can block it), then checks the open descriptor: a regular
//! file, owned by the expected user, mode 0600, as large as its header says, with our magic, layout
//! version and pid. The header is read with `pread`, so nothing is mapped before every check passed;
//! only then is it mapped, read-write when the descriptor allows. Anything else is refused with a
//! typed [`Refusal`] and never written.
//!
//! Shrinking after mapping: only the file's owner (the same user as the reader, or the watched
//! process's user for a root reader) can truncate it. In case it happens anyway, every reader
//! mapping is registered with a SIGBUS guard (`crate::sigbus`): a fault inside one of them replaces the
//! mapping with zeroed anonymous memory, the reader then sees no magic and reports the process
//! gone, instead of dying. Faults anywhere else go to the handler that was installed before.

use crate::error::{Error, Refusal, Result};
use crate::sigbus;
use gpumemhook_segment::layout::{Header, Segment, LAYOUT_MAJOR, MAGIC, SEGMENT_SIZE};
use gpumemhook_segment::process::{own_pid_namespace, INITIAL_PID_NAMESPACE};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

/// Environment variable naming the directory of segment files (default `/dev/shm`).
pub const SHM_DIR_ENV: &str = "GPUMEMHOOK_SHM_DIR";
/// Prefix of every segment file name.
pub const FILE_PREFIX: &str = "gpumemhook-";
/// The only mode a segment file may have.
pub const SEGMENT_MODE: u32 = 0o600;

/// The directory segment files live in.
pub fn segment_dir() -> PathBuf {
    std::env::var_os(SHM_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from)
}

/// The segment file of `pid` (a pid of this process's pid namespace) run by `uid` in `dir`.
pub fn segment_path(dir: &Path, uid: u32, pid: u32) -> PathBuf {
    segment_path_in(dir, uid, pid, own_pid_namespace())
}

/// The segment file of the process that sees itself as `pid` in pid namespace `namespace` (`None`
/// where unknown, named as in the initial one), run by `uid`, in `dir` (see the module docs).
pub fn segment_path_in(dir: &Path, uid: u32, pid: u32, namespace: Option<u64>) -> PathBuf {
    match namespace.filter(|&n| n != INITIAL_PID_NAMESPACE) {
        Some(namespace) => dir.join(format!("{FILE_PREFIX}{uid}-{pid}-{namespace}")),
        None => dir.join(format!("{FILE_PREFIX}{uid}-{pid}")),
    }
}

/// What a segment file's name says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentName {
    pub uid: u32,
    /// The pid in the process's own pid namespace.
    pub pid: u32,
    /// That namespace, `None` for the initial one (or a writer that did not know its own).
    pub namespace: Option<u64>,
}

impl SegmentName {
    /// Whether the name's pid is a pid of the reader's namespace, which it can then judge by.
    pub fn is_of_this_namespace(&self) -> bool {
        self.namespace.unwrap_or(INITIAL_PID_NAMESPACE)
            == own_pid_namespace().unwrap_or(INITIAL_PID_NAMESPACE)
    }
}

/// Reads a segment file's name (see the module docs).
pub fn parse_segment_name(name: &str) -> Option<SegmentName> {
    let mut parts = name.strip_prefix(FILE_PREFIX)?.split('-');
    let number = |s: Option<&str>| {
        let s = s.filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))?;
        s.parse::<u64>().ok()
    };
    let uid = u32::try_from(number(parts.next())?).ok()?;
    let pid = u32::try_from(number(parts.next())?).ok()?;
    let namespace = match parts.next() {
        None => None,
        Some(n) => Some(number(Some(n)).filter(|&n| n != INITIAL_PID_NAMESPACE)?),
    };
    parts.next().is_none().then_some(SegmentName {
        uid,
        pid,
        namespace,
    })
}

/// A mapped segment. Unmapped (and its descriptor closed) on drop unless leaked.
pub struct SegmentMapping {
    ptr: NonNull<Segment>,
    len: usize,
    path: Option<PathBuf>,
    writable: bool,
    /// A reader's descriptor of the file, open for the life of the mapping: it asks about the
    /// creator's liveness lock (which the creator holds on a pinned description, not here).
    fd: Option<OwnedFd>,
    /// The reader's SIGBUS guard registration (`None` for the creator's and private mappings).
    guard: Option<sigbus::Guarded>,
    /// The file's owner (the creating process's uid for a created one).
    owner: u32,
}

// SAFETY: the mapping is plain memory holding only atomics; it may be used from any thread.
unsafe impl Send for SegmentMapping {}
// SAFETY: as above, every access goes through atomics.
unsafe impl Sync for SegmentMapping {}

impl SegmentMapping {
    pub fn segment(&self) -> &Segment {
        // SAFETY: `ptr` points at a live mapping of at least `SEGMENT_SIZE` bytes (checked when it was
        // made), page-aligned, and `Segment` is made of atomics only, so any bit pattern is valid.
        unsafe { self.ptr.as_ref() }
    }

    /// The file behind the mapping; `None` for a private (in-process) segment.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The uid owning the file.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// True once the file shrank under this reader's mapping (the SIGBUS guard replaced it with
    /// zeroes): nothing it shows is the process's any more.
    pub fn was_truncated(&self) -> bool {
        self.guard.as_ref().is_some_and(sigbus::Guarded::tripped)
    }

    /// Whether some process holds the creator's liveness lock on the file; `None` when this mapping
    /// has no descriptor (in-process or private) or the question cannot be asked.
    pub fn lock_held(&self) -> Option<bool> {
        lock_held(self.fd.as_ref()?.as_raw_fd())
    }

    /// Keeps the mapping for the rest of the process (a creator's lock is pinned: [`LockAnchor`]).
    pub fn leak(self) -> &'static Segment {
        let ptr = self.ptr;
        std::mem::forget(self);
        // SAFETY: the mapping is never unmapped after this point.
        unsafe { ptr.as_ref() }
    }

    /// Wraps a segment that some other code keeps alive for the rest of the process (the hook's own
    /// segment, found in-process).
    ///
    /// # Safety
    /// `ptr` must point at a mapped, initialised segment that stays mapped for the process lifetime.
    pub unsafe fn from_static(ptr: NonNull<Segment>, path: Option<PathBuf>) -> SegmentMapping {
        SegmentMapping {
            ptr,
            len: 0,
            path,
            writable: true,
            fd: None,
            guard: None,
            owner: gpumemhook_segment::process::current_uid(),
        }
    }
}

impl Drop for SegmentMapping {
    fn drop(&mut self) {
        // Unregister first: the range must not be patched after it is given back.
        drop(self.guard.take());
        if self.len > 0 {
            // SAFETY: `ptr`/`len` describe a mapping made by `map_fd` and not yet unmapped.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

pub(crate) fn io_error(path: &Path) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::last_os_error(),
    }
}

pub(crate) fn refused(path: &Path, refusal: Refusal) -> Error {
    Error::Refused {
        path: path.to_path_buf(),
        refusal,
    }
}

pub(crate) fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"),
    })
}

/// Maps `len` bytes of `fd` shared, read-write or read-only.
fn map_fd(fd: libc::c_int, len: usize, writable: bool, path: &Path) -> Result<NonNull<Segment>> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh shared mapping of an open file descriptor; the result is checked.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
    if ptr == libc::MAP_FAILED {
        return Err(io_error(path));
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io_error(path))
}

/// A whole-file lock request of `kind` (`F_RDLCK`, `F_WRLCK`) for the `F_OFD_*` commands.
fn whole_file(kind: libc::c_int) -> libc::flock {
    // SAFETY: `flock` is plain old data; all-zero is a valid value, the fields that matter are set.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // l_start 0, l_len 0 (to the end, whatever the size), l_pid 0 (required for OFD locks).
    lock
}

/// Whether a lock conflicting with a whole-file write lock is held on the file of `fd` by another
/// open file description: the creator's liveness lock. `None` when the kernel cannot say.
fn lock_held(fd: libc::c_int) -> Option<bool> {
    let mut lock = whole_file(libc::F_WRLCK);
    // SAFETY: `fd` is an open descriptor and `lock` a valid, writable flock.
    if unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut lock) } != 0 {
        return None;
    }
    Some(i32::from(lock.l_type) != libc::F_UNLCK)
}

/// A second open file description of the file `fd` is open on (as `path`), read-write and
/// close-on-exec, for the liveness locks of a segment's or a group's writer: `/proc/self/fd/N`
/// opened again, or where `/proc` cannot, `path` opened again without following a link; either
/// only if it is the very file `fd` is (same device and inode).
///
/// Why not `fd`'s own: a mapping holds a reference to the description it was made from, and a
/// forked child inherits the mapping. An OFD lock lives as long as its description, so a lock on
/// the mapped description would outlive its process for as long as any forked child lives, and a
/// dead (or `exec`ed-away) process would look alive. The description made here is held only by its
/// descriptor, which a forked child closes and `exec` drops. `None` when neither way gives one
/// (the caller then locks `fd` itself).
pub fn lock_description(fd: libc::c_int, path: &Path) -> Option<OwnedFd> {
    let reopen = |name: &CString, extra: libc::c_int| {
        // SAFETY: a valid NUL-terminated path.
        let again = unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | extra) };
        // SAFETY: just opened (when not negative), owned by nothing else.
        (again >= 0).then(|| unsafe { OwnedFd::from_raw_fd(again) })
    };
    let file = dev_ino(fd).ok()?;
    let same = |again: &OwnedFd| dev_ino(again.as_raw_fd()).ok() == Some(file);
    // Our own descriptor's entry: a link the kernel resolves to the very file, whatever its name.
    let by_proc = CString::new(format!("/proc/self/fd/{fd}")).ok();
    if let Some(again) = by_proc.and_then(|p| reopen(&p, 0)).filter(same) {
        return Some(again);
    }
    reopen(&c_path(path).ok()?, libc::O_NOFOLLOW).filter(same)
}

/// The open file description that holds a writer's liveness lock, made to live exactly as long
/// as this process image, whatever the program does with its descriptors.
///
/// A descriptor would not do: a daemon's `closerange(3, ..)` closes it (and the process would
/// look dead while it runs), and a child made without the atfork handlers (a raw `clone`)
/// inherits it (and a dead writer would look alive while the child runs). So the description is
/// [`lock_description`]'s second one, locked, then [pinned](LockAnchor::pin): one page of the file
/// mapped `PROT_NONE` from it, marked `MADV_DONTFORK`, and the descriptor closed. A mapping holds
/// its description, and an OFD lock lives as long as its description: the lock now goes only when
/// the mapping does, at death or `exec`, and no child inherits the mapping.
pub struct LockAnchor {
    fd: OwnedFd,
}

impl LockAnchor {
    /// A description of the file `fd` is open on, for locks: a second one where it can be had,
    /// else `fd`'s own (a duplicate; then a forked child's copy of the main mapping holds it too).
    pub fn new(fd: libc::c_int, path: &Path) -> Option<LockAnchor> {
        let fd = match lock_description(fd, path) {
            Some(own) => own,
            // SAFETY: duplicates an open descriptor; the result is checked.
            None => match unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) } {
                n if n >= 0 => unsafe_owned(n),
                _ => return None,
            },
        };
        Some(LockAnchor { fd })
    }

    /// The descriptor (for a lock request, or a read of the file).
    pub fn raw(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    /// Takes the OFD lock `lock` without waiting; false when another description holds one
    /// that conflicts (or the kernel refuses).
    pub fn try_lock(&self, lock: &libc::flock) -> bool {
        // SAFETY: `fd` is open; `lock` is a valid flock.
        unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_OFD_SETLK, lock) == 0 }
    }

    /// Pins the description to this process image (see the type's docs) and closes the descriptor.
    /// Where the page cannot be mapped, the descriptor is handed back: the caller keeps it open,
    /// and the lock lives as long as it does.
    pub fn pin(self) -> std::result::Result<(), OwnedFd> {
        let raw = self.fd.as_raw_fd();
        // SAFETY: a new shared mapping of one page of an open descriptor, never accessed
        // (PROT_NONE); the result is checked.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return Err(self.fd);
        }
        // SAFETY: the page just mapped; MADV_DONTFORK only keeps it out of forked children.
        if unsafe { libc::madvise(page, PAGE, libc::MADV_DONTFORK) } != 0 {
            // SAFETY: unmaps the page just mapped, which nothing else knows of.
            unsafe { libc::munmap(page, PAGE) };
            return Err(self.fd);
        }
        Ok(())
    }
}

/// The pinned page's length: the smallest page of the machines we build for, as large as any
/// mapping may be made.
const PAGE: usize = 4096;

/// Owns a descriptor just returned by the kernel.
fn unsafe_owned(n: libc::c_int) -> OwnedFd {
    // SAFETY: callers pass a descriptor just opened or duplicated, owned by nothing else.
    unsafe { OwnedFd::from_raw_fd(n) }
}

/// Reserves bytes `offset .. offset + len` of `fd`'s file: `posix_fallocate`, or, where the
/// filesystem cannot reserve space, explicit zeros. An error (a full filesystem: ENOSPC) means the
/// space is not there. A file the process may not grow that far (`ulimit -f`) is EFBIG here, where
/// the kernel would end the program with SIGXFSZ.
/// Whether the process may grow a file to `size` bytes (`RLIMIT_FSIZE`).
pub fn within_file_size_limit(size: u64) -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given; on failure no limit is known.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) };
    rc != 0 || limit.rlim_cur == libc::RLIM_INFINITY || size <= limit.rlim_cur
}

pub fn reserve_file_range(fd: libc::c_int, offset: u64, len: usize) -> std::io::Result<()> {
    if !within_file_size_limit(offset.saturating_add(len as u64)) {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    }
    // SAFETY: `fd` is open for writing; posix_fallocate returns an error number, never sets errno.
    let rc = unsafe { libc::posix_fallocate(fd, offset as libc::off_t, len as libc::off_t) };
    match rc {
        0 => return Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL | libc::ENODEV => {}
        errno => return Err(std::io::Error::from_raw_os_error(errno)),
    }
    let zeros = [0u8; 4096];
    let start = offset;
    let mut offset = 0usize;
    while offset < len {
        let chunk = (len - offset).min(zeros.len());
        // SAFETY: writes `chunk` bytes from a live buffer at `offset` of an open descriptor.
        let n = unsafe {
            libc::pwrite(
                fd,
                zeros.as_ptr().cast(),
                chunk,
                (start + offset as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        if n == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        offset += n as usize;
    }
    Ok(())
}

/// Creates the segment file of this process, zero-filled with its space reserved, maps it
/// read-write, and keeps its descriptor open holding the liveness lock (see the module docs).
///
/// A file already there under our pid belongs to an earlier process with the same pid (or to the
/// image this process replaced with `exec`): it is removed and the creation retried once. A file
/// of another user there cannot be removed (sticky directory): then this fails, and the hook counts
/// privately.
pub fn create_segment(dir: &Path, uid: u32, pid: u32) -> Result<SegmentMapping> {
    let path = segment_path(dir, uid, pid);
    let cpath = c_path(&path)?;
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mut fd = -1;
    for _attempt in 0..2 {
        // SAFETY: `cpath` is a valid NUL-terminated path.
        fd = unsafe { libc::open(cpath.as_ptr(), flags, SEGMENT_MODE as libc::c_uint) };
        if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            break;
        }
        // SAFETY: as above; unlink removes a name (never follows a symlink).
        unsafe { libc::unlink(cpath.as_ptr()) };
    }
    if fd < 0 {
        return Err(io_error(&path));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    let made = (|| {
        // The umask may have taken bits away; readers accept exactly 0600.
        // SAFETY: `raw` is open.
        if unsafe { libc::fchmod(raw, SEGMENT_MODE as libc::mode_t) } != 0 {
            return Err(io_error(&path));
        }
        reserve_file_range(raw, 0, SEGMENT_SIZE).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let ptr = map_fd(raw, SEGMENT_SIZE, true, &path)?;
        // The lock goes on a description that only this process image holds (`LockAnchor`).
        let anchor = LockAnchor::new(raw, &path);
        let locked = anchor
            .as_ref()
            .is_some_and(|a| a.try_lock(&whole_file(libc::F_RDLCK)));
        let Some(anchor) = anchor.filter(|_| locked) else {
            // SAFETY: unmaps the mapping just made.
            unsafe { libc::munmap(ptr.as_ptr().cast(), SEGMENT_SIZE) };
            return Err(io_error(&path));
        };
        // A page that cannot be pinned leaves the lock on a descriptor kept open for good.
        if let Err(fd) = anchor.pin() {
            let _ = std::os::fd::IntoRawFd::into_raw_fd(fd);
        }
        Ok(ptr)
    })();
    match made {
        Ok(ptr) => Ok(SegmentMapping {
            ptr,
            len: SEGMENT_SIZE,
            path: Some(path),
            writable: true,
            fd: None,
            guard: None,
            owner: uid,
        }),
        Err(e) => {
            // SAFETY: removes the half-made file under our own name.
            unsafe { libc::unlink(cpath.as_ptr()) };
            Err(e)
        }
    }
}

/// A zeroed segment in this process's memory only, for when no file can be made.
pub fn private_segment() -> Result<SegmentMapping> {
    // SAFETY: an anonymous private mapping; zero-filled by the kernel; the result is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SEGMENT_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    let path = PathBuf::from("(private)");
    if ptr == libc::MAP_FAILED {
        return Err(io_error(&path));
    }
    Ok(SegmentMapping {
        ptr: NonNull::new(ptr.cast()).ok_or_else(|| io_error(&path))?,
        len: SEGMENT_SIZE,
        path: None,
        writable: true,
        fd: None,
        guard: None,
        owner: gpumemhook_segment::process::current_uid(),
    })
}

/// What a reader expects of a segment file before it reads it.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    /// The uid that must own the file.
    pub owner: u32,
    /// The pid the header must name (from the file name), if known.
    pub pid: Option<u32>,
}

/// Opens an existing segment with the default expectations: owned by this process's user.
pub fn open_segment_file(path: &Path) -> Result<SegmentMapping> {
    let pid = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_segment_name)
        .map(|name| name.pid);
    open_checked(
        path,
        Expect {
            owner: gpumemhook_segment::process::current_uid(),
            pid,
        },
    )
}

/// The kind of a file from its `st_mode`, for messages.
fn file_kind(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symlink",
        _ => "not a regular file",
    }
}

/// Opens a file that may have been planted (see the module docs) without blocking or following a
/// link, and checks the open descriptor: a regular file owned by `owner`, mode 0600. Gives the
/// descriptor, whether it is writable, and its `stat`. The one home of these checks, for process
/// segments and group segments (`crate::group`) alike.
pub(crate) fn open_trusted(path: &Path, owner: u32) -> Result<(OwnedFd, bool, libc::stat)> {
    let cpath = c_path(path)?;
    let base = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    let mut writable = true;
    // SAFETY: `cpath` is a valid path; these flags never create anything and never block.
    let mut fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | base) };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EACCES) {
        writable = false;
        // SAFETY: as above.
        fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY | base) };
    }
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ELOOP) => refused(path, Refusal::Symlink),
            Some(libc::EWOULDBLOCK) => refused(path, Refusal::WouldBlock),
            Some(libc::ENXIO) => refused(path, Refusal::NotRegular { kind: "a socket" }),
            _ => Error::Io {
                path: path.to_path_buf(),
                source: e,
            },
        });
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    // SAFETY: `stat` is plain old data, filled by fstat on the descriptor just opened.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `raw` is open and `stat` is writable.
    if unsafe { libc::fstat(raw, &mut stat) } != 0 {
        return Err(io_error(path));
    }
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refused(
            path,
            Refusal::NotRegular {
                kind: file_kind(stat.st_mode),
            },
        ));
    }
    if stat.st_uid != owner {
        return Err(refused(
            path,
            Refusal::ForeignOwner {
                owner: stat.st_uid,
                expected: owner,
            },
        ));
    }
    let mode = stat.st_mode & 0o7777;
    if mode != SEGMENT_MODE as libc::mode_t {
        return Err(refused(path, Refusal::Mode { mode: mode as u32 }));
    }
    Ok((fd, writable, stat))
}

/// Opens a segment file that may have been planted by someone else (see the module docs): checks
/// the open descriptor and the header (read with `pread`, nothing mapped yet), then maps it,
/// read-write where the descriptor allows, under the SIGBUS guard.
pub fn open_checked(path: &Path, expect: Expect) -> Result<SegmentMapping> {
    let (fd, writable, stat) = open_trusted(path, expect.owner)?;
    let raw = fd.as_raw_fd();
    let len = stat.st_size.max(0) as u64;
    let header = read_header(raw, path, len)?;
    if header.segment_size != len || len < SEGMENT_SIZE as u64 {
        return Err(refused(
            path,
            Refusal::SizeMismatch {
                file: len,
                header: header.segment_size,
            },
        ));
    }
    if let Some(named) = expect.pid {
        if header.pid != named {
            return Err(refused(
                path,
                Refusal::PidMismatch {
                    named,
                    header: header.pid,
                },
            ));
        }
    }
    let ptr = map_fd(raw, SEGMENT_SIZE, writable, path)?;
    let guard = sigbus::Guarded::new(ptr.as_ptr() as usize, SEGMENT_SIZE);
    Ok(SegmentMapping {
        ptr,
        len: SEGMENT_SIZE,
        path: Some(path.to_path_buf()),
        writable,
        fd: Some(fd),
        guard: Some(guard),
        owner: stat.st_uid,
    })
}

/// The header words a reader checks before mapping.
struct HeaderFacts {
    pid: u32,
    segment_size: u64,
}

/// Reads and checks the start of the header with `pread` (no mapping, so no SIGBUS).
fn read_header(fd: libc::c_int, path: &Path, len: u64) -> Result<HeaderFacts> {
    let mut bytes = [0u8; 32];
    if len < bytes.len() as u64 {
        return Err(Error::Truncated {
            path: path.to_path_buf(),
            len,
        });
    }
    // SAFETY: reads into a live buffer of that length from an open descriptor.
    let n = unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(Error::Truncated {
            path: path.to_path_buf(),
            len,
        });
    }
    let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap_or([0; 4]));
    let magic = u64::from_ne_bytes(bytes[0..8].try_into().unwrap_or([0; 8]));
    // Offsets of `Header`'s first fields (checked by a test against the struct).
    let (major, segment_size, pid) = (u32_at(8), u32_at(20), u32_at(24));
    if magic != MAGIC {
        return Err(Error::WrongMagic {
            path: path.to_path_buf(),
        });
    }
    if major != LAYOUT_MAJOR {
        return Err(Error::LayoutVersion {
            path: path.to_path_buf(),
            found: major,
            expected: LAYOUT_MAJOR,
        });
    }
    Ok(HeaderFacts {
        pid,
        segment_size: u64::from(segment_size),
    })
}

/// The liveness rule for a segment a reader opened: the pid runs and is the process that wrote
/// the segment (same start ticks), the file did not shrink under us, and some process still holds
/// the creator's lock (an `exec` away from the hook or a death drops it). Where the lock cannot be
/// asked about (no descriptor), the pid rule alone decides.
///
/// A segment of another pid namespace (as its header says, [`is_of_other_namespace`], or its name:
/// a writer of layout 4.0 recorded none) is judged by the lock alone: its
/// pid means another process here, or none. A lock is a property of the file, the same from every
/// namespace, so its absence proves the writer gone; where it cannot be asked about, the segment
/// counts as live (nothing is deleted that is not proved dead).
pub fn is_live(mapping: &SegmentMapping) -> bool {
    if mapping.was_truncated() {
        return false;
    }
    let h: &Header = &mapping.segment().header;
    let named_elsewhere = mapping
        .path()
        .and_then(|p| p.file_name()?.to_str().and_then(parse_segment_name))
        .is_some_and(|name| !name.is_of_this_namespace());
    if is_of_other_namespace(h) || named_elsewhere {
        return mapping.lock_held().unwrap_or(true);
    }
    let ticks = h.proc_start_ticks.load(Ordering::Relaxed);
    gpumemhook_segment::process::is_same_process_alive(
        h.pid.load(Ordering::Relaxed),
        (ticks != 0).then_some(ticks),
    ) && mapping.lock_held().unwrap_or(true)
}

/// Whether the header's pid is a pid of another pid namespace than this reader's (as its writer
/// recorded: a writer of layout 4.0 records none, and is taken to share the reader's).
pub fn is_of_other_namespace(header: &Header) -> bool {
    let recorded = header.pid_namespace.load(Ordering::Relaxed);
    recorded != 0 && own_pid_namespace() != Some(recorded)
}

/// Removes `path` if it is still the file `mapping` maps (same device and inode): never another
/// file that took its name meanwhile.
pub fn remove_if_same(path: &Path, mapping: &SegmentMapping) -> bool {
    let Some(fd) = mapping.fd.as_ref() else {
        return false;
    };
    let (Ok(open), Ok(named)) = (dev_ino(fd.as_raw_fd()), std::fs::symlink_metadata(path)) else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    open == (named.dev(), named.ino()) && std::fs::remove_file(path).is_ok()
}

/// `(st_dev, st_ino)` of an open descriptor.
pub(crate) fn dev_ino(fd: libc::c_int) -> std::io::Result<(u64, u64)> {
    // SAFETY: `stat` is plain old data filled by fstat.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `stat` writable.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((stat.st_dev, stat.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_offsets_match_what_read_header_reads() {
        assert_eq!(std::mem::offset_of!(Header, magic), 0);
        assert_eq!(std::mem::offset_of!(Header, layout_major), 8);
        assert_eq!(std::mem::offset_of!(Header, segment_size), 20);
        assert_eq!(std::mem::offset_of!(Header, pid), 24);
    }

    /// A fresh directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpumemhook-shm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A created, initialised segment of this process in `dir`.
    fn made(dir: &Path) -> SegmentMapping {
        let pid = std::process::id();
        let m = create_segment(dir, gpumemhook_segment::process::current_uid(), pid).unwrap();
        let ticks = gpumemhook_segment::process::start_ticks(pid).unwrap();
        m.segment().initialise(pid, ticks, 0, "test", 0);
        m
    }

    fn refusal(e: Error) -> Refusal {
        match e {
            Error::Refused { refusal, .. } => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_created_segments_lock_lives_with_the_process_image_not_a_descriptor() {
        let dir = scratch("lock");
        let creator = made(&dir);
        let path = creator.path().unwrap().to_path_buf();
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(meta.len(), SEGMENT_SIZE as u64);
        let reader = open_segment_file(&path).unwrap();
        assert!(reader.is_writable());
        assert_eq!(reader.lock_held(), Some(true));
        assert!(is_live(&reader));
        drop(creator);
        assert_eq!(
            reader.lock_held(),
            Some(true),
            "the lock is pinned to this image: no descriptor or mapping of the creator's holds it"
        );
        // A child that closes every descriptor it has still sees the lock held (by this image),
        // and holds none of it: this image's lock is not the child's.
        // SAFETY: fork in a test; the child only makes system calls and exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let held = reader.lock_held() == Some(true);
            // SAFETY: closes the child's own descriptors above the standard ones, then exits.
            unsafe {
                libc::close_range(3, u32::MAX, 0);
                libc::_exit(if held { 0 } else { 1 })
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(libc::WEXITSTATUS(status), 0);
        assert_eq!(reader.lock_held(), Some(true));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn planted_files_are_refused_without_blocking() {
        let dir = scratch("planted");
        let uid = gpumemhook_segment::process::current_uid();
        let fifo = segment_path(&dir, uid, 1);
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let started = std::time::Instant::now();
        assert_eq!(
            refusal(open_segment_file(&fifo).err().unwrap()),
            Refusal::NotRegular { kind: "a FIFO" }
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));

        let real = made(&dir);
        let link = segment_path(&dir, uid, 2);
        std::os::unix::fs::symlink(real.path().unwrap(), &link).unwrap();
        assert_eq!(
            refusal(open_segment_file(&link).err().unwrap()),
            Refusal::Symlink
        );

        use std::os::unix::fs::PermissionsExt;
        let loose = segment_path(&dir, uid, 3);
        std::fs::copy(real.path().unwrap(), &loose).unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            refusal(open_segment_file(&loose).err().unwrap()),
            Refusal::Mode { mode: 0o666 }
        );
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            refusal(open_segment_file(&loose).err().unwrap()),
            Refusal::PidMismatch {
                named: 3,
                header: std::process::id()
            }
        );
        let short = segment_path(&dir, uid, std::process::id() + 1);
        std::fs::write(&short, b"GPUMEMHK").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            open_segment_file(&short),
            Err(Error::Truncated { .. })
        ));
        if uid == 0 {
            let foreign = segment_path(&dir, 0, std::process::id());
            drop(real);
            let real = made(&dir);
            assert_eq!(real.path().unwrap(), foreign);
            let c = CString::new(foreign.as_os_str().as_bytes()).unwrap();
            // SAFETY: a valid path.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
            assert_eq!(
                refusal(open_segment_file(&foreign).err().unwrap()),
                Refusal::ForeignOwner {
                    owner: 65534,
                    expected: 0
                }
            );
        } else {
            eprintln!("skipping the foreign-owner case: it needs root to chown a file");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_shrunk_under_a_reader_reads_as_gone_not_sigbus() {
        let dir = scratch("shrunk");
        let creator = made(&dir);
        let path = creator.path().unwrap().to_path_buf();
        let reader = open_segment_file(&path).unwrap();
        assert!(is_live(&reader));
        // The creator's own mapping is not guarded: it is never touched again here.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let seg = reader.segment();
        assert_eq!(seg.header.magic.load(Ordering::SeqCst), 0);
        seg.devices[5].used.fetch_add(1, Ordering::SeqCst);
        assert!(reader.was_truncated());
        assert!(!is_live(&reader));
        drop(creator);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_segment_named_for_another_namespace_is_judged_by_its_lock_not_its_pid() {
        let dir = scratch("elsewhere");
        let uid = gpumemhook_segment::process::current_uid();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        // A writer of layout 4.0 records no namespace: only the name says where its pid means
        // something. Its lock is held (by this process image, the creator).
        let creator = create_segment(&dir, uid, pid).unwrap();
        creator.segment().initialise(pid, 1, 0, "old", 0);
        let here = creator.path().unwrap().to_path_buf();
        let elsewhere = segment_path_in(&dir, uid, pid, Some(12345));
        std::fs::rename(&here, &elsewhere).unwrap();
        let reader = open_segment_file(&elsewhere).unwrap();
        assert!(
            is_live(&reader),
            "a pid of another namespace proves nothing here"
        );
        std::fs::rename(&elsewhere, &here).unwrap();
        let reader = open_segment_file(&here).unwrap();
        assert!(!is_live(&reader), "a pid of this namespace that is gone");
        drop(creator);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_names_parse_only_when_exact() {
        let name = |uid, pid, namespace| {
            Some(SegmentName {
                uid,
                pid,
                namespace,
            })
        };
        assert_eq!(
            parse_segment_name("gpumemhook-1000-42"),
            name(1000, 42, None)
        );
        assert_eq!(
            parse_segment_name("gpumemhook-1000-42-4026532179"),
            name(1000, 42, Some(4026532179))
        );
        assert_eq!(parse_segment_name("gpumemhook-1000-42x"), None);
        assert_eq!(parse_segment_name("gpumemhook--42"), None);
        assert_eq!(parse_segment_name("gpumemhook-1000-+42"), None);
        assert_eq!(parse_segment_name("gpumemhook-1000-42-"), None);
        assert_eq!(parse_segment_name("gpumemhook-1000-42-7-8"), None);
        assert_eq!(parse_segment_name("gpumemhook-4294967296-42"), None);
        let initial = format!("gpumemhook-1000-42-{INITIAL_PID_NAMESPACE}");
        assert_eq!(parse_segment_name(&initial), None, "named without it");
        for namespace in [None, Some(4026532179)] {
            let path = segment_path_in(Path::new("/d"), 7, 9, namespace);
            let file = path.file_name().unwrap().to_str().unwrap();
            assert_eq!(parse_segment_name(file), name(7, 9, namespace));
        }
        assert_eq!(
            segment_path_in(Path::new("/d"), 7, 9, Some(INITIAL_PID_NAMESPACE)),
            Path::new("/d/gpumemhook-7-9")
        );
    }
}

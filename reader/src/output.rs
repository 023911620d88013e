//! Every file gpumemhook writes (the exit and out-of-memory reports, the timeline, the CLI's
//! `--report`, `--trace`, `--json` and `plot -o` files, the pytest plugin's files): `%p` and `%n`
//! expansion, and the one rule for what a path may name (`docs/output-files.md` says why).
//!
//! - A regular file, or a path that does not exist: written to a fresh temporary name beside it
//!   (`O_CREAT | O_EXCL | O_NOFOLLOW`) and renamed over it when complete, so a reader never sees
//!   half a file. A file that exists keeps its mode (and its owner and group where this user may
//!   set them), and one this user cannot write is refused ([`writable`], the up-front check's rule
//!   too); a new file is made `0666` less the umask, as a shell's `>` makes it.
//! - A character device, a FIFO or a Unix stream socket: opened (or connected to) without waiting
//!   and written through, never unlinked, renamed over or truncated into a file. A FIFO with no
//!   reader, a socket no process listens on and a socket whose listener's backlog is full are
//!   errors said at once, not hangs; a reader that stops reading delays the write by at most five
//!   seconds ([`Through`]).
//! - A symbolic link: followed only when this user or root owns it (`/dev/stdout`, a link of one's
//!   own); one that another user planted is replaced, as a regular file would be, never followed
//!   (in a sticky directory such as `/tmp` that rename is refused, and the write fails with a
//!   message). A followed link that reaches an open file of this process (`/dev/stdout`,
//!   `/dev/fd/N`, `/proc/self/fd/N`) writes to that open file, after what the program wrote
//!   there (what C stdio holds for `stdout` and `stderr` is flushed first); one that reaches a
//!   regular file replaces that file atomically and leaves the link.
//! - A directory or a block device is refused, and so is a name in `/dev` that names nothing
//!   (never a regular file among the devices); `/dev/stdin`, `/dev/stdout` and `/dev/stderr` are
//!   descriptors 0, 1 and 2 by name, even where a minimal `/dev` lacks their links.
//!
//! Writes never raise `SIGPIPE`: a closed pipe is an error returned to the caller.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The target of `pattern` for this process: `%p` becomes the pid.
pub fn expand_output(pattern: &Path) -> PathBuf {
    expand_output_numbered(pattern, None)
}

/// [`expand_output`], and `%n` becomes `number` when one is given (the out-of-memory reports'
/// count).
pub fn expand_output_numbered(pattern: &Path, number: Option<u64>) -> PathBuf {
    let text = pattern.as_os_str().as_bytes();
    let pid = std::process::id().to_string();
    let number = number.map(|n| n.to_string());
    let mut out = Vec::with_capacity(text.len() + 8);
    let mut i = 0;
    while i < text.len() {
        let digits = match (&text[i..], &number) {
            (t, _) if t.starts_with(b"%p") => Some(pid.as_bytes()),
            (t, Some(n)) if t.starts_with(b"%n") => Some(n.as_bytes()),
            _ => None,
        };
        match digits {
            Some(d) => {
                out.extend_from_slice(d);
                i += 2;
            }
            None => {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// How a path will be written, decided from what it names now.
#[derive(Debug, PartialEq, Eq)]
pub enum OutputTarget {
    /// A regular file or nothing (or a link another user planted): a temporary file renamed over
    /// this path.
    Replace(PathBuf),
    /// A character device or a FIFO, reached by this path (links followed): opened for writing.
    Device(PathBuf),
    /// A socket at this path: connected to.
    Socket(PathBuf),
    /// An open file of this process (`/dev/stdout`, `/proc/self/fd/N`): written through a copy of
    /// the descriptor.
    OpenFile(i32),
}

fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

/// The descriptor number when `path` names an open file of this process by its `/proc` or `/dev/fd`
/// name, or as `/dev/stdin`, `/dev/stdout` or `/dev/stderr` whatever the entry there is now: a
/// minimal `/dev` (a container's, a sandbox's) may lack those links, and a file made in their place
/// would take every later write meant for the program's own output.
fn own_descriptor(path: &Path) -> Option<i32> {
    let text = path.to_str()?;
    if let Some(fd) = ["/dev/stdin", "/dev/stdout", "/dev/stderr"]
        .iter()
        .position(|name| text == *name)
    {
        return Some(fd as i32);
    }
    let pid = std::process::id().to_string();
    let number = ["/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"]
        .iter()
        .find_map(|prefix| text.strip_prefix(prefix))
        .or_else(|| {
            text.strip_prefix("/proc/")?
                .strip_prefix(pid.as_str())?
                .strip_prefix("/fd/")
        })?;
    number
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| number.parse().ok())?
}

/// Decides how `path` is written (see the module's rule); an error for what is never written.
pub fn output_target(path: &Path) -> io::Result<OutputTarget> {
    // SAFETY: geteuid cannot fail and reads nothing but the process's credentials.
    let me = unsafe { libc::geteuid() };
    let mut at = path.to_path_buf();
    // The kernel's own limit on links followed in one lookup.
    for _ in 0..40 {
        if let Some(fd) = own_descriptor(&at) {
            return Ok(OutputTarget::OpenFile(fd));
        }
        let meta = match std::fs::symlink_metadata(&at) {
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && at.parent() == Some(Path::new("/dev")) =>
            {
                return Err(refused(format!(
                    "{} names nothing in /dev: gpumemhook never makes a file there (one in place \
                     of a device or of a link such as /dev/stdout would take every later write)",
                    at.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(OutputTarget::Replace(at)),
            other => other?,
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            if meta.uid() != me && meta.uid() != 0 {
                // Planted by another user: never followed (the rename replaces the link itself).
                return Ok(OutputTarget::Replace(at));
            }
            let link = std::fs::read_link(&at)?;
            at = match at.parent() {
                Some(dir) if link.is_relative() => dir.join(link),
                _ => link,
            };
            continue;
        }
        return if kind.is_file() {
            Ok(OutputTarget::Replace(at))
        } else if kind.is_char_device() || kind.is_fifo() {
            Ok(OutputTarget::Device(at))
        } else if kind.is_socket() {
            Ok(OutputTarget::Socket(at))
        } else if kind.is_dir() {
            Err(refused(format!(
                "{} is a directory; give a file name",
                at.display()
            )))
        } else {
            Err(refused(format!(
                "{} is a block device; gpumemhook never writes one",
                at.display()
            )))
        };
    }
    Err(refused(format!(
        "{}: too many levels of symbolic links",
        path.display()
    )))
}

/// [`output_target`], for a file that stays open and is written for as long as the program runs (the
/// flight recorder's timeline): an entry another user owns, at the path or where this user's own
/// links lead (a file, a FIFO, a socket or a link planted there, as anyone may in a sticky
/// directory such as `/tmp`), is refused, never written into, through or over. A live file left
/// hers would let her read every event and cut the file under the program; written through, her
/// FIFO would take the whole timeline. Devices (owned by root, or a terminal) are written as
/// [`output_target`] says.
pub fn live_target(path: &Path) -> io::Result<OutputTarget> {
    // SAFETY: geteuid cannot fail and reads nothing but the process's credentials.
    let me = unsafe { libc::geteuid() };
    let owner_refused = |at: &Path| -> io::Result<()> {
        match std::fs::symlink_metadata(at) {
            Ok(meta)
                if meta.uid() != me && meta.uid() != 0 && !meta.file_type().is_char_device() =>
            {
                Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} belongs to another user (uid {}): a live timeline is never written \
                         into, through or over another user's file, FIFO or link; name a path \
                         of your own",
                        at.display(),
                        meta.uid()
                    ),
                ))
            }
            _ => Ok(()),
        }
    };
    owner_refused(path)?;
    let target = output_target(path)?;
    if let OutputTarget::Replace(at) | OutputTarget::Device(at) | OutputTarget::Socket(at) = &target
    {
        owner_refused(at)?;
    }
    Ok(target)
}

/// Writes `path` through `fill`, with a buffered writer, by the module's rule; returns the error
/// to report.
pub fn write_file(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    match output_target(path)? {
        OutputTarget::Replace(at) => write_replacing(&at, fill),
        OutputTarget::Device(at) => {
            // O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of hanging the program at
            // its exit, and it stays on, so that a reader that stops reading can only delay the
            // exit by [`Through`]'s bound. O_NOFOLLOW and the fstat below: what is opened is still
            // the device or FIFO that `target` saw, not a link put in its place since.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(
                    libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                )
                .open(&at)
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ENXIO) => io::Error::new(
                        e.kind(),
                        format!("{} is a FIFO that no process reads", at.display()),
                    ),
                    _ => e,
                })?;
            let kind = file.metadata()?.file_type();
            if !(kind.is_char_device() || kind.is_fifo()) {
                return Err(refused(format!(
                    "{} changed while it was being opened",
                    at.display()
                )));
            }
            write_through(file, fill)
        }
        OutputTarget::Socket(at) => write_through(connect_without_waiting(&at)?, fill),
        OutputTarget::OpenFile(fd) => {
            // SAFETY: F_DUPFD_CLOEXEC only reads `fd`; a descriptor that is not open fails with
            // EBADF, checked below.
            let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if copy < 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{} names descriptor {fd}, which is not open: {e}",
                        path.display()
                    ),
                ));
            }
            // SAFETY: `copy` is a descriptor fcntl just made and nothing else owns.
            let copy = unsafe { OwnedFd::from_raw_fd(copy) };
            if is_segment(&copy) {
                return Err(refused(format!(
                    "{} names descriptor {fd}, a gpumemhook segment (the hook's own, most \
                     likely); a report would overwrite its counters",
                    path.display()
                )));
            }
            flush_c_stdio();
            write_through(copy, fill)
        }
    }
}

extern "C" {
    /// The C library's own streams (glibc and musl export them under these names).
    static stdout: *mut libc::FILE;
    static stderr: *mut libc::FILE;
}

/// Flushes what the program's C stdio holds for `stdout` and `stderr`, so that a report written
/// through a copy of descriptor 1 or 2 lands after the program's own text: the hook writes its
/// exit report from an `atexit` handler, and `exit` flushes stdio only after every handler ran.
/// Only these two streams: `fflush(NULL)` locks every stream, and would wait forever on one that
/// another thread holds while it blocks in a read (a thread in `fgets(stdin)`). A program that
/// uses no C stdio (the CLI, Python's own buffers) has nothing there to flush.
fn flush_c_stdio() {
    // SAFETY: `stdout` and `stderr` are the C library's streams, valid for the whole process (exit
    // closes them only after the atexit handlers ran); fflush locks each stream itself (recursively,
    // so a thread that holds it already does not wait on itself). Writes under SIGPIPE held back,
    // as every write to a descriptor whose far end is not gpumemhook's.
    without_sigpipe(|| unsafe {
        libc::fflush(stdout);
        libc::fflush(stderr);
    });
}

/// Connects to the Unix stream socket at `path` without waiting, and leaves the descriptor
/// non-blocking for [`Through`]: a socket that no process listens on and one whose listener's
/// backlog is full (its connections never accepted: a stuck collector) are errors at once, where a
/// blocking `connect` would wait in the kernel until the listener accepts, which may be never.
fn connect_without_waiting(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) address.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = path.as_os_str().as_bytes();
    // One byte is left for the NUL that ends the name.
    if name.len() >= address.sun_path.len() {
        return Err(refused(format!(
            "{} is a socket whose path is longer than a socket address takes ({} bytes)",
            path.display(),
            address.sun_path.len() - 1
        )));
    }
    for (to, &from) in address.sun_path.iter_mut().zip(name) {
        *to = from as libc::c_char;
    }
    // SAFETY: socket only makes a descriptor; a failure is checked below.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor socket just made and nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: a valid, NUL-terminated sockaddr_un and its size; connect only reads it.
    let rc = unsafe {
        libc::connect(
            socket.as_raw_fd(),
            (&address as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok(socket);
    }
    // A non-blocking connect never sleeps, so it is never interrupted (EINTR) either.
    let e = io::Error::last_os_error();
    let why = match e.raw_os_error() {
        // A Unix stream socket answers EAGAIN, never EINPROGRESS, when its listener's queue of
        // connections not yet accepted is full.
        Some(libc::EAGAIN) => {
            "a socket whose listener accepts no more connections (its backlog is full)".to_string()
        }
        Some(libc::ECONNREFUSED) => "a socket that no process listens on".to_string(),
        Some(libc::EPROTOTYPE) => {
            "a socket that takes no stream connections (a datagram socket?)".to_string()
        }
        _ => format!("a socket that cannot be connected to: {e}"),
    };
    Err(io::Error::new(
        e.kind(),
        format!("{} is {why}", path.display()),
    ))
}

/// Whether this user may write `path` (`access(W_OK)`: what the kernel would allow, root
/// included): the one rule for an existing file that a report would replace, used by
/// [`write_file`] and by [`crate::writable::check_writable`], the check before any work.
pub fn writable(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Whether `fd` is a file that begins with a segment's magic: the hook's own segment descriptor
/// (often 3), which `/dev/fd/3` names when the user forgot the `3>file` redirect.
fn is_segment(fd: &OwnedFd) -> bool {
    let mut head = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live local buffer; a pipe, a terminal or a descriptor
    // opened write-only fails, which is an answer too (not a segment).
    let n = unsafe { libc::pread(fd.as_raw_fd(), head.as_mut_ptr().cast(), head.len(), 0) };
    n == 8 && u64::from_le_bytes(head) == gpumemhook_segment::layout::MAGIC
}

/// A writer onto a descriptor that waits out `EAGAIN` (a FIFO, a socket, or a pipe the program made
/// non-blocking) while the far end keeps reading: it gives up after [`STALL_POLLS`] waits of 100 ms
/// in a row without progress, so a reader that stops reading delays the program's exit by at most
/// five seconds and never hangs it. It never raises `SIGPIPE`.
struct Through {
    fd: OwnedFd,
    /// Waits since the last byte written.
    stalled: u32,
}

/// How many 100 ms waits in a row without a byte written end a write through.
const STALL_POLLS: u32 = 50;

impl Write for Through {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let fd = self.fd.as_raw_fd();
        loop {
            // SAFETY: writes from a live slice to a descriptor this writer owns.
            let n = without_sigpipe(|| unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) });
            if n >= 0 {
                self.stalled = 0;
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if self.stalled < STALL_POLLS => {
                    self.stalled += 1;
                    let mut poll = libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd, waited on for at most 100 ms.
                    unsafe { libc::poll(&mut poll, 1, 100) };
                }
                io::ErrorKind::WouldBlock => return Err(io::Error::new(
                    e.kind(),
                    "the reader stopped reading (nothing taken for 5 s); the rest is not written",
                )),
                _ => return Err(e),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn write_through(
    fd: impl Into<OwnedFd>,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let mut out = io::BufWriter::with_capacity(
        1 << 16,
        Through {
            fd: fd.into(),
            stalled: 0,
        },
    );
    fill(&mut out)?;
    out.flush()
}

/// Runs `write` with `SIGPIPE` held back for this thread: a `SIGPIPE` the write raised (none was
/// pending before) is taken off the pending set before the mask is restored, so it never reaches
/// the program, and the write's `EPIPE` is the caller's to handle. Used for every write to a
/// descriptor gpumemhook does not own the far end of (stderr, pipes, sockets).
pub fn without_sigpipe<T>(write: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut pipe: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, filled by pthread_sigmask.
    let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, filled by sigpending.
    let mut pending: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset pointers; these calls only change this thread's signal mask and read the
    // pending set.
    let was_pending = unsafe {
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut saved);
        libc::sigpending(&mut pending);
        libc::sigismember(&pending, libc::SIGPIPE) == 1
    };
    let result = write();
    // SAFETY: as above; sigtimedwait with a zero timeout only takes a pending SIGPIPE.
    unsafe {
        if !was_pending {
            libc::sigpending(&mut pending);
            if libc::sigismember(&pending, libc::SIGPIPE) == 1 {
                let zero = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                libc::sigtimedwait(&pipe, std::ptr::null_mut(), &zero);
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
    }
    result
}

/// Writes `path` atomically: a temporary file beside it, renamed over it when complete. A file
/// already there keeps its mode, owner and group (see [`keep_permissions`]); one this user cannot
/// write is refused and left as it was.
fn write_replacing(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    create_replacing(path, |file| {
        let mut out = io::BufWriter::with_capacity(1 << 18, file);
        fill(&mut out)?;
        out.flush()
    })
    .map(drop)
}

/// Makes a file that replaces `path` by the module's rule: a temporary file in the same folder
/// (private until it has the old file's permissions), filled by `fill`, then renamed over `path`.
/// Returns the file, open for reading and writing.
pub fn create_replacing(
    path: &Path,
    fill: impl FnOnce(&File) -> io::Result<()>,
) -> io::Result<File> {
    create_renamed(path, false, fill)
}

/// [`create_replacing`] for a live file, which the flight recorder goes on writing through a
/// mapping after it took its name: the file stays this user's (a file of another user's at `path`
/// is refused, as [`live_target`] refuses it), and where `path` named nothing, the rename never
/// replaces what appeared there since (`RENAME_NOREPLACE`): a name planted in between is refused,
/// not taken over.
pub fn create_own(path: &Path, fill: impl FnOnce(&File) -> io::Result<()>) -> io::Result<File> {
    create_renamed(path, true, fill)
}

fn create_renamed(
    path: &Path,
    own: bool,
    fill: impl FnOnce(&File) -> io::Result<()>,
) -> io::Result<File> {
    let name = path
        .file_name()
        .ok_or_else(|| refused(format!("{} names no file", path.display())))?;
    let existing = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => Some(meta),
        _ => None,
    };
    if existing.is_some() && !writable(path) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} exists and this user may not write it; it is left as it was",
                path.display()
            ),
        ));
    }
    if own {
        live_target(path)?;
    }
    // A file that replaces another starts private and takes the old one's mode before a byte is
    // written (a reader that opened it in between would keep reading); a new one is made as a
    // shell's `>` makes it.
    let mode = if existing.is_some() { 0o600 } else { 0o666 };
    let (tmp, file) = temporary_beside(path, name, mode)?;
    let result = (|| {
        if let Some(meta) = &existing {
            keep_permissions(&file, meta)?;
        }
        fill(&file)?;
        if own && existing.is_none() {
            rename_no_replace(&tmp, path)
        } else {
            std::fs::rename(&tmp, path)
        }
    })();
    if let Err(e) = result {
        drop::<File>(file);
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(file)
}

/// A new file beside `path`, under a name no other user can guess (`.<name>.<16 random hex
/// digits>.tmp`: a name planted in advance can neither stop the write nor be written through),
/// made `O_CREAT | O_EXCL | O_NOFOLLOW` with `mode` (less the umask).
fn temporary_beside(path: &Path, name: &OsStr, mode: u32) -> io::Result<(PathBuf, File)> {
    let mut last = None;
    for _ in 0..8 {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{:016x}.tmp", unpredictable()));
        let tmp = path.with_file_name(tmp_name);
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(mode)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

/// 64 bits from the kernel's random source (`getrandom`, by system call: the hook loads on C
/// libraries older than its wrapper); where that fails, the clock, the pid, the thread and a
/// counter mixed (unpredictable enough for a name checked with `O_EXCL`).
fn unpredictable() -> u64 {
    let mut word = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into a live local; GRND_NONBLOCK never waits.
    let got = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            (&mut word as *mut u64).cast::<libc::c_void>(),
            8usize,
            libc::GRND_NONBLOCK,
        )
    };
    if got == 8 {
        return word;
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut x = gpumemhook_segment::clock_ns(libc::CLOCK_MONOTONIC)
        ^ u64::from(std::process::id()).rotate_left(32)
        ^ (&word as *const u64 as u64)
        ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, std::sync::atomic::Ordering::Relaxed);
    // splitmix64's finaliser: every input bit reaches every output bit.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Renames `from` to `to` unless `to` exists (`renameat2(RENAME_NOREPLACE)`; where the file system
/// or the kernel lacks it, a hard link, which never replaces either, then the old name removed).
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| refused(format!("{} holds a NUL byte", p.display())))
    };
    let (c_from, c_to) = (c(from)?, c(to)?);
    // SAFETY: two valid NUL-terminated paths, resolved against the working directory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            c_from.as_ptr(),
            libc::AT_FDCWD,
            c_to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    let e = io::Error::last_os_error();
    let appeared = |e: io::Error| match e.kind() {
        io::ErrorKind::AlreadyExists => io::Error::new(
            e.kind(),
            format!(
                "{} appeared while the file was being made; it is left as it was",
                to.display()
            ),
        ),
        _ => e,
    };
    match (rc, e.raw_os_error()) {
        (0, _) => Ok(()),
        (_, Some(libc::EINVAL | libc::ENOSYS)) => {
            std::fs::hard_link(from, to).map_err(appeared)?;
            std::fs::remove_file(from)
        }
        _ => Err(appeared(e)),
    }
}

/// Gives the temporary `file` the permissions of the file it will replace (`old`), before a byte
/// is written to it: the owner and group where they differ and this user may set them (root
/// writing another user's report, a directory whose files take its group), then the mode's
/// permission bits (never set-user-ID and the like, which a report has no use for). Where
/// the group cannot be kept, the group's bits are dropped, so that the replacement never lets a
/// group read what the old file kept from it.
fn keep_permissions(file: &File, old: &std::fs::Metadata) -> io::Result<()> {
    let fd = file.as_raw_fd();
    let new = file.metadata()?;
    let mut mode = old.mode() & 0o777;
    if new.uid() != old.uid() || new.gid() != old.gid() {
        // SAFETY: fchown on a descriptor this function borrows; a refusal is an answer, handled.
        let kept = unsafe { libc::fchown(fd, old.uid(), old.gid()) } == 0
            // SAFETY: as above, the group alone (-1 keeps the owner).
            || unsafe { libc::fchown(fd, u32::MAX, old.gid()) } == 0;
        if !kept {
            mode &= !0o070;
        }
    }
    // SAFETY: fchmod on a descriptor this function borrows; the result is checked.
    if unsafe { libc::fchmod(fd, mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_and_the_number_are_put_in_and_other_bytes_kept() {
        let pid = std::process::id();
        let pattern = Path::new(OsStr::from_bytes(b"/r/oom.\xff.%p.%n.json"));
        let want = format!("/r/oom.\u{fffd}.{pid}.7.json");
        assert_eq!(
            expand_output_numbered(pattern, Some(7)).to_string_lossy(),
            want.as_str()
        );
        assert_eq!(
            expand_output_numbered(pattern, Some(7))
                .as_os_str()
                .as_bytes()[7],
            0xff,
            "a byte that is not UTF-8 stays as it was"
        );
        // Without a number, `%n` stays as written (the exit report and the timeline).
        assert_eq!(
            expand_output(Path::new("a.%p.%n")),
            PathBuf::from(format!("a.{pid}.%n"))
        );
    }

    #[test]
    fn open_files_of_this_process_are_known_by_their_names() {
        let pid = std::process::id();
        assert_eq!(own_descriptor(Path::new("/proc/self/fd/1")), Some(1));
        assert_eq!(own_descriptor(Path::new("/dev/fd/12")), Some(12));
        assert_eq!(
            own_descriptor(Path::new(&format!("/proc/{pid}/fd/2"))),
            Some(2)
        );
        assert_eq!(own_descriptor(Path::new("/proc/1/fd/2")), None);
        assert_eq!(own_descriptor(Path::new("/proc/self/fd/1x")), None);
        assert_eq!(own_descriptor(Path::new("/proc/self/fd/")), None);
        assert_eq!(
            output_target(Path::new("/dev/stdout")).unwrap(),
            OutputTarget::OpenFile(1),
            "/dev/stdout is root's link to /proc/self/fd/1"
        );
        // By name, whatever the entry: a /dev without the links still means the descriptors.
        assert_eq!(own_descriptor(Path::new("/dev/stderr")), Some(2));
        assert_eq!(own_descriptor(Path::new("/dev/stdout")), Some(1));
        let e = output_target(Path::new("/dev/gpumemhook-no-such-entry")).unwrap_err();
        assert!(e.to_string().contains("names nothing in /dev"), "{e}");
    }

    #[test]
    fn directories_are_refused_and_new_paths_replaced() {
        let dir = std::env::temp_dir();
        let e = output_target(&dir).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let new = dir.join(format!("gmh-output-new-{}", std::process::id()));
        assert_eq!(
            output_target(&new).unwrap(),
            OutputTarget::Replace(new.clone())
        );
    }

    #[test]
    fn a_users_own_link_to_a_file_keeps_the_link() {
        let dir = std::env::temp_dir().join(format!("gmh-output-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("real.json"), b"old").unwrap();
        std::os::unix::fs::symlink("real.json", dir.join("link.json")).unwrap();
        write_file(&dir.join("link.json"), |out| out.write_all(b"new")).unwrap();
        assert!(std::fs::symlink_metadata(dir.join("link.json"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(dir.join("real.json")).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Typed errors of the reader crate. Each message says what happened and what to do about it.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum Error {
    /// No segment exists for the process: it was not started with the hook.
    NoSegment { pid: u32, path: PathBuf },
    /// This process has no hook loaded.
    NotLoaded,
    /// The process the segment belonged to has exited.
    ProcessGone { pid: u32 },
    /// The file is not a gpumemhook segment.
    WrongMagic { path: PathBuf },
    /// The segment was written by a gpumemhook whose layout this reader does not know.
    LayoutVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    /// The file is shorter than a segment.
    Truncated { path: PathBuf, len: u64 },
    /// The segment was opened read-only and the operation writes.
    ReadOnly { path: PathBuf },
    /// Every scope slot is in use.
    ScopesFull,
    /// The scope was closed (or its slot reused) since the handle was made.
    ScopeClosed,
    /// A device ordinal past what the segment counts.
    NoSuchDevice { device: u32 },
    /// Another live process held a scope (or every scope-change entry) for longer than a reader
    /// waits; try again.
    ScopeBusy,
    /// The file at a segment's name is not one this reader may trust; it was not read or written.
    Refused { path: PathBuf, refusal: Refusal },
    /// The process runs as another user, whose segment this reader may not open.
    OtherUser { pid: u32, uid: u32 },
    /// The segment is live and of a process of another pid namespace that this reader cannot see
    /// (a container's reader and the node's processes, or another container's): its `pid` is
    /// the one it sees itself by, in `namespace`. Left alone, never removed.
    OtherNamespace { pid: u32, namespace: u64 },
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The hook's in-process report could not be read (a hook of another release, say).
    Report { reason: String },
    /// A group name that is not 1 to 64 of `A-Z a-z 0-9 . _ -` (see `crate::group`).
    GroupName { name: String, max_len: usize },
    /// Every member slot of the group (`slots` of them) is held by a live process.
    GroupFull { path: PathBuf, slots: usize },
    /// This machine changes a 16-byte word only under a lock of this process's own (no
    /// `cmpxchg16b`), which other processes cannot see: a group's count would not be atomic.
    GroupNoWideAtomic { path: PathBuf },
    /// Every scope slot of the group is taken; `open` lists the open ones (id and label).
    GroupScopesFull {
        group: String,
        slots: usize,
        open: Vec<String>,
    },
    /// No scope of the group has this id: it was closed, or never opened.
    GroupScopeGone { group: String, id: u64 },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a file at a segment's name was refused (see `shm::open_checked`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A symbolic link.
    Symlink,
    /// A FIFO, device, directory or socket.
    NotRegular { kind: &'static str },
    /// Opening it would block (a lease held on it).
    WouldBlock,
    /// Owned by another user than the one whose process the name claims.
    ForeignOwner { owner: u32, expected: u32 },
    /// Another mode than 0600.
    Mode { mode: u32 },
    /// Its size differs from the size its header states (or is shorter than a segment).
    SizeMismatch { file: u64, header: u64 },
    /// Its header names another pid than its file name.
    PidMismatch { named: u32, header: u32 },
    /// Its name claims a user other than the one the process runs as.
    WrongUser { named: u32, runs_as: u32 },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Symlink => write!(f, "it is a symbolic link"),
            Refusal::NotRegular { kind } => write!(f, "it is {kind}, not a regular file"),
            Refusal::WouldBlock => write!(f, "opening it would block (a lease is held on it)"),
            Refusal::ForeignOwner { owner, expected } => write!(
                f,
                "it is owned by uid {owner}, not by uid {expected} whose process the name claims \
                 (another user may have planted it)"
            ),
            Refusal::Mode { mode } => write!(f, "its mode is {mode:04o}, not 0600"),
            Refusal::SizeMismatch { file, header } => write!(
                f,
                "it is {file} bytes but its header says {header} (this reader needs {})",
                gpumemhook_segment::layout::SEGMENT_SIZE
            ),
            Refusal::WrongUser { named, runs_as } => write!(
                f,
                "its name claims uid {named} but the process runs as uid {runs_as}"
            ),
            Refusal::PidMismatch { named, header } => {
                write!(
                    f,
                    "its name says pid {named} but its header says pid {header}"
                )
            }
        }
    }
}

/// What a user does to get a segment at all.
pub const HOW_TO_HOOK: &str = "start the program under the hook: `gpumemhook run -- CMD` or \
`LD_PRELOAD=/path/to/libgpumemhook.so CMD` (the Python package gives the path: \
`python -c 'import gpumemhook; print(gpumemhook.library_path())'`)";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoSegment { pid, path } => write!(
                f,
                "process {pid} has no gpumemhook segment ({} does not exist): {HOW_TO_HOOK}",
                path.display()
            ),
            Error::NotLoaded => write!(f, "gpumemhook is not loaded in this process: {HOW_TO_HOOK}"),
            Error::ProcessGone { pid } => write!(f, "process {pid} has exited"),
            Error::WrongMagic { path } => {
                write!(f, "{} is not a gpumemhook segment", path.display())
            }
            Error::LayoutVersion {
                path,
                found,
                expected,
            } => write!(
                f,
                "{} has segment layout version {found}, this reader reads version {expected}: \
                 use a reader from the same gpumemhook release as the hook",
                path.display()
            ),
            Error::Truncated { path, len } => write!(
                f,
                "{} is {len} bytes, shorter than a gpumemhook segment",
                path.display()
            ),
            Error::ReadOnly { path } => write!(
                f,
                "{} is open read-only; scopes and ceilings need write access (same user as the process)",
                path.display()
            ),
            Error::ScopesFull => write!(
                f,
                "all {} scope slots are open; close scopes you no longer need",
                gpumemhook_segment::layout::MAX_SCOPES
            ),
            Error::ScopeClosed => write!(f, "the scope was closed"),
            Error::NoSuchDevice { device } => write!(
                f,
                "device {device} is past the {} devices a segment counts",
                gpumemhook_segment::layout::MAX_DEVICES
            ),
            Error::ScopeBusy => write!(
                f,
                "another process kept the scope busy for longer than {:?}; try again",
                gpumemhook_segment::layout::CHANGE_WAIT
            ),
            Error::Refused { path, refusal } => {
                write!(f, "refusing to read {}: {refusal}", path.display())
            }
            Error::OtherUser { pid, uid } => write!(
                f,
                "process {pid} runs as uid {uid}, another user: only that user (or root) can read \
                 its gpumemhook segment"
            ),
            Error::OtherNamespace { pid, namespace } => write!(
                f,
                "a live process of another pid namespace (pid:[{namespace}], where it is pid \
                 {pid}) that this reader cannot see: read it from the node, or from its own \
                 container"
            ),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Report { reason } => write!(
                f,
                "cannot read the hook's report ({reason}): use a reader from the same gpumemhook \
                 release as the hook"
            ),
            Error::GroupName { .. }
            | Error::GroupFull { .. }
            | Error::GroupNoWideAtomic { .. }
            | Error::GroupScopesFull { .. }
            | Error::GroupScopeGone { .. } => self.fmt_group(f),
        }
    }
}

impl Error {
    /// The errors of groups ([`fmt::Display`] sends them here).
    fn fmt_group(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::GroupName { name, max_len } => write!(
                f,
                "group name {name:?} is not 1 to {max_len} characters of A-Z a-z 0-9 . _ -"
            ),
            Error::GroupFull { path, slots } => write!(
                f,
                "{}: all {slots} member slots are held by live processes",
                path.display()
            ),
            Error::GroupNoWideAtomic { path } => write!(
                f,
                "{}: this CPU has no lock-free 16-byte compare-and-swap, which a group's count \
                 shared between processes needs; counting this process alone",
                path.display()
            ),
            Error::GroupScopesFull { group, slots, open } => write!(
                f,
                "all {slots} scope slots of group {group} are taken; close one you no longer need \
                 (`gpumemhook group {group} scope close ID`); open now: {}",
                open.join(", ")
            ),
            Error::GroupScopeGone { group, id } => write!(
                f,
                "group {group} has no open scope {id} (closed, or never opened)"
            ),
            other => fmt::Debug::fmt(other, f),
        }
    }
}

/// No error here names a source: each one's message already says it (`Io`'s ends with the OS
/// error), and a chain printed whole (`{:#}`) would say it twice.
impl std::error::Error for Error {}

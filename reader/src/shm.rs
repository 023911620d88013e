//! Segment files: where they live, creating one (the interceptor), mapping one (readers).
//!
//! A segment is `<dir>/gpumemhook-<uid>-<pid>`, `<dir>` being `$GPUMEMHOOK_SHM_DIR` or `/dev/shm`.
//! It is created with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, so it is never opened through a
//! symlink and never readable by another user.

use crate::error::{Error, Result};
use crate::layout::{Segment, LAYOUT_MAJOR, MAGIC, SEGMENT_SIZE};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

/// Environment variable naming the directory of segment files (default `/dev/shm`).
pub const SHM_DIR_ENV: &str = "GPUMEMHOOK_SHM_DIR";
/// Prefix of every segment file name.
pub const FILE_PREFIX: &str = "gpumemhook-";

/// The directory segment files live in.
pub fn segment_dir() -> PathBuf {
    std::env::var_os(SHM_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from)
}

/// The segment file of `pid` run by `uid` in `dir`.
pub fn segment_path(dir: &Path, uid: u32, pid: u32) -> PathBuf {
    dir.join(format!("{FILE_PREFIX}{uid}-{pid}"))
}

/// Reads the pid out of a segment file name of `uid`.
pub fn pid_of_file_name(name: &str, uid: u32) -> Option<u32> {
    name.strip_prefix(FILE_PREFIX)?
        .strip_prefix(&format!("{uid}-"))?
        .parse()
        .ok()
}

/// A mapped segment. Unmapped on drop unless leaked.
pub struct Mapping {
    ptr: NonNull<Segment>,
    len: usize,
    path: Option<PathBuf>,
    writable: bool,
}

// SAFETY: the mapping is plain memory holding only atomics; it may be used from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above, every access goes through atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
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

    /// Keeps the mapping for the rest of the process.
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
    pub unsafe fn from_static(ptr: NonNull<Segment>, path: Option<PathBuf>) -> Mapping {
        Mapping {
            ptr,
            len: 0,
            path,
            writable: true,
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: `ptr`/`len` describe a mapping made by `map_fd` and not yet unmapped.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

fn io_error(path: &Path) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::last_os_error(),
    }
}

fn c_path(path: &Path) -> Result<CString> {
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

/// Creates the segment file of this process, zero-filled, and maps it read-write.
///
/// A file already there under our pid belongs to an earlier process with the same pid (or to the
/// image this process replaced with `exec`): it is removed and the creation retried once.
pub fn create(dir: &Path, uid: u32, pid: u32) -> Result<Mapping> {
    let path = segment_path(dir, uid, pid);
    let cpath = c_path(&path)?;
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mut fd = -1;
    for _attempt in 0..2 {
        // SAFETY: `cpath` is a valid NUL-terminated path.
        fd = unsafe { libc::open(cpath.as_ptr(), flags, 0o600 as libc::c_uint) };
        if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            break;
        }
        // SAFETY: as above; unlink removes a name (never follows a symlink).
        unsafe { libc::unlink(cpath.as_ptr()) };
    }
    if fd < 0 {
        return Err(io_error(&path));
    }
    // SAFETY: `fd` is the descriptor just opened.
    let sized = unsafe { libc::ftruncate(fd, SEGMENT_SIZE as libc::off_t) } == 0;
    let mapped = if sized {
        map_fd(fd, SEGMENT_SIZE, true, &path)
    } else {
        Err(io_error(&path))
    };
    // SAFETY: the mapping (if any) keeps its own reference to the file.
    unsafe { libc::close(fd) };
    match mapped {
        Ok(ptr) => Ok(Mapping {
            ptr,
            len: SEGMENT_SIZE,
            path: Some(path),
            writable: true,
        }),
        Err(e) => {
            // SAFETY: removes the half-made file under our own name.
            unsafe { libc::unlink(cpath.as_ptr()) };
            Err(e)
        }
    }
}

/// A zeroed segment in this process's memory only, for when no file can be made.
pub fn private() -> Result<Mapping> {
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
    Ok(Mapping {
        ptr: NonNull::new(ptr.cast()).ok_or_else(|| io_error(&path))?,
        len: SEGMENT_SIZE,
        path: None,
        writable: true,
    })
}

/// Opens and validates an existing segment: read-write where permitted, else read-only.
pub fn open(path: &Path) -> Result<Mapping> {
    let cpath = c_path(path)?;
    let mut writable = true;
    // SAFETY: `cpath` is a valid path; flags never create anything.
    let mut fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EACCES) {
        writable = false;
        // SAFETY: as above.
        fd = unsafe {
            libc::open(
                cpath.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
    }
    if fd < 0 {
        return Err(io_error(path));
    }
    // SAFETY: `stat` is plain old data, filled by fstat on the descriptor just opened.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `stat` is writable.
    let len = if unsafe { libc::fstat(fd, &mut stat) } == 0 {
        stat.st_size as u64
    } else {
        0
    };
    let mapped = if len >= SEGMENT_SIZE as u64 {
        map_fd(fd, SEGMENT_SIZE, writable, path)
    } else {
        Err(Error::Truncated {
            path: path.to_path_buf(),
            len,
        })
    };
    // SAFETY: the mapping keeps its own reference to the file.
    unsafe { libc::close(fd) };
    let mapping = Mapping {
        ptr: mapped?,
        len: SEGMENT_SIZE,
        path: Some(path.to_path_buf()),
        writable,
    };
    validate(mapping.segment(), path)?;
    Ok(mapping)
}

/// Checks the magic and the major layout version.
pub fn validate(segment: &Segment, path: &Path) -> Result<()> {
    if segment.header.magic.load(Ordering::Acquire) != MAGIC {
        return Err(Error::WrongMagic {
            path: path.to_path_buf(),
        });
    }
    let found = segment.header.layout_major.load(Ordering::Relaxed);
    if found != LAYOUT_MAJOR {
        return Err(Error::LayoutVersion {
            path: path.to_path_buf(),
            found,
            expected: LAYOUT_MAJOR,
        });
    }
    Ok(())
}

//! Files the hook writes (the reports, the timeline): `%p` and `%n` expansion and an atomic write.
//!
//! A file is written to a fresh temporary name beside its target (`O_CREAT | O_EXCL | O_NOFOLLOW`)
//! and renamed over the target when complete. A reader never sees half a file, and a symlink planted
//! at the target's name is replaced, never followed (in a sticky directory such as `/tmp` the rename
//! of another user's entry is refused instead, and the write fails with a message).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The target of `pattern` for this process: `%p` becomes the pid.
pub fn expand(pattern: &Path) -> PathBuf {
    expand_numbered(pattern, None)
}

/// [`expand`], and `%n` becomes `number` when one is given (the out-of-memory reports' count).
pub fn expand_numbered(pattern: &Path, number: Option<u64>) -> PathBuf {
    let text = pattern.as_os_str().as_encoded_bytes();
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
    // SAFETY: `out` is `pattern`'s bytes with ASCII digits substituted for ASCII "%p" and "%n", so
    // it is made of the encoded bytes of a valid OsStr split only at ASCII boundaries.
    PathBuf::from(unsafe { std::ffi::OsString::from_encoded_bytes_unchecked(out) })
}

/// Writes `path` atomically through `fill`, with a buffered writer; returns the error to report.
pub fn write_atomically(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    // A name no other process picks (pid), and another try if an earlier process of the same pid
    // left one behind.
    let (tmp, file) = (0..8)
        .map(|attempt| {
            let mut tmp_name = std::ffi::OsString::from(".");
            tmp_name.push(name);
            tmp_name.push(format!(".{}-{attempt}.tmp", std::process::id()));
            let tmp = path.with_file_name(tmp_name);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .mode(0o644)
                .open(&tmp)
                .map(|f| (tmp, f))
        })
        .find(|r| !matches!(r, Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists))
        .unwrap_or_else(|| {
            Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "temporary files of this pid are in the way",
            ))
        })?;
    let result = (|| {
        let mut out = std::io::BufWriter::with_capacity(1 << 18, file);
        fill(&mut out)?;
        out.flush()?;
        drop(out);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn the_pid_and_the_number_are_put_in_and_other_bytes_kept() {
        let pid = std::process::id();
        let pattern = Path::new(OsStr::from_bytes(b"/r/oom.\xff.%p.%n.json"));
        let want = format!("/r/oom.\u{fffd}.{pid}.7.json");
        assert_eq!(
            expand_numbered(pattern, Some(7)).to_string_lossy(),
            want.as_str()
        );
        assert_eq!(
            expand_numbered(pattern, Some(7)).as_os_str().as_bytes()[7],
            0xff,
            "a byte that is not UTF-8 stays as it was"
        );
        // Without a number, `%n` stays as written (the exit report and the timeline).
        assert_eq!(
            expand(Path::new("a.%p.%n")),
            PathBuf::from(format!("a.{pid}.%n"))
        );
    }
}

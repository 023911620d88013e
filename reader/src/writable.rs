//! The check, before any work, that a path gpumemhook will write later can be written: the one rule
//! `run --report`/`--trace`, `fit --json` and the pytest plugin's `--gpumem-json`/`--gpumem-save`
//! apply up front, so that a typo or a directory stops the command before the program or the tests
//! run, not after. What is written, and how, is [`crate::output`]'s rule; this asks it where the
//! path leads and then whether this user may write there.

use crate::output::{self, OutputTarget};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn unwritable(kind: io::ErrorKind, why: String) -> io::Error {
    io::Error::new(kind, why)
}

/// Refuses a path that cannot be written: a directory or a block device in its place (as
/// [`output::output_target`] decides), a missing or unwritable directory, an existing file or
/// device this user cannot write. `%p` in the name is filled in later, per process: only its directory is
/// checked then. The error's text says why, without the path's own name (the caller prefixes it).
pub fn check_writable(path: &Path) -> io::Result<()> {
    // A path without `%p` is checked where the rule of `output` will write it: through a link of
    // the user's own, at a device or a FIFO as it is.
    let resolved = if path.as_os_str().as_bytes().windows(2).any(|w| w == b"%p") {
        path.to_path_buf()
    } else {
        match output::output_target(path) {
            Err(e) => {
                return Err(unwritable(e.kind(), format!("cannot be written: {e}")));
            }
            Ok(OutputTarget::Replace(at)) => at,
            Ok(OutputTarget::Device(at)) => {
                return match output::writable(&at) {
                    true => Ok(()),
                    false => Err(unwritable(
                        io::ErrorKind::PermissionDenied,
                        format!("{} is not writable", at.display()),
                    )),
                };
            }
            Ok(OutputTarget::Socket(_) | OutputTarget::OpenFile(_)) => return Ok(()),
        }
    };
    let parent = match resolved.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(unwritable(
            io::ErrorKind::NotFound,
            format!(
                "cannot be written: the directory {} does not exist",
                parent.display()
            ),
        ));
    }
    if !output::writable(&parent) {
        return Err(unwritable(
            io::ErrorKind::PermissionDenied,
            format!(
                "cannot be written: the directory {} is not writable",
                parent.display()
            ),
        ));
    }
    if resolved.exists() && !output::writable(&resolved) {
        return Err(unwritable(
            io::ErrorKind::PermissionDenied,
            "exists and is not writable".to_string(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_missing_directories_and_block_devices_are_refused() {
        let e = check_writable(Path::new("/nonexistent/r.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent does not exist"), "{e}");
        let tmp = std::env::temp_dir();
        let e = check_writable(&tmp).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        assert!(check_writable(&tmp.join("gmh-new-%p.json")).is_ok());
        assert!(check_writable(Path::new("r.json")).is_ok());
        assert!(check_writable(Path::new("/dev/null")).is_ok());
    }
}

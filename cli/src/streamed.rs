//! `run --trace PATH`: the hook writes each process's timeline where the user asked, as events
//! come, so `report PATH` reads it while the program runs and a killed `run` leaves it whole to
//! its last event; afterwards `run` finds every file its processes wrote.
//!
//! A path with `%p` is the hook's own pattern. A path without it names the command's timeline,
//! and every other process of the job (a forked child, a worker a launcher starts) gets
//! `PATH.<pid>`, the hook's rule for a forked child (docs/timeline.md): `run` gives the hook
//! `PATH.%p`, so that no process's file replaces another's, points `PATH` at the command's file
//! while the program runs (a link), and gives that file the name `PATH` at the end. When the
//! command itself recorded nothing (a shell or launcher), the process with the highest peaks takes
//! `PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpumemhook_reader::{output_target, OutputTarget};
use gpumemhook_timeline::Recording;

use crate::launch::Written;

/// The timelines of a run written in place.
pub struct Streamed {
    /// What the hook is given (`GPUMEMHOOK_TRACE`): absolute, with `%p`.
    pub pattern: PathBuf,
    /// The path the user named, without `%p`: the main process's timeline takes it.
    main: Option<PathBuf>,
    /// The path as the user wrote it, to name the files in the summary as they would.
    given: PathBuf,
}

fn has_pid(path: &Path) -> bool {
    path.to_string_lossy().contains("%p")
}

impl Streamed {
    /// How `target` is written in place; `None` for a path the hook cannot write as events come
    /// (a device, a FIFO, a socket: `run` copies the main process's timeline there at the end).
    pub fn of(target: &Path) -> Option<Streamed> {
        let absolute = std::path::absolute(target).ok()?;
        if has_pid(&absolute) {
            return Some(Streamed {
                pattern: absolute,
                main: None,
                given: target.to_path_buf(),
            });
        }
        let main = match output_target(&absolute).ok()? {
            // A link `run` left at PATH (it was killed): replaced, not followed.
            OutputTarget::Replace(at) if pid_in_name(&pid_pattern(&absolute), &at).is_some() => {
                absolute.clone()
            }
            OutputTarget::Replace(at) => at,
            _ => return None,
        };
        Some(Streamed {
            pattern: PathBuf::from(pid_pattern(&main)),
            // A link of the user's was followed: the files are named where it leads.
            given: if main == absolute {
                target.to_path_buf()
            } else {
                main.clone()
            },
            main: Some(main),
        })
    }

    /// Once the command started as `pid`: `PATH` becomes a link to the file its timeline will
    /// have, so that `PATH` reads it from its first event on.
    pub fn link_main(&self, pid: u32) {
        let Some(main) = &self.main else { return };
        let mut target = main.file_name().unwrap_or_default().to_os_string();
        target.push(format!(".{pid}"));
        let mut temporary = OsString::from(".");
        temporary.push(main.file_name().unwrap_or_default());
        temporary.push(format!(".{}.link", std::process::id()));
        let temporary = main.with_file_name(temporary);
        let _ = std::fs::remove_file(&temporary);
        let linked = std::os::unix::fs::symlink(&target, &temporary)
            .and_then(|()| std::fs::rename(&temporary, main));
        if let Err(e) = linked {
            let _ = std::fs::remove_file(&temporary);
            sayln!(
                "gpumemhook: cannot link {} to the timeline as it is written ({e}); the file takes \
                 that name when the program ends",
                main.display()
            );
        }
    }

    /// Every timeline this run's processes wrote: the files the pattern names whose recording is
    /// of the pid in the name and started at or after `since_unix_ns` (not an earlier run's).
    pub fn written(&self, since_unix_ns: u64) -> Vec<Written> {
        let dir = self.pattern.parent().unwrap_or(Path::new("/"));
        let pattern = self
            .pattern
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        let mut found: Vec<Written> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let pid = pid_in_name(&pattern, &path)?;
                let recording = Recording::open(&path).ok()?;
                (recording.pid() == pid && recording.start_unix_ns() >= since_unix_ns)
                    .then_some(Written { pid, path })
            })
            .collect();
        found.sort_by_key(|w| w.pid);
        found
    }

    /// Gives the main process's timeline the user's path: the command's own (`child_pid`), else
    /// `main`'s (the process with the highest peaks). Returns the timelines with their paths now.
    pub fn settle(
        &self,
        mut traces: Vec<Written>,
        child_pid: u32,
        main: Option<u32>,
    ) -> Vec<Written> {
        let Some(path) = &self.main else {
            return traces;
        };
        let chosen = [Some(child_pid), main]
            .into_iter()
            .flatten()
            .find_map(|pid| traces.iter().position(|w| w.pid == pid));
        match chosen.map(|i| &mut traces[i]) {
            Some(w) => match std::fs::rename(&w.path, path) {
                Ok(()) => w.path = path.clone(),
                Err(e) => sayln!(
                    "gpumemhook: cannot name the timeline {} {}: {e}",
                    w.path.display(),
                    path.display()
                ),
            },
            // No process of the run recorded one: the link points nowhere.
            None => {
                if std::fs::read_link(path)
                    .is_ok_and(|to| pid_in_name(&pid_pattern(path), &to).is_some())
                {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        traces
    }

    /// The path of `w` as the user would write it (relative when they gave it so).
    pub fn shown(&self, w: &Written) -> PathBuf {
        match w.path.file_name() {
            Some(name) => self.given.with_file_name(name),
            None => w.path.clone(),
        }
    }
}

/// `PATH.%p`: the pattern of the other processes' timelines.
fn pid_pattern(path: &Path) -> String {
    format!("{}.%p", path.display())
}

/// The pid a file name has where `pattern` (a file name, or a path whose file name is compared)
/// has `%p`, when the name is the pattern's.
fn pid_in_name(pattern: &str, path: &Path) -> Option<u32> {
    let pattern = pattern.rsplit('/').next().unwrap_or(pattern);
    let name = path.file_name()?.to_str()?;
    let mut parts = pattern.split("%p");
    let mut rest = name.strip_prefix(parts.next()?)?;
    let mut pid = None;
    for part in parts {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let this: u32 = rest[..digits].parse().ok()?;
        if pid.is_some_and(|p| p != this) {
            return None;
        }
        pid = Some(this);
        rest = rest[digits..].strip_prefix(part)?;
    }
    rest.is_empty().then_some(pid?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_gives_its_pid_only_where_the_pattern_has_it() {
        let pid = |pattern: &str, name: &str| pid_in_name(pattern, Path::new(name));
        assert_eq!(pid("/d/t.trace.%p", "/d/t.trace.123"), Some(123));
        assert_eq!(pid("t.%p.trace", "t.77.trace"), Some(77));
        assert_eq!(pid("t.%p.%p", "t.5.5"), Some(5));
        assert_eq!(pid("t.%p.%p", "t.5.6"), None);
        assert_eq!(pid("t.trace.%p", "t.trace"), None);
        assert_eq!(pid("t.trace.%p", "t.trace.12x"), None);
        assert_eq!(pid("t.trace.%p", "t.trace.tmp"), None);
        assert_eq!(pid("t.trace", "t.trace"), None);
    }
}

//! Starting a program under the hook and reading back what it counted: the machinery `run` and
//! `fit` share. The hook library is found and checked ([`find_library`]), the program gets
//! `LD_PRELOAD`, a ceiling or a card, and `GPUMEMHOOK_REPORT` (with `%p`) pointing into a private
//! directory ([`TempDir`], [`hook_env`]); afterwards every process's exit report is read from there,
//! and the main process's segment when it died before writing one ([`read_snapshots`]).

use anyhow::{anyhow, Context, Result};
use gpumemhook_reader::cards::Emulation;
use gpumemhook_reader::env::{self, preload_value, HOOK_LIB_NAME as LIB_NAME};
use gpumemhook_reader::{output, process, shm, Process, Snapshot};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use crate::UsageError;

/// Where the hook library was looked for, for the error message when it is nowhere.
pub fn find_library(given: Option<&Path>) -> Result<PathBuf> {
    // An explicit choice is never second-guessed: a wrong path is an error, not a fallback.
    let explicit = given
        .map(|p| (p.to_path_buf(), "--lib".to_string()))
        .or_else(|| {
            std::env::var_os(env::LIB)
                .filter(|v| !v.is_empty())
                .map(|v| (PathBuf::from(v), format!("${}", env::LIB)))
        });
    if let Some((path, source)) = explicit {
        let why = if path.is_file() {
            match not_the_hook(&path) {
                None => return absolute(&path),
                Some(why) => why,
            }
        } else {
            "not a file".to_string()
        };
        return Err(anyhow!(
            "{source} names {}, which is not the gpumemhook library ({why}); build the hook with \
             `cargo build --release -p gpumemhook` (it is then target/release/{LIB_NAME})",
            path.display()
        ));
    }
    let mut tried = Vec::new();
    match std::env::current_exe() {
        Ok(exe) => {
            let beside = exe.with_file_name(LIB_NAME);
            if beside.is_file() {
                return Ok(beside);
            }
            tried.push(format!("{}: not there", beside.display()));
        }
        Err(e) => tried.push(format!(
            "beside this program: cannot tell where it is ({e})"
        )),
    }
    let probe = "import gpumemhook; print(gpumemhook.library_path())";
    match Command::new("python3")
        .args(["-c", probe])
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => {
            let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if path.is_file() {
                return absolute(&path);
            }
            tried.push(format!(
                "the Python package: it names {}, which is not a file",
                path.display()
            ));
        }
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or("").trim();
            tried.push(format!("the Python package (python3 -c '{probe}'): {last}"));
        }
        Err(e) => tried.push(format!("the Python package: cannot run python3 ({e})")),
    }
    Err(anyhow!(
        "cannot find {LIB_NAME}; tried:\n  --lib and ${lib_env}: not set\n  {}\n\
         Give its path with --lib PATH or {lib_env}=PATH, install the Python package \
         (`pip install gpumemhook`), or build it with `cargo build --release -p gpumemhook`",
        tried.join("\n  "),
        lib_env = env::LIB,
    ))
}

/// Why the file at `path` is not a gpumemhook preload library, or `None` when it is one: a shared
/// object (ELF, type `ET_DYN`) that exports `gpumemhook_segment_path`. Without this check the
/// dynamic linker would skip a wrong file with one warning and the program would run uncounted.
fn not_the_hook(path: &Path) -> Option<String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => return Some(format!("cannot read it: {e}")),
    };
    const ELF_MAGIC: &[u8] = b"\x7fELF";
    const ET_DYN: u16 = 3;
    if !bytes.starts_with(ELF_MAGIC) || bytes.len() < 18 {
        return Some("not an ELF shared library".to_string());
    }
    // e_type, at offset 16, in the file's byte order (EI_DATA at offset 5: 1 little, 2 big).
    let e_type = [bytes[16], bytes[17]];
    let e_type = if bytes[5] == 2 {
        u16::from_be_bytes(e_type)
    } else {
        u16::from_le_bytes(e_type)
    };
    if e_type != ET_DYN {
        return Some("an ELF file, but not a shared library".to_string());
    }
    let symbol = b"gpumemhook_segment_path";
    if !bytes.windows(symbol.len()).any(|w| w == symbol) {
        return Some("a shared library without gpumemhook's symbols".to_string());
    }
    None
}

/// Refuses, before the program starts, a report or timeline path that cannot be written: a missing
/// or unwritable directory, or a directory or read-only file in the path's place. (`%p` in the
/// name is filled in later, per process; only the directory can be checked then.)
pub fn check_writable(option: &str, target: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let writable = |p: &Path| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: `c` is a valid NUL-terminated path; access only reads it.
        unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
    };
    let fail = |why: String| -> Result<()> {
        Err(UsageError(format!("{option} {}: {why}", target.display())).into())
    };
    // A path without `%p` is checked where the rule of `output` will write it: through a link
    // of the user's own, at a device or a FIFO as it is.
    let resolved = if target.to_string_lossy().contains("%p") {
        target.to_path_buf()
    } else {
        match output::target(target) {
            Err(e) => return fail(format!("cannot be written: {e}")),
            Ok(output::Target::Replace(at)) => at,
            Ok(output::Target::Device(at)) => {
                return match writable(&at) {
                    true => Ok(()),
                    false => fail(format!("{} is not writable", at.display())),
                }
            }
            Ok(output::Target::Socket(_) | output::Target::OpenFile(_)) => return Ok(()),
        }
    };
    let parent = match resolved.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return fail(format!(
            "cannot be written: the directory {} does not exist",
            parent.display()
        ));
    }
    if !writable(&parent) {
        return fail(format!(
            "cannot be written: the directory {} is not writable",
            parent.display()
        ));
    }
    if resolved.exists() && !writable(&resolved) {
        return fail("exists and is not writable".to_string());
    }
    Ok(())
}

fn absolute(path: &Path) -> Result<PathBuf> {
    // The dynamic linker resolves a relative LD_PRELOAD entry against each program's working
    // directory, which the program may change: give it an absolute path.
    std::fs::canonicalize(path).with_context(|| format!("{}", path.display()))
}

/// A private directory (mode 0700), removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new directory `<within>/<prefix>-XXXXXX`.
    pub fn new(within: &Path, prefix: &str) -> Result<TempDir> {
        let template = within.join(format!("{prefix}-XXXXXX"));
        let mut bytes = template.into_os_string().into_encoded_bytes();
        bytes.push(0);
        // SAFETY: `bytes` is a writable NUL-terminated template that mkdtemp fills in place.
        let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(std::io::Error::last_os_error())
                .context("cannot create a temporary directory for the reports");
        }
        bytes.pop();
        // SAFETY: the bytes came from an OsString and mkdtemp only replaced X's with ASCII.
        let path = PathBuf::from(unsafe { OsString::from_encoded_bytes_unchecked(bytes) });
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        _ => "signal",
    }
}

/// The exit status `run` ends with for the child's, and how to say it.
pub fn describe(status: ExitStatus) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        (code, format!("exit status {code}"))
    } else if let Some(sig) = status.signal() {
        let core = if status.core_dumped() {
            ", core dumped"
        } else {
            ""
        };
        (
            128 + sig,
            format!("killed by signal {sig} ({}{core})", signal_name(sig)),
        )
    } else {
        (1, format!("{status}"))
    }
}

/// A file the hook wrote for one pid.
pub struct Written {
    pub pid: u32,
    pub path: PathBuf,
}

/// Files `<prefix>.<pid>.json` in `dir`, by pid.
pub fn written(dir: &Path, prefix: &str) -> Vec<Written> {
    let mut found: Vec<Written> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let path = e.ok()?.path();
                    let name = path.file_name()?.to_str()?;
                    let pid = name
                        .strip_prefix(prefix)?
                        .strip_prefix('.')?
                        .strip_suffix(".json")?
                        .parse()
                        .ok()?;
                    Some(Written { pid, path })
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|w| w.pid);
    found
}

/// Sets up `command` to run under the hook: `LD_PRELOAD` with `lib`, exit reports (`%p`: one per
/// process) into `dir`, and the ceiling or card asked for (when none is, the caller's own
/// `GPUMEMHOOK_LIMIT` or `GPUMEMHOOK_EMULATE` stays in force).
pub fn hook_env(
    command: &mut Command,
    lib: &Path,
    dir: &Path,
    limit: Option<u64>,
    emulate: Option<&Emulation>,
) {
    command.env(
        "LD_PRELOAD",
        preload_value(std::env::var_os("LD_PRELOAD").as_deref(), lib),
    );
    command.env(env::REPORT, dir.join("report.%p.json"));
    if let Some(bytes) = limit {
        // Bytes, with their unit: the hook parses exactly what was validated here.
        command.env(env::LIMIT, format!("{bytes}B"));
    }
    if let Some(e) = emulate {
        // The preset's name, or bytes: the hook reads exactly what was validated here.
        command.env(env::EMULATE, emulation_value(e));
    }
}

/// What `GPUMEMHOOK_EMULATE` is set to for `e`: the preset's name, or its size in bytes (`…B`).
pub fn emulation_value(e: &Emulation) -> String {
    e.card
        .map_or_else(|| format!("{}B", e.total), |c| c.name.to_string())
}

/// Every exit report the hook wrote into `dir`, each with `false`; and when the main process
/// (`child_pid`) wrote none (killed before its exit handlers ran: SIGKILL, a crash, the OOM
/// killer), its segment's last counters, with `true`, taken at `ended_ns` (the segment file is then
/// removed). An unreadable report is said on stderr and left out.
pub fn read_snapshots(dir: &Path, child_pid: u32, ended_ns: u64) -> Vec<(Snapshot, bool)> {
    let mut snapshots: Vec<(Snapshot, bool)> = written(dir, "report")
        .iter()
        .filter_map(|w| {
            let text = std::fs::read_to_string(&w.path).ok()?;
            match serde_json::from_str::<Snapshot>(&text) {
                Ok(s) => Some((s, false)),
                Err(e) => {
                    eprintln!(
                        "gpumemhook: the report of pid {} is unreadable ({e})",
                        w.pid
                    );
                    None
                }
            }
        })
        .collect();
    if !snapshots.iter().any(|(s, _)| s.pid == child_pid) {
        let path = shm::segment_path(&shm::segment_dir(), process::current_uid(), child_pid);
        if let Ok(p) = Process::open(&path) {
            let mut s = p.snapshot();
            if s.pid == child_pid && !s.devices.is_empty() {
                s.taken_unix_ns = ended_ns;
                snapshots.push((s, true));
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    snapshots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_shared_library_with_the_hooks_symbols_is_taken_for_the_hook() {
        let dir = std::env::temp_dir().join(format!("gmh-lib-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
        elf.resize(16, 0);
        let mut so = elf.clone();
        so.extend_from_slice(&[3, 0]);
        let mut exe = elf.clone();
        exe.extend_from_slice(&[2, 0]);
        let mut hook = so.clone();
        hook.extend_from_slice(b"...gpumemhook_segment_path...");
        let why = |p: PathBuf| not_the_hook(&p).unwrap_or_default();
        assert!(why(file("passwd", b"root:x:0:0")).contains("not an ELF"));
        assert!(why(file("exe", &exe)).contains("not a shared library"));
        assert!(why(file("other.so", &so)).contains("without gpumemhook's symbols"));
        assert_eq!(not_the_hook(&file("hook.so", &hook)), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unwritable_report_paths_are_refused_before_the_run() {
        let e = check_writable("--report", Path::new("/nonexistent/r.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent does not exist"), "{e}");
        let tmp = std::env::temp_dir();
        let e = check_writable("--trace", &tmp).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        assert!(check_writable("--report", &tmp.join("gmh-new-%p.json")).is_ok());
        assert!(check_writable("--report", Path::new("r.json")).is_ok());
    }

    #[test]
    fn statuses() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)).0, 3);
        let (code, how) = describe(ExitStatus::from_raw(libc::SIGKILL));
        assert_eq!(code, 137);
        assert!(how.contains("SIGKILL"), "{how}");
    }
}

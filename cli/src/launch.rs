//! Starting a program under the hook and reading back what it counted: the machinery `run` and
//! `fit` share. The hook library is found and checked ([`find_library`]), the program gets
//! `LD_PRELOAD`, a ceiling or a card, and `GPUMEMHOOK_REPORT` (with `%p`) pointing into a private
//! directory ([`TempDir`], [`hook_env`]); afterwards every process's exit report is read from there,
//! and the main process's segment when it died before writing one ([`read_snapshots`]). Both take
//! the signals sent to them on a thread of their own, to pass them on ([`Signals`]).

use anyhow::{anyhow, Context, Result};
use gpumemhook_reader::env::{self, preload_value, HOOK_LIB_NAME as LIB_NAME};
use gpumemhook_reader::Emulation;
use gpumemhook_reader::{current_uid, export_rows, segment_dir, segment_path, Export};
use gpumemhook_reader::{Process, Snapshot};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use crate::tail;
use crate::usage::UsageError;

/// How long a child's output is read past its end (a process it started may hold the pipe open).
const PIPE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The hook library `run` preloads: `given` (`--lib`), else `$GPUMEMHOOK_LIB`, else the one beside
/// this program, else the Python package's; the error says where it looked.
pub fn find_library(given: Option<&Path>) -> Result<PathBuf> {
    locate_library(given).map(|(path, _)| path)
}

/// [`find_library`], with where the library was found, for people: `--lib`, `$GPUMEMHOOK_LIB`,
/// `beside this program`, or the Python package of `python3`.
pub fn locate_library(given: Option<&Path>) -> Result<(PathBuf, String)> {
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
                None => return Ok((absolute(&path)?, source)),
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
                return Ok((beside, "beside this program".to_string()));
            }
            tried.push(format!("{}: not there", beside.display()));
        }
        Err(e) => tried.push(format!(
            "beside this program: cannot tell where it is ({e})"
        )),
    }
    let probe = "import gpumemhook; print(gpumemhook.library_path())";
    match python_probe(probe) {
        Ok((status, out, _)) if status.success() => {
            let path = PathBuf::from(out.last().map_or("", |l| l.trim()));
            if path.is_file() {
                let source = "the Python package of python3 on PATH".to_string();
                return Ok((absolute(&path)?, source));
            }
            tried.push(format!(
                "the Python package: it names {}, which is not a file",
                path.display()
            ));
        }
        Ok((_, _, err)) => {
            let last = err.last().map_or("", |l| l.trim());
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

/// Runs `python3 -c CODE` unhooked; its status and the last lines of its stdout and stderr.
fn python_probe(code: &str) -> std::io::Result<(ExitStatus, Vec<String>, Vec<String>)> {
    python_probe_with(Path::new("python3"), code)
}

/// Runs `PYTHON -c CODE` unhooked; its status and the last lines of its stdout and stderr.
pub fn python_probe_with(
    python: &Path,
    code: &str,
) -> std::io::Result<(ExitStatus, Vec<String>, Vec<String>)> {
    use std::process::Stdio;
    const LINES: usize = 5;
    let mut child = Command::new(python)
        .args(["-c", code])
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().map(|p| tail::Reader::start(p, LINES));
    let err = child.stderr.take().map(|p| tail::Reader::start(p, LINES));
    let status = child.wait()?;
    let lines = |r: Option<tail::Reader>| r.map_or_else(Vec::new, |r| r.finish(PIPE_WAIT));
    Ok((status, lines(out), lines(err)))
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
    let symbol = <export_rows::SegmentPath as Export>::NAME.to_bytes();
    if !bytes.windows(symbol.len()).any(|w| w == symbol) {
        return Some("a shared library without gpumemhook's symbols".to_string());
    }
    None
}

/// Refuses, before the program starts, a report or timeline path that cannot be written (the
/// reader's one rule, [`gpumemhook_reader::check_writable`]), as a usage error naming the option.
pub fn check_writable(option: &str, target: &Path) -> Result<()> {
    gpumemhook_reader::check_writable(target)
        .map_err(|why| UsageError(format!("{option} {}: {why}", target.display())).into())
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

/// Signals blocked in this process and taken, one at a time, by a thread of its own: how `run` and
/// `fit` pass on to their children the signals sent to them, instead of dying of them first. A
/// blocked mask is inherited by threads and across exec: block before any thread starts, and give
/// each child the mask back ([`Signals::unblock_in_child`]).
#[derive(Clone, Copy)]
pub struct Signals {
    set: libc::sigset_t,
}

impl Signals {
    /// Blocks `signals` in the calling thread, and so in every thread it starts from now on.
    pub fn block(signals: &[libc::c_int]) -> Signals {
        // SAFETY: sigset_t is plain data, initialised by sigemptyset before use; pthread_sigmask
        // only reads the set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in signals {
                libc::sigaddset(&mut set, *s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Signals { set }
        }
    }

    /// Gives the child the mask this process started with: the signals unblocked again.
    pub fn unblock_in_child(&self, command: &mut Command) {
        use std::os::unix::process::CommandExt;
        let set = self.set;
        // SAFETY: runs between fork and exec; pthread_sigmask is async-signal-safe and only reads
        // `set`.
        unsafe {
            command.pre_exec(move || {
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                Ok(())
            });
        }
    }

    /// Starts the thread that takes each signal as it comes and calls `handle` with it and whether
    /// the kernel generated it (a terminal's Ctrl-C or hangup, which went to the whole foreground
    /// process group) rather than a process (`kill PID`, a job scheduler).
    pub fn take(self, mut handle: impl FnMut(libc::c_int, bool) + Send + 'static) {
        std::thread::spawn(move || loop {
            // SAFETY: siginfo_t is plain data that sigwaitinfo fills.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `set` is a valid signal set and `info` a valid out-pointer.
            let sig = unsafe { libc::sigwaitinfo(&self.set, &mut info) };
            if sig < 0 {
                continue;
            }
            handle(sig, info.si_code > 0);
        });
    }
}

/// The name of signal `sig` (`SIGTERM`), or `signal` for one not named here.
pub fn signal_name(sig: i32) -> &'static str {
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
    let preload = preload_value(std::env::var_os("LD_PRELOAD").as_deref(), lib);
    for (name, value) in hook_variables(preload, limit, emulate) {
        command.env(name, value);
    }
    command.env(env::REPORT, dir.join("report.%p.json"));
}

/// The variables that put a program under the hook, whoever starts it (`run` and `fit` here, a
/// Jupyter kernel's spec for `kernel install`): `LD_PRELOAD` set to `preload` (see
/// [`preload_value`]), and the ceiling and card asked for, as validated values the hook parses
/// exactly.
pub fn hook_variables(
    preload: OsString,
    limit: Option<u64>,
    emulate: Option<&Emulation>,
) -> Vec<(&'static str, OsString)> {
    let mut variables = vec![("LD_PRELOAD", preload)];
    if let Some(bytes) = limit {
        // Bytes, with their unit: the hook parses exactly what was validated here.
        variables.push((env::LIMIT, format!("{bytes}B").into()));
    }
    if let Some(e) = emulate {
        // The preset's name, or bytes: the hook reads exactly what was validated here.
        variables.push((env::EMULATE, emulation_value(e).into()));
    }
    variables
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
                    sayln!(
                        "gpumemhook: the report of pid {} is unreadable ({e})",
                        w.pid
                    );
                    None
                }
            }
        })
        .collect();
    if !snapshots.iter().any(|(s, _)| s.pid == child_pid) {
        let path = segment_path(&segment_dir(), current_uid(), child_pid);
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

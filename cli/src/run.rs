//! `gpumemhook run -- CMD ...`: runs a program under the hook without the user knowing about
//! `LD_PRELOAD`, then summarises what every process of it that used the GPU held.
//!
//! The hook writes an exit report only for processes that touched CUDA, so `run` points
//! `GPUMEMHOOK_REPORT` (and `GPUMEMHOOK_TRACE`, when asked) into a private directory with `%p` in the
//! name: launchers, shells and workers each leave their own file there, none overwrites another, and
//! `run` finds them all afterwards without guessing pids.

use anyhow::{anyhow, Context, Result};
use gpumemhook_reader::env::{self, preload_value, HOOK_LIB_NAME as LIB_NAME};
use gpumemhook_reader::trace::read_chrome_trace;
use gpumemhook_reader::{cards, format_size, output, parse_size, process, shm, Process, Snapshot};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::style::{duration, Painter, Style};
use crate::summary::{self, Ending};
use crate::usage::UsageError;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook run -- python train.py
  gpumemhook run --limit 8GiB -- python train.py        # behave like an 8 GiB card
  gpumemhook run --emulate t4 -- python train.py        # a T4: its memory, context included
  gpumemhook run --report mem.json --trace mem.trace.json -- python train.py
  gpumemhook run --report 'mem.%p.json' -- torchrun --nproc-per-node 2 train.py

The summary goes to stderr, so the program's own output stays clean. The exit status is the
program's own, or 128+N when a signal N ended it.")]
pub struct RunArgs {
    /// Allocation ceiling for every device (8GiB, 8G, 8000MB, bytes): allocations past it fail
    /// with out-of-memory, as on a smaller card.
    #[arg(long, value_name = "SIZE")]
    pub limit: Option<String>,
    /// Make every device behave like this card (t4, l4, a100-40gb, rtx3090, ...: `gpumemhook
    /// cards` lists them) or a size: the card's total everywhere (CUDA and NVML), with the
    /// process's own context and kernels charged inside it.
    #[arg(long, value_name = "CARD")]
    pub emulate: Option<String>,
    /// Also write the exit report (JSON) here; `%p` becomes the pid, to keep one per process.
    /// Default: $GPUMEMHOOK_REPORT.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Record a timeline and write it here (Chrome trace JSON: open it in https://ui.perfetto.dev
    /// or with `gpumemhook plot`); `%p` becomes the pid. Default: $GPUMEMHOOK_TRACE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The hook library to preload. Default: $GPUMEMHOOK_LIB, then libgpumemhook.so beside this
    /// program, then the one of the installed Python package.
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// Print no summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// Where the hook library was looked for, for the error message when it is nowhere.
fn find_library(given: Option<&Path>) -> Result<PathBuf> {
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
fn check_writable(option: &str, target: &Path) -> Result<()> {
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
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let template = std::env::temp_dir().join("gpumemhook-run-XXXXXX");
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

/// Signals passed on to the child. SIGTSTP and SIGCONT are left alone so that job control stops
/// and continues `run` together with its child; SIGCHLD is how `run` learns that the child ended.
const FORWARDED: [libc::c_int; 8] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGALRM,
];

static CHILD_REAPED: AtomicBool = AtomicBool::new(false);

/// Blocks the forwarded signals in this (still single-threaded) process, so that they queue for
/// the forwarding thread instead of ending `run` before it can print the summary. A blocked mask is
/// inherited across exec, so the child unblocks them again ([`unblock_in_child`]).
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use; pthread_sigmask only
    // reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Gives the child the signal mask `run` itself started with: empty for the forwarded signals.
fn unblock_in_child(command: &mut Command, set: libc::sigset_t) {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs between fork and exec; pthread_sigmask is async-signal-safe and only reads `set`.
    unsafe {
        command.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
}

/// Passes each signal sent to `run` on to the child. A signal the kernel generated (Ctrl-C, Ctrl-\,
/// a window resize, a hangup) went to the whole foreground process group, the child included, so
/// passing it on would deliver it twice (a second KeyboardInterrupt in Python): only signals a
/// process sent to `run` itself (`kill PID`, a job scheduler) are forwarded.
fn forward_signals(set: libc::sigset_t, child: libc::pid_t) {
    std::thread::spawn(move || loop {
        // SAFETY: siginfo_t is plain data that sigwaitinfo fills.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid signal set and `info` a valid out-pointer.
        let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
        if sig < 0 {
            continue;
        }
        let from_kernel = info.si_code > 0;
        if !from_kernel && !CHILD_REAPED.load(Ordering::Acquire) {
            // SAFETY: plain kill(2) of our own child's pid.
            unsafe { libc::kill(child, sig) };
        }
    });
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

/// The exit status of `run` for the child's, and how to say it.
fn describe(status: ExitStatus) -> (i32, String) {
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
struct Written {
    pid: u32,
    path: PathBuf,
}

/// Files `<prefix>.<pid>.json` in `dir`, by pid.
fn written(dir: &Path, prefix: &str) -> Vec<Written> {
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

/// Copies the hook's files to where the user asked: each one when the path has `%p`, else the main
/// process's only.
fn deliver(files: &[Written], main: Option<u32>, target: &Path, what: &str) -> Vec<PathBuf> {
    let pattern = target.to_string_lossy();
    let chosen: Vec<&Written> = if pattern.contains("%p") {
        files.iter().collect()
    } else {
        files.iter().filter(|w| Some(w.pid) == main).collect()
    };
    let mut delivered = Vec::new();
    for w in chosen {
        let to = PathBuf::from(pattern.replace("%p", &w.pid.to_string()));
        let copied = std::fs::read(&w.path).and_then(|bytes| {
            gpumemhook_reader::output::write_file(&to, |out| out.write_all(&bytes))
        });
        match copied {
            Ok(_) => delivered.push(to),
            Err(e) => eprintln!(
                "gpumemhook: cannot write the {what} to {}: {e}",
                to.display()
            ),
        }
    }
    delivered
}

/// Runs the command; returns the exit status `gpumemhook` should end with.
pub fn run(args: RunArgs, painter: Painter) -> Result<i32> {
    let limit = match &args.limit {
        Some(text) => Some(parse_size(text).map_err(|e| UsageError(format!("--limit: {e}")))?),
        None => None,
    };
    let emulate = match &args.emulate {
        Some(text) => Some(cards::parse(text).map_err(|e| UsageError(format!("--emulate: {e}")))?),
        None => None,
    };
    let lib = find_library(args.lib.as_deref())?;
    let report_target = args.report.clone().or_else(|| {
        std::env::var_os(env::REPORT)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let trace_target = args.trace.clone().or_else(|| {
        std::env::var_os(env::TRACE)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    // As --limit: a file that cannot be written is refused now, not after the whole run.
    if let Some(target) = &report_target {
        let option = if args.report.is_some() {
            "--report".to_string()
        } else {
            format!("${}:", env::REPORT)
        };
        check_writable(&option, target)?;
    }
    if let Some(target) = &trace_target {
        let option = if args.trace.is_some() {
            "--trace".to_string()
        } else {
            format!("${}:", env::TRACE)
        };
        check_writable(&option, target)?;
    }
    let dir = TempDir::new()?;

    let program = &args.command[0];
    let mut command = Command::new(program);
    command.args(&args.command[1..]);
    command.env(
        "LD_PRELOAD",
        preload_value(std::env::var_os("LD_PRELOAD").as_deref(), &lib),
    );
    command.env(env::REPORT, dir.0.join("report.%p.json"));
    if trace_target.is_some() {
        command.env(env::TRACE, dir.0.join("trace.%p.json"));
    } else {
        command.env_remove(env::TRACE);
    }
    if let Some(bytes) = limit {
        // Plain bytes: the hook parses exactly what was validated here.
        command.env(env::LIMIT, bytes.to_string());
    }
    if let Some(e) = &emulate {
        // The preset's name, or plain bytes: the hook reads exactly what was validated here.
        let value = e
            .card
            .map_or_else(|| e.total.to_string(), |c| c.name.to_string());
        command.env("GPUMEMHOOK_EMULATE", value);
    }

    let set = block_signals();
    unblock_in_child(&mut command, set);
    let started = Instant::now();
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let name = program.to_string_lossy();
            let (code, why) = match e.kind() {
                std::io::ErrorKind::NotFound => (127, "command not found".to_string()),
                std::io::ErrorKind::PermissionDenied => (126, "permission denied".to_string()),
                _ => (126, e.to_string()),
            };
            eprintln!("gpumemhook: cannot run {name}: {why}");
            return Ok(code);
        }
    };
    let child_pid = child.id();
    forward_signals(set, child_pid as libc::pid_t);
    let status = child.wait().context("waiting for the command")?;
    CHILD_REAPED.store(true, Ordering::Release);
    let ended_ns = process::unix_now_ns();
    let elapsed = started.elapsed().as_secs_f64();
    let (code, how) = describe(status);

    let reports = written(&dir.0, "report");
    let mut snapshots: Vec<(Snapshot, bool)> = reports
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
    // A child killed before its exit handlers ran (SIGKILL, a crash, the OOM killer) wrote no
    // report, but its segment file is still there with the last counters: read them and remove it.
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
    let main = snapshots
        .iter()
        .find(|(s, _)| s.pid == child_pid)
        .or_else(|| {
            snapshots
                .iter()
                .max_by_key(|(s, _)| s.devices.iter().map(|d| d.peak).sum::<u64>())
        })
        .map(|(s, _)| s.pid);
    // The main process first, then the others by pid.
    snapshots.sort_by_key(|(s, _)| (Some(s.pid) != main, s.pid));

    let delivered_reports = match &report_target {
        Some(target) => deliver(&reports, main, target, "report"),
        None => Vec::new(),
    };
    let traces = written(&dir.0, "trace");
    let delivered_traces = match &trace_target {
        Some(target) => deliver(&traces, main, target, "timeline"),
        None => Vec::new(),
    };

    if !args.quiet {
        let mut out = String::new();
        let used_gpu = match snapshots.len() {
            0 => "no process used the GPU (no CUDA allocation went through the hook)".to_string(),
            1 => "1 process used the GPU".to_string(),
            n => format!("{n} processes used the GPU"),
        };
        out.push_str(&format!(
            "\n{} {how} after {}; {used_gpu}\n",
            painter.paint("gpumemhook:", Style::Heading),
            duration(elapsed)
        ));
        for (s, from_segment) in &snapshots {
            let ending = if s.pid == child_pid {
                Ending::Ran(how.clone())
            } else {
                Ending::Exited
            };
            out.push('\n');
            out.push_str(&summary::snapshot_summary(
                s,
                &ending,
                summary::Detail::Brief,
                painter,
            ));
            if *from_segment {
                out.push_str(&format!(
                    "  {}\n",
                    painter.paint(
                        "(read from its segment: the process ended before it could write a report)",
                        Style::Dim
                    )
                ));
            }
            // Every scope the main process opened, closed ones included, is in its timeline.
            if let Some(w) = traces.iter().find(|w| w.pid == s.pid) {
                match std::fs::read_to_string(&w.path)
                    .map_err(|e| e.to_string())
                    .and_then(|t| read_chrome_trace(&t).map_err(|e| e.to_string()))
                {
                    Ok(t) if !t.scopes.is_empty() => {
                        let (_, scopes) = crate::replay::replay(&t);
                        let start = crate::replay::time_span(&t).map_or(0.0, |s| s.0);
                        out.push_str(&format!(
                            "  {}\n",
                            painter.paint("scopes opened (from the timeline):", Style::Heading)
                        ));
                        out.push_str(&summary::scope_replay_table(&scopes, start, painter));
                    }
                    Ok(_) => {}
                    Err(e) => out.push_str(&format!(
                        "  the timeline of pid {} is unreadable: {e}\n",
                        s.pid
                    )),
                }
            }
        }
        if let Some(l) = limit {
            out.push_str(&format!("\nceiling: {} per device\n", format_size(l)));
        }
        if let Some(e) = &emulate {
            out.push_str(&format!(
                "\nemulated card: {} ({} per device)\n",
                e.label(),
                format_size(e.total)
            ));
            for (s, _) in &snapshots {
                for d in &s.devices {
                    if let Some(em) = &d.emulated {
                        out.push_str(&format!(
                            "  pid {} device {}: {} of context and modules charged inside it\n",
                            s.pid,
                            d.device,
                            format_size(em.overhead)
                        ));
                    }
                }
            }
        }
        for p in &delivered_reports {
            out.push_str(&format!("report: {}\n", p.display()));
        }
        for p in &delivered_traces {
            out.push_str(&format!(
                "timeline: {}  (open it in https://ui.perfetto.dev, or `gpumemhook plot {} -o memory.png`)\n",
                p.display(),
                p.display()
            ));
        }
        eprint!("{out}");
    }
    if trace_target.is_some() && traces.is_empty() && !snapshots.is_empty() {
        eprintln!(
            "gpumemhook: no timeline was written: this {LIB_NAME} ({}) may not record timelines yet",
            lib.display()
        );
    }
    Ok(code)
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

//! Helpers for the integration tests: build the simulated CUDA stack and the hook once, run real
//! programs under `LD_PRELOAD` through the real dynamic linker, and read back their exit reports.
//!
//! Every run gets a directory of its own for its segment files (`GPUMEMHOOK_SHM_DIR`) and reports,
//! so tests running in parallel never see each other's processes.

use gpumemhook_reader::Snapshot;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace root")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

fn run_checked(command: &mut Command, what: &str) {
    let status = command.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

/// The directory holding the simulated stack (`libcuda.so.1`, `libcudart.so.13`, `simrun`, ...),
/// built once per test run by `scripts/build/sim`.
/// `GPUMEMHOOK_TEST_SIM_DIR` names another directory (scripts/check/aarch64 builds an aarch64 stack
/// there, with `CC` a cross compiler).
pub fn sim_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("GPUMEMHOOK_TEST_SIM_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(|| target_dir().join("sim"), PathBuf::from);
        run_checked(
            Command::new(root().join("scripts/build/sim")).arg(&dir),
            "scripts/build/sim",
        );
        dir
    })
}

/// The hook library: `$GPUMEMHOOK_LIB`, or `target/release/libgpumemhook.so`, built if missing.
pub fn hook_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(p) = std::env::var_os("GPUMEMHOOK_LIB") {
            return PathBuf::from(p);
        }
        let lib = target_dir().join("release/libgpumemhook.so");
        run_checked(
            Command::new(env!("CARGO"))
                .args(["build", "--release", "--quiet", "-p", "gpumemhook"])
                .current_dir(root()),
            "cargo build --release -p gpumemhook",
        );
        lib
    })
}

/// The measurer [`measured`] puts in front of a command: it forks the command from its own
/// small image, kills it past the time limit (exit 137, as `timeout -s KILL`), writes the
/// command's peak resident memory (KiB, from `wait4`) into a file, and exits as it did.
const MEASURER: &str = r#"
import os, signal, sys, time
rss_file, limit = sys.argv[1], float(sys.argv[2])
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[3], sys.argv[3:])
deadline, killed = time.monotonic() + limit, False
while True:
    got, status, usage = os.wait4(pid, os.WNOHANG)
    if got:
        break
    if not killed and time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        killed = True
    time.sleep(0.002)
with open(rss_file, "w") as f:
    f.write(str(usage.ru_maxrss))
if killed:
    sys.exit(137)
if os.WIFSIGNALED(status):
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.WEXITSTATUS(status))
"#;

/// `command` (its program, arguments, environment and directory; set its output on the result)
/// killed after `limit_s`, its own peak resident memory written to `rss_file` (read it with
/// [`measured_rss`]). Measured from here, `wait4` would count the test binary's memory at the
/// spawn (a child's peak starts from the image it replaced at `exec`, every test of the binary
/// together): the command is forked by a small Python measurer instead ([`MEASURER`]).
pub fn measured(command: &Command, limit_s: u32, rss_file: &Path) -> Command {
    let prefix: Vec<std::ffi::OsString> = vec![
        "python3".into(),
        "-c".into(),
        MEASURER.into(),
        rss_file.as_os_str().to_owned(),
        limit_s.to_string().into(),
    ];
    wrapped(command, &prefix)
}

/// The peak resident memory (KiB) that a [`measured`] command's measurer wrote.
pub fn measured_rss(rss_file: &Path) -> i64 {
    std::fs::read_to_string(rss_file)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or_else(|| panic!("the measurer wrote no peak to {}", rss_file.display()))
}

/// The timeline the hook recorded at `path`, every allocation event kept.
pub fn timeline(path: &Path) -> gpumemhook_timeline::Timeline {
    gpumemhook_timeline::read_recording(path, gpumemhook_timeline::Keep::Everything)
        .unwrap_or_else(|e| panic!("the timeline {}: {e}", path.display()))
}

/// The `gpumemhook` command: `target/release/gpumemhook`, built (or brought up to date) once per
/// test run, like [`hook_lib`].
pub fn cli_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        run_checked(
            Command::new(env!("CARGO"))
                .args(["build", "--release", "--quiet", "-p", "gpumemhook-cli"])
                .current_dir(root()),
            "cargo build --release -p gpumemhook-cli",
        );
        target_dir().join("release/gpumemhook")
    })
}

/// The variables the hook records as job labels (the user's job and rank, rank, Ray and Slurm job,
/// pod): removed from every program a test runs, so that a CI job that itself runs under Slurm,
/// torchrun, Ray or Kubernetes (or with `GPUMEMHOOK_JOB` set) does not lend
/// its own labels to the tests' processes. Tests of job labels set them explicitly.
pub fn job_variables() -> impl Iterator<Item = &'static str> {
    gpumemhook_reader::JOB_VARIABLES
        .iter()
        .map(|(variable, _)| *variable)
}

/// `gpumemhook ARGS` in a clean environment: segments in `dir/shm` (so a test sees only its own
/// processes), the simulated CUDA stack on the library path, the hook named by `GPUMEMHOOK_LIB`,
/// and none of the hook's settings inherited from the caller.
pub fn cli(dir: &Path, args: &[&str]) -> Command {
    cli_at(cli_bin(), dir, args)
}

/// `gpumemhook ARGS` as [`cli`] runs it, which must succeed (its stderr said otherwise): its output.
pub fn cli_ok(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = cli(dir, args).output().expect("gpumemhook runs");
    assert!(
        out.status.success(),
        "gpumemhook {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// [`cli`] with another copy of the command (to test where it looks for its library).
pub fn cli_at(program: &Path, dir: &Path, args: &[&str]) -> Command {
    std::fs::create_dir_all(dir.join("shm")).expect("shm directory");
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .env_remove("LD_PRELOAD")
        .env_remove("GPUMEMHOOK_LIMIT")
        .env_remove("GPUMEMHOOK_EMULATE")
        .env_remove("GPUMEMHOOK_REPORT")
        .env_remove("GPUMEMHOOK_TRACE")
        .env_remove("NO_COLOR")
        .env("GPUMEMHOOK_SHM_DIR", dir.join("shm"))
        .env("GPUMEMHOOK_LIB", hook_lib())
        .env("LD_LIBRARY_PATH", sim_dir())
        .stdin(Stdio::null());
    for var in job_variables() {
        command.env_remove(var);
    }
    command
}

/// The real Python interpreter (not a version manager's shell shim, which would start a dozen
/// hooked shells of its own).
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 runs");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// Waits (up to 20 s, then fails the test) until `path` exists: how a test holds a program at a
/// point of its scenario (`touch:PATH` in `simrun`).
pub fn wait_for(path: &Path) {
    let start = std::time::Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The rows of the first table under the heading `## {section}` of `docs/{page}`, each as its
/// cells, trimmed, without the header row and its rule. Where a page is the one declaration of a
/// list (the hook's layers, the CLI's command modules), tests read the list from there.
pub fn doc_table(page: &str, section: &str) -> Vec<Vec<String>> {
    let path = root().join("docs").join(page);
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} is unreadable: {e}", path.display()));
    let heading = format!("## {section}\n");
    let body = doc
        .split(&heading)
        .nth(1)
        .unwrap_or_else(|| panic!("docs/{page} has no section `## {section}`"));
    let body = body.split("\n## ").next().unwrap_or(body);
    let rows: Vec<Vec<String>> = body
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            let cells: Vec<&str> = line.split('|').collect();
            // "| a | b |" splits into ["", " a ", " b ", ""].
            let inner = &cells[1..cells.len().saturating_sub(1)];
            inner.iter().map(|c| c.trim().to_string()).collect()
        })
        .collect();
    assert!(
        !rows.is_empty(),
        "docs/{page}: no table under `## {section}`"
    );
    rows
}

/// The names quoted in a table cell: "`a`, `b`" gives ["a", "b"].
pub fn quoted_names(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Every `.rs` file under `path` (a file or a folder), into `out`; build folders (`target`) and
/// hidden ones (`.git`) left out.
pub fn rust_files_under(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name != "target" && !name.to_string_lossy().starts_with('.') {
            rust_files_under(&entry.path(), out);
        }
    }
}

/// A fresh directory for one run.
pub fn scratch(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = target_dir()
        .join("test-scratch")
        .join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// What a run left behind.
#[derive(Debug)]
pub struct Ran {
    pub output: Output,
    pub dir: PathBuf,
}

impl Ran {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// Asserts the program exited 0, showing its output otherwise.
    pub fn ok(self) -> Ran {
        assert!(
            self.output.status.success(),
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.output.status,
            self.stdout(),
            self.stderr()
        );
        self
    }

    /// Every report written in this run's directory, by pid.
    pub fn reports(&self) -> BTreeMap<u32, Snapshot> {
        std::fs::read_dir(&self.dir)
            .expect("run directory")
            .filter_map(|e| {
                let path = e.ok()?.path();
                let name = path.file_name()?.to_str()?.to_string();
                name.starts_with("report.").then_some(path)
            })
            .map(|path| {
                let text = std::fs::read_to_string(&path).expect("report readable");
                let snapshot: Snapshot = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()));
                (snapshot.pid, snapshot)
            })
            .collect()
    }

    /// The one report of this run.
    pub fn report(&self) -> Snapshot {
        let mut reports = self.reports();
        assert_eq!(
            reports.len(),
            1,
            "expected one report, got {reports:#?}\nstderr:\n{}",
            self.stderr()
        );
        reports.pop_first().map(|(_, r)| r).expect("one report")
    }

    /// `key=value` fields of the first stdout line starting with `prefix`.
    pub fn line_fields(&self, prefix: &str) -> BTreeMap<String, String> {
        let out = self.stdout();
        let line = out
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{out}"));
        line.split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Segment files left in the run's segment directory.
    pub fn leftover_segments(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.join("shm"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// `command` run by `prefix` (a program and its first arguments): the same arguments,
/// environment and directory, stdin from `/dev/null`.
pub fn wrapped(command: &Command, prefix: &[std::ffi::OsString]) -> Command {
    let mut wrapped = Command::new(&prefix[0]);
    wrapped.args(&prefix[1..]);
    wrapped.arg(command.get_program());
    wrapped.args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped.stdin(Stdio::null());
    wrapped
}

/// A pod without `hostPID`, as far as pids go: a pid namespace of its own (the program is pid 1
/// there) with its own `/proc`, everything else shared with the node (files, the segment
/// directory, as the exporter's manifest shares `/run/gpumemhook`). Needs root.
pub const POD: [&str; 4] = ["unshare", "--pid", "--fork", "--mount-proc"];

/// Whether this machine can make [`POD`]s (root, and a kernel and `unshare` that allow it); when
/// not, tests of pods say so on stderr and check nothing.
pub fn pods_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let ok = Command::new(POD[0])
            .args(&POD[1..])
            .arg("true")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "skipping: `{}` does not run here (it needs root)",
                POD.join(" ")
            );
        }
        ok
    })
}

/// A program to run under the hook.
pub struct Run {
    command: Command,
    dir: PathBuf,
    before: Vec<PathBuf>,
    after: Vec<PathBuf>,
    hooked: bool,
    in_pod: bool,
}

impl Run {
    /// `simrun` (or another program of the simulated stack) with the given operations.
    pub fn sim(program: &str, ops: &[&str]) -> Run {
        let mut run = Run::program(sim_dir().join(program), program);
        run.command.args(ops);
        run
    }

    /// Any program, with a fresh run directory.
    pub fn program(program: impl AsRef<std::ffi::OsStr>, name: &str) -> Run {
        let dir = scratch(name.rsplit('/').next().unwrap_or(name));
        std::fs::create_dir_all(dir.join("shm")).expect("shm directory");
        let mut command = Command::new(program);
        command
            .env_remove("LD_PRELOAD")
            .env_remove("GPUMEMHOOK_LIMIT")
            .env_remove("GPUMEMHOOK_EMULATE")
            .env("GPUMEMHOOK_SHM_DIR", dir.join("shm"))
            .env("GPUMEMHOOK_REPORT", dir.join("report.%p.json"))
            .env("LD_LIBRARY_PATH", sim_dir())
            .stdin(Stdio::null());
        for var in job_variables() {
            command.env_remove(var);
        }
        Run {
            command,
            dir,
            before: Vec::new(),
            after: Vec::new(),
            hooked: true,
            in_pod: false,
        }
    }

    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Run {
        self.command.arg(arg);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Run {
        self.command.env(key, value);
        self
    }

    pub fn env_remove(mut self, key: &str) -> Run {
        self.command.env_remove(key);
        self
    }

    /// Preloads `lib` before the hook.
    pub fn preload_before(mut self, lib: impl Into<PathBuf>) -> Run {
        self.before.push(lib.into());
        self
    }

    /// Preloads `lib` after the hook.
    pub fn preload_after(mut self, lib: impl Into<PathBuf>) -> Run {
        self.after.push(lib.into());
        self
    }

    /// Runs without the hook (a baseline).
    pub fn unhooked(mut self) -> Run {
        self.hooked = false;
        self
    }

    /// Runs in a pid namespace of its own, as in a pod without `hostPID` ([`POD`]): the program is
    /// pid 1 there, its segment directory still the test's.
    pub fn in_pod(mut self) -> Run {
        self.in_pod = true;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The command with `LD_PRELOAD` set (before, hook, after), to spawn by hand.
    ///
    /// With `GPUMEMHOOK_TEST_RUNNER` set (scripts/check/aarch64: a user-mode emulator's wrapper),
    /// the program is started through that runner, and the preload list goes in
    /// `GPUMEMHOOK_TEST_PRELOAD` instead of `LD_PRELOAD`, which would otherwise apply to the runner
    /// itself; the runner hands it on to the emulated program as `LD_PRELOAD`.
    pub fn into_command(mut self) -> (Command, PathBuf) {
        let hook = self.hooked.then(|| hook_lib().to_path_buf());
        let libs: Vec<String> = self
            .before
            .iter()
            .chain(hook.iter())
            .chain(self.after.iter())
            .map(|p| p.display().to_string())
            .collect();
        let runner = std::env::var_os("GPUMEMHOOK_TEST_RUNNER").filter(|r| !r.is_empty());
        let preload_var = if runner.is_some() {
            "GPUMEMHOOK_TEST_PRELOAD"
        } else {
            "LD_PRELOAD"
        };
        if !libs.is_empty() && !self.in_pod {
            self.command.env(preload_var, libs.join(":"));
        }
        if let Some(runner) = runner {
            self.command = wrapped(&self.command, &[runner]);
        }
        if self.in_pod {
            // The preload list is the pod's program's only: `unshare`, like a container runtime,
            // runs without the hook.
            let mut prefix: Vec<std::ffi::OsString> = POD.map(Into::into).to_vec();
            prefix.push("env".into());
            if !libs.is_empty() {
                prefix.push(format!("{preload_var}={}", libs.join(":")).into());
            }
            self.command = wrapped(&self.command, &prefix);
        }
        (self.command, self.dir)
    }

    pub fn run(self) -> Ran {
        let (mut command, dir) = self.into_command();
        let output = command.output().expect("program runs");
        Ran { output, dir }
    }
}

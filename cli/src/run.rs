//! `gpumemhook run -- CMD ...`: runs a program under the hook without the user knowing about
//! `LD_PRELOAD`, then summarises what every process of it that used the GPU held.
//!
//! The hook writes an exit report only for processes that touched CUDA, so `run` points
//! `GPUMEMHOOK_REPORT` into a private directory with `%p` in the name: launchers, shells and workers
//! each leave their own file there, none overwrites another, and `run` finds them all afterwards
//! without guessing pids. Timelines are written where the user asked, as events come
//! (`crate::streamed`), or, for a path that is no regular file, in that directory too.

use anyhow::{Context, Result};
use gpumemhook_reader::env::{self, HOOK_LIB_NAME as LIB_NAME};
use gpumemhook_reader::Emulation;
use gpumemhook_reader::{format_size, parse_size, Snapshot};
use gpumemhook_reader::{parse_card, unix_now_ns};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::launch::{
    self, check_writable, describe, find_library, written, Signals, TempDir, Written,
};
use crate::streamed::Streamed;
use crate::style::{duration, Painter, Style};
use crate::summary::{self, Ending};
use crate::usage::UsageError;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook run -- python train.py
  gpumemhook run --limit 8GiB -- python train.py        # behave like an 8 GiB card
  gpumemhook run --emulate t4 -- python train.py        # a T4: its memory, context included
  gpumemhook run --stacks python:1MiB -- python train.py  # and which lines of Python asked
  gpumemhook run --report mem.json --trace mem.trace -- python train.py
  gpumemhook run --report 'mem.%p.json' -- torchrun --nproc-per-node 2 train.py

The summary goes to stderr, so the program's own output stays clean. The exit status is the
program's own, or 128+N when a signal N ended it.")]
pub struct RunArgs {
    /// Allocation ceiling for every device, with its unit (8GiB, 8G, 8000MB, 4096B): allocations
    /// past it fail with out-of-memory, as on a smaller card.
    #[arg(long, value_name = "SIZE")]
    pub limit: Option<String>,
    /// Make every device behave like this card (t4, l4, a100-40gb, rtx3090, ...: `gpumemhook
    /// cards` lists them) or a size: the card's total everywhere (CUDA and NVML), with the
    /// process's own context and kernels charged inside it.
    #[arg(long, value_name = "CARD")]
    pub emulate: Option<String>,
    /// Put the program's processes in this group (GPUMEMHOOK_GROUP): with every other process of
    /// the group they share one count, one peak, one ceiling (--group-limit) and, under
    /// --emulate, one card (docs/groups.md; `gpumemhook group NAME` reads it).
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// The group's ceiling for every device (GPUMEMHOOK_GROUP_LIMIT): what all its processes may
    /// hold together.
    #[arg(long, value_name = "SIZE", requires = "group")]
    pub group_limit: Option<String>,
    /// Record the Python call site of every device allocation of at least BYTES (`python`: every
    /// one; `python:1MiB:depth=5` keeps 5 frames), for `ls`/`top`/`report --by-site`. Sets
    /// GPUMEMHOOK_STACKS for the program.
    #[arg(long, value_name = "python[:BYTES]")]
    pub stacks: Option<String>,
    /// Also write the exit report (JSON) here; `%p` becomes the pid, to keep one per process.
    /// Default: $GPUMEMHOOK_REPORT.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Record a timeline into this file as events come (`gpumemhook report FILE` reads it
    /// mid-run; `export` converts it for Perfetto); `%p` becomes the pid. Every other process of
    /// the job that records one writes FILE.<pid> beside it. Default: $GPUMEMHOOK_TRACE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Record a timeline and write its page here: one self-contained HTML file (`gpumemhook view`).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
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
        let copied = std::fs::File::open(&w.path).and_then(|mut file| {
            gpumemhook_reader::write_file(&to, |out| std::io::copy(&mut file, out).map(drop))
        });
        match copied {
            Ok(_) => delivered.push(to),
            Err(e) => sayln!(
                "gpumemhook: cannot write the {what} to {}: {e}",
                to.display()
            ),
        }
    }
    delivered
}

/// `run`'s checked plan: every option and inherited setting parsed and every file to be written
/// checked, before the program starts.
struct RunPlan {
    command: Vec<OsString>,
    lib: PathBuf,
    limit: Option<u64>,
    emulate: Option<Emulation>,
    stacks: Option<String>,
    /// `--group` and `--group-limit`: the group's name and ceiling.
    group: Option<(String, Option<u64>)>,
    report_target: Option<PathBuf>,
    trace_target: Option<PathBuf>,
    /// `trace_target` written in place by the hook (a regular file or none yet).
    streamed: Option<Streamed>,
    /// `--html`: the page of the main process's timeline, or of every process that recorded one.
    html: Option<PathBuf>,
    quiet: bool,
}

/// What a run came to: how the program ended, and what its processes left.
struct RunOutcome {
    /// The exit status `gpumemhook` ends with, and how the program ended, in words.
    code: i32,
    how: String,
    elapsed: f64,
    child_pid: u32,
    /// The main process: the command's own, else the one with the highest peaks.
    main: Option<u32>,
    /// Every process that used the GPU (the main one first), and whether it was read from its
    /// segment (it ended before it could write a report).
    snapshots: Vec<(Snapshot, bool)>,
    traces: Vec<Written>,
    delivered_reports: Vec<PathBuf>,
    delivered_traces: Vec<PathBuf>,
    /// The private directory the hook wrote into (its timelines too, unless they were written in
    /// place): read from while presenting, and removed when the outcome is dropped.
    _dir: TempDir,
}

/// Runs the command; returns the exit status `gpumemhook` should end with.
pub fn run(args: RunArgs, painter: Painter) -> Result<i32> {
    let plan = plan(args)?;
    let outcome = match execute(&plan)? {
        Ok(outcome) => outcome,
        Err(not_started) => return Ok(not_started),
    };
    if !plan.quiet {
        say!("{}", present(&plan, &outcome, painter));
    }
    if let Some(page) = &plan.html {
        html_page(&outcome.traces, outcome.main, page, plan.quiet);
    }
    if plan.trace_target.is_some() && outcome.traces.is_empty() && !outcome.snapshots.is_empty() {
        sayln!(
            "gpumemhook: no timeline was written: this {LIB_NAME} ({}) may not record timelines yet",
            plan.lib.display()
        );
    }
    Ok(outcome.code)
}

/// The plan of `args`: a usage error for a bad size, card or setting (`--limit 8 GiB` is told
/// apart: the unit was taken for the program), and an error for a file that cannot be written.
fn plan(args: RunArgs) -> Result<RunPlan> {
    let split = |option: &str, text: &str| {
        let first = args
            .command
            .first()
            .map_or("".into(), |w| w.to_string_lossy());
        crate::usage::split_size(&[option, text, &*first])
    };
    let limit = match &args.limit {
        Some(text) => Some(parse_size(text).map_err(|e| {
            split("--limit", text).unwrap_or_else(|| UsageError(format!("--limit: {e}")))
        })?),
        None => None,
    };
    let emulate = match &args.emulate {
        Some(text) => Some(parse_card(text).map_err(|e| {
            split("--emulate", text).unwrap_or_else(|| UsageError(format!("--emulate: {e}")))
        })?),
        None => None,
    };
    if let Some(text) = &args.stacks {
        env::parse_stacks(text).map_err(|e| UsageError(format!("--stacks: {e}")))?;
    }
    let first = args
        .command
        .first()
        .map_or("".into(), |w| w.to_string_lossy().into_owned());
    let group = group_plan(args.group.as_deref(), args.group_limit.as_deref(), &first)?;
    // A setting inherited from the environment is read here too, so that a bad one is refused
    // with its one line and exit status 2 before the program starts (the hook would refuse it
    // in every process of the program).
    if limit.is_none() {
        if let Some(text) = std::env::var_os(env::LIMIT) {
            parse_size(&text.to_string_lossy())
                .map_err(|e| UsageError(format!("${}: {e}", env::LIMIT)))?;
        }
    }
    let lib = find_library(args.lib.as_deref())?;
    let report_target = output_target("--report", args.report, env::REPORT)?;
    let trace_target = output_target("--trace", args.trace, env::TRACE)?;
    if let Some(dir) = trace_target.as_deref().and_then(Path::parent) {
        if dir.to_string_lossy().contains("%p") {
            Err(UsageError(format!(
                "--trace {}: `%p` may be in the file's name only",
                dir.display()
            )))?;
        }
    }
    if let Some(page) = &args.html {
        crate::page::check_output(page)?;
    }
    Ok(RunPlan {
        report_target,
        streamed: trace_target.as_deref().and_then(Streamed::of),
        trace_target,
        html: args.html,
        command: args.command,
        lib,
        limit,
        emulate,
        stacks: args.stacks,
        group,
        quiet: args.quiet,
    })
}

/// `--group NAME` and `--group-limit SIZE`, checked: the group's name and its ceiling in bytes
/// (`first`, the command's first word: a unit written apart from its number lands there).
fn group_plan(
    name: Option<&str>,
    limit: Option<&str>,
    first: &str,
) -> Result<Option<(String, Option<u64>)>> {
    let Some(name) = name else {
        return Ok(None);
    };
    gpumemhook_reader::check_group_name(name).map_err(|e| UsageError(format!("--group: {e}")))?;
    let limit = match limit {
        Some(text) => Some(parse_size(text).map_err(|e| {
            crate::usage::split_size(&["--group-limit", text, first])
                .unwrap_or_else(|| UsageError(format!("--group-limit: {e}")))
        })?),
        None => None,
    };
    Ok(Some((name.to_string(), limit)))
}

/// Where a file the user asked for goes: the option's path, else the variable's (when not empty);
/// checked now, as --limit is, rather than after the whole run.
fn output_target(option: &str, given: Option<PathBuf>, variable: &str) -> Result<Option<PathBuf>> {
    let (target, named) = match given {
        Some(path) => (Some(path), option.to_string()),
        None => (
            std::env::var_os(variable)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            format!("${variable}:"),
        ),
    };
    if let Some(target) = &target {
        check_writable(&named, target)?;
    }
    Ok(target)
}

/// Runs the plan's program under the hook and collects what its processes left; `Err` holds the
/// exit status when the program could not be started (127: not found, 126: not runnable).
fn execute(plan: &RunPlan) -> Result<std::result::Result<RunOutcome, i32>> {
    let dir = TempDir::new(&std::env::temp_dir(), "gpumemhook-run")?;
    let program = &plan.command[0];
    let mut command = Command::new(program);
    command.args(&plan.command[1..]);
    launch::hook_env(
        &mut command,
        &plan.lib,
        &dir.0,
        plan.limit,
        plan.emulate.as_ref(),
    );
    if let Some((name, group_limit)) = &plan.group {
        crate::groups::group_env(&mut command, name, *group_limit);
    }
    if let Some(value) = &plan.stacks {
        command.env(env::STACKS, value);
    }
    match (
        &plan.streamed,
        plan.trace_target.is_some() || plan.html.is_some(),
    ) {
        (Some(streamed), _) => command.env(env::TRACE, &streamed.pattern),
        (None, true) => command.env(env::TRACE, dir.0.join("trace.%p.json")),
        (None, false) => command.env_remove(env::TRACE),
    };
    let started = Instant::now();
    let started_unix_ns = unix_now_ns();
    let linked = |pid: u32| {
        if let Some(streamed) = &plan.streamed {
            streamed.link_main(pid);
        }
    };
    let (child_pid, status) = match spawn_and_wait(&mut command, linked) {
        Ok(ended) => ended?,
        Err(e) => {
            let name = program.to_string_lossy();
            let (code, why) = match e.kind() {
                std::io::ErrorKind::NotFound => (127, "command not found".to_string()),
                std::io::ErrorKind::PermissionDenied => (126, "permission denied".to_string()),
                _ => (126, e.to_string()),
            };
            sayln!("gpumemhook: cannot run {name}: {why}");
            return Ok(Err(code));
        }
    };
    let ended_ns = unix_now_ns();
    let elapsed = started.elapsed().as_secs_f64();
    let (code, how) = describe(status);

    let reports = written(&dir.0, "report");
    let mut snapshots = launch::read_snapshots(&dir.0, child_pid, ended_ns);
    let main = main_process(&snapshots, child_pid);
    // The main process first, then the others by pid.
    snapshots.sort_by_key(|(s, _)| (Some(s.pid) != main, s.pid));
    let ended = Ended {
        child_pid,
        status,
        main,
        started_unix_ns,
    };
    let (traces, delivered_traces) = timelines(plan, &dir, &ended);
    Ok(Ok(RunOutcome {
        delivered_reports: plan.report_target.as_ref().map_or(Vec::new(), |target| {
            deliver(&reports, main, target, "report")
        }),
        delivered_traces,
        code,
        how,
        elapsed,
        child_pid,
        main,
        snapshots,
        traces,
        _dir: dir,
    }))
}

/// The main process: the command's own (`child_pid`), else the one with the highest peaks.
fn main_process(snapshots: &[(Snapshot, bool)], child_pid: u32) -> Option<u32> {
    snapshots
        .iter()
        .find(|(s, _)| s.pid == child_pid)
        .or_else(|| {
            snapshots
                .iter()
                .max_by_key(|(s, _)| s.devices.iter().map(|d| d.peak).sum::<u64>())
        })
        .map(|(s, _)| s.pid)
}

/// How the program ended, for finding its processes' timelines.
struct Ended {
    child_pid: u32,
    status: std::process::ExitStatus,
    /// The main process (see [`RunOutcome::main`]).
    main: Option<u32>,
    started_unix_ns: u64,
}

/// The timelines the run's processes left (closed where they died), and where the user finds
/// them: in place ([`Streamed`]), or copied from the private directory `dir` to a path that is no
/// regular file.
fn timelines(plan: &RunPlan, dir: &TempDir, ended: &Ended) -> (Vec<Written>, Vec<PathBuf>) {
    let traces = match &plan.streamed {
        Some(streamed) => streamed.written(ended.started_unix_ns),
        None => written(&dir.0, "trace"),
    };
    close_unfinished(&traces, ended.child_pid, ended.status);
    match (&plan.streamed, &plan.trace_target) {
        (Some(streamed), _) => {
            let traces = streamed.settle(traces, ended.child_pid, ended.main);
            let shown = traces.iter().map(|w| streamed.shown(w)).collect();
            (traces, shown)
        }
        (None, Some(target)) => {
            let delivered = deliver(&traces, ended.main, target, "timeline");
            (traces, delivered)
        }
        (None, None) => (traces, Vec::new()),
    }
}

/// Closes the timelines of the run's processes that died without finishing them (the flight
/// recorder's file stays readable either way; closed, it says the process died, and by which
/// signal for the command `run` started itself).
fn close_unfinished(traces: &[launch::Written], child_pid: u32, status: std::process::ExitStatus) {
    use std::os::unix::process::ExitStatusExt;
    let now = gpumemhook_reader::clock_ns(libc::CLOCK_MONOTONIC);
    for w in traces {
        if w.pid != child_pid && gpumemhook_reader::is_alive(w.pid) {
            // Still running (a daemon the command left behind): its timeline is not over.
            continue;
        }
        let signal = (w.pid == child_pid)
            .then(|| status.signal())
            .flatten()
            .map(|s| s as u32);
        if let Err(e) = gpumemhook_timeline::close_recording(&w.path, now, signal) {
            sayln!(
                "gpumemhook: cannot close the timeline {}: {e}",
                w.path.display()
            );
        }
    }
}

/// Starts `command` with the forwarded signals passed on to it, and waits for it: its pid and
/// status. The outer error is the start's (the program is not there or not runnable).
fn spawn_and_wait(
    command: &mut Command,
    started: impl FnOnce(u32),
) -> std::io::Result<Result<(u32, std::process::ExitStatus)>> {
    // Blocked before any thread starts, so that they queue for the forwarding thread instead of
    // ending `run` before it can print the summary.
    let signals = Signals::block(&FORWARDED);
    signals.unblock_in_child(command);
    let mut child = command.spawn()?;
    let child_pid = child.id();
    started(child_pid);
    // A signal the kernel generated (Ctrl-C, Ctrl-\, a window resize, a hangup) went to the whole
    // foreground process group, the child included, so passing it on would deliver it twice (a
    // second KeyboardInterrupt in Python): only signals a process sent to `run` itself (`kill PID`,
    // a job scheduler) are forwarded.
    signals.take(move |sig, from_kernel| {
        if !from_kernel && !CHILD_REAPED.load(Ordering::Acquire) {
            // SAFETY: plain kill(2) of our own child's pid.
            unsafe { libc::kill(child_pid as libc::pid_t, sig) };
        }
    });
    let status = child.wait().context("waiting for the command");
    CHILD_REAPED.store(true, Ordering::Release);
    Ok(status.map(|status| (child_pid, status)))
}

/// The summary of a run, for people: how it ended, each process's figures (and the scopes of its
/// timeline), the ceiling or card, and the files written.
fn present(plan: &RunPlan, outcome: &RunOutcome, painter: Painter) -> String {
    let mut out = String::new();
    let used_gpu = match outcome.snapshots.len() {
        0 => "no process used the GPU (no CUDA allocation went through the hook)".to_string(),
        1 => "1 process used the GPU".to_string(),
        n => format!("{n} processes used the GPU"),
    };
    out.push_str(&format!(
        "\n{} {} after {}; {used_gpu}\n",
        painter.paint("gpumemhook:", Style::Heading),
        outcome.how,
        duration(outcome.elapsed)
    ));
    for (s, from_segment) in &outcome.snapshots {
        out.push_str(&present_process(outcome, s, *from_segment, painter));
    }
    if let Some(l) = plan.limit {
        out.push_str(&format!("\nceiling: {} per device\n", format_size(l)));
    }
    if let Some(e) = &plan.emulate {
        out.push_str(&format!(
            "\nemulated card: {} ({} per device)\n",
            e.label(),
            format_size(e.total)
        ));
        for (s, _) in &outcome.snapshots {
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
    for p in &outcome.delivered_reports {
        out.push_str(&format!("report: {}\n", p.display()));
    }
    for p in &outcome.delivered_traces {
        out.push_str(&format!(
            "timeline: {}  (`gpumemhook plot {} -o memory.png` draws it; `export` converts it)\n",
            p.display(),
            p.display()
        ));
    }
    if let (Some(target), true) = (&plan.trace_target, outcome.snapshots.is_empty()) {
        // The hook makes a timeline at a process's first event: none used the GPU, none made one.
        out.push_str(&format!(
            "timeline: none written to {}: no process recorded an event\n",
            target.display()
        ));
    }
    out
}

/// One process's part of the summary: its figures, where they were read from, and every scope its
/// timeline holds (closed ones included).
fn present_process(
    outcome: &RunOutcome,
    s: &Snapshot,
    from_segment: bool,
    painter: Painter,
) -> String {
    let ending = if s.pid == outcome.child_pid {
        Ending::Ran(outcome.how.clone())
    } else {
        Ending::Exited
    };
    let mut out = String::from("\n");
    out.push_str(&summary::snapshot_summary(
        s,
        &ending,
        summary::Detail::Brief,
        painter,
    ));
    if from_segment {
        out.push_str(&format!(
            "  {}\n",
            painter.paint(
                "(read from its segment: the process ended before it could write a report)",
                Style::Dim
            )
        ));
    }
    let Some(w) = outcome.traces.iter().find(|w| w.pid == s.pid) else {
        return out;
    };
    match crate::snapshots::load_timeline(&w.path, gpumemhook_timeline::Keep::Peaks)
        .map_err(|e| format!("{e:#}"))
    {
        Ok(t) if !t.scopes.is_empty() => {
            let (_, scopes) = gpumemhook_timeline::replay(&t);
            let start = gpumemhook_timeline::time_span(&t).map_or(0.0, |s| s.0);
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
    out
}

/// `--html`: the page of the main process's timeline, or, when several processes recorded one (a
/// job: torchrun's ranks, a launcher's workers), of all of them on one page, a lane each (said on
/// stderr, as the summary is, unless `quiet`; a page that could not be written is said either way).
fn html_page(traces: &[Written], main: Option<u32>, page: &Path, quiet: bool) {
    let Some(trace) = traces
        .iter()
        .find(|w| Some(w.pid) == main)
        .or(traces.first())
    else {
        sayln!("gpumemhook: no page written: no process of the command recorded a timeline");
        return;
    };
    // The main process first: alone, its page is the page.
    let mut paths: Vec<&Path> = vec![trace.path.as_path()];
    paths.extend(
        traces
            .iter()
            .filter(|w| w.pid != trace.pid)
            .map(|w| w.path.as_path()),
    );
    match crate::page::write_run_page(&paths, page) {
        Ok(_) if quiet => {}
        Ok(1) => sayln!("page: {}  (open it in a browser)", page.display()),
        Ok(n) => sayln!(
            "page: {}  ({n} processes on one page; open it in a browser)",
            page.display()
        ),
        Err(e) => sayln!(
            "gpumemhook: cannot write the page {}: {e:#}",
            page.display()
        ),
    }
}

//! One trial of `gpumemhook fit`: the command line with the knob's value, started under the hook
//! with the card emulated or the ceiling set on a memory group of its own (`docs/groups.md`: all
//! its processes share them), and its outcome read from the hook's own files (exit and
//! out-of-memory reports, the group's joint peak), never from what the program prints. The trial is started, timed and
//! ended through [`super::running`], which owns its process group; of its output only the last
//! lines of stderr are kept ([`crate::tail`]).

use gpumemhook_reader::unix_now_ns;
use gpumemhook_reader::Emulation;
use gpumemhook_reader::{env, Snapshot};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use super::running::{TrialDir, RUNNING};
use crate::launch::{self, describe};
use crate::tail;

/// How many lines of a failed trial's stderr are shown.
const STDERR_LINES: usize = 15;

/// How many modules are named for the memory held at an out-of-memory.
const TOP_MODULES: usize = 3;

/// How long a trial's stderr is read past its end (a process it left outside its group may hold
/// the pipe open).
const STDERR_WAIT: Duration = Duration::from_secs(1);

/// The modules holding the most on the device at an out-of-memory, with their bytes.
pub(super) type Holders = Vec<(String, u64)>;

/// What a finished trial showed.
#[derive(Debug)]
pub(super) enum Outcome {
    Fits {
        /// The joint peak of its memory group on any device.
        peak: u64,
        /// The contexts and modules of its processes charged inside an emulated card (0 under a
        /// ceiling).
        overhead: u64,
    },
    OutOfMemory {
        /// At the first out-of-memory.
        holders: Holders,
    },
    /// Why (one line), and the last lines of its stderr.
    Failed { why: String, tail: String },
    /// It ran past `--trial-timeout` and was ended; the last lines of its stderr.
    TimedOut { limit: Duration, tail: String },
    /// It exited 0 without allocating any device memory (a program running on the CPU).
    NoAllocation,
    /// It was ended because its outcome could no longer change an answer.
    Stopped,
}

impl Outcome {
    fn failed(why: impl Into<String>) -> Outcome {
        Outcome::Failed {
            why: why.into(),
            tail: String::new(),
        }
    }
}

pub(super) struct Finished {
    pub(super) target: usize,
    pub(super) value: u64,
    pub(super) slot: usize,
    pub(super) held: u64,
    pub(super) outcome: Outcome,
    pub(super) seconds: f64,
}

/// The command line of one trial.
pub(super) struct TrialSpec {
    pub(super) target: usize,
    pub(super) value: u64,
    pub(super) slot: usize,
    pub(super) held: u64,
    pub(super) argv: Vec<OsString>,
    pub(super) lib: PathBuf,
    pub(super) card: Option<Emulation>,
    pub(super) limit: Option<u64>,
    pub(super) device: Option<String>,
    pub(super) launcher: Option<String>,
    pub(super) base: PathBuf,
    /// `--trial-timeout`.
    pub(super) time_limit: Option<Duration>,
    /// Set by `fit` when the trial's outcome can no longer change an answer: it is then ended.
    pub(super) moot: Arc<AtomicBool>,
}

/// `text` quoted for `sh`.
pub(super) fn shell_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The `env ... PROGRAM ARGS` line that gives a launcher's remote command the environment
/// `command` would have had here.
pub(super) fn as_shell_line(command: &Command) -> String {
    let mut words = vec!["env".to_string()];
    // `env` takes its options (`-u NAME`, a removal) before any NAME=VALUE.
    let (set, unset): (Vec<_>, Vec<_>) = command.get_envs().partition(|(_, v)| v.is_some());
    for (key, _) in unset {
        words.push("-u".to_string());
        words.push(shell_quote(&key.to_string_lossy()));
    }
    for (key, value) in set {
        let value = value.unwrap_or_default().to_string_lossy();
        words.push(shell_quote(&format!("{}={value}", key.to_string_lossy())));
    }
    words.push(shell_quote(&command.get_program().to_string_lossy()));
    words.extend(
        command
            .get_args()
            .map(|a| shell_quote(&a.to_string_lossy())),
    );
    words.join(" ")
}

/// Lines kept of a stream, indented, one per line.
fn indented(lines: Vec<String>) -> String {
    lines.iter().map(|l| format!("    {l}\n")).collect()
}

/// The trial's command: the program with the hook, the card or ceiling and its memory group (made
/// here first), under the launcher if one is given; `Err` says why the trial cannot run.
fn trial_command(spec: &TrialSpec, dir: &TrialDir) -> Result<Command, String> {
    let mut command = Command::new(&spec.argv[0]);
    command.args(&spec.argv[1..]);
    // Nothing of the caller's own hook settings may change a trial.
    for var in [env::LIMIT, env::EMULATE, env::TRACE, env::OOM_REPORT] {
        command.env_remove(var);
    }
    for (var, _) in std::env::vars_os() {
        let name = var.to_string_lossy();
        if name.starts_with(env::LIMIT_DEVICE_PREFIX)
            || name.starts_with(env::EMULATE_DEVICE_PREFIX)
        {
            command.env_remove(&var);
        }
    }
    launch::hook_env(
        &mut command,
        &spec.lib,
        dir.path(),
        spec.limit,
        spec.card.as_ref(),
    );
    // One memory group per trial: its processes share the card or the ceiling, and are judged
    // by their joint peak. Made here when the trial runs here (a launcher's machine makes its own).
    if spec.launcher.is_none() {
        crate::groups::create(&dir.memory_group()).map_err(|e| format!("{e:#}"))?;
    }
    crate::groups::group_env(&mut command, &dir.memory_group(), spec.limit);
    command.env(env::OOM_REPORT, dir.path().join("oom.%p.%n.json"));
    if let Some(uuid) = &spec.device {
        command.env("CUDA_VISIBLE_DEVICES", uuid);
    }
    if let Some(template) = &spec.launcher {
        let line = template.replace("{cmd}", &as_shell_line(&command));
        command = Command::new("sh");
        command.args(["-c", &line]);
    }
    Ok(command)
}

/// Runs one trial to its end and reads its outcome from the hook's files; `None` when `fit` is
/// stopping (the trial was not started, or was ended with the others).
pub(super) fn run_trial(spec: &TrialSpec) -> Option<Outcome> {
    let dir = match RUNNING.make_dir(&spec.base) {
        Ok(Some(d)) => d,
        Ok(None) => return None,
        Err(e) => return Some(Outcome::failed(format!("{e:#}"))),
    };
    let mut command = match trial_command(spec, &dir) {
        Ok(c) => c,
        Err(why) => return Some(Outcome::failed(why)),
    };
    // The program's stdout is not shown; of its stderr, the last lines are kept in memory.
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = match RUNNING.spawn(&dir, &mut command) {
        Ok(Some(c)) => c,
        Ok(None) => return None,
        Err(e) => {
            return Some(Outcome::failed(format!(
                "cannot run {}: {e}",
                spec.argv[0].to_string_lossy()
            )))
        }
    };
    let stderr = child
        .stderr
        .take()
        .map(|pipe| tail::Reader::start(pipe, STDERR_LINES));
    let pid = child.id();
    let ended = RUNNING.wait(&child, spec.time_limit, &spec.moot);
    if spec.launcher.is_none() && super::running::end_leftovers(&dir.memory_group()) > 0 {
        super::running::remove_stale_segments();
    }
    let tail = stderr.map_or_else(String::new, |r| indented(r.finish(STDERR_WAIT)));
    if RUNNING.stopping() {
        return None;
    }
    let ended = match ended {
        Ok(e) => e,
        Err(e) => return Some(Outcome::failed(format!("waiting for the trial: {e}"))),
    };
    if ended.stopped {
        return Some(Outcome::Stopped);
    }
    if let (true, Some(limit)) = (ended.timed_out, spec.time_limit) {
        return Some(Outcome::TimedOut { limit, tail });
    }
    let joint_peak = crate::groups::largest_joint_peak(&dir.memory_group());
    Some(outcome(&dir, pid, ended.status, joint_peak, tail))
}

/// What the hook's files in `dir`, the exit `status` of the trial's process `pid` and the joint
/// peak of its memory group say (`None` when the group cannot be read here: a launcher ran the
/// trial on another machine; its processes' largest peak stands in).
fn outcome(
    dir: &TrialDir,
    pid: u32,
    status: ExitStatus,
    joint_peak: Option<u64>,
    tail: String,
) -> Outcome {
    let snapshots = launch::read_snapshots(dir.path(), pid, unix_now_ns());
    let ooms: Vec<Snapshot> = std::fs::read_dir(dir.path())
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let path = e.ok()?.path();
                    path.file_name()?
                        .to_str()?
                        .starts_with("oom.")
                        .then_some(())?;
                    serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()
                })
                .collect()
        })
        .unwrap_or_default();
    let denied = snapshots
        .iter()
        .flat_map(|(s, _)| &s.devices)
        .any(|d| d.denied > 0);
    if denied || !ooms.is_empty() {
        let holders = ooms
            .iter()
            .min_by_key(|s| s.taken_unix_ns)
            .map(|s| {
                let device = s.oom.as_ref().map_or(0, |o| o.device);
                let mut holders: Holders = s
                    .device(device)
                    .by_module
                    .iter()
                    .take(TOP_MODULES)
                    .map(|m| (m.module.clone(), m.used))
                    .collect();
                holders.extend(others_in_the_group(s));
                holders
            })
            .unwrap_or_default();
        return Outcome::OutOfMemory { holders };
    }
    if !status.success() {
        let (_, how) = describe(status);
        return Outcome::Failed {
            why: format!("{how}, with no allocation refused"),
            tail,
        };
    }
    let devices = || snapshots.iter().flat_map(|(s, _)| &s.devices);
    // The group's joint peak, but never below a process's own: one that could not join the group
    // counted alone, and its peak is still the trial's.
    let own_peak = devices().map(|d| d.peak).max().unwrap_or(0);
    let peak = joint_peak.map_or(own_peak, |joint| joint.max(own_peak));
    if peak == 0 {
        return Outcome::NoAllocation;
    }
    // Every process's context is charged inside the group's card: their sum, on the device where
    // it is largest (more than was charged at the peak when they did not all run at once, never
    // less, so a value inferred to fit from it does).
    let mut overheads = std::collections::BTreeMap::<u32, u64>::new();
    for d in devices() {
        if let Some(e) = &d.emulated {
            *overheads.entry(d.device).or_default() += e.overhead;
        }
    }
    Outcome::Fits {
        peak,
        overhead: overheads.into_values().max().unwrap_or(0),
    }
}

/// What the trial's other processes held when `oom`'s process ran out (its report's group part),
/// as one holder: a program of several processes runs out of the memory they share.
fn others_in_the_group(oom: &Snapshot) -> Option<(String, u64)> {
    let group = oom.oom.as_ref()?.group.as_ref()?;
    let held: u64 = group.others.iter().map(|m| m.bytes).sum();
    let count = group.others.iter().filter(|m| m.bytes > 0).count();
    let what = match count {
        0 => return None,
        1 => "1 other process".to_string(),
        n => format!("{n} other processes"),
    };
    Some((what, held))
}

pub(super) fn outcome_word(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Fits { .. } => "fits",
        Outcome::OutOfMemory { .. } => "out of memory",
        Outcome::Failed { .. } => "failed",
        Outcome::TimedOut { .. } => "timed out",
        Outcome::NoAllocation => "no GPU memory",
        Outcome::Stopped => "stopped (moot)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_keeps_every_word_whole() {
        assert_eq!(shell_quote("plain-word_1.py"), "plain-word_1.py");
        assert_eq!(shell_quote("two words"), "'two words'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}

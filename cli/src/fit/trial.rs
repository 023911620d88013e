//! One trial of `gpumemhook fit`: the command line with the knob's value, started under the hook
//! with the card emulated or the ceiling set, and its outcome read from the hook's own files (exit
//! and out-of-memory reports), never from what the program prints.

use gpumemhook_reader::cards::Emulation;
use gpumemhook_reader::{env, process, Snapshot};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{STDERR_LINES, TOP_MODULES};
use crate::launch::{self, describe, TempDir};

/// The modules holding the most on the device at an out-of-memory, with their bytes.
pub(super) type Holders = Vec<(String, u64)>;

/// What a finished trial showed.
#[derive(Debug)]
pub(super) enum Outcome {
    Fits {
        /// The largest `peak` of any process on any device.
        peak: u64,
        /// The context and modules charged inside an emulated card (0 under a ceiling).
        overhead: u64,
    },
    OutOfMemory {
        /// At the first out-of-memory.
        holders: Holders,
    },
    /// Why (one line), and the last lines of its stderr.
    Failed { why: String, tail: String },
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

/// The last `n` lines of a file, indented.
pub(super) fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    {l}\n"))
        .collect()
}

/// Runs one trial to its end and reads its outcome from the hook's files.
pub(super) fn run_trial(spec: &TrialSpec) -> Outcome {
    let dir = match TempDir::new(&spec.base, ".gpumemhook-fit") {
        Ok(d) => d,
        Err(e) => return Outcome::failed(format!("{e:#}")),
    };
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
        &dir.0,
        spec.limit,
        spec.card.as_ref(),
    );
    command.env(env::OOM_REPORT, dir.0.join("oom.%p.%n.json"));
    if let Some(uuid) = &spec.device {
        command.env("CUDA_VISIBLE_DEVICES", uuid);
    }
    if let Some(template) = &spec.launcher {
        let line = template.replace("{cmd}", &as_shell_line(&command));
        command = Command::new("sh");
        command.args(["-c", &line]);
    }
    let stderr_path = dir.0.join("stderr");
    let files = std::fs::File::create(dir.0.join("stdout"))
        .and_then(|out| Ok((out, std::fs::File::create(&stderr_path)?)));
    let (out, err) = match files {
        Ok(f) => f,
        Err(e) => return Outcome::failed(format!("cannot keep the trial's output: {e}")),
    };
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome::failed(format!(
                "cannot run {}: {e}",
                spec.argv[0].to_string_lossy()
            ))
        }
    };
    let pid = child.id();
    let status = match child.wait() {
        Ok(s) => s,
        Err(e) => return Outcome::failed(format!("waiting for the trial: {e}")),
    };
    let snapshots = launch::read_snapshots(&dir.0, pid, process::unix_now_ns());
    let ooms: Vec<Snapshot> = std::fs::read_dir(&dir.0)
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
                s.device(device)
                    .by_module
                    .iter()
                    .take(TOP_MODULES)
                    .map(|m| (m.module.clone(), m.used))
                    .collect()
            })
            .unwrap_or_default();
        return Outcome::OutOfMemory { holders };
    }
    if !status.success() {
        let (_, how) = describe(status);
        return Outcome::Failed {
            why: format!("{how}, with no allocation refused"),
            tail: last_lines(&stderr_path, STDERR_LINES),
        };
    }
    let devices = || snapshots.iter().flat_map(|(s, _)| &s.devices);
    Outcome::Fits {
        peak: devices().map(|d| d.peak).max().unwrap_or(0),
        overhead: devices()
            .filter_map(|d| d.emulated.as_ref().map(|e| e.overhead))
            .max()
            .unwrap_or(0),
    }
}

pub(super) fn outcome_word(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Fits { .. } => "fits",
        Outcome::OutOfMemory { .. } => "out of memory",
        Outcome::Failed { .. } => "failed",
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

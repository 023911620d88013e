//! The hooked processes as every command sees them: attaching to one (with an error that says why
//! not, and the hooked program below a launcher's pid for the control commands), gathering all of
//! this user's, and the per-process table that `ls` and `top` print.
//!
//! Segment files are found and checked by the reader (`list_segments`): a FIFO, a symlink or another
//! user's file planted at a segment's name is never read or written, and never blocks; what was
//! skipped is kept with the reason.

use anyhow::{bail, Result};
use gpumemhook_reader::{command_line, descendants_of, is_alive, segment_dir};
use gpumemhook_reader::{format_size, list_segments, Error, Owners, Process, Snapshot};

use crate::style::{count, size_or_dash, Cell, Painter, Style, Table};

/// The command as `ls` and `top` show it: where the process belongs first, when known
/// (`[rank 3/8 slurm:1234] python train.py`).
pub fn command_cell(s: &Snapshot) -> String {
    let job = s.job.summary();
    if job.is_empty() {
        s.command.clone()
    } else {
        format!("[{job}] {}", s.command)
    }
}

/// A process has "used the GPU" once it allocated or holds a scope; launchers and shells started
/// under the hook never do and would only be noise.
pub fn is_idle(s: &Snapshot) -> bool {
    s.devices.is_empty() && s.host.allocs == 0 && s.scopes.is_empty()
}

/// What `ls` and `top` show.
pub struct Listing {
    /// Live processes, by pid.
    pub processes: Vec<Snapshot>,
    /// The pids of hooked processes left out because they have not used the GPU (`top` still
    /// knows them for hooked where NVML lists them).
    pub idle_hidden: Vec<u32>,
    /// Files at a segment's name that were not read, as `path: reason`.
    pub skipped: Vec<String>,
}

/// Attaches to `pid`, with an error that says why not: no such process, not hooked, another
/// user's, gone (exited or `exec`'d away from the hook), or a segment file that cannot be trusted.
pub fn attach(pid: u32) -> Result<Process> {
    if !is_alive(pid) {
        bail!("no process with pid {pid} is running");
    }
    let command = || command_line(pid).unwrap_or_default();
    match Process::attach(pid) {
        Ok(p) => Ok(p),
        Err(Error::NoSegment { .. }) => bail!(
            "process {pid} ({}) is not hooked (no segment in {}): {}",
            command(),
            segment_dir().display(),
            gpumemhook_reader::HOW_TO_HOOK
        ),
        Err(Error::ProcessGone { .. }) => bail!(
            "process {pid} ({}) has no live gpumemhook segment: the hooked program exited or \
             replaced itself (exec) with one that runs without the hook",
            command()
        ),
        Err(e @ (Error::OtherUser { .. } | Error::Refused { .. })) => {
            bail!("process {pid} ({}): {e}", command())
        }
        Err(e) => Err(e.into()),
    }
}

/// [`attach`], or where `pid` is not hooked itself, the one hooked process it runs (for the commands
/// that change a process: `limit`, `reset-peak`; a listing shows what it is asked for).
pub fn attach_or_descendant(pid: u32) -> Result<Process> {
    if is_alive(pid) && matches!(Process::attach(pid), Err(Error::NoSegment { .. })) {
        if let Some(p) = hooked_descendant(pid)? {
            return Ok(p);
        }
    }
    attach(pid)
}

/// The one hooked process under `pid`, when `pid` is not hooked itself but starts hooked programs
/// (`gpumemhook run ... &` then `$!`, or a shell script): said on stderr, so that what follows names
/// the program. Several are an error naming them; none is `None`.
fn hooked_descendant(pid: u32) -> Result<Option<Process>> {
    let mut hooked: Vec<Process> = descendants_of(pid, 4096)
        .into_iter()
        .filter_map(|child| Process::attach(child).ok())
        .collect();
    match hooked.len() {
        0 => Ok(None),
        1 => {
            let p = hooked.remove(0);
            sayln!(
                "gpumemhook: process {pid} ({}) is not hooked; its hooked program is process {} ({})",
                command_line(pid).unwrap_or_default(),
                p.pid(),
                command_line(p.pid()).unwrap_or_default()
            );
            Ok(Some(p))
        }
        _ => {
            let pids: Vec<String> = hooked.iter().map(|p| p.pid().to_string()).collect();
            bail!(
                "process {pid} ({}) is not hooked, and runs {} hooked processes (pids {}): name one",
                command_line(pid).unwrap_or_default(),
                pids.len(),
                pids.join(", ")
            )
        }
    }
}

/// Snapshots of every live hooked process (or of `pids`).
pub fn gather(pids: &[u32], all: bool) -> Result<Listing> {
    if !pids.is_empty() {
        let processes = pids
            .iter()
            .map(|&pid| attach(pid).map(|p| p.snapshot()))
            .collect::<Result<_>>()?;
        return Ok(Listing {
            processes,
            idle_hidden: Vec::new(),
            skipped: Vec::new(),
        });
    }
    let found = match list_segments(Owners::Me) {
        Ok(found) => found,
        // No segment directory yet: nobody has been hooked.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Default::default()
        }
        Err(e) => return Err(e.into()),
    };
    let skipped = found
        .skipped
        .iter()
        .map(|s| format!("{}: {}", s.path.display(), skipped_reason(&s.reason)))
        .collect();
    let mut processes = Vec::new();
    let mut idle_hidden = Vec::new();
    for e in found.live {
        let s = e.process.snapshot();
        if all || !is_idle(&s) {
            processes.push(s);
        } else {
            idle_hidden.push(s.pid);
        }
    }
    Ok(Listing {
        processes,
        idle_hidden,
        skipped,
    })
}

/// Why a segment file was skipped, in a few words.
fn skipped_reason(reason: &Error) -> String {
    match reason {
        Error::Refused { refusal, .. } => format!("refused: {refusal}"),
        Error::ProcessGone { .. } => {
            "stale: its process exited or exec'd away from the hook (removed if yours)".to_string()
        }
        other => other.to_string(),
    }
}

/// The `--all` section listing skipped files.
pub fn skipped_section(listing: &Listing) -> String {
    let mut text = format!(
        "skipped {} file(s) at segment names:\n",
        listing.skipped.len()
    );
    for line in &listing.skipped {
        text.push_str("  ");
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// The scopes of `s` that report on `device`, as `name +peak-above-start`.
pub fn scopes_cell(s: &Snapshot, device: Option<u32>) -> String {
    s.scopes
        .iter()
        .filter_map(|scope| {
            let Some(device) = device else {
                return Some(scope.name.clone());
            };
            if scope.device.is_some_and(|only| only != device) {
                return None;
            }
            let d = scope.devices.iter().find(|d| d.device == device)?;
            Some(format!(
                "{} +{}",
                scope.name,
                format_size(d.peak.saturating_sub(d.base))
            ))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One row per process and device.
pub fn table(processes: &[Snapshot], painter: Painter) -> String {
    let mut t = Table::new(&[
        ("PID", true),
        ("DEV", true),
        ("USED", true),
        ("PEAK", true),
        ("LIMIT", true),
        ("ALLOCS", true),
        ("DENIED", true),
        ("SCOPES", false),
        ("COMMAND", false),
    ]);
    for s in processes {
        if s.devices.is_empty() {
            t.push(vec![
                Cell::right(s.pid.to_string()),
                Cell::right("-").styled(Style::Dim),
                Cell::right("-").styled(Style::Dim),
                Cell::right("-").styled(Style::Dim),
                Cell::right("-").styled(Style::Dim),
                Cell::right("-").styled(Style::Dim),
                Cell::right("-").styled(Style::Dim),
                Cell::left(scopes_cell(s, None)).styled(Style::Name),
                Cell::left(command_cell(s)),
            ]);
            continue;
        }
        for (i, d) in s.devices.iter().enumerate() {
            let first = i == 0;
            let near = d.limit.is_some_and(|l| d.used as f64 >= 0.9 * l as f64);
            t.push(vec![
                Cell::right(if first {
                    s.pid.to_string()
                } else {
                    String::new()
                }),
                Cell::right(d.device.to_string()),
                Cell::right(format_size(d.used)).styled(if near {
                    Style::Warn
                } else {
                    Style::Plain
                }),
                Cell::right(format_size(d.peak)).styled(Style::Peak),
                Cell::right(match &d.emulated {
                    // An emulated card: its name and the overhead charged inside it.
                    Some(e) => format!("{} -{} ctx", e.card, format_size(e.overhead)),
                    None => size_or_dash(d.limit),
                })
                .styled(if d.limit.is_some() || d.emulated.is_some() {
                    Style::Plain
                } else {
                    Style::Dim
                }),
                Cell::right(count(d.allocs)),
                Cell::right(count(d.denied)).styled(if d.denied > 0 {
                    Style::Bad
                } else {
                    Style::Dim
                }),
                Cell::left(scopes_cell(s, Some(d.device))).styled(Style::Name),
                Cell::left(if first {
                    command_cell(s)
                } else {
                    String::new()
                }),
            ]);
        }
    }
    t.render(painter)
}

/// What to say when there is nothing to list.
pub fn nothing_message(listing: &Listing) -> String {
    let idle = listing.idle_hidden.len();
    if idle > 0 {
        format!(
            "no hooked process has used the GPU yet ({} hooked process{} idle: --all lists {})",
            idle,
            if idle == 1 { " is" } else { "es are" },
            if idle == 1 { "it" } else { "them" }
        )
    } else {
        format!(
            "no hooked processes of this user (segments are looked for in {}); start one with \
             `gpumemhook run -- CMD`",
            segment_dir().display()
        )
    }
}

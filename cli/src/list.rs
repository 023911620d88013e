//! `gpumemhook ls`: every live hooked process of this user on this machine, as a table or as JSON.
//! The gathering and the table are shared with `top`, which shows the same rows refreshed.
//!
//! Segment files are found and checked by the reader (`list_segments`): a FIFO, a symlink or another
//! user's file planted at a segment's name is never read or written, and never blocks; `--all`
//! lists what was skipped and why.

use anyhow::{bail, Result};
use gpumemhook_reader::{
    format_size, list_segments, process, shm, Error, Owners, Process, Snapshot,
};

use crate::style::{count, size_or_dash, Cell, Painter, Style, Table};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook ls                 # processes that have used the GPU
  gpumemhook ls --all           # also hooked processes that have not (shells, launchers), and
                                # files at a segment's name that were skipped, with the reason
  gpumemhook ls 4242            # one process (an error if it is not hooked)
  gpumemhook ls --by-site       # and which lines of Python hold it (run --stacks python)
  gpumemhook ls --json | jq '.[] | {pid, peak: .devices[0].peak}'
  gpumemhook ls --by-job     # one row per job and device: its ranks' bytes summed
                                # (name a job: GPUMEMHOOK_JOB=nightly GPUMEMHOOK_RANK=0 CMD)

JSON: a list of snapshots, the exit report's format: [{\"pid\", \"command\", \"devices\": [{\"device\",
\"used\", \"peak\", \"limit\", \"allocs\", \"frees\", \"denied\", ...}], \"host\", \"scopes\"}, ...],
sizes in bytes.")]
pub struct LsArgs {
    /// Only these processes.
    #[arg(value_name = "PID")]
    pub pids: Vec<u32>,
    /// Print JSON (sizes in bytes) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Include hooked processes that have not used the GPU yet, and list skipped segment files
    /// (planted, stale, another release) with the reason.
    #[arg(long, short)]
    pub all: bool,
    /// Sum processes by job ($GPUMEMHOOK_JOB, else the Ray job, Slurm job, torchrun rendezvous
    /// or pod; see `job` in the JSON): one row per job and device.
    #[arg(long)]
    pub by_job: bool,
    /// Only the processes that count in group NAME (GPUMEMHOOK_GROUP, `run --group NAME`), as
    /// `--group` means in every command.
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// Who holds the memory: one row per process, device and shared object that asked for it
    /// (with --json, every device's `by_module` list is in the snapshot anyway).
    #[arg(long, conflicts_with = "by_job")]
    pub by_module: bool,
    /// Where the memory was asked for: per process, bytes held and peak per Python call site
    /// (for programs run with `run --stacks python:<min bytes>`; with --json, `by_site` is in the
    /// snapshot anyway).
    #[arg(long, conflicts_with = "by_job")]
    pub by_site: bool,
}

/// The processes of one job on one device, summed (`ls --by-job`).
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct JobDeviceRow {
    /// The job id; `null` for processes that belong to no known job.
    pub job: Option<String>,
    pub device: u32,
    pub pids: Vec<u32>,
    /// The ranks of those processes that have one, in pid order.
    pub ranks: Vec<String>,
    pub used: u64,
    /// The sum of each process's own peak: an upper bound of the job's peak on the device (the
    /// processes need not have peaked at once).
    pub peak_sum: u64,
    /// The group all these processes count in (`GPUMEMHOOK_GROUP`), when they share one.
    pub group: Option<String>,
    /// That group's exact joint peak on the device (`docs/groups.md`); `null` when the processes
    /// share no group.
    pub peak: Option<u64>,
    pub allocs: u64,
    pub denied: u64,
}

/// One row per (job, device), jobs in name order, processes of no job last.
pub fn group_by_job(processes: &[Snapshot]) -> Vec<JobDeviceRow> {
    let mut rows: std::collections::BTreeMap<(bool, String, u32), JobDeviceRow> =
        std::collections::BTreeMap::new();
    for s in processes {
        let job = s.job.job_id();
        for d in &s.devices {
            let key = (job.is_none(), job.clone().unwrap_or_default(), d.device);
            let row = rows.entry(key).or_insert_with(|| JobDeviceRow {
                job: job.clone(),
                device: d.device,
                ..JobDeviceRow::default()
            });
            // The row's group: the first process's, and none once one differs.
            if row.pids.is_empty() || row.group != s.job.group {
                row.group = if row.pids.is_empty() {
                    s.job.group.clone()
                } else {
                    None
                };
            }
            row.pids.push(s.pid);
            row.ranks.extend(s.job.rank.clone());
            row.used += d.used;
            row.peak_sum += d.peak;
            row.allocs += d.allocs;
            row.denied += d.denied;
        }
    }
    let mut rows: Vec<JobDeviceRow> = rows.into_values().collect();
    for row in &mut rows {
        row.peak = row
            .group
            .as_deref()
            .and_then(|g| crate::group::joint_peak(g, row.device));
    }
    rows
}

/// The `ls --by-job` table.
pub fn job_table(rows: &[JobDeviceRow], painter: Painter) -> String {
    let mut t = Table::new(&[
        ("JOB", false),
        ("DEV", true),
        ("PROCS", true),
        ("USED", true),
        (peak_header(rows), true),
        ("ALLOCS", true),
        ("DENIED", true),
        ("RANKS", false),
    ]);
    for r in rows {
        t.push(vec![
            Cell::left(r.job.as_deref().unwrap_or("(no job)")).styled(Style::Name),
            Cell::right(r.device.to_string()),
            Cell::right(r.pids.len().to_string()),
            Cell::right(format_size(r.used)),
            Cell::right(peak_cell(r, rows)).styled(Style::Peak),
            Cell::right(count(r.allocs)),
            Cell::right(count(r.denied)).styled(if r.denied > 0 { Style::Bad } else { Style::Dim }),
            Cell::left(r.ranks.join(",")),
        ]);
    }
    t.render(painter)
}

/// `PEAK SUM` when no row's processes share a group, else `PEAK`: the group's exact joint peak
/// where they do, the sum of the processes' own peaks (marked) where they do not.
fn peak_header(rows: &[JobDeviceRow]) -> &'static str {
    if rows.iter().any(|r| r.peak.is_some()) {
        "PEAK"
    } else {
        "PEAK SUM"
    }
}

fn peak_cell(row: &JobDeviceRow, rows: &[JobDeviceRow]) -> String {
    match row.peak {
        Some(peak) => format_size(peak),
        None if peak_header(rows) == "PEAK" => format!("{} (sum)", format_size(row.peak_sum)),
        None => format_size(row.peak_sum),
    }
}

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
    /// Hooked processes left out because they have not used the GPU.
    pub idle_hidden: usize,
    /// Files at a segment's name that were not read, as `path: reason`.
    pub skipped: Vec<String>,
}

/// Attaches to `pid`, with an error that says why not: no such process, not hooked, another
/// user's, gone (exited or `exec`'d away from the hook), or a segment file that cannot be trusted.
pub fn attach(pid: u32) -> Result<Process> {
    if !process::is_alive(pid) {
        bail!("no process with pid {pid} is running");
    }
    let command = || process::command_line(pid).unwrap_or_default();
    match Process::attach(pid) {
        Ok(p) => Ok(p),
        Err(Error::NoSegment { .. }) => bail!(
            "process {pid} ({}) is not hooked (no segment in {}): {}",
            command(),
            shm::segment_dir().display(),
            gpumemhook_reader::error::HOW_TO_HOOK
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
    if process::is_alive(pid) && matches!(Process::attach(pid), Err(Error::NoSegment { .. })) {
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
    let mut hooked: Vec<Process> = process::descendants_of(pid, 4096)
        .into_iter()
        .filter_map(|child| Process::attach(child).ok())
        .collect();
    match hooked.len() {
        0 => Ok(None),
        1 => {
            let p = hooked.remove(0);
            eprintln!(
                "gpumemhook: process {pid} ({}) is not hooked; its hooked program is process {} ({})",
                process::command_line(pid).unwrap_or_default(),
                p.pid(),
                process::command_line(p.pid()).unwrap_or_default()
            );
            Ok(Some(p))
        }
        _ => {
            let pids: Vec<String> = hooked.iter().map(|p| p.pid().to_string()).collect();
            bail!(
                "process {pid} ({}) is not hooked, and runs {} hooked processes (pids {}): name one",
                process::command_line(pid).unwrap_or_default(),
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
            idle_hidden: 0,
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
    let mut idle_hidden = 0;
    for e in found.live {
        let s = e.process.snapshot();
        if all || !is_idle(&s) {
            processes.push(s);
        } else {
            idle_hidden += 1;
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
fn skipped_section(listing: &Listing) -> String {
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
    if listing.idle_hidden > 0 {
        format!(
            "no hooked process has used the GPU yet ({} hooked process{} idle: --all lists {})",
            listing.idle_hidden,
            if listing.idle_hidden == 1 {
                " is"
            } else {
                "es are"
            },
            if listing.idle_hidden == 1 {
                "it"
            } else {
                "them"
            }
        )
    } else {
        format!(
            "no hooked processes of this user (segments are looked for in {}); start one with \
             `gpumemhook run -- CMD`",
            shm::segment_dir().display()
        )
    }
}

pub fn ls(args: LsArgs, painter: Painter) -> Result<i32> {
    let mut listing = gather(&args.pids, args.all)?;
    if let Some(name) = &args.group {
        gpumemhook_reader::group::check_name(name)
            .map_err(|e| crate::usage::UsageError(e.to_string()))?;
        listing
            .processes
            .retain(|s| s.job.group.as_deref() == Some(name.as_str()));
    }
    if args.by_job {
        let rows = group_by_job(&listing.processes);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else if !rows.is_empty() {
            print!("{}", job_table(&rows, painter));
        }
        if rows.is_empty() {
            eprintln!("gpumemhook: {}", nothing_message(&listing));
        }
        return Ok(0);
    }
    let show_skipped = args.all && !listing.skipped.is_empty();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing.processes)?);
        if listing.processes.is_empty() {
            eprintln!("gpumemhook: {}", nothing_message(&listing));
        }
        // JSON stays a list of snapshots; what was skipped goes to stderr.
        if show_skipped {
            eprint!("{}", skipped_section(&listing));
        }
        return Ok(0);
    }
    if listing.processes.is_empty() {
        eprintln!("gpumemhook: {}", nothing_message(&listing));
    } else if args.by_module || args.by_site {
        for s in &listing.processes {
            println!(
                "{}  {}",
                painter.paint(&format!("pid {}", s.pid), Style::Heading),
                painter.paint(&command_cell(s), Style::Name)
            );
            if args.by_module {
                let modules = crate::attribution::module_table(s, painter, 2);
                if modules.is_empty() {
                    println!(
                        "  {}",
                        painter.paint("no device memory attributed yet", Style::Dim)
                    );
                } else {
                    print!("{modules}");
                }
            }
            if args.by_site {
                print!("{}", crate::attribution::site_table(s, painter, 2));
            }
        }
    } else {
        print!("{}", table(&listing.processes, painter));
    }
    if show_skipped {
        print!("{}", skipped_section(&listing));
    }
    Ok(0)
}

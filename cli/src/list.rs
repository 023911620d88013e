//! `gpumemhook ls`: every live hooked process of this user on this machine, as a table or as JSON
//! (gathered by `crate::processes`, which `top` shares), or summed by job; `--all` lists the
//! segment files that were skipped and why.

use anyhow::Result;
use gpumemhook_reader::{format_size, Snapshot};

use crate::processes::{command_cell, gather, nothing_message, skipped_section, table};
use crate::style::{count, Cell, Painter, Style, Table};

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
            .and_then(|g| crate::groups::joint_peak(g, row.device));
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

pub fn ls(args: LsArgs, painter: Painter) -> Result<i32> {
    let mut listing = gather(&args.pids, args.all)?;
    if let Some(name) = &args.group {
        gpumemhook_reader::check_group_name(name)
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
            sayln!("gpumemhook: {}", nothing_message(&listing));
        }
        return Ok(0);
    }
    let show_skipped = args.all && !listing.skipped.is_empty();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing.processes)?);
        if listing.processes.is_empty() {
            sayln!("gpumemhook: {}", nothing_message(&listing));
        }
        // JSON stays a list of snapshots; what was skipped goes to stderr.
        if show_skipped {
            say!("{}", skipped_section(&listing));
        }
        return Ok(0);
    }
    if listing.processes.is_empty() {
        sayln!("gpumemhook: {}", nothing_message(&listing));
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

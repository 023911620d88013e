//! `gpumemhook ls`: every live hooked process of this user on this machine, as a table or as JSON.
//! The gathering and the table are shared with `top`, which shows the same rows refreshed.

use anyhow::{bail, Result};
use gpumemhook_reader::{format_size, list_processes, process, shm, Error, Process, Snapshot};

use crate::style::{count, size_or_dash, Cell, Painter, Style, Table};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook ls                 # processes that have used the GPU
  gpumemhook ls --all           # also hooked processes that have not (shells, launchers)
  gpumemhook ls 4242            # one process (an error if it is not hooked)
  gpumemhook ls --json | jq '.[] | {pid, peak: .devices[0].peak}'

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
    /// Include hooked processes that have not used the GPU yet.
    #[arg(long, short)]
    pub all: bool,
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
}

/// Attaches to `pid`, with an error that says whether the process exists at all.
pub fn attach(pid: u32) -> Result<Process> {
    if !process::is_alive(pid) {
        bail!("no process with pid {pid} is running");
    }
    match Process::attach(pid) {
        Ok(p) => Ok(p),
        Err(Error::NoSegment { .. }) => bail!(
            "process {pid} ({}) is not hooked (no segment in {}): {}",
            process::command_line(pid).unwrap_or_default(),
            shm::segment_dir().display(),
            gpumemhook_reader::error::HOW_TO_HOOK
        ),
        Err(e) => Err(e.into()),
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
        });
    }
    let entries = match list_processes() {
        Ok(e) => e,
        // No segment directory yet: nobody has been hooked.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Vec::new()
        }
        Err(e) => return Err(e.into()),
    };
    let mut processes = Vec::new();
    let mut idle_hidden = 0;
    for e in entries {
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
    })
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
                Cell::left(s.command.as_str()),
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
                Cell::left(if first { s.command.as_str() } else { "" }),
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
    let listing = gather(&args.pids, args.all)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing.processes)?);
        if listing.processes.is_empty() {
            eprintln!("gpumemhook: {}", nothing_message(&listing));
        }
        return Ok(0);
    }
    if listing.processes.is_empty() {
        eprintln!("gpumemhook: {}", nothing_message(&listing));
        return Ok(0);
    }
    print!("{}", table(&listing.processes, painter));
    Ok(0)
}

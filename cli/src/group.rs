//! `gpumemhook group NAME`: a group's joint figures (`docs/groups.md`), read from its segment
//! through the reader (`gpumemhook_reader::group`), which first sweeps out members that died; and
//! the variables that put a program in a group, for `run` and `fit`.

use std::process::Command;

use anyhow::{Context, Result};
use gpumemhook_reader::group::{self, GroupStats};
use gpumemhook_reader::{env, format_size, process, shm, MAX_DEVICES};

use crate::style::{size_or_dash, Cell, Painter, Style, Table};
use crate::usage::UsageError;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook run --group job -- python server.py &   # two processes of one job...
  gpumemhook run --group job -- python client.py     # ...share one count, peak and ceiling
  gpumemhook group job                               # the job's joint used and peak, per device
  gpumemhook group job --json

JSON: {\"name\", \"path\", \"devices\": [{\"device\", \"used\", \"peak\", \"limit\", \"allocs\", \"frees\",
\"refusals\", \"emulated_total\", \"members\": [{\"pid\", \"bytes\"}]}]}, bytes throughout; a device is
listed once any member touched it.")]
pub struct GroupArgs {
    /// The group's name (GPUMEMHOOK_GROUP, `run --group`).
    pub name: String,
    /// Print JSON (bytes) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The devices any member touched (allocated, was refused, or emulates a card), with their figures.
pub fn devices_of(mapping: &group::GroupMapping) -> Vec<(u32, GroupStats)> {
    (0..MAX_DEVICES as u32)
        .map(|d| (d, mapping.stats(d)))
        .filter(|(_, s)| s.allocs + s.refusals > 0 || s.used > 0 || s.emulated_total.is_some())
        .collect()
}

/// Opens this user's group `name` in the segment directory.
pub fn open(name: &str) -> Result<group::GroupMapping> {
    group::check_name(name).map_err(|e| UsageError(e.to_string()))?;
    group::open(&shm::segment_dir(), process::current_uid(), name)
        .with_context(|| format!("group {name}"))
}

/// The exact joint peak of this user's group `name` on `device`, if the group can be read.
pub fn joint_peak(name: &str, device: u32) -> Option<u64> {
    let mapping = group::open(&shm::segment_dir(), process::current_uid(), name).ok()?;
    Some(mapping.stats(device).peak)
}

/// The largest exact joint peak of this user's group `name` on any device, if the group can be
/// read here (`fit` judges a trial by it).
pub fn largest_joint_peak(name: &str) -> Option<u64> {
    let mapping = group::open(&shm::segment_dir(), process::current_uid(), name).ok()?;
    devices_of(&mapping).iter().map(|(_, s)| s.peak).max()
}

/// Removes this user's group file `name` from the segment directory, if it is there: the group
/// starts afresh (`fit` removes each trial's once the trial is over).
pub fn remove(name: &str) {
    let _ = group::remove(&shm::segment_dir(), process::current_uid(), name);
}

/// Prints the group's figures.
pub fn group(args: GroupArgs, painter: Painter) -> Result<i32> {
    let mapping = open(&args.name)?;
    let devices = devices_of(&mapping);
    if args.json {
        let list: Vec<serde_json::Value> = devices
            .iter()
            .map(|(d, s)| {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                v["device"] = (*d).into();
                v
            })
            .collect();
        let out = serde_json::json!({
            "name": args.name,
            "path": mapping.path(),
            "devices": list,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    let mut t = Table::new(&[
        ("DEVICE", true),
        ("USED", true),
        ("PEAK", true),
        ("LIMIT", true),
        ("ALLOCS", true),
        ("FREES", true),
        ("REFUSED", true),
        ("MEMBERS", false),
    ]);
    for (d, s) in &devices {
        let members: Vec<String> = s
            .members
            .iter()
            .map(|m| format!("{} {}", m.pid, format_size(m.bytes)))
            .collect();
        t.push(vec![
            Cell::right(d.to_string()),
            Cell::right(format_size(s.used)),
            Cell::right(format_size(s.peak)).styled(Style::Name),
            Cell::right(size_or_dash(s.limit.or(s.emulated_total))),
            Cell::right(s.allocs.to_string()),
            Cell::right(s.frees.to_string()),
            Cell::right(s.refusals.to_string()),
            Cell::left(members.join(", ")),
        ]);
    }
    println!("group {} ({})", args.name, mapping.path().display());
    print!("{}", t.render(painter));
    Ok(0)
}

/// Puts the program `command` starts in group `name`, with `limit` as the group's ceiling.
pub fn group_env(command: &mut Command, name: &str, limit: Option<u64>) {
    command.env(env::GROUP, name);
    match limit {
        // Bytes, with their unit: the hook parses exactly what was validated here.
        Some(bytes) => command.env(env::GROUP_LIMIT, format!("{bytes}B")),
        None => command.env_remove(env::GROUP_LIMIT),
    };
}

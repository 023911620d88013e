//! `gpumemhook group NAME`: a group's joint figures (`docs/groups.md`), read from its segment
//! through the reader (`gpumemhook_reader::group`), which first sweeps out members that died; and
//! the variables that put a program in a group, for `run` and `fit`. Its scopes are [`scope`]'s.

mod scope;

use std::process::Command;

use anyhow::{Context, Result};
use gpumemhook_reader::group::{self, GroupStats};
use gpumemhook_reader::{env, format_size, process, shm, Snapshot, MAX_DEVICES};

use crate::style::{size_or_dash, Cell, Painter, Style, Table};
use crate::usage::UsageError;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook run --group job -- python server.py &   # two processes of one job...
  gpumemhook run --group job -- python client.py     # ...share one count, peak and ceiling
  gpumemhook group job                               # the job's joint used and peak, per device
  gpumemhook group job --json
  ID=$(gpumemhook group job scope open warmup)       # the group's peak above now, from any process
  gpumemhook group job scope read $ID
  gpumemhook group job scope reset $ID               # start the window again from now
  gpumemhook group job scope close $ID --json        # the final reading

JSON: {\"name\", \"path\", \"devices\": [{\"device\", \"used\", \"peak\", \"limit\", \"allocs\", \"frees\",
\"refusals\", \"emulated_total\", \"members\": [{\"pid\", \"bytes\"}]}], \"scopes\": [{\"id\", \"label\",
\"device\", \"base\", \"peak\", \"used\", \"delta_peak\", \"delta_used\", \"delta_peaked\",
\"peak_above_used\", \"settled\"}]}, bytes throughout; a device is listed once any member touched
it, a scope while it is open.")]
pub struct GroupArgs {
    /// The group's name (GPUMEMHOOK_GROUP, `run --group`).
    pub name: String,
    /// Print JSON (bytes) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Remove the group's file, once all its members have ended (its figures go with it; the
    /// next job in the group starts afresh either way).
    #[arg(long, conflicts_with = "json")]
    pub remove: bool,
    #[command(subcommand)]
    pub action: Option<GroupAction>,
}

#[derive(clap::Subcommand, Debug)]
pub enum GroupAction {
    /// Group scopes: open one (prints its id), read, reset or close it. A group scope measures the
    /// group's peak above its start, whichever members allocate; it lives until closed.
    #[command(subcommand)]
    Scope(scope::ScopeAction),
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

/// This user's group `name`, if it can be read (for views that show groups beside processes).
fn try_open(name: &str) -> Option<group::GroupMapping> {
    group::open(&shm::segment_dir(), process::current_uid(), name).ok()
}

/// The exact joint peak of this user's group `name` on `device`, if the group can be read.
pub fn joint_peak(name: &str, device: u32) -> Option<u64> {
    Some(try_open(name)?.stats(device).peak)
}

/// One group's figures on one device, for `top`.
pub struct GroupRow {
    pub name: String,
    pub device: u32,
    pub stats: GroupStats,
}

/// The groups the listed processes count in (in name order), one row per device any member
/// touched; groups that cannot be read are left out.
pub fn rows_of(processes: &[Snapshot]) -> Vec<GroupRow> {
    let names: std::collections::BTreeSet<&str> = processes
        .iter()
        .filter_map(|s| s.job.group.as_deref())
        .collect();
    names
        .into_iter()
        .filter_map(|name| Some((name, try_open(name)?)))
        .flat_map(|(name, mapping)| {
            devices_of(&mapping)
                .into_iter()
                .map(move |(device, stats)| GroupRow {
                    name: name.to_string(),
                    device,
                    stats,
                })
        })
        .collect()
}

/// The cells of a group row (`GROUP`, `DEV`, `MEMBERS`, `USED`, `PEAK`, `LIMIT`), as text.
pub fn row_cells(row: &GroupRow) -> [String; 6] {
    let s = &row.stats;
    [
        row.name.clone(),
        row.device.to_string(),
        s.members.len().to_string(),
        format_size(s.used),
        format_size(s.peak),
        size_or_dash(s.limit.or(s.emulated_total)),
    ]
}

/// The column headers of [`row_cells`].
pub const ROW_HEADERS: [&str; 6] = ["GROUP", "DEV", "MEMBERS", "USED", "PEAK", "LIMIT"];

/// The group rows as a plain table (empty when there are none).
pub fn rows_table(rows: &[GroupRow], painter: Painter) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&ROW_HEADERS.map(|h| (h, h != "GROUP")));
    for row in rows {
        let [name, device, members, used, peak, limit] = row_cells(row);
        t.push(vec![
            Cell::left(name),
            Cell::right(device),
            Cell::right(members),
            Cell::right(used),
            Cell::right(peak).styled(Style::Name),
            Cell::right(limit),
        ]);
    }
    t.render(painter)
}

/// The largest exact joint peak of this user's group `name` on any device, if the group can be
/// read here (`fit` judges a trial by it).
pub fn largest_joint_peak(name: &str) -> Option<u64> {
    devices_of(&try_open(name)?)
        .iter()
        .map(|(_, s)| s.peak)
        .max()
}

/// Makes this user's group file `name` in the segment directory (or opens it, if a process was
/// first), so that whatever sits at its name and cannot be trusted is refused here, once, before
/// any process is told to join it (each would otherwise count alone, with one line on stderr).
pub fn create(name: &str) -> Result<()> {
    group::open_or_create(&shm::segment_dir(), process::current_uid(), name)
        .map(drop)
        .with_context(|| format!("cannot make the memory group {name}"))
}

/// Removes this user's group file `name` from the segment directory, if it is there: the group
/// starts afresh (`fit` removes each trial's once the trial is over).
pub fn remove(name: &str) {
    let _ = group::remove(&shm::segment_dir(), process::current_uid(), name);
}

/// Prints the group's figures.
pub fn group(args: GroupArgs, painter: Painter) -> Result<i32> {
    if let Some(GroupAction::Scope(action)) = &args.action {
        return scope::scope(&args.name, action, open);
    }
    let mapping = open(&args.name)?;
    if args.remove {
        return remove_ended(&args.name, &mapping);
    }
    let devices = devices_of(&mapping);
    let scopes = mapping.scopes();
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
            "scopes": scopes.iter().map(scope::scope_json).collect::<Vec<_>>(),
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
    print!("{}", scope::scopes_table(&scopes, painter));
    Ok(0)
}

/// `group NAME --remove`: removes the group's file if no member of it is live.
fn remove_ended(name: &str, mapping: &group::GroupMapping) -> Result<i32> {
    mapping.sweep();
    let live: Vec<String> = (0..MAX_DEVICES as u32)
        .flat_map(|d| mapping.group().stats(d).members)
        .map(|m| m.pid.to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !live.is_empty() {
        anyhow::bail!(
            "group {name} has live members (pid {}): it is removed once they have ended",
            live.join(", ")
        );
    }
    group::remove(&shm::segment_dir(), process::current_uid(), name)
        .with_context(|| format!("cannot remove group {name}"))?;
    println!("removed group {name} ({})", mapping.path().display());
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

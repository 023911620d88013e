//! What every command knows of groups (`docs/groups.md`): opening this user's group by name, its
//! devices' figures, the per-device rows that `top` (and `ls`) show, the joint peak `fit` judges a
//! trial by, making and removing a group's file, and the variables that put a program in a group
//! (`run --group`, `fit`'s trials).

use gpumemhook_reader::{
    check_group_name, current_uid, open_group, open_or_create_group, remove_group, segment_dir,
    GroupMapping,
};
use std::process::Command;

use anyhow::{Context, Result};
use gpumemhook_reader::GroupStats;
use gpumemhook_reader::{env, format_size, Snapshot, MAX_DEVICES};

use crate::style::{size_or_dash, Cell, Painter, Style, Table};
use crate::usage::UsageError;

/// The devices any member touched (allocated, was refused, or emulates a card), with their figures.
pub fn devices_of(mapping: &GroupMapping) -> Vec<(u32, GroupStats)> {
    (0..MAX_DEVICES as u32)
        .map(|d| (d, mapping.stats(d)))
        .filter(|(_, s)| s.allocs + s.refusals > 0 || s.used > 0 || s.emulated_total.is_some())
        .collect()
}

/// Opens this user's group `name` in the segment directory.
pub fn open(name: &str) -> Result<GroupMapping> {
    check_group_name(name).map_err(|e| UsageError(e.to_string()))?;
    open_group(&segment_dir(), current_uid(), name).with_context(|| format!("group {name}"))
}

/// This user's group `name`, if it can be read (for views that show groups beside processes).
fn try_open(name: &str) -> Option<GroupMapping> {
    open_group(&segment_dir(), current_uid(), name).ok()
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
    open_or_create_group(&segment_dir(), current_uid(), name)
        .map(drop)
        .with_context(|| format!("cannot make the memory group {name}"))
}

/// Removes this user's group file `name` from the segment directory, if it is there: the group
/// starts afresh (`fit` removes each trial's once the trial is over).
pub fn remove(name: &str) {
    let _ = remove_group(&segment_dir(), current_uid(), name);
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

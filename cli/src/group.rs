//! `gpumemhook group NAME`: a group's joint figures (`docs/groups.md`), read from its segment
//! through the reader (`gpumemhook_reader::GroupMapping`), which first sweeps out members that
//! died, and `--remove` of an ended group. Its scopes are [`scope`]'s; what other commands know of
//! groups is `crate::groups`'.

mod scope;

use anyhow::{Context, Result};
use gpumemhook_reader::{current_uid, remove_group, segment_dir, GroupMapping};
use gpumemhook_reader::{format_size, MAX_DEVICES};

use crate::groups::{devices_of, open};
use crate::style::{size_or_dash, Cell, Painter, Style, Table};

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
fn remove_ended(name: &str, mapping: &GroupMapping) -> Result<i32> {
    mapping.sweep();
    let live: Vec<String> = (0..MAX_DEVICES as u32)
        .flat_map(|d| gpumemhook_reader::group_stats(mapping.group(), d).members)
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
    remove_group(&segment_dir(), current_uid(), name)
        .with_context(|| format!("cannot remove group {name}"))?;
    println!("removed group {name} ({})", mapping.path().display());
    Ok(0)
}

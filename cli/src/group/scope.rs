//! `gpumemhook group NAME scope open|read|reset|close`: group scopes (`docs/groups.md`), the group's
//! peak above a start, from any process. The protocol is the segment crate's, what users ask of it
//! the reader's (`GroupScopes`); this module plans a request from the arguments, executes
//! it on the group's segment, and presents the outcome as text or JSON.

use anyhow::Result;
use gpumemhook_reader::check_device;
use gpumemhook_reader::format_size;
use gpumemhook_reader::GroupMapping;
use gpumemhook_reader::GroupScope;

use crate::style::{Cell, Painter, Style, Table};
use crate::usage::UsageError;

#[derive(clap::Subcommand, Debug)]
pub enum ScopeAction {
    /// Open a scope on the group (it lives until closed, whoever opened it); prints its id.
    Open {
        /// A label to tell it by in `gpumemhook group NAME`.
        label: Option<String>,
        /// The device it measures.
        #[arg(long, short, default_value_t = 0)]
        device: u32,
    },
    /// Read an open scope: the group's peak and use above its start.
    Read {
        id: u64,
        /// Print JSON (bytes).
        #[arg(long)]
        json: bool,
    },
    /// Restart an open scope from the group's use now (base and peak drop to it).
    Reset { id: u64 },
    /// Close a scope; prints its final reading.
    Close {
        id: u64,
        /// Print JSON (bytes).
        #[arg(long)]
        json: bool,
    },
}

/// Maps this user's group of a name (the parent module's `open`, passed in: this module is its
/// child and does not name it back).
pub type Opener = fn(&str) -> Result<GroupMapping>;

/// What one call asks of the group.
struct ScopePlan<'a> {
    group: &'a str,
    action: &'a ScopeAction,
    open: Opener,
}

/// What the group answered.
enum Outcome {
    Opened(u64),
    /// A reading: of a scope just reset, read, or closed (then it is final).
    Reading {
        scope: GroupScope,
        verb: &'static str,
    },
}

fn plan<'a>(group: &'a str, action: &'a ScopeAction, open: Opener) -> Result<ScopePlan<'a>> {
    if let ScopeAction::Open { device, .. } = action {
        check_device(*device).map_err(|e| UsageError(e.to_string()))?;
    }
    Ok(ScopePlan {
        group,
        action,
        open,
    })
}

fn execute(plan: &ScopePlan) -> Result<Outcome> {
    // The reader's errors name the group and the scope already.
    let mapping = (plan.open)(plan.group)?;
    Ok(match plan.action {
        ScopeAction::Open { label, device } => {
            Outcome::Opened(mapping.open_scope(label.as_deref().unwrap_or(""), *device)?)
        }
        ScopeAction::Read { id, .. } => Outcome::Reading {
            scope: mapping.read_scope(*id)?,
            verb: "open",
        },
        ScopeAction::Reset { id } => {
            mapping.reset_scope(*id)?;
            Outcome::Reading {
                scope: mapping.read_scope(*id)?,
                verb: "reset",
            }
        }
        ScopeAction::Close { id, .. } => Outcome::Reading {
            scope: mapping.close_scope(*id)?,
            verb: "closed",
        },
    })
}

/// A scope's reading as JSON: bytes, with the deltas.
pub fn scope_json(s: &GroupScope) -> serde_json::Value {
    let r = &s.reading;
    serde_json::json!({
        "id": s.id,
        "label": s.label,
        "device": r.device,
        "base": r.base,
        "peak": r.peak,
        "used": r.used,
        "delta_peak": r.delta_peak(),
        "delta_used": r.delta_used(),
        "delta_peaked": r.delta_peaked(),
        "peak_above_used": r.peak_above_used(),
        "settled": s.settled,
    })
}

/// A signed size for people: `+1.00 MiB`, `-1.00 MiB`, `0 B`.
fn signed_size(delta: i64) -> String {
    let size = format_size(delta.unsigned_abs());
    match delta.signum() {
        1 => format!("+{size}"),
        -1 => format!("-{size}"),
        _ => size,
    }
}

fn present(plan: &ScopePlan, outcome: &Outcome) -> Result<()> {
    let json = matches!(
        plan.action,
        ScopeAction::Read { json: true, .. } | ScopeAction::Close { json: true, .. }
    );
    match outcome {
        Outcome::Opened(id) => println!("{id}"),
        Outcome::Reading { scope, verb } if json => {
            let mut v = scope_json(scope);
            v["group"] = plan.group.into();
            v["state"] = (*verb).into();
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Outcome::Reading { scope, verb } => {
            let r = &scope.reading;
            println!(
                "group {} scope {}{} on device {} ({verb}): peak {} above its start, used {} \
                 (base {}, peak {}, used {})",
                plan.group,
                scope.id,
                label_suffix(&scope.label),
                r.device,
                format_size(r.delta_peak()),
                signed_size(r.delta_used()),
                format_size(r.base),
                format_size(r.peak),
                format_size(r.used),
            );
        }
    }
    Ok(())
}

fn label_suffix(label: &str) -> String {
    if label.is_empty() {
        String::new()
    } else {
        format!(" {label:?}")
    }
}

/// Runs `gpumemhook group NAME scope ...`.
pub fn scope(group: &str, action: &ScopeAction, open: Opener) -> Result<i32> {
    let plan = plan(group, action, open)?;
    let outcome = execute(&plan)?;
    present(&plan, &outcome)?;
    Ok(0)
}

/// The open scopes, as a table under `gpumemhook group NAME` (empty when none is open).
pub fn scopes_table(scopes: &[GroupScope], painter: Painter) -> String {
    if scopes.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&[
        ("SCOPE", true),
        ("LABEL", false),
        ("DEVICE", true),
        ("BASE", true),
        ("PEAK", true),
        ("DELTA PEAK", true),
        ("DELTA USED", true),
    ]);
    for s in scopes {
        let r = &s.reading;
        let label = if s.settled {
            s.label.clone()
        } else {
            // An open or reset under way (or left by an actor that died: the next scope call
            // finishes it).
            format!("{} (opening)", s.label)
        };
        t.push(vec![
            Cell::right(s.id.to_string()),
            Cell::left(label),
            Cell::right(r.device.to_string()),
            Cell::right(format_size(r.base)),
            Cell::right(format_size(r.peak)),
            Cell::right(format_size(r.delta_peak())).styled(Style::Name),
            Cell::right(signed_size(r.delta_used())),
        ]);
    }
    t.render(painter)
}

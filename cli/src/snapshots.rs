//! Reading what a run left: an exit report (or an out-of-memory report, or one item of `ls
//! --json`) into a [`Snapshot`], the one parser that `report` and `view` share; and a timeline
//! file, read as it streams ([`load_timeline`], [`timeline_of`]) for `report`, `view`, `plot` and
//! `run`.

use anyhow::{bail, Context, Result};
use gpumemhook_reader::{read_chrome_trace_from, Snapshot, Timeline};
use serde_json::Value;
use std::path::Path;

/// Reads the timeline at `path` as it streams (one event at a time: memory holds the timeline's
/// figures, not the file), with errors that say what is wrong with it.
pub fn load_timeline(path: &Path) -> Result<Timeline> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read the trace {}", path.display()))?;
    read_chrome_trace_from(std::io::BufReader::with_capacity(1 << 20, file))
        .with_context(|| format!("{} is not a gpumemhook timeline", path.display()))
}

/// The timeline at `path`, when it holds one; `None` for anything else (a report, a file that is
/// not JSON, one that cannot be read), which the caller then reads as it did before timelines
/// streamed and explains.
pub fn timeline_of(path: &Path) -> Option<Timeline> {
    load_timeline(path).ok()
}

/// Reads one report. Only `pid`, `devices` and each device's `device`, `used` and `peak` are
/// required (reader/src/snapshot.rs gives every other field a default); a report without them is
/// refused naming what is missing.
pub fn parse_snapshot(v: Value) -> Result<Snapshot> {
    if !v.is_object() {
        bail!(
            "not a gpumemhook exit report: expected a JSON object, found {}",
            json_kind(&v)
        );
    }
    serde_json::from_value(v).map_err(|e| {
        anyhow::anyhow!(
            "not a gpumemhook exit report ({e}); a report needs at least \"pid\" and \"devices\", \
             each device with \"device\", \"used\" and \"peak\" (docs/report-format.md)"
        )
    })
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

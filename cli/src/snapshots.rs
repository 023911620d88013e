//! Reading an exit report (or an out-of-memory report, or one item of `ls --json`) into a
//! [`Snapshot`]: the one parser that `report` and `view` share.

use anyhow::{bail, Result};
use gpumemhook_reader::Snapshot;
use serde_json::Value;

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

//! Reading what a run left: an exit report (or an out-of-memory report, or one item of `ls
//! --json`) into a [`Snapshot`], the one parser that `report` and `view` share; a timeline file,
//! read as it streams ([`load_timeline`]) for `report`, `view`, `plot` and `run`; and telling the
//! two apart ([`read_run_file`]).

use anyhow::{bail, Context, Result};
use gpumemhook_reader::Snapshot;
use gpumemhook_timeline::{
    is_recording, read_chrome_trace, read_chrome_trace_from, read_recording,
    write_recording_as_chrome, Keep, Timeline,
};
use serde_json::Value;
use std::path::Path;

/// Reads the timeline at `path` as it streams (one event at a time: memory holds the timeline's
/// figures, not the file): the flight recorder's file, or the Chrome JSON of earlier versions
/// (and of `export --chrome`), with errors that say what is wrong with it.
pub fn load_timeline(path: &Path, keep: Keep) -> Result<Timeline> {
    if is_recording(path) {
        return read_recording(path, keep)
            .with_context(|| format!("cannot read the timeline {}", path.display()));
    }
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read the trace {}", path.display()))?;
    read_chrome_trace_from(std::io::BufReader::with_capacity(1 << 20, file))
        .with_context(|| format!("{} is not a gpumemhook timeline", path.display()))
}

/// Writes the timeline at `input` as Chrome JSON into `out`: a recording converted event by event,
/// a Chrome timeline of an earlier version copied as it is.
pub fn copy_as_chrome(input: &Path, out: &mut dyn std::io::Write) -> Result<()> {
    if is_recording(input) {
        return write_recording_as_chrome(input, out)
            .with_context(|| format!("cannot convert {}", input.display()));
    }
    let mut file =
        std::fs::File::open(input).with_context(|| format!("cannot read {}", input.display()))?;
    std::io::copy(&mut file, out).with_context(|| format!("copying {}", input.display()))?;
    Ok(())
}

/// What one file of a run holds, as `report` and `view` take it.
pub enum RunFile {
    Timeline(Box<Timeline>),
    /// Any other JSON: a report, an out-of-memory report, `ls --json`'s list.
    Json(Value),
}

/// Reads the file at `path`: a timeline as it streams; anything else whole, as JSON, with errors
/// that name the file (JSON with a `traceEvents` list the timeline reader refused gets its reason).
/// A pipe or a device (`report <(cat r.json)`) can be read only once, so it is read whole first.
pub fn read_run_file(path: &Path, keep: Keep) -> Result<RunFile> {
    let label = path.display();
    let read_whole =
        || std::fs::read_to_string(path).with_context(|| format!("cannot read {label}"));
    let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    if regular && is_recording(path) {
        return Ok(RunFile::Timeline(Box::new(load_timeline(path, keep)?)));
    }
    let (refused, text) = if regular {
        match load_timeline(path, keep) {
            Ok(t) => return Ok(RunFile::Timeline(Box::new(t))),
            Err(why) => (why, read_whole()?),
        }
    } else {
        let text = read_whole()?;
        match read_chrome_trace(&text) {
            Ok(t) => return Ok(RunFile::Timeline(Box::new(t))),
            Err(why) => (
                anyhow::Error::new(why).context(format!("{label} is not a gpumemhook timeline")),
                text,
            ),
        }
    };
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{label} is not JSON: not a gpumemhook report or timeline"))?;
    if value.get("traceEvents").is_some() {
        return Err(refused);
    }
    Ok(RunFile::Json(value))
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

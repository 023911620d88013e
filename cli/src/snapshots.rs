//! Reading what a run left: an exit report (or an out-of-memory report, or one item of `ls
//! --json`) into a [`Snapshot`], the one parser that `report` and `view` share; a timeline file,
//! read as it streams ([`load_timeline`]) for `report`, `view`, `plot` and `run`, a long one in
//! bounded memory for `plot` and `view` ([`load_bounded`]); and telling the two apart
//! ([`read_run_file`]).

use anyhow::{bail, Context, Result};
use gpumemhook_reader::Snapshot;
use gpumemhook_timeline::{
    read_chrome_trace_from, read_recording, read_recording_reduced, write_recording_as_chrome,
    Keep, Reduction, Timeline, REDUCE_ABOVE_EVENTS,
};
use serde_json::Value;
use std::io::Read;
use std::path::Path;

use crate::input::{Format, Input};

/// The longest JSON that is read whole (an exit report, `ls --json`'s list): a longer one can
/// only be a timeline, which is read as it streams.
const WHOLE_JSON_BYTES: u64 = 64 << 20;

/// Reads the timeline at `path` as it streams (one event at a time: memory holds the timeline's
/// figures, not the file): the flight recorder's file, or the Chrome JSON of earlier versions
/// (and of `export --chrome`), with errors that say what is wrong with it.
pub fn load_timeline(path: &Path, keep: Keep) -> Result<Timeline> {
    let input = Input::open(path)?;
    load_opened(path, input, keep, None)
}

/// How `plot` and `view` reduce a long recording, given a first reading of it ([`Keep::Peaks`]):
/// the columns its curves are reduced to and the moments whose allocations are kept.
pub type Reduce<'a> = Option<&'a mut dyn FnMut(Timeline) -> Result<Reduction>>;

/// [`load_timeline`] in bounded memory whatever the timeline's length (`plot`, `view`): a
/// recording in a regular file of more than [`REDUCE_ABOVE_EVENTS`] events is read twice, first
/// for its span and figures, then reduced as `reduce` says of that first reading; any other
/// timeline as `keep` says.
pub fn load_bounded(path: &Path, keep: Keep, reduce: Reduce) -> Result<Timeline> {
    let input = Input::open(path)?;
    load_opened(path, input, keep, reduce)
}

/// [`load_timeline`] of a file already opened and recognised.
fn load_opened(path: &Path, input: Input, keep: Keep, reduce: Reduce) -> Result<Timeline> {
    let context = || format!("cannot read the timeline {}", path.display());
    if input.format == Format::Recording {
        if let (Some(reduce), true) = (reduce, input.regular) {
            let first = read_recording(path, Keep::Peaks).with_context(context)?;
            if first.events > REDUCE_ABOVE_EVENTS {
                return read_recording_reduced(path, reduce(first)?).with_context(context);
            }
        }
        return read_recording(path, keep).with_context(context);
    }
    read_chrome_trace_from(std::io::BufReader::with_capacity(
        1 << 20,
        input.into_reader(),
    ))
    .with_context(|| format!("{} is not a gpumemhook timeline", path.display()))
}

/// Writes the timeline at `input` as Chrome JSON into `out`: a recording converted event by event,
/// a Chrome timeline of an earlier version copied as it is.
pub fn copy_as_chrome(path: &Path, out: &mut dyn std::io::Write) -> Result<()> {
    let input = Input::open(path)?;
    if input.format == Format::Recording {
        return write_recording_as_chrome(path, out)
            .with_context(|| format!("cannot convert {}", path.display()));
    }
    std::io::copy(&mut input.into_reader(), out)
        .with_context(|| format!("copying {}", path.display()))?;
    Ok(())
}

/// What one file of a run holds, as `report` and `view` take it.
pub enum RunFile {
    Timeline(Box<Timeline>),
    /// Any other JSON: a report, an out-of-memory report, `ls --json`'s list.
    Json(Value),
}

/// Reads the file at `path`, recognised by its first bytes: a timeline as it streams; other JSON
/// whole (up to [`WHOLE_JSON_BYTES`]), with errors that name the file (JSON with a `traceEvents`
/// list the timeline reader refused gets its reason). A pipe or a device (`report <(cat r.json)`)
/// can be read only once: what the timeline reader takes of it is kept (up to
/// [`WHOLE_JSON_BYTES`]) to be read as other JSON when it is no timeline.
pub fn read_run_file(path: &Path, keep: Keep, reduce: Reduce) -> Result<RunFile> {
    let label = path.display();
    let input = Input::open(path)?;
    if input.format == Format::Recording {
        return Ok(RunFile::Timeline(Box::new(load_opened(
            path, input, keep, reduce,
        )?)));
    }
    let not_a_timeline = || format!("{label} is not a gpumemhook timeline");
    let (refused, bytes) = if input.regular {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        match load_opened(path, input, keep, None) {
            Ok(t) => return Ok(RunFile::Timeline(Box::new(t))),
            Err(why) if size > WHOLE_JSON_BYTES => return Err(why),
            Err(why) => (why, read_whole(path)?),
        }
    } else {
        let mut kept = Kept {
            inner: input.into_reader(),
            kept: Vec::new(),
            full: false,
        };
        match read_chrome_trace_from(std::io::BufReader::with_capacity(1 << 20, &mut kept)) {
            Ok(t) => return Ok(RunFile::Timeline(Box::new(t))),
            Err(why) if kept.full => return Err(anyhow::Error::new(why).context(not_a_timeline())),
            Err(why) => (anyhow::Error::new(why).context(not_a_timeline()), kept.kept),
        }
    };
    let value: Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{label} is not JSON: not a gpumemhook report or timeline"))?;
    if value.get("traceEvents").is_some() {
        return Err(refused);
    }
    Ok(RunFile::Json(value))
}

/// The regular file at `path`, whole (it is at most [`WHOLE_JSON_BYTES`] long).
fn read_whole(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    Input::open(path)?
        .into_reader()
        .take(WHOLE_JSON_BYTES)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(bytes)
}

/// A reader that keeps a copy of the first [`WHOLE_JSON_BYTES`] it passes on (`full` once more
/// went through, the copy then dropped).
struct Kept<R> {
    inner: R,
    kept: Vec<u8>,
    full: bool,
}

impl<R: Read> Read for Kept<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if !self.full {
            if (self.kept.len() + n) as u64 > WHOLE_JSON_BYTES {
                self.full = true;
                self.kept = Vec::new();
            } else {
                self.kept.extend_from_slice(&buf[..n]);
            }
        }
        Ok(n)
    }
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

//! The self-contained HTML page of a run (a timeline, an exit report, an out-of-memory report or a
//! live pid), or of two runs side by side, as `view` and `run --html` write it: what each argument
//! is ([`load`]), [`data`] builds the page's data, [`html`] writes the page around it.

mod data;
mod html;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;

use crate::snapshots::{read_run_file, RunFile};
use crate::usage::UsageError;
pub use data::PageData;
use data::RunData;

/// Writes the page of the timeline at `trace` to `output` (`run --html`), naming the run `label`.
pub fn write_timeline_page(trace: &Path, label: String, output: &Path) -> Result<()> {
    let mut run = load_file(trace)?;
    run.label = label;
    write(output, PageData::new(vec![run]))
}

/// Checks, before a run, that `run --html FILE` will be able to write FILE.
pub fn check_output(output: &Path) -> Result<()> {
    crate::launch::check_writable("--html", output)
}

/// Writes the page of `data` to `output`.
pub fn write(output: &Path, data: PageData) -> Result<()> {
    let html = html::render(&data)?;
    gpumemhook_reader::write_file(output, |out| out.write_all(html.as_bytes()))
        .with_context(|| format!("cannot write {}", output.display()))
}

/// A run named on the command line: a file when one is there, else a pid.
pub fn load(run: &str) -> Result<RunData> {
    let path = Path::new(run);
    if !path.exists() {
        if let Ok(pid) = run.parse::<u32>() {
            let snapshot = crate::processes::attach(pid)?.snapshot();
            return Ok(data::from_snapshot(format!("pid {pid}"), "live", snapshot));
        }
        return Err(UsageError(format!("{run}: no such file, and not a pid")).into());
    }
    load_file(path)
}

fn load_file(path: &Path) -> Result<RunData> {
    let label = path.display().to_string();
    let value = match read_run_file(path, gpumemhook_reader::Keep::Everything)? {
        RunFile::Timeline(t) => return Ok(data::from_timeline(label, &t)),
        RunFile::Json(value) => value,
    };
    let report = match value {
        Value::Array(mut items) if items.len() == 1 => items.remove(0),
        Value::Array(items) => bail!(
            "{label} holds {} reports: `view` draws one process (pass a single report)",
            items.len()
        ),
        other => other,
    };
    let snapshot = crate::snapshots::parse_snapshot(report).with_context(|| label.clone())?;
    let source = if snapshot.oom.is_some() {
        "oom"
    } else {
        "report"
    };
    Ok(data::from_snapshot(label, source, snapshot))
}

//! The self-contained HTML page of a run (a timeline, an exit report, an out-of-memory report or a
//! live pid), or of two runs side by side, as `view` and `run --html` write it: what each argument
//! is ([`load`]), [`data`] builds the page's data, [`html`] writes the page around it.

mod data;
mod html;
mod job;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;

use crate::snapshots::{read_run_file, RunFile};
use crate::usage::UsageError;
pub use data::PageData;
use data::RunData;
pub use job::{job_page, one_job, JobRun};

/// Writes the page of the processes whose timelines are at `traces` (`run --html`), each named
/// `pid N`: of one process, or of all of them as one job, a lane each. A timeline that cannot be
/// read is said and left out; one without device memory (a launcher that traced no allocation)
/// too, unless none has any. Returns how many processes the page draws.
pub fn write_run_page(traces: &[&Path], output: &Path) -> Result<usize> {
    let mut runs = Vec::new();
    for path in traces {
        match load_timeline_run(path) {
            Ok(mut run) => {
                run.run.label = format!("pid {}", run.run.pid);
                runs.push(run);
            }
            Err(e) if traces.len() == 1 => return Err(e),
            Err(e) => sayln!("gpumemhook: the page leaves out {}: {e:#}", path.display()),
        }
    }
    if runs.iter().any(|r| !r.run.devices.is_empty()) {
        runs.retain(|r| !r.run.devices.is_empty());
    }
    let drawn = runs.len();
    let data = match drawn {
        0 => bail!("no timeline could be read"),
        1 => PageData::new(vec![runs.remove(0).run]),
        _ => job_page(runs),
    };
    write(output, data)?;
    Ok(drawn)
}

/// The timeline at `path` as a run of a job.
fn load_timeline_run(path: &Path) -> Result<JobRun> {
    let mut t = crate::snapshots::load_timeline(path, gpumemhook_timeline::Keep::Everything)?;
    gpumemhook_timeline::fill_overwritten(&mut t);
    Ok(JobRun {
        run: data::from_timeline(path.display().to_string(), &t),
        info: t.info.clone(),
        cut_short: t.cut_short,
    })
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

/// A run named on the command line, as `view` takes it: a timeline (with its job labels, host and
/// clock), or anything else as its page's data.
pub enum Loaded {
    Timeline(Box<JobRun>),
    Other(Box<RunData>),
}

impl Loaded {
    /// Its page's data, whatever it was.
    pub fn into_run(self) -> RunData {
        match self {
            Loaded::Timeline(t) => t.run,
            Loaded::Other(run) => *run,
        }
    }
}

/// A run named on the command line: a file when one is there, else a pid.
pub fn load(run: &str) -> Result<Loaded> {
    let path = Path::new(run);
    if !path.exists() {
        if let Ok(pid) = run.parse::<u32>() {
            let snapshot = crate::processes::attach(pid)?.snapshot();
            return Ok(Loaded::Other(Box::new(data::from_snapshot(
                format!("pid {pid}"),
                "live",
                snapshot,
            ))));
        }
        return Err(UsageError(format!("{run}: no such file, and not a pid")).into());
    }
    load_file(path)
}

fn load_file(path: &Path) -> Result<Loaded> {
    let label = path.display().to_string();
    let value = match read_run_file(path, gpumemhook_timeline::Keep::Everything)? {
        RunFile::Timeline(t) => {
            return Ok(Loaded::Timeline(Box::new(JobRun {
                run: data::from_timeline(label, &t),
                info: t.info.clone(),
                cut_short: t.cut_short,
            })))
        }
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
    Ok(Loaded::Other(Box::new(data::from_snapshot(
        label, source, snapshot,
    ))))
}

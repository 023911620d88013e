//! The self-contained HTML page of a run (a timeline, an exit report, an out-of-memory report or a
//! live pid), or of two runs side by side, as `view` and `run --html` write it: what each argument
//! is ([`load`]), [`data`] builds the page's data, [`html`] writes the page around it.

mod data;
mod html;
mod job;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;

use crate::snapshots::{load_bounded, read_run_file, RunFile};
use crate::usage::UsageError;
pub use data::PageData;
use data::RunData;
use gpumemhook_timeline::{Columns, Keep, Reduction, Timeline};
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
    let mut t = load_bounded(path, Keep::Everything, Some(&mut reduction))?;
    gpumemhook_timeline::fill_overwritten(&mut t);
    Ok(JobRun {
        run: data::from_timeline(path.display().to_string(), &t),
        info: t.info.clone(),
        cut_short: t.cut_short,
    })
}

/// Columns of time a long recording's curves are reduced to on its page: more than the pixels of a
/// wide screen, so that the whole run is drawn exactly (a zoom into a few columns draws them as
/// steps, as the page says).
const PAGE_COLUMNS: u32 = 4000;

/// Moments spread evenly over a long recording whose live allocations its page keeps, besides each
/// device's peak and the end: a click picks the moment nearest, as the page says.
const PAGE_MOMENTS: u32 = 1000;

/// How a long recording is reduced for its page, given a first reading of it: its curves to
/// [`PAGE_COLUMNS`] columns of the whole run, every module's curve too, and its allocations to
/// those live at [`PAGE_MOMENTS`] moments, at each device's peak (since a restart, and over the
/// run) and at the end.
fn reduction(mut first: Timeline) -> Result<Reduction> {
    gpumemhook_timeline::fill_overwritten(&mut first);
    let (lo, hi) = gpumemhook_timeline::time_span(&first).unwrap_or((0.0, 0.0));
    let (devices, _) = gpumemhook_timeline::replay(&first);
    let step = (hi - lo) / f64::from(PAGE_MOMENTS);
    let mut moments: Vec<f64> = (1..=PAGE_MOMENTS)
        .map(|i| lo + step * f64::from(i))
        .chain(devices.iter().flat_map(|d| [d.peak_ts, d.run_peak.1]))
        .collect();
    moments.sort_by(f64::total_cmp);
    moments.dedup();
    Ok(Reduction {
        columns: Columns {
            from: lo,
            to: hi,
            count: PAGE_COLUMNS,
        },
        modules: true,
        moments: Some(moments),
        cuts: Vec::new(),
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
    let value = match read_run_file(path, Keep::Everything, Some(&mut reduction))? {
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

//! `gpumemhook view RUN [RUN2] -o run.html`: one self-contained HTML page of a run (a timeline, an
//! exit report, an out-of-memory report or a live pid), or of two runs side by side. Planning here
//! (what each argument is), [`data`] builds the page's data, [`page`] writes the page around it.

mod data;
mod page;

use anyhow::{bail, Context, Result};
use gpumemhook_reader::trace::read_chrome_trace;
use serde_json::Value;
use std::path::{Path, PathBuf};

use crate::usage::UsageError;
use data::{PageData, RunData};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook run --trace t.json -- python train.py && gpumemhook view t.json -o run.html
  gpumemhook run --html run.html -- python train.py   # the same in one step
  gpumemhook view oom.json -o oom.html                 # an out-of-memory report
  gpumemhook view 4242 -o now.html                     # a live process (no timeline: its figures now)
  gpumemhook view before.json after.json -o diff.html  # two runs side by side

The page has no network access: its script and style are inline, so it opens from a shared disk or
a CI artifact.")]
pub struct ViewArgs {
    /// A timeline (GPUMEMHOOK_TRACE / run --trace), an exit report, an out-of-memory report, or the
    /// pid of a live hooked process; a second one to compare the two.
    #[arg(required = true, num_args = 1..=2, value_name = "RUN")]
    pub runs: Vec<String>,
    /// The HTML file to write.
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
}

pub fn view(args: ViewArgs) -> Result<i32> {
    crate::launch::check_writable("-o", &args.output)?;
    let runs = args
        .runs
        .iter()
        .map(|run| load(run))
        .collect::<Result<Vec<_>>>()?;
    write(&args.output, PageData { runs })?;
    eprintln!("gpumemhook: wrote {}", args.output.display());
    Ok(0)
}

/// Writes the page of the timeline at `trace` to `output` (`run --html`), naming the run `label`.
pub fn write_timeline_page(trace: &Path, label: String, output: &Path) -> Result<()> {
    let mut run = load_file(trace)?;
    run.label = label;
    write(output, PageData { runs: vec![run] })
}

/// Checks, before a run, that `run --html FILE` will be able to write FILE.
pub fn check_output(output: &Path) -> Result<()> {
    crate::launch::check_writable("--html", output)
}

fn write(output: &Path, data: PageData) -> Result<()> {
    let html = page::render(&data)?;
    gpumemhook_reader::output::write_file(output, |out| out.write_all(html.as_bytes()))
        .with_context(|| format!("cannot write {}", output.display()))
}

/// A file when one is there, else a pid.
fn load(run: &str) -> Result<RunData> {
    let path = Path::new(run);
    if !path.exists() {
        if let Ok(pid) = run.parse::<u32>() {
            let snapshot = crate::list::attach(pid)?.snapshot();
            return Ok(data::from_snapshot(format!("pid {pid}"), "live", snapshot));
        }
        return Err(UsageError(format!("{run}: no such file, and not a pid")).into());
    }
    load_file(path)
}

fn load_file(path: &Path) -> Result<RunData> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {label}"))?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{label} is not JSON: not a gpumemhook report or timeline"))?;
    if value.get("traceEvents").is_some() {
        drop(value);
        let t = read_chrome_trace(&text)
            .with_context(|| format!("{label} is not a gpumemhook timeline"))?;
        return Ok(data::from_timeline(label, &t));
    }
    let report = match value {
        Value::Array(mut items) if items.len() == 1 => items.remove(0),
        Value::Array(items) => bail!(
            "{label} holds {} reports: `view` draws one process (pass a single report)",
            items.len()
        ),
        other => other,
    };
    let snapshot = crate::report::parse_snapshot(report).with_context(|| label.clone())?;
    let source = if snapshot.oom.is_some() {
        "oom"
    } else {
        "report"
    };
    Ok(data::from_snapshot(label, source, snapshot))
}

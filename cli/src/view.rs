//! `gpumemhook view RUN [RUN2] -o run.html`: one self-contained HTML page of a run (a timeline, an
//! exit report, an out-of-memory report or a live pid), or of two runs side by side; the page
//! itself is `crate::page`'s, which `run --html` writes too.

use anyhow::Result;
use std::path::PathBuf;

use crate::page::{load, write, PageData};

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
    write(&args.output, PageData::new(runs))?;
    eprintln!("gpumemhook: wrote {}", args.output.display());
    Ok(0)
}

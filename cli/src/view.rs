//! `gpumemhook view RUN [RUN...] -o run.html`: one self-contained HTML page of a run (a timeline,
//! an exit report, an out-of-memory report or a live pid), of two runs side by side, or of the
//! processes of one job (several timelines, one lane each, on one time axis); the page itself is
//! `crate::page`'s, which `run --html` writes too.

use anyhow::Result;
use std::path::PathBuf;

use crate::page::{job_page, load, one_job, write, Loaded, PageData};
use crate::usage::UsageError;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook run --trace t.trace -- python train.py && gpumemhook view t.trace -o run.html
  gpumemhook run --html run.html -- python train.py   # the same in one step
  gpumemhook view oom.json -o oom.html                 # an out-of-memory report
  gpumemhook view 4242 -o now.html                     # a live process (no timeline: its figures now)
  gpumemhook view before.json after.json -o diff.html  # two runs side by side
  gpumemhook run --trace 't.%p.trace' -- torchrun --nproc-per-node 4 train.py
  gpumemhook view t.*.trace -o job.html                # every rank of the job on one page

Two timelines are one job (one page, a lane each) when they overlap in time on one clock, or hold
different ranks with a job label in common; else two runs compared. --together and --compare say
which. Three or more are always one job.

The page has no network access: its script and style are inline, so it opens from a shared disk or
a CI artifact.")]
pub struct ViewArgs {
    /// A timeline (GPUMEMHOOK_TRACE / run --trace), an exit report, an out-of-memory report, or the
    /// pid of a live hooked process; a second one to compare the two; or the timelines of the
    /// processes of one job (one per rank).
    #[arg(required = true, num_args = 1.., value_name = "RUN")]
    pub runs: Vec<String>,
    /// The HTML file to write.
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
    /// Draw the timelines as the processes of one job (a lane each, one time axis), whatever their
    /// clocks and labels say.
    #[arg(long, conflicts_with = "compare")]
    pub together: bool,
    /// Compare the two runs side by side, even when they look like two processes of one job.
    #[arg(long)]
    pub compare: bool,
}

pub fn view(args: ViewArgs) -> Result<i32> {
    crate::launch::check_writable("-o", &args.output)?;
    if args.compare && args.runs.len() != 2 {
        return Err(UsageError(format!(
            "--compare compares two runs; {} given",
            args.runs.len()
        ))
        .into());
    }
    let loaded = args
        .runs
        .iter()
        .map(|run| load(run))
        .collect::<Result<Vec<_>>>()?;
    let together = match (loaded.as_slice(), args.together) {
        (_, true) | ([_, _, _, ..], false) => {
            if let Some(i) = loaded
                .iter()
                .position(|l| !matches!(l, Loaded::Timeline(_)))
            {
                return Err(UsageError(format!(
                    "{}: not a timeline; a page of several processes of one job draws their \
                     timelines (GPUMEMHOOK_TRACE, run --trace 't.%p.trace'); `view A B` compares two \
                     runs of any kind",
                    args.runs[i]
                ))
                .into());
            }
            true
        }
        ([Loaded::Timeline(a), Loaded::Timeline(b)], false) => !args.compare && one_job(a, b),
        _ => false,
    };
    let data = if together {
        let mut runs: Vec<_> = loaded
            .into_iter()
            .filter_map(|l| match l {
                Loaded::Timeline(t) => Some(*t),
                Loaded::Other(_) => None,
            })
            .collect();
        // A launcher's timeline (torchrun's own process) holds no device memory: no lane.
        if runs.iter().any(|r| !r.run.devices.is_empty()) {
            runs.retain(|r| {
                let kept = !r.run.devices.is_empty();
                if !kept {
                    sayln!(
                        "gpumemhook: {} recorded no device memory: left out of the page",
                        r.run.label
                    );
                }
                kept
            });
        }
        job_page(runs)
    } else {
        PageData::new(loaded.into_iter().map(Loaded::into_run).collect())
    };
    let what = match &data.job {
        Some(job) => format!(
            " ({} processes of one job, on {})",
            data.runs.len(),
            match job.clock {
                "monotonic" => "one machine's clock",
                "wall" => "the wall clock",
                _ => "their own clocks, not lined up",
            }
        ),
        None if data.runs.len() == 2 => " (two runs compared)".to_string(),
        None => String::new(),
    };
    write(&args.output, data)?;
    sayln!("gpumemhook: wrote {}{what}", args.output.display());
    Ok(0)
}

//! `gpumemhook report FILE`: prints an exit report (`GPUMEMHOOK_REPORT`) for people. It also reads
//! the output of `ls --json` (a list of the same snapshots) and timelines (`GPUMEMHOOK_TRACE`), whose
//! events it replays to the same figures (`--json`: in the exit report's shape, the timeline
//! crate's `recording_json`).

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::PathBuf;

use crate::snapshots::{parse_snapshot, read_run_file, RunFile};
use crate::style::Painter;
use crate::summary::{snapshot_summary, timeline_summary, Detail, Ending};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook report mem.json                 # an exit report (GPUMEMHOOK_REPORT / run --report)
  gpumemhook report mem.trace                # a timeline, replayed to the same figures
  gpumemhook report --json mem.trace         # and as the exit report's JSON
  gpumemhook report --by-site mem.json       # and bytes held and peak per Python call site
  gpumemhook ls --json > now.json && gpumemhook report now.json")]
pub struct ReportArgs {
    /// Exit reports, `ls --json` outputs, or timelines.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print the report as JSON (normalised: every field, sizes in bytes) instead; a timeline's
    /// figures in the exit report's shape, with a `replayed` object (the file, whether it was cut
    /// short, events lost, every scope).
    #[arg(long)]
    pub json: bool,
    /// Also print device memory by Python call site: bytes held and peak per site (a report of a
    /// program run with GPUMEMHOOK_STACKS=python:<min bytes>).
    #[arg(long)]
    pub by_site: bool,
}

pub fn report(args: ReportArgs, painter: Painter) -> Result<i32> {
    let mut out = String::new();
    let mut json = Vec::new();
    for (i, path) in args.files.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
        if args.json && regular && gpumemhook_timeline::is_recording(path) {
            json.push(
                gpumemhook_timeline::recording_json(path)
                    .with_context(|| format!("cannot read the timeline {}", path.display()))?,
            );
            continue;
        }
        let value = match read_run_file(path, gpumemhook_timeline::Keep::Peaks, None)? {
            RunFile::Timeline(t) if args.json => {
                json.push(gpumemhook_timeline::timeline_json(&t, path)?);
                continue;
            }
            RunFile::Timeline(t) => {
                out.push_str(&timeline_summary(&t, painter));
                if args.by_site {
                    // Said, never an empty table: the sites of a timeline are on its page.
                    out.push_str(&format!(
                        "  by site: a timeline's report has no site table; `gpumemhook view {} -o \
                         page.html` shows the Python call sites it recorded (GPUMEMHOOK_STACKS=1 \
                         records them)\n",
                        path.display()
                    ));
                }
                continue;
            }
            RunFile::Json(value) => value,
        };
        let list = match value {
            Value::Array(items) => items,
            Value::Object(mut o) if o.contains_key("processes") => match o.remove("processes") {
                Some(Value::Array(items)) => items,
                _ => bail!("{}: \"processes\" is not a list", path.display()),
            },
            other => vec![other],
        };
        if list.is_empty() {
            // `ls --json` with nothing hooked prints `[]`: say so rather than print nothing.
            bail!(
                "{} holds an empty list: no process to report (`ls --json` prints [] when \
                 nothing was hooked)",
                path.display()
            );
        }
        for (j, item) in list.into_iter().enumerate() {
            let s = parse_snapshot(item).with_context(|| format!("{}", path.display()))?;
            if j > 0 {
                out.push('\n');
            }
            out.push_str(&snapshot_summary(
                &s,
                &Ending::Exited,
                Detail::Full,
                painter,
            ));
            if args.by_site {
                out.push_str(&crate::attribution::site_table(&s, painter, 2));
            }
            json.push(serde_json::to_value(s)?);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{out}");
    }
    Ok(0)
}

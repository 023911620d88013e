//! `gpumemhook export TRACE [--perfetto FILE] [--chrome FILE] [--pytorch FILE]`: a timeline in the
//! formats other viewers read: Perfetto's protobuf trace ([`perfetto`]), the Chrome JSON trace, and
//! the snapshot pickle of PyTorch's memory viewer, all encoded by the timeline crate. A recording
//! is read once per format, and each format is written as it is read, event by event, in memory
//! that does not grow with the recording; a timeline of an earlier version (Chrome JSON) is read
//! whole into a [`Timeline`] (`snapshots::load_timeline`), once, for the formats made from it, so
//! that any timeline file the reader takes exports the same. Each output is written by
//! `write_file` (a temporary file renamed, or a device or pipe written through), and one line per
//! file says what it holds and its size.

use anyhow::{bail, Context, Result};
use clap::ArgGroup;
use gpumemhook_reader::{format_size, write_file};
use gpumemhook_timeline::{LeftOut, TimeWindow, Timeline};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::snapshots::{copy_as_chrome, load_timeline};

#[derive(clap::Args, Debug)]
#[command(
    group(ArgGroup::new("outputs").required(true).multiple(true)),
    after_help = "\
Examples:
  gpumemhook run --trace mem.trace -- python train.py
  gpumemhook export mem.trace --perfetto mem.pftrace  # open in the Perfetto UI
  gpumemhook export mem.trace --pytorch mem.pickle    # PyTorch's memory viewer
  gpumemhook export mem.trace --chrome mem.json       # chrome://tracing, Perfetto
  gpumemhook export mem.trace --pytorch w.pickle --from 60 --to 90  # entries of 60 s to 90 s
  gpumemhook export mem.trace --perfetto a.pftrace --pytorch a.pickle  # several at once

At least one output is required. Each file is written whole or not at all (or through, for a
device or a pipe such as /dev/stdout). A binary timeline is exported as it is read: memory does not
grow with its length (--pytorch keeps each device's last --entries and what is allocated at the
end).")]
pub struct ExportArgs {
    /// A timeline written by GPUMEMHOOK_TRACE / `gpumemhook run --trace`.
    pub trace: PathBuf,
    /// Write Perfetto's protobuf trace: a process track, counters of used, ceiling and each
    /// module's bytes per device, scopes as slices, refusals and peak restarts as instants.
    #[arg(long, value_name = "FILE", group = "outputs")]
    pub perfetto: Option<PathBuf>,
    /// Write the Chrome JSON trace (what chrome://tracing and Perfetto open).
    #[arg(long, value_name = "FILE", group = "outputs")]
    pub chrome: Option<PathBuf>,
    /// Write the snapshot pickle of PyTorch's memory viewer (torch.cuda.memory._snapshot()'s
    /// format: segments and per-device traces of allocations, frees and out-of-memory events).
    #[arg(long, value_name = "FILE", group = "outputs")]
    pub pytorch: Option<PathBuf>,
    /// With --pytorch: the trace entries kept per device, the last ones (as PyTorch's recorder
    /// keeps `max_entries`): its viewer cannot open millions. An allocation is two entries, a
    /// free three.
    #[arg(long, value_name = "N", default_value_t = gpumemhook_timeline::DEFAULT_PYTORCH_ENTRIES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub entries: usize,
    /// With --pytorch: keep only the trace entries of events from this time on, in seconds since
    /// the timeline's first event (as `plot --from` counts: `12`, `12.5`). What is allocated at
    /// the end stays whole.
    #[arg(long, value_name = "SECONDS", requires = "pytorch", value_parser = seconds)]
    pub from: Option<f64>,
    /// With --pytorch: keep only the trace entries of events up to this time, as --from.
    #[arg(long, value_name = "SECONDS", requires = "pytorch", value_parser = seconds)]
    pub to: Option<f64>,
}

/// A time of --from/--to: seconds, not negative.
fn seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(format!(
            "{text:?}: write seconds since the timeline's first event (12, 12.5)"
        )),
    }
}

/// The window of --from/--to, in ns since the first event.
fn window(args: &ExportArgs) -> Result<TimeWindow> {
    if let (Some(from), Some(to)) = (args.from, args.to) {
        if from > to {
            return Err(crate::usage::UsageError(format!(
                "--from {from} is after --to {to}: nothing would be kept"
            ))
            .into());
        }
    }
    let ns = |s: f64| (s * 1e9).round() as u64;
    Ok(TimeWindow {
        from_ns: args.from.map(ns),
        to_ns: args.to.map(ns),
    })
}

/// What the line of `--pytorch` says it holds, and what it left out.
fn pytorch_holds(args: &ExportArgs, left: LeftOut) -> String {
    let mut what = "PyTorch memory snapshot (pickle)".to_string();
    if left.older > 0 {
        what += &format!(
            " of each device's last {} trace entries",
            crate::style::count(args.entries as u64)
        );
    }
    use crate::style::duration;
    match (args.from, args.to) {
        (Some(from), Some(to)) => {
            what += &format!(" between {} and {}", duration(from), duration(to))
        }
        (Some(from), None) => what += &format!(" from {} on", duration(from)),
        (None, Some(to)) => what += &format!(" up to {}", duration(to)),
        (None, None) => {}
    }
    if args.from.is_some() || args.to.is_some() {
        what += " after the first event";
    }
    if left.older > 0 {
        what += &format!(
            ", {} older left out (--entries N keeps more)",
            crate::style::count(left.older)
        );
    }
    if left.outside > 0 {
        what += &format!(
            ", {} outside --from/--to left out",
            crate::style::count(left.outside)
        );
    }
    what
}

/// Counts what goes through it.
struct Counted<'a> {
    out: &'a mut dyn Write,
    bytes: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes `path` with `fill` (buffered) and returns the number of bytes written.
fn write_counted(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<u64> {
    let mut bytes = 0;
    write_file(path, |out| {
        let mut counted = Counted { out, bytes: 0 };
        let mut buffered = io::BufWriter::with_capacity(1 << 16, &mut counted);
        fill(&mut buffered)?;
        buffered.flush()?;
        drop(buffered);
        bytes = counted.bytes;
        Ok(())
    })?;
    Ok(bytes)
}

pub fn export(args: ExportArgs) -> Result<i32> {
    let input = &args.trace;
    // A pipe or a device can be read only once, and the Chrome copy reads the file again.
    let regular = std::fs::metadata(input).is_ok_and(|m| m.is_file());
    if args.chrome.is_some() && !regular && input.exists() {
        bail!(
            "{}: --chrome reads the timeline twice, so it needs a regular file, not a pipe or a \
             device",
            input.display()
        );
    }
    let window = window(&args)?;
    // A recording is written as it is read, format by format; any other timeline is read whole,
    // once, for the Perfetto and PyTorch formats (its Chrome JSON is copied as it is).
    let recording = regular && gpumemhook_timeline::is_recording(input);
    if recording {
        // Refused before any output is made, as a timeline read whole would be.
        gpumemhook_timeline::Recording::open(input)
            .with_context(|| format!("cannot read the timeline {}", input.display()))?;
    }
    let whole = !recording && (args.perfetto.is_some() || args.pytorch.is_some());
    let timeline: Option<Timeline> = match whole {
        true => Some(load_timeline(input, gpumemhook_timeline::Keep::Everything)?),
        false => None,
    };
    // The lines go to stderr when a file goes to stdout, so that stdout holds that file alone.
    let to_stdout = [&args.perfetto, &args.chrome, &args.pytorch]
        .into_iter()
        .flatten()
        .any(|p| is_stdout(p));
    let say = |path: &Path, what: &str, size: u64| {
        let line = format!("{}: {what}, {}", path.display(), format_size(size));
        if to_stdout {
            sayln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let cannot = |path: &Path| format!("cannot write {}", path.display());
    let read = |e: gpumemhook_timeline::TraceError| io::Error::other(format!("{e:#}"));
    if let Some(path) = &args.perfetto {
        let size = write_counted(path, |out| match &timeline {
            Some(timeline) => gpumemhook_timeline::write_perfetto(timeline, out),
            None => gpumemhook_timeline::write_recording_as_perfetto(input, out).map_err(read),
        })
        .with_context(|| cannot(path))?;
        say(path, "Perfetto protobuf trace", size);
    }
    if let Some(path) = &args.chrome {
        let size = write_counted(path, |out| {
            copy_as_chrome(input, out).map_err(|e| io::Error::other(format!("{e:#}")))
        })
        .with_context(|| cannot(path))?;
        say(path, "Chrome JSON trace", size);
    }
    if let Some(path) = &args.pytorch {
        let mut left = LeftOut::default();
        let size = write_counted(path, |out| {
            left = match &timeline {
                Some(timeline) => {
                    gpumemhook_timeline::write_pytorch(timeline, args.entries, window, out)?
                }
                None => gpumemhook_timeline::write_recording_as_pytorch(
                    input,
                    args.entries,
                    window,
                    out,
                )
                .map_err(read)?,
            };
            Ok(())
        })
        .with_context(|| cannot(path))?;
        say(path, &pytorch_holds(&args, left), size);
    }
    Ok(0)
}

/// Whether `path` names this process's standard output.
fn is_stdout(path: &Path) -> bool {
    let named = ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"];
    named.iter().any(|n| path == Path::new(n))
        || std::fs::canonicalize(path).is_ok_and(|p| {
            std::fs::canonicalize("/proc/self/fd/1").is_ok_and(|out| out == p && !p.is_file())
        })
}

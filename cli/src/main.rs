//! The `gpumemhook` command: run a program under the hook and summarise what it held
//! (`run`), list and watch hooked processes (`ls`, `top`), read exit reports (`report`), draw
//! timelines (`plot`), change a running process's ceiling and peaks (`limit`, `reset-peak`),
//! serve every hooked process's counters to Prometheus (`exporter`), and find the largest value of
//! a size knob that fits each card (`fit`), and install a Jupyter kernel that runs under the hook
//! (`kernel`), and write one HTML page of a run (`view`), and write a timeline for other viewers
//! (`export`: Perfetto, Chrome JSON, PyTorch's memory viewer), and say which CLI, library and
//! Python are in use (`env`).
//!
//! Modules: [`run`] and [`fit`], which start programs through [`launch`] ([`devices`]: the GPUs
//! `fit` packs trials onto), [`list`] (`ls`), [`top`], [`report`], [`plot`] with [`canvas`] (SVG and PNG),
//! [`control`] (`limit`, `reset-peak`), [`group`] (a group's joint figures), [`exporter`], [`summary`] (the human summaries `run` and
//! `report` share), [`attribution`] (who holds the memory: modules, live allocations, the
//! out-of-memory section), [`replay`] (a timeline's figures), [`replayed`] (them as an exit
//! report's JSON), [`style`] (colour and tables),
//! [`cards`] (the cards `run --emulate` knows), [`kernel`] (Jupyter kernel specs), [`tail`] (what
//! is kept of a child's output: its last lines, bounded), [`usage`] (usage errors, exit status 2),
//! [`console`] (how a command ends when the reader of its output goes),
//! [`view`] (`view`), [`export`] (`export`), [`setup`] (`env`); and what commands share, since no command module uses another:
//! [`processes`] (attaching, gathering, the process table), [`groups`] (what commands know of
//! groups), [`page`] (the HTML page of a run, for `view` and `run --html`), [`snapshots`] (reading
//! an exit report), [`input`] (opening what a reader is given: its format from its first bytes, a
//! pipe read with a bound), [`streamed`] (`run --trace`'s timelines, written in place).
//!
//! Exit status: 0 on success, 1 on an error, 2 on a usage error (a bad size, an unknown option);
//! `run` ends with its command's status (128+N when a signal N ended it); `fit` with 1 when the
//! search for a target stopped (a trial failed for a reason other than memory, or timed out), and
//! 128+N when SIGTERM, SIGINT or SIGHUP stopped it.
//!
//! Every command writes to standard error through [`say!`] and [`sayln!`], never `eprint!`: the
//! commands that keep SIGPIPE ignored (`run`, `fit`, `exporter`) would otherwise panic when the
//! reader of their standard error went away. What they print on standard output goes through
//! [`console::print_or_end`] for the same reason.

/// `eprint!` that never panics: a message to a standard error whose reader went away is lost (a
/// command whose SIGPIPE is at its default dies of it first, quietly).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprintln!` that never panics (see [`say!`]).
macro_rules! sayln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod attribution;
mod canvas;
mod cards;
mod console;
mod control;
mod devices;
mod export;
mod exporter;
mod fit;
mod group;
mod groups;
mod input;
mod kernel;
mod launch;
mod list;
mod page;
mod plot;
mod processes;
mod report;
mod run;
mod setup;
mod snapshots;
mod streamed;
mod style;
mod summary;
mod tail;
mod top;
mod usage;
mod view;

use clap::{Parser, Subcommand};
use style::{ColorChoice, Painter, Style};

/// glibc's `gettid`, which glibc has only since 2.30. Rust's standard library refers to it (to
/// name the thread in a panic message), and the release wheels link this executable against
/// glibc 2.17's symbols, where it does not exist: the link fails. This is the system call that
/// glibc's function wraps, so every caller gets the same answer on any glibc.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[no_mangle]
pub extern "C" fn gettid() -> libc::pid_t {
    // SAFETY: SYS_gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::pid_t }
}

#[derive(Parser, Debug)]
#[command(
    name = "gpumemhook",
    version,
    about = "Exact GPU memory of your programs: how much they hold and held at their peak",
    long_about = "Exact GPU memory of your programs: how much they hold and held at their peak.\n\n\
        Every CUDA allocation of a program started under gpumemhook is counted as it happens \
        (per device, with peaks, scopes and an optional ceiling), by a preloaded library; this \
        command starts programs under it and reads what it counts.",
    after_help = "\
Examples:
  gpumemhook run -- python train.py               # run, then print peak and final use per device
  gpumemhook run --limit 8GiB -- python train.py  # as if the card had 8 GiB
  gpumemhook run --emulate t4 -- python train.py  # as on a T4, its context included (see `cards`)
  gpumemhook ls                                   # hooked processes now: used, peak, ceiling, scopes
  gpumemhook top                                  # the same, live (q quits)
  gpumemhook run --trace t.trace -- python train.py && gpumemhook plot t.trace -o t.png
  gpumemhook limit 4242 6GiB                      # change a running process's ceiling
  gpumemhook fit --card t4,l4 --param batch=1..64 -- python train.py --batch {batch}
  gpumemhook kernel install                       # a Jupyter kernel \"Python 3 (gpumemhook)\"
  gpumemhook run --html run.html -- python train.py  # one HTML page: timeline, who held the peak

Run `gpumemhook <command> --help` for each command's options and examples."
)]
struct Cli {
    // One short line in every subcommand's help (a global option is repeated there): the values
    // are named in it rather than listed with their descriptions.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = ColorChoice::Auto,
        value_name = "WHEN",
        hide_possible_values = true,
        hide_default_value = true,
        help = "Colour: auto (a terminal, NO_COLOR unset; the default), always, never"
    )]
    color: ColorChoice,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command under the hook; print what each of its processes held at exit.
    Run(run::RunArgs),
    /// List the live hooked processes of this user: used, peak, ceiling, scopes.
    Ls(list::LsArgs),
    /// Watch the hooked processes live (like nvidia-smi, but exact and with peaks).
    Top(top::TopArgs),
    /// Print an exit report (or a timeline's figures) for people.
    Report(report::ReportArgs),
    /// Draw a timeline as a PNG or SVG: memory used over time per device, scopes, ceiling.
    Plot(plot::PlotArgs),
    /// Set or lift the allocation ceiling of a running process.
    Limit(control::LimitArgs),
    /// Restart the peak of a running process from what it uses now.
    ResetPeak(control::ResetPeakArgs),
    /// Serve every hooked process's counters at /metrics for Prometheus.
    Exporter(exporter::ExporterArgs),
    /// List the cards `run --emulate` (and GPUMEMHOOK_EMULATE) can emulate, with their memory.
    Cards(cards::CardsArgs),
    /// Will it fit? The largest value of a size knob (a batch) that runs on each card or ceiling.
    Fit(fit::FitArgs),
    /// A group's joint figures: what its processes hold together, their joint peak, its ceiling.
    Group(group::GroupArgs),
    /// Install, list or remove a Jupyter kernel that runs under the hook ("Python 3 (gpumemhook)").
    Kernel(kernel::KernelArgs),
    /// One self-contained HTML page of a run (timeline, report, OOM report, live pid), or of two.
    View(view::ViewArgs),
    /// Write a timeline for other viewers: Perfetto's protobuf trace, Chrome JSON, PyTorch's
    /// memory snapshot.
    Export(export::ExportArgs),
    /// Which CLI, hook library and Python are in use, their versions, and whether they agree.
    Env(setup::EnvArgs),
}

fn main() {
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        // `limit 4242 8 GiB`: clap sees an extra argument, but the mistake is the space.
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        match usage::split_size(&args) {
            Some(refusal) if e.use_stderr() => {
                sayln!("gpumemhook: error: {refusal}");
                std::process::exit(2)
            }
            _ => e.exit(),
        }
    });
    if !matches!(
        cli.command,
        Command::Exporter(_) | Command::Run(_) | Command::Fit(_)
    ) {
        console::end_quietly_when_the_reader_goes();
    }
    let out = Painter::new(cli.color, false);
    let err = Painter::new(cli.color, true);
    let result = match cli.command {
        // `run`'s summary goes to stderr, so that the program's own stdout stays clean.
        Command::Run(args) => run::run(args, err),
        Command::Ls(args) => list::ls(args, out),
        Command::Top(args) => top::top(args, out),
        Command::Report(args) => report::report(args, out),
        Command::Plot(args) => plot::plot(args),
        Command::Limit(args) => control::limit(args),
        Command::ResetPeak(args) => control::reset_peak(args),
        Command::Exporter(args) => exporter::exporter(args),
        Command::Cards(args) => cards::cards(args, out),
        // The table to stdout, progress and errors to stderr.
        Command::Fit(args) => fit::fit(args, out, err),
        Command::Kernel(args) => kernel::kernel(args, out),
        Command::Group(args) => group::group(args, out),
        Command::View(args) => view::view(args),
        Command::Export(args) => export::export(args),
        Command::Env(args) => setup::env(args, out),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            sayln!("gpumemhook: {} {e:#}", err.paint("error:", Style::Bad));
            if e.downcast_ref::<usage::UsageError>().is_some() {
                2
            } else {
                1
            }
        }
    };
    std::process::exit(code);
}

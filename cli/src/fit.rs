//! `gpumemhook fit`: the largest value of a size knob (a batch, a sequence length) for which a
//! program runs on each named card or under each ceiling, from real runs under the hook, several
//! at once on the GPUs here.
//!
//! Each trial is the command with `{NAME}` replaced by a value, started as `run` starts one
//! ([`crate::launch`]), with the card emulated or the ceiling set, in a memory group of its own
//! (`docs/groups.md`), so that a program of several processes is judged on one card or ceiling
//! shared by all of them, by their joint peak. Its outcome comes from the
//! hook's own counts, never from what the program prints: out of memory when an allocation was
//! refused by the ceiling (`denied` in an exit report) or failed by the driver for want of memory
//! (an out-of-memory report, which the hook writes for both); otherwise it fits when the program
//! exited 0, and failed for another reason when it did not, or timed out past `--trial-timeout`
//! ([`trial`]). [`search`] chooses the values. `fit` owns its trials ([`running`]): each runs in a
//! process group of its own, and none outlives `fit`, whether it ends, fails, panics or is sent
//! SIGTERM, SIGINT or SIGHUP (passed on to every trial's group; `fit` then exits 128+N).
//!
//! Side by side: a trial on a card holds at most the card's total (context included), so trials
//! are packed onto the visible devices ([`crate::devices`]) by that budget; a ceiling leaves the
//! context outside, so its budget is the ceiling plus [`CONTEXT_ALLOWANCE`].

mod running;
mod search;
mod trial;

use anyhow::{Context, Result};
use gpumemhook_reader::Emulation;
use gpumemhook_reader::{format_size, parse_size};
use gpumemhook_reader::{parse_card, write_file};
use running::{StopOnDrop, RUNNING};
use search::{Room, Search, Strategy, Verdict};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use trial::{outcome_word, run_trial, Finished, Holders, Outcome, TrialSpec};

use crate::devices::{self, Device};
use crate::launch::{check_writable, find_library};
use crate::style::{duration, Cell, Painter, Style, Table};
use crate::usage::UsageError;

/// What a trial under a plain ceiling is assumed to hold beyond it: its CUDA context, which a
/// ceiling does not charge (an emulated card does). A CUDA 12/13 context with PyTorch's kernels
/// takes some 500 MiB; twice that leaves room for cuBLAS's and NCCL's own.
pub const CONTEXT_ALLOWANCE: u64 = 1 << 30;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  gpumemhook fit --card t4,l4,a100-40gb,h100 --param batch=1..256 -- python train.py --batch {batch}
  gpumemhook fit --limit 8GiB,12GiB --param seq=128..8192 -- python infer.py --seq-len {seq}
  gpumemhook fit --card t4 --param batch=1..64 --json fit.json -- python train.py --batch {batch}
  gpumemhook fit --card a100-40gb --param batch=1..512 --launcher 'srun -N1 --gpus=1 {cmd}' \\
      -- python train.py --batch {batch}

For each card or ceiling, in the order given, fit finds the largest value in LO..HI for which the
program exits 0 with no allocation refused by the ceiling and none failed by the driver for want
of memory. It assumes that more of the knob never needs less memory. Each fitting trial's exact peak
is a point of the program's peak curve: from two points on, every target's answer is predicted and
then confirmed by real runs (the value fits, the next one runs out: the answer is always those two
outcomes), falling back to bisection after two misses (--search bisection: outcomes alone). What
one target learns serves the others; trials whose outcome no longer matters are ended, and counted
apart (trials: 9 (+2 stopped)). A target larger than the device here is marked device-bound (its
answer is a lower bound); a trial that allocates no GPU memory, or a peak that shrinks as the value
grows, is an error.

Each trial is a group of its own (docs/groups.md): all the processes it starts share the card or the
ceiling, and its peak is their joint peak.

Each trial's outcome is read from the hook's counts, never from the program's messages: fits, out
of memory, failed for another reason (a crash, a non-zero exit with nothing refused), or timed out
(it ran past --trial-timeout). The last two stop that target's search, show the last lines of the
program's stderr, and make fit exit 1.

Trials run side by side while the GPUs here hold them: one on a card takes at most the card's
memory, context included; one under a ceiling, the ceiling and 1 GiB for its context. Each trial
gets one device (CUDA_VISIBLE_DEVICES) and a process group of its own, which fit ends with it:
SIGTERM, SIGINT or SIGHUP to fit goes to every running trial's group (SIGKILL after 5 s), and fit
exits 128+N. The program's own output is not shown (but for a failed trial's last stderr lines);
the table goes to stdout, progress to stderr. Exit status: 0 when every target has its answer, 1
when a search stopped, 2 for a usage error, 128+N when signal N stopped fit. docs/fit.md says what
the answer means and what it cannot know.")]
pub struct FitArgs {
    /// Cards to fit on, as `run --emulate` takes them (t4, l4, a100-40gb, h100, ...: `gpumemhook
    /// cards` lists them; or a size): the card's memory, with the process's context charged inside.
    /// Repeatable; with --limit, targets are answered in the order given.
    #[arg(long, value_name = "CARD[,CARD...]", value_parser = in_order)]
    card: Vec<Given>,
    /// Ceilings to fit under (8GiB, 12GB, 500MiB: a number and its unit): plain allocation
    /// ceilings, the context outside.
    /// Repeatable.
    #[arg(long, value_name = "SIZE[,SIZE...]", value_parser = in_order)]
    limit: Vec<Given>,
    /// The knob and its range, NAME=LO..HI (whole numbers, LO <= HI): `{NAME}` in the command is
    /// replaced by each value tried.
    #[arg(long, value_name = "NAME=LO..HI")]
    param: String,
    /// At most this many trials at once. Default: as many as the devices hold, at most the number
    /// of CPU cores.
    #[arg(long, short, value_name = "N")]
    jobs: Option<usize>,
    /// Start each trial through a scheduler: {cmd} in the template becomes the trial's command
    /// (shell-quoted, its environment prefixed with `env`), run with `sh -c`. Example: 'srun -N1
    /// --gpus=1 {cmd}'. Reports then go to a directory under the current one, which the nodes
    /// must share; trials run --jobs at a time (default: the number of CPU cores).
    #[arg(long, value_name = "TEMPLATE")]
    launcher: Option<String>,
    /// End a trial that runs longer than this (30s, 10m, 1h 30m): its outcome is `timed out`, an
    /// error that stops its target's search. Default: no limit.
    #[arg(long, value_name = "DURATION", value_parser = time_limit)]
    trial_timeout: Option<Duration>,
    /// How values are chosen: `peaks` predicts each answer from the peaks measured so far and
    /// confirms it with real runs; `bisection` searches by outcomes alone. Both give the same
    /// answers.
    #[arg(
        long,
        value_enum,
        value_name = "HOW",
        default_value = "peaks",
        hide_possible_values = true
    )]
    search: Strategy,
    /// Also write the results as JSON here (docs/fit.md gives the schema).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The hook library to preload (as for `run`).
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
    /// The program and its arguments, with `{NAME}` where the value goes.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

/// One `--card` or `--limit` value, with its place among all of them on the command line (clap
/// parses values in that order), so that targets keep the order given across the two options.
#[derive(Clone, Debug)]
struct Given {
    order: usize,
    text: String,
}

fn in_order(text: &str) -> std::result::Result<Given, String> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    Ok(Given {
        order: NEXT.fetch_add(1, Ordering::Relaxed),
        text: text.to_string(),
    })
}

/// A `--trial-timeout`: a duration as humantime reads it (`90s`, `10m`, `1h 30m`), not zero.
fn time_limit(text: &str) -> std::result::Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("a time limit of zero would end every trial".to_string()),
        Ok(d) => Ok(d),
        Err(e) => Err(format!(
            "{e} (expected a duration such as 90s, 10m or 1h 30m)"
        )),
    }
}

/// One card or ceiling to fit on.
#[derive(Clone, Debug)]
struct Target {
    /// What the table and the JSON call it: the preset, the card's size, or `<size> ceiling`.
    label: String,
    total: u64,
    /// The card, or `None` for a plain ceiling.
    card: Option<Emulation>,
}

impl Target {
    fn room(&self) -> Room {
        Room {
            total: self.total,
            context_inside: self.card.is_some(),
        }
    }

    /// The most device memory one trial of it can hold.
    fn budget(&self) -> u64 {
        match self.card {
            Some(_) => self.total,
            None => self.total.saturating_add(CONTEXT_ALLOWANCE),
        }
    }
}

/// The parsed command line.
struct Plan {
    name: String,
    lo: u64,
    hi: u64,
    targets: Vec<Target>,
    strategy: Strategy,
}

fn parse_targets(args: &FitArgs) -> Result<Vec<Target>> {
    let mut given: Vec<(&Given, bool)> = args
        .card
        .iter()
        .map(|g| (g, true))
        .chain(args.limit.iter().map(|g| (g, false)))
        .collect();
    given.sort_by_key(|(g, _)| g.order);
    let mut targets = Vec::new();
    for (g, is_card) in given {
        for text in g.text.split(',').map(str::trim) {
            let target = if is_card {
                let e = parse_card(text).map_err(|e| UsageError(format!("--card: {e}")))?;
                Target {
                    label: e.label(),
                    total: e.total,
                    card: Some(e),
                }
            } else {
                let total = parse_size(text).map_err(|e| UsageError(format!("--limit: {e}")))?;
                Target {
                    label: format!("{} ceiling", format_size(total)),
                    total,
                    card: None,
                }
            };
            targets.push(target);
        }
    }
    if targets.is_empty() {
        return Err(UsageError("no target: give --card CARD or --limit SIZE".to_string()).into());
    }
    Ok(targets)
}

fn parse_plan(args: &FitArgs) -> Result<Plan> {
    let usage = |why: String| UsageError(format!("--param {}: {why}", args.param));
    let (name, range) = args
        .param
        .split_once('=')
        .ok_or_else(|| usage("expected NAME=LO..HI".to_string()))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(usage("NAME must be letters, digits and _".to_string()).into());
    }
    let (lo, hi) = range
        .split_once("..")
        .ok_or_else(|| usage("expected NAME=LO..HI".to_string()))?;
    let bound = |text: &str| {
        text.trim()
            .parse::<u64>()
            .map_err(|_| usage("the range is empty or not whole numbers LO..HI".to_string()))
    };
    let (lo, hi) = (bound(lo)?, bound(hi)?);
    if lo > hi {
        return Err(usage(format!("the range is reversed ({lo} > {hi})")).into());
    }
    let placeholder = format!("{{{name}}}");
    if !args
        .command
        .iter()
        .any(|a| a.to_string_lossy().contains(&placeholder))
    {
        return Err(UsageError(format!(
            "--param {name}: the command has no {placeholder} to put the value in"
        ))
        .into());
    }
    let targets = parse_targets(args)?;
    Ok(Plan {
        name: name.to_string(),
        lo,
        hi,
        targets,
        strategy: args.search,
    })
}

/// Where trials may run: each device with its free bytes and what running trials hold of them.
struct Places {
    slots: Vec<Slot>,
    jobs: usize,
    running: usize,
}

struct Slot {
    /// `None`: no device is named to the trial (unknown devices, or a launcher).
    device: Option<Device>,
    capacity: u64,
    held: u64,
    running: usize,
}

impl Places {
    /// The slot a trial of `budget` bytes can start on now (the one it fits best), if any. A
    /// budget larger than every device runs alone on the largest.
    fn place(&self, budget: u64) -> Option<usize> {
        if self.running >= self.jobs {
            return None;
        }
        let largest = self.slots.iter().map(|s| s.capacity).max().unwrap_or(0);
        let budget = budget.min(largest);
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.capacity - s.held >= budget)
            .min_by_key(|(_, s)| s.capacity - s.held - budget)
            .map(|(i, _)| i)
    }

    fn take(&mut self, slot: usize, budget: u64) -> u64 {
        let s = &mut self.slots[slot];
        let held = budget.min(s.capacity);
        s.held += held;
        s.running += 1;
        self.running += 1;
        held
    }

    fn give_back(&mut self, slot: usize, held: u64) {
        let s = &mut self.slots[slot];
        s.held -= held;
        s.running -= 1;
        self.running -= 1;
    }
}

/// Everything known about one target at the end.
#[derive(Default)]
struct Answer {
    trials: usize,
    /// Trials ended because their outcome no longer mattered (not counted in `trials`).
    stopped: usize,
    error: Option<String>,
    /// The error is a trial that ran past `--trial-timeout`.
    timed_out: bool,
    /// The last lines of stderr of the trial that stopped the search.
    stderr_tail: String,
    /// The target is larger than the device its trials ran on: its answer is a lower bound.
    bound_by_device: bool,
}

/// Who held the memory at each out-of-memory: (target, value, holders) of every run that ran out
/// (the holders depend on the program and the value, not on the card).
#[derive(Default)]
struct Holdings(Vec<(usize, u64, Holders)>);

impl Holdings {
    fn at(&self, target: usize, value: u64) -> Option<&[(String, u64)]> {
        let runs = self.0.iter().filter(|f| f.1 == value);
        runs.clone()
            .find(|f| f.0 == target)
            .or_else(|| runs.clone().next())
            .map(|f| f.2.as_slice())
    }
}

/// The places trials can run, and a line saying how, when it matters.
fn places(launcher: bool, jobs: Option<usize>, targets: &[Target]) -> Places {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let unplaced = |jobs: usize| Places {
        slots: vec![Slot {
            device: None,
            capacity: u64::MAX,
            held: 0,
            running: 0,
        }],
        jobs,
        running: 0,
    };
    if launcher {
        return unplaced(jobs.unwrap_or(cores).max(1));
    }
    match devices::visible() {
        Ok(found) if !found.is_empty() => {
            let largest = found.iter().map(|d| d.free).max().unwrap_or(0);
            for t in targets.iter().filter(|t| t.budget() > largest) {
                sayln!(
                    "gpumemhook fit: {} ({}) is larger than the memory free on any device here \
                     ({}): its trials run alone, and a value needing more than the device has \
                     runs out of memory on the device, not the card: its answer is a lower bound",
                    t.label,
                    format_size(t.budget()),
                    format_size(largest)
                );
            }
            Places {
                slots: found
                    .into_iter()
                    .map(|d| Slot {
                        capacity: d.free,
                        device: Some(d),
                        held: 0,
                        running: 0,
                    })
                    .collect(),
                jobs: jobs.unwrap_or(cores).max(1),
                running: 0,
            }
        }
        found => {
            let why = match found {
                Err(why) => why,
                Ok(_) => "NVML lists no device".to_string(),
            };
            sayln!(
                "gpumemhook fit: the devices' memory cannot be learned ({why}): trials run one at \
                 a time"
            );
            unplaced(1)
        }
    }
}

/// Runs the search; returns the exit status.
pub fn fit(args: FitArgs, painter: Painter, err_painter: Painter) -> Result<i32> {
    let plan = parse_plan(&args)?;
    let live = std::io::stderr().is_terminal();
    RUNNING.own(live);
    // On an error of fit's own, the trials are stopped when this goes.
    let _stop_on_error = StopOnDrop;
    if let Some(path) = &args.json {
        check_writable("--json", path)?;
    }
    let lib = find_library(args.lib.as_deref())?;
    let base = match args.launcher {
        // The nodes a scheduler starts trials on see the current directory, not this /tmp.
        Some(_) => std::env::current_dir().context("the current directory")?,
        None => std::env::temp_dir(),
    };
    let places = places(args.launcher.is_some(), args.jobs, &plan.targets);
    let run = Run::new(&plan, &args, lib, base, places, live);
    let outcome = run.execute();
    present(&plan, &outcome, args.json.as_deref(), painter, err_painter)
}

/// A trial running, and the flag that ends it once its outcome no longer matters.
struct Flight {
    target: usize,
    value: u64,
    moot: Arc<AtomicBool>,
}

/// The search as it runs: what is known, what is running, where.
struct Run<'a> {
    plan: &'a Plan,
    args: &'a FitArgs,
    lib: PathBuf,
    base: PathBuf,
    places: Places,
    search: Search,
    answers: Vec<Answer>,
    holdings: Holdings,
    flights: Vec<Flight>,
    send: mpsc::Sender<Finished>,
    receive: mpsc::Receiver<Finished>,
    started: Instant,
    /// How long each finished trial took, for the time left.
    trial_seconds: Vec<f64>,
    /// Trials finished, stopped ones included.
    finished: usize,
    last_line: String,
    live: bool,
}

/// What the search found.
struct Found {
    search: Search,
    answers: Vec<Answer>,
    holdings: Holdings,
    took: Duration,
}

impl<'a> Run<'a> {
    fn new(
        plan: &'a Plan,
        args: &'a FitArgs,
        lib: PathBuf,
        base: PathBuf,
        places: Places,
        live: bool,
    ) -> Run<'a> {
        let (send, receive) = mpsc::channel::<Finished>();
        // A target needing more than the largest device is bounded by the device, not itself.
        let largest = places
            .slots
            .iter()
            .filter(|s| s.device.is_some())
            .map(|s| s.capacity)
            .max();
        let answers = plan
            .targets
            .iter()
            .map(|t| Answer {
                bound_by_device: largest.is_some_and(|l| t.budget() > l),
                ..Answer::default()
            })
            .collect();
        let rooms = plan.targets.iter().map(Target::room).collect();
        Run {
            plan,
            args,
            lib,
            base,
            places,
            search: Search::new(plan.lo, plan.hi, rooms, plan.strategy, &plan.name),
            answers,
            holdings: Holdings::default(),
            flights: Vec::new(),
            send,
            receive,
            started: Instant::now(),
            trial_seconds: Vec::new(),
            finished: 0,
            last_line: String::new(),
            live,
        }
    }

    /// Starts trials while there is room, takes their outcomes, until every target is settled.
    fn execute(mut self) -> Found {
        loop {
            self.start_trials();
            if self.places.running == 0 {
                break;
            }
            match self.receive.recv_timeout(Duration::from_millis(250)) {
                Ok(finished) => self.take(finished),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if self.live {
                self.progress();
            }
        }
        if self.live {
            say!("\r\x1b[2K");
        }
        for (t, answer) in self.answers.iter_mut().enumerate() {
            if answer.error.is_none() {
                answer.error = self.search.contradiction(t);
            }
        }
        Found {
            search: self.search,
            answers: self.answers,
            holdings: self.holdings,
            took: self.started.elapsed(),
        }
    }

    /// Starts every trial the devices hold now: the targets with the fewest trials in flight
    /// first, then in the order given (so that one at a time, each target is searched knowing all
    /// that the targets before it taught); a target with none in flight that cannot be placed waits
    /// for room, and nothing else is started past it, so a large card is not starved.
    fn start_trials(&mut self) {
        'starting: loop {
            let mut order: Vec<usize> = (0..self.plan.targets.len())
                .filter(|t| self.answers[*t].error.is_none())
                .collect();
            order.sort_by_key(|t| (self.search.in_flight(*t), *t));
            for t in order {
                let Some(value) = self.search.next(t) else {
                    continue;
                };
                let Some(slot) = self.places.place(self.plan.targets[t].budget()) else {
                    if self.search.in_flight(t) == 0 {
                        break 'starting;
                    }
                    continue;
                };
                self.start(t, value, slot);
                continue 'starting;
            }
            break;
        }
    }

    /// Starts the trial of `value` on target `t` on `slot`, in a thread of its own.
    fn start(&mut self, t: usize, value: u64, slot: usize) {
        let target = &self.plan.targets[t];
        let held = self.places.take(slot, target.budget());
        self.search.start(t, value);
        self.answers[t].trials += 1;
        let placeholder = format!("{{{}}}", self.plan.name);
        let moot = Arc::new(AtomicBool::new(false));
        self.flights.push(Flight {
            target: t,
            value,
            moot: moot.clone(),
        });
        let spec = TrialSpec {
            target: t,
            value,
            slot,
            held,
            argv: (self.args.command.iter())
                .map(|a| match a.to_str() {
                    Some(s) => s.replace(&placeholder, &value.to_string()).into(),
                    None => a.clone(),
                })
                .collect(),
            lib: self.lib.clone(),
            card: target.card,
            limit: target.card.is_none().then_some(target.total),
            device: self.places.slots[slot]
                .device
                .as_ref()
                .map(|d| d.uuid.clone()),
            launcher: self.args.launcher.clone(),
            base: self.base.clone(),
            time_limit: self.args.trial_timeout,
            moot,
        };
        let send = self.send.clone();
        std::thread::spawn(move || {
            let begun = Instant::now();
            // Stopping, fit reports nothing more: it exits once every trial is ended.
            let Some(outcome) = run_trial(&spec) else {
                return;
            };
            let _ = send.send(Finished {
                target: spec.target,
                value: spec.value,
                slot: spec.slot,
                held: spec.held,
                outcome,
                seconds: begun.elapsed().as_secs_f64(),
            });
        });
    }

    /// Takes a finished trial's outcome into the search, then ends the trials it made moot.
    fn take(&mut self, finished: Finished) {
        self.places.give_back(finished.slot, finished.held);
        let (t, value) = (finished.target, finished.value);
        self.flights
            .retain(|f| (f.target, f.value) != (finished.target, finished.value));
        if let Outcome::Stopped = finished.outcome {
            self.search.withdraw(t, value);
            self.answers[t].trials -= 1;
            self.answers[t].stopped += 1;
        } else {
            self.trial_seconds.push(finished.seconds);
            let verdict = self.verdict(&finished);
            self.search.finish(t, value, verdict);
        }
        for flight in &self.flights {
            let done = self.answers[flight.target].error.is_some();
            if done || self.search.moot(flight.target, flight.value) {
                flight.moot.store(true, Ordering::Relaxed);
            }
        }
        self.finished += 1;
        self.last_line = format!(
            "trial {}: {} {}={value}: {} ({})",
            self.finished,
            self.plan.targets[t].label,
            self.plan.name,
            outcome_word(&finished.outcome),
            duration(finished.seconds)
        );
        if !self.live {
            sayln!("gpumemhook fit: {}", self.last_line);
        }
    }

    /// What a finished trial teaches the search (`None`: it failed, which stops its target),
    /// recording a failure as its target's error.
    fn verdict(&mut self, finished: &Finished) -> Option<Verdict> {
        let (t, name, value) = (finished.target, &self.plan.name, finished.value);
        let (error, tail) = match &finished.outcome {
            Outcome::Fits { peak, overhead } => {
                let card = self.plan.targets[t].card.is_some();
                return Some(Verdict::Fits {
                    peak: *peak,
                    overhead: card.then_some(*overhead),
                });
            }
            Outcome::OutOfMemory { holders } => {
                self.holdings.0.push((t, value, holders.clone()));
                return Some(Verdict::OutOfMemory);
            }
            Outcome::Failed { why, tail } => (format!("{name}={value}: {why}"), tail.clone()),
            Outcome::TimedOut { limit, tail } => (
                format!(
                    "{name}={value}: timed out (ran past --trial-timeout {}), ended with its \
                     process group",
                    humantime::format_duration(*limit)
                ),
                tail.clone(),
            ),
            Outcome::NoAllocation => (
                format!(
                    "{name}={value}: the program allocated no GPU memory (is it running on the \
                     CPU?)"
                ),
                String::new(),
            ),
            Outcome::Stopped => return None,
        };
        let answer = &mut self.answers[t];
        if answer.error.is_none() {
            answer.timed_out = matches!(finished.outcome, Outcome::TimedOut { .. });
            answer.error = Some(error);
            answer.stderr_tail = tail;
        }
        None
    }

    /// Redraws the progress line: the last trial; each open target's bracket and the prediction
    /// being confirmed; what is running; the time left, from the trials' measured durations.
    fn progress(&self) {
        let brackets: Vec<String> = (0..self.plan.targets.len())
            .filter(|t| !self.search.settled(*t) && self.answers[*t].error.is_none())
            .map(|t| {
                let fit = self.search.largest_fitting(t);
                let fail = self.search.smallest_failing(t);
                let known = |v: Option<u64>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
                let label = &self.plan.targets[t].label;
                let bracket = format!("{label}: {}..{}", known(fit), known(fail));
                match self.search.prediction(t) {
                    Some(p) => format!("{bracket} confirming {p}"),
                    None => bracket,
                }
            })
            .collect();
        let left = match self.trial_seconds.is_empty() || self.search.trials_left() == 0 {
            true => String::new(),
            false => {
                let mean = self.trial_seconds.iter().sum::<f64>() / self.trial_seconds.len() as f64;
                let at_once = self.places.running.max(1) as f64;
                let guess = mean * self.search.trials_left() as f64 / at_once;
                format!(", about {} left", duration(guess))
            }
        };
        let brackets = match brackets.is_empty() {
            true => String::new(),
            false => format!(" · {}", brackets.join(", ")),
        };
        say!(
            "\r\x1b[2K{}{brackets} · {} running{left} · {}",
            self.last_line,
            self.places.running,
            duration(self.started.elapsed().as_secs_f64())
        );
    }
}

/// Prints the table, the errors, writes the JSON; returns the exit status.
fn present(
    plan: &Plan,
    found: &Found,
    json: Option<&std::path::Path>,
    painter: Painter,
    err_painter: Painter,
) -> Result<i32> {
    crate::console::print_or_end(&table(plan, found, painter))?;
    for (t, answer) in found.answers.iter().enumerate() {
        if let Some(why) = &answer.error {
            sayln!(
                "gpumemhook fit: {} {}: the search stopped at {why}",
                err_painter.paint("error:", Style::Bad),
                plan.targets[t].label
            );
            match answer.stderr_tail.is_empty() {
                true => sayln!("  (its stderr was empty)"),
                false => say!("  the last lines of its stderr:\n{}", answer.stderr_tail),
            }
        }
    }
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&json_results(plan, found))? + "\n";
        write_file(path, |out| out.write_all(text.as_bytes()))
            .with_context(|| format!("--json {}", path.display()))?;
    }
    Ok(if found.answers.iter().any(|a| a.error.is_some()) {
        1
    } else {
        0
    })
}

fn json_results(plan: &Plan, found: &Found) -> serde_json::Value {
    let results: Vec<serde_json::Value> = plan
        .targets
        .iter()
        .enumerate()
        .map(|(t, target)| {
            let largest = found.search.largest_fitting(t);
            let peak = largest.and_then(|v| found.search.peak(t, v)).map(|p| p.0);
            let answer = &found.answers[t];
            serde_json::json!({
                "card": target.label,
                "total": target.total,
                "largest": largest,
                "peak": peak,
                "smallest_failing": found.search.smallest_failing(t),
                "bound_by_device": answer.bound_by_device,
                "error": answer.error,
                "trials": answer.trials,
                "stopped": answer.stopped,
            })
        })
        .collect();
    serde_json::json!({ "param": plan.name, "results": results })
}

/// The LARGEST cell of target `t`.
fn largest_cell(answer: &Answer, largest: Option<u64>) -> Cell {
    match (largest, &answer.error) {
        (_, Some(_)) if answer.timed_out => Cell::right("timed out").styled(Style::Bad),
        (_, Some(_)) => Cell::right("error").styled(Style::Bad),
        (Some(v), None) if answer.bound_by_device => {
            Cell::right(format!("≥ {v} (device-bound)")).styled(Style::Peak)
        }
        (Some(v), None) => Cell::right(v.to_string()).styled(Style::Peak),
        (None, None) => Cell::right("none").styled(Style::Bad),
    }
}

fn table(plan: &Plan, found: &Found, painter: Painter) -> String {
    let mut t = Table::new(&[
        ("TARGET", false),
        ("TOTAL", true),
        ("LARGEST", true),
        ("PEAK", true),
        ("OF CARD", true),
        ("FAILS AT", true),
        ("HELD AT ITS OOM", false),
        ("TRIALS", true),
    ]);
    for (i, target) in plan.targets.iter().enumerate() {
        let largest = found.search.largest_fitting(i);
        let peak = largest.and_then(|v| found.search.peak(i, v));
        let failing = found.search.smallest_failing(i);
        let holders = failing
            .and_then(|v| found.holdings.at(i, v))
            .map(|h| {
                h.iter()
                    .map(|(m, b)| format!("{m} {}", format_size(*b)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let dash = || Cell::right("-").styled(Style::Dim);
        t.push(vec![
            Cell::left(&target.label).styled(Style::Name),
            Cell::right(format_size(target.total)),
            largest_cell(&found.answers[i], largest),
            peak.map_or_else(dash, |(p, _)| Cell::right(format_size(p))),
            // Of the card: the peak with the context charged inside it; of a ceiling: the peak.
            peak.map_or_else(dash, |(p, overhead)| {
                let share = (p + overhead) as f64 * 100.0 / target.total as f64;
                Cell::right(format!("{share:.0}%"))
            }),
            failing.map_or_else(dash, |v| Cell::right(v.to_string())),
            Cell::left(holders).styled(Style::Dim),
            Cell::right(found.answers[i].trials.to_string()),
        ]);
    }
    let stopped: usize = found.answers.iter().map(|a| a.stopped).sum();
    format!(
        "{}\n{}: {}..{}; trials: {}{} in {}\n",
        t.render(painter),
        plan.name,
        plan.lo,
        plan.hi,
        found.answers.iter().map(|a| a.trials).sum::<usize>(),
        match stopped {
            0 => String::new(),
            n => format!(" (+{n} stopped)"),
        },
        duration(found.took.as_secs_f64())
    )
}

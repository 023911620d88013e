//! The [`Timeline`]: what a reader keeps of a timeline's events, as much as [`Keep`] says, and the
//! step both of its readers (the builder from the event stream, the reader of Chrome JSON) take
//! each allocation, free, refusal and failure by.

use gpumemhook_segment::layout::{MemKind, MAX_SCOPES};
use gpumemhook_segment::recording::EventKind;
use std::collections::BTreeMap;

/// Where a run stands among others: what lines up the timelines of a job's processes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunInfo {
    /// The process's job labels (rank, local rank, group, job name...), as its segment has them.
    pub labels: gpumemhook_reader::JobLabels,
    /// The machine's host name, `None` when unknown.
    pub host: Option<String>,
    /// Microseconds to add to a timestamp (`CLOCK_MONOTONIC`) to get Unix time, `None` when the
    /// file does not say.
    pub wall_offset_us: Option<f64>,
}

/// A timeline read back from a trace file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub pid: u32,
    pub command: String,
    /// Rank, group, host and wall clock of the run.
    pub info: RunInfo,
    /// The writer died before finishing the file (a recording cut short by SIGKILL, say): the
    /// timeline ends at its last whole event.
    pub cut_short: bool,
    /// Its process died without finishing it and `gpumemhook run` closed it: `Some(signal)` when
    /// the signal that killed it is known.
    pub killed_by: Option<Option<u32>>,
    /// Per device: `(ts in µs, used after)` in file order.
    pub used: BTreeMap<u32, Vec<(f64, u64)>>,
    /// `(name, open µs, close µs or None while still open at exit)`.
    pub scopes: Vec<(String, f64, Option<f64>)>,
    /// The ceilings in force at exit, per device (the metadata's `limits`).
    pub limits: BTreeMap<u32, u64>,
    /// Per device, when its peak was restarted (`reset_peak`), µs, in file order.
    pub peak_resets: BTreeMap<u32, Vec<f64>>,
    /// When the process exited (µs), for files that say (the metadata's `end`).
    pub end: Option<f64>,
    /// Per device, the ceiling over time: `(ts in µs, ceiling from then on, None for no ceiling)`,
    /// in file order. From the `device <d> limit` counter events; for a file without them, one step
    /// per device of the metadata's `limits`, at the timeline's first timestamp.
    pub ceilings: BTreeMap<u32, Vec<(f64, Option<u64>)>>,
    /// Allocations refused by the ceiling and allocations the driver failed, in file order: with
    /// [`Keep::Peaks`], only the first and the last [`MARKS_KEPT`] (`counts` has them all).
    pub marks: Vec<Mark>,
    /// How many refusals and failures between the first and last [`MARKS_KEPT`] `marks` leaves out.
    pub marks_left_out: u64,
    pub events: u64,
    pub dropped: u64,
    /// Count of instant events per category (`alloc`, `free`, `denied`, `failed`), every memory
    /// kind together.
    pub counts: BTreeMap<String, u64>,
    /// The same counts split by memory kind: `kind_counts[kind][category]`, kind being `device`,
    /// `managed` or `host_pinned` (events without a kind count as `device`).
    pub kind_counts: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per device and module, the module's device bytes over time: `(ts in µs, held after)`,
    /// summed from the device allocations and frees that name their module, in file order.
    pub module_used: BTreeMap<u32, BTreeMap<String, Vec<(f64, u64)>>>,
    /// Every allocation, free, refusal and failure of device memory, in file order, with what the
    /// file says of each (`gpumemhook view` pairs frees with their allocations by address).
    pub allocations: Vec<AllocationEvent>,
    /// Per device, how many changes of `used` the timeline had, where `used` holds only some of
    /// them ([`Keep::Peaks`]); empty when `used` is whole.
    pub used_changes: BTreeMap<u32, u64>,
    /// A ring timeline's (`GPUMEMHOOK_TRACE_MAX`): what it kept of the events it overwrote; the
    /// fields above hold only the events after [`RingPart::detail_from`] (and some before).
    pub ring: Option<RingPart>,
    /// Set when the timeline was reduced as it was read (`crate::columns`): `used` and
    /// `module_used` hold a few changes per column of time, and `allocations` only those live at
    /// [`Reduced::moments`].
    pub reduced: Option<Reduced>,
}

/// What a timeline reduced as it was read keeps in place of every change and every allocation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reduced {
    /// How many columns of time the curves were reduced to.
    pub columns: u32,
    /// The moments (µs) whose live allocations the timeline holds (each allocation live at one of
    /// them, with its free); empty when it holds none.
    pub moments: Vec<f64>,
    /// Each call site's most bytes held at once, over every allocation of the run.
    pub site_peaks: BTreeMap<String, u64>,
    /// How many refusals and failures of device memory between the first and last [`MARKS_KEPT`]
    /// `allocations` leaves out.
    pub refused_left_out: u64,
}

/// What a ring timeline kept of the events it overwrote: their sums, the segment's peaks, and
/// `used`'s lowest and highest per interval (`gpumemhook_segment::ring`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RingPart {
    pub figures: gpumemhook_segment::SummaryFigures,
    /// The names of the modules the figures number.
    pub module_names: BTreeMap<u8, String>,
}

impl RingPart {
    /// The time of the newest event overwritten (µs): every event after it is in the timeline;
    /// `None` when the ring overwrote nothing.
    pub fn detail_from(&self) -> Option<f64> {
        (self.figures.evicted_events > 0).then(|| self.figures.detail_from_ns as f64 / 1000.0)
    }

    /// The name of a module the figures number (`""` for none, or one the file does not name).
    pub fn module_name(&self, number: u8) -> &str {
        self.module_names.get(&number).map_or("", String::as_str)
    }
}

/// One device-memory allocation, free, refusal or failure, as the timeline holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocationEvent {
    /// µs, as every timestamp of the file.
    pub ts: f64,
    /// [`EventKind::Alloc`], [`EventKind::Free`], [`EventKind::Denied`] or [`EventKind::Failed`].
    pub kind: EventKind,
    pub device: u32,
    pub bytes: u64,
    /// The device address (`0x…` in the file), 0 when unreadable.
    pub address: u64,
    pub tid: u32,
    /// The module charged, `""` when unknown.
    pub module: String,
    /// The Python call site, `""` when none was recorded.
    pub site: String,
}

impl Timeline {
    /// How many `event` events (alloc, free, denied, failed) of memory `kind` the timeline holds.
    pub fn count(&self, kind: MemKind, event: EventKind) -> u64 {
        self.kind_counts
            .get(kind.name())
            .and_then(|c| c.get(event.category()))
            .copied()
            .unwrap_or(0)
    }
}

/// Whether an allocation was refused by the ceiling or failed in the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// Refused by gpumemhook's ceiling (`cat` `denied`).
    Denied,
    /// Failed in the driver (`cat` `failed`).
    Failed,
}

/// An allocation that did not happen, where it would sit on the `used` curve.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub kind: MarkKind,
    /// µs, as every timestamp of the file.
    pub ts: f64,
    pub device: u32,
    /// The size asked for.
    pub bytes: u64,
    /// The device's `used` at that moment (unchanged by the refusal).
    pub used: u64,
    /// Memory kind asked for: `device`, `managed` or `host_pinned`.
    pub memory: String,
}

/// How much of a timeline a reader keeps: what grows with its events beyond the `used` curves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Keep {
    /// The figures a replay states (`report`, `run`, and the first reading of `plot` and `view`):
    /// each device's `used` kept only where it matters to them (see [`crate::TimelineBuilder`]),
    /// with the number of changes in [`Timeline::used_changes`]; ceilings and scopes whole, the
    /// first and last [`MARKS_KEPT`] marks. Memory then grows with the number of new highs, not
    /// of events.
    Peaks,
    /// The whole `used` curves (`plot`), ceilings, scopes, marks.
    Figures,
    /// And each module's bytes over time (`plot --by-module`).
    Modules,
    /// And every allocation event (`view`, which pairs frees with allocations).
    Everything,
}

/// How many of the first, and of the last, refusals and failures a bounded reader keeps
/// ([`Keep::Peaks`], and the allocations `view` keeps of a long recording).
pub const MARKS_KEPT: usize = 1000;

/// Keeps `item` in `kept` if it is among the first or the last [`MARKS_KEPT`] of those offered:
/// the last are a ring after the first, `left_out` counting what it overwrote ([`in_order`] puts
/// it back in order).
pub(crate) fn keep_first_and_last<T>(kept: &mut Vec<T>, left_out: &mut u64, item: T) {
    if kept.len() < 2 * MARKS_KEPT {
        kept.push(item);
        return;
    }
    kept[MARKS_KEPT + (*left_out % MARKS_KEPT as u64) as usize] = item;
    *left_out += 1;
}

/// What [`keep_first_and_last`] kept, in the order offered.
pub(crate) fn in_order<T>(kept: &mut [T], left_out: u64) {
    if let Some(last) = kept.get_mut(MARKS_KEPT..) {
        last.rotate_left((left_out % MARKS_KEPT as u64) as usize);
    }
}

/// What reading a trace has gathered so far.
#[derive(Default)]
pub(crate) struct Reading {
    pub(crate) t: Timeline,
    /// Scopes begun and not yet ended, by id: name and start.
    pub(crate) open: BTreeMap<u64, (String, f64)>,
    /// The earliest time of an event, `None` before the first.
    pub(crate) first_ts: Option<f64>,
}

impl Reading {
    /// The timeline, once every event is in: scopes still open at the end, and the ceilings of a
    /// file from before ceiling events.
    /// A scope opened at `ts` in `slot`, kept until it closes. A slot the hook never gives (it
    /// has [`MAX_SCOPES`]) can only be a forged file's: not kept, so that the scopes open at once
    /// cost at most that many entries, however many a file opens and never closes.
    pub(crate) fn open_scope(&mut self, slot: u64, name: &str, ts: f64) {
        if slot < MAX_SCOPES as u64 {
            self.open.insert(slot, (name.to_string(), ts));
        }
    }

    /// The timeline, once every event is in: scopes still open at the end, the ceilings of a file
    /// from before ceiling events, and no ceiling steps for a device that never had a ceiling
    /// (files of earlier versions start every device's counter at 0, meaning none).
    pub(crate) fn finish(self) -> Timeline {
        let mut t = self.t;
        t.scopes
            .extend(self.open.into_values().map(|(n, start)| (n, start, None)));
        if t.ceilings.is_empty() {
            // A file from before ceiling events: the ceilings at exit are all it knows.
            let start = self.first_ts.unwrap_or(0.0);
            for (&d, &limit) in &t.limits {
                t.ceilings.insert(d, vec![(start, Some(limit))]);
            }
        }
        t.ceilings
            .retain(|_, steps| steps.iter().any(|(_, limit)| limit.is_some()));
        in_order(&mut t.marks, t.marks_left_out);
        t
    }
}

/// An allocation, free, refusal or failure as either reader found it.
pub(crate) struct MemoryInstant<'a> {
    pub(crate) ts: f64,
    /// The category (`alloc`, `free`, `denied`, `failed`, or one this version does not know).
    pub(crate) cat: &'a str,
    pub(crate) device: Option<u32>,
    pub(crate) bytes: u64,
    pub(crate) used: u64,
    pub(crate) address: u64,
    pub(crate) tid: u32,
    /// The memory kind's name (`device`, `managed`, `host_pinned`).
    pub(crate) memory: &'a str,
    pub(crate) module: &'a str,
    pub(crate) site: &'a str,
}

/// The step both readers share.
impl Timeline {
    /// An allocation, free, refusal or failure (or an instant of a category this version does not
    /// know): counted by category and memory kind; of device memory, kept as an allocation event
    /// and a module's step (as `keep` says); a refusal or failure, as a mark.
    pub(crate) fn take_memory(&mut self, m: &MemoryInstant<'_>, keep: Keep) {
        let count = |map: &mut BTreeMap<String, u64>, key: &str| match map.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                map.insert(key.to_string(), 1);
            }
        };
        count(&mut self.counts, m.cat);
        match self.kind_counts.get_mut(m.memory) {
            Some(counts) => count(counts, m.cat),
            None => {
                let mut counts = BTreeMap::new();
                count(&mut counts, m.cat);
                self.kind_counts.insert(m.memory.to_string(), counts);
            }
        }
        let event = EventKind::of_category(m.cat);
        if let (Some(event), Some(device), true) =
            (event, m.device, m.memory == MemKind::Device.name())
        {
            if matches!(event, EventKind::Alloc | EventKind::Free)
                && !m.module.is_empty()
                && keep >= Keep::Modules
            {
                self.module_step(device, m.module, m.ts, event, m.bytes);
            }
            if keep == Keep::Everything {
                self.allocations.push(AllocationEvent {
                    ts: m.ts,
                    kind: event,
                    device,
                    bytes: m.bytes,
                    address: m.address,
                    tid: m.tid,
                    module: m.module.to_string(),
                    site: m.site.to_string(),
                });
            }
        }
        let kind = match event {
            Some(EventKind::Denied) => Some(MarkKind::Denied),
            Some(EventKind::Failed) => Some(MarkKind::Failed),
            _ => None,
        };
        if let (Some(kind), Some(device)) = (kind, m.device) {
            let mark = Mark {
                kind,
                ts: m.ts,
                device,
                bytes: m.bytes,
                used: m.used,
                memory: m.memory.to_string(),
            };
            if keep == Keep::Peaks {
                keep_first_and_last(&mut self.marks, &mut self.marks_left_out, mark);
            } else {
                self.marks.push(mark);
            }
        }
    }

    /// The next step of what `module` holds on `device`: an allocation or free of `bytes`.
    fn module_step(&mut self, device: u32, module: &str, ts: f64, event: EventKind, bytes: u64) {
        let modules = self.module_used.entry(device).or_default();
        if !modules.contains_key(module) {
            modules.insert(module.to_string(), Vec::new());
        }
        let Some(series) = modules.get_mut(module) else {
            return;
        };
        let before = series.last().map_or(0, |&(_, held)| held);
        let after = if event == EventKind::Alloc {
            before.saturating_add(bytes)
        } else {
            before.saturating_sub(bytes)
        };
        series.push((ts, after));
    }
}

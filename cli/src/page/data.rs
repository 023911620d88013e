//! The page's data: a timeline, an exit report, an out-of-memory report or a live process's
//! snapshot turned into the compact JSON `gpumemhook view` embeds in its page.
//!
//! A timeline's series are columnar arrays of integers, times in µs from the first event and both
//! times and `used` delta-encoded (each value is the difference from the one before), so that a
//! million events stay under 40 bytes each. Every allocation is one record (its start, how long it
//! was held, its size, module, site and thread), frees paired with their allocations by address:
//! the page finds what was live at any instant from these alone. The data carries the rule sizes
//! are written by (`sizes`, the reader's `SIZE_RULE`), which the page's script applies.

use gpumemhook_reader::EventKind;
use gpumemhook_reader::{SizeRule, Snapshot, SIZE_RULE};
use gpumemhook_timeline::Timeline;
use serde::Serialize;
use std::collections::HashMap;

use gpumemhook_timeline::{replay, time_span};

/// Everything the page draws: one run, two side by side (`view A B`), or the processes of one job
/// (`job`: `view A B C ...`, `run --html` of several processes).
#[derive(Serialize)]
pub struct PageData {
    pub runs: Vec<RunData>,
    /// The job the runs are the processes of, all on its time axis; `None` for one run or two
    /// compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<JobData>,
    /// How sizes are written ([`SIZE_RULE`]): the page formats its sizes by it (`js/format.js`).
    pub sizes: SizeRule,
}

impl PageData {
    /// The page of `runs`.
    pub fn new(runs: Vec<RunData>) -> Self {
        PageData {
            runs,
            job: None,
            sizes: SIZE_RULE,
        }
    }
}

/// The job's part of the page (`cli/src/page/job.rs` makes it): its clock, each process, each
/// group's joint line.
#[derive(Serialize, Debug, Default)]
pub struct JobData {
    /// `monotonic` (one machine's `CLOCK_MONOTONIC`), `wall` (aligned by each file's wall-clock
    /// offset) or `separate` (several machines, not all with a wall-clock offset: each process from
    /// its own first event).
    pub clock: &'static str,
    /// The clock in words, as the page states it.
    pub clock_note: String,
    /// Unix time of the axis's 0, µs, when the files say it.
    pub start_unix_us: Option<f64>,
    /// The job's last event, µs from its first.
    pub end: i64,
    /// One per run of the page, in the same order (by rank, then pid).
    pub procs: Vec<ProcData>,
    /// One line per group and device that two or more processes of the page share.
    pub groups: Vec<GroupLine>,
    /// The index (in `procs`) of the process with the highest peak; the lowest rank on a tie.
    pub top: Option<usize>,
}

/// One process of the job: who it is and its peak.
#[derive(Serialize, Debug, Default, PartialEq)]
pub struct ProcData {
    /// `info.labels.rank`; the page names the process by its pid without one.
    pub rank: Option<String>,
    pub local_rank: Option<String>,
    pub host: Option<String>,
    pub group: Option<String>,
    pub pid: u32,
    /// The devices it used.
    pub devices: Vec<u32>,
    /// Its largest device peak, that device, and when (µs on the job's axis).
    pub peak: u64,
    pub peak_device: u32,
    pub peak_t: Option<i64>,
    /// Its recording ended early (the writer died): its lane ends at its last whole event.
    pub cut_short: bool,
}

/// A group's joint `used` on one device: the sum of its members' `used` over time.
#[derive(Serialize, Debug, Default, PartialEq)]
pub struct GroupLine {
    pub name: String,
    pub device: u32,
    /// The members, as indexes of `procs`.
    pub members: Vec<usize>,
    /// Times of the changes (delta-encoded µs on the job's axis) and the joint `used` after each
    /// (delta-encoded bytes).
    pub t: Vec<i64>,
    pub v: Vec<i64>,
    /// The most the members held together at one instant, and when.
    pub peak: u64,
    pub peak_t: i64,
}

/// One run: its timeline's series when it has one, the report it came from otherwise.
#[derive(Serialize, Default)]
pub struct RunData {
    /// The file (or `pid N`) it was read from.
    pub label: String,
    /// `timeline`, `report`, `oom` or `live`.
    pub source: &'static str,
    pub command: String,
    pub pid: u32,
    /// The timeline's first timestamp, µs of `CLOCK_MONOTONIC`: every time below counts from it.
    /// On a job's page, the job's first event on this process's clock instead (the runs share one
    /// time axis: `RunData::shift`).
    pub t0: f64,
    /// The timeline's last timestamp, µs from `t0`.
    pub end: i64,
    pub devices: Vec<DeviceSeries>,
    /// `[name, open, close or null]`, µs from `t0`.
    pub scopes: Vec<(String, i64, Option<i64>)>,
    /// The names the allocation records point to by index (`m`, `s`, `h`): index 0 is "unknown"
    /// for modules and "no site" for sites.
    pub modules: Vec<String>,
    pub sites: Vec<String>,
    pub threads: Vec<u32>,
    pub allocs: AllocColumns,
    /// Refused and failed allocations: `[kind, t, device, bytes, used, module, site]`.
    pub marks: Vec<(&'static str, i64, u32, u64, u64, u32, u32)>,
    /// Each site's largest held bytes over the run (the exit report's `by_site[].peak`).
    pub site_peaks: Vec<(String, u64)>,
    /// A long recording's, reduced as it was read: the columns of time its curves were reduced to,
    /// 0 when they are whole.
    #[serde(skip_serializing_if = "is_zero")]
    pub columns: u32,
    /// The moments (µs from `t0`) whose live allocations `allocs` holds, when it does not hold
    /// every allocation: a click picks the nearest, and the stacks by module or site are drawn from
    /// them (`js/series.js`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub moments: Vec<i64>,
    /// How many refusals and failures between the first and last `MARKS_KEPT` `marks` leaves out
    /// (a long recording's).
    #[serde(skip_serializing_if = "is_none")]
    pub marks_left_out: u64,
    pub summary: Summary,
    /// The report itself, for `report`, `oom` and `live` runs.
    pub report: Option<Snapshot>,
}

impl RunData {
    /// Moves every time of the run `by` µs later, and `t0` as much earlier: the same instants,
    /// counted from a start `by` µs before the run's first event (a job's, on the job's page).
    pub fn shift(&mut self, by: i64) {
        self.t0 -= by as f64;
        self.end += by;
        for d in &mut self.devices {
            d.peak_t += by;
            if let Some(r) = &mut d.restarted {
                *r += by;
            }
            if let Some(first) = d.t.first_mut() {
                *first += by;
            }
            for c in &mut d.ceil {
                c.0 += by;
            }
            for r in &mut d.resets {
                *r += by;
            }
        }
        for (_, open, close) in &mut self.scopes {
            *open += by;
            if let Some(c) = close {
                *c += by;
            }
        }
        if let Some(first) = self.allocs.t.first_mut() {
            *first += by;
        }
        for m in &mut self.marks {
            m.1 += by;
        }
        for m in &mut self.moments {
            *m += by;
        }
        if let Some(t) = &mut self.summary.peak_t {
            *t += by;
        }
    }
}

/// The figures the page states and a test compares with the exit report.
#[derive(Serialize, Default)]
pub struct Summary {
    /// The largest device peak (since the last restart, as the exit report states it).
    pub peak: u64,
    pub peak_device: u32,
    /// When it was reached, µs from `t0` (timelines only).
    pub peak_t: Option<i64>,
    /// The module with the largest peak, and that peak.
    pub top_module: String,
    pub top_module_peak: u64,
    /// The call site with the largest peak, and that peak (`""` without call sites).
    pub top_site: String,
    pub top_site_peak: u64,
    /// A ring timeline's: where its full detail starts (µs from `t0`) and how many events before
    /// it are summarised (`GPUMEMHOOK_TRACE_MAX`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail_from: Option<(i64, u64)>,
}

/// One device's `used` and ceiling over time.
#[derive(Serialize)]
pub struct DeviceSeries {
    pub device: u32,
    pub peak: u64,
    pub peak_t: i64,
    pub restarted: Option<i64>,
    pub last: u64,
    /// Times of the `used` changes, delta-encoded µs.
    pub t: Vec<i64>,
    /// `used` after each change, delta-encoded bytes.
    pub v: Vec<i64>,
    /// The ceiling's steps: `[t, bytes or null]`.
    pub ceil: Vec<(i64, Option<u64>)>,
    pub resets: Vec<i64>,
}

/// Every device allocation of the run as columns, in order of their start.
#[derive(Serialize, Default)]
pub struct AllocColumns {
    /// Device ordinals.
    pub d: Vec<u32>,
    /// Starts, delta-encoded µs.
    pub t: Vec<i64>,
    /// How long each was held, µs; -1 for held to the end.
    pub e: Vec<i64>,
    pub b: Vec<u64>,
    /// Indexes into `modules`, `sites`, `threads`.
    pub m: Vec<u32>,
    pub s: Vec<u32>,
    pub h: Vec<u32>,
}

/// Names by first appearance, each given the index it is written as.
struct Names<K> {
    index: HashMap<K, u32>,
    list: Vec<K>,
}

impl<K: std::hash::Hash + Eq + Clone> Names<K> {
    fn starting_with(first: K) -> Self {
        let mut names = Names {
            index: HashMap::new(),
            list: Vec::new(),
        };
        names.of(&first);
        names
    }

    fn of(&mut self, key: &K) -> u32 {
        if let Some(&i) = self.index.get(key) {
            return i;
        }
        let i = self.list.len() as u32;
        self.index.insert(key.clone(), i);
        self.list.push(key.clone());
        i
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_none(n: &u64) -> bool {
    *n == 0
}

/// Microseconds from `t0`, whole.
fn micros(ts: f64, t0: f64) -> i64 {
    (ts - t0).round() as i64
}

/// Each value's difference from the one before (the first from 0).
pub(super) fn deltas(values: impl Iterator<Item = i64>) -> Vec<i64> {
    let mut last = 0;
    values
        .map(|v| {
            let d = v - last;
            last = v;
            d
        })
        .collect()
}

/// The page's data of a timeline read from `label`.
pub fn from_timeline(label: String, t: &Timeline) -> RunData {
    let t0 = time_span(t).map_or(0.0, |s| s.0);
    let (replayed, _) = replay(t);
    let devices = replayed
        .iter()
        .map(|r| device_series(t, r, t0))
        .collect::<Vec<_>>();
    let mut run = RunData {
        label,
        source: "timeline",
        command: t.command.clone(),
        pid: t.pid,
        t0,
        end: time_span(t).map_or(0, |s| micros(s.1, t0)),
        devices,
        scopes: t
            .scopes
            .iter()
            .map(|(name, open, close)| {
                (
                    name.clone(),
                    micros(*open, t0),
                    close.map(|c| micros(c, t0)),
                )
            })
            .collect(),
        ..RunData::default()
    };
    fill_allocations(&mut run, t, t0);
    if let Some(reduced) = &t.reduced {
        run.columns = reduced.columns;
        run.moments = reduced.moments.iter().map(|&m| micros(m, t0)).collect();
        run.marks_left_out = reduced.refused_left_out;
        if !reduced.moments.is_empty() {
            // The allocations kept are not all: each site's peak is the reading's, of every one.
            run.site_peaks = reduced.site_peaks.clone().into_iter().collect();
            run.site_peaks.retain(|s| !s.0.is_empty());
            run.site_peaks.sort_by_key(|s| std::cmp::Reverse(s.1));
        }
    }
    run.summary = timeline_summary(&run, t);
    run
}

fn device_series(t: &Timeline, r: &gpumemhook_timeline::DeviceReplay, t0: f64) -> DeviceSeries {
    let mut points = t.used.get(&r.device).cloned().unwrap_or_default();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    DeviceSeries {
        device: r.device,
        peak: r.peak,
        peak_t: micros(r.peak_ts, t0),
        restarted: r.restarted.map(|at| micros(at, t0)),
        last: r.last,
        t: deltas(points.iter().map(|p| micros(p.0, t0))),
        v: deltas(points.iter().map(|p| p.1 as i64)),
        ceil: t
            .ceilings
            .get(&r.device)
            .into_iter()
            .flatten()
            .map(|&(ts, limit)| (micros(ts, t0).max(0), limit))
            .collect(),
        resets: t
            .peak_resets
            .get(&r.device)
            .into_iter()
            .flatten()
            .map(|&ts| micros(ts, t0))
            .collect(),
    }
}

/// Pairs every free with its allocation (same device and address) and writes the allocation
/// records, the refusals and failures, and each site's peak.
fn fill_allocations(run: &mut RunData, t: &Timeline, t0: f64) {
    let mut events: Vec<_> = t.allocations.iter().collect();
    events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    let mut modules = Names::starting_with(String::new());
    let mut sites = Names::starting_with(String::new());
    let mut threads = Names::starting_with(0u32);
    let mut open: HashMap<(u32, u64), usize> = HashMap::new();
    let mut starts = Vec::new();
    let mut site_held: Vec<(u64, u64)> = vec![(0, 0)];
    let a = &mut run.allocs;
    for e in events {
        let (m, s) = (modules.of(&e.module), sites.of(&e.site));
        if site_held.len() <= s as usize {
            site_held.push((0, 0));
        }
        let at = micros(e.ts, t0);
        match e.kind {
            EventKind::Alloc => {
                open.insert((e.device, e.address), a.b.len());
                starts.push(at);
                a.d.push(e.device);
                a.e.push(-1);
                a.b.push(e.bytes);
                a.m.push(m);
                a.s.push(s);
                a.h.push(threads.of(&e.tid));
                let held = &mut site_held[s as usize];
                held.0 += e.bytes;
                held.1 = held.1.max(held.0);
            }
            EventKind::Free => {
                if let Some(i) = open.remove(&(e.device, e.address)) {
                    a.e[i] = at - starts[i];
                    let held = &mut site_held[a.s[i] as usize];
                    held.0 = held.0.saturating_sub(a.b[i]);
                }
            }
            kind => {
                let name = if kind == EventKind::Denied {
                    "denied"
                } else {
                    "failed"
                };
                let used = t
                    .used
                    .get(&e.device)
                    .map_or(0, |p| gpumemhook_timeline::used_at(p, e.ts));
                run.marks.push((name, at, e.device, e.bytes, used, m, s));
            }
        }
    }
    a.t = deltas(starts.into_iter());
    run.site_peaks = sites
        .list
        .iter()
        .zip(&site_held)
        .skip(1)
        .map(|(site, held)| (site.clone(), held.1))
        .collect();
    run.site_peaks.sort_by_key(|s| std::cmp::Reverse(s.1));
    run.modules = modules.list;
    run.sites = sites.list;
    run.threads = threads.list;
}

fn timeline_summary(run: &RunData, t: &Timeline) -> Summary {
    let mut summary = Summary::default();
    if let Some(d) = run
        .devices
        .iter()
        .max_by_key(|d| (d.peak, std::cmp::Reverse(d.device)))
    {
        (summary.peak, summary.peak_device, summary.peak_t) = (d.peak, d.device, Some(d.peak_t));
    }
    let module_peaks = t.module_used.values().flat_map(|modules| {
        modules
            .iter()
            .map(|(name, series)| (name, series.iter().map(|p| p.1).max().unwrap_or(0)))
    });
    if let Some((name, peak)) = module_peaks.max_by_key(|m| m.1) {
        (summary.top_module, summary.top_module_peak) = (name.clone(), peak);
    }
    if let Some((site, peak)) = run.site_peaks.first() {
        (summary.top_site, summary.top_site_peak) = (site.clone(), *peak);
    }
    summary.detail_from = t.ring.as_ref().and_then(|ring| {
        let from = ring.detail_from()?;
        Some((micros(from, run.t0).max(0), ring.figures.evicted_events))
    });
    summary
}

/// The page's data of an exit report, an out-of-memory report or a live process's snapshot.
pub fn from_snapshot(label: String, source: &'static str, s: Snapshot) -> RunData {
    let mut summary = Summary::default();
    if let Some(d) = s
        .devices
        .iter()
        .max_by_key(|d| (d.peak, std::cmp::Reverse(d.device)))
    {
        (summary.peak, summary.peak_device) = (d.peak, d.device);
    }
    let modules = s.devices.iter().flat_map(|d| &d.by_module);
    if let Some(m) = modules.max_by_key(|m| m.peak) {
        (summary.top_module, summary.top_module_peak) = (m.module.clone(), m.peak);
    }
    if let Some(site) = s.by_site.iter().flatten().max_by_key(|site| site.peak) {
        (summary.top_site, summary.top_site_peak) = (site.site.clone(), site.peak);
    }
    RunData {
        label,
        source,
        command: s.command.clone(),
        pid: s.pid,
        summary,
        report: Some(s),
        ..RunData::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumemhook_timeline::AllocationEvent;

    fn event(ts: f64, kind: EventKind, bytes: u64, address: u64, site: &str) -> AllocationEvent {
        AllocationEvent {
            ts,
            kind,
            device: 0,
            bytes,
            address,
            tid: 9,
            module: "libx.so".into(),
            site: site.into(),
        }
    }

    #[test]
    fn frees_pair_with_their_allocations_and_sites_keep_their_peaks() {
        let mut t = Timeline::default();
        t.used
            .insert(0, vec![(10.0, 100), (11.0, 300), (12.0, 200)]);
        t.allocations = vec![
            event(10.0, EventKind::Alloc, 100, 0xa, "a.py:1 in f"),
            event(11.0, EventKind::Alloc, 200, 0xb, "a.py:2 in g"),
            event(12.0, EventKind::Free, 100, 0xa, ""),
            event(13.0, EventKind::Denied, 999, 0, "a.py:2 in g"),
        ];
        let run = from_timeline("t".into(), &t);
        assert_eq!(run.allocs.t, [0, 1]);
        assert_eq!(
            run.allocs.e,
            [2, -1],
            "the first freed after 2 µs, the second held"
        );
        assert_eq!(run.devices[0].t, [0, 1, 1]);
        assert_eq!(run.devices[0].v, [100, 200, -100]);
        assert_eq!(run.summary.peak, 300);
        assert_eq!(run.summary.peak_t, Some(1));
        assert_eq!(run.summary.top_site, "a.py:2 in g");
        assert_eq!(run.marks, [("denied", 3, 0, 999, 200, 1, 2)]);
        assert_eq!(run.threads, [0, 9]);
    }
}

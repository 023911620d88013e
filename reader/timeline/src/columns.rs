//! Reducing a recording as it is read, so that what `plot` and `view` keep of it is bounded
//! whatever its length: each `used` curve (a device's, a module's) reduced per column of time
//! ([`Columns`]: of the changes in a column, the first, the lowest, the highest and the last), and
//! the allocations to those live at chosen moments ([`Reduction::moments`]). A [`Reducer`] is an
//! [`EventSink`] read beside a [`Keep::Peaks`] builder ([`read_recording_reduced`]).
//!
//! Every point kept is a change the file holds, at its own time: a curve's peak, when it was first
//! reached, its lowest and its last value stay exact; so does `used` at each anchor (a scope
//! opening or closing, a peak restart, a moment), where the column is cut short, so that the
//! figures replayed between anchors are the whole curve's. Refusals and failures are kept as
//! [`Keep::Peaks`] keeps its marks: the first and the last [`crate::MARKS_KEPT`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use gpumemhook_segment::layout::MemKind;
use gpumemhook_segment::recording::EventKind;

use crate::error::TraceError;
use crate::event::{Event, EventSink};
use crate::timeline::{in_order, keep_first_and_last, AllocationEvent, Keep, Reduced, Timeline};

/// A recording with more events than this is worth reducing: below it, `plot` and `view` keep it
/// whole (in a few megabytes).
pub const REDUCE_ABOVE_EVENTS: u64 = 100_000;

/// Time from `from` to `to` (µs) split into `count` equal columns; what comes before is one more
/// column, and what comes after another.
#[derive(Clone, Debug, PartialEq)]
pub struct Columns {
    pub from: f64,
    pub to: f64,
    pub count: u32,
}

impl Columns {
    /// The column of `ts`: -1 before `from`, `count` at or after `to`. (`plot` tells the pixel
    /// column of a change by it too, so that a curve reduced to columns and a whole one agree
    /// to the last bit at a column's edge.)
    pub fn column(&self, ts: f64) -> i64 {
        if ts < self.from {
            return -1;
        }
        let width = (self.to - self.from) / f64::from(self.count.max(1));
        if width.is_nan() || width <= 0.0 {
            return i64::from(self.count);
        }
        (((ts - self.from) / width).floor() as i64).min(i64::from(self.count))
    }
}

/// How a recording is reduced as it is read.
#[derive(Clone, Debug, PartialEq)]
pub struct Reduction {
    pub columns: Columns,
    /// Each module's curve is kept too (reduced the same way).
    pub modules: bool,
    /// The moments (µs) whose live allocations are kept, `None` to keep no allocation.
    pub moments: Option<Vec<f64>>,
    /// Times (µs) where `used`'s column is cut short, besides the moments: a change at or after one
    /// is in a column of its own (`plot`'s window, whose edges need not be a column's).
    pub cuts: Vec<f64>,
}

/// A change kept: its place among the series' changes, its time and value.
type Kept = Option<(u64, f64, u64)>;

/// One series as it is reduced: its current column's first, lowest, highest and last change
/// (the first change at the lowest and at the highest value), and the points kept.
struct ColumnSeries {
    column: i64,
    seen: u64,
    kept: [Kept; 4],
    points: Vec<(f64, u64)>,
    /// The series' value now (a module's bytes held, which its changes add to).
    now: u64,
}

impl ColumnSeries {
    fn new() -> ColumnSeries {
        ColumnSeries {
            column: i64::MIN,
            seen: 0,
            kept: [None; 4],
            points: Vec::new(),
            now: 0,
        }
    }

    /// A change to `value` at `ts`, in column `column` (or the current one, for a change the file
    /// has after a later one).
    fn take(&mut self, column: i64, ts: f64, value: u64) {
        let column = column.max(self.column);
        if column != self.column {
            self.flush();
            self.column = column;
        }
        let point = Some((self.seen, ts, value));
        self.seen += 1;
        self.now = value;
        let [first, low, high, last] = &mut self.kept;
        if first.is_none() {
            *first = point;
        }
        if low.is_none_or(|l| value < l.2) {
            *low = point;
        }
        if high.is_none_or(|h| value > h.2) {
            *high = point;
        }
        *last = point;
    }

    /// The changes kept of the column so far, in file order, each once; the column goes on empty.
    fn flush(&mut self) {
        let mut kept = std::mem::take(&mut self.kept);
        kept.sort_by_key(|p| p.map(|p| p.0));
        let mut last_seen = None;
        for (seen, ts, value) in kept.into_iter().flatten() {
            if last_seen != Some(seen) {
                self.points.push((ts, value));
                last_seen = Some(seen);
            }
        }
    }

    fn finish(mut self) -> Vec<(f64, u64)> {
        self.flush();
        self.points
    }
}

/// The allocations live at the moments: every allocation still open (paired with its free by
/// device and address), those kept, and each call site's bytes held and peak.
struct Moments {
    at: Vec<f64>,
    next: usize,
    open: HashMap<(u32, u64), (AllocationEvent, bool)>,
    kept: Vec<AllocationEvent>,
    /// The first and last [`crate::MARKS_KEPT`] refusals and failures, and how many between them
    /// are not.
    refused: Vec<AllocationEvent>,
    refused_left_out: u64,
    /// Per call site: bytes held now, and the most held at once.
    sites: HashMap<String, (u64, u64)>,
}

impl Moments {
    /// Every moment before `ts`: the allocations open then are kept. Returns whether one passed.
    fn pass(&mut self, ts: f64) -> bool {
        let mut passed = false;
        while self.at.get(self.next).is_some_and(|&m| m < ts) {
            self.next += 1;
            passed = true;
            self.keep_open();
        }
        passed
    }

    fn keep_open(&mut self) {
        for (alloc, kept) in self.open.values_mut() {
            if !*kept {
                *kept = true;
                self.kept.push(alloc.clone());
            }
        }
    }

    fn take(&mut self, e: AllocationEvent) {
        let key = (e.device, e.address);
        match e.kind {
            EventKind::Alloc => {
                let held = self.sites.entry(e.site.clone()).or_default();
                held.0 += e.bytes;
                held.1 = held.1.max(held.0);
                self.open.insert(key, (e, false));
            }
            EventKind::Free => {
                if let Some((alloc, kept)) = self.open.remove(&key) {
                    if let Some(held) = self.sites.get_mut(&alloc.site) {
                        held.0 = held.0.saturating_sub(alloc.bytes);
                    }
                    if kept {
                        self.kept.push(e);
                    }
                }
            }
            _ => keep_first_and_last(&mut self.refused, &mut self.refused_left_out, e),
        }
    }
}

/// The [`EventSink`] that reduces a recording as [`Reduction`] says.
pub struct Reducer {
    columns: Columns,
    used: BTreeMap<u32, ColumnSeries>,
    /// Per device and module; `None` when modules are not kept.
    modules: Option<BTreeMap<u32, BTreeMap<String, ColumnSeries>>>,
    moments: Option<Moments>,
    /// [`Reduction::cuts`], in order, and the next one ahead.
    cuts: Vec<f64>,
    next_cut: usize,
}

impl Reducer {
    pub fn new(reduction: Reduction) -> Reducer {
        let mut cuts = reduction.cuts;
        cuts.sort_by(f64::total_cmp);
        let moments = reduction.moments.map(|mut at| {
            at.sort_by(f64::total_cmp);
            Moments {
                at,
                next: 0,
                open: HashMap::new(),
                kept: Vec::new(),
                refused: Vec::new(),
                refused_left_out: 0,
                sites: HashMap::new(),
            }
        });
        Reducer {
            columns: reduction.columns,
            used: BTreeMap::new(),
            modules: reduction.modules.then(BTreeMap::new),
            moments,
            cuts,
            next_cut: 0,
        }
    }

    /// Cuts every device's column short: `used` at this instant is kept.
    fn anchor(&mut self) {
        self.used.values_mut().for_each(ColumnSeries::flush);
    }

    /// A device allocation, free, refusal or failure.
    fn memory(&mut self, e: &Event<'_>, ts: f64) {
        let mut cut = self.moments.as_mut().is_some_and(|m| m.pass(ts));
        while self.cuts.get(self.next_cut).is_some_and(|&c| c <= ts) {
            self.next_cut += 1;
            cut = true;
        }
        if cut {
            self.anchor();
        }
        let column = self.columns.column(ts);
        if matches!(e.kind, EventKind::Alloc | EventKind::Free) {
            let series = self.used.entry(e.device).or_insert_with(ColumnSeries::new);
            series.take(column, ts, e.used);
            if let (Some(modules), false) = (&mut self.modules, e.module.is_empty()) {
                module_step(modules, e, column, ts);
            }
        }
        if let Some(moments) = &mut self.moments {
            moments.take(AllocationEvent {
                ts,
                kind: e.kind,
                device: e.device,
                bytes: e.bytes,
                address: e.address,
                tid: e.tid,
                module: e.module.to_string(),
                site: e.site.to_string(),
            });
        }
    }

    /// `t` (read with [`Keep::Peaks`] beside this reducer) with the curves and allocations the
    /// reducer kept in place of its own.
    pub fn finish(self, mut t: Timeline) -> Timeline {
        t.used = self
            .used
            .into_iter()
            .map(|(d, s)| (d, s.finish()))
            .collect();
        t.used_changes.clear();
        if let Some(modules) = self.modules {
            t.module_used = modules
                .into_iter()
                .map(|(d, m)| (d, m.into_iter().map(|(n, s)| (n, s.finish())).collect()))
                .collect();
        }
        let mut reduced = Reduced {
            columns: self.columns.count,
            ..Reduced::default()
        };
        if let Some(mut moments) = self.moments {
            moments.keep_open();
            in_order(&mut moments.refused, moments.refused_left_out);
            reduced.refused_left_out = moments.refused_left_out;
            t.allocations = moments.kept;
            t.allocations.append(&mut moments.refused);
            reduced.moments = moments.at;
            reduced.site_peaks = moments.sites.into_iter().map(|(s, h)| (s, h.1)).collect();
        }
        t.reduced = Some(reduced);
        t
    }
}

/// The next step of what `e`'s module holds on its device.
fn module_step(
    modules: &mut BTreeMap<u32, BTreeMap<String, ColumnSeries>>,
    e: &Event<'_>,
    column: i64,
    ts: f64,
) {
    let of_device = modules.entry(e.device).or_default();
    if !of_device.contains_key(e.module) {
        of_device.insert(e.module.to_string(), ColumnSeries::new());
    }
    let Some(series) = of_device.get_mut(e.module) else {
        return;
    };
    let after = if e.kind == EventKind::Alloc {
        series.now.saturating_add(e.bytes)
    } else {
        series.now.saturating_sub(e.bytes)
    };
    series.take(column, ts, after);
}

impl EventSink for Reducer {
    fn event(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        let ts = e.ts_ns as f64 / 1000.0;
        match e.kind {
            EventKind::ScopeOpen | EventKind::ScopeClose | EventKind::PeakReset => self.anchor(),
            EventKind::Ceiling => {}
            _ if e.mem == MemKind::Device => self.memory(e, ts),
            _ => {}
        }
        Ok(())
    }

    fn ceiling_step(&mut self, _: u64, _: u32, _: Option<u64>) -> std::io::Result<()> {
        Ok(())
    }
}

/// The recording at `path` read in bounded memory: its figures as [`Keep::Peaks`] keeps them,
/// its curves and allocations as `reduction` says.
pub fn read_recording_reduced(path: &Path, reduction: Reduction) -> Result<Timeline, TraceError> {
    let mut reducer = Reducer::new(reduction);
    let t = crate::recording::read_recording_teed(path, Keep::Peaks, &mut reducer)?;
    Ok(reducer.finish(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reduced(points: &[(f64, u64)], columns: &Columns) -> Vec<(f64, u64)> {
        let mut s = ColumnSeries::new();
        for &(ts, v) in points {
            s.take(columns.column(ts), ts, v);
        }
        s.finish()
    }

    #[test]
    fn a_column_keeps_its_first_lowest_highest_and_last_change() {
        let columns = Columns {
            from: 0.0,
            to: 10.0,
            count: 2,
        };
        let points = [
            (0.0, 5),
            (1.0, 9),
            (2.0, 9),
            (3.0, 1),
            (4.0, 4),
            (5.0, 7),
            (6.0, 3),
            (7.0, 8),
        ];
        assert_eq!(
            reduced(&points, &columns),
            [
                (0.0, 5),
                (1.0, 9),
                (3.0, 1),
                (4.0, 4),
                (5.0, 7),
                (6.0, 3),
                (7.0, 8)
            ],
            "the first column's second 9 ties its highest: left out; the second's last is its high"
        );
        let before = [(-3.0, 2), (-2.0, 6), (-1.0, 4), (0.5, 1)];
        assert_eq!(
            reduced(&before, &columns),
            [(-3.0, 2), (-2.0, 6), (-1.0, 4), (0.5, 1)],
            "before the columns is one more column"
        );
    }

    #[test]
    fn a_million_changes_keep_at_most_four_a_column_and_every_extreme() {
        let columns = Columns {
            from: 0.0,
            to: 1e6,
            count: 1000,
        };
        let points: Vec<(f64, u64)> = (0..1_000_000u64)
            .map(|i| {
                (
                    i as f64,
                    (i * 7919) % 1_000_003 + (i == 654_321) as u64 * (1 << 40),
                )
            })
            .collect();
        let kept = reduced(&points, &columns);
        assert!(kept.len() <= 4 * 1000, "{} points kept", kept.len());
        let per_column = |pts: &[(f64, u64)], c: usize| {
            let inside = pts.iter().filter(|p| (p.0 / 1000.0) as usize == c);
            inside.fold((u64::MAX, 0), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)))
        };
        for c in (0..1000).step_by(37).chain([654]) {
            assert_eq!(per_column(&kept, c), per_column(&points, c), "column {c}");
        }
        assert_eq!(kept.last(), points.last());
    }
}

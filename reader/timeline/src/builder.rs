//! Building a [`Timeline`] from the event stream ([`TimelineBuilder`], an [`EventSink`]), keeping
//! as much as [`Keep`] says.

use gpumemhook_segment::layout::MemKind;
use gpumemhook_segment::recording::EventKind;
use std::collections::BTreeMap;

use crate::event::{Event, EventSink, UNSEEN};
use crate::timeline::{Keep, MemoryInstant, Reading, RunInfo, Timeline};

/// Builds a [`Timeline`] from events as they come, to what [`crate::read_chrome_trace`] gives for the
/// Chrome file [`crate::ChromeTraceWriter`] writes of the same events (a test holds the two equal).
///
/// With [`Keep::Peaks`], a change of `used` is kept only when a replay's figures may need it: the
/// first; one above every value since the last anchor (a scope opening or a peak restart, when
/// `used` then is the new base); the last before each anchor and at the end. Each device's peak
/// (over the run and since a restart, and when first reached), its last `used`, and each scope's
/// base and peak are then those of the whole curve (a test of `crate::replay` holds them equal
/// on random timelines).
pub struct TimelineBuilder {
    reading: Reading,
    /// Per device, the ceiling last taken (as the writer's `limits_written`).
    limits_taken: Vec<u64>,
    keep: Keep,
    /// Per device, for [`Keep::Peaks`]: the highest `used` since the last anchor, and the latest
    /// change not kept.
    highs: BTreeMap<u32, (u64, Option<(f64, u64)>)>,
    /// When the last anchor was (µs).
    last_anchor: f64,
}

impl TimelineBuilder {
    pub fn new(keep: Keep) -> TimelineBuilder {
        TimelineBuilder {
            reading: Reading::default(),
            limits_taken: vec![UNSEEN; gpumemhook_segment::layout::MAX_DEVICES],
            keep,
            highs: BTreeMap::new(),
            last_anchor: f64::NEG_INFINITY,
        }
    }

    /// A change of `used` on `device`: kept as [`Keep`] says.
    fn take_used(&mut self, device: u32, ts: f64, used: u64) {
        let series = self.reading.t.used.entry(device).or_default();
        if self.keep != Keep::Peaks {
            series.push((ts, used));
            return;
        }
        *self.reading.t.used_changes.entry(device).or_default() += 1;
        let (high, pending) = self.highs.entry(device).or_insert((0, None));
        if series.is_empty() || used > *high || ts <= self.last_anchor {
            // A change at the anchor's own time is at the anchor: it is the new base.
            *high = if ts <= self.last_anchor {
                used
            } else {
                used.max(*high)
            };
            *pending = None;
            series.push((ts, used));
        } else {
            *pending = Some((ts, used));
        }
    }

    /// A scope opened or a peak restarted at `ts`: each device's latest change is kept, and its
    /// `used` now is the base new highs are counted from.
    fn anchor(&mut self, ts: f64) {
        self.last_anchor = ts;
        for (device, (high, pending)) in &mut self.highs {
            let series = self.reading.t.used.entry(*device).or_default();
            if let Some(point) = pending.take() {
                series.push(point);
            }
            *high = series.last().map_or(0, |&(_, used)| used);
        }
    }

    /// The timeline, given what the file says of the run: the ceilings in force at exit, events
    /// lost, the end (µs), and the run's place.
    pub fn finish(
        mut self,
        pid: u32,
        command: String,
        limits: BTreeMap<u32, u64>,
        dropped: u64,
        end_ns: Option<u64>,
        info: RunInfo,
    ) -> Timeline {
        for (device, (_, pending)) in &mut self.highs {
            if let Some(point) = pending.take() {
                self.reading.t.used.entry(*device).or_default().push(point);
            }
        }
        let t = &mut self.reading.t;
        t.pid = pid;
        t.command = command;
        t.limits = limits;
        t.dropped = dropped;
        t.end = end_ns.map(micros);
        t.info = info;
        self.reading.finish()
    }

    fn see(&mut self, ts: f64) {
        let first = &mut self.reading.first_ts;
        *first = Some(first.map_or(ts, |f| f.min(ts)));
    }
}

/// Nanoseconds as the file's microseconds (the same `f64` the Chrome file's text parses to).
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl EventSink for TimelineBuilder {
    fn event(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        let ts = micros(e.ts_ns);
        self.see(ts);
        self.reading.t.events += 1;
        match e.kind {
            EventKind::ScopeOpen => {
                self.anchor(ts);
                self.reading.open_scope(u64::from(e.scope), e.name, ts);
            }
            EventKind::ScopeClose => {
                if let Some((n, start)) = self.reading.open.remove(&u64::from(e.scope)) {
                    self.reading.t.scopes.push((n, start, Some(ts)));
                }
            }
            EventKind::Ceiling => self.ceiling_step(e.ts_ns, e.device, e.limit)?,
            EventKind::PeakReset => {
                self.anchor(ts);
                self.reading
                    .t
                    .peak_resets
                    .entry(e.device)
                    .or_default()
                    .push(ts);
                self.ceiling_step(e.ts_ns, e.device, e.limit)?;
            }
            kind => {
                self.reading.t.take_memory(
                    &MemoryInstant {
                        ts,
                        cat: kind.category(),
                        device: Some(e.device),
                        bytes: e.bytes,
                        used: e.used,
                        address: e.address,
                        tid: e.tid,
                        memory: e.mem.name(),
                        module: e.module,
                        site: e.site,
                    },
                    self.keep,
                );
                if e.mem == MemKind::Device {
                    self.ceiling_step(e.ts_ns, e.device, e.limit)?;
                    if matches!(kind, EventKind::Alloc | EventKind::Free) {
                        self.take_used(e.device, ts, e.used);
                    }
                }
            }
        }
        Ok(())
    }

    fn ceiling_step(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) -> std::io::Result<()> {
        let limit = limit.unwrap_or(0);
        let changed = self
            .limits_taken
            .get_mut(device as usize)
            .is_some_and(|taken| std::mem::replace(taken, limit) != limit);
        if changed {
            let ts = micros(ts_ns);
            self.see(ts);
            self.reading
                .t
                .ceilings
                .entry(device)
                .or_default()
                .push((ts, (limit != 0).then_some(limit)));
        }
        Ok(())
    }
}

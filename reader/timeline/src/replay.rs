//! Replaying a timeline's counter events to the figures the segment's counters would have shown:
//! each device's peak (counted from its last restart, as the segment counts it), when it was
//! reached and its last `used`, and each scope's window. The CLI's text summary, `run`'s scope
//! table, the plot and the page all read a timeline through this.

use crate::timeline::Timeline;
use gpumemhook_reader::DeviceFigures;
use std::collections::{BTreeMap, BTreeSet};

/// One device's figures replayed from a timeline's counter events.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceReplay {
    pub device: u32,
    /// Largest `used` the counters reached since the peak was last restarted (`reset_peak`), or
    /// since the start: the peak the exit report states.
    pub peak: u64,
    /// When it was first reached (µs, trace clock).
    pub peak_ts: f64,
    /// When the peak was last restarted, if it was.
    pub restarted: Option<f64>,
    /// Largest `used` over the whole run, restarts or not, and when it was first reached.
    pub run_peak: (u64, f64),
    /// `used` after the last event.
    pub last: u64,
    /// Counter events (allocations and frees that changed `used`).
    pub changes: u64,
}

/// A scope span replayed: the largest `used` while it was open, per device.
#[derive(Clone, Debug, PartialEq)]
pub struct ScopeReplay {
    pub name: String,
    pub open: f64,
    pub close: Option<f64>,
    /// Per device: (`used` when opened, largest `used` while open).
    pub devices: BTreeMap<u32, (u64, u64)>,
}

/// Replays the counters of a timeline: what the segment's counters would have said.
pub fn replay(t: &Timeline) -> (Vec<DeviceReplay>, Vec<ScopeReplay>) {
    let overwritten: BTreeMap<u32, &DeviceFigures> = t
        .ring
        .iter()
        .flat_map(|r| &r.figures.devices)
        .map(|d| (d.device, d))
        .collect();
    let mut devices: BTreeSet<u32> = t.used.keys().copied().collect();
    devices.extend(
        overwritten
            .values()
            .filter(|d| d.is_active())
            .map(|d| d.device),
    );
    let devices = devices
        .into_iter()
        .map(|device| {
            let points = t.used.get(&device).map_or(&[][..], Vec::as_slice);
            let mut replayed = replay_device(t, device, points);
            if let Some(d) = overwritten.get(&device) {
                add_overwritten(&mut replayed, d, points);
            }
            replayed
        })
        .collect();
    let scopes = t
        .scopes
        .iter()
        .map(|(name, open, close)| {
            let devices = t
                .used
                .iter()
                .map(|(&device, points)| {
                    let base = used_at(points, *open);
                    let peak = points
                        .iter()
                        .filter(|p| p.0 > *open && close.is_none_or(|c| p.0 <= c))
                        .map(|p| p.1)
                        .fold(base, u64::max);
                    (device, (base, peak))
                })
                .collect();
            ScopeReplay {
                name: name.clone(),
                open: *open,
                close: *close,
                devices,
            }
        })
        .collect();
    (devices, scopes)
}

/// One device's figures from its `used` curve.
fn replay_device(t: &Timeline, device: u32, points: &[(f64, u64)]) -> DeviceReplay {
    let restarted = t
        .peak_resets
        .get(&device)
        .and_then(|r| r.iter().copied().reduce(f64::max));
    let first_ts = points.first().map_or(0.0, |p| p.0);
    // After a restart the peak starts from `used` at that moment.
    let (mut peak, mut peak_ts) = match restarted {
        Some(at) => (used_at(points, at), at),
        None => (0, first_ts),
    };
    let mut run_peak = (0, first_ts);
    for &(ts, used) in points {
        if used > run_peak.0 {
            run_peak = (used, ts);
        }
        if used > peak && restarted.is_none_or(|at| ts > at) {
            (peak, peak_ts) = (used, ts);
        }
    }
    DeviceReplay {
        device,
        peak,
        peak_ts,
        restarted,
        run_peak,
        last: points.last().map_or(0, |p| p.1),
        // A curve kept for its figures only holds some of its changes.
        changes: t
            .used_changes
            .get(&device)
            .copied()
            .unwrap_or(points.len() as u64),
    }
}

/// Adds what a ring overwrote of a device to its replayed figures. The peak the ring copied from
/// the segment is the peak since the restart it names, up to the last overwrite: where no later
/// restart is in the timeline, the device's peak is the larger of it and the kept changes' after
/// that restart; `used` at the end is the last kept change's, else the last overwritten one's.
fn add_overwritten(r: &mut DeviceReplay, d: &DeviceFigures, points: &[(f64, u64)]) {
    let us = |ns: u64| ns as f64 / 1000.0;
    let ring_restart = (d.peak_reset_ns != 0).then(|| us(d.peak_reset_ns));
    if ring_restart >= r.restarted {
        if ring_restart > r.restarted {
            // The restart the ring overwrote is the last: kept changes before it do not count.
            let at = ring_restart.unwrap_or(0.0);
            (r.peak, r.peak_ts) =
                points
                    .iter()
                    .filter(|p| p.0 > at)
                    .fold(
                        (0, at),
                        |best, &(ts, used)| if used > best.0 { (used, ts) } else { best },
                    );
            r.restarted = ring_restart;
        }
        if d.peak > r.peak {
            // Reached in what was overwritten: when exactly, the ring does not keep.
            let when = d.intervals.iter().rev().find(|i| i.2 >= d.peak);
            (r.peak, r.peak_ts) = (d.peak, when.map_or(0.0, |i| us(i.0)));
        }
    }
    if let Some(&(start, _, high)) = d.intervals.iter().max_by_key(|i| i.2) {
        if high > r.run_peak.0 {
            r.run_peak = (high, us(start));
        }
    }
    if let Some((at, used)) = d.last_used {
        if points.last().is_none_or(|p| p.0 < us(at)) {
            r.last = used;
        }
    }
    r.changes += d.allocs + d.frees;
}

/// Draws a ring timeline's overwritten part into its `used` curves, for `plot` and the page: each
/// interval's lowest and highest `used`, at the interval's start and middle (which came first
/// the ring does not keep). The figures (`replay`) are the same before and after.
pub fn fill_overwritten(t: &mut Timeline) {
    let Some(ring) = t.ring.as_ref() else { return };
    let half_us = ring.figures.bucket_ns as f64 / 2000.0;
    for d in &ring.figures.devices {
        if d.intervals.is_empty() {
            continue;
        }
        let points = t.used.entry(d.device).or_default();
        for &(start_ns, low, high) in &d.intervals {
            let start = start_ns as f64 / 1000.0;
            points.extend([(start, low), (start + half_us, high)]);
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
}

/// `used` at time `ts`: the last change at or before it (0 before the first).
pub fn used_at(points: &[(f64, u64)], ts: f64) -> u64 {
    points
        .iter()
        .take_while(|p| p.0 <= ts)
        .last()
        .map_or(0, |p| p.1)
}

/// The first and last timestamps of a timeline's events (µs), for durations: its memory events,
/// scopes and marks, and at the end any ceiling change or peak restart after them (a ceiling set
/// before the first event, as the one of the hook's start-up is, does not move the start).
pub fn time_span(t: &Timeline) -> Option<(f64, f64)> {
    let (lo, hi) = event_span(t)?;
    let later = t
        .ceilings
        .values()
        .flat_map(|steps| steps.iter().map(|s| s.0))
        .chain(t.peak_resets.values().flatten().copied())
        .fold(hi, f64::max);
    Some((lo, later))
}

/// The first and last timestamps of the memory events, scopes and marks.
fn event_span(t: &Timeline) -> Option<(f64, f64)> {
    let stamps = t
        .used
        .values()
        .flatten()
        .map(|p| p.0)
        .chain(
            t.scopes
                .iter()
                .flat_map(|(_, open, close)| std::iter::once(*open).chain(*close)),
        )
        .chain(t.marks.iter().map(|m| m.ts));
    stamps.fold(None, |acc, ts| match acc {
        None => Some((ts, ts)),
        Some((lo, hi)) => Some((f64::min(lo, ts), f64::max(hi, ts))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_finds_peaks_and_scope_windows() {
        let mut t = Timeline::default();
        t.used
            .insert(0, vec![(1.0, 100), (2.0, 300), (3.0, 200), (5.0, 250)]);
        t.scopes.push(("a".into(), 2.5, Some(4.0)));
        t.scopes.push(("b".into(), 4.5, None));
        let (devices, scopes) = replay(&t);
        assert_eq!(devices[0].peak, 300);
        assert_eq!(devices[0].peak_ts, 2.0);
        assert_eq!(devices[0].last, 250);
        assert_eq!(scopes[0].devices[&0], (300, 300));
        assert_eq!(scopes[1].devices[&0], (200, 250));
        assert_eq!(
            (devices[0].restarted, devices[0].run_peak),
            (None, (300, 2.0))
        );
    }

    #[test]
    fn a_restarted_peak_counts_from_used_at_the_restart() {
        let mut t = Timeline::default();
        t.used.insert(
            0,
            vec![(1.0, 100), (2.0, 300), (3.0, 200), (5.0, 250), (6.0, 10)],
        );
        t.peak_resets.insert(0, vec![2.5, 4.0]);
        let (devices, _) = replay(&t);
        assert_eq!(
            (devices[0].peak, devices[0].peak_ts, devices[0].restarted),
            (250, 5.0, Some(4.0))
        );
        assert_eq!(devices[0].run_peak, (300, 2.0));
        // Nothing above `used` at the restart: the peak is that `used`, reached at the restart.
        t.peak_resets.insert(0, vec![5.5]);
        let (devices, _) = replay(&t);
        assert_eq!((devices[0].peak, devices[0].peak_ts), (250, 5.5));
        // A ceiling changed after the last event ends the span there.
        t.ceilings
            .insert(0, vec![(0.5, None), (9.0, Some(1 << 20))]);
        assert_eq!(time_span(&t), Some((1.0, 9.0)));
    }

    /// A random run of allocations and frees on two devices, with scopes opened and closed and
    /// peaks restarted among them, several events now and then at one nanosecond.
    fn random_run(
        next: &mut impl FnMut(u64) -> u64,
        round: u32,
    ) -> Vec<crate::event::Event<'static>> {
        use crate::event::Event;
        use gpumemhook_reader::{EventKind, MemKind};
        let (mut used, mut ts, mut open) = ([0u64; 2], 1_000, Vec::new());
        (0..(20 + next(400)))
            .map(|_| {
                ts += next(3) * 1_000;
                let device = next(2) as u32;
                let d = device as usize;
                let kind = match next(20) {
                    0 => EventKind::ScopeOpen,
                    1 if !open.is_empty() => EventKind::ScopeClose,
                    2 => EventKind::PeakReset,
                    _ if next(2) == 0 || used[d] == 0 => EventKind::Alloc,
                    _ => EventKind::Free,
                };
                let bytes = 1 + next(1 << 20);
                match kind {
                    EventKind::Alloc => used[d] += bytes,
                    EventKind::Free => used[d] -= bytes.min(used[d]),
                    _ => {}
                }
                let scope = match kind {
                    EventKind::ScopeOpen => {
                        open.push(round * 1000 + open.len() as u32);
                        *open.last().unwrap_or(&0)
                    }
                    EventKind::ScopeClose => open.remove(next(open.len() as u64) as usize),
                    _ => 0,
                };
                Event {
                    ts_ns: ts,
                    kind,
                    device,
                    bytes,
                    used: used[d],
                    address: 0,
                    name: "s",
                    mem: MemKind::Device,
                    tid: 1,
                    scope,
                    limit: None,
                    module: "",
                    site: "",
                }
            })
            .collect()
    }

    /// A timeline kept for its figures only (`Keep::Peaks`) replays to the same figures as the
    /// whole one, on random runs ([`random_run`]).
    #[test]
    fn a_timeline_kept_for_its_figures_replays_as_the_whole_one() {
        use crate::builder::TimelineBuilder;
        use crate::event::EventSink;
        use crate::timeline::{Keep, RunInfo};
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..300 {
            let events = random_run(&mut next, round);
            let [whole, peaks] = [Keep::Figures, Keep::Peaks].map(|keep| {
                let mut b = TimelineBuilder::new(keep);
                for e in &events {
                    b.event(e).unwrap();
                }
                b.finish(
                    1,
                    String::new(),
                    Default::default(),
                    0,
                    None,
                    RunInfo::default(),
                )
            });
            let kept = |t: &Timeline| t.used.values().map(Vec::len).sum::<usize>();
            assert!(kept(&peaks) <= kept(&whole));
            assert_eq!(replay(&whole), replay(&peaks), "round {round}");
            assert_eq!(time_span(&whole), time_span(&peaks), "round {round}");
        }
    }
}

//! Replaying a timeline's counter events to the figures the segment's counters would have shown:
//! each device's peak, when it was reached and its last `used`, and each scope's window. The text
//! summary (`crate::summary`), `run`'s scope table and the plot all read a timeline through this.

use gpumemhook_reader::trace::Timeline;
use std::collections::BTreeMap;

/// One device's figures replayed from a timeline's counter events.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceReplay {
    pub device: u32,
    /// Largest `used` the counters reached.
    pub peak: u64,
    /// When it was first reached (µs, trace clock).
    pub peak_ts: f64,
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
    let devices = t
        .used
        .iter()
        .map(|(&device, points)| {
            let mut r = DeviceReplay {
                device,
                peak: 0,
                peak_ts: points.first().map_or(0.0, |p| p.0),
                last: points.last().map_or(0, |p| p.1),
                changes: points.len() as u64,
            };
            for &(ts, used) in points {
                if used > r.peak {
                    r.peak = used;
                    r.peak_ts = ts;
                }
            }
            r
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
                    // `used` when the scope opened: the last change at or before that moment.
                    let base = points
                        .iter()
                        .take_while(|p| p.0 <= *open)
                        .last()
                        .map_or(0, |p| p.1);
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

/// The first and last timestamps of a timeline (µs), for durations.
pub fn time_span(t: &Timeline) -> Option<(f64, f64)> {
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
    }
}

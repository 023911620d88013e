//! Human summaries of what a process held: of an exit report or live snapshot ([`Snapshot`]), and of
//! a timeline ([`Timeline`]), replayed to the same figures. `run` prints these at exit and `report`
//! prints them for a file, so both read the same way.

use crate::attribution;
use crate::style::{count, counted, duration, size_or_dash, Cell, Painter, Style, Table};
use gpumemhook_reader::trace::Timeline;
use gpumemhook_reader::{format_size, Snapshot};
use std::collections::BTreeMap;

/// The per-device table of a finished process's snapshot.
pub fn device_table(s: &Snapshot, painter: Painter, indent: usize) -> String {
    // An out-of-memory report is taken at the refusal, not at exit.
    let used = if s.oom.is_some() {
        "USED AT OOM"
    } else {
        "USED AT EXIT"
    };
    let mut t = Table::new(&[
        ("DEVICE", true),
        ("PEAK", true),
        (used, true),
        ("LIMIT", true),
        ("ALLOCS", true),
        ("FREES", true),
        ("DENIED", true),
        ("FAILED", true),
    ])
    .indent(indent);
    for d in &s.devices {
        let near_limit = d.limit.is_some_and(|l| d.peak as f64 >= 0.9 * l as f64);
        t.push(vec![
            Cell::right(d.device.to_string()),
            Cell::right(format_size(d.peak)).styled(if near_limit {
                Style::Warn
            } else {
                Style::Peak
            }),
            Cell::right(format_size(d.used)),
            Cell::right(size_or_dash(d.limit)).styled(if d.limit.is_some() {
                Style::Plain
            } else {
                Style::Dim
            }),
            Cell::right(count(d.allocs)),
            Cell::right(count(d.frees)),
            bad_count(d.denied),
            bad_count(d.failed),
        ]);
    }
    t.render(painter)
}

fn bad_count(n: u64) -> Cell {
    Cell::right(count(n)).styled(if n > 0 { Style::Bad } else { Style::Dim })
}

/// The scopes of a snapshot (those open when it was taken), one row per scope and device.
pub fn scope_table(s: &Snapshot, painter: Painter, indent: usize) -> String {
    let mut t = Table::new(&[
        ("SCOPE", false),
        ("DEVICE", true),
        ("PEAK ABOVE START", true),
        ("AT START", true),
        ("PEAK", true),
        ("NOW", true),
    ])
    .indent(indent);
    for scope in &s.scopes {
        let devices = scope
            .devices
            .iter()
            .filter(|d| scope.device.is_none_or(|only| only == d.device));
        for (i, d) in devices.enumerate() {
            t.push(vec![
                Cell::left(if i == 0 { scope.name.as_str() } else { "" }).styled(Style::Name),
                Cell::right(d.device.to_string()),
                Cell::right(format!("+{}", format_size(d.peak.saturating_sub(d.base))))
                    .styled(Style::Peak),
                Cell::right(format_size(d.base)),
                Cell::right(format_size(d.peak)),
                Cell::right(format_size(d.used)),
            ]);
        }
    }
    t.render(painter)
}

/// How a summarised process ended, when known.
pub enum Ending {
    /// An exit report: the process ended, nothing more is known.
    Exited,
    /// `run` saw it end, with this description (`exit status 0`, `killed by signal 9 (SIGKILL)`).
    Ran(String),
}

/// How much of who-holds-the-memory a summary shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// `run`: the largest modules of each device, in one line.
    Brief,
    /// `report`: the breakdown by module, the live allocations and the out-of-memory section.
    Full,
}

/// The whole summary of one process: title line, devices, who holds the memory, host memory,
/// scopes.
pub fn snapshot_summary(s: &Snapshot, ending: &Ending, detail: Detail, painter: Painter) -> String {
    let mut out = String::new();
    let command = if s.command.is_empty() {
        "(unknown command)"
    } else {
        &s.command
    };
    let ran = (s.taken_unix_ns > s.start_unix_ns && s.start_unix_ns > 0)
        .then(|| duration((s.taken_unix_ns - s.start_unix_ns) as f64 / 1e9));
    let mut title = format!(
        "{}  {}",
        painter.paint(&format!("pid {}", s.pid), Style::Heading),
        painter.paint(command, Style::Name)
    );
    let mut facts = Vec::new();
    if let Some(ran) = ran {
        facts.push(format!("ran {ran}"));
    }
    if let Ending::Ran(how) = ending {
        facts.push(how.clone());
    }
    let job = s.job.summary();
    if !job.is_empty() {
        facts.push(job);
    }
    if !facts.is_empty() {
        title.push_str(&format!("  ({})", facts.join(", ")));
    }
    out.push_str(&title);
    out.push('\n');
    if s.devices.is_empty() {
        out.push_str(&format!(
            "  {}\n",
            painter.paint("no device memory was allocated", Style::Dim)
        ));
    } else {
        out.push_str(&device_table(s, painter, 2));
    }
    if let Some(oom) = &s.oom {
        out.push_str(&attribution::oom_lines(oom, painter, 2));
    }
    match detail {
        Detail::Brief => out.push_str(&attribution::largest_modules_lines(s, painter, 2)),
        Detail::Full => {
            let modules = attribution::module_table(s, painter, 4);
            if !modules.is_empty() {
                out.push_str(&format!(
                    "  {}\n",
                    painter.paint("by module (the shared object that asked):", Style::Heading)
                ));
                out.push_str(&modules);
            }
            out.push_str(&attribution::live_table(s, painter, 2));
        }
    }
    for d in s.devices.iter().filter(|d| d.managed_peak > 0) {
        out.push_str(&format!(
            "  managed (unified) memory on device {}: peak {}, {} now\n",
            d.device,
            format_size(d.managed_peak),
            format_size(d.managed)
        ));
    }
    if s.host.allocs > 0 {
        out.push_str(&format!(
            "  pinned host memory: peak {}, {} now ({})\n",
            format_size(s.host.pinned_peak),
            format_size(s.host.pinned),
            counted(s.host.allocs, "allocation", "allocations")
        ));
    }
    let denied: u64 = s.devices.iter().map(|d| d.denied).sum();
    if denied > 0 {
        out.push_str(&format!(
            "  {}\n",
            painter.paint(
                &format!(
                    "{} refused by the ceiling (the program saw out-of-memory errors)",
                    counted(denied, "allocation was", "allocations were")
                ),
                Style::Bad
            )
        ));
    }
    if !s.scopes.is_empty() {
        out.push_str(&format!(
            "  {}\n",
            painter.paint("scopes still open at exit:", Style::Heading)
        ));
        out.push_str(&scope_table(s, painter, 4));
    }
    out
}

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

/// Scopes replayed from a timeline, as a table.
pub fn scope_replay_table(scopes: &[ScopeReplay], start: f64, painter: Painter) -> String {
    let mut t = Table::new(&[
        ("SCOPE", false),
        ("OPENED", true),
        ("LASTED", true),
        ("DEVICE", true),
        ("PEAK ABOVE START", true),
        ("AT START", true),
        ("PEAK", true),
    ])
    .indent(4);
    for s in scopes {
        let lasted = s.close.map_or_else(
            || "open at exit".to_string(),
            |c| duration((c - s.open) / 1e6),
        );
        let rows: Vec<_> = s
            .devices
            .iter()
            .filter(|(_, (base, peak))| *base > 0 || *peak > 0)
            .collect();
        if rows.is_empty() {
            t.push(vec![
                Cell::left(s.name.as_str()).styled(Style::Name),
                Cell::right(format!("+{}", duration((s.open - start).max(0.0) / 1e6))),
                Cell::right(lasted),
                Cell::right("-").styled(Style::Dim),
                Cell::right("-").styled(Style::Dim),
                Cell::right("-").styled(Style::Dim),
                Cell::right("-").styled(Style::Dim),
            ]);
            continue;
        }
        for (i, (device, (base, peak))) in rows.into_iter().enumerate() {
            let first = i == 0;
            t.push(vec![
                Cell::left(if first { s.name.as_str() } else { "" }).styled(Style::Name),
                Cell::right(if first {
                    format!("+{}", duration((s.open - start).max(0.0) / 1e6))
                } else {
                    String::new()
                }),
                Cell::right(if first { lasted.clone() } else { String::new() }),
                Cell::right(device.to_string()),
                Cell::right(format!("+{}", format_size(peak - base))).styled(Style::Peak),
                Cell::right(format_size(*base)),
                Cell::right(format_size(*peak)),
            ]);
        }
    }
    t.render(painter)
}

/// The summary of a timeline file: the same figures as the exit report, replayed from its events.
pub fn timeline_summary(t: &Timeline, painter: Painter) -> String {
    let mut out = String::new();
    let (devices, scopes) = replay(t);
    let span = time_span(t);
    let mut title = format!(
        "{}  {}  (timeline, {} events",
        painter.paint(&format!("pid {}", t.pid), Style::Heading),
        painter.paint(
            if t.command.is_empty() {
                "(unknown command)"
            } else {
                &t.command
            },
            Style::Name
        ),
        count(t.events)
    );
    if let Some((lo, hi)) = span {
        title.push_str(&format!(" over {}", duration((hi - lo) / 1e6)));
    }
    title.push(')');
    out.push_str(&title);
    out.push('\n');
    if t.dropped > 0 {
        out.push_str(&format!(
            "  {}\n",
            painter.paint(
                &format!(
                    "{} events were dropped (the recording buffer was full): the figures below \
                     may miss some changes",
                    count(t.dropped)
                ),
                Style::Warn
            )
        ));
    }
    if devices.is_empty() {
        out.push_str(&format!(
            "  {}\n",
            painter.paint("no device memory was allocated", Style::Dim)
        ));
    } else {
        let mut table = Table::new(&[
            ("DEVICE", true),
            ("PEAK", true),
            ("PEAK AT", true),
            ("USED AT END", true),
            ("LIMIT", true),
            ("CHANGES", true),
        ])
        .indent(2);
        let start = span.map_or(0.0, |s| s.0);
        for d in &devices {
            table.push(vec![
                Cell::right(d.device.to_string()),
                Cell::right(format_size(d.peak)).styled(Style::Peak),
                Cell::right(format!("+{}", duration((d.peak_ts - start).max(0.0) / 1e6))),
                Cell::right(format_size(d.last)),
                Cell::right(size_or_dash(t.limits.get(&d.device).copied())),
                Cell::right(count(d.changes)),
            ]);
        }
        out.push_str(&table.render(painter));
    }
    out.push_str(&ceiling_changes(t, span.map_or(0.0, |s| s.0)));
    out.push_str(&event_counts(t));
    if !scopes.is_empty() {
        out.push_str(&format!("  {}\n", painter.paint("scopes:", Style::Heading)));
        out.push_str(&scope_replay_table(
            &scopes,
            span.map_or(0.0, |s| s.0),
            painter,
        ));
    }
    out
}

/// The timeline's events counted per memory kind, as the exit report keeps them apart: device
/// memory (the `ALLOCS`/`FREES` of the exit report), then managed and pinned host memory when any.
fn event_counts(t: &Timeline) -> String {
    let c = |kind: &str, category: &str| t.count(kind, category);
    let mut out = format!(
        "  device memory events: {}, {}, {} denied, {} failed\n",
        counted(c("device", "alloc"), "allocation", "allocations"),
        counted(c("device", "free"), "free", "frees"),
        count(c("device", "denied")),
        count(c("device", "failed"))
    );
    for (kind, label) in [
        ("managed", "managed (unified) memory"),
        ("host_pinned", "pinned host memory"),
    ] {
        let any = ["alloc", "free", "denied", "failed"]
            .iter()
            .any(|&category| c(kind, category) > 0);
        if !any {
            continue;
        }
        let mut facts = vec![
            counted(c(kind, "alloc"), "allocation", "allocations"),
            counted(c(kind, "free"), "free", "frees"),
        ];
        for (category, word) in [("denied", "denied"), ("failed", "failed")] {
            if c(kind, category) > 0 {
                facts.push(format!("{} {word}", count(c(kind, category))));
            }
        }
        out.push_str(&format!("  {label} events: {}\n", facts.join(", ")));
    }
    out
}

/// One line per device whose ceiling changed during the run: each ceiling and when it took effect
/// (the table's `LIMIT` is the one in force at the end).
fn ceiling_changes(t: &Timeline, start: f64) -> String {
    let mut out = String::new();
    for (device, steps) in &t.ceilings {
        if steps.len() < 2 {
            continue;
        }
        let history: Vec<String> = steps
            .iter()
            .map(|(ts, limit)| {
                let ceiling = limit.map_or_else(|| "none".to_string(), format_size);
                if *ts <= start {
                    format!("{ceiling} from the start")
                } else {
                    format!("{ceiling} from +{}", duration((ts - start) / 1e6))
                }
            })
            .collect();
        out.push_str(&format!(
            "  device {device} ceiling: {}\n",
            history.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_counts_keep_device_managed_and_pinned_apart() {
        let mut t = Timeline::default();
        let mut add = |kind: &str, category: &str, n: u64| {
            t.kind_counts
                .entry(kind.into())
                .or_default()
                .insert(category.into(), n);
        };
        add("device", "alloc", 3);
        add("device", "free", 1);
        add("managed", "alloc", 1);
        add("host_pinned", "alloc", 1);
        add("host_pinned", "free", 1);
        let text = event_counts(&t);
        assert_eq!(
            text,
            "  device memory events: 3 allocations, 1 free, 0 denied, 0 failed\n  \
             managed (unified) memory events: 1 allocation, 0 frees\n  \
             pinned host memory events: 1 allocation, 1 free\n"
        );
    }

    #[test]
    fn ceiling_history_is_listed_only_when_it_changed() {
        let mut t = Timeline::default();
        t.ceilings.insert(0, vec![(0.0, Some(4 << 30))]);
        assert_eq!(ceiling_changes(&t, 0.0), "");
        t.ceilings.insert(
            1,
            vec![(0.0, Some(4 << 30)), (1.5e6, Some(862 << 20)), (2e6, None)],
        );
        assert_eq!(
            ceiling_changes(&t, 0.0),
            "  device 1 ceiling: 4.00 GiB from the start, 862.0 MiB from +1.5 s, none from +2.0 s\n"
        );
    }

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

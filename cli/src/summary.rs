//! Human summaries of what a process held: of an exit report or live snapshot ([`Snapshot`]), and of
//! a timeline ([`Timeline`]), replayed to the same figures (by the timeline crate's `replay`).
//! `run` prints these at exit and `report` prints them for a file, so both read the same way.

use crate::attribution;
use crate::style::{count, counted, duration, size_or_dash, Cell, Painter, Style, Table};
use gpumemhook_reader::EventKind;
use gpumemhook_reader::{format_size, MemKind, Snapshot};
use gpumemhook_timeline::Timeline;
use gpumemhook_timeline::{replay, time_span, DeviceReplay, ScopeReplay};

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
    let mut out = title_line(s, ending, painter);
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
    out.push_str(&other_memory_lines(s, painter));
    if !s.scopes.is_empty() {
        out.push_str(&format!(
            "  {}\n",
            painter.paint("scopes still open at exit:", Style::Heading)
        ));
        out.push_str(&scope_table(s, painter, 4));
    }
    out
}

/// A process's title line: pid and command, how long it ran, how it ended and its job.
fn title_line(s: &Snapshot, ending: &Ending, painter: Painter) -> String {
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
    title.push('\n');
    title
}

/// Managed and pinned host memory, and the allocations the ceiling refused.
fn other_memory_lines(s: &Snapshot, painter: Painter) -> String {
    let mut out = String::new();
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
    out
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
/// What a reader of the timeline's figures must know first: a file its writer did not finish, and
/// events it could not write.
fn timeline_warnings(t: &Timeline) -> Vec<String> {
    let mut warnings = Vec::new();
    match (t.cut_short, t.killed_by) {
        (true, Some(Some(signal))) => warnings.push(format!(
            "cut short: the process was killed by signal {signal} ({}) before it finished its \
             timeline; it is read to its last whole event",
            crate::launch::signal_name(signal as i32)
        )),
        (true, Some(None)) => warnings.push(
            "cut short: the process died before it finished its timeline; it is read to its \
             last whole event"
                .to_string(),
        ),
        (true, None) => warnings.push(
            "cut short: the process ended without finishing its timeline (killed, crashed or \
             still running); it is read to its last whole event"
                .to_string(),
        ),
        (false, _) => {}
    }
    if let Some(line) = ring_line(t) {
        warnings.push(line);
    }
    if t.dropped > 0 {
        warnings.push(format!(
            "{} events were lost (the timeline could not grow: a full disk?): the figures below \
             may miss some changes",
            count(t.dropped)
        ));
    }
    warnings
}

/// Where a ring timeline's full detail starts, and what stands for what it overwrote; `None` for
/// a timeline that overwrote nothing.
pub fn ring_line(t: &Timeline) -> Option<String> {
    let ring = t.ring.as_ref()?;
    let from = ring.detail_from()?;
    let into = (from - ring.figures.start_ns as f64 / 1000.0).max(0.0);
    Some(format!(
        "a ring (GPUMEMHOOK_TRACE_MAX): full detail from {} after recording started on; the {} \
         events before are summarised (peaks, used and counts below are the whole run's; scopes, \
         sites and single allocations only from then)",
        duration(into / 1e6),
        count(ring.figures.evicted_events)
    ))
}

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
    if t.events == 1 {
        // "1 event", and no span: one event lasts no time.
        title.pop();
    } else if let Some((lo, hi)) = span {
        title.push_str(&format!(" over {}", duration((hi - lo) / 1e6)));
    }
    // The job (rank, job name, pod) as the exit report's title says it.
    let job = t.info.labels.summary();
    if !job.is_empty() {
        title.push_str(&format!(", {job}"));
    }
    title.push(')');
    out.push_str(&title);
    out.push('\n');
    for warning in timeline_warnings(t) {
        out.push_str(&format!("  {}\n", painter.paint(&warning, Style::Warn)));
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
    out.push_str(&peak_restarts(&devices, span.map_or(0.0, |s| s.0)));
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
    use EventKind::{Alloc, Denied, Failed, Free};
    let c = |kind: MemKind, event: EventKind| t.count(kind, event);
    let mut out = format!(
        "  device memory events: {}, {}, {} denied, {} failed\n",
        counted(c(MemKind::Device, Alloc), "allocation", "allocations"),
        counted(c(MemKind::Device, Free), "free", "frees"),
        count(c(MemKind::Device, Denied)),
        count(c(MemKind::Device, Failed))
    );
    for (kind, label) in [
        (MemKind::Managed, "managed (unified) memory"),
        (MemKind::HostPinned, "pinned host memory"),
    ] {
        if ![Alloc, Free, Denied, Failed]
            .iter()
            .any(|&event| c(kind, event) > 0)
        {
            continue;
        }
        let mut facts = vec![
            counted(c(kind, Alloc), "allocation", "allocations"),
            counted(c(kind, Free), "free", "frees"),
        ];
        for event in [Denied, Failed] {
            if c(kind, event) > 0 {
                facts.push(format!("{} {}", count(c(kind, event)), event.category()));
            }
        }
        out.push_str(&format!("  {label} events: {}\n", facts.join(", ")));
    }
    out
}

/// One line per device whose peak was restarted (`reset_peak`): when, and the peak over the whole
/// run beside the one since (the table's `PEAK`, as the exit report counts it).
fn peak_restarts(devices: &[DeviceReplay], start: f64) -> String {
    devices
        .iter()
        .filter_map(|d| {
            let at = d.restarted?;
            Some(format!(
                "  device {} peak restarted at +{} (reset_peak): PEAK counts from then; {} over \
                 the whole run, at +{}\n",
                d.device,
                duration((at - start).max(0.0) / 1e6),
                format_size(d.run_peak.0),
                duration((d.run_peak.1 - start).max(0.0) / 1e6)
            ))
        })
        .collect()
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
        let mut add = |kind: MemKind, event: EventKind, n: u64| {
            t.kind_counts
                .entry(kind.name().into())
                .or_default()
                .insert(event.category().into(), n);
        };
        add(MemKind::Device, EventKind::Alloc, 3);
        add(MemKind::Device, EventKind::Free, 1);
        add(MemKind::Managed, EventKind::Alloc, 1);
        add(MemKind::HostPinned, EventKind::Alloc, 1);
        add(MemKind::HostPinned, EventKind::Free, 1);
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
}

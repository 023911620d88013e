//! `report --json TIMELINE`: a timeline's figures in the exit report's shape ([`Snapshot`]),
//! replayed from its events, with a `replayed` object that says so and whether the file was cut
//! short or lost events. Peaks, `used` and scopes come from `crate::replay`; what the timeline
//! keeps only for all devices together (allocations, frees, refusals and failures, managed memory,
//! each module's bytes, pinned host memory) is counted here per device, as the events go by.

use crate::error::TraceError;
use crate::event::{Event, EventSink};
use crate::recording::read_recording_teed;
use crate::timeline::{AllocationEvent, Keep, RingPart, Timeline};
use gpumemhook_reader::{
    DeviceStats, EventKind, HostStats, MemKind, ModuleStats, ScopeDeviceStats, ScopeStats,
    Snapshot, OTHER_MODULE_NAME,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

use crate::replay::{replay, DeviceReplay, ScopeReplay};

/// What `report --json` adds to a timeline's figures: where they come from.
#[derive(Serialize)]
struct Replayed {
    /// The timeline file.
    timeline: String,
    /// Its writer did not finish it (killed, crashed, or still running): read to its last event.
    cut_short: bool,
    /// The signal that killed the process, when `run` saw it.
    signal: Option<u32>,
    /// Events the writer could not write (a full disk): the figures may miss them.
    lost_events: u64,
    events: u64,
    /// Every scope of the run, closed ones included (the report's `scopes` has only those still
    /// open at the end, as an exit report's).
    scopes: Vec<ReplayedScope>,
}

/// A scope as the timeline holds it: when it opened and closed (µs of `CLOCK_MONOTONIC`, the
/// timeline's clock), and per device `used` when it opened and the largest `used` while open.
#[derive(Serialize)]
struct ReplayedScope {
    name: String,
    open_us: f64,
    close_us: Option<f64>,
    devices: Vec<ReplayedScopeDevice>,
}

#[derive(Serialize)]
struct ReplayedScopeDevice {
    device: u32,
    base: u64,
    peak: u64,
}

/// Per device, what its events add up to beside `used` (which the replay gives).
#[derive(Default)]
struct Counts {
    devices: BTreeMap<u32, DeviceStats>,
    /// Per device, module name: its bytes, peak and live allocations.
    modules: BTreeMap<(u32, String), ModuleStats>,
    host: HostStats,
}

impl Counts {
    /// One event of memory kind `mem`, charged to `module` (device memory only).
    fn take(&mut self, kind: EventKind, mem: MemKind, device: u32, bytes: u64, module: &str) {
        use EventKind::{Alloc, Denied, Failed, Free};
        // Scopes, ceilings and peak restarts are no activity of a device.
        if !matches!(kind, Alloc | Free | Denied | Failed) {
            return;
        }
        let d = self.devices.entry(device).or_insert_with(|| DeviceStats {
            device,
            ..DeviceStats::default()
        });
        match (mem, kind) {
            (MemKind::Device, EventKind::Alloc) => {
                d.allocs += 1;
                d.total_allocated += bytes;
                self.module(device, module, bytes as i64);
            }
            (MemKind::Device, EventKind::Free) => {
                d.frees += 1;
                self.module(device, module, -(bytes as i64));
            }
            (_, EventKind::Denied) => d.denied += 1,
            (_, EventKind::Failed) => d.failed += 1,
            (MemKind::Managed, EventKind::Alloc) => {
                d.managed += bytes;
                d.managed_peak = d.managed_peak.max(d.managed);
            }
            (MemKind::Managed, EventKind::Free) => d.managed = d.managed.saturating_sub(bytes),
            (MemKind::HostPinned, EventKind::Alloc) => {
                let h = &mut self.host;
                (h.allocs, h.pinned) = (h.allocs + 1, h.pinned + bytes);
                h.pinned_peak = h.pinned_peak.max(h.pinned);
            }
            (MemKind::HostPinned, EventKind::Free) => {
                let h = &mut self.host;
                (h.frees, h.pinned) = (h.frees + 1, h.pinned.saturating_sub(bytes));
            }
            _ => {}
        }
    }

    /// A module's bytes grow (or shrink) by `change`, with one allocation more (or less).
    fn module(&mut self, device: u32, module: &str, change: i64) {
        let m = self.module_stats(device, module);
        m.used = m.used.saturating_add_signed(change);
        m.peak = m.peak.max(m.used);
        m.live_allocs = if change >= 0 {
            m.live_allocs + 1
        } else {
            m.live_allocs.saturating_sub(1)
        };
    }

    /// A module's figures on `device` (`""`: the other modules').
    fn module_stats(&mut self, device: u32, module: &str) -> &mut ModuleStats {
        let name = if module.is_empty() {
            OTHER_MODULE_NAME
        } else {
            module
        };
        let m = self.modules.entry((device, name.to_string())).or_default();
        m.module = name.to_string();
        m
    }

    /// The counts of a timeline read whole (the Chrome JSON of earlier versions): its device
    /// allocation events, the only ones it keeps one by one.
    fn of_allocations(allocations: &[AllocationEvent]) -> Counts {
        let mut counts = Counts::default();
        for a in allocations {
            counts.take(a.kind, MemKind::Device, a.device, a.bytes, &a.module);
        }
        counts
    }
}

impl EventSink for Counts {
    fn event(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        self.take(e.kind, e.mem, e.device, e.bytes, e.module);
        Ok(())
    }

    /// Starts from what a ring overwrote: its sums, and the segment's peaks it copied.
    fn ring(&mut self, ring: &RingPart) -> std::io::Result<()> {
        let f = &ring.figures;
        for r in f.devices.iter().filter(|r| r.is_active()) {
            let d = self.devices.entry(r.device).or_insert_with(|| DeviceStats {
                device: r.device,
                ..DeviceStats::default()
            });
            d.allocs += r.allocs;
            d.frees += r.frees;
            d.denied += r.denied;
            d.failed += r.failed;
            d.total_allocated += r.total_allocated;
            d.managed = d.managed.saturating_add_signed(r.managed);
            d.managed_peak = d.managed_peak.max(r.managed_peak);
            for &(number, bytes, allocs, peak) in &r.modules {
                let m = self.module_stats(r.device, ring.module_name(number));
                m.used = m.used.saturating_add_signed(bytes);
                m.live_allocs = m.live_allocs.saturating_add_signed(allocs);
                m.peak = m.peak.max(peak);
            }
        }
        let h = &mut self.host;
        h.allocs += f.host_allocs;
        h.frees += f.host_frees;
        h.pinned = h.pinned.saturating_add_signed(f.host_pinned);
        h.pinned_peak = h.pinned_peak.max(f.host_pinned_peak);
        Ok(())
    }

    fn ceiling_step(&mut self, _: u64, _: u32, _: Option<u64>) -> std::io::Result<()> {
        Ok(())
    }
}

/// The recording at `path` as `report --json` prints it: the exit report's object with a
/// `replayed` object beside its fields.
pub fn recording_json(path: &Path) -> Result<serde_json::Value, TraceError> {
    let mut counts = Counts::default();
    let t = read_recording_teed(path, Keep::Peaks, &mut counts)?;
    json_of(&t, counts, path)
}

/// [`recording_json`] of a timeline read whole (the Chrome JSON of earlier versions): counted from
/// its device allocation events, the only ones it keeps one by one.
pub fn timeline_json(t: &Timeline, path: &Path) -> Result<serde_json::Value, TraceError> {
    json_of(t, Counts::of_allocations(&t.allocations), path)
}

fn json_of(t: &Timeline, counts: Counts, path: &Path) -> Result<serde_json::Value, TraceError> {
    let (devices, scopes) = replay(t);
    let snapshot = snapshot_of(t, &devices, &scopes, counts);
    let json_error = |e: serde_json::Error| TraceError::broken(e.to_string());
    let mut value = serde_json::to_value(snapshot).map_err(json_error)?;
    let replayed = Replayed {
        timeline: path.display().to_string(),
        cut_short: t.cut_short,
        signal: t.killed_by.flatten(),
        lost_events: t.dropped,
        events: t.events,
        scopes: scopes.iter().map(replayed_scope).collect(),
    };
    value["replayed"] = serde_json::to_value(replayed).map_err(json_error)?;
    Ok(value)
}

/// The exit report's figures of a timeline: each device's peak and `used` at the end replayed,
/// its counts and modules from `counts`, the scopes still open at the end.
fn snapshot_of(
    t: &Timeline,
    devices: &[DeviceReplay],
    scopes: &[ScopeReplay],
    mut counts: Counts,
) -> Snapshot {
    for d in devices {
        let stats = counts.devices.entry(d.device).or_default();
        (stats.device, stats.peak, stats.used) = (d.device, d.peak, d.last);
    }
    for (&device, &limit) in &t.limits {
        let stats = counts.devices.entry(device).or_default();
        (stats.device, stats.limit) = (device, Some(limit));
    }
    let run_peaks: BTreeMap<u32, u64> = devices.iter().map(|d| (d.device, d.run_peak.0)).collect();
    for ((device, _), mut m) in std::mem::take(&mut counts.modules) {
        // A module never held more than its device: a ring's sums, started from before the
        // events it kept, can say more where threads raced (`RingPart`).
        if let Some(&run_peak) = run_peaks.get(&device) {
            m.peak = m.peak.min(run_peak.max(m.used));
        }
        if let Some(stats) = counts.devices.get_mut(&device) {
            stats.by_module.push(m);
        }
    }
    for stats in counts.devices.values_mut() {
        gpumemhook_reader::sort_modules(&mut stats.by_module);
    }
    let last: BTreeMap<u32, u64> = devices.iter().map(|d| (d.device, d.last)).collect();
    let open_scopes = scopes.iter().filter(|s| s.close.is_none());
    Snapshot {
        pid: t.pid,
        command: gpumemhook_reader::kept_command(&t.command),
        job: t.info.labels.clone(),
        start_unix_ns: unix_ns(t, crate::replay::time_span(t).map_or(0.0, |s| s.0)),
        taken_unix_ns: unix_ns(t, t.end.unwrap_or(0.0)),
        devices: counts.devices.into_values().collect(),
        host: counts.host,
        scopes: open_scopes
            .map(|s| ScopeStats {
                name: s.name.clone(),
                opened_unix_ns: unix_ns(t, s.open),
                devices: scope_devices(s, &last),
                ..ScopeStats::default()
            })
            .collect(),
        ..Snapshot::default()
    }
}

/// A scope's devices: `used` when it opened, its largest `used` while open, and `used` in
/// `now` (per device).
fn scope_devices(s: &ScopeReplay, now: &BTreeMap<u32, u64>) -> Vec<ScopeDeviceStats> {
    s.devices
        .iter()
        .map(|(&device, &(base, peak))| ScopeDeviceStats {
            device,
            base,
            peak,
            used: now.get(&device).copied().unwrap_or(0),
        })
        .collect()
}

fn replayed_scope(s: &ScopeReplay) -> ReplayedScope {
    ReplayedScope {
        name: s.name.clone(),
        open_us: s.open,
        close_us: s.close,
        devices: s
            .devices
            .iter()
            .map(|(&device, &(base, peak))| ReplayedScopeDevice { device, base, peak })
            .collect(),
    }
}

/// Unix time (ns) of `us` on the timeline's clock, 0 when the file does not say its wall clock.
fn unix_ns(t: &Timeline, us: f64) -> u64 {
    match t.info.wall_offset_us {
        Some(offset) if us > 0.0 => ((us + offset) * 1000.0).max(0.0) as u64,
        _ => 0,
    }
}

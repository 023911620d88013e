//! A consistent-enough copy of a segment's counters as plain data: what `stats()` returns, what the
//! CLI prints, and (serialised as JSON) the exit report `GPUMEMHOOK_REPORT` writes. One type for all
//! three, so the report's fields and the live view's fields cannot drift apart.
//!
//! Reading a report back, only what identifies it is required: `pid`, `devices`, and in each device
//! `device`, `used`, `peak` (in each scope device, `device`, `base`, `peak`, `used`). Every other
//! field may be missing (a report from an older release, or one written by hand) and reads as zero,
//! `null` or empty. `docs/report-format.md` is the schema.

use crate::labels::JobLabels;
use gpumemhook_segment::layout::{Segment, COMMAND_LEN, MAX_DEVICES, MODULE_CELLS, OTHER_MODULE};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering::Relaxed;

/// Calls `$callback!` with the fields of [`DeviceStats`], their doc comments and types, once for
/// every crate that needs them: this one defines the struct with it, the Python bindings their
/// `DeviceStats` class, so a field added here appears everywhere (the `.pyi` stub is checked
/// against the module in the tests). A field marked `= default` may be missing from a report and
/// reads as zero or `null`; the others identify a device's figures and are required.
#[macro_export]
macro_rules! for_device_stats_fields {
    ($callback:ident) => {
        $callback! {
            /// Device ordinal.
            device: u32,
            /// Device bytes held now.
            used: u64,
            /// Largest `used` since start or the last peak reset.
            peak: u64,
            /// Ceiling in bytes, `null` (Python: `None`) when none.
            limit: Option<u64> = default,
            /// Successful device allocations.
            allocs: u64 = default,
            /// Successful frees of allocations the hook saw.
            frees: u64 = default,
            /// Allocations refused by the ceiling.
            denied: u64 = default,
            /// Allocations the driver failed.
            failed: u64 = default,
            /// Bytes ever allocated.
            total_allocated: u64 = default,
            /// Live managed (unified) bytes, never part of `used`.
            managed: u64 = default,
            /// Largest `managed` since start.
            managed_peak: u64 = default,
        }
    };
}

/// An emulated card: what the device's views report as its total, and the overhead charged inside it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmulatedStats {
    /// The preset's name, or the size for a card given by size (`"12.00 GiB"`).
    #[serde(default)]
    pub card: String,
    /// The card's total memory in bytes.
    #[serde(default)]
    pub total: u64,
    /// Memory no allocation accounts for (context, modules), charged inside `total`; last measured.
    #[serde(default)]
    pub overhead: u64,
}

macro_rules! define_device_stats {
    ($($(#[$doc:meta])* $name:ident: $ty:ty $(= $default:ident)?,)*) => {
        /// Counters of one device.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct DeviceStats {
            $($(#[$doc])* $(#[serde($default)])? pub $name: $ty,)*
            /// The card the device emulates (`GPUMEMHOOK_EMULATE`), absent when it does not. Not
            /// in the field list: a nested object, which Python reads from the report's JSON.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub emulated: Option<EmulatedStats>,
            /// Device memory by the shared object that asked for it, largest `used` first (see
            /// [`ModuleStats`]). Not in the field list: a nested list.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub by_module: Vec<ModuleStats>,
        }

        impl DeviceStats {
            /// The field names, in order: the keys of a device in the exit report.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($name)),*];
        }
    };
}

for_device_stats_fields!(define_device_stats);

/// The device memory one shared object (library or executable) asked for on one device: every
/// device allocation is charged to the module that called into CUDA for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleStats {
    /// The file name (`libc10_cuda.so`), or [`OTHER_MODULE_NAME`] for modules past the named ones.
    pub module: String,
    /// The full path, empty for `other`.
    #[serde(default)]
    pub path: String,
    /// Bytes held now.
    pub used: u64,
    /// Largest `used` since the process started.
    #[serde(default)]
    pub peak: u64,
    /// Its allocations held now (the device's `allocs` counts every one made); `allocs` in
    /// reports written before the two were named apart.
    #[serde(default, alias = "allocs")]
    pub live_allocs: u64,
}

/// The module name of the cell that takes the allocations of modules past the named ones.
pub const OTHER_MODULE_NAME: &str = "other";

/// The file name of `path` (what the breakdown calls a module).
pub fn module_file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

impl ModuleStats {
    /// The modules of `device` that hold or held memory, largest `used` first (then largest peak,
    /// then by name).
    pub fn read(segment: &Segment, device: u32) -> Vec<ModuleStats> {
        let mut rows: Vec<ModuleStats> = (0..MODULE_CELLS)
            .filter_map(|slot| {
                let (used, peak, allocs) = segment.modules.cell(device, slot)?.read();
                if used == 0 && peak == 0 && allocs == 0 {
                    return None;
                }
                let path = if slot == OTHER_MODULE {
                    String::new()
                } else {
                    segment.modules.path(slot).unwrap_or_default()
                };
                let module = if slot == OTHER_MODULE {
                    OTHER_MODULE_NAME.to_string()
                } else if path.is_empty() {
                    format!("module {slot}")
                } else {
                    module_file_name(&path).to_string()
                };
                Some(ModuleStats {
                    module,
                    path,
                    used,
                    peak,
                    live_allocs: allocs,
                })
            })
            .collect();
        sort_modules(&mut rows);
        rows
    }
}

/// Largest `used` first, then largest peak, then by name: the order of every breakdown.
pub fn sort_modules(rows: &mut [ModuleStats]) {
    sort_largest_first(rows, |m| (m.used, m.peak, &m.module));
}

/// Sorts rows by their `(used, peak, name)`: largest `used` first, then largest peak, then name.
fn sort_largest_first<T>(rows: &mut [T], key: impl Fn(&T) -> (u64, u64, &str)) {
    rows.sort_by(|a, b| {
        let (a, b) = (key(a), key(b));
        b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then_with(|| a.2.cmp(b.2))
    });
}

/// An allocation still held when the report was written: at exit, the leak report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveAllocation {
    pub device: u32,
    pub bytes: u64,
    /// File name of the module that asked for it (`""` when unknown).
    #[serde(default)]
    pub module: String,
    /// The device address (or the physical-memory handle of `cuMemCreate`), `0x…`.
    #[serde(default)]
    pub address: String,
    /// Seconds since it was made.
    #[serde(default)]
    pub age_s: f64,
    /// The Python frame that made it (`file:line in function`), with `GPUMEMHOOK_STACKS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// The most live allocations a report lists; `live_omitted` counts the rest.
pub const LIVE_LISTED: usize = 1000;

/// What an out-of-memory report (`GPUMEMHOOK_OOM_REPORT`) says about the allocation that failed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomInfo {
    pub device: u32,
    /// The size asked for.
    pub bytes: u64,
    /// The entry point that was called (`cuMemAlloc_v2`, `cudaMalloc`, ...).
    #[serde(default)]
    pub entry: String,
    /// `ceiling` (refused by gpumemhook's ceiling) or `driver` (the driver ran out).
    #[serde(default)]
    pub reason: String,
    /// The device's `used` at that moment.
    #[serde(default)]
    pub used: u64,
    /// The ceiling in force, `null` when none.
    #[serde(default)]
    pub limit: Option<u64>,
    /// File name of the module that asked.
    #[serde(default)]
    pub module: String,
    /// The Python call site that asked (`GPUMEMHOOK_STACKS`), when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// When the process is in a group: the group's figures at that moment and what each other
    /// member held (`docs/groups.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::group::GroupOom>,
}

/// One event of the timeline, as an out-of-memory report lists the last ones.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecentEvent {
    /// Microseconds of `CLOCK_MONOTONIC`, as the timeline's `ts`.
    pub ts: f64,
    /// `alloc`, `free`, `denied` or `failed`.
    pub event: String,
    #[serde(default)]
    pub entry: String,
    #[serde(default)]
    pub device: u32,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub used: u64,
    #[serde(default)]
    pub module: String,
    /// Its Python call site (`GPUMEMHOOK_STACKS`), when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// Pinned host memory, process-wide (never part of any device's `used`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStats {
    #[serde(default)]
    pub pinned: u64,
    #[serde(default)]
    pub pinned_peak: u64,
    #[serde(default)]
    pub allocs: u64,
    #[serde(default)]
    pub frees: u64,
}

/// One device's figures inside a scope.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeDeviceStats {
    pub device: u32,
    /// `used` when the scope was opened or last reset.
    pub base: u64,
    /// Largest `used` while open (since the last reset).
    pub peak: u64,
    /// `used` now.
    pub used: u64,
}

/// An open scope.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeStats {
    #[serde(default)]
    pub slot: u32,
    #[serde(default)]
    pub generation: u64,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub owner_pid: u32,
    /// Default device of the scope, `null` for all.
    #[serde(default)]
    pub device: Option<u32>,
    #[serde(default)]
    pub opened_unix_ns: u64,
    #[serde(default)]
    pub devices: Vec<ScopeDeviceStats>,
}

/// Everything a segment holds about one process.
/// `command` as a [`Snapshot`] states it: cut as the segment cuts it, so that a snapshot built
/// from elsewhere (a timeline keeps a longer command line) says what the process's own says.
pub fn kept_command(command: &str) -> String {
    gpumemhook_segment::text::cut_text(command, COMMAND_LEN - 1).to_owned()
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The pid the reader sees the process by.
    pub pid: u32,
    /// For a process of another pid namespace than the reader's (a container's, seen from the
    /// node): the pid it sees itself by there; left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_in_namespace: Option<u32>,
    /// The command line, as the segment keeps it: its first [`COMMAND_LEN`]` - 1` bytes
    /// ([`kept_command`]).
    #[serde(default)]
    pub command: String,
    /// Where the process belongs (rank, Slurm job, pod); left out when nothing is known.
    #[serde(default, skip_serializing_if = "JobLabels::is_empty")]
    pub job: JobLabels,
    /// The version of the gpumemhook that counted (wrote the segment).
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub start_unix_ns: u64,
    /// When the copy was taken.
    #[serde(default)]
    pub taken_unix_ns: u64,
    /// The segment file, `null` for a private (in-process only) segment.
    #[serde(default)]
    pub segment: Option<String>,
    /// Devices with activity or a ceiling of their own, in ordinal order.
    pub devices: Vec<DeviceStats>,
    #[serde(default)]
    pub host: HostStats,
    #[serde(default)]
    pub scopes: Vec<ScopeStats>,
    /// Reports only: the allocations still held, largest first, at most [`LIVE_LISTED`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Vec<LiveAllocation>>,
    /// Reports only: live allocations past the ones listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub live_omitted: u64,
    /// Out-of-memory reports only: the allocation that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomInfo>,
    /// Out-of-memory reports only, with a timeline recorded: its last events, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<RecentEvent>>,
    /// With `GPUMEMHOOK_STACKS` only: device memory by Python call site, all devices together,
    /// largest `used` first (the first [`gpumemhook_segment::layout::SITE_SLOTS`] sites the process recorded;
    /// in reports, and read from any process's segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_site: Option<Vec<SiteStats>>,
}

/// Device memory made at one Python call site (`GPUMEMHOOK_STACKS`), all devices together.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteStats {
    /// The site's frames, innermost first (`file:line in function < file:line in caller`), or
    /// `no Python frame, thread '<name>'`.
    pub site: String,
    /// Bytes its allocations hold now.
    pub used: u64,
    /// The largest `used` it reached.
    pub peak: u64,
    /// Its allocations held now; `allocs` in reports written before the name said so.
    #[serde(alias = "allocs")]
    pub live_allocs: u64,
}

impl SiteStats {
    /// The per-site breakdown kept in `segment`, largest `used` first; `None` when the process
    /// recorded no site.
    pub fn read(segment: &Segment) -> Option<Vec<SiteStats>> {
        let mut rows: Vec<SiteStats> = segment
            .sites
            .read()
            .into_iter()
            .map(|(site, used, peak, allocs)| SiteStats {
                site,
                used,
                peak,
                live_allocs: allocs,
            })
            .collect();
        if rows.is_empty() {
            return None;
        }
        sort_sites(&mut rows);
        Some(rows)
    }
}

/// Largest `used` first, then largest peak, then by site: the order of the per-site breakdown.
pub fn sort_sites(rows: &mut [SiteStats]) {
    sort_largest_first(rows, |s| (s.used, s.peak, &s.site));
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl DeviceStats {
    /// Reads device `device` of `segment` (zeroes past [`MAX_DEVICES`]).
    pub fn read(segment: &Segment, device: u32) -> DeviceStats {
        let Some(c) = segment.device(device) else {
            return DeviceStats {
                device,
                ..DeviceStats::default()
            };
        };
        let (allocs, frees, total_allocated) = segment.allocation_counts(device);
        DeviceStats {
            device,
            used: c.used.load(Relaxed),
            peak: c.peak_bytes(),
            limit: c.limit(),
            allocs,
            frees,
            denied: c.denied.load(Relaxed),
            failed: c.failed.load(Relaxed),
            total_allocated,
            managed: c.managed.load(Relaxed),
            managed_peak: c.managed_peak.load(Relaxed),
            emulated: match c.emulated_total.load(Relaxed) {
                0 => None,
                total => Some(EmulatedStats {
                    card: crate::cards::card_label(
                        u32::try_from(c.emulated_card.load(Relaxed)).unwrap_or(0),
                        total,
                    ),
                    total,
                    overhead: c.overhead.load(Relaxed),
                }),
            },
            by_module: ModuleStats::read(segment, device),
        }
    }
}

impl Snapshot {
    /// Copies the counters of `segment`.
    pub fn read(segment: &Segment, path: Option<&std::path::Path>) -> Snapshot {
        let h = &segment.header;
        let devices = segment.active_devices();
        let scopes = segment
            .open_scopes()
            .map(|(id, slot)| ScopeStats {
                slot: id.index,
                generation: id.generation,
                name: slot.name(),
                owner_pid: slot.owner_pid.load(Relaxed),
                device: slot.default_device(),
                opened_unix_ns: slot.opened_unix_ns.load(Relaxed),
                devices: devices
                    .iter()
                    .filter(|&&d| (d as usize) < MAX_DEVICES)
                    .map(|&d| ScopeDeviceStats {
                        device: d,
                        base: slot.base[d as usize].load(Relaxed),
                        peak: slot.peak[d as usize].load(Relaxed),
                        used: segment.devices[d as usize].used.load(Relaxed),
                    })
                    .collect(),
            })
            .collect();
        Snapshot {
            pid: h.pid.load(Relaxed),
            command: segment.command(),
            job: crate::labels::JobLabels::read_from(segment),
            version: segment.writer_version(),
            start_unix_ns: h.start_unix_ns.load(Relaxed),
            taken_unix_ns: gpumemhook_segment::process::unix_now_ns(),
            segment: path.map(|p| p.display().to_string()),
            devices: devices
                .iter()
                .map(|&d| DeviceStats::read(segment, d))
                .collect(),
            host: HostStats {
                pinned: h.host_pinned.load(Relaxed),
                pinned_peak: h.host_pinned_peak.load(Relaxed),
                allocs: h.host_allocs.load(Relaxed),
                frees: h.host_frees.load(Relaxed),
            },
            scopes,
            by_site: SiteStats::read(segment),
            ..Snapshot::default()
        }
    }

    /// The figures of `device`, zeroes when it saw no activity.
    pub fn device(&self, device: u32) -> DeviceStats {
        self.devices
            .iter()
            .find(|d| d.device == device)
            .cloned()
            .unwrap_or(DeviceStats {
                device,
                ..DeviceStats::default()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_with_only_the_required_fields_reads_with_zero_defaults() {
        let s: Snapshot =
            serde_json::from_str(r#"{"pid": 5, "devices": [{"device": 1, "used": 2, "peak": 3}]}"#)
                .unwrap();
        assert_eq!(s.pid, 5);
        assert_eq!(s.start_unix_ns, 0);
        assert_eq!(s.command, "");
        assert_eq!(s.host, HostStats::default());
        assert!(s.scopes.is_empty() && s.segment.is_none());
        assert_eq!(
            s.devices,
            vec![DeviceStats {
                device: 1,
                used: 2,
                peak: 3,
                ..DeviceStats::default()
            }]
        );
        // A full snapshot still round-trips.
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Snapshot>(&json).unwrap(), s);
    }

    #[test]
    fn the_field_list_is_the_report_keys() {
        let json = serde_json::to_value(DeviceStats::default()).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        let mut fields = DeviceStats::FIELDS.to_vec();
        fields.sort_unstable();
        assert_eq!(keys, fields);
        assert_eq!(DeviceStats::FIELDS[..3], ["device", "used", "peak"]);
    }

    #[test]
    fn hostile_bytes_in_the_module_cells_and_names_read_without_a_panic() {
        use std::sync::atomic::Ordering::Relaxed;
        // SAFETY: every field of `Segment` is an atomic integer, for which zero is valid.
        let seg: Box<Segment> = unsafe { Box::new_zeroed().assume_init() };
        for row in &seg.modules.cells {
            for cell in row {
                cell.held.store(u64::MAX, Relaxed);
                cell.peak.store(u64::MAX, Relaxed);
                cell.wraps.store(u64::MAX, Relaxed);
            }
        }
        for name in &seg.modules.names {
            name.named.store(7, Relaxed);
            name.path.iter().for_each(|b| b.store(0xff, Relaxed));
        }
        seg.modules.names[1].named.store(1, Relaxed);
        for device in [0, 63, 64, u32::MAX] {
            let rows = ModuleStats::read(&seg, device);
            if device < 64 {
                assert_eq!(rows.len(), MODULE_CELLS);
                // Only a slot published with exactly 1 shows its (lossy, bounded) path.
                let named: Vec<_> = rows.iter().filter(|r| !r.path.is_empty()).collect();
                assert_eq!(named.len(), 1);
                assert_eq!(
                    named[0].path.chars().count(),
                    gpumemhook_segment::layout::MODULE_PATH_LEN
                );
            } else {
                assert!(rows.is_empty());
            }
        }
    }

    #[test]
    fn hostile_bytes_in_the_site_slots_read_bounded_and_without_a_panic() {
        use std::sync::atomic::Ordering::Relaxed;
        // SAFETY: every field of `Segment` is an atomic integer, for which zero is valid.
        let seg: Box<Segment> = unsafe { Box::new_zeroed().assume_init() };
        assert_eq!(SiteStats::read(&seg), None, "no site named");
        // A count of named sites past the slots is clamped to them, never read past the segment.
        seg.sites.named.store(u64::MAX, Relaxed);
        for slot in &seg.sites.slots {
            slot.named.store(7, Relaxed);
            slot.used.store(u64::MAX, Relaxed);
            slot.peak.store(u64::MAX, Relaxed);
            slot.allocs.store(u64::MAX, Relaxed);
            slot.text.iter().for_each(|b| b.store(0xff, Relaxed));
        }
        let last = gpumemhook_segment::layout::SITE_SLOTS - 1;
        seg.sites.slots[last].named.store(1, Relaxed);
        // Only a slot published with exactly 1 shows, its text lossy and bounded.
        let rows = SiteStats::read(&seg).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            rows[0].site.chars().count(),
            gpumemhook_segment::layout::SITE_TEXT_LEN
        );
        assert_eq!((rows[0].used, rows[0].live_allocs), (u64::MAX, u64::MAX));
    }

    #[test]
    fn the_identifying_fields_stay_required() {
        for (text, missing) in [
            (r#"{"devices": []}"#, "pid"),
            (r#"{"pid": 1}"#, "devices"),
            (
                r#"{"pid": 1, "devices": [{"device": 0, "used": 1}]}"#,
                "peak",
            ),
        ] {
            let e = serde_json::from_str::<Snapshot>(text).unwrap_err();
            assert!(e.to_string().contains(missing), "{text}: {e}");
        }
    }

    #[test]
    fn a_module_or_site_names_its_live_allocations_apart_from_the_devices_allocs() {
        // The device's `allocs` counts every allocation made; a module's or a site's count is of
        // those still held, and says so. Reports written before the rename still read.
        let module = serde_json::json!({"module": "libc.so", "used": 4, "peak": 8, "allocs": 3});
        let site = serde_json::json!({"site": "a.py:1 in f", "used": 4, "peak": 8, "allocs": 2});
        let module: ModuleStats = serde_json::from_value(module).unwrap();
        let site: SiteStats = serde_json::from_value(site).unwrap();
        for written in [
            serde_json::to_value(&module).unwrap(),
            serde_json::to_value(&site).unwrap(),
        ] {
            assert!(written.get("allocs").is_none(), "{written}");
            assert!(written["live_allocs"].as_u64().unwrap() > 0, "{written}");
        }
        let again: ModuleStats =
            serde_json::from_value(serde_json::to_value(&module).unwrap()).unwrap();
        assert_eq!(again, module);
        assert_eq!(serde_json::to_value(&again).unwrap()["live_allocs"], 3);
    }
}

//! A consistent-enough copy of a segment's counters as plain data: what `stats()` returns, what the
//! CLI prints, and (serialised as JSON) the exit report `GPUMEMHOOK_REPORT` writes. One type for all
//! three, so the report's fields and the live view's fields cannot drift apart.
//!
//! Reading a report back, only what identifies it is required: `pid`, `devices`, and in each device
//! `device`, `used`, `peak` (in each scope device, `device`, `base`, `peak`, `used`). Every other
//! field may be missing (a report from an older release, or one written by hand) and reads as zero,
//! `null` or empty. `docs/report-format.md` is the schema.

use crate::labels::JobLabels;
use crate::layout::{Segment, MAX_DEVICES};
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
        }

        impl DeviceStats {
            /// The field names, in order: the keys of a device in the exit report.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($name)),*];
        }
    };
}

for_device_stats_fields!(define_device_stats);

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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub pid: u32,
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
            peak: c.peak.load(Relaxed),
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
                    card: crate::cards::label(
                        u32::try_from(c.emulated_card.load(Relaxed)).unwrap_or(0),
                        total,
                    ),
                    total,
                    overhead: c.overhead.load(Relaxed),
                }),
            },
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
            job: segment.job_labels(),
            version: segment.writer_version(),
            start_unix_ns: h.start_unix_ns.load(Relaxed),
            taken_unix_ns: crate::process::unix_now_ns(),
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
}

//! The exporter's metrics: the live hooked processes read, each scrape anew, and their series
//! written as OpenMetrics text, or as the Prometheus text format 0.0.4 made from it.
//!
//! The format comes from `prometheus-client`, the Prometheus project's own Rust client: it writes
//! names, units, escaping and the closing `# EOF` as the specification says, and the series of
//! a scrape are handed to it through its `Collector` interface, so no metric state lives between
//! scrapes. With `httparse` (in [`super::serve`]), it adds four crates to the build
//! (`prometheus-client`, its derive macro, `dtoa`, `httparse`): about 4 s of compiling in a release
//! build on a 2-core machine, the rest they use (`syn`, `parking_lot`, `itoa`) being built for
//! other crates already.
//!
//! Two formats, chosen by the request's `Accept`, as Prometheus' own Go client does: OpenMetrics
//! for a client that asks for it (Prometheus itself does), else the older Prometheus text format
//! 0.0.4 (`curl`, scripts, parsers of that format), made from the OpenMetrics text by
//! [`prometheus_text`].

use anyhow::{Context, Result};
use gpumemhook_reader::GroupStats;
use gpumemhook_reader::{
    list_segments, DeviceStats, Error, JobLabels, Owners, Process, ProcessEntry,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;

/// Longest `command` label, in characters.
const COMMAND_LABEL_CHARS: usize = 64;

/// The live hooked processes to serve, with the uid each runs as. The one place that decides which
/// segments a scrape reads.
/// The live hooked processes the exporter serves, with the uid that owns each: every user's when
/// `all_users` (root), with the readers' ownership checks; this user's otherwise. Files the checks
/// refuse (planted by another user, stale) are not served.
fn live_processes(all_users: bool) -> Result<Vec<(u32, ProcessEntry)>> {
    let owners = if all_users {
        Owners::Everyone
    } else {
        Owners::Me
    };
    match list_segments(owners) {
        Ok(listing) => Ok(listing.live.into_iter().map(|e| (e.uid, e)).collect()),
        // No segment directory yet: nobody has been hooked.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(Vec::new())
        }
        Err(e) => Err(e.into()),
    }
}

/// One process's series.
#[derive(Debug)]
struct ProcessSeries {
    /// `pid`, `user`, `command` and the job labels: shared by every device of the process.
    labels: Vec<(&'static str, String)>,
    devices: Vec<DeviceStats>,
}

impl ProcessSeries {
    fn read(process: &Process, user: String) -> ProcessSeries {
        let (segment, job) = (process.segment(), process.job());
        let mut labels = vec![
            ("pid", process.pid().to_string()),
            ("user", user),
            ("command", short_command(&segment.command())),
        ];
        // A pod's process seen from the node: the pid it sees itself by in the pod too.
        labels.extend(
            process
                .pid_in_namespace()
                .map(|pid| ("pid_in_namespace", pid.to_string())),
        );
        labels.extend(job.pairs().map(|(k, v)| (k, v.to_string())));
        labels.extend(job_id_label(&job));
        ProcessSeries {
            labels,
            devices: segment
                .active_devices()
                .into_iter()
                .map(|d| DeviceStats::read(segment, d))
                .collect(),
        }
    }
}

fn job_id_label(job: &JobLabels) -> Option<(&'static str, String)> {
    job.job_id().map(|id| ("job_id", id))
}

/// The command for a label: the program's file name and its arguments, cut to
/// [`COMMAND_LABEL_CHARS`] characters.
pub fn short_command(command: &str) -> String {
    let mut words = command.split_whitespace();
    let mut short = words
        .next()
        .map(|w| w.rsplit('/').next().unwrap_or(w).to_string())
        .unwrap_or_default();
    for w in words {
        short.push(' ');
        short.push_str(w);
    }
    if short.chars().count() > COMMAND_LABEL_CHARS {
        short = short.chars().take(COMMAND_LABEL_CHARS - 1).collect();
        short.push('…');
    }
    short
}

/// The login name of `uid`, or the number when the system knows none (a container's `/etc/passwd`
/// rarely lists the host's users).
fn user_name(uid: u32) -> String {
    let mut buffer = vec![0 as libc::c_char; 4096];
    // SAFETY: `passwd` is plain old data that getpwuid_r fills in.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and `buffer.len()` is the buffer's real size; the
    // strings it returns point into `buffer`, which outlives their use below.
    let status = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if status != 0 || found.is_null() || entry.pw_name.is_null() {
        return uid.to_string();
    }
    // SAFETY: on success `pw_name` is a NUL-terminated string inside `buffer`.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) };
    name.to_str()
        .ok()
        .filter(|n| !n.is_empty())
        .map_or_else(|| uid.to_string(), str::to_string)
}

/// Reads every live hooked process now and renders one scrape: OpenMetrics text ending in `# EOF`.
pub fn scrape(all_users: bool) -> Result<String> {
    scrape_and_keep(all_users).map(|(text, _mapped)| text)
}

/// The segments a scrape read, still mapped: dropped (unmapped) once the response is sent, so that
/// unmapping a thousand of them is not part of the time a scrape takes.
pub(super) type Mapped = Vec<(u32, ProcessEntry)>;

pub(super) fn scrape_and_keep(all_users: bool) -> Result<(String, Mapped)> {
    let entries = live_processes(all_users)?;
    let mut users: HashMap<u32, String> = HashMap::new();
    let processes = entries.len();
    let series = entries
        .iter()
        .map(|(uid, e)| {
            let user = users.entry(*uid).or_insert_with(|| user_name(*uid)).clone();
            ProcessSeries::read(&e.process, user)
        })
        .filter(|s| !s.devices.is_empty())
        .collect();
    let groups = group_series(&entries, &mut users);
    Ok((
        render(Scrape {
            processes,
            series,
            groups,
        })?,
        entries,
    ))
}

/// The series of every group a live process counts in (`GPUMEMHOOK_GROUP`): labels `group`,
/// `device`, `user` and the members' `job_id`, and the group's figures on that device.
fn group_series(
    entries: &Mapped,
    users: &mut HashMap<u32, String>,
) -> Vec<(Vec<(&'static str, String)>, GroupStats)> {
    let mut named: std::collections::BTreeMap<(u32, String), Option<String>> = Default::default();
    for (uid, e) in entries {
        let job = e.process.job();
        if let Some(group) = job.group.clone() {
            named.insert((*uid, group), job.job_id());
        }
    }
    let dir = gpumemhook_reader::segment_dir();
    let mut out = Vec::new();
    for ((uid, name), job_id) in named {
        let Ok(mapping) = gpumemhook_reader::open_group(&dir, uid, &name) else {
            continue;
        };
        let user = users.entry(uid).or_insert_with(|| user_name(uid)).clone();
        for (device, stats) in crate::groups::devices_of(&mapping) {
            let mut labels = vec![
                ("group", name.clone()),
                ("device", device.to_string()),
                ("user", user.clone()),
            ];
            labels.extend(job_id.clone().map(|id| ("job_id", id)));
            out.push((labels, stats));
        }
    }
    out
}

/// The Prometheus text format 0.0.4 of OpenMetrics text written by [`render`]. The two differ, for
/// what this exporter writes, in three things only: 0.0.4 has no `# UNIT` and no `# EOF` lines, and
/// names a counter's family by its sample name (`x_total`), where OpenMetrics names it `x`.
/// Samples, label escaping (`\\`, `\"`, `\n`) and integer values are the same in both.
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"))
        {
            counters.insert(name.to_string());
            out.push_str(&format!("# TYPE {name}_total counter\n"));
            continue;
        }
        if let Some((name, help)) = line
            .strip_prefix("# HELP ")
            .and_then(|rest| rest.split_once(' '))
        {
            // HELP comes before TYPE: a counter's is renamed by looking at the next TYPE line.
            let counter = openmetrics.contains(&format!("\n# TYPE {name} counter\n"));
            let suffix = if counter { "_total" } else { "" };
            out.push_str(&format!("# HELP {name}{suffix} {help}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn render(scrape: Scrape) -> Result<String> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .context("cannot write the metrics text")?;
    Ok(text)
}

/// What one scrape read, handed to `prometheus-client` to write out.
#[derive(Debug)]
struct Scrape {
    /// Live hooked processes, idle ones included.
    processes: usize,
    /// Processes that used a device.
    series: Vec<ProcessSeries>,
    /// Groups of those processes: labels and figures per device.
    groups: Vec<(Vec<(&'static str, String)>, GroupStats)>,
}

/// The group metrics: name, help, value.
type GroupMetric = (&'static str, &'static str, fn(&GroupStats) -> Option<u64>);

const GROUP_METRICS: [GroupMetric; 3] = [
    (
        "gpumemhook_group_used",
        "Device memory all the group's processes hold now together, exact",
        |g| Some(g.used),
    ),
    (
        "gpumemhook_group_peak",
        "The most all the group's processes held at one instant (exact joint peak)",
        |g| Some(g.peak),
    ),
    (
        "gpumemhook_group_limit",
        "The group's ceiling on the device (absent when none is set)",
        |g| g.limit,
    ),
];

/// One per-device metric: its name (before the unit and `_total`), help, type, unit and value.
struct DeviceMetric {
    name: &'static str,
    help: &'static str,
    counter: bool,
    value: fn(&DeviceStats) -> Option<u64>,
}

const DEVICE_METRICS: [DeviceMetric; 7] = [
    DeviceMetric {
        name: "gpumemhook_used",
        help: "Device memory the process holds now through CUDA allocations, exact",
        counter: false,
        value: |d| Some(d.used),
    },
    DeviceMetric {
        name: "gpumemhook_peak",
        help: "Largest used since the process started or its peak was last reset",
        counter: false,
        value: |d| Some(d.peak),
    },
    DeviceMetric {
        name: "gpumemhook_limit",
        help: "Allocation ceiling of the process on the device (absent when none is set)",
        counter: false,
        value: |d| d.limit,
    },
    DeviceMetric {
        name: "gpumemhook_allocations",
        help: "Successful device allocations",
        counter: true,
        value: |d| Some(d.allocs),
    },
    DeviceMetric {
        name: "gpumemhook_frees",
        help: "Frees of allocations the hook counted",
        counter: true,
        value: |d| Some(d.frees),
    },
    DeviceMetric {
        name: "gpumemhook_denied",
        help: "Allocations refused by the ceiling (the driver was never asked)",
        counter: true,
        value: |d| Some(d.denied),
    },
    DeviceMetric {
        name: "gpumemhook_failed",
        help: "Allocations the CUDA driver itself failed",
        counter: true,
        value: |d| Some(d.failed),
    },
];

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        // The labels of every (process, device) series, made once for all metrics.
        let series: Vec<(Vec<(&str, String)>, &DeviceStats)> = self
            .series
            .iter()
            .flat_map(|p| {
                p.devices.iter().map(|d| {
                    // After pid, user and command, before the job labels.
                    let mut labels = p.labels.clone();
                    labels.insert(labels.len().min(3), ("device", d.device.to_string()));
                    (labels, d)
                })
            })
            .collect();
        for metric in &DEVICE_METRICS {
            let (unit, kind) = if metric.counter {
                (None, MetricType::Counter)
            } else {
                (Some(&Unit::Bytes), MetricType::Gauge)
            };
            let mut family = encoder.encode_descriptor(metric.name, metric.help, unit, kind)?;
            for (labels, device) in &series {
                let Some(value) = (metric.value)(device) else {
                    continue;
                };
                let sample = family.encode_family(labels)?;
                if metric.counter {
                    ConstCounter::new(value).encode(sample)?;
                } else {
                    ConstGauge::new(value).encode(sample)?;
                }
            }
        }
        // Who holds the memory: one series per (process, device, module), the module's label after
        // the device's.
        let mut family = encoder.encode_descriptor(
            "gpumemhook_module_used",
            "Device memory the process holds now, by the shared object that asked for it",
            Some(&Unit::Bytes),
            MetricType::Gauge,
        )?;
        for (labels, device) in &series {
            for module in &device.by_module {
                let mut labels = labels.clone();
                labels.insert(labels.len().min(4), ("module", module.module.clone()));
                ConstGauge::new(module.used).encode(family.encode_family(&labels)?)?;
            }
        }
        for (name, help, value) in GROUP_METRICS {
            let mut family =
                encoder.encode_descriptor(name, help, Some(&Unit::Bytes), MetricType::Gauge)?;
            for (labels, stats) in &self.groups {
                if let Some(v) = value(stats) {
                    ConstGauge::new(v).encode(family.encode_family(labels)?)?;
                }
            }
        }
        let count = encoder.encode_descriptor(
            "gpumemhook_processes",
            "Hooked processes alive on this machine (those that never used a device included)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.processes as u64).encode(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_shortened_to_the_program_name_and_a_bounded_length() {
        assert_eq!(
            short_command("/usr/bin/python3 train.py --lr 3"),
            "python3 train.py --lr 3"
        );
        assert_eq!(short_command(""), "");
        let long = short_command(&format!("/x/y {}", "a".repeat(200)));
        assert_eq!(long.chars().count(), COMMAND_LABEL_CHARS);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn the_exposition_has_every_series_with_its_labels_and_ends_in_eof() {
        let job = JobLabels::from_env_vars([("RANK", "1"), ("SLURM_JOB_ID", "77")]);
        let mut labels = vec![
            ("pid", "42".to_string()),
            ("user", "alice".to_string()),
            ("command", "sim \"q\"\\".to_string()),
        ];
        labels.extend(job.pairs().map(|(k, v)| (k, v.to_string())));
        labels.extend(job_id_label(&job));
        let text = render(Scrape {
            processes: 3,
            groups: Vec::new(),
            series: vec![ProcessSeries {
                labels,
                devices: vec![DeviceStats {
                    device: 2,
                    used: 1000,
                    peak: 1500,
                    limit: Some(4096),
                    allocs: 5,
                    frees: 4,
                    denied: 1,
                    failed: 0,
                    by_module: vec![gpumemhook_reader::ModuleStats {
                        module: "libnccl.so.2".into(),
                        used: 600,
                        ..Default::default()
                    }],
                    ..DeviceStats::default()
                }],
            }],
        })
        .unwrap();
        let l = r#"{pid="42",user="alice",command="sim \"q\"\\",device="2",rank="1",slurm_job_id="77",job_id="slurm:77"}"#;
        let m = r#"{pid="42",user="alice",command="sim \"q\"\\",device="2",module="libnccl.so.2",rank="1",slurm_job_id="77",job_id="slurm:77"}"#;
        assert!(
            text.contains(&format!("gpumemhook_module_used_bytes{m} 600\n")),
            "{text}"
        );
        for sample in [
            format!("gpumemhook_used_bytes{l} 1000\n"),
            format!("gpumemhook_peak_bytes{l} 1500\n"),
            format!("gpumemhook_limit_bytes{l} 4096\n"),
            format!("gpumemhook_allocations_total{l} 5\n"),
            format!("gpumemhook_frees_total{l} 4\n"),
            format!("gpumemhook_denied_total{l} 1\n"),
            format!("gpumemhook_failed_total{l} 0\n"),
            "gpumemhook_processes 3\n".to_string(),
        ] {
            assert!(text.contains(&sample), "{sample} missing from\n{text}");
        }
        assert!(
            text.contains("# TYPE gpumemhook_denied counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# UNIT gpumemhook_used_bytes bytes\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn the_prometheus_text_names_counters_by_their_samples_and_has_no_unit_or_eof() {
        let openmetrics = render(Scrape {
            processes: 1,
            groups: Vec::new(),
            series: vec![ProcessSeries {
                labels: vec![("pid", "1".into())],
                devices: vec![DeviceStats {
                    used: 5,
                    allocs: 2,
                    ..DeviceStats::default()
                }],
            }],
        })
        .unwrap();
        let text = prometheus_text(&openmetrics);
        assert!(text.contains(
            "# HELP gpumemhook_allocations_total Successful device allocations\n\
             # TYPE gpumemhook_allocations_total counter\n\
             gpumemhook_allocations_total{pid=\"1\",device=\"0\"} 2\n"
        ));
        assert!(text.contains(
            "# TYPE gpumemhook_used_bytes gauge\ngpumemhook_used_bytes{pid=\"1\",device=\"0\"} 5\n"
        ));
        assert!(
            !text.contains("# UNIT") && !text.contains("# EOF"),
            "{text}"
        );
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count(),
            openmetrics.lines().filter(|l| !l.starts_with('#')).count()
        );
    }

    #[test]
    fn no_ceiling_means_no_limit_series() {
        let text = render(Scrape {
            processes: 1,
            groups: Vec::new(),
            series: vec![ProcessSeries {
                labels: vec![("pid", "1".into())],
                devices: vec![DeviceStats::default()],
            }],
        })
        .unwrap();
        assert!(!text.contains("gpumemhook_limit_bytes{"), "{text}");
        assert!(text.contains("gpumemhook_used_bytes{"), "{text}");
    }

    #[test]
    fn this_user_has_a_name_or_a_number() {
        let uid = gpumemhook_reader::current_uid();
        assert!(!user_name(uid).is_empty());
        assert_eq!(user_name(u32::MAX - 7), (u32::MAX - 7).to_string());
    }
}

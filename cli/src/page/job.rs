//! The page of several processes of one job (`view A B C ...`, `run --html` of a job that traced
//! several processes): which files are one job ([`one_job`]), the clock they are drawn on, each
//! process's lane and peak, and each group's joint line.
//!
//! Every run's times are moved onto the job's axis ([`RunData::shift`]): µs from the job's first
//! event, on `CLOCK_MONOTONIC` when every file is of one machine (the same `host`, or none said),
//! else on the wall clock (each file's `wall_offset`); files of several machines without one start
//! each at their own first event, and the page says so. Each run's own view then shares the job's
//! time axis: a time of the job chart is the same time in every run's chart.

use gpumemhook_timeline::RunInfo;
use std::collections::BTreeMap;

use super::data::{deltas, GroupLine, JobData, PageData, ProcData, RunData};

/// A timeline's run with what the job needs of it: its labels, host and wall clock.
pub struct JobRun {
    pub run: RunData,
    pub info: RunInfo,
    pub cut_short: bool,
}

/// The page of the processes of one job, each run's times on the job's axis.
pub fn job_page(runs: Vec<JobRun>) -> PageData {
    let (runs, job) = arrange(runs);
    PageData {
        job: Some(job),
        ..PageData::new(runs)
    }
}

/// Whether two timelines are processes of one job, not two runs to compare: they are not one
/// process read twice (the same pid of the same machine), and either they overlap in time on one
/// clock (one machine's `CLOCK_MONOTONIC`, else the wall clock when both files say it), or they
/// hold different ranks and share a job label (job name, group, torchelastic run id, Slurm or Ray
/// job id).
pub fn one_job(a: &JobRun, b: &JobRun) -> bool {
    if a.run.pid == b.run.pid && a.info.host == b.info.host {
        return false;
    }
    let span = |r: &JobRun, shift: f64| (r.run.t0 + shift, r.run.t0 + shift + r.run.end as f64);
    let spans = if same_machine(&[a, b]) {
        Some((span(a, 0.0), span(b, 0.0)))
    } else {
        match (a.info.wall_offset_us, b.info.wall_offset_us) {
            (Some(oa), Some(ob)) => Some((span(a, oa), span(b, ob))),
            _ => None,
        }
    };
    if let Some(((a0, a1), (b0, b1))) = spans {
        if a0 <= b1 && b0 <= a1 {
            return true;
        }
    }
    let (la, lb) = (&a.info.labels, &b.info.labels);
    let shared = |x: &Option<String>, y: &Option<String>| x.is_some() && x == y;
    la.rank.is_some()
        && lb.rank.is_some()
        && la.rank != lb.rank
        && (shared(&la.job_name, &lb.job_name)
            || shared(&la.group, &lb.group)
            || shared(&la.torchelastic_run_id, &lb.torchelastic_run_id)
            || shared(&la.slurm_job_id, &lb.slurm_job_id)
            || shared(&la.ray_job_id, &lb.ray_job_id))
}

/// Every file is of one machine: they all name the same host, or none.
fn same_machine(runs: &[&JobRun]) -> bool {
    let mut hosts = runs.iter().filter_map(|r| r.info.host.as_deref());
    let first = hosts.next();
    hosts.all(|h| Some(h) == first)
}

/// The runs of one job on one time axis, ordered by rank (as a number where it is one), then pid,
/// and the job's data.
pub fn arrange(mut runs: Vec<JobRun>) -> (Vec<RunData>, JobData) {
    runs.sort_by(|a, b| {
        let rank = |r: &JobRun| {
            let text = r.info.labels.rank.clone();
            (
                text.is_none(),
                text.as_deref().and_then(|t| t.parse::<u64>().ok()),
                text,
            )
        };
        (rank(a), a.run.pid).cmp(&(rank(b), b.run.pid))
    });
    let (clock, clock_note, on_clock) = clock_of(&runs);
    // A timeline without a single event has no time to line up (its `t0` is 0).
    let on_clock: Vec<Option<f64>> = runs
        .iter()
        .zip(on_clock)
        .map(|(r, at)| at.filter(|_| r.run.t0 != 0.0 || r.run.end != 0))
        .collect();
    let start = on_clock.iter().flatten().copied().reduce(f64::min);
    let offset = runs.iter().find_map(|r| r.info.wall_offset_us);
    let mut out = Vec::with_capacity(runs.len());
    let mut procs = Vec::with_capacity(runs.len());
    for (mut r, at) in runs.into_iter().zip(on_clock) {
        if let (Some(at), Some(start)) = (at, start) {
            r.run.shift((at - start).round() as i64);
        }
        procs.push(proc_of(&r));
        out.push(r.run);
    }
    let start_unix_us = match clock {
        "wall" => start,
        // One machine: a file's wall-clock offset dates the axis too.
        "monotonic" => start.zip(offset).map(|(s, o)| s + o),
        _ => None,
    };
    let top = procs
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.devices.is_empty())
        .max_by_key(|(i, p)| (p.peak, std::cmp::Reverse(*i)))
        .map(|(i, _)| i);
    let job = JobData {
        clock,
        clock_note,
        start_unix_us,
        end: out.iter().map(|r| r.end).max().unwrap_or(0),
        groups: group_lines(&out, &procs),
        procs,
        top,
    };
    (out, job)
}

/// The clock `runs` are drawn on (`JobData::clock`), in words, and where each run's first event
/// lies on it (`None` for each with `separate`).
fn clock_of(runs: &[JobRun]) -> (&'static str, String, Vec<Option<f64>>) {
    let refs: Vec<&JobRun> = runs.iter().collect();
    let mut hosts: Vec<&str> = runs.iter().filter_map(|r| r.info.host.as_deref()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    if same_machine(&refs) {
        let host = hosts
            .first()
            .map_or("one machine".to_string(), |h| format!("host {h}"));
        (
            "monotonic",
            format!("CLOCK_MONOTONIC of {host}: every process on one clock"),
            runs.iter().map(|r| Some(r.run.t0)).collect(),
        )
    } else if runs.iter().all(|r| r.info.wall_offset_us.is_some()) {
        (
            "wall",
            format!(
                "the wall clock: {} machines ({}) lined up by each file's wall-clock offset",
                hosts.len(),
                hosts.join(", ")
            ),
            runs.iter()
                .map(|r| Some(r.run.t0 + r.info.wall_offset_us.unwrap_or(0.0)))
                .collect(),
        )
    } else {
        (
            "separate",
            format!(
                "not lined up: {} machines ({}) and not every file says its wall clock, so each \
                 process starts at its own first event",
                hosts.len(),
                hosts.join(", ")
            ),
            runs.iter().map(|_| None).collect(),
        )
    }
}

/// What the page says of a process of the job (its times already on the job's axis).
fn proc_of(r: &JobRun) -> ProcData {
    let labels = &r.info.labels;
    ProcData {
        rank: labels.rank.clone(),
        local_rank: labels.local_rank.clone(),
        host: r.info.host.clone(),
        group: labels.group.clone(),
        pid: r.run.pid,
        devices: r.run.devices.iter().map(|d| d.device).collect(),
        peak: r.run.summary.peak,
        peak_device: r.run.summary.peak_device,
        peak_t: r.run.summary.peak_t,
        cut_short: r.cut_short,
    }
}

/// Each group's joint `used` on each device that two or more of its processes used: the members'
/// changes merged in time order, summed.
fn group_lines(runs: &[RunData], procs: &[ProcData]) -> Vec<GroupLine> {
    let mut members: BTreeMap<(&str, u32), Vec<usize>> = BTreeMap::new();
    for (i, (run, p)) in runs.iter().zip(procs).enumerate() {
        let Some(group) = p.group.as_deref() else {
            continue;
        };
        for d in &run.devices {
            members.entry((group, d.device)).or_default().push(i);
        }
    }
    let mut lines = Vec::new();
    for ((name, device), members) in members {
        if members.len() < 2 {
            continue;
        }
        // Every member's changes of `used` on the device, as (time, change), in time order (a
        // stable sort keeps each member's own order at one time).
        let mut changes: Vec<(i64, i64)> = Vec::new();
        for &i in &members {
            let Some(d) = runs[i].devices.iter().find(|d| d.device == device) else {
                continue;
            };
            let mut t = 0;
            for (&dt, &dv) in d.t.iter().zip(&d.v) {
                t += dt;
                changes.push((t, dv));
            }
        }
        changes.sort_by_key(|c| c.0);
        let (mut times, mut values): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
        let mut used = 0i64;
        for (t, dv) in changes {
            used += dv;
            // Changes at one time are one step: the joint value after all of them.
            if times.last() == Some(&t) {
                *values.last_mut().unwrap() = used;
            } else {
                times.push(t);
                values.push(used);
            }
        }
        // The first time the joint value was highest.
        let (peak_t, peak) =
            times.iter().zip(&values).fold(
                (0, 0),
                |best, (&t, &v)| if v > best.1 { (t, v) } else { best },
            );
        lines.push(GroupLine {
            name: name.to_string(),
            device,
            members,
            t: deltas(times.into_iter()),
            v: deltas(values.into_iter()),
            peak: peak.max(0) as u64,
            peak_t,
        });
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::super::data::from_timeline;
    use super::*;
    use gpumemhook_timeline::Timeline;

    /// A process `pid` of rank `rank` (and `group`) on `host`: `used` on `device` at each
    /// `(µs, bytes)`, CLOCK_MONOTONIC.
    fn proc(
        pid: u32,
        rank: Option<&str>,
        group: Option<&str>,
        host: Option<&str>,
        device: u32,
        used: &[(f64, u64)],
    ) -> JobRun {
        let mut t = Timeline {
            pid,
            command: "python train.py".into(),
            ..Timeline::default()
        };
        t.used.insert(device, used.to_vec());
        t.info.labels.rank = rank.map(str::to_string);
        t.info.labels.group = group.map(str::to_string);
        t.info.host = host.map(str::to_string);
        JobRun {
            run: from_timeline(format!("t.{pid}.json"), &t),
            info: t.info.clone(),
            cut_short: false,
        }
    }

    fn undelta(d: &[i64]) -> Vec<i64> {
        d.iter()
            .scan(0, |v, x| {
                *v += x;
                Some(*v)
            })
            .collect()
    }

    #[test]
    fn lanes_by_rank_on_one_clock_with_each_ranks_peak_and_the_highest() {
        let runs = vec![
            proc(
                30,
                Some("10"),
                None,
                None,
                2,
                &[(1_000.0, 50), (1_500.0, 80)],
            ),
            proc(
                20,
                Some("2"),
                None,
                None,
                1,
                &[(1_200.0, 300), (1_300.0, 100)],
            ),
            proc(10, None, None, None, 0, &[(900.0, 10)]),
            proc(
                40,
                Some("0"),
                None,
                None,
                0,
                &[(1_100.0, 200), (1_400.0, 0)],
            ),
        ];
        let (runs, job) = arrange(runs);
        assert_eq!(job.clock, "monotonic");
        assert!(
            job.clock_note.contains("CLOCK_MONOTONIC"),
            "{}",
            job.clock_note
        );
        let order: Vec<(Option<&str>, u32)> = job
            .procs
            .iter()
            .map(|p| (p.rank.as_deref(), p.pid))
            .collect();
        assert_eq!(
            order,
            [
                (Some("0"), 40),
                (Some("2"), 20),
                (Some("10"), 30),
                (None, 10)
            ],
            "by rank as a number, then the processes without one"
        );
        assert_eq!(
            runs.iter().map(|r| r.pid).collect::<Vec<_>>(),
            [40, 20, 30, 10]
        );
        // One axis: µs from the job's first event (pid 10's, at 900).
        let peaks: Vec<(u64, u32, Option<i64>)> = job
            .procs
            .iter()
            .map(|p| (p.peak, p.peak_device, p.peak_t))
            .collect();
        assert_eq!(
            peaks,
            [
                (200, 0, Some(200)),
                (300, 1, Some(300)),
                (80, 2, Some(600)),
                (10, 0, Some(0))
            ]
        );
        assert_eq!(job.top, Some(1), "rank 2 held the highest peak");
        assert_eq!(job.end, 600);
        // Each run's own data moved onto the axis: its series start where it began.
        assert_eq!(undelta(&runs[0].devices[0].t), [200, 500]);
        assert_eq!(runs[0].t0, 900.0);
        assert_eq!(runs[0].devices[0].peak_t, 200);
        assert_eq!(runs[2].end, 600);
        assert_eq!(job.procs[2].devices, [2]);
        assert!(job.groups.is_empty());
    }

    #[test]
    fn a_group_has_its_joint_line_on_each_device_two_members_share() {
        let runs = vec![
            proc(
                1,
                Some("0"),
                Some("pair"),
                None,
                0,
                &[(0.0, 100), (20.0, 0)],
            ),
            proc(
                2,
                Some("1"),
                Some("pair"),
                None,
                0,
                &[(10.0, 50), (20.0, 70), (30.0, 0)],
            ),
            proc(3, Some("2"), None, None, 0, &[(5.0, 1000)]),
            proc(4, Some("3"), Some("pair"), None, 1, &[(5.0, 1)]),
        ];
        let (_, job) = arrange(runs);
        assert_eq!(
            job.groups.len(),
            1,
            "device 1 has one member: no joint line"
        );
        let g = &job.groups[0];
        assert_eq!((g.name.as_str(), g.device), ("pair", 0));
        assert_eq!(g.members, [0, 1]);
        assert_eq!(undelta(&g.t), [0, 10, 20, 30]);
        // At 20 rank 0 frees its 100 as rank 1 grows to 70: one step, to 70, not 150 between.
        assert_eq!(undelta(&g.v), [100, 150, 70, 0]);
        assert_eq!((g.peak, g.peak_t), (150, 10));
        assert_eq!(job.top, Some(2), "rank 2's 1000 bytes");
    }

    #[test]
    fn machines_line_up_by_the_wall_clock_or_say_they_are_not() {
        let mut a = proc(
            1,
            Some("0"),
            None,
            Some("n1"),
            0,
            &[(1_000.0, 10), (1_100.0, 0)],
        );
        let mut b = proc(1, Some("1"), None, Some("n2"), 0, &[(50.0, 20), (80.0, 0)]);
        a.info.wall_offset_us = Some(1e9);
        b.info.wall_offset_us = Some(1e9 + 1_000.0);
        assert!(
            one_job(&a, &b),
            "the same pid on two machines, overlapping on the wall clock"
        );
        let (runs, job) = arrange(vec![a, b]);
        assert_eq!(job.clock, "wall");
        assert_eq!(job.start_unix_us, Some(1e9 + 1_000.0));
        assert_eq!(
            job.procs[1].peak_t,
            Some(50),
            "n2's 50 µs is 1050 µs of n1's clock"
        );
        assert_eq!(runs[0].devices[0].peak_t, 0);
        let mut c = proc(5, Some("0"), None, Some("n1"), 0, &[(1_000.0, 10)]);
        let d = proc(6, Some("1"), None, Some("n2"), 0, &[(3.0, 20)]);
        c.info.wall_offset_us = Some(1.0);
        let (_, job) = arrange(vec![c, d]);
        assert_eq!(job.clock, "separate");
        assert!(
            job.clock_note.contains("own first event"),
            "{}",
            job.clock_note
        );
        assert_eq!(job.procs[0].peak_t, Some(0));
        assert_eq!(job.procs[1].peak_t, Some(0));
    }

    #[test]
    fn two_timelines_are_one_job_when_they_overlap_or_share_a_job_label() {
        let run = |pid, rank, host, from: f64| {
            proc(pid, rank, None, host, 0, &[(from, 1), (from + 100.0, 0)])
        };
        assert!(
            !one_job(&run(7, None, None, 0.0), &run(7, None, None, 0.0)),
            "one file twice"
        );
        assert!(
            one_job(&run(7, None, None, 0.0), &run(8, None, None, 50.0)),
            "overlapping"
        );
        assert!(
            !one_job(&run(7, None, None, 0.0), &run(8, None, None, 500.0)),
            "one after the other"
        );
        assert!(
            one_job(&run(7, None, Some("h"), 0.0), &run(8, None, None, 50.0)),
            "a file without a host is of the one machine"
        );
        assert!(
            !one_job(
                &run(7, None, Some("h"), 0.0),
                &run(8, None, Some("g"), 50.0)
            ),
            "two machines without a wall clock: no clock in common"
        );
        let (mut a, mut b) = (run(7, Some("0"), None, 0.0), run(8, Some("1"), None, 500.0));
        assert!(!one_job(&a, &b));
        a.info.labels.torchelastic_run_id = Some("abc".into());
        b.info.labels.torchelastic_run_id = Some("abc".into());
        assert!(one_job(&a, &b), "two ranks of one torchrun launch");
        b.info.labels.rank = Some("0".into());
        assert!(!one_job(&a, &b), "rank 0 of two runs: compared");
    }

    #[test]
    fn the_page_of_a_job_carries_the_job() {
        let data = job_page(vec![
            proc(1, Some("0"), None, None, 0, &[(0.0, 5)]),
            proc(2, Some("1"), None, None, 0, &[(1.0, 6)]),
        ]);
        let json = serde_json::to_value(&data).unwrap();
        assert_eq!(json["job"]["procs"][1]["rank"], "1");
        assert_eq!(json["job"]["top"], 1);
        assert_eq!(json["runs"].as_array().unwrap().len(), 2);
        let one = serde_json::to_value(PageData::new(Vec::new())).unwrap();
        assert!(one.get("job").is_none(), "a page of one run has no job");
    }
}

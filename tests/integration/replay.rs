//! The timeline replays to the counters exactly: every figure a reader computes from the recorded
//! changes of `used` (the peak, the peak since a restart, `used` at the end) equals what the exit
//! report and the live segment state, whatever the threads, failed requests, restarts and slow
//! drivers did in between.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use gpumemhook_reader::Snapshot;
use gpumemhook_tests::{cli_ok, timeline, wait_for, Run};
use gpumemhook_timeline::Timeline;

/// `used` at `ts`: the last change at or before it (0 before the first).
fn used_at(series: &[(f64, u64)], ts: f64) -> u64 {
    series
        .iter()
        .take_while(|p| p.0 <= ts)
        .last()
        .map_or(0, |p| p.1)
}

/// `(peak since the last restart, used at the end)` of `device`, replayed from the timeline's
/// curve as the segment counts them: after a restart the peak starts from `used` at that moment.
fn replayed(t: &Timeline, device: u32) -> (u64, u64) {
    let series = t.used.get(&device).map_or(&[][..], Vec::as_slice);
    let restart = t
        .peak_resets
        .get(&device)
        .and_then(|r| r.iter().copied().reduce(f64::max));
    let peak = match restart {
        Some(at) => series
            .iter()
            .filter(|p| p.0 > at)
            .map(|p| p.1)
            .fold(used_at(series, at), u64::max),
        None => series.iter().map(|p| p.1).max().unwrap_or(0),
    };
    (peak, series.last().map_or(0, |p| p.1))
}

/// Asserts that every device of `report` replays from `t` to its peak and its `used`.
fn assert_replays_to(t: &Timeline, report: &Snapshot, what: &str) {
    for device in &report.devices {
        assert_eq!(
            replayed(t, device.device),
            (device.peak, device.used),
            "{what}: device {} (peak, used) replayed vs counted",
            device.device
        );
    }
}

/// Asserts that `gpumemhook report --json TRACE` states every device's figures as `report` does
/// (peak, used, allocations, frees, refusals, failures).
fn assert_report_json_states(dir: &Path, trace: &Path, report: &Snapshot, what: &str) {
    let out = cli_ok(dir, &["report", "--json", &trace.display().to_string()]);
    let replayed: Vec<Snapshot> = serde_json::from_slice(&out.stdout).unwrap();
    let figures = |s: &Snapshot| -> Vec<_> {
        s.devices
            .iter()
            .map(|d| {
                (
                    d.device, d.peak, d.used, d.allocs, d.frees, d.denied, d.failed,
                )
            })
            .collect()
    };
    assert_eq!(
        figures(&replayed[0]),
        figures(report),
        "{what}: report --json"
    );
}

/// A request the driver refuses, asked again and again while another thread frees what the
/// process holds: the refused bytes were never held, so no figure of the timeline holds them.
#[test]
fn a_failed_request_racing_frees_raises_no_figure() {
    for seed in 1..=5 {
        let run = Run::sim(
            "simrun",
            &[
                "drv.init",
                "drv.ctx:0",
                "hold:64:1048576",
                &format!("release.held.failing:{seed}:34359738368"),
            ],
        );
        let trace = run.dir().join("t.trace");
        let ran = run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
        assert!(ran.stdout().contains("failing asked="), "{}", ran.stdout());
        let report = ran.report();
        assert_eq!(report.devices[0].peak, 64 << 20);
        assert_eq!(report.devices[0].used, 0);
        let t = timeline(&trace);
        assert!(
            t.count(
                gpumemhook_segment::MemKind::Device,
                gpumemhook_reader::EventKind::Failed
            ) > 0
        );
        assert_replays_to(&t, &report, &format!("seed {seed}"));
        assert_report_json_states(ran.dir.as_path(), &trace, &report, &format!("seed {seed}"));
    }
}

/// Eight threads churn on two devices (with a stand-in driver that takes 50 µs a call in some
/// runs, and `reset-peak` from another process while they run in others): the timeline replays
/// to the exit report every time.
#[test]
fn threads_churning_on_two_devices_replay_to_the_exit_report_every_time() {
    for round in 0..20u32 {
        let slow = round % 4 == 1;
        let restart = round % 2 == 0;
        let iterations = if slow { "600" } else { "6000" };
        let first = format!("churn:8:{iterations}:{}:65536:2", round * 16 + 1);
        let second = format!("churn:8:{iterations}:{}:65536:2", round * 16 + 9);
        let run = Run::sim("simrun", &["drv.init", "drv.ctx:0", &first]);
        let started = run.dir().join("started");
        let restarted = run.dir().join("restarted");
        // The third part waits for the restart: the process is still running when it comes.
        let mut run = run
            .arg(format!("touch:{}", started.display()))
            .arg(&second)
            .arg(format!("wait:{}", restarted.display()))
            .arg(&first);
        if slow {
            run = run.env("FAKECUDA_DELAY_US", "50");
        }
        let dir = run.dir().to_path_buf();
        let trace = dir.join("t.trace");
        let (mut command, _) = run.env("GPUMEMHOOK_TRACE", &trace).into_command();
        let mut child = command.stdout(Stdio::null()).spawn().unwrap();
        if restart {
            wait_for(&started);
            reset_peak(&dir, child.id());
        }
        std::fs::write(&restarted, "").unwrap();
        assert!(child.wait().unwrap().success(), "round {round}");
        let report = only_report(&dir);
        let t = timeline(&trace);
        if restart {
            assert!(
                !t.peak_resets.is_empty(),
                "round {round}: the restart is on the timeline"
            );
        }
        let what = format!("round {round} (slow {slow}, restart {restart})");
        assert_replays_to(&t, &report, &what);
        assert_report_json_states(&dir, &trace, &report, &what);
    }
}

/// `gpumemhook reset-peak PID` from another process, while it runs.
pub(crate) fn reset_peak(dir: &Path, pid: u32) {
    cli_ok(dir, &["reset-peak", &pid.to_string()]);
}

/// The one exit report a run directory holds.
pub(crate) fn only_report(dir: &Path) -> Snapshot {
    let reports: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            (name.starts_with("report.") && name.ends_with(".json")).then_some(name)
        })
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let text = std::fs::read_to_string(dir.join(&reports[0])).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A process killed by SIGKILL after a quiet moment: its timeline reads to the figures the live
/// segment showed just before, every time (the threads' last records all written by then).
#[test]
fn a_process_killed_after_a_quiet_moment_replays_to_its_live_figures() {
    // Built before the first program starts: a build under load could outlast its sleep.
    gpumemhook_tests::cli_bin();
    for round in 0..25u32 {
        let churn = format!("churn:8:3000:{}:65536:2", round * 8 + 3);
        let (_, trace, live) = killed_after_a_quiet_moment(&churn, &[]);
        let t = timeline(&trace);
        assert!(t.cut_short);
        assert_replays_to(&t, &live, &format!("kill {round}"));
    }
}

/// Runs simrun's `churn` op, then kills it with SIGKILL once it sleeps: the run's directory, its
/// timeline (`GPUMEMHOOK_TRACE`, with `env` set too), and the figures `ls --json` showed just
/// before the kill.
pub(crate) fn killed_after_a_quiet_moment(
    churn: &str,
    env: &[(&str, &str)],
) -> (PathBuf, PathBuf, Snapshot) {
    let run = Run::sim("simrun", &["drv.init", "drv.ctx:0", churn]);
    let dir = run.dir().to_path_buf();
    let mut run = run
        .arg(format!("touch:{}", dir.join("ready").display()))
        .arg("sleep:60000");
    let trace = dir.join("t.trace");
    for (name, value) in env {
        run = run.env(name, value);
    }
    let (mut command, _) = run.env("GPUMEMHOOK_TRACE", &trace).into_command();
    let mut child = command.stdout(Stdio::null()).spawn().unwrap();
    wait_for(&dir.join("ready"));
    let live = live(&dir, child.id());
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    child.wait().unwrap();
    (dir, trace, live)
}

/// The live process `pid` as `gpumemhook ls --json` shows it.
pub(crate) fn live(dir: &Path, pid: u32) -> Snapshot {
    let out = cli_ok(dir, &["ls", "--json"]);
    let all: Vec<Snapshot> = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<u32> = all.iter().map(|s| s.pid).collect();
    all.into_iter().find(|s| s.pid == pid).unwrap_or_else(|| {
        panic!(
            "process {pid} is not listed ({listed:?}; {}; files {:?})",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_dir(dir.join("shm")).map(|d| d
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .collect::<Vec<_>>())
        )
    })
}

/// Nothing is silent: `run --trace` of a program that never uses the GPU says that no timeline
/// was written, `report` of a timeline names its rank as the exit report does (and says "1 event",
/// not "1 events over 0 µs"), and `report --by-site` of a timeline says where its sites are
/// instead of printing an empty table.
#[test]
fn an_empty_timeline_and_a_timeline_without_a_site_table_are_said() {
    let dir = gpumemhook_tests::scratch("silent");
    let trace = dir.join("t.trace");
    let out = cli_ok(
        &dir,
        &["run", "--trace", &trace.display().to_string(), "--", "true"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("timeline: none written to {}", trace.display())),
        "{err}"
    );
    assert!(!trace.exists());
    let run = Run::sim("simrun", &["rt.malloc:a:4096"]).env("RANK", "3");
    let trace = run.dir().join("t.trace");
    let ran = run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
    // One event, and the rank the exit report names.
    let out = cli_ok(&ran.dir, &["report", &trace.display().to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(timeline, 1 event, rank 3)"), "{text}");
    let out = cli_ok(
        &ran.dir,
        &["report", "--by-site", &trace.display().to_string()],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("by site: a timeline's report has no site table"),
        "{text}"
    );
}

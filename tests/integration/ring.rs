//! A bounded timeline (`GPUMEMHOOK_TRACE_MAX`): the file never outgrows the size asked for, keeps
//! every event of its last part, and still states the whole run's figures as the exit report
//! does (peaks, `used`, counts, modules, pinned memory), from the summary of what it overwrote.

use std::path::Path;
use std::process::Stdio;

use gpumemhook_reader::Snapshot;
use gpumemhook_tests::{cli_ok, timeline, wait_for, Run};

use crate::replay::{killed_after_a_quiet_moment, only_report, reset_peak};

/// `report --json` of the timeline at `trace`: its one process's figures.
pub(crate) fn replayed(dir: &Path, trace: &Path) -> Snapshot {
    let out = cli_ok(dir, &["report", "--json", &trace.display().to_string()]);
    let mut all: Vec<Snapshot> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.len(), 1);
    all.remove(0)
}

/// Asserts that `replayed` states every device figure of `counted` and its pinned memory. A
/// module's bytes and live allocations are exact; its peak is not a figure threads agree on (the
/// segment charges a module apart from the device's count, so its peak is never taken at one
/// moment with the others): it lies between the segment's and the device's whole-run peak.
fn assert_states(mut replayed: Snapshot, mut counted: Snapshot, restarted: bool, what: &str) {
    for (r, c) in replayed.devices.iter_mut().zip(counted.devices.iter_mut()) {
        assert_eq!(r.by_module.len(), c.by_module.len(), "{what}");
        for (rm, cm) in r.by_module.iter_mut().zip(c.by_module.iter_mut()) {
            assert_eq!(
                (&rm.module, rm.used, rm.live_allocs),
                (&cm.module, cm.used, cm.live_allocs),
                "{what}"
            );
            // Without a restart the device's peak is the whole run's.
            assert!(
                cm.peak <= rm.peak && (restarted || rm.peak <= c.peak),
                "{what}: {rm:?} {cm:?}"
            );
            (rm.peak, rm.path) = (cm.peak, cm.path.clone());
        }
    }
    assert_eq!(replayed.devices, counted.devices, "{what}");
    assert_eq!(replayed.host, counted.host, "{what}");
}

/// Eight threads churn on two devices for seconds, writing far more than the ring holds, with a
/// peak restart from another process in half the rounds: the file stays within the size asked,
/// its report states the exit report's figures, and `report` says where its full detail starts.
#[test]
fn a_long_churn_in_a_small_ring_states_the_exit_reports_figures() {
    gpumemhook_tests::cli_bin();
    for round in 0..2u32 {
        let restart = round % 2 == 1;
        let first = format!("churn:8:40000:{}:1048576:2", round * 16 + 1);
        let second = format!("churn:8:40000:{}:1048576:2", round * 16 + 9);
        let run = Run::sim(
            "simrun",
            &["drv.init", "drv.ctx:0", "rt.malloc_host:h:4096", &first],
        );
        let (started, restarted) = (run.dir().join("started"), run.dir().join("restarted"));
        let run = run
            .arg(format!("touch:{}", started.display()))
            .arg(&second)
            .arg(format!("wait:{}", restarted.display()))
            .arg(&first);
        let dir = run.dir().to_path_buf();
        let trace = dir.join("t.trace");
        let (mut command, _) = run
            .env("GPUMEMHOOK_TRACE", &trace)
            .env("GPUMEMHOOK_TRACE_MAX", "2MiB")
            .into_command();
        let mut child = command.stdout(Stdio::null()).spawn().unwrap();
        if restart {
            wait_for(&started);
            reset_peak(&dir, child.id());
        }
        std::fs::write(&restarted, "").unwrap();
        assert!(child.wait().unwrap().success(), "round {round}");
        let what = format!("round {round} (restart {restart})");
        let size = std::fs::metadata(&trace).unwrap().len();
        assert!(size <= 2 << 20, "{what}: {size} bytes");
        let counted = only_report(&dir);
        assert!(counted.devices[0].allocs > 200_000, "{what}: {counted:?}");
        let t = timeline(&trace);
        let ring = t.ring.as_ref().expect("a ring timeline");
        assert!(ring.figures.evicted_events > 100_000, "{what}: {ring:?}");
        assert_eq!(ring.figures.names_dropped, 0, "{what}");
        // Every kept event is named: the names the ring overwrote were kept.
        assert!(
            t.allocations.iter().all(|a| !a.module.is_empty()),
            "{what}: an unnamed module"
        );
        assert_states(replayed(&dir, &trace), counted, restart, &what);
        let out = cli_ok(&dir, &["report", &trace.display().to_string()]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("full detail from"), "{what}: {text}");
        // The page says it too, and the plot draws the overwritten part from the summary.
        let trace = trace.display().to_string();
        cli_ok(&dir, &["view", &trace, "-o", "v.html"]);
        let page = std::fs::read_to_string(dir.join("v.html")).unwrap();
        assert!(
            page.contains("\"detail_from\":["),
            "{what}: the page's data"
        );
        cli_ok(&dir, &["plot", &trace, "-o", "p.svg"]);
        assert!(std::fs::metadata(dir.join("p.svg")).unwrap().len() > 1000);
    }
}

/// A process killed by SIGKILL after a quiet moment, its ring wrapped many times: the timeline
/// states the figures the live segment showed just before.
#[test]
fn a_killed_process_ring_states_its_live_figures() {
    gpumemhook_tests::cli_bin();
    for round in 0..4u32 {
        let churn = format!("churn:8:30000:{}:65536:2", round * 8 + 3);
        let (dir, trace, live) =
            killed_after_a_quiet_moment(&churn, &[("GPUMEMHOOK_TRACE_MAX", "2MiB")]);
        let replayed = replayed(&dir, &trace);
        let figures = |s: &Snapshot| -> Vec<_> {
            s.devices
                .iter()
                .map(|d| (d.device, d.peak, d.used, d.allocs, d.frees))
                .collect()
        };
        assert_eq!(figures(&replayed), figures(&live), "kill {round}");
    }
}

/// A ring smaller than its parts need is refused at start, in one line, before the program runs.
#[test]
fn a_ring_too_small_is_refused_in_one_line() {
    let run = Run::sim("simrun", &["drv.init", "rt.malloc:a:4096"]);
    let trace = run.dir().join("t.trace");
    let ran = run
        .env("GPUMEMHOOK_TRACE", &trace)
        .env("GPUMEMHOOK_TRACE_MAX", "1MiB")
        .run();
    assert_eq!(ran.output.status.code(), Some(2), "{}", ran.stderr());
    let err = ran.stderr();
    assert!(
        err.contains("GPUMEMHOOK_TRACE_MAX=1MiB") && err.contains("at least 2.00 MiB"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!trace.exists());
}

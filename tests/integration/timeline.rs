//! The timeline (`GPUMEMHOOK_TRACE`): a valid Chrome trace whose counters replay to the exit report.

use gpumemhook_reader::trace::read_chrome_trace;
use gpumemhook_tests::Run;

#[test]
fn trace_counters_replay_to_the_exit_report() {
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:1048576",
            "rt.malloc:b:4096",
            "rt.free:a",
            "drv.ctx:1",
            "drv.alloc:c:777",
            "drv.create:h:2097152:0",
            "drv.release:h",
            "rt.malloc_host:p:100",
            "threads:2:2000:7:65536",
        ],
    );
    let trace_path = run.dir().join("trace.%p.json");
    let ran = run.env("GPUMEMHOOK_TRACE", &trace_path).run().ok();
    let report = ran.report();
    let file = ran.dir.join(format!("trace.{}.json", report.pid));
    let timeline = read_chrome_trace(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(timeline.pid, report.pid);
    assert_eq!(timeline.dropped, 0);
    for device in &report.devices {
        let series = &timeline.used[&device.device];
        assert_eq!(
            series.last().unwrap().1,
            device.used,
            "device {}",
            device.device
        );
        assert_eq!(
            series.iter().map(|p| p.1).max().unwrap(),
            device.peak,
            "device {}",
            device.device
        );
        assert!(
            series.windows(2).all(|w| w[0].0 <= w[1].0),
            "time runs forward"
        );
    }
    let allocs: u64 = report.devices.iter().map(|d| d.allocs).sum::<u64>() + report.host.allocs;
    let frees: u64 = report.devices.iter().map(|d| d.frees).sum::<u64>() + report.host.frees;
    assert_eq!(timeline.counts["alloc"], allocs);
    assert_eq!(timeline.counts["free"], frees);
}

#[test]
fn a_small_buffer_drops_events_and_says_so() {
    let run = Run::sim(
        "simrun",
        &[
            "rt.malloc:a:1",
            "rt.malloc:b:2",
            "rt.malloc:c:3",
            "rt.free:a",
        ],
    );
    let trace_path = run.dir().join("trace.json");
    let ran = run
        .env("GPUMEMHOOK_TRACE", &trace_path)
        .env("GPUMEMHOOK_TRACE_EVENTS", "2")
        .run()
        .ok();
    let timeline = read_chrome_trace(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    assert_eq!((timeline.events, timeline.dropped), (2, 2));
    assert!(
        ran.stderr().contains("misses the last 2 events"),
        "{}",
        ran.stderr()
    );
}

//! The timeline (`GPUMEMHOOK_TRACE`): a valid Chrome trace whose counters replay to the exit report.

use gpumemhook_reader::{EventKind, MemKind};
use gpumemhook_tests::{cli, measured, measured_rss, scratch, timeline, Run};
use gpumemhook_timeline::{read_chrome_trace, write_chrome_trace, Event, MarkKind};
use std::collections::BTreeMap;

#[test]
fn trace_counters_replay_to_the_exit_report() {
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:1048576",
            "rt.malloc:b:4096",
            // Threads, then single-threaded events: the reader puts the threads' changes back in
            // the counter's order (docs/timeline.md, "Exact replay"; tests/integration/replay.rs
            // ends a run on racing threads).
            "threads:2:2000:7:65536",
            "rt.free:a",
            "drv.ctx:1",
            "drv.alloc:c:777",
            "drv.create:h:2097152:0",
            "drv.release:h",
            "rt.malloc_host:p:100",
        ],
    );
    let trace_path = run.dir().join("trace.%p.json");
    let ran = run.env("GPUMEMHOOK_TRACE", &trace_path).run().ok();
    let report = ran.report();
    let file = ran.dir.join(format!("trace.{}.json", report.pid));
    let timeline = timeline(&file);
    assert_eq!(timeline.pid, report.pid);
    assert!(!timeline.cut_short);
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

/// `cuMemAllocPitch_v2` reserves width × height before the call and learns the pitch after it: a
/// failure of the driver and a refusal by the ceiling (before the call, or after it for the
/// padding, the allocation then given back) are each one mark of the timeline, and nothing stays
/// counted.
#[test]
fn pitched_allocations_the_driver_fails_or_the_ceiling_refuses_are_marked() {
    // A 1 MB device under a 950 kB ceiling.
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            // 840 000 bytes asked (within the ceiling); the pitch makes 1 075 200: the driver fails.
            "drv.alloc_pitch:a:1200:700:4=2",
            // 2 000 000 bytes asked: refused before the driver.
            "drv.alloc_pitch:b:2000:1000:4=2",
            "print.used:0",
        ],
    );
    let trace_path = run.dir().join("trace.json");
    let ran = run
        .env("GPUMEMHOOK_TRACE", &trace_path)
        .env("GPUMEMHOOK_LIMIT", "950000B")
        .env("FAKECUDA_MEM_BYTES", "1000000")
        .run()
        .ok();
    let timeline = timeline(&trace_path);
    let marks: Vec<_> = timeline
        .marks
        .iter()
        .map(|m| (m.kind, m.device, m.bytes, m.used))
        .collect();
    assert_eq!(
        marks,
        [
            (MarkKind::Failed, 0, 840_000, 0),
            (MarkKind::Denied, 0, 2_000_000, 0)
        ]
    );
    assert_eq!(ran.report().device(0).used, 0);
    assert_eq!(ran.line_fields("used dev=0")["bytes"], "0");

    // Within the ceiling as asked (513 000 bytes), past it with the pitch (1 024 000): given back to
    // the driver and refused.
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "drv.alloc_pitch:c:513:1000:4=2",
            "drv.alloc_pitch:d:100:3:4",
            "print.used:0",
        ],
    );
    let trace_path = run.dir().join("trace.json");
    let ran = run
        .env("GPUMEMHOOK_TRACE", &trace_path)
        .env("GPUMEMHOOK_LIMIT", "950000B")
        .run()
        .ok();
    let timeline = gpumemhook_tests::timeline(&trace_path);
    let marks: Vec<_> = timeline
        .marks
        .iter()
        .map(|m| (m.kind, m.bytes, m.used))
        .collect();
    assert_eq!(marks, [(MarkKind::Denied, 1_024_000, 0)]);
    assert_eq!(ran.report().device(0).used, 512 * 3);
    assert_eq!(
        ran.line_fields("used dev=0")["bytes"],
        (512 * 3).to_string()
    );
}

/// `export` of a recorded timeline: `--chrome` reads back to the same timeline, and each file
/// written is said on its line with its size.
#[test]
fn export_writes_each_format_and_says_so() {
    let run = Run::sim("simrun", &["rt.malloc:a:1048576", "rt.free:a"]);
    let trace = run.dir().join("t.json");
    let ran = run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
    let (chrome, perfetto) = (ran.dir.join("c.json"), ran.dir.join("p.pftrace"));
    let o = cli(
        &ran.dir,
        &[
            "export",
            "t.json",
            "--chrome",
            "c.json",
            "--perfetto",
            "p.pftrace",
        ],
    )
    .output()
    .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let converted = read_chrome_trace(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    assert_eq!(converted, timeline(&trace));
    let lines: Vec<&str> = out.lines().collect();
    let size = std::fs::metadata(&perfetto).unwrap().len();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(
        lines[0],
        format!("p.pftrace: Perfetto protobuf trace, {size} B")
    );
    assert!(lines[1].starts_with("c.json: Chrome JSON trace, "), "{out}");
}

/// `export --chrome` draws a device's ceiling counter only where the device had a ceiling: one at
/// 0 reads in viewers as a ceiling of 0 bytes. A ceiling that comes mid-run still starts from
/// "none" at the device's first event, so the file reads back to the same ceilings.
#[test]
fn export_chrome_draws_a_ceiling_only_on_a_device_that_had_one() {
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:1048576",
            "drv.ctx:1",
            "rt.malloc:b:4096",
        ],
    );
    let trace = run.dir().join("t.trace");
    let ran = run
        .env("GPUMEMHOOK_TRACE", &trace)
        .env("GPUMEMHOOK_LIMIT_0", "6MiB")
        .run()
        .ok();
    let o = cli(&ran.dir, &["export", "t.trace", "--chrome", "c.json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json = std::fs::read_to_string(ran.dir.join("c.json")).unwrap();
    assert!(json.contains("\"device 0 limit\""), "{json}");
    assert!(json.contains("\"device 1 used\""), "{json}");
    assert!(!json.contains("\"device 1 limit\""), "{json}");
    let converted = read_chrome_trace(&json).unwrap();
    assert_eq!(converted, timeline(&trace));
    assert_eq!(converted.ceilings.keys().collect::<Vec<_>>(), [&0]);

    // A ceiling set after the device's first events: "none" from its first event, then the step.
    let event = |ts_ns: u64, device: u32, limit: Option<u64>| Event {
        ts_ns,
        kind: EventKind::Alloc,
        device,
        bytes: 1,
        used: ts_ns,
        address: ts_ns,
        name: "cudaMalloc",
        mem: MemKind::Device,
        tid: 1,
        scope: 0,
        limit,
        module: "",
        site: "",
    };
    let events = [
        event(1000, 0, None),
        event(2000, 1, None),
        event(3000, 0, None),
        event(4000, 0, Some(4096)),
    ];
    let mut out = Vec::new();
    let limits = BTreeMap::from([(0, 4096)]);
    write_chrome_trace(&mut out, 7, "x", &events, &limits, 0).unwrap();
    let json = String::from_utf8(out).unwrap();
    assert!(!json.contains("\"device 1 limit\""), "{json}");
    let t = read_chrome_trace(&json).unwrap();
    assert_eq!(t.ceilings.len(), 1, "{json}");
    assert_eq!(t.ceilings[&0], [(1.0, None), (4.0, Some(4096))], "{json}");
}

#[test]
fn export_without_an_output_is_a_usage_error_and_an_unreadable_input_is_named() {
    let dir = scratch("export");
    std::fs::write(dir.join("t.json"), "{\"traceEvents\": []}").unwrap();
    let o = cli(&dir, &["export", "t.json"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--perfetto") && err.contains("--pytorch"),
        "{err}"
    );
    for input in ["missing.json", "not-a-timeline.json"] {
        std::fs::write(dir.join("not-a-timeline.json"), "{\"pid\": 1}").unwrap();
        let o = cli(&dir, &["export", input, "--pytorch", "out.pickle"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(input), "{err}");
        assert!(!dir.join("out.pickle").exists(), "nothing written");
    }
}

#[test]
fn export_pytorch_keeps_each_devices_last_entries_and_says_what_it_left_out() {
    // About 30,000 allocations and as many frees on device 0: about 150,000 trace entries (two
    // an allocation, three a free), past the 100,000 PyTorch's viewer is given by default.
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:1:60000:7:4096"],
    );
    let dir = run.dir().to_path_buf();
    run.env("GPUMEMHOOK_TRACE", dir.join("t.trace")).run().ok();
    let lengths = |args: &[&str]| {
        let o = cli(&dir, args).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let count = std::process::Command::new(gpumemhook_tests::python())
            .args([
                "-c",
                "import pickle, sys; d = pickle.load(open(sys.argv[1], 'rb')); \
                 print(' '.join(str(len(t)) for t in d['device_traces']), len(d['segments']))",
                dir.join("t.pickle").to_str().unwrap(),
            ])
            .output()
            .unwrap();
        (
            out,
            String::from_utf8_lossy(&count.stdout).trim().to_string(),
        )
    };
    let (out, whole) = lengths(&[
        "export",
        "t.trace",
        "--pytorch",
        "t.pickle",
        "--entries",
        "1000000",
    ]);
    assert!(!out.contains("left out"), "{out}");
    let (entries, segments) = whole.split_once(' ').unwrap();
    let entries: u64 = entries.parse().unwrap();
    assert!(entries > 140_000, "{whole}");
    let (out, kept) = lengths(&["export", "t.trace", "--pytorch", "t.pickle"]);
    assert!(
        out.contains("each device's last 100,000 trace entries"),
        "{out}"
    );
    assert!(
        out.contains("older left out (--entries N keeps more)"),
        "{out}"
    );
    let (trace, kept_segments) = kept.split_once(' ').unwrap();
    let trace: u64 = trace.parse().unwrap();
    assert!((99_998..=100_000).contains(&trace), "{kept}");
    let left: u64 = out
        .split("entries, ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .map(|n| n.replace(',', "").parse().unwrap())
        .unwrap();
    assert_eq!(trace + left, entries, "{out}");
    // What is held at the end is whole whatever the trace keeps.
    assert_eq!(kept_segments, segments);
}

/// A recording of a million events (`t.trace`) and one of 6,000 (`small.trace`), made the same
/// way, in a run directory of their own: its path.
fn a_million_events_and_a_few() -> std::path::PathBuf {
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:1:1000000:7:4096"],
    );
    let dir = run.dir().to_path_buf();
    run.env("GPUMEMHOOK_TRACE", dir.join("t.trace")).run().ok();
    let small = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:2:3000:7:65536"],
    );
    small
        .env("GPUMEMHOOK_TRACE", dir.join("small.trace"))
        .run()
        .ok();
    dir
}

/// The peak resident memory (KiB) of `export TRACE ARGS...` in `dir`, which must succeed.
fn export_peak(dir: &std::path::Path, trace: &str, args: &[&str]) -> i64 {
    let rss = dir.join(format!("{trace}.{}.rss", args.join("_").replace('/', "_")));
    let mut command = vec!["export", trace];
    command.extend_from_slice(args);
    let status = measured(&cli(dir, &command), 300, &rss)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "export {args:?}");
    measured_rss(&rss)
}

#[test]
fn export_chrome_of_a_recording_is_written_as_it_is_read_in_bounded_memory() {
    // A million events: the whole timeline would take over 100 MB (every allocation kept).
    // Measured against the export of a recording of 6,000 events, made the same way.
    let dir = a_million_events_and_a_few();
    let peak = |trace: &str| export_peak(&dir, trace, &["--chrome", "c.json"]);
    let (small, big) = (peak("small.trace"), peak("t.trace"));
    assert!(
        big < small + 24 * 1024,
        "{big} KiB, 6,000 events {small} KiB"
    );
    // Every event is in it (one a line), read as it streams: the test stays small too.
    let chrome = std::fs::File::open(dir.join("c.json")).unwrap();
    let events = std::io::BufRead::lines(std::io::BufReader::new(chrome))
        .map(Result::unwrap)
        .filter(|l| l.contains("\"cat\":\"alloc\"") || l.contains("\"cat\":\"free\""))
        .count();
    assert_eq!(events, 1_000_000);
}

#[test]
fn export_perfetto_and_pytorch_of_a_recording_are_written_as_it_is_read_in_bounded_memory() {
    // A million events: the whole timeline would take over 100 MB (every allocation kept). The
    // Perfetto trace holds no state per event; the PyTorch snapshot holds each device's last
    // 100,000 entries (both recordings fill most of them), and what is allocated at the end.
    let dir = a_million_events_and_a_few();
    for args in [
        &["--perfetto", "t.pftrace"][..],
        &["--pytorch", "t.pickle"],
        &["--pytorch", "t.pickle", "--from", "0.001", "--to", "1000"],
    ] {
        let (small, big) = (
            export_peak(&dir, "small.trace", args),
            export_peak(&dir, "t.trace", args),
        );
        assert!(
            big < small + 24 * 1024,
            "{args:?}: {big} KiB, 6,000 events {small} KiB"
        );
    }
    // The pickle opens, each device's last entries in it.
    let count = std::process::Command::new(gpumemhook_tests::python())
        .args([
            "-c",
            "import pickle, sys; d = pickle.load(open(sys.argv[1], 'rb')); \
             print(sum(len(t) for t in d['device_traces']))",
            dir.join("t.pickle").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let entries: u64 = String::from_utf8_lossy(&count.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!((99_998..=100_000).contains(&entries), "{entries}");
}

#[test]
fn export_pytorch_from_to_keeps_exactly_the_entries_of_the_events_in_the_window() {
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:2:3000:7:4096"],
    );
    let dir = run.dir().to_path_buf();
    run.env("GPUMEMHOOK_TRACE", dir.join("t.trace")).run().ok();
    gpumemhook_tests::cli_ok(&dir, &["export", "t.trace", "--chrome", "t.json"]);
    // The window: from the 30th to the 60th percentile of the allocations and frees, in seconds
    // since the run's first event, from the Chrome export's timestamps (exact to the
    // nanosecond), each end midway between two events.
    let chrome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("t.json")).unwrap()).unwrap();
    let events = chrome["traceEvents"].as_array().unwrap();
    let stamps: Vec<f64> = events.iter().filter_map(|e| e["ts"].as_f64()).collect();
    let first = stamps.iter().copied().fold(f64::MAX, f64::min);
    let changes: Vec<f64> = events
        .iter()
        .filter(|e| matches!(e["cat"].as_str(), Some("alloc" | "free")))
        .map(|e| e["ts"].as_f64().unwrap())
        .collect();
    let midway = |share: usize| {
        let k = (share * changes.len() / 100..changes.len())
            .find(|&k| changes[k] > changes[k - 1])
            .unwrap();
        (changes[k] + changes[k - 1]) / 2.0 - first
    };
    let (from_us, to_us) = (midway(30), midway(60));
    // What the window holds, an allocation's two entries, a free's three, in order.
    let mut expected = Vec::new();
    let mut outside = 0;
    for e in events {
        let actions: &[&str] = match e["cat"].as_str() {
            Some("alloc") => &["segment_alloc", "alloc"],
            Some("free") => &["free_requested", "free_completed", "segment_free"],
            _ => continue,
        };
        let since = e["ts"].as_f64().unwrap() - first;
        if since < from_us || since > to_us {
            outside += actions.len();
            continue;
        }
        let address = e["args"]["address"].as_str().unwrap();
        let address = u64::from_str_radix(&address[2..], 16).unwrap();
        for action in actions {
            expected.push(format!("{action} {address}"));
        }
    }
    assert!(
        expected.len() > 1000 && outside > 1000,
        "{} {outside}",
        expected.len()
    );
    let (from, to) = (
        format!("{:.9}", from_us / 1e6),
        format!("{:.9}", to_us / 1e6),
    );
    let out = gpumemhook_tests::cli_ok(
        &dir,
        &[
            "export",
            "t.trace",
            "--pytorch",
            "w.pickle",
            "--from",
            &from,
            "--to",
            &to,
        ],
    );
    let said = String::from_utf8_lossy(&out.stdout);
    let left: Option<usize> = said
        .split(" outside --from/--to left out")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|n| n.replace(',', "").parse().ok());
    assert_eq!(left, Some(outside), "{said}");
    let kept = std::process::Command::new(gpumemhook_tests::python())
        .args([
            "-c",
            "import pickle, sys; d = pickle.load(open(sys.argv[1], 'rb')); \
             [print(e['action'], e['addr']) for t in d['device_traces'] for e in t]; \
             print('segments', len(d['segments']))",
            dir.join("w.pickle").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let kept = String::from_utf8_lossy(&kept.stdout).into_owned();
    let mut lines: Vec<&str> = kept.lines().collect();
    let segments = lines.pop().unwrap();
    assert_eq!(lines, expected);
    // What is allocated at the end is whole, as without a window.
    gpumemhook_tests::cli_ok(&dir, &["export", "t.trace", "--pytorch", "all.pickle"]);
    let whole = std::process::Command::new(gpumemhook_tests::python())
        .args([
            "-c",
            "import pickle, sys; d = pickle.load(open(sys.argv[1], 'rb')); \
             print('segments', len(d['segments']))",
            dir.join("all.pickle").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&whole.stdout).trim(), segments);
    // A window that ends before it starts keeps nothing: a usage error, nothing written.
    let o = cli(
        &dir,
        &[
            "export",
            "t.trace",
            "--pytorch",
            "x.pickle",
            "--from",
            "2",
            "--to",
            "1",
        ],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--from 2 is after --to 1"), "{err}");
    assert!(!dir.join("x.pickle").exists());
}

#[test]
fn export_of_a_recording_it_cannot_read_says_so_before_writing_anything() {
    // The recording's magic, then a header of zeros: format version 0, which no reader reads.
    let dir = scratch("export-unreadable-recording");
    let mut forged = b"GMHTRACE".to_vec();
    forged.resize(64 << 10, 0);
    std::fs::write(dir.join("t.trace"), forged).unwrap();
    for (format, output) in [("--perfetto", "t.pftrace"), ("--pytorch", "t.pickle")] {
        let o = cli(&dir, &["export", "t.trace", format, output])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("cannot read the timeline"), "{format}: {err}");
        assert!(err.contains("format version 0"), "{format}: {err}");
        assert!(!dir.join(output).exists(), "nothing written");
    }
}

/// Ten million events (a 306 MiB recording, one thread) through every reader of a timeline:
/// each peaks under 64 MiB (the table: `view` took 1.87 GB, the exports 1.45 to 4.96 GB,
/// `plot` 322 MiB of 10^7 events), and `report --json` states the exit report's figures.
#[test]
fn every_reader_of_ten_million_events_stays_within_64_mib() {
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:1:10000000:7:4096"],
    );
    let dir = run.dir().to_path_buf();
    let ran = run
        .env("GPUMEMHOOK_TRACE", dir.join("t.trace"))
        .env("FAKECUDA_MEM_BYTES", (1u64 << 40).to_string())
        .run()
        .ok();
    let counted = ran.report();
    let readers: [&[&str]; 6] = [
        &["report", "--json", "t.trace"],
        &["plot", "t.trace", "-o", "p.png"],
        &["view", "t.trace", "-o", "v.html"],
        &["export", "t.trace", "--perfetto", "t.pftrace"],
        &["export", "t.trace", "--chrome", "t.json"],
        &["export", "t.trace", "--pytorch", "t.pickle"],
    ];
    for args in readers {
        let rss = dir.join("reader.rss");
        let out = measured(&cli(&dir, args), 600, &rss).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let kib = measured_rss(&rss);
        assert!(kib < 64 * 1024, "{args:?}: {kib} KiB of 10^7 events");
        if args[0] == "report" {
            let replayed: Vec<gpumemhook_reader::Snapshot> =
                serde_json::from_slice(&out.stdout).unwrap();
            let figures = |d: &gpumemhook_reader::DeviceStats| (d.peak, d.used, d.allocs, d.frees);
            assert_eq!(
                figures(&replayed[0].devices[0]),
                figures(&counted.device(0))
            );
            let d = counted.device(0);
            assert!(d.allocs + d.frees >= 10_000_000, "{d:?}");
        }
        for output in ["p.png", "v.html", "t.pftrace", "t.json", "t.pickle"] {
            let _ = std::fs::remove_file(dir.join(output));
        }
    }
    let _ = std::fs::remove_file(dir.join("t.trace"));
}

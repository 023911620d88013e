//! `gpumemhook view` and `run --html`: the page's embedded data, read back as the page reads it,
//! states the exit report's figures for a timeline, an out-of-memory report, a live process and
//! two runs side by side; the page fetches nothing. (scripts/check/browser opens the same pages in
//! chromium.) `view` and `plot` of a long recording peak near what they take of a short one.

use gpumemhook_reader::EventKind;
use gpumemhook_reader::Snapshot;
use gpumemhook_tests::{cli, measured, measured_rss, scratch, sim_dir, timeline, wait_for, Run};
use gpumemhook_timeline::{read_recording_reduced, replay, AllocationEvent, Columns, Reduction};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

const MIB: u64 = 1 << 20;

fn simrun() -> String {
    sim_dir().join("simrun").display().to_string()
}

fn gmh(dir: &Path, args: &[&str]) -> Output {
    let o = cli(dir, args).output().expect("gpumemhook runs");
    assert!(
        o.status.success(),
        "gpumemhook {args:?}: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// The page's data, as its script parses it; the page itself must fetch nothing.
fn page_data(path: &Path) -> Value {
    let page = std::fs::read_to_string(path).unwrap();
    let open = r#"<script id="gmh-data" type="application/json">"#;
    let start = page.find(open).expect("the data element") + open.len();
    let end = start + page[start..].find("</script>").unwrap();
    for outside in ["src=", "href=", "http://", "https://", "@import"] {
        assert!(
            !page.contains(outside),
            "the page refers outside itself: {outside}"
        );
    }
    serde_json::from_str(&page[start..end].replace("<\\/", "</")).unwrap()
}

fn report(path: &Path) -> Snapshot {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn run_html_states_the_exit_reports_figures_and_every_allocation() {
    let dir = scratch("view-run");
    let sim = simrun();
    gmh(
        &dir,
        &[
            "run",
            "-q",
            "--report",
            "r.json",
            "--trace",
            "t.json",
            "--html",
            "p.html",
            "--",
            &sim,
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:3145728",
            "rt.malloc:b:1048576",
            "rt.free:a",
            "rt.malloc:c:2097152",
        ],
    );
    let data = page_data(&dir.join("p.html"));
    let r = report(&dir.join("r.json"));
    let run = &data["runs"][0];
    assert_eq!(run["source"], "timeline");
    assert_eq!(run["summary"]["peak"], r.devices[0].peak);
    assert_eq!(r.devices[0].peak, 4 * MIB);
    let top = r.devices[0]
        .by_module
        .iter()
        .max_by_key(|m| m.peak)
        .unwrap();
    assert_eq!(run["summary"]["top_module"], top.module.as_str());
    // Three allocations in order; the first freed, the others held to the end (-1).
    let allocs = &run["allocs"];
    assert_eq!(allocs["b"], serde_json::json!([3 * MIB, MIB, 2 * MIB]));
    let held: Vec<i64> = allocs["e"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_i64().unwrap())
        .collect();
    assert!(held[0] >= 0 && held[1] == -1 && held[2] == -1, "{held:?}");
    // `used` delta-encoded: its running sum ends at the report's `used`.
    let used: i64 = run["devices"][0]["v"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .sum();
    assert_eq!(used as u64, r.devices[0].used);
    // `view` of the same timeline writes the same data.
    gmh(&dir, &["view", "t.json", "-o", "v.html"]);
    let again = page_data(&dir.join("v.html"));
    assert_eq!(again["runs"][0]["allocs"], run["allocs"]);
}

/// The numbers in `data[key]` (a JSON array).
fn numbers(data: &Value, key: &str) -> Vec<i64> {
    let array = data[key].as_array();
    let values = array.unwrap_or_else(|| panic!("{key}: {data}"));
    values.iter().map(|v| v.as_i64().unwrap()).collect()
}

/// The running sums of delta-encoded `values` (the page's `undelta`).
fn undelta(values: &[i64]) -> Vec<i64> {
    values
        .iter()
        .scan(0, |sum, v| {
            *sum += v;
            Some(*sum)
        })
        .collect()
}

#[test]
fn plot_and_view_of_a_million_events_peak_near_six_thousand_and_state_the_exit_report() {
    let dir = scratch("view-bounded");
    let sim = simrun();
    let record = |args: &[&str], workload: &str| {
        let mut all = vec!["run", "-q"];
        all.extend(args);
        all.extend(["--", &sim, "drv.init", "drv.ctx:0", workload]);
        gmh(&dir, &all);
    };
    // A million events: every allocation and every change of `used` kept would take over 100 MB.
    record(
        &["--report", "r.json", "--trace", "t.trace"],
        "threads:1:1000000:7:4096",
    );
    record(&["--trace", "small.trace"], "threads:2:3000:7:65536");
    let peak = |args: &[&str], trace: &str| {
        let rss = dir.join(format!("{}.{trace}.rss", args[0]));
        let mut args = args.to_vec();
        args.insert(1, trace);
        let status = measured(&cli(&dir, &args), 300, &rss)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "{args:?}");
        measured_rss(&rss)
    };
    for command in [&["plot", "-o", "p.png"][..], &["view", "-o", "v.html"]] {
        let (small, big) = (peak(command, "small.trace"), peak(command, "t.trace"));
        // The recording's reader takes about 10 MiB more at a million events whatever it keeps
        // (`report` does too); every change or allocation kept would take over 30 MiB more.
        assert!(
            big < small + 16 * 1024,
            "{}: {big} KiB, 6,000 events {small} KiB",
            command[0]
        );
    }
    // The page of the million states the exit report's figures.
    let r = report(&dir.join("r.json"));
    let run = &page_data(&dir.join("v.html"))["runs"][0];
    let device = &run["devices"][0];
    assert_eq!(run["summary"]["peak"], r.devices[0].peak);
    assert_eq!(device["last"], r.devices[0].used);
    let used = undelta(&numbers(device, "v"));
    assert_eq!(used.last().copied(), Some(r.devices[0].used as i64));
    assert_eq!(used.iter().max().copied(), Some(r.devices[0].peak as i64));
    let peak_t = device["peak_t"].as_i64().unwrap();
    assert!(
        numbers(run, "moments").contains(&peak_t),
        "the peak is one of the moments kept"
    );
    assert!(numbers(&run["allocs"], "b").len() < 100_000);
    // The allocations kept at a moment are those live then, of every allocation: at the peak,
    // they hold the peak. (The page counts in whole µs, where a million events in under a
    // second cannot be told apart: this is checked on the timeline's own times.)
    let trace = dir.join("t.trace");
    let whole = timeline(&trace);
    let peak = &replay(&whole).0[0];
    let reduced = read_recording_reduced(
        &trace,
        Reduction {
            columns: Columns {
                from: 0.0,
                to: 1.0,
                count: 1,
            },
            modules: false,
            moments: Some(vec![peak.peak_ts]),
            cuts: Vec::new(),
        },
    )
    .unwrap();
    let at_peak = live_at(&reduced.allocations, peak.peak_ts);
    assert_eq!(at_peak, live_at(&whole.allocations, peak.peak_ts));
    assert_eq!(at_peak.iter().map(|a| a.2).sum::<u64>(), peak.peak);
    assert!(reduced.allocations.len() < 1000);
}

#[test]
fn plot_of_a_long_recording_reduced_as_it_is_read_draws_what_its_whole_curve_draws() {
    let dir = scratch("plot-reduced");
    let sim = simrun();
    let workload = ["drv.init", "drv.ctx:0", "threads:1:1000000:7:4096"];
    let mut args = vec!["run", "-q", "--trace", "t.trace", "--", &sim];
    args.extend(workload);
    gmh(&dir, &args);
    // Chrome JSON is read whole: its plot draws every change.
    gmh(&dir, &["export", "t.trace", "--chrome", "c.json"]);
    for (i, options) in [&[][..], &["--by-module"], &["--from", "0.1", "--to", "0.2"]]
        .iter()
        .enumerate()
    {
        let image = |input: &str| {
            let output = format!("{i}.{input}.svg");
            let mut args = vec!["plot", input, "-o", &output];
            args.extend(options.iter());
            gmh(&dir, &args);
            std::fs::read_to_string(dir.join(&output)).unwrap()
        };
        assert!(
            image("t.trace") == image("c.json"),
            "plot {options:?} of the recording (reduced) and of its Chrome export (whole) differ"
        );
    }
}

/// The allocations (time, address, bytes) of `events` live at `at`: made then or before, and not
/// freed (frees paired with allocations by device and address, in file order).
fn live_at(events: &[AllocationEvent], at: f64) -> Vec<(f64, u64, u64)> {
    let mut open = std::collections::HashMap::new();
    for e in events.iter().filter(|e| e.ts <= at) {
        match e.kind {
            EventKind::Alloc => open.insert((e.device, e.address), (e.ts, e.address, e.bytes)),
            EventKind::Free => open.remove(&(e.device, e.address)),
            _ => None,
        };
    }
    let mut live: Vec<_> = open.into_values().collect();
    live.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    live
}

#[test]
fn an_out_of_memory_report_shows_the_refused_request_beside_what_was_held() {
    let run = Run::sim("simrun", &[]);
    let dir = run.dir().to_path_buf();
    run.env("GPUMEMHOOK_LIMIT", "2MiB")
        .env("GPUMEMHOOK_OOM_REPORT", dir.join("oom.json"))
        .arg("rt.malloc:a:1048576")
        .arg("rt.malloc:b:4194304=2")
        .run()
        .ok();
    gmh(&dir, &["view", "oom.json", "-o", "oom.html"]);
    let run = &page_data(&dir.join("oom.html"))["runs"][0];
    assert_eq!(run["source"], "oom");
    assert_eq!(run["report"]["oom"]["bytes"], 4 * MIB);
    assert_eq!(run["report"]["oom"]["reason"], "ceiling");
    assert_eq!(run["report"]["live"][0]["bytes"], MIB);
}

#[test]
fn a_live_pid_has_its_figures_now_and_two_runs_go_side_by_side() {
    let dir = scratch("view-live");
    let sim = simrun();
    let (ready, go) = (dir.join("ready"), dir.join("go"));
    let mut child = cli(
        &dir,
        &[
            "run",
            "-q",
            "--trace",
            "t.json",
            "--",
            &sim,
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:5242880",
            &format!("touch:{}", ready.display()),
            &format!("wait:{}", go.display()),
        ],
    )
    .spawn()
    .unwrap();
    wait_for(&ready);
    let pid = std::fs::read_dir(dir.join("shm"))
        .unwrap()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .rsplit('-')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .next()
        .expect("the segment of the live process");
    gmh(&dir, &["view", &pid.to_string(), "-o", "live.html"]);
    std::fs::write(&go, "").unwrap();
    assert!(child.wait().unwrap().success());
    let run = &page_data(&dir.join("live.html"))["runs"][0];
    assert_eq!(run["source"], "live");
    assert_eq!(run["summary"]["peak"], 5 * MIB);
    gmh(&dir, &["view", "t.json", "t.json", "-o", "both.html"]);
    let both = page_data(&dir.join("both.html"));
    assert_eq!(both["runs"].as_array().unwrap().len(), 2);
    assert_eq!(both["runs"][1]["summary"]["peak"], 5 * MIB);
    assert!(
        both.get("job").is_none(),
        "one timeline twice is two runs compared"
    );
    let o = cli(&dir, &["view", "no-such-file", "-o", "x.html"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "neither a file nor a pid: a usage error"
    );
}

/// The page of a job: three processes, two of them in one group, each with its rank.
fn job_page(data: &Value) -> &Value {
    data.get("job")
        .unwrap_or_else(|| panic!("the page of a job has its job: {data}"))
}

#[test]
fn the_processes_of_one_job_are_one_page_a_lane_each() {
    let dir = scratch("view-job");
    let sim = simrun();
    let file = |name: &str| dir.join(name).display().to_string();
    // Ranks 0 and 1 (group `pair`, device 0) overlap: rank 0 holds 4 MiB while rank 1 takes 2 MiB,
    // their joint peak 6 MiB; rank 2, alone on device 1, peaks highest, at 8 MiB.
    let script = format!(
        "GPUMEMHOOK_RANK=0 GPUMEMHOOK_GROUP=pair {sim} drv.init drv.ctx:0 rt.malloc:a:4194304 \
           touch:{a} wait:{b} rt.free:a &
         GPUMEMHOOK_RANK=1 GPUMEMHOOK_GROUP=pair {sim} drv.init drv.ctx:0 wait:{a} \
           rt.malloc:b:2097152 touch:{b} rt.free:b &
         GPUMEMHOOK_RANK=2 {sim} drv.init drv.ctx:1 rt.malloc:c:8388608 rt.free:c &
         wait",
        a = file("a"),
        b = file("b"),
    );
    let o = gmh(
        &dir,
        &[
            "run",
            "--report",
            "r.%p.json",
            "--trace",
            "t.%p.json",
            "--html",
            "run.html",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("3 processes on one page"), "{stderr}");
    let data = page_data(&dir.join("run.html"));
    let job = job_page(&data);
    let procs = job["procs"].as_array().unwrap();
    let ranks: Vec<&str> = procs.iter().map(|p| p["rank"].as_str().unwrap()).collect();
    assert_eq!(ranks, ["0", "1", "2"], "{job}");
    let peaks: Vec<u64> = procs.iter().map(|p| p["peak"].as_u64().unwrap()).collect();
    assert_eq!(peaks, [4 * MIB, 2 * MIB, 8 * MIB]);
    for p in procs {
        let r = report(&dir.join(format!("r.{}.json", p["pid"])));
        assert_eq!(p["peak"], r.devices.iter().map(|d| d.peak).max().unwrap());
    }
    assert_eq!(job["top"], 2, "rank 2 held the highest peak");
    assert_eq!(procs[2]["peak_device"], 1);
    assert_eq!(job["clock"], "monotonic");
    let groups = job["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["name"], "pair");
    assert_eq!(groups[0]["members"], serde_json::json!([0, 1]));
    assert_eq!(groups[0]["peak"], 6 * MIB);
    assert_eq!(
        groups[0]["peak_t"], procs[1]["peak_t"],
        "when rank 1 took its 2 MiB"
    );
    assert!(procs[0]["peak_t"].as_i64() < procs[1]["peak_t"].as_i64());
    assert_eq!(data["runs"][1]["summary"]["peak_t"], procs[1]["peak_t"]);

    // `view` of the three timelines: the same job.
    let traces: Vec<String> = procs
        .iter()
        .map(|p| format!("t.{}.json", p["pid"]))
        .collect();
    let mut args = vec!["view", "-o", "view.html"];
    args.extend(traces.iter().map(String::as_str));
    gmh(&dir, &args);
    let viewed = page_data(&dir.join("view.html"));
    assert_eq!(job_page(&viewed)["procs"], job["procs"]);
    assert_eq!(job_page(&viewed)["groups"], job["groups"]);
    // Two ranks that overlap in time on one machine are one job too; --compare compares them.
    let o = gmh(&dir, &["view", &traces[1], &traces[0], "-o", "two.html"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("2 processes of one job"));
    let two = page_data(&dir.join("two.html"));
    assert_eq!(
        job_page(&two)["procs"][0]["rank"],
        "0",
        "by rank, whatever the order given"
    );
    gmh(
        &dir,
        &[
            "view",
            "--compare",
            &traces[0],
            &traces[1],
            "-o",
            "cmp.html",
        ],
    );
    assert!(page_data(&dir.join("cmp.html")).get("job").is_none());
    let mut three = vec!["view", "--compare", "-o", "x.html"];
    three.extend(traces.iter().map(String::as_str));
    let o = cli(&dir, &three).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "--compare of three: a usage error"
    );
    let rep = format!("r.{}.json", procs[0]["pid"]);
    let o = cli(
        &dir,
        &["view", &traces[0], &traces[1], &rep, "-o", "x.html"],
    )
    .output()
    .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "a report among three is not a process of the job"
    );
}

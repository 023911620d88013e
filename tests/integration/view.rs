//! `gpumemhook view` and `run --html`: the page's embedded data, read back as the page reads it,
//! states the exit report's figures for a timeline, an out-of-memory report, a live process and
//! two runs side by side; the page fetches nothing. (scripts/check/browser opens the same pages in
//! chromium.)

use gpumemhook_reader::Snapshot;
use gpumemhook_tests::{cli, scratch, sim_dir, wait_for, Run};
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
    let o = cli(&dir, &["view", "no-such-file", "-o", "x.html"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "neither a file nor a pid: a usage error"
    );
}

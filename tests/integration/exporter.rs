//! `gpumemhook exporter` over live simulated processes: exact figures and job labels in `/metrics`
//! (the user's `GPUMEMHOOK_JOB`, Ray's, Slurm's, torchrun's, a pod's, which wins, bad values),
//! processes appearing and disappearing between scrapes, malformed and hostile requests, clients
//! that connect and say nothing, and no segment kept open between scrapes. (The Python package's
//! tests parse the same output with Prometheus' own Python parser; `scripts/check/prometheus` has a
//! real Prometheus scrape it.)

use gpumemhook_tests::{cli, wait_for, Run};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A running exporter over one segment directory; stopped when dropped.
struct Exporter {
    child: Child,
    addr: SocketAddr,
}

impl Exporter {
    fn start(dir: &Path) -> Exporter {
        let mut child = cli(dir, &["exporter", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("gpumemhook exporter starts");
        let mut line = String::new();
        BufReader::new(child.stderr.take().expect("stderr piped"))
            .read_line(&mut line)
            .expect("exporter's first line");
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in the exporter's first line: {line:?}"));
        Exporter { child, addr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `GET /metrics` asking for OpenMetrics, as Prometheus does: the status and body.
    fn scrape(&self) -> (u16, String) {
        request(
            self.addr,
            b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: application/openmetrics-text;\
              version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n\r\n",
        )
    }

    /// The samples of a successful scrape.
    fn samples(&self) -> Vec<Sample> {
        let (status, body) = self.scrape();
        assert_eq!(status, 200, "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        parse_samples(&body)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `raw` on a fresh connection; returns the response's status and body.
fn request(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the exporter");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(raw).expect("send the request");
    read_response(&mut stream)
}

fn read_response(stream: &mut TcpStream) -> (u16, String) {
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).expect("read the response");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: String,
}

/// The sample lines of an exposition: `name{label="value",...} value`, values unescaped.
pub(crate) fn parse_samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let name_end = line.find(['{', ' ']).expect("a sample name");
            let name = line[..name_end].to_string();
            let mut labels = BTreeMap::new();
            let mut rest = &line[name_end..];
            if let Some(mut inside) = rest.strip_prefix('{') {
                while !inside.starts_with('}') {
                    let (key, after) = inside.split_once("=\"").expect("label=\"");
                    let mut value = String::new();
                    let mut chars = after.char_indices();
                    let end = loop {
                        match chars.next().expect("closing quote") {
                            (_, '\\') => match chars.next().expect("escaped character").1 {
                                'n' => value.push('\n'),
                                c => value.push(c),
                            },
                            (i, '"') => break i,
                            (_, c) => value.push(c),
                        }
                    };
                    labels.insert(key.trim_start_matches(',').to_string(), value);
                    inside = &after[end + 1..];
                }
                rest = &inside[1..];
            }
            Sample {
                name,
                labels,
                value: rest.trim().to_string(),
            }
        })
        .collect()
}

/// The value of `name` for `pid` on `device`, if the scrape has it.
pub(crate) fn value(samples: &[Sample], name: &str, pid: u32, device: u32) -> Option<String> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && s.labels.get("pid") == Some(&pid.to_string())
                && s.labels.get("device") == Some(&device.to_string())
        })
        .map(|s| s.value.clone())
}

/// A simulated program held after `ops` until its `go` file appears.
struct Held {
    child: Child,
    go: PathBuf,
}

impl Held {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets it finish and waits for it.
    fn finish(mut self) {
        std::fs::write(&self.go, "").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

/// Starts `simrun OPS` under the hook, counting into `shm`, with `env` added.
fn hold(dir: &Path, name: &str, ops: &[&str], env: &[(&str, &str)]) -> Held {
    let ready = dir.join(format!("{name}.ready"));
    let go = dir.join(format!("{name}.go"));
    let run = Run::sim("simrun", ops)
        .arg(format!("touch:{}", ready.display()))
        .arg(format!("wait:{}", go.display()));
    start_held(dir, run, env, &ready, go)
}

/// Starts `run` under the hook, counting into `dir/shm`, with `env` added, and returns once it has
/// created `ready`; it goes on when `go` appears.
fn start_held(dir: &Path, mut run: Run, env: &[(&str, &str)], ready: &Path, go: PathBuf) -> Held {
    run = run.env("GPUMEMHOOK_SHM_DIR", dir.join("shm"));
    for (k, v) in env {
        run = run.env(k, v);
    }
    let (mut command, _) = run.into_command();
    let child = command
        .stdout(Stdio::null())
        .spawn()
        .expect("the held program starts");
    wait_for(ready);
    Held { child, go }
}

fn scratch_dir(name: &str) -> PathBuf {
    // Built before any program is held: a held program gives up waiting after 120 s.
    gpumemhook_tests::cli_bin();
    let dir = gpumemhook_tests::scratch(name);
    std::fs::create_dir_all(dir.join("shm")).unwrap();
    dir
}

#[test]
fn exporter_serves_the_exact_figures_and_job_labels_of_a_live_process() {
    let dir = scratch_dir("exporter-exact");
    let held = hold(
        &dir,
        "rank1",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:300000",
            "rt.malloc:b:400000",
            "rt.free:a",
            "rt.malloc:c:900000=2",
            "drv.ctx:1",
            "drv.alloc:d:5000",
        ],
        &[
            ("GPUMEMHOOK_LIMIT", "1000000B"),
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("SLURM_JOB_ID", "4242"),
            ("POD_NAME", "has \"quotes\" \\ and, commas}"),
        ],
    );
    let exporter = Exporter::start(&dir);
    let samples = exporter.samples();
    let pid = held.pid();
    let figures = |device| {
        [
            "gpumemhook_used_bytes",
            "gpumemhook_peak_bytes",
            "gpumemhook_limit_bytes",
            "gpumemhook_allocations_total",
            "gpumemhook_frees_total",
            "gpumemhook_denied_total",
            "gpumemhook_failed_total",
        ]
        .map(|name| value(&samples, name, pid, device).unwrap_or_else(|| "absent".into()))
    };
    assert_eq!(
        figures(0),
        ["400000", "700000", "1000000", "2", "1", "1", "0"],
        "{samples:#?}"
    );
    assert_eq!(
        figures(1),
        ["5000", "5000", "1000000", "1", "0", "0", "0"],
        "{samples:#?}"
    );
    assert_eq!(value(&samples, "gpumemhook_used_bytes", pid, 2), None);
    // Who holds it: every byte of device 0 was asked for by the program itself.
    let by_module: Vec<(String, String)> = samples
        .iter()
        .filter(|s| s.name == "gpumemhook_module_used_bytes" && s.labels["device"] == "0")
        .map(|s| (s.labels["module"].clone(), s.value.clone()))
        .collect();
    assert_eq!(by_module, [("simrun".to_string(), "400000".to_string())]);
    let used = samples
        .iter()
        .find(|s| s.name == "gpumemhook_used_bytes" && s.labels["device"] == "0")
        .unwrap();
    let mut expected: BTreeMap<String, String> = [
        ("pid", pid.to_string()),
        ("device", "0".into()),
        ("rank", "1".into()),
        ("local_rank", "1".into()),
        ("world_size", "2".into()),
        ("slurm_job_id", "4242".into()),
        ("pod_name", "has \"quotes\" \\ and, commas}".into()),
        ("job_id", "slurm:4242".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let user = used.labels.get("user").cloned().unwrap_or_default();
    assert!(!user.is_empty(), "{used:?}");
    expected.insert("user".into(), user);
    let command = used.labels.get("command").cloned().unwrap_or_default();
    assert!(
        command.starts_with("simrun drv.init drv.ctx:0 rt.malloc:a:300000"),
        "the program's file name and its arguments: {command:?}"
    );
    assert_eq!(command.chars().count(), 64, "{command:?}");
    expected.insert("command".into(), command);
    assert_eq!(used.labels, expected);
    let processes = samples
        .iter()
        .find(|s| s.name == "gpumemhook_processes")
        .map(|s| s.value.as_str());
    assert_eq!(processes, Some("1"));
    held.finish();
}

#[test]
fn processes_appear_and_disappear_between_scrapes() {
    let dir = scratch_dir("exporter-churn");
    let exporter = Exporter::start(&dir);
    let first = exporter.samples();
    assert!(
        first.iter().all(|s| !s.name.starts_with("gpumemhook_used")),
        "{first:#?}"
    );
    let a = hold(&dir, "a", &["rt.malloc:a:1111"], &[]);
    let b = hold(&dir, "b", &["rt.malloc:a:2222"], &[]);
    // Hooked but never used the GPU: counted as a process, no series.
    let idle = hold(&dir, "idle", &[], &[]);
    let both = exporter.samples();
    assert_eq!(
        value(&both, "gpumemhook_used_bytes", a.pid(), 0).as_deref(),
        Some("1111")
    );
    assert_eq!(
        value(&both, "gpumemhook_used_bytes", b.pid(), 0).as_deref(),
        Some("2222")
    );
    assert!(both
        .iter()
        .all(|s| s.labels.get("pid") != Some(&idle.pid().to_string())));
    assert!(both
        .iter()
        .any(|s| s.name == "gpumemhook_processes" && s.value == "3"));
    let (a_pid, b_pid) = (a.pid(), b.pid());
    a.finish();
    let after = exporter.samples();
    assert!(
        after
            .iter()
            .all(|s| s.labels.get("pid") != Some(&a_pid.to_string())),
        "an exited process must be gone: {after:#?}"
    );
    assert_eq!(
        value(&after, "gpumemhook_used_bytes", b_pid, 0).as_deref(),
        Some("2222")
    );
    b.finish();
    idle.finish();
    let none = exporter.samples();
    assert!(
        none.iter().all(|s| !s.labels.contains_key("pid")),
        "{none:#?}"
    );
    assert!(none
        .iter()
        .any(|s| s.name == "gpumemhook_processes" && s.value == "0"));
}

#[test]
fn a_process_killed_without_cleanup_is_gone_from_the_next_scrape() {
    let dir = scratch_dir("exporter-killed");
    let mut held = hold(&dir, "k", &["rt.malloc:a:777"], &[]);
    let exporter = Exporter::start(&dir);
    let pid = held.pid();
    assert_eq!(
        value(&exporter.samples(), "gpumemhook_used_bytes", pid, 0).as_deref(),
        Some("777")
    );
    held.child.kill().unwrap();
    held.child.wait().unwrap();
    let after = exporter.samples();
    assert_eq!(
        value(&after, "gpumemhook_used_bytes", pid, 0),
        None,
        "{after:#?}"
    );
}

#[test]
fn malformed_and_unexpected_requests_get_4xx() {
    let dir = scratch_dir("exporter-bad");
    let exporter = Exporter::start(&dir);
    let addr = exporter.addr;
    let long_head = format!(
        "GET /metrics HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    for (raw, expected) in [
        (&b"garbage\r\n\r\n"[..], 400),
        (b"GET /metrics HTTP/9.9\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 404),
        (b"GET /metrics/../etc/passwd HTTP/1.1\r\n\r\n", 404),
        (b"GET /debug HTTP/1.0\r\n\r\n", 404),
        (
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            405,
        ),
        (b"DELETE /metrics HTTP/1.1\r\n\r\n", 405),
        (long_head.as_bytes(), 431),
    ] {
        let (status, body) = request(addr, raw);
        assert_eq!(
            status,
            expected,
            "{:?} -> {body}",
            String::from_utf8_lossy(&raw[..raw.len().min(60)])
        );
    }
    // A request whose client closes its side after half a head still gets an answer (400).
    let mut half = TcpStream::connect(addr).unwrap();
    half.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    half.write_all(b"GET /metr").unwrap();
    half.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_response(&mut half).0, 400);
    // HEAD: the head only. A query string is ignored.
    let (status, body) = request(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!((status, body.as_str()), (200, ""));
    let (status, body) = request(addr, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.ends_with("\ngpumemhook_processes 0\n"), "{body}");
}

#[test]
fn silent_and_half_sent_clients_never_delay_another_scrape() {
    let dir = scratch_dir("exporter-slow");
    let held = hold(&dir, "s", &["rt.malloc:a:4096"], &[]);
    let exporter = Exporter::start(&dir);
    let silent = TcpStream::connect(exporter.addr).unwrap();
    let mut half = TcpStream::connect(exporter.addr).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    // A client that sends a request and then never reads the (large enough) response.
    let mut deaf = TcpStream::connect(exporter.addr).unwrap();
    deaf.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        let start = Instant::now();
        let samples = exporter.samples();
        let took = start.elapsed();
        assert_eq!(
            value(&samples, "gpumemhook_used_bytes", held.pid(), 0).as_deref(),
            Some("4096")
        );
        assert!(
            took < Duration::from_secs(2),
            "a scrape took {took:?} beside stuck clients"
        );
    }
    // The stuck ones are answered 408 once their time is up, and their threads end.
    for mut stuck in [silent, half] {
        stuck
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let start = Instant::now();
        assert_eq!(read_response(&mut stuck).0, 408);
        assert!(start.elapsed() < Duration::from_secs(15));
    }
    drop(deaf);
    held.finish();
}

#[test]
fn past_the_connection_cap_clients_are_refused_at_once_and_service_resumes() {
    let dir = scratch_dir("exporter-cap");
    let exporter = Exporter::start(&dir);
    // The exporter serves 32 connections at once.
    let stuck: Vec<TcpStream> = (0..32)
        .map(|_| TcpStream::connect(exporter.addr).unwrap())
        .collect();
    // Wait until the exporter serves them all: its main thread plus one thread each.
    let tasks = PathBuf::from(format!("/proc/{}/task", exporter.pid()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_dir(&tasks).unwrap().count() < 33 {
        assert!(
            Instant::now() < deadline,
            "the 32 connections were never all taken"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let start = Instant::now();
    let mut refused = TcpStream::connect(exporter.addr).unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // Wait for the refusal before asking: a request that crosses it would reset the connection.
    let mut answer = Vec::new();
    refused.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(start.elapsed() < Duration::from_secs(2));
    drop(stuck);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = exporter.scrape();
        if status == 200 {
            assert!(body.ends_with("# EOF\n"));
            break;
        }
        assert!(Instant::now() < deadline, "never served again: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_exporter_keeps_no_segment_open_or_mapped_between_scrapes() {
    let dir = scratch_dir("exporter-fds");
    let held = hold(&dir, "f", &["rt.malloc:a:10"], &[]);
    let exporter = Exporter::start(&dir);
    for _ in 0..3 {
        assert_eq!(
            value(&exporter.samples(), "gpumemhook_used_bytes", held.pid(), 0).as_deref(),
            Some("10")
        );
    }
    let shm = dir.join("shm").display().to_string();
    let proc_dir = PathBuf::from(format!("/proc/{}", exporter.pid()));
    let open: Vec<String> = std::fs::read_dir(proc_dir.join("fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p.contains(&shm))
        .collect();
    assert!(open.is_empty(), "descriptors left open: {open:?}");
    let maps = std::fs::read_to_string(proc_dir.join("maps")).unwrap();
    assert!(
        !maps.contains(&shm),
        "segments left mapped:\n{}",
        maps.lines()
            .filter(|l| l.contains(&shm))
            .collect::<Vec<_>>()
            .join("\n")
    );
    held.finish();
}

#[test]
fn clients_that_do_not_ask_for_openmetrics_get_the_prometheus_text_format() {
    let dir = scratch_dir("exporter-text");
    let held = hold(&dir, "t", &["rt.malloc:a:64", "rt.malloc:b:64"], &[]);
    let exporter = Exporter::start(&dir);
    let raw = |accept: &str| {
        let mut stream = TcpStream::connect(exporter.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        write!(stream, "GET /metrics HTTP/1.1\r\nHost: x\r\n{accept}\r\n").unwrap();
        let mut bytes = String::new();
        stream.read_to_string(&mut bytes).unwrap();
        bytes
    };
    for accept in ["", "Accept: text/plain\r\n", "Accept: */*\r\n"] {
        let text = raw(accept);
        assert!(
            text.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{text}"
        );
        assert!(text.contains("\n# TYPE gpumemhook_allocations_total counter\n"));
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        let samples = parse_samples(body);
        assert_eq!(
            value(&samples, "gpumemhook_allocations_total", held.pid(), 0).as_deref(),
            Some("2")
        );
    }
    let text = raw("ACCEPT: Application/OpenMetrics-Text; version=1.0.0\r\n");
    assert!(text.contains("\r\nContent-Type: application/openmetrics-text; version=1.0.0"));
    assert!(text.ends_with("# EOF\n"));
    held.finish();
}

#[test]
fn serving_beyond_loopback_needs_allow_remote() {
    let dir = scratch_dir("exporter-remote");
    let out = cli(&dir, &["exporter", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-remote"));
}

#[test]
fn once_prints_one_scrape_and_exits() {
    let dir = scratch_dir("exporter-once");
    let held = hold(&dir, "o", &["rt.malloc:a:31337"], &[("RANK", "0")]);
    let out = cli(&dir, &["exporter", "--once"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let samples = parse_samples(&text);
    assert_eq!(
        value(&samples, "gpumemhook_used_bytes", held.pid(), 0).as_deref(),
        Some("31337")
    );
    assert!(text.ends_with("# EOF\n"));
    held.finish();
}

// ---------------------------------------------------------------------------------------------
// Job labels in `ls`, `ls --by-job`, `report` and the exit report.

fn gmh(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = cli(dir, args).output().expect("gpumemhook runs");
    assert!(
        out.status.success(),
        "gpumemhook {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn ls_group_job_sums_each_jobs_ranks_per_device() {
    let dir = scratch_dir("exporter-group");
    let slurm0 = hold(
        &dir,
        "s0",
        &["rt.malloc:a:100", "rt.malloc:b:1000", "rt.free:b"],
        &[("SLURM_JOB_ID", "7"), ("RANK", "0"), ("WORLD_SIZE", "2")],
    );
    let slurm1 = hold(
        &dir,
        "s1",
        &["rt.malloc:a:200", "drv.init", "drv.ctx:1", "drv.alloc:b:30"],
        &[("SLURM_JOB_ID", "7"), ("RANK", "1"), ("WORLD_SIZE", "2")],
    );
    let torch = hold(
        &dir,
        "t",
        &["rt.malloc:a:50"],
        &[("TORCHELASTIC_RUN_ID", "abc"), ("RANK", "0")],
    );
    let loose = hold(&dir, "l", &["rt.malloc:a:5"], &[]);
    let out = gmh(&dir, &["ls", "--by-job", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let summary: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} dev{} pids{} ranks{} used{} peak_sum{} allocs{}",
                r["job"],
                r["device"],
                r["pids"].as_array().unwrap().len(),
                r["ranks"],
                r["used"],
                r["peak_sum"],
                r["allocs"]
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            r#""slurm:7" dev0 pids2 ranks["0","1"] used300 peak_sum1300 allocs3"#,
            r#""slurm:7" dev1 pids1 ranks["1"] used30 peak_sum30 allocs1"#,
            r#""torchrun:abc" dev0 pids1 ranks["0"] used50 peak_sum50 allocs1"#,
            r#"null dev0 pids1 ranks[] used5 peak_sum5 allocs1"#,
        ]
    );
    let table = String::from_utf8_lossy(&gmh(&dir, &["ls", "--by-job"]).stdout).into_owned();
    let words: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        words[1],
        ["slurm:7", "0", "2", "300", "B", "1.27", "KiB", "3", "0", "0,1"],
        "{table}"
    );
    assert_eq!(words[4][..3], ["(no", "job)", "0"], "{table}");
    // The plain listing shows where each process belongs before its command.
    let ls = String::from_utf8_lossy(&gmh(&dir, &["ls"]).stdout).into_owned();
    let line = ls
        .lines()
        .find(|l| l.trim_start().starts_with(&slurm1.pid().to_string()))
        .unwrap_or_else(|| panic!("{ls}"));
    assert!(line.contains("[rank 1/2 slurm:7] "), "{ls}");
    let loose_line = ls
        .lines()
        .find(|l| l.trim_start().starts_with(&loose.pid().to_string()))
        .unwrap_or_else(|| panic!("{ls}"));
    assert!(!loose_line.contains('['), "{ls}");
    for h in [slurm0, slurm1, torch, loose] {
        h.finish();
    }
}

#[test]
fn job_labels_reach_the_exit_report_and_a_forked_child() {
    let ran = Run::sim(
        "simrun",
        &["rt.malloc:a:10", "fork", "rt.malloc:b:20", "endfork"],
    )
    // The stand-in driver refuses a forked child's calls, as a real one does; the child is let
    // through so that it has a report to read its labels from.
    .env("FAKECUDA_FORK_OK", "1")
    .env("POD_NAME", "trainer-0")
    .env("POD_NAMESPACE", "ml")
    .env("LOCAL_RANK", "3")
    .run()
    .ok();
    let reports = ran.reports();
    assert_eq!(reports.len(), 2, "{reports:#?}");
    for r in reports.values() {
        let job: Vec<(&str, &str)> = r.job.pairs().collect();
        assert_eq!(
            job,
            [
                ("local_rank", "3"),
                ("pod_name", "trainer-0"),
                ("pod_namespace", "ml")
            ],
            "pid {}",
            r.pid
        );
    }
    let path = ran.dir.join("report.json");
    let one = reports.values().next().unwrap();
    std::fs::write(&path, serde_json::to_string(one).unwrap()).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(r#""job":{"local_rank":"3","pod_name":"trainer-0","pod_namespace":"ml"}"#),
        "{text}"
    );
    let shown = gmh(&ran.dir, &["report", path.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("pod:ml/trainer-0"), "{shown}");
}

/// A plain Python script (no framework: ctypes into the stand-in runtime) under the hook that holds
/// 4096 bytes until its `go` file appears.
fn hold_script(dir: &Path, name: &str, env: &[(&str, &str)]) -> Held {
    let ready = dir.join(format!("{name}.ready"));
    let go = dir.join(format!("{name}.go"));
    let script = dir.join(format!("{name}.py"));
    std::fs::write(
        &script,
        "import ctypes, os, sys, time\n\
         rt = ctypes.CDLL('libcudart.so.13')\n\
         p = ctypes.c_void_p()\n\
         assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096)) == 0\n\
         open(sys.argv[1], 'w').close()\n\
         deadline = time.monotonic() + 30\n\
         while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:\n\
         \x20   time.sleep(0.01)\n",
    )
    .unwrap();
    let run = Run::program(gpumemhook_tests::python(), name)
        .arg(&script)
        .arg(&ready)
        .arg(&go);
    start_held(dir, run, env, &ready, go)
}

/// `ls --by-job --json` as `job pids ranks used` lines.
fn job_rows(dir: &Path) -> Vec<String> {
    let out = gmh(dir, &["ls", "--by-job", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} pids{} ranks{} used{}",
                r["job"],
                r["pids"].as_array().unwrap().len(),
                r["ranks"],
                r["used"]
            )
        })
        .collect()
}

/// The job labels (every label but pid, user, command and device) of `pid`'s
/// `gpumemhook_used_bytes` on device 0.
fn job_labels_scraped(samples: &[Sample], pid: u32) -> Vec<(String, String)> {
    let used = samples
        .iter()
        .find(|s| {
            s.name == "gpumemhook_used_bytes"
                && s.labels.get("pid") == Some(&pid.to_string())
                && s.labels.get("device").map(String::as_str) == Some("0")
        })
        .unwrap_or_else(|| panic!("no used bytes of {pid}: {samples:#?}"));
    used.labels
        .iter()
        .filter(|(k, _)| !["pid", "user", "command", "device"].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = list
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

#[test]
fn a_plain_script_started_with_gpumemhook_job_is_that_job_in_ls_and_the_exporter() {
    let dir = scratch_dir("labels-nightly");
    let script = hold_script(
        &dir,
        "nightly",
        &[("GPUMEMHOOK_JOB", "nightly"), ("GPUMEMHOOK_RANK", "0")],
    );
    let second = hold(
        &dir,
        "n1",
        &["rt.malloc:a:100"],
        &[("GPUMEMHOOK_JOB", "nightly"), ("GPUMEMHOOK_RANK", "1")],
    );
    let loose = hold_script(&dir, "loose", &[]);
    assert_eq!(
        job_rows(&dir),
        [
            r#""nightly" pids2 ranks["0","1"] used4196"#,
            r#"null pids1 ranks[] used4096"#,
        ]
    );
    let table = String::from_utf8_lossy(&gmh(&dir, &["ls", "--by-job"]).stdout).into_owned();
    let first: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(first[..3], ["nightly", "0", "2"], "{table}");
    let ls = String::from_utf8_lossy(&gmh(&dir, &["ls"]).stdout).into_owned();
    let line = ls
        .lines()
        .find(|l| l.trim_start().starts_with(&script.pid().to_string()))
        .unwrap_or_else(|| panic!("{ls}"));
    assert!(line.contains("[rank 0 nightly] "), "{ls}");
    let top = String::from_utf8_lossy(&gmh(&dir, &["top", "--once"]).stdout).into_owned();
    assert!(top.contains("[rank 1 nightly] "), "{top}");
    let samples = Exporter::start(&dir).samples();
    assert_eq!(
        job_labels_scraped(&samples, script.pid()),
        pairs(&[
            ("job_name", "nightly"),
            ("rank", "0"),
            ("job_id", "nightly")
        ])
    );
    assert_eq!(job_labels_scraped(&samples, loose.pid()), pairs(&[]));
    for h in [script, second, loose] {
        h.finish();
    }
}

#[test]
fn the_users_job_wins_then_ray_then_slurm_and_bad_values_are_cleaned_or_skipped() {
    let dir = scratch_dir("labels-precedence");
    let long = "n".repeat(400);
    // The user's job and rank over a Slurm job and torchrun's rank.
    let user = hold(
        &dir,
        "user",
        &["rt.malloc:a:10"],
        &[
            ("GPUMEMHOOK_JOB", "nightly"),
            ("GPUMEMHOOK_RANK", "3"),
            ("RANK", "5"),
            ("SLURM_JOB_ID", "7"),
        ],
    );
    // A Ray worker as Ray's raylet starts it, on a Ray cluster started inside Slurm job 7.
    let ray = hold(
        &dir,
        "ray",
        &["rt.malloc:a:20"],
        &[
            ("RAY_JOB_ID", "02000000"),
            ("RAY_RAYLET_PID", "4321"),
            ("SPT_NOENV", "1"),
            ("SLURM_JOB_ID", "7"),
        ],
    );
    // An empty job label is no label: the Slurm job wins.
    let empty = hold(
        &dir,
        "empty",
        &["rt.malloc:a:40"],
        &[
            ("GPUMEMHOOK_JOB", ""),
            ("GPUMEMHOOK_RANK", " "),
            ("SLURM_JOB_ID", "7"),
        ],
    );
    // Control characters dropped, an over-long value cut to 253 bytes.
    let dirty = hold(
        &dir,
        "dirty",
        &["rt.malloc:a:80"],
        &[
            ("GPUMEMHOOK_JOB", "\u{1b}[31mred\u{7}"),
            ("GPUMEMHOOK_RANK", &long),
        ],
    );
    let rank253 = "n".repeat(253);
    assert_eq!(
        job_rows(&dir),
        [
            format!(r#""[31mred" pids1 ranks["{rank253}"] used80"#),
            r#""nightly" pids1 ranks["3"] used10"#.to_string(),
            r#""ray:02000000" pids1 ranks[] used20"#.to_string(),
            r#""slurm:7" pids1 ranks[] used40"#.to_string(),
        ]
    );
    let samples = Exporter::start(&dir).samples();
    assert_eq!(
        job_labels_scraped(&samples, user.pid()),
        pairs(&[
            ("job_name", "nightly"),
            ("rank", "3"),
            ("slurm_job_id", "7"),
            ("job_id", "nightly"),
        ])
    );
    assert_eq!(
        job_labels_scraped(&samples, ray.pid()),
        pairs(&[
            ("ray_job_id", "02000000"),
            ("slurm_job_id", "7"),
            ("job_id", "ray:02000000"),
        ])
    );
    assert_eq!(
        job_labels_scraped(&samples, empty.pid()),
        pairs(&[("slurm_job_id", "7"), ("job_id", "slurm:7")])
    );
    assert_eq!(
        job_labels_scraped(&samples, dirty.pid()),
        pairs(&[
            ("job_name", "[31mred"),
            ("rank", &rank253),
            ("job_id", "[31mred"),
        ])
    );
    for h in [user, ray, empty, dirty] {
        h.finish();
    }
    // A job label that is not UTF-8, like any GPUMEMHOOK_ value the hook cannot read, stops the
    // program at load naming the variable; Ray's own variable, not the hook's, is only skipped.
    let ran = Run::sim("simrun", &["drv.init"])
        .env("GPUMEMHOOK_JOB", OsStr::from_bytes(&[b'n', 0xff]))
        .run();
    assert_eq!(ran.output.status.code(), Some(2), "{}", ran.stderr());
    assert!(
        ran.stderr().contains("GPUMEMHOOK_JOB") && ran.stderr().contains("job label"),
        "{}",
        ran.stderr()
    );
    let ran = Run::sim("simrun", &["rt.malloc:a:10"])
        .env("RAY_JOB_ID", OsStr::from_bytes(&[b'0', 0xff]))
        .run()
        .ok();
    assert!(ran.report().job.is_empty(), "{:?}", ran.report().job);
}

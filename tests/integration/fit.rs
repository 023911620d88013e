//! `gpumemhook fit`: the exact largest value under ceilings and on emulated cards (context
//! charged), a crash reported as an error and never as out of memory, trials side by side that
//! never hold more than the device has free, what one target teaches another, the JSON schema,
//! bad input refused in one line; and fit owning its trials: SIGTERM, SIGINT and SIGHUP to fit
//! leave no process of any trial's group and no directory, `--trial-timeout` ends a trial that
//! hangs as `timed out`, and a trial's endless stderr does not grow fit's memory.
//!
//! The program tried is a small Python script over the simulated stack: with value N it allocates
//! N blocks of 100 MiB with `cudaMalloc` and exits 1 at the first failure (as a framework raising
//! its out-of-memory error would), so its peak is exactly N × 100 MiB.

use gpumemhook_tests::{cli, python, scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 100 * MIB;
const CONTEXT: u64 = 500 * MIB;

/// With argv[1] = N: logs `start` and `end` (pid, CLOCK_MONOTONIC ns, N, $FIT_LAUNCHED) to
/// $FIT_LOG (`end` on SIGTERM too), allocates its peak (N blocks, or the curve $FIT_CURVE gives, in MiB) in blocks of at most
/// BLOCK, holds it $FIT_HOLD_MS, and exits 0; aborts instead when N is $CRASH_AT; sleeps 60 s first
/// when N is $FIT_SLOW_FROM or more; allocates only once trial $FIT_AFTER_START has started.
const PROGRAM: &str = r#"
import ctypes, os, signal, sys, time
n = int(sys.argv[1])
log = os.environ.get("FIT_LOG")
def note(what):
    if log:
        with open(log, "a") as f:
            f.write(f"{what} {os.getpid()} {time.clock_gettime_ns(time.CLOCK_MONOTONIC)} {n} "
                    f"{os.environ.get('FIT_LAUNCHED', '-')}\n")
def ended(signum, frame):
    # A trial that fit ends as moot logs its end too (else it would seem to run for ever), then
    # dies of the signal as it would have.
    note("end")
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
signal.signal(signal.SIGTERM, ended)
note("start")
after = os.environ.get("FIT_AFTER_START")
if after and log and n != int(after):
    # Allocate only once trial `after` has started (at most 30 s), so that its start is logged
    # before any outcome can make it moot, however slowly Python starts under load.
    until = time.time() + 30
    def started():
        with open(log) as f:
            return any(w[:1] == ["start"] and w[3:4] == [after] for w in map(str.split, f))
    while time.time() < until and not started():
        time.sleep(0.01)
daemons = os.environ.get("FIT_DAEMONS")
if daemons:
    # A daemon of the trial's: a session of its own, outside the trial's process group.
    import subprocess
    d = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with open(daemons, "a") as f:
        f.write(f"{d.pid}\n")
slow_from = os.environ.get("FIT_SLOW_FROM")
if slow_from and n >= int(slow_from):
    time.sleep(60)
rt = ctypes.CDLL("libcudart.so.13")
if os.environ.get("CRASH_AT") == str(n):
    print(f"boom at {n}", file=sys.stderr)
    sys.stderr.flush()
    os.abort()
mib = 1 << 20
curve = {
    "affine": lambda n: n * BLOCK,
    "convex": lambda n: (3 * n * n + 40) * mib,
    "step": lambda n: (300 if n <= 7 else 900 + n) * mib,
    "dip": lambda n: 50 * mib if n == 2 else n * BLOCK,
}[os.environ.get("FIT_CURVE", "affine")]
left = curve(n)
held = []
while left > 0:
    p = ctypes.c_void_p()
    size = min(left, BLOCK)
    if rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)) != 0:
        print("CUDA out of memory", file=sys.stderr)
        note("end")
        sys.exit(1)
    held.append(p)
    left -= size
time.sleep(int(os.environ.get("FIT_HOLD_MS", "0")) / 1000)
note("end")
"#;

fn program(dir: &Path) -> PathBuf {
    let path = dir.join("grow.py");
    std::fs::write(&path, PROGRAM.replace("BLOCK", &BLOCK.to_string())).unwrap();
    path
}

/// `gpumemhook fit TARGETS... --param n=RANGE --json fit.json -- python grow.py {n}` in `dir`.
fn fit_command(dir: &Path, options: &[&str], range: &str) -> Command {
    let prog = program(dir);
    let param = format!("n={range}");
    let mut args: Vec<&str> = vec!["fit"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--param", &param, "--json", "fit.json", "--"]);
    let python = python().to_str().unwrap();
    args.extend_from_slice(&[python, prog.to_str().unwrap(), "{n}"]);
    let mut command = cli(dir, &args);
    command.env("FAKECUDA_CONTEXT_BYTES", CONTEXT.to_string());
    command
}

fn show(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn results(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("fit.json")).expect("fit.json written");
    let json: Value = serde_json::from_str(&text).unwrap();
    json["results"].as_array().unwrap().clone()
}

#[test]
fn the_exact_largest_value_under_ceilings_and_on_cards_with_the_context_charged() {
    let dir = scratch("fit-exact");
    let o = fit_command(
        &dir,
        &["--limit", "1000MiB,550MiB", "--card", "2GiB"],
        "1..64",
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let r = results(&dir);
    // A ceiling holds its size exactly; a 2 GiB card holds 2 GiB less the 500 MiB context.
    let want = [(10u64, 1000 * MIB), (5, 550 * MIB), (15, 2048 * MIB)];
    for (result, (largest, total)) in r.iter().zip(want) {
        assert_eq!(result["largest"], largest, "{result}");
        assert_eq!(result["smallest_failing"], largest + 1, "{result}");
        assert_eq!(result["peak"], largest * BLOCK, "{result}");
        assert_eq!(result["total"], total, "{result}");
        assert_eq!(result["error"], Value::Null, "{result}");
    }
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("LARGEST") && table.contains("2.00 GiB") && table.contains("libcudart"),
        "the table names who held the memory at the out-of-memory: {table}"
    );

    // A card too small for one block: no value fits, and the first one fails.
    let dir = scratch("fit-none");
    let o = fit_command(&dir, &["--card", "550MiB", "--jobs", "1"], "1..3")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let r = results(&dir);
    assert_eq!(r[0]["largest"], Value::Null, "{}", show(&o));
    assert_eq!(r[0]["smallest_failing"], 1, "{}", show(&o));
    assert_eq!(r[0]["trials"], 1, "{}", show(&o));
}

#[test]
fn a_crash_is_an_error_that_stops_the_search_not_an_out_of_memory() {
    let dir = scratch("fit-crash");
    // One at a time, so that no larger value is in flight when 10 crashes (1 and 2 fit, then 10,
    // the value the peaks predict, is confirmed).
    let o = fit_command(&dir, &["--limit", "1000MiB", "--jobs", "1"], "1..64")
        .env("CRASH_AT", "10")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("boom at 10"),
        "its stderr is shown: {stderr}"
    );
    let r = results(&dir);
    let error = r[0]["error"].as_str().expect("an error");
    assert!(
        error.contains("n=10") && error.contains("SIGABRT"),
        "{error}"
    );
    assert_eq!(
        r[0]["smallest_failing"],
        Value::Null,
        "never an OOM: {:?}",
        r[0]
    );
    assert_eq!(r[0]["largest"], 2);
}

/// The most trials that ran at once, from the trials' own `start`/`end` lines.
fn most_at_once(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).expect("the trials logged");
    let mut events: Vec<(u64, i32)> = text
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[2].parse().unwrap(), if w[0] == "start" { 1 } else { -1 })
        })
        .collect();
    // At the same instant an end comes before a start.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[test]
fn trials_side_by_side_never_hold_more_than_the_device_has_free() {
    // One device of 2.5 GiB, cards of 1 GiB: two trials at once, never three, however many jobs.
    let run = |name: &str, other_used: u64, nvml: Option<&str>| {
        let dir = scratch(name);
        let log = dir.join("trials.log");
        let mut command = fit_command(&dir, &["--card", "1GiB,1GiB,1GiB", "--jobs", "8"], "1..8");
        command
            .env("FAKECUDA_DEVICES", "1")
            .env("FAKECUDA_MEM_BYTES", (2560 * MIB).to_string())
            .env("FAKENVML_OTHER_USED", other_used.to_string())
            .env("FIT_LOG", &log)
            .env("FIT_HOLD_MS", "300");
        if let Some(nvml) = nvml {
            command.env("GPUMEMHOOK_NVML_LIB", nvml);
        }
        let o = command.output().unwrap();
        assert!(o.status.success(), "{}", show(&o));
        // 1 GiB less the 500 MiB context: 5 blocks.
        for r in results(&dir) {
            assert_eq!(r["largest"], 5, "{r}");
        }
        (
            most_at_once(&log),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (most, _) = run("fit-side", 0, None);
    assert_eq!(most, 2, "two 1 GiB cards fit in 2.5 GiB, three do not");
    // What others hold is not free: 1.5 GiB holds one card at a time.
    let (most, _) = run("fit-others", 1 << 30, None);
    assert_eq!(most, 1);
    // Without NVML the devices' memory is unknown: one at a time, and fit says so.
    let (most, stderr) = run("fit-no-nvml", 0, Some("none"));
    assert_eq!(most, 1);
    assert!(stderr.contains("one at a time"), "{stderr}");
}

fn trials(dir: &Path, options: &[&str]) -> Vec<(Value, u64)> {
    let o = fit_command(dir, options, "1..1000").output().unwrap();
    assert!(o.status.success(), "{}", show(&o));
    results(dir)
        .iter()
        .map(|r| (r["largest"].clone(), r["trials"].as_u64().unwrap()))
        .collect()
}

#[test]
fn what_one_target_learns_spares_trials_on_another() {
    let one = |limit: &str, name: &str| {
        trials(&scratch(name), &["--jobs", "1", "--limit", limit])[0].clone()
    };
    let small = one("550MiB", "fit-alone-small");
    let big = one("1000MiB", "fit-alone-big");
    assert_eq!((small.0.clone(), big.0.clone()), (5.into(), 10.into()));
    for (name, order) in [
        ("fit-small-first", ["550MiB,1000MiB", "small"]),
        ("fit-big-first", ["1000MiB,550MiB", "big"]),
    ] {
        let both = trials(&scratch(name), &["--jobs", "1", "--limit", order[0]]);
        let (first, second) = match order[1] {
            "small" => (&small, &big),
            _ => (&big, &small),
        };
        assert_eq!((&both[0].0, &both[1].0), (&first.0, &second.0));
        assert!(
            both[0].1 + both[1].1 < first.1 + second.1,
            "{name}: {both:?} against {first:?} and {second:?} alone"
        );
    }
}

#[test]
fn the_json_has_one_result_per_target_in_the_order_given_with_exactly_its_fields() {
    let dir = scratch("fit-json");
    let o = fit_command(
        &dir,
        &[
            "--limit", "550MiB", "--card", "t4,2GiB", "--limit", "1000MiB",
        ],
        "1..4",
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("fit.json")).unwrap()).unwrap();
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&json), ["param", "results"]);
    assert_eq!(json["param"], "n");
    let r = json["results"].as_array().unwrap();
    let cards: Vec<&str> = r.iter().map(|r| r["card"].as_str().unwrap()).collect();
    assert_eq!(
        cards,
        ["550.0 MiB ceiling", "t4", "2.00 GiB", "1000.0 MiB ceiling"]
    );
    for result in r {
        assert_eq!(
            keys(result),
            [
                "bound_by_device",
                "card",
                "error",
                "largest",
                "peak",
                "smallest_failing",
                "stopped",
                "total",
                "trials"
            ]
        );
    }
    assert_eq!(r[1]["total"], 15360 * MIB);
    // A T4 holds all four blocks: the top of the range, nothing failing.
    assert_eq!(
        (r[1]["largest"].clone(), r[1]["smallest_failing"].clone()),
        (4.into(), Value::Null)
    );
}

#[test]
fn bad_input_is_refused_in_one_line_with_exit_status_2() {
    let dir = scratch("fit-bad");
    let prog = program(&dir);
    let prog = prog.to_str().unwrap();
    let python = python().to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &[
                "--card", "t4", "--param", "n=8..2", "--", python, prog, "{n}",
            ],
            "reversed",
        ),
        (
            &["--card", "t4", "--param", "n=..", "--", python, prog, "{n}"],
            "empty",
        ),
        (
            &["--card", "t4", "--param", "n=1..4", "--", python, prog, "4"],
            "{n}",
        ),
        (
            &[
                "--card", "t5", "--param", "n=1..4", "--", python, prog, "{n}",
            ],
            "--card",
        ),
        (
            &[
                "--limit", "lots", "--param", "n=1..4", "--", python, prog, "{n}",
            ],
            "--limit",
        ),
        (
            &["--param", "n=1..4", "--", python, prog, "{n}"],
            "no target",
        ),
    ];
    for (args, said) in cases {
        let mut all = vec!["fit"];
        all.extend_from_slice(args);
        let o = cli(&dir, &all).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", show(&o));
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
}

#[test]
fn a_launcher_template_starts_every_trial_with_its_environment() {
    let dir = scratch("fit-launcher");
    let log = dir.join("trials.log");
    // A stand-in scheduler: it adds a variable of its own, then runs the trial's line.
    let o = fit_command(
        &dir,
        &[
            "--limit",
            "550MiB",
            "--launcher",
            "env FIT_LAUNCHED=yes {cmd}",
        ],
        "1..64",
    )
    .env("FIT_LOG", &log)
    .env("GPUMEMHOOK_LIMIT_0", "1MiB")
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(
        results(&dir)[0]["largest"],
        5,
        "the hook and ceiling reached the trials"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines().all(|l| l.ends_with(" yes")),
        "every trial went through the launcher: {text}"
    );
    // The reports went to a directory under the current one, removed after each trial.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".gpumemhook-fit")
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// With argv[1] = N (unused): allocates 1 MiB, starts `sleep 300` (in its own process group), logs
/// `trial PID PGID SLEEP_PID` to $FIT_LOG, and sleeps; with $IGNORE_TERM set it ignores SIGTERM (its `sleep` does
/// not).
const HANGS: &str = r#"
import ctypes, os, signal, subprocess, sys, time
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
# One allocation, so that the trial's memory group exists when fit is stopped.
block = ctypes.c_void_p()
assert ctypes.CDLL("libcudart.so.13").cudaMalloc(ctypes.byref(block), ctypes.c_size_t(1 << 20)) == 0
sleeper = subprocess.Popen(["sleep", "300"])
with open(os.environ["FIT_LOG"], "a") as f:
    f.write(f"trial {os.getpid()} {os.getpgid(0)} {sleeper.pid}\n")
time.sleep(300)
"#;

/// `gpumemhook fit --limit 1000MiB OPTIONS --param n=1..8 --json fit.json -- python hangs.py {n}`
/// in `dir`, its temporary directory `dir/tmp`, its stdout and stderr in `dir/stdout`, `dir/stderr`.
fn hanging_fit(dir: &Path, options: &[&str]) -> Command {
    let prog = dir.join("hangs.py");
    std::fs::write(&prog, HANGS).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let mut args = vec!["fit", "--limit", "1000MiB"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--param", "n=1..8", "--json", "fit.json", "--"]);
    args.extend_from_slice(&[python().to_str().unwrap(), prog.to_str().unwrap(), "{n}"]);
    let mut command = cli(dir, &args);
    command
        .env("TMPDIR", dir.join("tmp"))
        .env("FIT_LOG", dir.join("trials.log"))
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
    command
}

/// The child's status once it ends; past `limit` it is killed and the test fails.
fn ends_within(child: &mut Child, limit: Duration, dir: &Path) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fit did not end within {limit:?}:\n{}", said(dir));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What fit printed (run by [`hanging_fit`]).
fn said(dir: &Path) -> String {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    format!("stdout:\n{}\nstderr:\n{}", read("stdout"), read("stderr"))
}

/// The `(pid, process group, its sleep's pid)` of the first `count` trials, once they have logged.
fn running_trials(dir: &Path, count: usize) -> Vec<(i32, i32, i32)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(dir.join("trials.log")).unwrap_or_default();
        let trials: Vec<(i32, i32, i32)> = text
            .lines()
            .map(|l| {
                let w: Vec<i32> = l
                    .split_whitespace()
                    .skip(1)
                    .map(|n| n.parse().unwrap())
                    .collect();
                (w[0], w[1], w[2])
            })
            .collect();
        if trials.len() >= count {
            return trials;
        }
        assert!(
            Instant::now() < deadline,
            "no {count} trials started: {}",
            said(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The trials' memory group files in `dir/shm` (`gpumemhook-group-<uid>-fit-<pid>-<trial>`).
fn trial_groups(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("shm"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("gpumemhook-group-") && name.contains("-fit-"))
        .collect()
}

/// No process is left of any trial's group (not even a zombie), nor its `sleep`, no
/// `.gpumemhook-fit-*` directory (in `dir/tmp`, or `dir` itself for a launcher's trials), and no
/// trial's memory group file.
fn nothing_left(dir: &Path, trials: &[(i32, i32, i32)]) {
    let gone = |pid: i32| {
        // SAFETY: signal 0 only asks whether the process or group exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    };
    for (pid, group, sleeper) in trials {
        assert!(gone(*pid), "the trial {pid} is left: {}", said(dir));
        assert!(
            gone(-group),
            "the group {group} of a trial is left: {}",
            said(dir)
        );
        assert!(gone(*sleeper), "the sleep {sleeper} of a trial is left");
    }
    for within in [dir.to_path_buf(), dir.join("tmp")] {
        let left: Vec<_> = std::fs::read_dir(&within)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .filter(|name| name.to_string_lossy().starts_with(".gpumemhook-fit"))
            .collect();
        assert!(left.is_empty(), "{left:?} in {}", within.display());
    }
    let groups = trial_groups(dir);
    assert!(groups.is_empty(), "trials' memory groups left: {groups:?}");
    let uid = gpumemhook_reader::current_uid();
    for (pid, _, _) in trials {
        let segment = dir.join("shm").join(format!("gpumemhook-{uid}-{pid}"));
        assert!(!segment.exists(), "the segment of the trial {pid} is left");
    }
}

/// A trial that starts a daemon (`setsid`: a session and process group of its own, outside the
/// trial's) leaves nothing running once `fit` returns: `fit` is the subreaper of what its trials
/// orphan, and ends every process that carries the trial's memory group.
#[test]
fn a_trials_daemon_is_gone_when_fit_returns() {
    let dir = scratch("fit-daemon");
    let daemons = dir.join("daemons");
    let o = fit_command(&dir, &["--limit", "1000MiB"], "1..4")
        .env("FIT_DAEMONS", &daemons)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let pids: Vec<i32> = std::fs::read_to_string(&daemons)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(!pids.is_empty());
    for pid in pids {
        // SAFETY: signal 0 only asks whether the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        let gone = r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        assert!(gone, "the daemon {pid} of a trial is left running");
    }
}

#[test]
fn a_signal_to_fit_ends_every_trials_process_group_and_removes_its_directories() {
    // SIGHUP takes the same path as SIGTERM and SIGINT; a trial that ignores SIGTERM is killed
    // after the grace of 5 s; under a launcher the signal goes to the launcher's group (here the
    // shell that runs the trial's line and waits for it), which the trial is in.
    let launcher: &[&str] = &["--launcher", "{cmd}; exit $?"];
    let cases: [(&str, i32, bool, &[&str]); 4] = [
        ("fit-sigterm", libc::SIGTERM, false, &[]),
        ("fit-sigint", libc::SIGINT, false, &[]),
        ("fit-sigterm-ignored", libc::SIGTERM, true, &[]),
        ("fit-sigterm-launcher", libc::SIGTERM, false, launcher),
    ];
    for (name, signal, ignore, options) in cases {
        let dir = scratch(name);
        let mut all = vec!["--jobs", "2"];
        all.extend_from_slice(options);
        let mut command = hanging_fit(&dir, &all);
        if ignore {
            command.env("IGNORE_TERM", "1");
        }
        let mut fit = command.spawn().unwrap();
        let trials = running_trials(&dir, 2);
        for (pid, group, _) in &trials {
            match options.is_empty() {
                true => assert_eq!(pid, group, "{name}: each trial leads a group of its own"),
                false => assert_ne!(pid, group, "{name}: the launcher leads the trial's group"),
            }
        }
        assert_eq!(
            trial_groups(&dir).len(),
            2,
            "{name}: each running trial is a memory group of its own"
        );
        // SAFETY: kill(2) of the fit process this test started.
        unsafe { libc::kill(fit.id() as i32, signal) };
        let status = ends_within(&mut fit, Duration::from_secs(20), &dir);
        assert_eq!(status.code(), Some(128 + signal), "{name}: {}", said(&dir));
        assert_eq!(trials.len(), 2, "{name}: no trial started after the signal");
        nothing_left(&dir, &trials);
        assert!(
            said(&dir).contains("stopped (2 trials were running, none is left)"),
            "{name}: {}",
            said(&dir)
        );
    }
}

#[test]
fn a_trial_past_its_time_limit_is_ended_as_timed_out_an_error_not_an_out_of_memory() {
    let dir = scratch("fit-timeout");
    let mut fit = hanging_fit(&dir, &["--jobs", "1", "--trial-timeout", "1s"])
        .spawn()
        .unwrap();
    let status = ends_within(&mut fit, Duration::from_secs(20), &dir);
    assert_eq!(status.code(), Some(1), "{}", said(&dir));
    nothing_left(&dir, &running_trials(&dir, 1));
    let r = results(&dir);
    let error = r[0]["error"].as_str().expect("an error");
    assert!(error.contains("n=1: timed out"), "{error}");
    assert_eq!(
        r[0]["smallest_failing"],
        Value::Null,
        "not an OOM: {:?}",
        r[0]
    );
    assert_eq!(r[0]["largest"], Value::Null);
    assert_eq!(r[0]["trials"], 1);
    let table = std::fs::read_to_string(dir.join("stdout")).unwrap();
    let row = table
        .lines()
        .find(|l| l.contains("ceiling"))
        .unwrap_or_default();
    assert!(row.contains("timed out"), "{table}");

    let bad = cli(
        &dir,
        &[
            "fit",
            "--limit",
            "1GiB",
            "--trial-timeout",
            "soon",
            "--param",
            "n=1..2",
            "--",
            "true",
            "{n}",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", show(&bad));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--trial-timeout"),
        "{}",
        show(&bad)
    );
}

/// Writes 200 MiB to stderr without a newline, then one line, and exits 3.
const FLOODS: &str = r#"
import sys
chunk = b"=" * (1 << 20)
for _ in range(200):
    sys.stderr.buffer.write(chunk)
sys.stderr.buffer.write(b" done\nthe last line\n")
sys.exit(3)
"#;

#[test]
fn a_trials_endless_stderr_keeps_fit_small_and_its_tail_short() {
    let dir = scratch("fit-flood");
    let prog = dir.join("floods.py");
    std::fs::write(&prog, FLOODS).unwrap();
    let stderr = dir.join("stderr");
    let command = cli(
        &dir,
        &[
            "fit",
            "--limit",
            "1000MiB",
            "--jobs",
            "1",
            "--param",
            "n=1..8",
            "--",
            python().to_str().unwrap(),
            prog.to_str().unwrap(),
            "{n}",
        ],
    );
    let rss = stderr.with_extension("rss");
    let status = gpumemhook_tests::measured(&command, 600, &rss)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .status()
        .unwrap();
    let max_rss_kib = gpumemhook_tests::measured_rss(&rss);
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert!(status.code() == Some(1), "{status}: {said:.2000}");
    assert!(max_rss_kib < 100 * 1024, "fit grew to {max_rss_kib} KiB");
    assert!(said.len() < 64 * 1024, "fit printed {} bytes", said.len());
    assert!(
        said.contains("exit status 3") && said.contains("the last line"),
        "{said:.2000}"
    );
    assert!(said.contains("… [cut 200.0 MiB] …"), "{said:.2000}");
}

/// Runs fit over three targets (two ceilings, a card) on `curve` with `--search how`; returns its
/// output and JSON results.
fn fit_curve(curve: &str, how: &str) -> (Output, Vec<Value>) {
    let dir = scratch(&format!("fit-curve-{curve}-{how}"));
    let options = [
        "--limit",
        "1000MiB,550MiB",
        "--card",
        "2GiB",
        "--search",
        how,
    ];
    let o = fit_command(&dir, &options, "1..200")
        .env("FIT_CURVE", curve)
        .output()
        .unwrap();
    let r = match dir.join("fit.json").exists() {
        true => results(&dir),
        false => Vec::new(),
    };
    (o, r)
}

#[test]
fn the_peaks_give_bisections_answers_and_peaks_in_fewer_trials_on_every_curve() {
    let trials = |r: &[Value]| r.iter().map(|r| r["trials"].as_u64().unwrap()).sum::<u64>();
    for curve in ["affine", "convex", "step"] {
        let (peaks_said, peaks) = fit_curve(curve, "peaks");
        let (bisect_said, bisect) = fit_curve(curve, "bisection");
        assert!(
            peaks_said.status.success(),
            "{curve}: {}",
            show(&peaks_said)
        );
        assert!(
            bisect_said.status.success(),
            "{curve}: {}",
            show(&bisect_said)
        );
        for (p, b) in peaks.iter().zip(&bisect) {
            for key in ["largest", "peak", "smallest_failing"] {
                assert_eq!(p[key], b[key], "{curve} {key}: {p} against {b}");
            }
        }
        assert!(
            trials(&peaks) <= trials(&bisect),
            "{curve}: {peaks:?} {bisect:?}"
        );
        if curve == "affine" {
            // The stand-in's own curve: 10, 5 and 15 blocks, with their exact peaks.
            let largest: Vec<&Value> = peaks.iter().map(|r| &r["largest"]).collect();
            assert_eq!(largest, [10, 5, 15], "{}", show(&peaks_said));
            assert_eq!(peaks[2]["peak"], 15 * BLOCK);
            let stopped = peaks
                .iter()
                .map(|r| r["stopped"].as_u64().unwrap())
                .sum::<u64>();
            assert!(trials(&peaks) + stopped <= 12, "{}", show(&peaks_said));
            let table = String::from_utf8_lossy(&peaks_said.stdout);
            let closing = match stopped {
                0 => format!("trials: {} in", trials(&peaks)),
                n => format!("trials: {} (+{n} stopped) in", trials(&peaks)),
            };
            assert!(table.contains(&closing), "{table}");
        }
    }
}

#[test]
fn a_peak_that_shrinks_as_the_value_grows_is_an_error_naming_both_values_and_peaks() {
    for how in ["peaks", "bisection"] {
        let (o, r) = fit_curve("dip", how);
        assert_eq!(o.status.code(), Some(1), "{how}: {}", show(&o));
        for result in &r {
            let error = result["error"].as_str().unwrap_or_default();
            assert!(
                error.contains("n=1 peaks at 100.0 MiB but n=2 at 50.00 MiB"),
                "{how}: {result}"
            );
        }
    }
}

#[test]
fn a_program_that_allocates_no_gpu_memory_is_an_error_never_a_fit() {
    let dir = scratch("fit-cpu");
    let o = cli(
        &dir,
        &[
            "fit",
            "--card",
            "t4",
            "--jobs",
            "1",
            "--param",
            "n=1..8",
            "--json",
            "fit.json",
            "--",
            python().to_str().unwrap(),
            "-c",
            "print({n})",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let said = "n=1: the program allocated no GPU memory (is it running on the CPU?)";
    let r = results(&dir);
    assert_eq!(r[0]["error"], said, "{}", show(&o));
    // One sentence: "the search stopped at n=1: the program allocated ...".
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("the search stopped at {said}")),
        "{}",
        show(&o)
    );
    assert_eq!(
        (r[0]["largest"].clone(), r[0]["trials"].clone()),
        (Value::Null, 1.into())
    );
    let table = String::from_utf8_lossy(&o.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("t4"))
        .unwrap_or_default();
    assert!(row.contains("error"), "{table}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(said),
        "{}",
        show(&o)
    );
}

#[test]
fn a_target_larger_than_the_device_is_marked_device_bound_in_the_table_and_the_json() {
    // One device of 2.5 GiB: a T4's 15 GiB runs out on the device past 25 blocks (the stand-in
    // driver keeps the context apart from its memory), a lower bound; a 550 MiB ceiling fits it.
    let dir = scratch("fit-device-bound");
    let o = fit_command(&dir, &["--card", "t4", "--limit", "550MiB"], "1..64")
        .env("FAKECUDA_DEVICES", "1")
        .env("FAKECUDA_MEM_BYTES", (2560 * MIB).to_string())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let r = results(&dir);
    assert_eq!(
        (r[0]["largest"].clone(), r[0]["bound_by_device"].clone()),
        (25.into(), true.into())
    );
    assert_eq!(
        (r[1]["largest"].clone(), r[1]["bound_by_device"].clone()),
        (5.into(), false.into())
    );
    let table = String::from_utf8_lossy(&o.stdout);
    let row = |label: &str| {
        table
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_default()
    };
    assert!(row("t4").contains("≥ 25 (device-bound)"), "{table}");
    assert!(!row("550").contains("device-bound"), "{table}");
}

#[test]
fn a_speculative_trial_is_ended_once_moot_and_counted_apart() {
    // Five at once: 1, 2, 4, 8 and 16 (which first sleeps a minute). 8 runs out at once, which
    // makes 16 moot while 1, 2 and 4 still hold their memory: its group is ended then.
    let dir = scratch("fit-moot");
    let log = dir.join("trials.log");
    let mut fit = fit_command(&dir, &["--limit", "550MiB", "--jobs", "5"], "1..200")
        .env("FIT_LOG", &log)
        .env("FIT_HOLD_MS", "3000")
        .env("FIT_SLOW_FROM", "16")
        .env("FIT_AFTER_START", "16")
        .env("FAKECUDA_MEM_BYTES", (64u64 << 30).to_string())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let slow = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let started = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>());
        if let Some(w) = started.clone().find(|w| w[0] == "start" && w[3] == "16") {
            break w[1].parse::<i32>().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "16 never started: {}",
            said(&dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let gone = |pid: i32| {
        // SAFETY: signal 0 only asks whether the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    };
    while !gone(slow) {
        assert!(
            Instant::now() < deadline,
            "16 was not ended: {}",
            said(&dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        fit.try_wait().unwrap().is_none(),
        "the search was still going when 16 was ended: {}",
        said(&dir)
    );
    let status = ends_within(&mut fit, Duration::from_secs(60), &dir);
    assert!(status.success(), "{}", said(&dir));
    let r = results(&dir);
    // 16 at least was stopped; so may be others that a later outcome made moot.
    assert_eq!(r[0]["largest"], 5);
    let (trials, stopped) = (
        r[0]["trials"].as_u64().unwrap(),
        r[0]["stopped"].as_u64().unwrap(),
    );
    assert!(stopped >= 1, "{}", said(&dir));
    let closing = format!("trials: {trials} (+{stopped} stopped) in");
    assert!(said(&dir).contains(&closing), "{}", said(&dir));
}

#[test]
fn the_live_line_shows_each_targets_bracket_the_prediction_confirmed_and_the_time_left() {
    // fit draws its progress line only on a terminal: `script` gives it one.
    let dir = scratch("fit-live");
    let fit = fit_command(&dir, &["--limit", "1000MiB", "--jobs", "1"], "1..200");
    let line: Vec<String> = std::iter::once(fit.get_program())
        .chain(fit.get_args())
        .map(|a| format!("'{}'", a.to_str().unwrap().replace('\'', r"'\''")))
        .collect();
    let mut command = Command::new("script");
    command
        .args(["-qfec", &line.join(" "), "/dev/null"])
        .current_dir(&dir)
        .env("FIT_HOLD_MS", "600")
        .stdin(Stdio::null());
    for (key, value) in fit.get_envs() {
        match value {
            Some(v) => command.env(key, v),
            None => command.env_remove(key),
        };
    }
    let o = command.output().expect("script (util-linux) runs");
    assert!(o.status.success(), "{}", show(&o));
    let screen = String::from_utf8_lossy(&o.stdout);
    for shown in [
        "1000.0 MiB ceiling: 1..? ",
        "1000.0 MiB ceiling: 2..? confirming 10",
        "left ·",
    ] {
        assert!(screen.contains(shown), "{shown:?} not in: {screen}");
    }
    assert_eq!(results(&dir)[0]["largest"], 10);
}

/// `halves.sh one N` allocates N × 100 MiB in one `simrun`; `halves.sh two N` starts two `simrun`s
/// that allocate half of it each and hold it until both have allocated (or one was refused), and
/// exits 0 only when both did.
const HALVES: &str = r#"
bytes=$(($2 * 104857600))
case $1 in
one) exec "$SIMRUN" rt.malloc:a:$bytes ;;
two)
    meet=$(mktemp -d)
    half=$((bytes / 2))
    ( "$SIMRUN" rt.malloc:a:$half touch:$meet/a wait:$meet/b; s=$?; touch $meet/a; exit $s ) &
    a=$!
    ( "$SIMRUN" rt.malloc:b:$half touch:$meet/b wait:$meet/a; s=$?; touch $meet/b; exit $s ) &
    b=$!
    wait $a; sa=$?
    wait $b; sb=$?
    rm -rf "$meet"
    [ $sa = 0 ] && [ $sb = 0 ] ;;
esac
"#;

/// `fit` of `halves.sh HOW {n}` under two ceilings and on a card (no context: two processes' own
/// contexts would rightly take more of the card than one's), n in 1..64, run in `dir`.
fn fit_halves(how: &str) -> (PathBuf, Vec<Value>, String) {
    let dir = scratch(&format!("fit-halves-{how}"));
    let script = dir.join("halves.sh");
    std::fs::write(&script, HALVES).unwrap();
    let o = cli(
        &dir,
        &[
            "fit",
            "--limit",
            "1000MiB,550MiB",
            "--card",
            "2GiB",
            "--param",
            "n=1..64",
            "--json",
            "fit.json",
            "--",
            "sh",
            script.to_str().unwrap(),
            how,
            "{n}",
        ],
    )
    .env("SIMRUN", gpumemhook_tests::sim_dir().join("simrun"))
    .env("FAKECUDA_CONTEXT_BYTES", "0")
    .env("TMPDIR", &dir)
    .output()
    .unwrap();
    assert!(o.status.success(), "{how}: {}", show(&o));
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    (dir.clone(), results(&dir), table)
}

#[test]
fn two_processes_with_half_each_fit_as_one_process_with_all_of_it() {
    let (_, one, _) = fit_halves("one");
    let (dir, two, table) = fit_halves("two");
    // Each trial is one memory group: the two processes share the ceiling or the card, and the
    // trial's peak is their joint peak, so the answers are the single process's, exactly.
    for ((one, two), largest) in one.iter().zip(&two).zip([10u64, 5, 20]) {
        assert_eq!(one["largest"], largest, "{one}");
        assert_eq!(one["peak"], largest * BLOCK, "{one}");
        for field in ["card", "largest", "peak", "smallest_failing", "error"] {
            assert_eq!(one[field], two[field], "{field}: one {one}, two {two}");
        }
    }
    // At the out-of-memory, the refused process held nothing: its partner held the memory.
    assert!(
        table.contains("1 other process 550.0 MiB"),
        "the other process is named among the holders: {table}"
    );
    let groups = trial_groups(&dir);
    assert!(groups.is_empty(), "trials' memory groups left: {groups:?}");
}

/// Another user (here the same, with a directory no member may trust) can make something at the
/// name `fit` gave its first trial's memory group before (`fit-<pid>-1`: `sh` `exec`s into `fit`,
/// keeping its pid): the names now end in a random token, so `fit` runs as if it were not there,
/// and judges the trials by their groups' peaks.
#[test]
fn a_trials_group_name_cannot_be_taken_before_fit_makes_it() {
    let dir = scratch("fit-group-taken");
    let inner = fit_command(&dir, &["--limit", "1000MiB"], "1..4");
    let uid = gpumemhook_reader::current_uid();
    let script = format!("mkdir \"shm/gpumemhook-group-{uid}-fit-$$-1\" && exec \"$@\"");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(inner.get_program())
        .args(inner.get_args())
        .current_dir(&dir);
    for (key, value) in inner.get_envs() {
        match value {
            Some(v) => command.env(key, v),
            None => command.env_remove(key),
        };
    }
    let o = command.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("cannot make the memory group"),
        "{}",
        show(&o)
    );
    let planted = trial_groups(&dir);
    assert_eq!(
        planted.len(),
        1,
        "only the planted directory is left: {planted:?}"
    );
}

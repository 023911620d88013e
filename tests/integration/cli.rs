//! Tests of the `gpumemhook` command, each subcommand run as a user would run it, over programs
//! of the simulated CUDA stack: `run` (summary, exit status, signals, reports, ceiling, timelines,
//! finding its library), `ls` and `top --once` on live processes with exact figures, `limit` and
//! `reset-peak` changing a live process, `report`, and `plot` drawing real images.

use gpumemhook_reader::EventKind;
use gpumemhook_reader::MemKind;
use gpumemhook_reader::{current_uid, segment_path};
use gpumemhook_reader::{Process, Snapshot};
use gpumemhook_tests::{cli, cli_at, cli_bin, hook_lib, scratch, sim_dir, wait_for, Run};
use gpumemhook_timeline::{read_chrome_trace, write_chrome_trace, Event, Timeline};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

fn simrun() -> String {
    sim_dir().join("simrun").display().to_string()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `gpumemhook ARGS` in `dir`; returns its output.
fn gmh(dir: &Path, args: &[&str]) -> Output {
    cli(dir, args).output().expect("gpumemhook runs")
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    )
}

fn read_report(path: &Path) -> Snapshot {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// A simulated program held alive under the hook until the test lets it go.
struct Held {
    child: Child,
    dir: PathBuf,
}

impl Held {
    /// Runs `before`, signals it is ready, waits for `go`, then runs `after`.
    fn start(before: &[&str], after: &[&str]) -> Held {
        Held::start_with(Run::sim("simrun", &[]), before, after)
    }

    /// [`Held::start`] of `run` (a `simrun` without operations, its environment set).
    fn start_with(run: Run, before: &[&str], after: &[&str]) -> Held {
        // The CLI built first: a build under load can outlast the program's wait for `go`.
        gpumemhook_tests::cli_bin();
        let dir = run.dir().to_path_buf();
        let ready = format!("touch:{}", dir.join("ready").display());
        let go = format!("wait:{}", dir.join("go").display());
        let mut ops: Vec<&str> = before.to_vec();
        ops.push(&ready);
        ops.push(&go);
        ops.extend_from_slice(after);
        let (mut command, _) = run.into_command();
        command
            .args(&ops)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = command.spawn().expect("simrun starts");
        wait_for(&dir.join("ready"));
        Held { child, dir }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets the program finish; returns its exit report.
    fn finish(self) -> Snapshot {
        let pid = self.pid();
        std::fs::write(self.dir.join("go"), "").expect("go file");
        let out = self.child.wait_with_output().expect("simrun ends");
        assert!(out.status.success(), "{}", show(&out));
        read_report(&self.dir.join(format!("report.{pid}.json")))
    }
}

#[test]
fn run_summarises_and_passes_the_exit_status_through() {
    let dir = scratch("cli-run");
    let sim = simrun();
    let o = gmh(
        &dir,
        &[
            "run",
            "--",
            &sim,
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:3000",
            "rt.malloc:b:5000",
            "rt.free:a",
            "drv.ctx:1",
            "drv.alloc:c:700",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("exit status 0"), "{err}");
    assert!(err.contains("1 process used the GPU"), "{err}");
    // Device 0: peak 8000 B (7.81 KiB), 5000 B (4.88 KiB) at exit, 2 allocations, 1 free.
    let row0 = err
        .lines()
        .find(|l| l.trim_start().starts_with("0 "))
        .unwrap_or_else(|| panic!("no device 0 row:\n{err}"));
    let words: Vec<&str> = row0.split_whitespace().collect();
    assert_eq!(
        words,
        ["0", "7.81", "KiB", "4.88", "KiB", "-", "2", "1", "0", "0"],
        "{err}"
    );
    assert!(err.contains("700 B"), "{err}");
    // No escape codes when stderr is not a terminal.
    assert!(!err.contains('\x1b'), "{err:?}");
    // The program's own output is untouched on stdout.
    assert!(text(&o.stdout).is_empty() || !text(&o.stdout).contains("DEVICE"));

    let o = gmh(&dir, &["run", "--", &sim, "rt.malloc:a:10", "rt.free:a=2"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("exit status 1"), "{}", show(&o));

    let o = gmh(
        &dir,
        &["--color", "always", "run", "--", &sim, "rt.malloc:a:10"],
    );
    assert!(text(&o.stderr).contains("\x1b["), "{}", show(&o));

    // A program that never touches CUDA: no report, said plainly.
    let o = gmh(&dir, &["run", "--", "/bin/echo", "hello"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(text(&o.stdout), "hello\n");
    assert!(
        text(&o.stderr).contains("no process used the GPU"),
        "{}",
        show(&o)
    );

    let o = gmh(&dir, &["run", "--", "no-such-program-here"]);
    assert_eq!(o.status.code(), Some(127), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("command not found"),
        "{}",
        show(&o)
    );
}

#[test]
fn run_limit_and_report() {
    let dir = scratch("cli-limit");
    let report = dir.join("mem.json");
    let o = gmh(
        &dir,
        &[
            "run",
            "--limit",
            "1000B",
            "--report",
            report.to_str().unwrap(),
            "--",
            &simrun(),
            "rt.malloc:a:600",
            "rt.malloc:b:600=2",
            "rt.free:a",
            "rt.malloc:c:900",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let r = read_report(&report);
    let d = r.device(0);
    assert_eq!(
        (d.used, d.peak, d.limit, d.allocs, d.frees, d.denied),
        (900, 900, Some(1000), 2, 1, 1)
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("1 allocation was refused by the ceiling"),
        "{err}"
    );
    assert!(err.contains("ceiling: 1000 B per device"), "{err}");
    assert!(
        err.contains(&format!("report: {}", report.display())),
        "{err}"
    );

    // A bad size is refused before anything runs, with exit status 2.
    let marker = dir.join("ran");
    let touch = format!("touch:{}", marker.display());
    for bad in ["lots", "0", "-1G", "8 parsecs"] {
        let o = gmh(&dir, &["run", "--limit", bad, "--", &simrun(), &touch]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", show(&o));
        assert!(text(&o.stderr).contains("--limit"), "{}", show(&o));
        assert!(text(&o.stderr).contains("examples"), "{}", show(&o));
        assert!(!marker.exists(), "the command ran despite --limit {bad}");
    }
}

#[test]
fn run_summarises_every_process_and_keeps_one_report_each() {
    let dir = scratch("cli-fork");
    // The stand-in driver refuses every call in a forked child, as the real one does; this test is
    // about the summary of two processes, so the child is let through.
    let o = cli(
        &dir,
        &[
            "run",
            "--report",
            "rep.%p.json",
            "--",
            &simrun(),
            "rt.malloc:a:100",
            "fork",
            "rt.malloc:b:200",
            "endfork",
        ],
    )
    .env("FAKECUDA_FORK_OK", "1")
    .output()
    .expect("gpumemhook runs");
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("2 processes used the GPU"), "{err}");
    assert_eq!(err.matches("DEVICE").count(), 2, "{err}");
    let reports: Vec<Snapshot> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            p.file_name()?
                .to_str()?
                .starts_with("rep.")
                .then(|| read_report(&p))
        })
        .collect();
    assert_eq!(reports.len(), 2, "{err}");
    let mut peaks: Vec<u64> = reports.iter().map(|r| r.device(0).peak).collect();
    peaks.sort();
    assert_eq!(peaks, [100, 200]);
}

#[test]
fn run_forwards_signals_and_reads_a_killed_process_from_its_segment() {
    let dir = scratch("cli-signal");
    let ready = dir.join("ready");
    let mut child = cli(
        &dir,
        &[
            "run",
            "--",
            &simrun(),
            "rt.malloc:a:4096",
            &format!("touch:{}", ready.display()),
            &format!("wait:{}", dir.join("never").display()),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("gpumemhook runs");
    wait_for(&ready);
    // SAFETY: kill(2) takes plain integers; the pid is our own child's, not yet waited for, so it
    // cannot name another process.
    let killed = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(killed, 0);
    let o = child_output(&mut child);
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("killed by signal 15 (SIGTERM)"), "{err}");
    // The hook had no chance to write a report; the summary comes from the segment, exact.
    assert!(err.contains("read from its segment"), "{err}");
    assert!(err.contains("4.00 KiB"), "{err}");
    assert!(
        std::fs::read_dir(dir.join("shm")).unwrap().next().is_none(),
        "the dead process's segment is cleaned up"
    );
}

fn child_output(child: &mut Child) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "gpumemhook did not end"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    if let Some(mut s) = child.stdout.take() {
        s.read_to_string(&mut out).unwrap();
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_string(&mut err).unwrap();
    }
    Output {
        status: child.wait().unwrap(),
        stdout: out.into_bytes(),
        stderr: err.into_bytes(),
    }
}

#[test]
fn run_finds_its_library_beside_itself_in_python_or_says_where_it_looked() {
    let dir = scratch("cli-lib");
    let sim = simrun();
    // Beside the executable: a copy of the command next to a copy of the library.
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::copy(cli_bin(), bin_dir.join("gpumemhook")).unwrap();
    let fakepy = dir.join("fakepy");
    let beside = |with_lib: bool| {
        let lib = bin_dir.join("libgpumemhook.so");
        if with_lib {
            std::fs::copy(hook_lib(), &lib).unwrap();
        } else {
            let _ = std::fs::remove_file(&lib);
        }
        // A file just written can be "busy" for exec while another test thread's fork still holds
        // a copy of its descriptor (until that child's exec): try again shortly.
        let mut tries = 0;
        loop {
            let out = cli_at(
                &bin_dir.join("gpumemhook"),
                &dir,
                &["run", "--", &sim, "rt.malloc:a:64"],
            )
            .env_remove("GPUMEMHOOK_LIB")
            .env("PATH", format!("{}:/usr/bin:/bin", fakepy.display()))
            .output();
            match out {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => break other.unwrap(),
            }
        }
    };
    // A python3 without the package, first on PATH.
    std::fs::create_dir_all(&fakepy).unwrap();
    let write_python = |script: &str| {
        let p = fakepy.join("python3");
        std::fs::write(&p, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write_python(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'gpumemhook'\" >&2\nexit 1\n",
    );

    let o = beside(true);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(text(&o.stderr).contains("64 B"), "{}", show(&o));

    let o = beside(false);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("cannot find libgpumemhook.so; tried:"),
        "{err}"
    );
    assert!(
        err.contains(&bin_dir.join("libgpumemhook.so").display().to_string()),
        "{err}"
    );
    assert!(err.contains("No module named 'gpumemhook'"), "{err}");
    assert!(err.contains("--lib"), "{err}");

    // The Python package names the library.
    write_python(&format!("#!/bin/sh\necho {}\n", hook_lib().display()));
    let o = beside(false);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(text(&o.stderr).contains("64 B"), "{}", show(&o));

    // An explicit path that is wrong is an error, not a fallback.
    let o = gmh(
        &dir,
        &["run", "--lib", "/nonexistent/libgpumemhook.so", "--", &sim],
    );
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("/nonexistent/libgpumemhook.so"),
        "{}",
        show(&o)
    );

    // A file that is not the hook, named by --lib or by $GPUMEMHOOK_LIB, is refused alike before
    // anything runs (the dynamic linker would only warn and run the program uncounted).
    let ran = dir.join("ran");
    let touch = format!("touch:{}", ran.display());
    let o = gmh(&dir, &["run", "--lib", "/etc/passwd", "--", &sim, &touch]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("--lib names /etc/passwd, which is not the gpumemhook library"),
        "{}",
        show(&o)
    );
    let probe = sim_dir().join("libnextprobe.so");
    let o = cli(&dir, &["run", "--", &sim, &touch])
        .env("GPUMEMHOOK_LIB", &probe)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("$GPUMEMHOOK_LIB names")
            && text(&o.stderr).contains("without gpumemhook's symbols"),
        "{}",
        show(&o)
    );
    let o = cli(&dir, &["run", "--", &sim, &touch])
        .env("GPUMEMHOOK_LIB", "/etc/passwd")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("not an ELF"), "{}", show(&o));
    assert!(!ran.exists(), "the program ran with a wrong library");

    // LD_PRELOAD already set is kept (the probe library still sees its calls).
    let o = cli(&dir, &["run", "--", &sim, "rt.malloc:a:64"])
        .env("LD_PRELOAD", &probe)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("nextprobe calls=1"),
        "{}",
        show(&o)
    );
    assert!(text(&o.stderr).contains("64 B"), "{}", show(&o));
}

/// The figures of `pid` in `ls --json` output (a list, or an object with "processes").
fn listed(json: &str, pid: u32) -> Value {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let list = v
        .as_array()
        .or_else(|| v.get("processes").and_then(Value::as_array))
        .expect("a list of processes")
        .clone();
    list.into_iter()
        .find(|p| p["pid"].as_u64() == Some(pid as u64))
        .unwrap_or_else(|| panic!("pid {pid} not in {json}"))
}

#[test]
fn ls_top_limit_and_reset_peak_on_a_live_process() {
    let held = Held::start(
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:1048576",
            "rt.malloc:b:3145728",
            "rt.free:b",
            "drv.ctx:1",
            "drv.alloc:c:5000",
        ],
        // After `limit PID 2MiB --device 0`: 1 MiB more fits exactly, a byte more is refused.
        &["drv.ctx:0", "rt.malloc:d:1048576", "rt.malloc:e:1=2"],
    );
    let dir = held.dir.clone();
    let pid = held.pid();
    // A scope opened from outside, left open so the exit report keeps it.
    let segment = segment_path(&dir.join("shm"), current_uid(), pid);
    let scope = Process::open(&segment)
        .unwrap()
        .open_scope("warmup", Some(0))
        .unwrap();

    let o = gmh(&dir, &["ls", "--json"]);
    assert!(o.status.success(), "{}", show(&o));
    let p = listed(&text(&o.stdout), pid);
    let dev = |p: &Value, d: u64| {
        p["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["device"].as_u64() == Some(d))
            .unwrap_or_else(|| panic!("device {d} in {p}"))
            .clone()
    };
    let d0 = dev(&p, 0);
    assert_eq!(d0["used"], 1048576);
    assert_eq!(d0["peak"], 4194304);
    assert_eq!(d0["allocs"], 2);
    assert_eq!(d0["frees"], 1);
    assert_eq!(d0["limit"], Value::Null);
    assert_eq!(dev(&p, 1)["used"], 5000);
    assert_eq!(p["scopes"][0]["name"], "warmup");
    assert!(p["command"].as_str().unwrap().contains("simrun"));

    let o = gmh(&dir, &["ls"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    assert!(out.trim_start().starts_with("PID"), "{out}");
    assert!(out.contains(&pid.to_string()), "{out}");
    assert!(
        out.contains("1.00 MiB") && out.contains("4.00 MiB"),
        "{out}"
    );
    assert!(out.contains("warmup +0 B"), "{out}");
    assert!(!out.contains('\x1b'), "{out:?}");

    let o = gmh(&dir, &["ls", &pid.to_string(), "--json"]);
    assert_eq!(listed(&text(&o.stdout), pid)["pid"], pid);

    let o = gmh(&dir, &["top", "--once"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    assert!(out.contains("1 process, 1.00 MiB used now"), "{out}");
    assert!(
        out.contains(&pid.to_string()) && out.contains("4.00 MiB"),
        "{out}"
    );
    let o = gmh(
        &dir,
        &["top", "-n", "2", "--interval", "0.05", "--sort", "peak"],
    );
    assert_eq!(
        text(&o.stdout).matches("gpumemhook top").count(),
        2,
        "{}",
        show(&o)
    );

    let o = gmh(&dir, &["reset-peak", &pid.to_string(), "--device", "0"]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        text(&o.stdout).contains("peak was 4.00 MiB, now 1.00 MiB"),
        "{}",
        show(&o)
    );

    // A device the process does not have is refused, naming the ones it has; zero and sizes
    // past the no-limit sentinel too, with the words of the hook's configuration.
    for (args, want) in [
        (
            vec!["limit", "1G", "--device", "5"],
            "--device 5: process PID has used devices 0, 1",
        ),
        (
            vec!["reset-peak", "--device", "5"],
            "--device 5: process PID has used devices 0, 1",
        ),
        (vec!["limit", "0"], "zero bytes"),
        (vec!["limit", "18446744073709551615B"], "too large"),
        (vec!["limit", "99999999999999999999GiB"], "too large"),
    ] {
        let pid_text = pid.to_string();
        let mut full = vec![args[0], pid_text.as_str()];
        full.extend_from_slice(&args[1..]);
        let o = gmh(&dir, &full);
        assert_eq!(o.status.code(), Some(2), "{full:?}: {}", show(&o));
        let want = want.replace("PID", &pid_text);
        assert!(text(&o.stderr).contains(&want), "{full:?}: {}", show(&o));
    }
    let p = listed(&text(&gmh(&dir, &["ls", "--json"]).stdout), pid);
    assert_eq!(
        dev(&p, 0)["limit"],
        Value::Null,
        "a refused limit changed nothing"
    );

    let o = gmh(&dir, &["limit", &pid.to_string(), "2MiB", "--device", "0"]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(text(&o.stdout).contains("set to 2.00 MiB"), "{}", show(&o));
    let p = listed(&text(&gmh(&dir, &["ls", "--json"]).stdout), pid);
    assert_eq!(dev(&p, 0)["limit"], 2097152);
    assert_eq!(dev(&p, 0)["peak"], 1048576);
    assert_eq!(dev(&p, 1)["limit"], Value::Null);

    let o = gmh(&dir, &["limit", &pid.to_string(), "lots"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));

    std::mem::forget(scope);
    let report = held.finish();
    let d = report.device(0);
    assert_eq!(
        (d.used, d.peak, d.denied, d.limit),
        (2097152, 2097152, 1, Some(2097152))
    );
    assert_eq!(report.scopes[0].name, "warmup");

    // The exit report, pretty-printed.
    let report_file = dir.join(format!("report.{pid}.json"));
    let o = gmh(&dir, &["report", report_file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    assert!(out.contains(&format!("pid {pid}")), "{out}");
    assert!(out.contains("USED AT EXIT"), "{out}");
    assert!(out.contains("2.00 MiB"), "{out}");
    assert!(out.contains("refused by the ceiling"), "{out}");
    assert!(out.contains("scopes still open at exit"), "{out}");
    assert!(out.contains("warmup"), "{out}");
    let o = gmh(&dir, &["report", "--json", report_file.to_str().unwrap()]);
    let back: Vec<Snapshot> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(back, vec![report]);
}

#[test]
fn clear_errors() {
    let dir = scratch("cli-errors");
    // Nothing hooked: an empty list, and a sentence saying so.
    let o = gmh(&dir, &["ls", "--json"]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap(),
        Value::Array(vec![])
    );
    assert!(
        text(&o.stderr).contains("no hooked processes"),
        "{}",
        show(&o)
    );
    let o = gmh(&dir, &["ls"]);
    assert!(
        o.status.success() && text(&o.stdout).is_empty(),
        "{}",
        show(&o)
    );
    assert!(
        text(&o.stderr).contains("gpumemhook run -- CMD"),
        "{}",
        show(&o)
    );
    let o = gmh(&dir, &["top", "--once"]);
    assert!(
        o.status.success() && text(&o.stderr).contains("no hooked processes"),
        "{}",
        show(&o)
    );

    // No such pid, and a live process that is not hooked.
    let gone = u32::MAX / 2;
    for args in [
        vec!["ls".to_string(), gone.to_string()],
        vec!["limit".to_string(), gone.to_string(), "1GiB".to_string()],
        vec!["reset-peak".to_string(), gone.to_string()],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = gmh(&dir, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", show(&o));
        assert!(
            text(&o.stderr).contains(&format!("no process with pid {gone} is running")),
            "{}",
            show(&o)
        );
    }
    let me = std::process::id().to_string();
    let o = gmh(&dir, &["limit", &me, "1GiB"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("is not hooked"), "{}", show(&o));
    assert!(text(&o.stderr).contains("gpumemhook run"), "{}", show(&o));

    // Unreadable files.
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "this is not json").unwrap();
    let other = dir.join("other.json");
    std::fs::write(&other, "{\"hello\": 1}").unwrap();
    for (args, want) in [
        (
            vec!["plot", "missing.json", "-o", "x.png"],
            "cannot read missing.json",
        ),
        (
            vec!["plot", "junk.json", "-o", "x.png"],
            "junk.json: not a gpumemhook timeline or report: it starts with bytes 74 68 69 73",
        ),
        (
            vec!["plot", "other.json", "-o", "x.png"],
            "not a Chrome trace (a timeline is written by `gpumemhook run --trace FILE`",
        ),
        (vec!["report", "missing.json"], "cannot read missing.json"),
        (
            vec!["report", "junk.json"],
            "junk.json: not a gpumemhook timeline or report",
        ),
        (vec!["report", "other.json"], "not a gpumemhook exit report"),
    ] {
        let o = gmh(&dir, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", show(&o));
        assert!(text(&o.stderr).contains(want), "{args:?}: {}", show(&o));
    }
    // A list with no report in it, and reports missing fields: optional ones read as zero, the
    // identifying ones are named.
    std::fs::write(dir.join("empty.json"), "[]").unwrap();
    std::fs::write(
        dir.join("minimal.json"),
        r#"{"pid": 9, "devices": [{"device": 0, "used": 1024, "peak": 2048}]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("nopeak.json"),
        r#"{"pid": 9, "devices": [{"device": 0, "used": 1024}]}"#,
    )
    .unwrap();
    let o = gmh(&dir, &["report", "empty.json"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("empty.json holds an empty list"),
        "{}",
        show(&o)
    );
    let o = gmh(&dir, &["report", "minimal.json"]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        text(&o.stdout).contains("pid 9") && text(&o.stdout).contains("2.00 KiB"),
        "{}",
        show(&o)
    );
    let o = gmh(&dir, &["report", "nopeak.json"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("missing field `peak`")
            && text(&o.stderr).contains("docs/report-format.md"),
        "{}",
        show(&o)
    );

    // The "no ceiling" sentinel and zero are refused by every door that reads a size, the hook's
    // configuration included, so that an accepted ceiling is always shown as it was given.
    for (value, want) in [
        ("18446744073709551615B", "too large"),
        ("99999999999999999999GiB", "too large"),
        ("0", "zero bytes"),
    ] {
        let o = gmh(&dir, &["run", "--limit", value, "--", &simrun()]);
        assert_eq!(o.status.code(), Some(2), "--limit {value}: {}", show(&o));
        assert!(
            text(&o.stderr).contains(want),
            "--limit {value}: {}",
            show(&o)
        );
        let o = cli(&dir, &["run", "--", &simrun(), "rt.malloc:a:64"])
            .env("GPUMEMHOOK_LIMIT", value)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(2),
            "GPUMEMHOOK_LIMIT={value}: {}",
            show(&o)
        );
        assert!(
            text(&o.stderr).contains("GPUMEMHOOK_LIMIT") && text(&o.stderr).contains(want),
            "GPUMEMHOOK_LIMIT={value}: {}",
            show(&o)
        );
    }

    // Report and timeline paths that cannot be written are refused before the program runs.
    let ran = dir.join("ran");
    let touch = format!("touch:{}", ran.display());
    for args in [
        vec![
            "run",
            "--report",
            "/nonexistent/r.json",
            "--",
            &simrun(),
            &touch,
        ],
        vec![
            "run",
            "--trace",
            "/nonexistent/t.json",
            "--",
            &simrun(),
            &touch,
        ],
        vec!["run", "--report", ".", "--", &simrun(), &touch],
    ] {
        let o = gmh(&dir, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", show(&o));
        assert!(text(&o.stderr).contains(args[2]), "{args:?}: {}", show(&o));
    }
    let o = cli(&dir, &["run", "--", &simrun(), &touch])
        .env("GPUMEMHOOK_REPORT", "/nonexistent/r.%p.json")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("$GPUMEMHOOK_REPORT: /nonexistent/r.%p.json"),
        "{}",
        show(&o)
    );
    assert!(
        !ran.exists(),
        "the program ran although its report could not be written"
    );

    let o = gmh(&dir, &["plot", "junk.json", "-o", "x.jpg"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains(".png or .svg"), "{}", show(&o));
}

/// The names under "Commands:" in a clap help text (without `help`).
fn commands_in_help(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter(|line| !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command of the CLI, read from its own help, nested ones too, each as the arguments that
/// reach it (a positional its parent needs before the subcommand, such as `group NAME scope`,
/// gets a placeholder), with the long options its help lists.
pub(crate) fn every_command(dir: &Path) -> Vec<(Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let o = gmh(dir, &args);
        assert!(o.status.success(), "{path:?}: {}", show(&o));
        let help = text(&o.stdout);
        // "Usage: gpumemhook group [OPTIONS] <NAME> [COMMAND]": the positionals between the
        // command's own path and its subcommand.
        let placeholders = help
            .lines()
            .find(|line| line.starts_with("Usage:"))
            .map(|usage| {
                usage
                    .split_whitespace()
                    .skip(2 + path.len())
                    .take_while(|word| !word.contains("COMMAND"))
                    .filter(|word| word.starts_with('<'))
                    .count()
            })
            .unwrap_or(0);
        let options = help
            .lines()
            .skip_while(|line| line.trim() != "Options:")
            // "  -o, --output <FILE>  ..." or "      --color <WHEN>  ...": an option's own line is
            // indented at most 6 spaces, a wrapped description more.
            .filter(|line| line.len() - line.trim_start().len() <= 6)
            .filter_map(|line| {
                let line = line.trim_start();
                let long = match line.get(..4) {
                    Some(short) if short.starts_with('-') && short.ends_with(", ") => &line[4..],
                    _ => line,
                };
                Some(long.split_whitespace().next()?.to_string())
            })
            .filter(|option| option.starts_with("--") && option != "--help")
            .collect();
        for sub in commands_in_help(&help) {
            let mut next = path.clone();
            next.extend((0..placeholders).map(|_| "x".to_string()));
            next.push(sub);
            todo.push(next);
        }
        if !path.is_empty() {
            found.push((path, options));
        }
    }
    found.sort();
    found
}

/// docs/cli.md promises every command and option: each command has a row in its table (a nested
/// one, its name in a row of its parent's), each option of each command is named on the page, and
/// the table of command modules in docs/architecture.md holds exactly the CLI's commands.
#[test]
fn docs_name_every_command_and_option() {
    let dir = scratch("cli-docs");
    let page = std::fs::read_to_string(gpumemhook_tests::root().join("docs/cli.md")).unwrap();
    let rows: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("| `gpumemhook "))
        .collect();
    let mut missing = Vec::new();
    let mut top_level = std::collections::BTreeSet::new();
    for (path, options) in every_command(&dir) {
        let top = &path[0];
        let own_rows: Vec<&&str> = rows
            .iter()
            .filter(|row| {
                let rest = &row["| `gpumemhook ".len()..];
                rest.strip_prefix(top.as_str())
                    .is_some_and(|after| after.starts_with([' ', '`']))
            })
            .collect();
        let name = path.last().unwrap();
        if path.len() == 1 {
            top_level.insert(top.clone());
        }
        if !own_rows.iter().any(|row| row.contains(name.as_str())) {
            missing.push(format!(
                "`gpumemhook {}`: no row in the table",
                path.join(" ")
            ));
        }
        for option in options {
            let named = page.match_indices(&option).any(|(at, _)| {
                let after = page[at + option.len()..].chars().next();
                !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
            });
            if !named {
                missing.push(format!("`gpumemhook {} {option}`", path.join(" ")));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/cli.md lacks:\n{}",
        missing.join("\n")
    );
    let declared: std::collections::BTreeSet<String> =
        gpumemhook_tests::doc_table("architecture.md", "The command's shape")
            .iter()
            .flat_map(|cells| gpumemhook_tests::quoted_names(&cells[1]))
            .collect();
    assert_eq!(
        declared, top_level,
        "docs/architecture.md's table of command modules"
    );
}

#[test]
fn every_command_has_help_with_examples() {
    let dir = scratch("cli-help");
    let commands = commands_in_help(&text(&gmh(&dir, &["--help"]).stdout));
    assert!(commands.len() >= 13, "{commands:?}");
    for sub in &commands {
        let o = gmh(&dir, &[sub, "--help"]);
        assert!(o.status.success(), "{sub}: {}", show(&o));
        assert!(text(&o.stdout).contains("Examples:"), "{sub}: {}", show(&o));
    }
    let o = gmh(&dir, &["--help"]);
    let out = text(&o.stdout);
    assert!(out.contains("gpumemhook run -- python train.py"), "{out}");
    // `<PID>` is explained where it is asked for, and the global --color option takes one line in
    // each subcommand's help, not a block of its values.
    for sub in ["limit", "reset-peak"] {
        let help = text(&gmh(&dir, &[sub, "--help"]).stdout);
        let pid_line = help
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("<PID>"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(pid_line.contains("Process id"), "{sub}: {help}");
    }
    for sub in &commands {
        let help = text(&gmh(&dir, &[sub, "--help"]).stdout);
        assert_eq!(help.matches("--color").count(), 1, "{sub}: {help}");
        assert!(!help.contains("Possible values"), "{sub}: {help}");
    }
    let o = gmh(&dir, &["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A timeline with two devices, a ceiling, a refusal and two scopes (one open at exit), written
/// by the format's own writer: the figures it must replay to are known.
fn synthetic_trace(path: &Path) -> (Timeline, BTreeMap<u32, (u64, u64)>) {
    let mut events = Vec::new();
    let mut used = [0u64; 2];
    let mut peak = [0u64; 2];
    let mut ts = 1_000_000_000u64;
    let mut ev = |kind, device: u32, bytes: u64, name: &'static str, scope: u32| {
        ts += 7_000_000;
        if kind == EventKind::Alloc {
            used[device as usize] += bytes;
        } else if kind == EventKind::Free {
            used[device as usize] -= bytes;
        }
        peak[device as usize] = peak[device as usize].max(used[device as usize]);
        events.push(Event {
            ts_ns: ts,
            kind,
            device,
            bytes,
            used: used[device as usize],
            address: 0x1000 + ts,
            name,
            mem: MemKind::Device,
            tid: 7,
            scope,
            limit: Some(8 << 30),
            module: if device == 0 {
                "libc10_cuda.so"
            } else {
                "libnccl.so.2"
            },
            site: "",
        });
    };
    let g = 1u64 << 30;
    ev(EventKind::Alloc, 0, g, "cudaMalloc", 0);
    ev(EventKind::ScopeOpen, 0, 0, "forward", 3);
    ev(EventKind::Alloc, 0, 3 * g, "cudaMalloc", 0);
    ev(EventKind::Alloc, 1, g / 2, "cuMemAlloc_v2", 0);
    ev(EventKind::Alloc, 0, 2 * g, "cudaMalloc", 0);
    ev(EventKind::Free, 0, 3 * g, "cudaFree", 0);
    ev(EventKind::ScopeClose, 0, 0, "forward", 3);
    ev(EventKind::Denied, 0, 9 * g, "cudaMalloc", 0);
    ev(EventKind::ScopeOpen, 0, 0, "backward", 4);
    ev(EventKind::Alloc, 0, g, "cudaMalloc", 0);
    ev(EventKind::Free, 1, g / 2, "cuMemFree_v2", 0);
    let limits = BTreeMap::from([(0, 8 * g), (1, 8 * g)]);
    let mut file = std::fs::File::create(path).unwrap();
    write_chrome_trace(
        &mut file,
        4242,
        "python train.py --epochs 3",
        &events,
        &limits,
        0,
    )
    .unwrap();
    let t = read_chrome_trace(&std::fs::read_to_string(path).unwrap()).unwrap();
    let expected = BTreeMap::from([(0, (used[0], peak[0])), (1, (used[1], peak[1]))]);
    (t, expected)
}

/// `report` of a pipe (`report /dev/stdin`, `report <(...)`): a pipe can be read once only, so a
/// report in it must not be lost to a first try at reading it as a timeline, and a timeline in it
/// reads as from a file.
#[test]
fn report_reads_a_report_or_a_timeline_from_a_pipe() {
    let dir = scratch("cli-report-pipe");
    synthetic_trace(&dir.join("t.json"));
    let from_file = gmh(&dir, &["report", "t.json"]);
    assert!(from_file.status.success(), "{}", show(&from_file));
    let report = r#"{"pid": 41, "devices": [{"device": 0, "used": 5, "peak": 1048576}]}"#;
    let timeline = std::fs::read(dir.join("t.json")).unwrap();
    for (input, expected) in [
        (report.as_bytes().to_vec(), "1.00 MiB".to_string()),
        (timeline, text(&from_file.stdout)),
    ] {
        let mut child = cli(&dir, &["report", "/dev/stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(&input);
        });
        let o = child.wait_with_output().unwrap();
        writer.join().unwrap();
        assert!(o.status.success(), "{}", show(&o));
        assert!(text(&o.stdout).contains(&expected), "{}", show(&o));
    }
}

#[test]
fn plot_draws_a_png_and_an_svg_of_a_timeline() {
    let dir = scratch("cli-plot");
    let trace = dir.join("t.json");
    let (t, expected) = synthetic_trace(&trace);
    assert_eq!(t.scopes.len(), 2);
    for (d, (used, peak)) in &expected {
        let points = &t.used[d];
        assert_eq!(points.last().unwrap().1, *used);
        assert_eq!(points.iter().map(|p| p.1).max().unwrap(), *peak);
    }

    let o = gmh(&dir, &["plot", "t.json", "-o", "t.png"]);
    assert!(o.status.success(), "{}", show(&o));
    let decoder = png::Decoder::new(std::fs::File::open(dir.join("t.png")).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1200, 600));
    assert_eq!(info.color_type, png::ColorType::Rgba);
    let pixels: Vec<[u8; 3]> = buf[..info.buffer_size()]
        .chunks(4)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    let has = |rgb: [u8; 3]| pixels.contains(&rgb);
    assert!(has([0x1f, 0x77, 0xb4]), "device 0's line colour");
    assert!(has([0xff, 0x7f, 0x0e]), "device 1's line colour");
    assert!(has([0xd6, 0x27, 0x28]), "the ceiling's colour");
    let dark = pixels.iter().filter(|p| p.iter().all(|&c| c < 80)).count();
    assert!(dark > 2000, "text and axes leave dark ink ({dark} pixels)");

    let o = gmh(
        &dir,
        &[
            "plot", "t.json", "-o", "t.svg", "--width", "900", "--height", "500",
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    let svg = std::fs::read_to_string(dir.join("t.svg")).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("width=\"900\" height=\"500\""));
    for want in [
        "GPU memory used: python train.py --epochs 3 (pid 4242)",
        "forward",
        "backward (open at exit)",
        "ceiling 8.00 GiB",
        "peak 6.00 GiB",
        "device 1 (peak 512.0 MiB)",
        "1 allocation refused by the ceiling",
        "GiB",
    ] {
        assert!(svg.contains(want), "{want:?} missing from the SVG");
    }
    // Balanced elements: every opened text is closed.
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());

    // `report` on a timeline replays the same figures.
    let o = gmh(&dir, &["report", "t.json"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        out.contains("6.00 GiB") && out.contains("4.00 GiB"),
        "{out}"
    );
    assert!(
        out.contains("device memory events: 5 allocations, 2 frees, 1 denied, 0 failed"),
        "{out}"
    );
    // Scope "forward" opened at 1 GiB and reached 6 GiB: +5 GiB.
    assert!(
        out.contains("forward") && out.contains("+5.00 GiB"),
        "{out}"
    );
    assert!(out.contains("open at exit"), "{out}");
}

/// A timeline in the written format with the ceiling changed twice (4 GiB, then 862 MiB, under
/// which an allocation is refused, then none) and a driver failure: the plot draws each ceiling
/// where it was in force and marks both allocations; `report` lists the ceiling's history.
#[test]
fn plot_draws_the_ceiling_as_steps_and_marks_refusals() {
    let dir = scratch("cli-plot-steps");
    let mib = 1u64 << 20;
    let mut events = vec![
        serde_json::json!({"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "demo"}}),
        serde_json::json!({"ph": "M", "name": "gpumemhook", "pid": 3,
            "args": {"limits": {}, "events": 9, "dropped": 0}}),
        serde_json::json!({"ph": "C", "name": "device 0 limit", "ts": 0.0, "pid": 3,
            "args": {"limit": 4u64 << 30}}),
    ];
    let instant = |cat: &str, ts: f64, bytes: u64, used: u64| {
        serde_json::json!({"ph": "i", "s": "t", "name": "cudaMalloc", "cat": cat, "ts": ts,
            "pid": 3, "tid": 1, "args": {"device": 0, "bytes": bytes, "used": used,
            "address": "0x0", "kind": "device"}})
    };
    let counter = |ts: f64, used: u64| {
        serde_json::json!({"ph": "C", "name": "device 0 used", "ts": ts, "pid": 3,
            "args": {"used": used}})
    };
    for k in 1..=5u64 {
        let ts = k as f64 * 1000.0;
        events.push(instant("alloc", ts, 100 * mib, k * 100 * mib));
        events.push(counter(ts, k * 100 * mib));
    }
    events.push(
        serde_json::json!({"ph": "C", "name": "device 0 limit", "ts": 6000.0,
        "pid": 3, "args": {"limit": 862 * mib}}),
    );
    events.push(instant("denied", 7000.0, 400 * mib, 500 * mib));
    events.push(instant("failed", 8000.0, 300 * mib, 500 * mib));
    events.push(
        serde_json::json!({"ph": "C", "name": "device 0 limit", "ts": 9000.0,
        "pid": 3, "args": {"limit": 0}}),
    );
    events.push(instant("free", 10000.0, 500 * mib, 0));
    events.push(counter(10000.0, 0));
    std::fs::write(
        dir.join("t.json"),
        serde_json::json!({"traceEvents": events}).to_string(),
    )
    .unwrap();
    let o = gmh(&dir, &["plot", "t.json", "-o", "t.svg"]);
    assert!(o.status.success(), "{}", show(&o));
    let svg = std::fs::read_to_string(dir.join("t.svg")).unwrap();
    for want in [
        "ceiling 4.00 GiB (above the plot)",
        "ceiling 862.0 MiB",
        "1 allocation refused by the ceiling",
        "1 allocation failed in the driver",
        ">refused<",
        ">failed<",
    ] {
        assert!(svg.contains(want), "{want:?} missing from the SVG");
    }
    let o = gmh(&dir, &["plot", "t.json", "-o", "t.png"]);
    assert!(o.status.success(), "{}", show(&o));
    let o = gmh(&dir, &["report", "t.json"]);
    assert!(
        text(&o.stdout).contains(
            "device 0 ceiling: 4.00 GiB from the start, 862.0 MiB from +5 ms, none from +8 ms"
        ),
        "{}",
        show(&o)
    );
}

/// A ceiling set and a peak restarted from another process (`gpumemhook limit PID`, `reset-peak`)
/// while the program runs, and the ceiling changed again after its last allocation: all are on the
/// timeline at the time they happened, and `report` and `plot` of the timeline state the ceiling
/// and peak of the exit report (the peak since the restart), and say where the peak restarted.
#[test]
fn a_ceiling_changed_and_a_peak_restarted_mid_run_are_on_the_timeline() {
    let mib = 1u64 << 20;
    let run = Run::sim("simrun", &[]);
    let dir = run.dir().to_path_buf();
    let run = run.env("GPUMEMHOOK_TRACE", dir.join("t.json"));
    let (ready2, go2) = (dir.join("ready2"), dir.join("go2"));
    let touch2 = format!("touch:{}", ready2.display());
    let wait2 = format!("wait:{}", go2.display());
    let held = Held::start_with(
        run,
        // 4 MiB at the most, 1 MiB held when the peak is restarted.
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:3145728",
            "rt.malloc:b:1048576",
            "rt.free:a",
        ],
        // Under the new 2 MiB ceiling: half a MiB more (the peak since the restart, 1.5 MiB), then
        // the last allocation; the ceiling is raised to 3 MiB after it.
        &["rt.malloc:c:524288", &touch2, &wait2],
    );
    let pid = held.pid().to_string();
    for args in [
        vec!["limit", &pid, "2MiB", "--device", "0"],
        vec!["reset-peak", &pid, "--device", "0"],
    ] {
        let o = gmh(&dir, &args);
        assert!(o.status.success(), "{}", show(&o));
    }
    std::fs::write(dir.join("go"), "").unwrap();
    wait_for(&ready2);
    let o = gmh(&dir, &["limit", &pid, "3MiB", "--device", "0"]);
    assert!(o.status.success(), "{}", show(&o));
    std::fs::write(&go2, "").unwrap();
    let report = held.finish();
    let d0 = report.device(0);
    assert_eq!((d0.peak, d0.limit), (3 * mib / 2, Some(3 * mib)));

    let t = gpumemhook_tests::timeline(&dir.join("t.json"));
    let ceilings: Vec<Option<u64>> = t.ceilings[&0].iter().map(|s| s.1).collect();
    assert_eq!(ceilings, [None, Some(2 * mib), Some(3 * mib)]);
    let resets = &t.peak_resets[&0];
    assert_eq!(resets.len(), 1);
    let used = &t.used[&0];
    let last_alloc = used.last().unwrap().0;
    // In order: the 2 MiB ceiling, the restart (before the half MiB), the 3 MiB after everything.
    assert!(t.ceilings[&0][1].0 <= resets[0] && resets[0] < last_alloc);
    assert!(t.ceilings[&0][2].0 > last_alloc);

    // `report` of the timeline and of the exit report state the same peak and ceiling.
    let o = gmh(&dir, &["report", "t.json"]);
    let timeline_text = text(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    let row = timeline_text
        .lines()
        .find(|l| l.trim_start().starts_with("0 "))
        .unwrap_or_else(|| panic!("no device 0 row in\n{timeline_text}"));
    assert!(
        row.contains("1.50 MiB") && row.contains("3.00 MiB") && !row.contains("4.00 MiB"),
        "{row}"
    );
    for want in [
        "device 0 peak restarted at +",
        "(reset_peak): PEAK counts from then; 4.00 MiB over the whole run",
        "device 0 ceiling: none from the start, 2.00 MiB from +",
        ", 3.00 MiB from +",
    ] {
        assert!(timeline_text.contains(want), "{want:?} in\n{timeline_text}");
    }
    let o = gmh(&dir, &["report", &format!("report.{}.json", report.pid)]);
    let exit_text = text(&o.stdout);
    assert!(
        exit_text.contains("1.50 MiB") && exit_text.contains("3.00 MiB"),
        "{exit_text}"
    );

    // The plot names the same peak and the ceiling that held at the end, and the restart.
    let o = gmh(&dir, &["plot", "t.json", "-o", "t.svg"]);
    assert!(o.status.success(), "{}", show(&o));
    let svg = std::fs::read_to_string(dir.join("t.svg")).unwrap();
    for want in [
        "peak 1.50 MiB on device 0",
        "ceiling, 3.00 MiB at the end",
        "peak reset",
    ] {
        assert!(svg.contains(want), "{want:?} missing from the SVG");
    }
}

/// A timeline of 10 s of idle start-up (1 MiB held) and then four half-second steps, each in a
/// scope, the third reaching the peak.
fn stepped_training_timeline(dir: &Path) {
    let mib = 1u64 << 20;
    let mut events = vec![
        serde_json::json!({"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "train"}}),
        serde_json::json!({"ph": "C", "name": "device 0 used", "ts": 0.0, "pid": 9,
            "args": {"used": mib}}),
    ];
    for k in 0..4u64 {
        let open = 10e6 + k as f64 * 0.5e6;
        let high = [300, 500, 900, 400][k as usize] * mib;
        events.push(
            serde_json::json!({"ph": "b", "cat": "scope", "id": k, "name":
            format!("step {k}"), "ts": open, "pid": 9, "tid": 1}),
        );
        for (dt, used) in [(0.1e6, high / 2), (0.2e6, high), (0.4e6, mib)] {
            events.push(
                serde_json::json!({"ph": "C", "name": "device 0 used", "ts": open + dt,
                "pid": 9, "args": {"used": used}}),
            );
        }
        events.push(
            serde_json::json!({"ph": "e", "cat": "scope", "id": k, "name":
            format!("step {k}"), "ts": open + 0.5e6, "pid": 9, "tid": 1}),
        );
    }
    std::fs::write(
        dir.join("t.json"),
        serde_json::json!({"traceEvents": events}).to_string(),
    )
    .unwrap();
}

/// The share of the image's width that the scope bars (in the first lane, at row `y`) cover: the
/// columns that are not white.
fn scope_bar_share(png_path: &Path, y: usize) -> f64 {
    let decoder = png::Decoder::new(std::fs::File::open(png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgba);
    let row = &buf[y * info.line_size..(y + 1) * info.line_size];
    let coloured = row
        .chunks(4)
        .filter(|p| p[0] < 250 || p[1] < 250 || p[2] < 250)
        .count();
    coloured as f64 / info.width as f64
}

/// `plot` leaves out the idle start-up by default and says so, draws the window --from/--to ask
/// for (seconds, or around the peak), labels every scope where it fits, and its legend's scope
/// swatch takes the colours of the bars; a window with nothing in it is a usage error.
#[test]
fn plot_leaves_out_idle_start_up_and_draws_the_window_asked_for() {
    let dir = scratch("cli-plot-window");
    stepped_training_timeline(&dir);
    let plot = |args: &[&str]| {
        let mut all = vec!["plot", "t.json"];
        all.extend_from_slice(args);
        let o = gmh(&dir, &all);
        assert!(o.status.success(), "{}", show(&o));
    };
    // The first lane's bars lie between y = 90 and 104 (under the legend).
    let bar_row = 97;
    plot(&["-o", "trimmed.png"]);
    plot(&["-o", "whole.png", "--from", "0"]);
    let (trimmed, whole) = (
        scope_bar_share(&dir.join("trimmed.png"), bar_row),
        scope_bar_share(&dir.join("whole.png"), bar_row),
    );
    assert!(trimmed > 0.75, "the steps fill the plot: {trimmed}");
    assert!(whole < 0.25, "the steps are a sixth of the run: {whole}");

    plot(&["-o", "trimmed.svg"]);
    let svg = std::fs::read_to_string(dir.join("trimmed.svg")).unwrap();
    assert!(
        svg.contains("the first 10.0 s (idle start-up) left out: --from 0 draws it"),
        "{svg}"
    );
    for k in 0..4 {
        assert!(
            svg.contains(&format!(">step {k}</text>")),
            "step {k} unlabelled"
        );
    }
    // The legend's swatch (its stripes at y = 66) has the colours of the bars (at y = 90).
    let fills_at = |y: &str| -> std::collections::BTreeSet<String> {
        svg.lines()
            .filter(|l| l.starts_with("<rect") && l.contains(&format!(" y=\"{y}\"")))
            .filter_map(|l| {
                l.split("fill=\"")
                    .nth(1)?
                    .split('"')
                    .next()
                    .map(String::from)
            })
            .collect()
    };
    let (swatch, bars) = (fills_at("66.0"), fills_at("90.0"));
    assert_eq!(bars.len(), 4, "{bars:?}");
    assert_eq!(swatch, bars);

    // Around the peak (the third step, at 11.2 s): only the steps that overlap the window.
    plot(&["-o", "peak.svg", "--from", "peak±0.2s"]);
    let svg = std::fs::read_to_string(dir.join("peak.svg")).unwrap();
    assert!(svg.contains("from 11.0 s to 11.4 s"), "{svg}");
    assert!(
        svg.contains("peak 900.0 MiB on device 0 at 11.20 s"),
        "{svg}"
    );
    assert!(svg.contains(">step 2</text>") && !svg.contains(">step 0</text>"));
    plot(&["-o", "late.svg", "--from", "11.5", "--to", "peak+0.6s"]);
    let svg = std::fs::read_to_string(dir.join("late.svg")).unwrap();
    assert!(svg.contains("from 11.5 s to 11.8 s") && svg.contains(">step 3</text>"));
    // Only an end: from the first event.
    plot(&["-o", "early.svg", "--to", "10.2s"]);
    let svg = std::fs::read_to_string(dir.join("early.svg")).unwrap();
    assert!(svg.contains("from the first event to 10.2 s"), "{svg}");

    for (args, says) in [
        (
            vec!["--from", "12", "--to", "11"],
            "nothing to draw between 12.0 s and 11.0 s",
        ),
        (
            vec!["--from", "soon"],
            "write seconds since the first event",
        ),
        (vec!["--to", "2 GiB"], "write seconds since the first event"),
    ] {
        let mut all = vec!["plot", "t.json", "-o", "x.png"];
        all.extend_from_slice(&args);
        let o = gmh(&dir, &all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", show(&o));
        assert!(text(&o.stderr).contains(says), "{args:?}: {}", show(&o));
        assert!(!dir.join("x.png").exists());
    }
}

/// Replays a timeline's counters: per device (used after the last change, largest used).
fn replay(t: &Timeline) -> BTreeMap<u32, (u64, u64)> {
    t.used
        .iter()
        .map(|(&d, points)| {
            (
                d,
                (
                    points.last().map_or(0, |p| p.1),
                    points.iter().map(|p| p.1).max().unwrap_or(0),
                ),
            )
        })
        .collect()
}

#[test]
fn run_trace_replays_to_the_exit_report_and_plots() {
    let dir = scratch("cli-trace");
    let o = gmh(
        &dir,
        &[
            "run",
            "--limit",
            "16MiB",
            "--report",
            "r.json",
            "--trace",
            "t.json",
            "--",
            &simrun(),
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:300000",
            "drv.alloc:b:500000",
            "rt.malloc:c:20000000=2",
            // Threads whose events interleave: each event carries its own `used` and its place
            // in the counter's order, which the reader restores (docs/timeline.md, "Exact
            // replay").
            "threads:4:200:7:50000",
            "rt.free:a",
            "rt.malloc_async:d:200000",
            "drv.ctx:1",
            "drv.alloc:e:123456",
            "rt.malloc_managed:m:4096",
            "rt.malloc_host:h:64",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(err.contains("timeline: t.json"), "{err}");
    let report = read_report(&dir.join("r.json"));
    let t = gpumemhook_tests::timeline(&dir.join("t.json"));
    assert_eq!(t.pid, report.pid);
    assert_eq!(t.dropped, 0);
    let replayed = replay(&t);
    for d in &report.devices {
        assert_eq!(
            replayed.get(&d.device).copied(),
            Some((d.used, d.peak)),
            "device {}",
            d.device
        );
        assert_eq!(t.limits.get(&d.device).copied(), d.limit);
    }
    let sum =
        |f: fn(&gpumemhook_reader::DeviceStats) -> u64| report.devices.iter().map(f).sum::<u64>();
    // Device events are what the exit report's allocs/frees count; managed and pinned host
    // memory are kept apart, as the report keeps them.
    let count = |k| t.count(MemKind::Device, k);
    assert_eq!(count(EventKind::Alloc), sum(|d| d.allocs));
    assert_eq!(count(EventKind::Free), sum(|d| d.frees));
    assert_eq!(count(EventKind::Denied), sum(|d| d.denied));
    assert_eq!(count(EventKind::Denied), 1);
    assert_eq!(t.count(MemKind::Managed, EventKind::Alloc), 1);
    assert_eq!(
        t.count(MemKind::HostPinned, EventKind::Alloc),
        report.host.allocs
    );
    assert_eq!(report.host.allocs, 1);
    let o = gmh(&dir, &["report", "t.json"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        out.contains(&format!(
            "device memory events: {} allocations,",
            sum(|d| d.allocs)
        )),
        "{out}"
    );
    assert!(
        out.contains("managed (unified) memory events: 1 allocation, 0 frees"),
        "{out}"
    );
    assert!(
        out.contains("pinned host memory events: 1 allocation, 0 frees"),
        "{out}"
    );
    let o = gmh(&dir, &["report", "r.json"]);
    assert!(text(&o.stdout).contains("(1 allocation)"), "{}", show(&o));
    // The refusal is a mark on the curve, at the device's `used` of that moment.
    assert_eq!(t.marks.len(), 1);
    assert_eq!(t.marks[0].bytes, 20_000_000);
    assert_eq!(t.marks[0].used, 800_000);

    let o = gmh(&dir, &["plot", "t.json", "-o", "t.png"]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(std::fs::metadata(dir.join("t.png")).unwrap().len() > 10_000);
}

#[test]
fn plot_stacks_a_device_by_module() {
    let dir = scratch("cli-plot-modules");
    synthetic_trace(&dir.join("t.json"));
    let o = gmh(&dir, &["plot", "t.json", "-o", "m.svg", "--by-module"]);
    assert!(o.status.success(), "{}", show(&o));
    let svg = std::fs::read_to_string(dir.join("m.svg")).unwrap();
    // Device 0 has the highest peak: its module's band and legend entry, not device 1's.
    assert!(svg.contains("libc10_cuda.so  peak"), "legend of the band");
    assert!(
        !svg.contains("libnccl.so.2  peak"),
        "device 1 is not stacked"
    );
    let o = gmh(
        &dir,
        &[
            "plot",
            "t.json",
            "-o",
            "m1.svg",
            "--by-module",
            "--device",
            "1",
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    let svg = std::fs::read_to_string(dir.join("m1.svg")).unwrap();
    assert!(svg.contains("libnccl.so.2  peak"));
    // A device with no module events is a clear error.
    let o = gmh(
        &dir,
        &[
            "plot",
            "t.json",
            "-o",
            "m2.svg",
            "--by-module",
            "--device",
            "5",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(text(&o.stderr).contains("nothing to stack"), "{}", show(&o));
    // --device without --by-module is refused by the parser.
    let o = gmh(&dir, &["plot", "t.json", "-o", "m3.svg", "--device", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
}

#[test]
fn run_names_the_largest_modules_and_report_prints_the_breakdown_and_the_leaks() {
    let dir = scratch("cli-modules");
    let sim = simrun();
    let o = gmh(
        &dir,
        &[
            "run",
            "--report",
            "r.json",
            "--",
            &sim,
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:3000",
            "lib.alloc:b:500000",
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "device 0 held at exit by: libfakecollective.so {}, simrun {}",
            gpumemhook_reader::format_size(500_000),
            gpumemhook_reader::format_size(3000)
        )),
        "{err}"
    );
    let o = gmh(&dir, &["report", "r.json"]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    for want in [
        "by module (the shared object that asked):",
        "libfakecollective.so",
        &format!(
            "2 allocations were still held ({}):",
            gpumemhook_reader::format_size(503_000)
        ),
        "0x1000",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    // The JSON form keeps every field.
    let o = gmh(&dir, &["report", "--json", "r.json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v[0]["devices"][0]["by_module"][0]["module"],
        "libfakecollective.so"
    );
    assert_eq!(v[0]["live"][0]["bytes"], 500000);
}

#[test]
fn report_of_an_out_of_memory_file_names_the_refused_request() {
    let dir = scratch("cli-oom");
    let sim = simrun();
    let o = gmh(
        &dir,
        &[
            "run",
            "--limit",
            "1MiB",
            "--",
            &sim,
            "rt.malloc:a:4096",
            "rt.malloc:b:2097152=2",
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    // `run` passes GPUMEMHOOK_OOM_REPORT through from its environment.
    let o = cli(
        &dir,
        &[
            "run",
            "--limit",
            "1MiB",
            "--",
            &sim,
            "rt.malloc:b:2097152=2",
        ],
    )
    .env("GPUMEMHOOK_OOM_REPORT", dir.join("oom.json"))
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let o = gmh(&dir, &["report", "oom.json"]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    assert!(
        out.contains(
            "out of memory: 2.00 MiB asked by simrun on device 0 with cuMemAlloc_v2, refused by the \
             ceiling (0 B in use, ceiling 1.00 MiB)"
        ),
        "{out}"
    );
}

#[test]
fn ls_and_top_show_who_holds_a_live_process_memory() {
    let held = Held::start(
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:3000",
            "lib.alloc:b:70000",
        ],
        &[],
    );
    let pid = held.pid().to_string();
    let o = gmh(&held.dir, &["ls", "--by-module", &pid]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    let lib_row = out
        .lines()
        .find(|l| l.contains("libfakecollective.so"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(lib_row.contains("68.36 KiB"), "{lib_row}");
    assert!(out.contains("simrun"), "{out}");
    let o = gmh(&held.dir, &["top", "--once", "--by-module"]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    assert!(out.contains(&format!("pid {pid}:")), "{out}");
    assert!(out.contains("libfakecollective.so"), "{out}");
    // --by-module and --by-job do not mix.
    let o = gmh(&held.dir, &["ls", "--by-module", "--by-job"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    held.finish();
}

/// `top` shows NVML's view of each device (total, used by all, free, utilisation or "n/a") and
/// NVML's processes that are not hooked, marked as such, with their memory as NVML sees it; the
/// hooked process NVML lists too is not repeated. Without NVML, or with NVML and no device, one
/// line says so.
#[test]
fn top_shows_each_device_from_nvml_and_its_processes_outside_the_hook() {
    let held = Held::start(&["drv.init", "drv.ctx:0", "rt.malloc:a:3145728"], &[]);
    let pid = held.pid();
    let processes = format!("{pid}:3145728,4242:5242880");
    let top = |env: &[(&str, &str)]| {
        let mut command = cli(&held.dir, &["top", "--once"]);
        command.env("FAKENVML_PROCESSES", &processes);
        for (key, value) in env {
            command.env(key, value);
        }
        let o = command.output().expect("gpumemhook runs");
        assert!(o.status.success(), "{}", show(&o));
        text(&o.stdout)
    };
    let out = top(&[]);
    for device in [0, 1] {
        let line = format!(
            "device {device} (NVML): 16.00 GiB total, 8.00 MiB used by all, 15.99 GiB free, \
             utilisation n/a"
        );
        assert!(out.contains(&line), "{line}\n{out}");
    }
    let outside: Vec<&str> = out.lines().filter(|l| l.contains("(not hooked)")).collect();
    assert_eq!(outside.len(), 2, "one per device: {out}");
    for row in outside {
        assert!(row.trim_start().starts_with("pid 4242 "), "{row}");
        assert!(row.contains("5.00 MiB"), "{row}");
    }
    assert!(top(&[("FAKENVML_UTILIZATION", "37")]).contains("utilisation 37%"));
    for env in [
        ("FAKENVML_FAIL", "1"),
        ("GPUMEMHOOK_NVML_LIB", "/nonexistent/libnvidia-ml.so.1"),
    ] {
        let out = top(&[env]);
        let said: Vec<&str> = out.lines().filter(|l| l.contains("NVML")).collect();
        assert_eq!(said.len(), 1, "{out}");
        assert!(said[0].starts_with("NVML: not available ("), "{out}");
        assert!(
            out.contains(&pid.to_string()),
            "the hooked rows stay: {out}"
        );
    }
    let out = top(&[("FAKECUDA_DEVICES", "0")]);
    let said: Vec<&str> = out.lines().filter(|l| l.contains("NVML")).collect();
    assert_eq!(said, ["NVML: no device"], "{out}");
    held.finish();
}

/// `o`'s stderr, which must be exactly one line; returns it.
fn one_line(o: &Output) -> String {
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {}", show(o));
    err.trim_end().to_string()
}

#[test]
fn sizes_given_as_text_must_carry_their_unit() {
    let dir = scratch("cli-units");
    let marker = dir.join("ran");
    let touch = format!("touch:{}", marker.display());
    let sim = simrun();
    // A bare number, a number and its unit as two words (with and without `--`: the unit would
    // otherwise be taken for the program), on every option that takes a size.
    for (args, line) in [
        (
            vec!["run", "--limit", "8", "--", &sim, &touch],
            "--limit: 8 what? write 8GiB, or 8B for bytes",
        ),
        (
            vec!["run", "--limit", "8", "GiB", "--", &sim, &touch],
            "--limit: write 8GiB (no space)",
        ),
        (
            vec!["run", "--limit", "8", "GiB", &sim, &touch],
            "--limit: write 8GiB (no space)",
        ),
        (
            vec!["run", "--emulate", "16", "--", &sim, &touch],
            "--emulate: 16 what? write 16GiB, or 16B for bytes",
        ),
        (
            vec!["run", "--emulate", "16", "GB", "--", &sim, &touch],
            "--emulate: write 16GB (no space)",
        ),
        (
            vec!["run", "--stacks", "python:1048576", "--", &sim, &touch],
            "1048576 what? write 1048576GiB, or 1048576B for bytes",
        ),
        (
            vec!["limit", "4242", "8"],
            "8 what? write 8GiB, or 8B for bytes",
        ),
        (vec!["limit", "4242", "8", "GiB"], "write 8GiB (no space)"),
    ] {
        let o = gmh(&dir, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", show(&o));
        let err = one_line(&o);
        assert!(
            err.starts_with("gpumemhook: error: ") && err.ends_with(line),
            "{args:?}: {err}"
        );
        assert!(!marker.exists(), "the command ran despite {args:?}");
    }
    // The ceiling inherited from the environment: refused by `run` before the program starts,
    // and by the hook itself when preloaded without `run` (ceiling.rs).
    let o = cli(&dir, &["run", "--", &sim, &touch])
        .env("GPUMEMHOOK_LIMIT", "8")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert_eq!(
        one_line(&o),
        "gpumemhook: error: $GPUMEMHOOK_LIMIT: 8 what? write 8GiB, or 8B for bytes"
    );
    assert!(
        !marker.exists(),
        "the command ran despite GPUMEMHOOK_LIMIT=8"
    );

    // With its unit, a number of bytes is a ceiling of that many bytes.
    let o = gmh(
        &dir,
        &[
            "run",
            "--limit",
            "4096B",
            "--report",
            "r.json",
            "--",
            &sim,
            "rt.malloc:a:4096",
            "rt.malloc:b:1=2",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let d = read_report(&dir.join("r.json")).device(0).clone();
    assert_eq!((d.limit, d.used, d.denied), (Some(4096), 4096, 1));
    // A unit as the first word of the program's own arguments is the program's business.
    let o = gmh(
        &dir,
        &[
            "run", "--limit", "8GiB", "--", "sh", "-c", "exit 0", "8", "GiB",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

#[test]
fn run_stacks_records_python_call_sites_that_ls_by_site_shows() {
    let dir = scratch("cli-stacks");
    let (ready, go) = (dir.join("ready"), dir.join("go"));
    let script = dir.join("hold.py");
    std::fs::write(
        &script,
        "import ctypes, os, sys, time\n\
         rt = ctypes.CDLL('libcudart.so.13')\n\
         def load_weights():\n\
         \x20   p = ctypes.c_void_p()\n\
         \x20   assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(2 << 20)) == 0  # SITE\n\
         \x20   return p\n\
         weights = load_weights()\n\
         open(sys.argv[1], 'w').close()\n\
         deadline = time.monotonic() + 60\n\
         while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:\n\
         \x20   time.sleep(0.01)\n",
    )
    .unwrap();
    let python = gpumemhook_tests::python().to_str().unwrap();
    let child = cli(
        &dir,
        &[
            "run",
            "--quiet",
            "--stacks",
            "python:1MiB",
            "--",
            python,
            script.to_str().unwrap(),
            ready.to_str().unwrap(),
            go.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for(&ready);
    let o = gmh(&dir, &["ls", "--by-site"]);
    std::fs::write(&go, "").unwrap();
    let done = child.wait_with_output().unwrap();
    assert!(done.status.success(), "{}", show(&done));
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    let site = format!("{}:5 in load_weights", script.display());
    let row = out
        .lines()
        .find(|l| l.contains(&site))
        .unwrap_or_else(|| panic!("no row for {site}:\n{out}"));
    assert_eq!(
        row.split_whitespace().take(5).collect::<Vec<_>>(),
        ["2.00", "MiB", "2.00", "MiB", "1"],
        "{row}"
    );
    assert!(out.contains("by Python call site"), "{out}");
    assert!(out.lines().next().unwrap().starts_with("pid "), "{out}");

    // A process run without call sites says how to get them; `--stacks` refuses what the hook would.
    let held = Held::start(&["rt.malloc:a:3000"], &[]);
    let o = gmh(&held.dir, &["ls", "--by-site"]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        text(&o.stdout).contains("no per-site figures: the program ran without GPUMEMHOOK_STACKS="),
        "{}",
        show(&o)
    );
    let o = gmh(&held.dir, &["ls", "--by-site", "--by-job"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    held.finish();
    let o = gmh(&dir, &["run", "--stacks", "native:1MiB", "--", &simrun()]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(
        one_line(&o).contains("--stacks: expected python:<min bytes>"),
        "{}",
        show(&o)
    );
}

#[test]
fn cards_json_is_the_table_in_bytes() {
    let dir = scratch("cli-cards-json");
    let o = gmh(&dir, &["cards", "--json"]);
    assert!(o.status.success(), "{}", show(&o));
    let cards: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let t4 = cards.iter().find(|c| c["name"] == "t4").unwrap();
    assert_eq!(t4["total"], 15360u64 << 20, "{t4}");
    assert_eq!(t4["source"], "nvidia-smi", "{t4}");
    assert!(t4["full_name"].as_str().unwrap().contains("T4"), "{t4}");
    assert!(t4["aliases"].is_array(), "{t4}");
    // The same cards as the table, in its order (smallest first).
    let table = gmh(&dir, &["cards"]);
    let names: Vec<String> = text(&table.stdout)
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    let json_names: Vec<&str> = cards.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, json_names);
    let totals: Vec<u64> = cards.iter().map(|c| c["total"].as_u64().unwrap()).collect();
    assert!(totals.windows(2).all(|w| w[0] <= w[1]), "{totals:?}");
}

#[test]
fn top_refuses_zero_frames_and_says_nothing_is_hooked_once_on_stderr() {
    let dir = scratch("cli-top-edges");
    let o = gmh(&dir, &["top", "-n", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(one_line(&o).contains("-n 0"), "{}", show(&o));
    assert!(o.stdout.is_empty(), "{}", show(&o));

    for args in [
        vec!["top", "--once"],
        vec!["top", "-n", "3", "--interval", "0.05"],
    ] {
        let o = gmh(&dir, &args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", show(&o));
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(
            !out.contains("no hooked processes"),
            "{args:?}: {}",
            show(&o)
        );
        assert_eq!(
            err.matches("no hooked processes").count(),
            1,
            "{args:?}: {}",
            show(&o)
        );
        // Each frame still has its headline.
        let frames = if args.len() == 2 { 1 } else { 3 };
        assert_eq!(out.matches("gpumemhook top").count(), frames, "{out}");
    }
    // `ls` says it once too, on stderr.
    let o = gmh(&dir, &["ls"]);
    assert!(o.stdout.is_empty(), "{}", show(&o));
    assert_eq!(text(&o.stderr).matches("no hooked processes").count(), 1);
}

#[test]
fn the_demo_keeps_its_own_install_steps_quiet_unless_one_fails() {
    // scripts/demo in a stand-in checkout: its set-up steps (cargo, scripts/build/python-env,
    // scripts/build/sim) are noisy stand-ins, the workload a small program over the simulated
    // stack, and the CLI and hook the ones under test. No NVIDIA driver: the simulated path.
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = scratch("cli-demo");
    let tree = dir.join("checkout");
    let bin = dir.join("bin");
    for d in [
        "scripts/build",
        "scripts/lib",
        "scripts/workloads",
        "target/release",
        "target/venv/bin",
    ] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::fs::create_dir_all(&bin).unwrap();
    let root = gpumemhook_tests::root();
    std::fs::copy(root.join("scripts/demo"), tree.join("scripts/demo")).unwrap();
    std::fs::copy(
        root.join("scripts/lib/steps"),
        tree.join("scripts/lib/steps"),
    )
    .unwrap();
    let script = |path: &Path, body: &str| {
        std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let noisy = |what: &str| {
        format!(
            "echo '{what} noise on stdout'; echo '{what} noise on stderr' >&2; \
             exit ${{FAIL_{}:-0}}",
            what.to_uppercase().replace('-', "_")
        )
    };
    script(&bin.join("cargo"), &noisy("cargo"));
    script(&bin.join("nvidia-smi"), "exit 1");
    script(&tree.join("scripts/build/python-env"), &noisy("pip"));
    script(&tree.join("scripts/build/sim"), &noisy("build-sim"));
    symlink(sim_dir(), tree.join("target/sim")).unwrap();
    symlink(cli_bin(), tree.join("target/release/gpumemhook")).unwrap();
    symlink(hook_lib(), tree.join("target/release/libgpumemhook.so")).unwrap();
    symlink(
        gpumemhook_tests::python(),
        tree.join("target/venv/bin/python"),
    )
    .unwrap();
    std::fs::write(
        tree.join("scripts/workloads/demo_sim.py"),
        "import ctypes\n\
         rt = ctypes.CDLL('libcudart.so.13')\n\
         p = ctypes.c_void_p()\n\
         assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(3 << 20)) == 0\n\
         print('the workload allocated 3 MiB')\n",
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let demo = |fail: Option<&str>| {
        let mut command = std::process::Command::new(tree.join("scripts/demo"));
        command
            .env("PATH", &path)
            .env("GPUMEMHOOK_SHM_DIR", dir.join("shm"))
            .env_remove("LD_PRELOAD")
            .env_remove("GPUMEMHOOK_LIMIT")
            .env_remove("GPUMEMHOOK_LIB")
            .stdin(Stdio::null());
        if let Some(var) = fail {
            command.env(var, "3");
        }
        command.output().unwrap()
    };
    let o = demo(None);
    assert!(o.status.success(), "{}", show(&o));
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(!all.contains("noise"), "set-up output shown: {}", show(&o));
    // The demo's own story is still told: its steps, the program's output, gpumemhook's summary.
    for want in [
        "== building the hook",
        "the workload allocated 3 MiB",
        "1 process used the GPU",
        "== the exit report",
    ] {
        assert!(all.contains(want), "{want:?} missing: {}", show(&o));
    }
    // It ends with the one Python it set up, what that Python holds, and how to use it.
    let venv_python = tree.join("target/venv/bin/python").display().to_string();
    for want in [
        "\npython:    ".to_string(),
        format!("The Python set up here (the package, pytest, ipykernel): {venv_python}"),
        format!("{venv_python} -m pytest --gpumem"),
        format!("kernel install --python {venv_python}"),
    ] {
        assert!(all.contains(&want), "{want:?} missing: {}", show(&o));
    }
    // A step that fails shows everything it printed, and the demo stops there.
    for (var, step) in [
        ("FAIL_CARGO", "cargo build --release"),
        ("FAIL_PIP", "scripts/build/python-env"),
    ] {
        let o = demo(Some(var));
        assert_eq!(o.status.code(), Some(1), "{var}: {}", show(&o));
        let err = text(&o.stderr);
        assert!(
            err.contains("noise on stdout") && err.contains("noise on stderr"),
            "{var}: {}",
            show(&o)
        );
        assert!(
            err.contains(&format!("demo: this step failed: {step}")),
            "{var}: {}",
            show(&o)
        );
        assert!(
            !text(&o.stdout).contains("== the exit report"),
            "{}",
            show(&o)
        );
    }
}

/// `run --trace` presents the summary while the hook's files are still there: each process's
/// timeline is read for its scopes after the program ended, before its private directory goes.
#[test]
fn run_reads_each_timeline_for_its_summary_before_its_files_are_removed() {
    let dir = scratch("cli-run-trace");
    let sim = simrun();
    let trace = dir.join("t.json");
    let trace_arg = trace.to_string_lossy().into_owned();
    let o = gmh(
        &dir,
        &[
            "run",
            "--trace",
            &trace_arg,
            "--",
            &sim,
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:4096",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(!err.contains("is unreadable"), "{err}");
    assert!(err.contains(&format!("timeline: {trace_arg}")), "{err}");
    assert!(trace.is_file(), "{err}");
}

#[test]
fn plot_of_an_exit_report_says_how_to_get_a_timeline_and_an_os_error_is_said_once() {
    let dir = scratch("cli-small-errors");
    std::fs::write(dir.join("report.json"), r#"{"pid": 1, "devices": []}"#).unwrap();
    let o = gmh(&dir, &["plot", "report.json", "-o", "x.png"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains(
            "this is an exit report, not a timeline: record one with `gpumemhook run --trace FILE`"
        ),
        "{}",
        show(&o)
    );
    let o = gmh(&dir, &["group", "nosuch"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(
        text(&o.stderr).matches("(os error 2)").count(),
        1,
        "{}",
        show(&o)
    );
}

/// `gpumemhook run ... &` then `gpumemhook limit $!`: `$!` is the launcher, not the program; the
/// command reaches the one hooked program under it and says so.
#[test]
fn limit_of_a_gpumemhook_run_pid_reaches_its_program() {
    let dir = scratch("cli-limit-launcher");
    let sim = gpumemhook_tests::sim_dir().join("simrun");
    let ready = dir.join("ready");
    let go = dir.join("go");
    let mut launcher = cli(&dir, &["run", "--quiet", "--", sim.to_str().unwrap()])
        .args([
            "rt.malloc:a:1048576".to_string(),
            format!("touch:{}", ready.display()),
            format!("wait:{}", go.display()),
            // Past the 2 MiB ceiling set below: refused (2, out of memory), as expected.
            "rt.malloc:b:2097152=2".to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&ready);
    let o = gmh(&dir, &["limit", &launcher.id().to_string(), "2MiB"]);
    std::fs::write(&go, "").unwrap();
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        text(&o.stderr).contains(&format!("process {} (", launcher.id()))
            && text(&o.stderr).contains("is not hooked; its hooked program is process"),
        "{}",
        show(&o)
    );
    assert!(
        !text(&o.stdout).contains(&format!("process {}:", launcher.id())),
        "{}",
        show(&o)
    );
    let out = child_output(&mut launcher);
    assert!(
        out.status.success(),
        "the program's second allocation was refused: {}",
        show(&out)
    );
}

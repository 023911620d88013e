//! The flight recorder (`GPUMEMHOOK_TRACE`): what a process counted is in its file as it goes,
//! whatever ends it, at any length, in 32 bytes an event, and read back in bounded memory.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;

use gpumemhook_reader::Snapshot;
use gpumemhook_segment::{CHUNK_BYTES, RECORDING_HEADER_BYTES, RECORD_BYTES};
use gpumemhook_tests::{cli, measured, measured_rss, timeline, wait_for, Run};
use gpumemhook_timeline::{read_chrome_trace, read_recording, write_recording_as_chrome, Keep};

/// The peak of every device the timeline replays to.
fn peaks(t: &gpumemhook_timeline::Timeline) -> Vec<(u32, u64)> {
    t.used
        .iter()
        .map(|(&d, series)| (d, series.iter().map(|&(_, used)| used).max().unwrap_or(0)))
        .collect()
}

/// The live process `pid` as `gpumemhook ls --json` shows it (its segment under `shm`).
fn live(dir: &Path, shm: &Path, pid: u32) -> Snapshot {
    let out = cli(dir, &["ls", "--json"])
        .env("GPUMEMHOOK_SHM_DIR", shm)
        .output()
        .unwrap();
    let all: Vec<Snapshot> = serde_json::from_slice(&out.stdout).unwrap();
    all.into_iter()
        .find(|s| s.pid == pid)
        .expect("the process is listed")
}

/// Starts `run` (its stdout thrown away, its stderr piped) and returns it once it has made all its
/// allocations: it then touches a file and sleeps until the test signals it.
fn start_until_ready(run: Run) -> std::process::Child {
    let ready = run.dir().join("ready");
    let (mut command, _) = run
        .arg(format!("touch:{}", ready.display()))
        .arg("sleep:60000")
        .into_command();
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&ready);
    child
}

#[test]
fn a_process_killed_by_sigkill_or_sigterm_leaves_a_timeline_that_reads_to_its_exact_peak() {
    for signal in [libc::SIGKILL, libc::SIGTERM] {
        let run = Run::sim(
            "simrun",
            &[
                "drv.init",
                "drv.ctx:0",
                "rt.malloc:a:3145728",
                "rt.malloc:b:1048576",
                "rt.free:a",
                "threads:3:3000:7:65536",
                "drv.ctx:1",
                "drv.alloc:c:777",
            ],
        );
        let dir = run.dir().to_path_buf();
        let trace = dir.join("t");
        let mut child = start_until_ready(run.env("GPUMEMHOOK_TRACE", &trace));
        let before = live(&dir, &dir.join("shm"), child.id());
        // Read as it is, mid-run: cut short, to its last whole event.
        let running = timeline(&trace);
        assert!(running.cut_short);
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(signal)
        );
        let t = timeline(&trace);
        assert!(t.cut_short, "signal {signal}");
        let expected: Vec<(u32, u64)> = before.devices.iter().map(|d| (d.device, d.peak)).collect();
        assert_eq!(peaks(&t), expected, "signal {signal}");
        assert_eq!(peaks(&running), expected);
        let allocs: u64 = before.devices.iter().map(|d| d.allocs).sum();
        assert_eq!(t.counts["alloc"], allocs);
        // `report` reads it and says how it ended.
        let out = cli(&dir, &["report", trace.to_str().unwrap()])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        assert!(said.contains("cut short"), "{said}");
        assert!(said.contains("4.00 MiB"), "{said}");
    }
}

#[test]
fn four_and_a_half_million_events_are_all_kept_in_32_bytes_each_and_report_reads_them_in_bounded_memory(
) {
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:1:4500000:7:4096"],
    );
    let dir = run.dir().to_path_buf();
    let trace = dir.join("t");
    let ran = run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
    let report = ran.report();
    let size = std::fs::metadata(&trace).unwrap().len();
    let t = read_recording(&trace, Keep::Figures).unwrap();
    assert!(!t.cut_short);
    assert_eq!(t.dropped, 0);
    let device = report.device(0);
    assert_eq!(t.counts["alloc"], device.allocs);
    assert_eq!(t.counts["free"], device.frees);
    assert!(device.allocs + device.frees >= 4_500_000);
    assert_eq!(peaks(&t), vec![(0, device.peak)]);
    // 32 bytes an event; each chunk's own first record, the names and the last chunk's free room
    // on top.
    let events = t.events;
    let records_per_chunk = CHUNK_BYTES / RECORD_BYTES;
    let bound = RECORDING_HEADER_BYTES
        + RECORD_BYTES * events * records_per_chunk / (records_per_chunk - 1)
        + 2 * CHUNK_BYTES;
    assert!(
        size <= bound,
        "{size} bytes for {events} events ({:.2} an event)",
        size as f64 / events as f64
    );
    // `report` of them, its peak resident memory as the kernel counted it.
    let rss = dir.join("report.rss");
    let status = measured(&cli(&dir, &["report", trace.to_str().unwrap()]), 600, &rss)
        .stdout(std::fs::File::create(dir.join("report.txt")).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let max_rss_kib = measured_rss(&rss);
    assert!(
        max_rss_kib < 512 * 1024,
        "report of {events} events grew to {max_rss_kib} KiB"
    );
    let said = std::fs::read_to_string(dir.join("report.txt")).unwrap();
    assert!(said.contains("device memory events"), "{said}");
    eprintln!("report of {events} events: {max_rss_kib} KiB at most");
}

#[test]
fn forked_children_record_files_of_their_own_while_the_parents_threads_allocate() {
    // With a ring too: a child empties the slot states it inherited and rings a file of its own.
    for ring in [None, Some("2M")] {
        let run = Run::sim(
            "simrun",
            &[
                "drv.init",
                "drv.ctx:0",
                "rt.malloc:a:1048576",
                "forkstorm:12:4",
            ],
        );
        let dir = run.dir().to_path_buf();
        let trace = dir.join("t");
        let run = match ring {
            Some(max) => run.env("GPUMEMHOOK_TRACE_MAX", max),
            None => run,
        };
        let ran = run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
        let t = timeline(&trace);
        assert_eq!(t.ring.is_some(), ring.is_some());
        // Every process wrote its exit report; the parent's is the one of the file's pid.
        let report = ran.reports().remove(&t.pid).expect("the parent's report");
        assert!(!t.cut_short);
        if ring.is_none() {
            assert_eq!(peaks(&t), vec![(0, report.device(0).peak)]);
            assert_eq!(t.counts["alloc"], report.device(0).allocs);
        }
        // What `report --json` states, a ring's overwritten part included, is the exit report's.
        let stated = crate::ring::replayed(&dir, &trace);
        let figures = |d: &gpumemhook_reader::DeviceStats| (d.peak, d.used, d.allocs, d.frees);
        assert_eq!(
            figures(&stated.devices[0]),
            figures(&report.device(0)),
            "ring {ring:?}"
        );
        // Each child that recorded anything did so in `t.<its pid>`, never in its parent's file.
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if let Some(pid) = name.strip_prefix("t.") {
                let child = timeline(&dir.join(&name));
                assert_eq!(child.pid.to_string(), pid);
                assert_eq!(child.ring.is_some(), ring.is_some());
            }
        }
    }
}

#[test]
fn a_file_that_cannot_grow_loses_events_says_so_once_and_the_counts_stay_exact() {
    // A file size limit (`ulimit -f`) stands in for a full disk: the timeline may grow by a few
    // chunks, then no more; the hook must not die of SIGXFSZ.
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:2:20000:7:4096"],
    );
    let dir = run.dir().to_path_buf();
    let trace = dir.join("t");
    let (mut command, _) = run.env("GPUMEMHOOK_TRACE", &trace).into_command();
    let limit = RECORDING_HEADER_BYTES + 3 * CHUNK_BYTES;
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let l = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &l) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    };
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // simrun's own count: "threads allocs=A frees=F ...".
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> u64 {
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {stdout}"))
    };
    let (allocs, frees) = (field("allocs="), field("frees="));
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("cannot grow"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(stderr.contains("misses"), "{stderr}");
    let report: Snapshot = serde_json::from_slice(
        &std::fs::read(
            std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.to_string_lossy().contains("report."))
                .unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (report.device(0).allocs, report.device(0).frees),
        (allocs, frees)
    );
    let t = timeline(&trace);
    assert!(t.dropped > 0);
    // Every allocation and free is in the file or counted lost.
    assert_eq!(
        t.counts["alloc"] + t.counts["free"] + t.dropped,
        allocs + frees
    );
    assert!(std::fs::metadata(&trace).unwrap().len() <= limit);
}

#[test]
fn the_compact_timeline_reads_as_its_chrome_export_does() {
    // Every kind of record: allocations of each memory kind, refusals, scopes, ceiling steps,
    // several threads; the timeline built from the file equals the one read back from its Chrome
    // JSON.
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:1048576",
            "scopes:50",
            "threads:3:2000:7:65536",
            "rt.malloc:b:8388608",
            "rt.malloc_managed:m:4096",
            "rt.malloc_host:h:100",
            "rt.free:a",
            "drv.ctx:1",
            "drv.alloc:c:777",
        ],
    );
    let dir = run.dir().to_path_buf();
    let trace = dir.join("t");
    run.env("GPUMEMHOOK_TRACE", &trace)
        .env("GPUMEMHOOK_LIMIT", "6MiB")
        .run();
    let compact = timeline(&trace);
    let mut json = Vec::new();
    write_recording_as_chrome(&trace, &mut json).unwrap();
    let chrome = read_chrome_trace(std::str::from_utf8(&json).unwrap()).unwrap();
    assert_eq!(compact, chrome);
    assert!(compact.counts["denied"] >= 1);
    // Each scope mark's name number and slot (`EventRecord::scope_address`) read back: every
    // scope named, and closed by the mark of its own slot.
    let scopes: Vec<(&str, bool)> = compact
        .scopes
        .iter()
        .map(|(name, _, close)| (name.as_str(), close.is_some()))
        .collect();
    let names: Vec<String> = (0..50).map(|i| format!("scope-{i}")).collect();
    let expected: Vec<(&str, bool)> = names.iter().map(|n| (n.as_str(), true)).collect();
    assert_eq!(scopes, expected);
    assert!(!compact.allocations.is_empty());
}

#[test]
fn hostile_bytes_in_a_recording_are_read_to_where_they_start_and_never_crash_the_reader() {
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:2:3000:7:65536"],
    );
    let dir = run.dir().to_path_buf();
    let trace = dir.join("t");
    run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
    let whole = std::fs::read(&trace).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..40 {
        let mut bytes = whole.clone();
        // Scribble over some records past the header: random words, records of unknown tags,
        // strings whose length runs past their chunk.
        for _ in 0..(1 + round % 8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = RECORDING_HEADER_BYTES as usize
                + (seed as usize % (bytes.len() - RECORDING_HEADER_BYTES as usize - 8)) / 8 * 8;
            bytes[at..at + 8].copy_from_slice(&seed.to_le_bytes());
        }
        if round % 5 == 0 {
            bytes.truncate(bytes.len() - (seed as usize % 5000));
        }
        let path = dir.join(format!("hostile-{round}"));
        std::fs::write(&path, &bytes).unwrap();
        let out = cli(&dir, &["report", path.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "round {round}: {stderr}");
    }
    // A header of another version is refused with words, not read.
    let mut other = whole.clone();
    other[8] = 99;
    let path = dir.join("other-version");
    std::fs::write(&path, &other).unwrap();
    let out = cli(&dir, &["report", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("format version 99"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_link_at_the_timeline_path_has_its_target_replaced_never_written_through() {
    let run = Run::sim("simrun", &["drv.init", "drv.ctx:0", "rt.malloc:a:4096"]);
    let dir = run.dir().to_path_buf();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"keep me").unwrap();
    let trace = dir.join("t");
    std::os::unix::fs::symlink(&victim, &trace).unwrap();
    // The link is this user's, so it is followed to its target, which is replaced by rename: the
    // victim's old bytes are never written over in place.
    let before = std::fs::File::open(&victim).unwrap();
    run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
    let mut kept = String::new();
    std::io::Read::read_to_string(&mut &before, &mut kept).unwrap();
    assert_eq!(kept, "keep me", "the old file was written through");
    assert_eq!(timeline(&trace).counts["alloc"], 1);
}

#[test]
fn run_closes_the_timeline_of_a_process_killed_before_it_finished_it_and_says_by_what() {
    // With `%p`, and without: the command's file is then renamed PATH once it is closed.
    for pattern in ["t.%p", "t.trace"] {
        let dir = gpumemhook_tests::scratch("run-closes");
        let ops = ["drv.init", "drv.ctx:0", "rt.malloc:a:3145728"];
        let mut child = start_run_until_ready(&dir, pattern, &ops);
        // `run` passes SIGTERM on to the program, which dies of it.
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        child.wait().unwrap();
        let trace = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("t."))
            .expect("the timeline");
        let t = timeline(&trace);
        assert!(t.cut_short);
        assert_eq!(t.killed_by, Some(Some(libc::SIGTERM as u32)), "{pattern}");
        assert_eq!(peaks(&t), vec![(0, 3145728)]);
        let out = cli(&dir, &["report", trace.to_str().unwrap()])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("killed by signal 15 (SIGTERM) before it finished its timeline"),
            "{said}"
        );
    }
}

#[test]
fn threads_that_end_leave_no_chunk_of_the_timeline_mapped() {
    // 2,048 threads that each allocate once and end: each had a chunk of its own; without the
    // thread-exit handler each would leave its 64 KiB mapped (a mapping each, up to the kernel's
    // limit on mappings).
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "threads:1024:2:7:4096",
            "threads:1024:2:8:4096",
        ],
    );
    let trace = run.dir().join("t");
    let mut child = start_until_ready(run.env("GPUMEMHOOK_TRACE", &trace));
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let name = trace.file_name().unwrap().to_str().unwrap();
    let mapped = maps
        .lines()
        .filter(|l| l.ends_with(&format!("/{name}")))
        .count();
    // The header page and the main thread's chunk.
    assert!(mapped <= 2, "{mapped} mappings of the timeline left");
    let t = timeline(&trace);
    assert!(t.counts["alloc"] >= 2048, "{:?}", t.counts);
}

#[test]
fn a_timeline_sent_to_dev_null_keeps_nothing_anywhere() {
    // Other targets that cannot be mapped (a FIFO, /dev/stdout) get an unnamed temporary file,
    // copied at exit; for the null device that copy would only fill the temporary folder.
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:1:20000:7:4096"],
    );
    let dir = run.dir().to_path_buf();
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let child = start_until_ready(run.env("GPUMEMHOOK_TRACE", "/dev/null").env("TMPDIR", &tmp));
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    let kept: Vec<&str> = maps
        .lines()
        .filter(|l| l.contains(tmp.to_str().unwrap()))
        .collect();
    assert!(kept.is_empty(), "{kept:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `gpumemhook run --trace PATH -- simrun OPS..., touch:ready, sleep:60000`, started in `dir` and
/// returned once the program made its allocations (stdout and stderr thrown away).
fn start_run_until_ready(dir: &Path, trace: &str, ops: &[&str]) -> std::process::Child {
    let ready = dir.join("ready");
    let sim = gpumemhook_tests::sim_dir().join("simrun");
    let touch = format!("touch:{}", ready.display());
    let mut args = vec!["run", "--trace", trace, "--", sim.to_str().unwrap()];
    args.extend_from_slice(ops);
    args.extend_from_slice(&[&touch, "sleep:60000"]);
    let child = cli(dir, &args)
        .env("LD_LIBRARY_PATH", gpumemhook_tests::sim_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&ready);
    child
}

#[test]
fn run_trace_writes_its_path_as_events_come_and_a_sigkilled_run_leaves_it_whole() {
    let dir = gpumemhook_tests::scratch("run-trace-stream");
    let ops = ["drv.init", "drv.ctx:0", "rt.malloc:a:3145728"];
    let mut run = start_run_until_ready(&dir, "t.trace", &ops);
    // Mid-run, `report PATH` reads what the program counted so far.
    let out = cli(&dir, &["report", "t.trace"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("3.00 MiB"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let children = format!("/proc/{0}/task/{0}/children", run.id());
    let program: i32 = std::fs::read_to_string(children)
        .unwrap()
        .split_whitespace()
        .next()
        .expect("run's program")
        .parse()
        .unwrap();
    // `run` itself dies, its program goes on: PATH holds every event counted, to the last.
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGKILL) }, 0);
    run.wait().unwrap();
    let t = timeline(&dir.join("t.trace"));
    // SAFETY: a signal to the program `run` started, orphaned now.
    unsafe { libc::kill(program, libc::SIGKILL) };
    assert!(t.cut_short);
    assert_eq!(t.pid, program as u32);
    assert_eq!((peaks(&t), t.counts["alloc"]), (vec![(0, 3145728)], 1));

    // The next run replaces the link the killed one left at PATH (not followed to its file).
    let sim = gpumemhook_tests::sim_dir().join("simrun");
    let out = cli(
        &dir,
        &["run", "--trace", "t.trace", "--", sim.to_str().unwrap()],
    )
    .args(["drv.init", "drv.ctx:0", "rt.malloc:a:1048576"])
    .env("LD_LIBRARY_PATH", gpumemhook_tests::sim_dir())
    .output()
    .unwrap();
    assert!(out.status.success());
    let left = timelines_left(&dir);
    let names: Vec<String> = left.keys().cloned().collect();
    assert_eq!(names, ["t.trace".to_string(), format!("t.trace.{program}")]);
    assert!(std::fs::symlink_metadata(dir.join("t.trace"))
        .unwrap()
        .is_file());
    assert_eq!(peaks(&left["t.trace"]), vec![(0, 1048576)]);
    assert_eq!(
        peaks(&left[&format!("t.trace.{program}")]),
        vec![(0, 3145728)]
    );
}

/// The timelines `run --trace t.trace` left in `dir`: `t.trace` and every `t.trace.<pid>`, by name.
fn timelines_left(dir: &Path) -> BTreeMap<String, gpumemhook_timeline::Timeline> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("t.trace"))
        .map(|name| (name.clone(), timeline(&dir.join(name))))
        .collect()
}

#[test]
fn run_trace_keeps_the_timeline_of_every_process_of_a_job_and_names_each() {
    let sim = gpumemhook_tests::sim_dir().join("simrun");
    let sim = sim.to_str().unwrap();
    // The command itself and a child it forks: the command's timeline at PATH, the child's beside.
    let forked = [sim, "drv.init", "drv.ctx:0", "rt.malloc:a:1048576", "fork"]
        .into_iter()
        .chain(["rt.malloc:b:2097152", "endfork"]);
    // A launcher (a shell that uses no GPU) of two programs: the one with the highest peak at PATH.
    let script = format!(
        "{sim} drv.init drv.ctx:0 rt.malloc:a:1048576 & \
         {sim} drv.init drv.ctx:0 rt.malloc:b:2097152; wait"
    );
    let launched = ["sh", "-c", &script];
    for (command, main) in [
        (forked.collect::<Vec<_>>(), 1048576),
        (launched.to_vec(), 2097152),
    ] {
        let dir = gpumemhook_tests::scratch("run-trace-job");
        let mut args = vec!["run", "--trace", "t.trace", "--"];
        args.extend(command);
        let out = cli(&dir, &args)
            .env("LD_LIBRARY_PATH", gpumemhook_tests::sim_dir())
            .env("FAKECUDA_FORK_OK", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let left = timelines_left(&dir);
        assert_eq!(left.len(), 2, "{:?}\n{err}", left.keys());
        assert!(std::fs::symlink_metadata(dir.join("t.trace"))
            .unwrap()
            .is_file());
        assert_eq!(peaks(&left["t.trace"]), vec![(0, main)], "{err}");
        for (name, t) in &left {
            assert!(!t.cut_short, "{name}");
            assert!(err.contains(&format!("timeline: {name} ")), "{name}: {err}");
            if name != "t.trace" {
                assert_eq!(name, &format!("t.trace.{}", t.pid));
                assert_eq!(peaks(t).len(), 1, "{name}");
                assert_ne!(peaks(t), vec![(0, main)], "{name}");
            }
        }
    }
}

/// `gpumemhook report --json FILE`, its one process.
fn report_json(dir: &Path, file: &Path) -> serde_json::Value {
    let out = cli(dir, &["report", "--json", file.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    list.into_iter().next().unwrap()
}

#[test]
fn report_json_of_a_timeline_states_the_exit_reports_figures_marked_replayed() {
    // A command line longer than the segment keeps: the timeline keeps more of it, and its
    // report states the part the exit report states.
    let long_name = format!("rt.malloc_host:{}:64", "h".repeat(300));
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:300000",
            "drv.alloc:b:500000",
            "rt.malloc:c:20000000=2",
            "rt.malloc:big:40000000=2",
            "rt.free:a",
            "rt.malloc_async:d:200000",
            "drv.ctx:1",
            "drv.alloc:e:123456",
            "rt.malloc_managed:m:4096",
            long_name.as_str(),
        ],
    );
    let trace = run.dir().join("t.trace");
    let ran = run
        .env("GPUMEMHOOK_TRACE", &trace)
        .env("GPUMEMHOOK_LIMIT", "30MB")
        .env("FAKECUDA_MEM_BYTES", "10000000")
        .run()
        .ok();
    let mut report = ran.report();
    let value = report_json(&ran.dir, &trace);
    assert_eq!(value["replayed"]["cut_short"], false, "{value}");
    assert_eq!(value["replayed"]["lost_events"], 0, "{value}");
    let mut replayed: Snapshot = serde_json::from_value(value).unwrap();
    // The timeline names a module by its file name only.
    for d in report.devices.iter_mut().chain(replayed.devices.iter_mut()) {
        d.by_module.iter_mut().for_each(|m| m.path.clear());
    }
    assert!(report.devices[0].denied == 1 && report.devices[0].failed == 1);
    assert_eq!(replayed.devices, report.devices);
    assert_eq!(replayed.host, report.host);
    assert_eq!(
        (replayed.pid, &replayed.command),
        (report.pid, &report.command)
    );
    assert_eq!(report.command.len(), gpumemhook_reader::COMMAND_LEN - 1);

    // A Chrome JSON timeline (of earlier versions, and `export --chrome`'s) counts its device
    // memory, the only kind it keeps one event at a time.
    let chrome = ran.dir.join("t.json");
    let out = cli(&ran.dir, &["export", trace.to_str().unwrap(), "--chrome"])
        .arg(&chrome)
        .output()
        .unwrap();
    assert!(out.status.success());
    let from_chrome: Snapshot = serde_json::from_value(report_json(&ran.dir, &chrome)).unwrap();
    for d in &mut report.devices {
        (d.managed, d.managed_peak) = (0, 0);
    }
    assert_eq!(from_chrome.devices, report.devices);
}

#[test]
fn report_json_of_a_killed_process_timeline_says_it_was_cut_short() {
    let run = Run::sim("simrun", &["drv.init", "drv.ctx:0", "rt.malloc:a:3145728"]);
    let trace = run.dir().join("t.trace");
    let dir = run.dir().to_path_buf();
    let mut child = start_until_ready(run.env("GPUMEMHOOK_TRACE", &trace));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let value = report_json(&dir, &trace);
    assert_eq!(value["replayed"]["cut_short"], true, "{value}");
    assert_eq!(value["devices"][0]["peak"], 3145728, "{value}");
}

#[test]
fn ten_thousand_short_lived_threads_share_chunks_in_a_file_under_16_mib_and_leave_no_mapping() {
    // Two events a thread: a chunk of its own each would be 64 KiB a thread (655 MB). An ending
    // thread hands the rest of its chunk to the next one.
    let run = Run::sim("simrun", &["drv.init", "drv.ctx:0", "brief:10000:4096"]);
    let trace = run.dir().join("t");
    let mut child = start_until_ready(run.env("GPUMEMHOOK_TRACE", &trace));
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let mapped = maps.lines().filter(|l| l.ends_with("/t")).count();
    // The header page and the main thread's chunk.
    assert!(mapped <= 2, "{mapped} mappings of the timeline left");
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(size < 16 << 20, "{size} bytes for 10,000 threads");
    let t = timeline(&trace);
    assert_eq!((t.counts["alloc"], t.counts["free"]), (10_000, 10_000));
    assert_eq!(peaks(&t), vec![(0, 4096)]);
    // Each thread's free after its allocation, whichever thread id the kernel gave again.
    assert_eq!(t.used[&0].last().map(|&(_, used)| used), Some(0));
    assert!(t.used[&0].iter().all(|&(_, used)| used <= 4096));
    eprintln!("10,000 threads of 2 events: {size} bytes");
}

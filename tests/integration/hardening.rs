//! The hook can never hurt the program it watches: fork while threads allocate, a closed stderr,
//! unwritable outputs, hostile configuration (planted symlinks and devices at output paths:
//! `outputs.rs`), `chdir`, the timeline's memory at
//! exit, and the driver-query shortcuts checked against the query.

use gpumemhook_tests::{scratch, sim_dir, Run};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

#[test]
fn forked_children_of_a_busy_process_never_hang() {
    // 1000 children forked while 4 threads allocate and free without pause; each child frees an
    // inherited block and allocates (the stand-in driver refuses both, as a real one does).
    let ran = Run::sim("simrun", &["drv.init", "drv.ctx:0", "forkstorm:1000:4"])
        .env("FAKECUDA_FRESH", "1")
        .env_remove("GPUMEMHOOK_REPORT")
        .run();
    let fields = ran.line_fields("forkstorm");
    assert_eq!(fields["hung"], "0", "{}", ran.stderr());
    assert!(ran.output.status.success(), "{}", ran.stderr());
    assert_eq!(fields["children"], "1000");
    assert!(
        fields["thread_ops"].parse::<u64>().unwrap() > 1000,
        "the threads must really have allocated meanwhile: {fields:?}"
    );
}

#[test]
fn a_child_that_never_used_cuda_leaves_nothing_and_overwrites_no_report() {
    let dir = scratch("child-quiet");
    let report = dir.join("report.json");
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:100",
            "fork",
            "endfork",
            "sleep:50",
        ],
    )
    .env("GPUMEMHOOK_REPORT", &report)
    .run()
    .ok();
    let snapshot: gpumemhook_reader::Snapshot =
        serde_json::from_slice(&std::fs::read(&report).expect("the parent's report")).unwrap();
    assert_eq!(
        (snapshot.device(0).used, snapshot.device(0).allocs),
        (100, 1),
        "the child (no CUDA) must not overwrite the parent's report"
    );
    assert!(
        ran.leftover_segments().is_empty(),
        "{:?}",
        ran.leftover_segments()
    );
}

#[test]
fn a_child_that_used_cuda_makes_its_segment_at_its_first_call() {
    // The child's first counted CUDA call (refused by the driver, as in a real forked child) makes
    // its own segment; the parent's counts are untouched by anything the child does. (The free of an
    // inherited block comes first: the runtime refuses it before any counting.)
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:100",
            "print.segment",
            "fork",
            "print.segment",
            "rt.free:a=3",
            "drv.alloc:b:200=3",
            "print.segment",
            "endfork",
            "rt.malloc:c:1",
        ],
    )
    .run()
    .ok();
    let out = ran.stdout();
    let segments: Vec<&str> = out.lines().filter(|l| l.starts_with("segment=")).collect();
    assert_eq!(segments.len(), 3, "{out}");
    assert_eq!(
        segments[1], "segment=none",
        "no segment before the child's first CUDA call"
    );
    assert_ne!(segments[2], "segment=none");
    assert_ne!(
        segments[0], segments[2],
        "the child has a segment of its own"
    );
    let reports = ran.reports();
    assert_eq!(reports.len(), 2, "{reports:#?}");
    let parent = reports.values().find(|r| r.device(0).allocs == 2).unwrap();
    let child = reports.values().find(|r| r.device(0).allocs == 0).unwrap();
    assert_eq!((parent.device(0).used, parent.device(0).frees), (101, 0));
    assert_eq!(
        (child.device(0).used, child.device(0).frees),
        (0, 0),
        "nothing the parent allocated is the child's"
    );
}

/// Runs `simrun ops` with stderr a pipe whose reading end is already closed, and SIGPIPE either
/// ignored (as Python does) or at its default action; returns the exit status.
fn with_closed_stderr(
    ignore_sigpipe: bool,
    ops: &[&str],
    envs: &[(&str, &str)],
) -> std::process::ExitStatus {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: closes the reading end this test owns; the writing end becomes the child's stderr.
    unsafe { libc::close(fds[0]) };
    let mut run = Run::sim("simrun", ops);
    for (k, v) in envs {
        run = run.env(k, v);
    }
    let (mut command, _dir) = run.into_command();
    // SAFETY: the writing end is a valid descriptor owned here; Stdio takes it over.
    let stderr = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
    command.stdout(Stdio::null()).stderr(Stdio::from(stderr));
    if ignore_sigpipe {
        // SAFETY: only signal(2) between fork and exec, which is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    command.status().expect("simrun runs")
}

#[test]
fn a_closed_stderr_and_unwritable_outputs_never_change_the_exit_status() {
    let unwritable = [
        ("GPUMEMHOOK_REPORT", "/nonexistent-dir/r.json"),
        ("GPUMEMHOOK_TRACE", "/nonexistent-dir/t.json"),
        ("GPUMEMHOOK_SHM_DIR", "/nonexistent-dir"),
    ];
    for ignore in [true, false] {
        let status = with_closed_stderr(
            ignore,
            &["drv.init", "drv.ctx:0", "rt.malloc:a:100"],
            &unwritable,
        );
        assert_eq!(
            status.code(),
            Some(0),
            "SIGPIPE ignored: {ignore}: {status:?} (a warning must never abort or kill the job)"
        );
        // An out-of-memory report that cannot be written: the program still gets its
        // out-of-memory error (simrun checks the code, 2) and runs on to its own exit status.
        let status = with_closed_stderr(
            ignore,
            &[
                "drv.init",
                "drv.ctx:0",
                "rt.malloc:a:100",
                "rt.malloc:b:200=2",
                "rt.free:a",
            ],
            &[
                ("GPUMEMHOOK_LIMIT", "150B"),
                ("GPUMEMHOOK_OOM_REPORT", "/nonexistent-dir/oom.json"),
            ],
        );
        assert_eq!(
            status.code(),
            Some(0),
            "SIGPIPE ignored: {ignore}: {status:?}"
        );
    }
}

#[test]
fn values_that_are_not_utf8_stop_the_program_naming_the_variable() {
    let ran = Run::sim("simrun", &["drv.init"])
        .env(
            "GPUMEMHOOK_LIMIT",
            std::ffi::OsStr::from_bytes(&[0xff, 0xfe]),
        )
        .run();
    assert_eq!(ran.output.status.code(), Some(2), "{}", ran.stderr());
    let err = ran.stderr();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("GPUMEMHOOK_LIMIT") && err.contains("UTF-8"),
        "{err}"
    );
}

#[test]
fn relative_paths_are_resolved_at_load_so_chdir_changes_nothing() {
    let dir = scratch("chdir");
    std::fs::create_dir_all(dir.join("segs")).unwrap();
    std::fs::create_dir_all(dir.join("elsewhere")).unwrap();
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:100",
            &format!("chdir:{}", dir.join("elsewhere").display()),
            "rt.malloc:b:28",
        ],
    )
    .env("GPUMEMHOOK_SHM_DIR", "segs")
    .env("GPUMEMHOOK_REPORT", "rel-report.json");
    let (mut command, _) = ran.into_command();
    let status = command.current_dir(&dir).status().unwrap();
    assert!(status.success());
    let left: Vec<_> = std::fs::read_dir(dir.join("segs")).unwrap().collect();
    assert!(left.is_empty(), "the segment file must be removed at exit");
    let snapshot: gpumemhook_reader::Snapshot =
        serde_json::from_slice(&std::fs::read(dir.join("rel-report.json")).unwrap()).unwrap();
    assert_eq!(snapshot.device(0).used, 128);
    assert!(!dir.join("elsewhere/rel-report.json").exists());
}

#[test]
fn scope_names_stay_true_past_65536_scope_events() {
    // Scope events used to carry a 16-bit name code that wrapped. The program marks 40 000 scopes
    // (80 000 events) with distinct names through the hook's in-process entry, as the readers do;
    // every span keeps its own name.
    let dir = scratch("scope-names");
    let trace = dir.join("t.json");
    Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "scopes:40000", "rt.malloc:a:64"],
    )
    .env("GPUMEMHOOK_TRACE", &trace)
    .run()
    .ok();
    let timeline = gpumemhook_tests::timeline(&trace);
    assert_eq!(timeline.scopes.len(), 40_000);
    for (i, (name, _, end)) in timeline.scopes.iter().enumerate() {
        assert_eq!(name, &format!("scope-{i}"));
        assert!(end.is_some());
    }
}

#[test]
fn one_visible_device_needs_no_device_query() {
    let ops = [
        "drv.init",
        "drv.ctx:0",
        "drv.alloc:a:100",
        "drv.alloc:b:200",
        "drv.alloc_async:c:300",
        "drv.free:a",
        "drv.alloc:d:400",
        "print.queries",
    ];
    let one = Run::sim("simrun", &ops)
        .env("FAKECUDA_DEVICES", "1")
        .run()
        .ok();
    let two = Run::sim("simrun", &ops).run().ok();
    // The first allocation asks (the count is learned after it); none after.
    assert_eq!(one.line_fields("queries")["queries"], "1");
    assert_eq!(two.line_fields("queries")["queries"], "4");
    for ran in [&one, &two] {
        let d = ran.report().device(0);
        assert_eq!((d.used, d.allocs, d.frees), (900, 4, 1));
    }
}

#[test]
fn a_streams_device_is_asked_once_and_forgotten_when_the_stream_dies() {
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.stream:s:1",
            "drv.ctx:0",
            "drv.alloc:warm:1",
            "drv.alloc_async_on:a:100:s",
            "drv.alloc_async_on:b:100:s",
            "drv.alloc_async_on:c:100:s",
            "print.queries",
            "print.var:s",
            "drv.stream_destroy:s",
            "drv.stream:t:0",
            "print.var:t",
            "drv.alloc_async_on:d:50:t",
            "print.queries",
        ],
    )
    .run()
    .ok();
    let out = ran.stdout();
    let queries: Vec<&str> = out.lines().filter(|l| l.starts_with("queries=")).collect();
    // warm: 1 context query; the stream: 1 query for three allocations.
    assert_eq!(queries, ["queries=2", "queries=3"], "{out}");
    let report = ran.report();
    assert_eq!(report.device(1).used, 300, "the stream of device 1");
    assert_eq!(
        report.device(0).used,
        51,
        "a new stream at the same handle (the stand-in recycles them) on device 0 is asked again:\n{out}"
    );
}

#[test]
fn the_simulated_driver_is_faithful_about_fork() {
    // Without the hook: a forked child's calls are refused, as with a real driver.
    Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:1",
            "fork",
            "rt.malloc:b:1=3",
            "endfork",
        ],
    )
    .unhooked()
    .run()
    .ok();
    assert!(sim_dir().join("libcuda.so.1").exists());
}

#[test]
fn the_report_names_the_release_that_counted() {
    let ran = Run::sim("simrun", &["drv.init", "drv.ctx:0", "rt.malloc:a:1"])
        .run()
        .ok();
    assert_eq!(ran.report().version, env!("CARGO_PKG_VERSION"));
}

#[test]
fn a_hundred_thousand_live_fresh_addresses_freed_in_any_order_stay_exact() {
    // A driver that never reuses an address, 100 000 allocations held at once (the ledger grows
    // through many sizes, on cold lines), then threads allocating and freeing beside them, then
    // every held block freed in a shuffled order: the hook's figures match the driver's own.
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "hold:100000:4096",
            "print.used:0",
            "threads:4:20000:9:65536",
            "release.held:12345",
            "print.used:0",
        ],
    )
    .env("FAKECUDA_FRESH", "1")
    .env("FAKECUDA_DEVICES", "1")
    .run()
    .ok();
    let out = ran.stdout();
    let used: Vec<u64> = out
        .lines()
        .filter_map(|l| l.strip_prefix("used dev=0 bytes="))
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(used[0], 100_000 * 4096, "{out}");
    let t = ran.line_fields("threads ");
    let num = |k: &str| -> u64 { t[k].parse().unwrap() };
    let d = ran.report().device(0);
    assert_eq!(d.used, used[1], "the hook's used is the driver's at exit");
    assert_eq!(d.allocs, 100_000 + num("allocs"));
    assert_eq!(d.frees, 100_000 + num("frees"));
    assert_eq!(d.total_allocated, 100_000 * 4096 + num("total"));
    assert!(d.peak >= 100_000 * 4096);
}

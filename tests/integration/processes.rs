//! The hook inside whole processes: other preloaded libraries, fork, programs without CUDA, no
//! /dev/shm, and the segment's life cycle.

use gpumemhook_tests::{sim_dir, Run};

fn probe() -> std::path::PathBuf {
    sim_dir().join("libnextprobe.so")
}

#[test]
fn another_preloaded_library_using_rtld_next_in_both_orders() {
    let ops = [
        "drv.init",
        "drv.ctx:0",
        "rt.malloc:a:100",
        "drv.alloc:b:200",
        "rt.free:a",
    ];
    for (order, run) in [
        (
            "probe first",
            Run::sim("simrun", &ops).preload_before(probe()),
        ),
        (
            "hook first",
            Run::sim("simrun", &ops).preload_after(probe()),
        ),
    ] {
        let ran = run.run();
        let ran = ran.ok();
        assert!(
            ran.stderr().contains("nextprobe calls=2"),
            "{order}: {}",
            ran.stderr()
        );
        let d = ran.report().device(0);
        assert_eq!((d.used, d.allocs, d.frees), (200, 2, 1), "{order}");
    }
}

#[test]
fn forked_child_counts_into_its_own_segment() {
    // The child's allocations are let through the stand-in driver (a real driver refuses them; see
    // `forked_children_of_a_busy_process_never_hang`): this checks the hook's bookkeeping.
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:100",
            "print.segment",
            "fork",
            "rt.malloc:b:200",
            "rt.free:b",
            "rt.malloc:c:50",
            "print.segment",
            "endfork",
            "rt.malloc:d:1",
            "rt.free:a",
        ],
    )
    .env("FAKECUDA_FORK_OK", "1")
    .run()
    .ok();
    let reports = ran.reports();
    assert_eq!(reports.len(), 2, "{reports:#?}");
    let out = ran.stdout();
    let segments: Vec<&str> = out.lines().filter(|l| l.starts_with("segment=")).collect();
    assert_eq!(segments.len(), 2, "{out}");
    assert_ne!(
        segments[0], segments[1],
        "the child must not write its parent's segment"
    );
    let (parent, child): (Vec<_>, Vec<_>) = reports
        .values()
        .partition(|r| r.device(0).allocs == 2 && r.device(0).used == 1);
    let (parent, child) = (parent[0].device(0), child[0].device(0));
    assert_eq!(
        (parent.used, parent.peak, parent.allocs, parent.frees),
        (1, 101, 2, 1)
    );
    assert_eq!(
        (child.used, child.peak, child.allocs, child.frees),
        (50, 200, 2, 1)
    );
    assert!(
        ran.leftover_segments().is_empty(),
        "{:?}",
        ran.leftover_segments()
    );
}

#[test]
fn programs_without_cuda_run_unchanged() {
    let python = gpumemhook_tests::python().display().to_string();
    for (program, args) in [
        ("/bin/true", vec![]),
        (python.as_str(), vec!["-c", "pass"]),
        ("/bin/echo", vec!["hello"]),
    ] {
        let mut run = Run::program(program, "nocuda");
        for a in &args {
            run = run.arg(a);
        }
        let baseline = {
            let mut b = Run::program(program, "nocuda-base").unhooked();
            for a in &args {
                b = b.arg(a);
            }
            b.run()
        };
        let ran = run.run();
        assert_eq!(
            ran.output.status.code(),
            baseline.output.status.code(),
            "{program}"
        );
        assert_eq!(ran.output.stdout, baseline.output.stdout, "{program}");
        assert_eq!(
            ran.stderr(),
            baseline.stderr(),
            "{program}: the hook must print nothing"
        );
        assert!(
            ran.leftover_segments().is_empty(),
            "{program}: segment left behind"
        );
        assert!(
            ran.reports().is_empty(),
            "{program}: a process that never used CUDA writes no report"
        );
    }
}

#[test]
fn no_usable_shm_dir_counts_in_process_memory_and_says_so_once() {
    let ran = Run::sim(
        "simrun",
        &["rt.malloc:a:100", "rt.malloc:b:100", "rt.free:a"],
    )
    .env("GPUMEMHOOK_SHM_DIR", "/nonexistent/gpumemhook")
    .run()
    .ok();
    let stderr = ran.stderr();
    assert_eq!(stderr.matches("gpumemhook:").count(), 1, "{stderr}");
    assert!(stderr.contains("process memory"), "{stderr}");
    let r = ran.report();
    assert_eq!(r.segment, None);
    assert_eq!((r.device(0).used, r.device(0).allocs), (100, 2));
}

#[test]
fn disabled_hook_passes_everything_through() {
    let ran = Run::sim("simrun", &["rt.malloc:a:100", "print.segment"])
        .env("GPUMEMHOOK_DISABLE", "1")
        .env("GPUMEMHOOK_LIMIT", "10B")
        .run()
        .ok();
    assert!(ran.reports().is_empty());
    assert!(ran.stdout().contains("segment=none"));
}

#[test]
fn the_segment_file_is_private_and_removed_at_exit() {
    use std::os::unix::fs::PermissionsExt;
    let run = Run::sim("simrun", &["rt.malloc:a:100", "touch:READY", "wait:GO"]);
    let dir = run.dir().to_path_buf();
    let (mut command, _) = run.into_command();
    command.current_dir(&dir);
    let mut child = command.spawn().expect("simrun starts");
    gpumemhook_tests::wait_for(&dir.join("READY"));
    let files: Vec<_> = std::fs::read_dir(dir.join("shm"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777;
    std::fs::write(dir.join("GO"), "").unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(mode, 0o600);
    assert!(!files[0].exists(), "segment removed at exit");
}

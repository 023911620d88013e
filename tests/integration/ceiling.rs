//! The allocation ceiling (`GPUMEMHOOK_LIMIT`, `GPUMEMHOOK_LIMIT_<i>`, and changes at run time).

use gpumemhook_reader::Process;
use gpumemhook_tests::Run;

const MIB: u64 = 1 << 20;

fn limited(limit: &str, ops: &[&str]) -> gpumemhook_tests::Ran {
    Run::sim("simrun", ops)
        .env("GPUMEMHOOK_LIMIT", limit)
        .run()
        .ok()
}

#[test]
fn the_boundary_byte_is_admitted_and_the_next_refused_without_reaching_the_driver() {
    let ran = limited(
        "1000B",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:600",
            "rt.malloc:b:401=2",
            "drv.alloc:c:401=2",
            "gpa2.alloc:c:401=2",
            "drv.create:h:401:0=2",
            "rt.malloc:d:400",
            "drv.alloc:e:1=2",
            "print.used:0",
        ],
    );
    let d = ran.report().device(0);
    assert_eq!(
        (d.used, d.peak, d.allocs, d.denied, d.failed, d.limit),
        (1000, 1000, 2, 5, 0, Some(1000))
    );
    assert!(
        ran.stdout().contains("used dev=0 bytes=1000"),
        "the driver saw only admitted allocations"
    );
}

#[test]
fn frees_make_room_again() {
    let ran = limited(
        "1KiB",
        &[
            "rt.malloc:a:1024",
            "rt.malloc:b:1=2",
            "rt.free:a",
            "rt.malloc:b:1024",
        ],
    );
    let d = ran.report().device(0);
    assert_eq!(
        (d.used, d.peak, d.allocs, d.frees, d.denied),
        (1024, 1024, 2, 1, 1)
    );
}

#[test]
fn a_runtime_path_out_of_sight_is_refused_after_the_fact_and_given_back() {
    let ran = Run::sim(
        "simrun",
        &["rt.malloc:a:600", "rt.malloc:b:600=2", "print.used:0"],
    )
    .env("GPUMEMHOOK_LIMIT", "1000B")
    .env("FAKECUDART_HIDDEN", "1")
    .run()
    .ok();
    let d = ran.report().device(0);
    assert_eq!((d.used, d.allocs, d.denied), (600, 1, 1));
    assert!(
        ran.stdout().contains("used dev=0 bytes=600"),
        "{}",
        ran.stdout()
    );
}

#[test]
fn per_device_ceilings_win_over_the_global_one() {
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "drv.alloc:a:5000",
            "drv.ctx:1",
            "drv.alloc:b:1000",
            "drv.alloc:c:1=2",
            "drv.ctx:2",
            "drv.alloc:d:9000=2",
        ],
    )
    .env("FAKECUDA_DEVICES", "3")
    .env("GPUMEMHOOK_LIMIT", "8000B")
    .env("GPUMEMHOOK_LIMIT_0", "1GiB")
    .env("GPUMEMHOOK_LIMIT_1", "1000B")
    .run()
    .ok();
    let r = ran.report();
    assert_eq!((r.device(0).used, r.device(0).limit), (5000, Some(1 << 30)));
    assert_eq!(
        (r.device(1).used, r.device(1).denied, r.device(1).limit),
        (1000, 1, Some(1000))
    );
    assert_eq!(
        (r.device(2).used, r.device(2).denied, r.device(2).limit),
        (0, 1, Some(8000))
    );
}

#[test]
fn eight_threads_racing_for_the_last_bytes() {
    for _ in 0..5 {
        let ran = limited(
            "10MiB",
            &["rt.malloc:warm:1", "rt.free:warm", "race:8:1048576"],
        );
        let race = ran.line_fields("race ");
        assert_eq!((race["ok"].as_str(), race["last"].as_str()), ("10", "2"));
        let d = ran.report().device(0);
        assert_eq!(
            (d.used, d.peak, d.denied, d.allocs),
            (10 * MIB, 10 * MIB, 8, 11)
        );
    }
}

fn fields(ran: &gpumemhook_tests::Ran, prefix: &str) -> (u64, u64) {
    let f = ran.line_fields(prefix);
    let get = |k: &str| {
        f.get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{prefix}: {f:?}"))
    };
    (get("free"), get("total"))
}

#[test]
fn memory_info_shows_the_ceilings_view_and_stays_consistent() {
    let ops = [
        "drv.init",
        "drv.ctx:0",
        "rt.malloc:a:600",
        "drv.meminfo",
        "rt.meminfo",
        "drv.total:0",
        "drv.total:1",
        "drv.meminfo_null",
    ];
    let ran = limited("1000B", &ops);
    assert_eq!(fields(&ran, "drv.meminfo"), (400, 1000));
    assert_eq!(fields(&ran, "rt.meminfo"), (400, 1000));
    assert!(ran.stdout().contains("drv.total dev=0 total=1000"));
    assert!(ran.stdout().contains("drv.total dev=1 total=1000"));
    // A ceiling above the card: the card's own figures.
    let ran = Run::sim("simrun", &ops)
        .env("FAKECUDA_MEM_BYTES", "5000")
        .env("GPUMEMHOOK_LIMIT", "1GiB")
        .run()
        .ok();
    assert_eq!(fields(&ran, "drv.meminfo"), (4400, 5000));
    // Free never exceeds what the card has free, even under a roomy ceiling.
    let ran = Run::sim("simrun", &ops)
        .env("FAKECUDA_MEM_BYTES", "5000")
        .env("GPUMEMHOOK_LIMIT", "4800B")
        .run()
        .ok();
    assert_eq!(fields(&ran, "drv.meminfo"), (4200, 4800));
}

#[test]
fn bad_ceilings_stop_the_program_with_a_clear_line() {
    for (var, value) in [
        ("GPUMEMHOOK_LIMIT", "lots"),
        ("GPUMEMHOOK_LIMIT", "0"),
        ("GPUMEMHOOK_LIMIT", "-8GiB"),
        ("GPUMEMHOOK_LIMIT", "8 parsecs"),
        ("GPUMEMHOOK_LIMIT", "8"),
        ("GPUMEMHOOK_LIMIT_0", "8"),
        ("GPUMEMHOOK_LIMIT_one", "8GiB"),
    ] {
        let ran = Run::sim("simrun", &["rt.malloc:a:1"]).env(var, value).run();
        assert_eq!(
            ran.output.status.code(),
            Some(2),
            "{var}={value} must exit 2, not crash or run"
        );
        let stderr = ran.stderr();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(var) && stderr.contains("gpumemhook:"),
            "{stderr}"
        );
        assert!(
            stderr.contains("8GiB") || var.ends_with("one"),
            "examples given: {stderr}"
        );
        assert!(ran.stdout().is_empty(), "the program never ran");
    }
}

#[test]
fn a_bare_number_is_refused_with_the_line_that_shows_the_fix() {
    // `GPUMEMHOOK_LIMIT=8` meant 8 GiB to whoever wrote it and 8 bytes to the parser: the program
    // stops before it runs, with one line, whether the ceiling or the call sites were asked for.
    for (var, value, says) in [
        (
            "GPUMEMHOOK_LIMIT",
            "8",
            "GPUMEMHOOK_LIMIT=8: 8 what? write 8GiB, or 8B for bytes",
        ),
        (
            "GPUMEMHOOK_LIMIT_1",
            " 512 ",
            "512 what? write 512GiB, or 512B for bytes",
        ),
        (
            "GPUMEMHOOK_STACKS",
            "python:1048576",
            "1048576 what? write 1048576GiB, or 1048576B for bytes",
        ),
        (
            "GPUMEMHOOK_EMULATE",
            "16",
            "GPUMEMHOOK_EMULATE=16: 16 what? write 16GiB, or 16B for bytes",
        ),
    ] {
        let ran = Run::sim("simrun", &["rt.malloc:a:1"]).env(var, value).run();
        assert_eq!(ran.output.status.code(), Some(2), "{var}={value}");
        let stderr = ran.stderr();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "{var}={value}: {stderr}");
        assert!(ran.stdout().is_empty(), "the program never ran");
    }
    // With its unit, the same number of bytes is a ceiling: 4096B admits 4096 bytes, not 4097.
    let d = limited("4096B", &["rt.malloc:a:4096", "rt.malloc:b:1=2"])
        .report()
        .device(0);
    assert_eq!((d.limit, d.used, d.denied), (Some(4096), 4096, 1));
}

#[test]
fn ceiling_changed_at_run_time_from_a_reader() {
    let run = Run::sim(
        "simrun",
        &[
            "rt.malloc:a:600",
            "rt.malloc:b:600=2",
            "touch:READY",
            "wait:GO",
            "rt.malloc:b:600",
            "rt.malloc:c:1=2",
        ],
    )
    .env("GPUMEMHOOK_LIMIT", "1000B");
    let dir = run.dir().to_path_buf();
    let (mut command, _) = run.into_command();
    let child = command
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("simrun starts");
    gpumemhook_tests::wait_for(&dir.join("READY"));
    let segment = std::fs::read_dir(dir.join("shm"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let process = Process::open(&segment).unwrap();
    assert_eq!(process.device(0).unwrap().limit, Some(1000));
    process.set_limit(Some(0), Some(1200)).unwrap();
    std::fs::write(dir.join("GO"), "").unwrap();
    let output = child.wait_with_output().unwrap();
    let d = gpumemhook_tests::Ran { output, dir }
        .ok()
        .report()
        .device(0);
    assert_eq!((d.used, d.limit, d.denied), (1200, Some(1200), 2));
}

//! Who holds the memory: every device allocation charged to the shared object that called into
//! CUDA for it (the breakdown by module), the allocations still held at exit (the leak report), and
//! the forensic report written at the first out-of-memory.

use gpumemhook_reader::Snapshot;
use gpumemhook_reader::{ModuleStats, OTHER_MODULE_NAME};
use gpumemhook_tests::Run;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// `(used, peak, allocs)` of each module of `device`, by file name.
fn modules(r: &Snapshot, device: u32) -> Vec<(String, u64, u64, u64)> {
    r.device(device)
        .by_module
        .iter()
        .map(|m| (m.module.clone(), m.used, m.peak, m.live_allocs))
        .collect()
}

fn module<'a>(r: &'a Snapshot, device: u32, name: &str) -> &'a ModuleStats {
    let d = r
        .devices
        .iter()
        .find(|d| d.device == device)
        .expect("device");
    d.by_module
        .iter()
        .find(|m| m.module == name)
        .unwrap_or_else(|| panic!("no module {name} in {:#?}", d.by_module))
}

#[test]
fn a_library_reaching_the_driver_through_get_proc_address_is_charged_apart_from_the_program() {
    // The program allocates through the runtime, the driver shadow and cuGetProcAddress; the
    // library through cuGetProcAddress and through cudaMalloc. The runtime's own driver calls are
    // charged to the runtime's caller, never to the runtime.
    let r = Run::sim(
        "simrun",
        &[
            "rt.malloc:a:1048576",
            "drv.init",
            "drv.ctx:0",
            "drv.alloc:b:1000",
            "gpa2.alloc:c:2000",
            "lib.alloc:x:3000",
            "lib.rt_alloc:y:5000",
            "lib.free:x",
            "drv.ctx:1",
            "lib.alloc:z:700",
        ],
    )
    .run()
    .ok()
    .report();
    assert_eq!(
        modules(&r, 0),
        vec![
            ("simrun".to_string(), MIB + 3000, MIB + 3000, 3),
            ("libfakecollective.so".to_string(), 5000, 8000, 1),
        ]
    );
    assert_eq!(
        modules(&r, 1),
        vec![("libfakecollective.so".to_string(), 700, 700, 1)]
    );
    let lib = module(&r, 0, "libfakecollective.so");
    assert!(
        lib.path.ends_with("/libfakecollective.so") && lib.path.starts_with('/'),
        "{}",
        lib.path
    );
    // The modules of a device add up to its `used`.
    for d in &r.devices {
        assert_eq!(d.by_module.iter().map(|m| m.used).sum::<u64>(), d.used);
    }
}

#[test]
fn a_runtime_allocation_the_hook_only_sees_at_the_runtime_is_charged_to_its_caller() {
    // FAKECUDART_HIDDEN: the runtime reaches the driver out of the hook's sight, so the runtime
    // shadow counts the allocation itself, for the program that called it.
    let r = Run::sim("simrun", &["rt.malloc:a:4096", "lib.rt_alloc:b:8192"])
        .env("FAKECUDART_HIDDEN", "1")
        .run()
        .ok()
        .report();
    assert_eq!(
        modules(&r, 0),
        vec![
            ("libfakecollective.so".to_string(), 8192, 8192, 1),
            ("simrun".to_string(), 4096, 4096, 1),
        ]
    );
}

#[test]
fn threads_freeing_each_others_blocks_leave_every_module_exact() {
    // Four threads allocate through the runtime and the driver and free each other's blocks in
    // any order, beside a library's allocations: the cells stay exact.
    let r = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "lib.alloc:x:12345",
            "threads:4:3000:7:65536",
            "hold:300:4096",
            "release.held:3",
        ],
    )
    .env("FAKECUDA_FRESH", "1")
    .run()
    .ok();
    let report = r.report();
    let fields = r.line_fields("threads ");
    let live: u64 = report.device(0).used - 12345;
    assert_eq!(
        modules(&report, 0)
            .iter()
            .find(|m| m.0 == "simrun")
            .map(|m| (m.1, m.3)),
        Some((live, fields["live"].parse().unwrap()))
    );
    assert_eq!(module(&report, 0, "libfakecollective.so").used, 12345);
}

#[test]
fn the_exit_report_lists_the_live_allocations_largest_first_capped_with_a_count_of_the_rest() {
    let r = Run::sim(
        "simrun",
        &[
            "hold:1204:512",
            "lib.alloc:big:3000000",
            "rt.malloc:mid:70000",
            "rt.malloc:gone:90000",
            "rt.free:gone",
        ],
    )
    .run()
    .ok()
    .report();
    let live = r
        .live
        .as_ref()
        .expect("an exit report lists live allocations");
    assert_eq!(live.len(), 1000);
    assert_eq!(r.live_omitted, 1206 - 1000);
    assert_eq!(
        (live[0].bytes, live[0].module.as_str()),
        (3_000_000, "libfakecollective.so")
    );
    assert_eq!((live[1].bytes, live[1].module.as_str()), (70_000, "simrun"));
    assert!(live.windows(2).all(|w| w[0].bytes >= w[1].bytes));
    for a in live {
        assert!(a.address.starts_with("0x1"), "{}", a.address);
        assert!((0.0..60.0).contains(&a.age_s), "{}", a.age_s);
        assert_eq!(a.site, None, "no Python, no site");
    }
}

#[test]
fn a_process_with_nothing_left_reports_an_empty_leak_list() {
    let r = Run::sim("simrun", &["rt.malloc:a:4096", "rt.free:a"])
        .run()
        .ok()
        .report();
    assert_eq!(r.live.as_deref(), Some(&[][..]));
    assert_eq!(r.live_omitted, 0);
    // A module that held memory keeps its row (its peak), with nothing held.
    assert_eq!(modules(&r, 0), vec![("simrun".to_string(), 0, 4096, 0)]);
}

#[test]
fn the_first_refusal_by_the_ceiling_writes_one_forensic_report_before_the_error_returns() {
    // The program exec()s away right after the refusals: no exit report, but the out-of-memory
    // report, written before the error came back, is there, and only one.
    let run = Run::sim("simrun", &[]);
    let dir = run.dir().to_path_buf();
    let r = run
        .env("GPUMEMHOOK_LIMIT", "1MiB")
        .env("GPUMEMHOOK_OOM_REPORT", dir.join("oom.%p.json"))
        .env("GPUMEMHOOK_TRACE", dir.join("trace.json"))
        .arg("rt.malloc:a:524288")
        .arg("lib.alloc:b:2097152=2")
        .arg("rt.malloc:c:2097152=2")
        .arg("exec.unhooked:/bin/true")
        .run()
        .ok();
    assert!(r.reports().is_empty(), "exec leaves no exit report");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("oom."))
        .collect();
    assert_eq!(files.len(), 1, "one report per process, not per retry");
    let text = std::fs::read_to_string(files[0].path()).unwrap();
    let report: Snapshot = serde_json::from_str(&text).unwrap();
    let oom = report.oom.as_ref().expect("the oom section");
    assert_eq!(
        (
            oom.device,
            oom.bytes,
            oom.entry.as_str(),
            oom.reason.as_str(),
            oom.used,
            oom.limit,
            oom.module.as_str()
        ),
        (
            0,
            2 * MIB,
            "cuMemAlloc_v2",
            "ceiling",
            512 * KIB,
            Some(MIB),
            "libfakecollective.so"
        )
    );
    assert_eq!(
        modules(&report, 0),
        vec![("simrun".to_string(), 512 * KIB, 512 * KIB, 1)]
    );
    let live = report.live.as_ref().unwrap();
    assert_eq!(live.len(), 1);
    let tail = report
        .timeline
        .as_ref()
        .expect("the timeline's last events");
    let last = tail.last().unwrap();
    assert_eq!(
        (last.event.as_str(), last.bytes, last.module.as_str()),
        ("denied", 2 * MIB, "libfakecollective.so")
    );
    assert_eq!(tail[0].event, "alloc");
}

#[test]
fn the_driver_running_out_writes_the_report_with_reason_driver() {
    let run = Run::sim("simrun", &[]);
    let dir = run.dir().to_path_buf();
    let r = run
        .env("FAKECUDA_MEM_BYTES", "1048576")
        .env("GPUMEMHOOK_OOM_REPORT", dir.join("oom.json"))
        .arg("rt.malloc:a:4096")
        .arg("rt.malloc:b:2097152=2")
        .run()
        .ok();
    let report: Snapshot =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oom.json")).unwrap()).unwrap();
    let oom = report.oom.unwrap();
    assert_eq!(
        (
            oom.reason.as_str(),
            oom.bytes,
            oom.used,
            oom.limit,
            oom.module.as_str()
        ),
        ("driver", 2 * MIB, 4096, None, "simrun")
    );
    assert!(
        report.timeline.is_none(),
        "no timeline recorded, none listed"
    );
    // The exit report is there as well, and has no oom section.
    assert!(r.report().oom.is_none());
}

#[test]
fn without_the_variable_no_forensic_report_is_written() {
    let run = Run::sim("simrun", &[]);
    let dir = run.dir().to_path_buf();
    run.env("GPUMEMHOOK_LIMIT", "1MiB")
        .arg("rt.malloc:b:2097152=2")
        .run()
        .ok();
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    assert!(!names.iter().any(|n| n.contains("oom")), "{names:?}");
}

#[test]
fn a_forked_child_names_its_parents_modules_in_its_own_segment() {
    // The child's first allocation comes from a module its parent registered: the child's
    // segment must still carry that module's name.
    let r = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "lib.alloc:x:4096", "forkstorm:3:1"],
    )
    .env("FAKECUDA_FORK_OK", "1")
    .run()
    .ok();
    let reports = r.reports();
    let with_modules = reports
        .values()
        .filter(|s| s.devices.iter().any(|d| !d.by_module.is_empty()))
        .count();
    assert!(with_modules >= 2, "parent and children: {reports:#?}");
    for (pid, report) in &reports {
        for d in &report.devices {
            for m in &d.by_module {
                assert!(
                    m.module == "simrun" || m.module == "libfakecollective.so",
                    "pid {pid}: {m:?}"
                );
                assert_ne!(m.module, OTHER_MODULE_NAME);
            }
        }
    }
}

//! Each door by which an allocation reaches the hook, counted exactly once, on the right device.

use gpumemhook_tests::Run;

const MIB: u64 = 1 << 20;

fn sim(ops: &[&str]) -> gpumemhook_reader::Snapshot {
    Run::sim("simrun", ops).run().ok().report()
}

#[test]
fn runtime_malloc_counts_once_not_twice() {
    // cudaMalloc reaches the driver's cuMemAlloc_v2 through cuGetProcAddress: one allocation.
    let r = sim(&["rt.malloc:a:1048576", "rt.malloc:b:4096"]);
    let d = r.device(0);
    assert_eq!(
        (d.used, d.peak, d.allocs, d.frees),
        (MIB + 4096, MIB + 4096, 2, 0)
    );
    let r = sim(&[
        "rt.malloc:a:1048576",
        "rt.free:a",
        "rt.malloc:b:100",
        "rt.free:b",
    ]);
    let d = r.device(0);
    assert_eq!(
        (d.used, d.peak, d.allocs, d.frees, d.total_allocated),
        (0, MIB, 2, 2, MIB + 100)
    );
}

#[test]
fn driver_shadow_door_for_programs_linked_to_the_driver() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "drv.alloc:a:1000",
        "drv.alloc:b:24",
        "drv.free:a",
    ]);
    let d = r.device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (24, 1024, 2, 1));
}

#[test]
fn dlsym_door() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "dl.alloc:a:4096",
        "drv.free:a",
        "dl.alloc:b:512",
    ]);
    let d = r.device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (512, 4096, 2, 1));
}

#[test]
fn get_proc_address_v1_and_v2_doors() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "gpa1.alloc:a:1000",
        "gpa2.alloc:b:2000",
        "gpa2.free:a",
        "ep.alloc:c:3000",
    ]);
    let d = r.device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (5000, 5000, 3, 1));
}

#[test]
fn per_thread_stream_variants_are_wrapped() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "gpa2.alloc_async_ptsz:a:1000",
        "rt.malloc_async_ptsz:b:2000",
        "rt.malloc_async:c:4000",
        "gpa2.free_async_ptsz:a",
        "rt.free_async_ptsz:b",
        "drv.alloc_async_ptsz:d:8",
        "drv.free_async:d",
    ]);
    let d = r.device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (4000, 7000, 4, 3));
}

#[test]
fn two_devices_with_context_switches() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "drv.alloc:a:100",
        "drv.ctx:1",
        "drv.alloc:b:200",
        "rt.setdev:0",
        "rt.malloc:c:300",
        "drv.ctx:1",
        // a was allocated on device 0: its free counts there, whatever context is current.
        "drv.free:a",
        "print.used:0",
        "print.used:1",
    ]);
    let (d0, d1) = (r.device(0), r.device(1));
    assert_eq!((d0.used, d0.peak, d0.allocs, d0.frees), (300, 400, 2, 1));
    assert_eq!((d1.used, d1.peak, d1.allocs, d1.frees), (200, 200, 1, 0));
}

#[test]
fn hook_matches_the_drivers_own_count() {
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:1",
            "rt.setdev:1",
            "rt.malloc:a:7777",
            "drv.alloc:b:3333",
            "rt.free:a",
            "drv.stream:s:0",
            "drv.alloc_async_on:c:5000:s",
            "print.used:0",
            "print.used:1",
        ],
    )
    .run()
    .ok();
    let report = ran.report();
    let out = ran.stdout();
    assert!(out.contains("used dev=0 bytes=5000"), "{out}");
    assert!(out.contains("used dev=1 bytes=3333"), "{out}");
    assert_eq!(
        report.device(0).used,
        5000,
        "stream-ordered allocation counted on the stream's device"
    );
    assert_eq!(report.device(1).used, 3333);
}

#[test]
fn mem_create_counts_on_the_property_location_not_the_current_device() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "drv.create:h:2097152:1",
        "gpa2.create:g:4096:0",
    ]);
    assert_eq!(r.device(1).used, 2 * MIB);
    assert_eq!(r.device(0).used, 4096);
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "drv.create:h:2097152:1",
        "drv.release:h",
        "gpa2.create:g:4096:1",
        "gpa2.release:g",
    ]);
    let d = r.device(1);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (0, 2 * MIB, 2, 2));
}

#[test]
fn pool_allocations_count_on_the_pools_device() {
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "drv.alloc_pool:a:1000:1",
            "rt.setdev:1",
            "rt.malloc_pool:b:24",
            "drv.ctx:0",
            "drv.alloc_pool:c:7:0",
            "print.used:0",
            "print.used:1",
        ],
    )
    .run()
    .ok();
    let r = ran.report();
    assert!(
        ran.stdout().contains("used dev=1 bytes=1024"),
        "{}",
        ran.stdout()
    );
    assert_eq!((r.device(1).used, r.device(1).allocs), (1024, 2));
    assert_eq!((r.device(0).used, r.device(0).allocs), (7, 1));
}

#[test]
fn pools_pitch_managed_and_pinned_host() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "drv.alloc_pool:p:1000:0",
        "rt.malloc_pool:q:3000",
        "rt.malloc_pitch:m:1000:10",
        "drv.alloc_pitch:n:100:2:4",
        "rt.malloc_managed:u:5000",
        "drv.alloc_managed:v:7000",
        "rt.malloc_host:h:100",
        "rt.host_alloc:i:200",
        "drv.host_alloc:j:300",
        "drv.alloc_host:k:400",
        "drv.create_host:l:4096",
        "rt.free_host:h",
        "drv.free_host:j",
        "rt.free:u",
        "print.used:0",
    ]);
    let d = r.device(0);
    assert_eq!(
        d.allocs, 4,
        "managed and pinned allocations are not device allocations"
    );
    assert_eq!((d.managed, d.managed_peak), (7000, 12000));
    assert_eq!(r.host.pinned, 200 + 400 + 4096);
    assert_eq!(r.host.pinned_peak, 100 + 200 + 300 + 400 + 4096);
    assert_eq!((r.host.allocs, r.host.frees), (5, 2));
    // Pitched allocations count pitch × height bytes, whatever the pitch is.
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc_pitch:m:1000:10",
            "drv.alloc_pitch:n:100:3:4",
            "print.used:0",
        ],
    )
    .run()
    .ok();
    let driver_used: u64 = ran.line_fields("used dev=0")["bytes"].parse().unwrap();
    assert_eq!(ran.report().device(0).used, driver_used);
    assert!(driver_used >= 1000 * 10 + 100 * 3);
}

#[test]
fn unknown_and_null_frees_pass_through_and_count_nothing() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "rt.malloc:a:100",
        "rt.free:0x123400=1",
        "drv.free:0x567800=1",
        "rt.free:0",
        "drv.free:0",
        "gpa2.free:0",
    ]);
    let d = r.device(0);
    assert_eq!((d.used, d.allocs, d.frees), (100, 1, 0));
}

#[test]
fn null_out_pointers_behave_as_the_driver_does() {
    let r = sim(&[
        "drv.init",
        "drv.ctx:0",
        "drv.alloc_null:100",
        "drv.meminfo_null",
        "rt.malloc:a:64",
    ]);
    let d = r.device(0);
    assert_eq!((d.used, d.allocs, d.failed), (64, 1, 0));
}

#[test]
fn driver_failure_changes_nothing_but_failed() {
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "drv.alloc:a:600",
            "drv.alloc:b:600=2",
            "rt.malloc:c:600=2",
            "drv.alloc:d:400",
        ],
    )
    .env("FAKECUDA_MEM_BYTES", "1000")
    .run()
    .ok();
    let d = ran.report().device(0);
    assert_eq!(
        (d.used, d.peak, d.allocs, d.failed, d.denied),
        (1000, 1000, 2, 2, 0)
    );
}

#[test]
fn runtime_reaching_the_driver_out_of_sight_is_still_counted_once() {
    let ran = Run::sim(
        "simrun",
        &[
            "rt.malloc:a:1000",
            "rt.malloc:b:24",
            "rt.free:a",
            "print.used:0",
        ],
    )
    .env("FAKECUDART_HIDDEN", "1")
    .run()
    .ok();
    let d = ran.report().device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (24, 1024, 2, 1));
    assert!(ran.stdout().contains("used dev=0 bytes=24"));
}

#[test]
fn eight_threads_of_100k_random_allocations_and_frees() {
    let ran = Run::sim("simrun", &["threads:8:100000:42:1048576", "print.used:0"])
        .run()
        .ok();
    let t = ran.line_fields("threads ");
    let num = |k: &str| -> u64 { t[k].parse().unwrap() };
    let d = ran.report().device(0);
    assert_eq!(d.allocs, num("allocs"));
    assert_eq!(d.frees, num("frees"));
    assert_eq!(d.total_allocated, num("total"));
    // `live` counts blocks; the driver's own count gives the live bytes.
    let driver_used: u64 = ran.line_fields("used dev=0")["bytes"].parse().unwrap();
    assert_eq!(d.used, driver_used);
    assert!(num("live") > 0 && d.used > 0);
    assert!(
        d.peak >= d.used && d.peak <= num("total"),
        "peak {} outside [{}, {}]",
        d.peak,
        d.used,
        num("total")
    );
}

#[test]
fn frees_on_other_threads_before_and_after_their_owners_exit_are_counted_once() {
    // Each thread's allocations are recorded in a table of its own: a free on another thread
    // claims the entry, the owner removes it (before recording an address the driver hands out
    // again), and a thread's exit hands its live entries over. Reused and fresh addresses.
    for fresh in ["0", "1"] {
        let ran = Run::sim("simrun", &["handoff:6:2000:4096", "print.used:0"])
            .env("FAKECUDA_FRESH", fresh)
            .run()
            .ok();
        let h = ran.line_fields("handoff ");
        let num = |k: &str| -> u64 { h[k].parse().unwrap() };
        let d = ran.report().device(0);
        assert_eq!(
            (d.allocs, d.frees),
            (num("allocs"), num("frees")),
            "fresh={fresh}"
        );
        assert_eq!((d.used, d.total_allocated), (0, num("allocs") * 4096));
        assert_eq!(ran.line_fields("used dev=0")["bytes"], "0");
        let report = ran.report();
        assert_eq!(
            (report.live.as_ref().map(Vec::len), report.live_omitted),
            (Some(0), 0),
            "fresh={fresh}: no entry left behind"
        );
        assert!(
            d.by_module
                .iter()
                .all(|m| m.used == 0 && m.live_allocs == 0),
            "fresh={fresh}: {:?}",
            d.by_module
        );
    }
}

#[test]
fn runtime_loaded_into_a_local_scope_by_python_ctypes() {
    let script = r#"
import ctypes, sys
rt = ctypes.CDLL(sys.argv[1] + "/libcudart.so.13")
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(3 << 20)) == 0
q = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(q), ctypes.c_size_t(5000)) == 0
assert rt.cudaFree(p) == 0
print("ok")
"#;
    let ran = Run::program(gpumemhook_tests::python(), "python-ctypes")
        .arg("-c")
        .arg(script)
        .arg(gpumemhook_tests::sim_dir())
        .run()
        .ok();
    let d = ran.report().device(0);
    assert_eq!(
        (d.used, d.peak, d.allocs, d.frees),
        (5000, (3 << 20) + 5000, 2, 1)
    );
}

#[test]
fn driver_shadow_reached_by_default_lookup_while_the_driver_sits_in_a_local_scope() {
    // The runtime dlopens libcuda.so.1 locally, so nothing after the hook in the global scope defines
    // cuMemAlloc_v2: the hook's export must fall back to the driver's own function, every time.
    let script = r#"
import ctypes, sys
rt = ctypes.CDLL(sys.argv[1] + "/libcudart.so.13")
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(100)) == 0
glob = ctypes.CDLL(None)
ptrs = [ctypes.c_uint64() for _ in range(3)]
for q in ptrs:
    assert glob.cuMemAlloc_v2(ctypes.byref(q), ctypes.c_size_t(1000)) == 0
assert glob.cuMemFree_v2(ptrs[0]) == 0
"#;
    let ran = Run::program(gpumemhook_tests::python(), "python-default-lookup")
        .arg("-c")
        .arg(script)
        .arg(gpumemhook_tests::sim_dir())
        .run()
        .ok();
    let d = ran.report().device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (2100, 3100, 4, 1));
}

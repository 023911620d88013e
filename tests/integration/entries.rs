//! Entry points with a test of their own: context teardown (`cuCtxDestroy*`,
//! `cuDevicePrimaryCtxReset*`, `cuDevicePrimaryCtxRelease*`), `cuStreamDestroy`, memory pools
//! (`cuMemPoolCreate`, `cuMemPoolDestroy`, `cuDeviceGetMemPool`, the `_ptsz` pool allocations of
//! the driver and the runtime), `cudaFreeAsync`, and every module load. Each runs `simrun` under the
//! hook and checks the hook's figures against the stand-in driver's own after each call.
//!
//! The hook's `used` in the middle of a run is read through the ceiling's view: under
//! `GPUMEMHOOK_LIMIT`, `cuMemGetInfo`'s free is the ceiling less the hook's `used` (the stand-in
//! card being far larger), so each `drv.meminfo` shows the hook's figure at that point.

use crate::emulation::{emulated, CONTEXT, MIB};
use gpumemhook_tests::{scratch, Ran, Run};

/// The ceiling the middle-of-run figures are read under: far below the stand-in card's 16 GiB.
const CEILING: u64 = 1 << 30;

/// Runs `ops` under [`CEILING`]; they must all succeed.
fn run_under_ceiling(ops: &[&str]) -> Ran {
    Run::sim("simrun", ops)
        .env("GPUMEMHOOK_LIMIT", format!("{CEILING}B"))
        .run()
        .ok()
}

/// The hook's `used` of the current device at each `drv.meminfo`, in order.
fn hook_used(ran: &Ran) -> Vec<u64> {
    numbers(ran, "drv.meminfo", "free")
        .into_iter()
        .map(|free| CEILING - free)
        .collect()
}

/// The stand-in driver's own `used` at each `print.used` (of any device), in order.
fn driver_used(ran: &Ran) -> Vec<u64> {
    numbers(ran, "used dev=", "bytes")
}

/// The queries of the driver for a device at each `print.queries`, in order.
fn queries(ran: &Ran) -> Vec<u64> {
    numbers(ran, "queries=", "queries")
}

/// The value of `key=` on every stdout line starting with `prefix`, in order.
fn numbers(ran: &Ran, prefix: &str, key: &str) -> Vec<u64> {
    ran.stdout()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key}= in {l:?}"))
                .parse()
                .unwrap()
        })
        .collect()
}

/// What device 0 holds in the teardown scenarios: a plain allocation, a pitched one (two rows of
/// 512 bytes) and a runtime one, which the context owns, and a stream-ordered one, which it does
/// not (the real driver documents that stream-ordered, pool and `cuMemCreate` memory outlives a
/// context).
const OWNED: u64 = 1000 + 1024 + 3000;
const STREAM_ORDERED: u64 = 500;
const ALLOCATE: [&str; 4] = [
    "drv.alloc:a:1000",
    "drv.alloc_pitch:b:100:2:4",
    "rt.malloc:c:3000",
    "drv.alloc_async:d:500",
];

/// `teardown` (ops on device 0's context) after [`ALLOCATE`], then the free of the stream-ordered
/// allocation: the figures of the driver and of the hook after each step.
fn teardown_figures(setup: &[&str], teardown: &[&str]) -> (Ran, Vec<u64>, Vec<u64>) {
    let mut ops = vec!["drv.init"];
    ops.extend_from_slice(setup);
    ops.extend_from_slice(&ALLOCATE);
    ops.extend(["drv.meminfo", "print.used:0"]);
    ops.extend_from_slice(teardown);
    // The driver forgot the context's allocations: their free is refused, and counts nothing.
    ops.extend(["drv.meminfo", "print.used:0", "drv.free:a=1"]);
    ops.extend(["drv.free_async:d", "drv.meminfo", "print.used:0"]);
    let ran = run_under_ceiling(&ops);
    let (hook, driver) = (hook_used(&ran), driver_used(&ran));
    (ran, hook, driver)
}

/// After a teardown the driver holds only the stream-ordered allocation, and then nothing. The
/// hook sees no free of the context's allocations and keeps counting them (docs/known-limits.md:
/// "Destroying or resetting a context frees its allocations without a free the hook sees").
fn assert_torn_down(what: &str, ran: &Ran, hook: &[u64], driver: &[u64]) {
    let all = OWNED + STREAM_ORDERED;
    assert_eq!(driver, [all, STREAM_ORDERED, 0], "{what}: the driver");
    assert_eq!(hook, [all, all, OWNED], "{what}: the hook");
    let d = ran.report().device(0);
    assert_eq!(
        (d.used, d.peak, d.allocs, d.frees),
        (OWNED, all, 4, 1),
        "{what}: the report"
    );
}

#[test]
fn a_primary_context_reset_frees_what_the_context_owns() {
    for reset in ["drv.ctx_reset:0", "drv.ctx_reset_v1:0"] {
        let (ran, hook, driver) = teardown_figures(&["drv.ctx:0"], &[reset]);
        assert_torn_down(reset, &ran, &hook, &driver);
    }
}

#[test]
fn the_last_release_of_a_primary_context_destroys_it() {
    for release in ["drv.ctx_release:0", "drv.ctx_release_v1:0"] {
        // Retained twice: the first release leaves everything in place, the second destroys it,
        // and a third has nothing left to release.
        let (ran, hook, driver) = teardown_figures(
            &["drv.ctx:0", "drv.ctx:0"],
            &[
                release,
                "drv.meminfo",
                "print.used:0",
                release,
                &format!("{release}=201"),
            ],
        );
        let all = OWNED + STREAM_ORDERED;
        assert_eq!(hook[..2], [all, all], "{release}: one release of two");
        assert_eq!(driver[..2], [all, all], "{release}: one release of two");
        assert_torn_down(release, &ran, &hook[1..], &driver[1..]);
    }
}

#[test]
fn destroying_a_created_context_frees_what_it_owns() {
    for destroy in ["drv.ctx_destroy:x", "drv.ctx_destroy_v1:x"] {
        // The created context is current from its creation until its destruction pops it; device
        // 0's primary context is current again after it. Its managed memory dies with it too.
        let (ran, hook, driver) = teardown_figures(
            &["drv.ctx:0", "drv.ctx_create:x:0", "drv.alloc_managed:m:100"],
            &[destroy, &format!("{destroy}=201")],
        );
        assert_torn_down(destroy, &ran, &hook, &driver);
        assert_eq!(ran.report().device(0).managed, 100, "{destroy}");
    }
}

#[test]
fn every_teardown_forgets_the_cached_devices_of_streams() {
    // A stream of device 1 survives the teardown of device 0's context, but the hook cannot tell
    // which streams died with it: it asks for the stream's device again.
    let teardowns: [&[&str]; 6] = [
        &["drv.ctx_reset:0"],
        &["drv.ctx_reset_v1:0"],
        &["drv.ctx_release:0"],
        &["drv.ctx_release_v1:0"],
        &["drv.ctx_create:x:0", "drv.ctx_destroy:x"],
        &["drv.ctx_create:x:0", "drv.ctx_destroy_v1:x"],
    ];
    for teardown in teardowns {
        let mut ops = vec![
            "drv.init",
            "drv.stream:s:1",
            "drv.ctx:0",
            "drv.alloc:warm:1",
            "drv.alloc_async_on:a:100:s",
            "drv.alloc_async_on:b:100:s",
            "print.queries",
        ];
        ops.extend_from_slice(teardown);
        ops.extend(["drv.alloc_async_on:c:100:s", "print.queries"]);
        let ran = Run::sim("simrun", &ops).run().ok();
        // warm: 1 context query; the stream: 1 query, and 1 more after the teardown.
        assert_eq!(queries(&ran), [2, 3], "{teardown:?}");
        let d = ran.report().device(1);
        assert_eq!((d.used, d.allocs), (300, 3), "{teardown:?}");
    }
}

#[test]
fn the_first_abi_of_stream_destroy_forgets_the_stream() {
    // As with cuStreamDestroy_v2 (hardening.rs): a new stream at the same handle (the stand-in
    // recycles handles, as real drivers do), on another device, is asked again.
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.stream:s:1",
            "drv.ctx:0",
            "drv.alloc:warm:1",
            "drv.alloc_async_on:a:100:s",
            "print.var:s",
            "drv.stream_destroy_v1:s",
            "drv.stream_destroy_v1:s=400",
            "drv.stream:t:0",
            "print.var:t",
            "drv.alloc_async_on:b:50:t",
            "print.queries",
        ],
    )
    .run()
    .ok();
    let out = ran.stdout();
    let handle = |var: &str| ran.line_fields(&format!("{var}="))[var].clone();
    assert_eq!(handle("s"), handle("t"), "the handle came back:\n{out}");
    assert_eq!(queries(&ran), [3], "{out}");
    let r = ran.report();
    assert_eq!((r.device(1).used, r.device(0).used), (100, 51));
}

#[test]
fn a_created_pool_counts_on_its_device_and_outlives_its_destruction_until_freed() {
    // Device 0 is current; the pool is on device 1. Destroying a pool whose allocations are still
    // live returns at once and leaves them live (the real driver releases the pool once they are
    // freed); the hook forgets the pool's device, so a later use of the handle is counted on the
    // stream's device, where the driver fails it.
    let ran = run_under_ceiling(&[
        "drv.init",
        "drv.ctx:1",
        "drv.meminfo",
        "drv.ctx:0",
        "drv.pool_create:p:1",
        "drv.alloc_from:a:1000:p",
        "drv.alloc_from_ptsz:b:24:p",
        "print.used:1",
        "drv.ctx:1",
        "drv.meminfo",
        "drv.pool_destroy:p",
        "drv.meminfo",
        "print.used:1",
        "drv.ctx:0",
        "drv.alloc_from:c:7:p=400",
        "drv.free_async:a",
        "drv.ctx:1",
        "drv.meminfo",
        "print.used:1",
        "drv.free_async_ptsz:b",
        "drv.meminfo",
        "print.used:1",
    ]);
    assert_eq!(driver_used(&ran), [1024, 1024, 24, 0]);
    assert_eq!(hook_used(&ran), [0, 1024, 1024, 24, 0]);
    let r = ran.report();
    let (d0, d1) = (r.device(0), r.device(1));
    assert_eq!((d1.peak, d1.allocs, d1.frees, d1.failed), (1024, 2, 2, 0));
    assert_eq!((d0.used, d0.allocs, d0.failed), (0, 0, 1));
}

#[test]
fn the_current_pool_of_a_device_counts_on_that_device() {
    // cuDeviceGetMemPool hands out device 1's pool while device 0 is current; the default pool
    // cannot be destroyed, and stays known.
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "drv.pool_get:q:1",
            "drv.alloc_from:a:1000:q",
            "drv.pool_destroy:q=1",
            "drv.alloc_from_ptsz:b:24:q",
            "drv.free_async:a",
            "print.used:1",
        ],
    )
    .run()
    .ok();
    assert_eq!(driver_used(&ran), [24]);
    let r = ran.report();
    let d1 = r.device(1);
    assert_eq!((d1.used, d1.peak, d1.allocs, d1.frees), (24, 1024, 2, 1));
    assert_eq!((r.device(0).used, r.device(0).allocs), (0, 0));
}

#[test]
fn pool_allocations_per_thread_are_refused_like_the_others() {
    // The _ptsz forms reserve under the ceiling as their legacy-stream forms do.
    for alloc in ["drv.alloc_from", "drv.alloc_from_ptsz"] {
        let ran = Run::sim(
            "simrun",
            &[
                "drv.init",
                "drv.ctx:0",
                "drv.pool_create:p:0",
                &format!("{alloc}:a:600:p"),
                &format!("{alloc}:b:401:p=2"),
                &format!("{alloc}:b:400:p"),
                "print.used:0",
            ],
        )
        .env("GPUMEMHOOK_LIMIT", "1000B")
        .run()
        .ok();
        assert_eq!(driver_used(&ran), [1000], "{alloc}");
        let d = ran.report().device(0);
        assert_eq!((d.used, d.allocs, d.denied), (1000, 2, 1), "{alloc}");
    }
}

#[test]
fn runtime_pool_allocations_per_thread_and_async_frees_count_once() {
    // Through the runtime's shadows and the driver wrappers beneath them: one allocation each, on
    // the current device, charged to the program; cudaFreeAsync frees, and an unknown address is
    // refused and counts nothing.
    let ran = run_under_ceiling(&[
        "rt.setdev:1",
        "rt.malloc_pool_ptsz:a:1000",
        "drv.meminfo",
        "rt.malloc_pool:b:24",
        "drv.meminfo",
        "rt.free_async:a",
        "drv.meminfo",
        "rt.free_async:0x123=1",
        "rt.malloc_pool_ptsz:c:8",
        "rt.free_async:c",
        "drv.meminfo",
        "print.used:1",
    ]);
    assert_eq!(hook_used(&ran), [1000, 1024, 24, 24]);
    assert_eq!(driver_used(&ran), [24]);
    let d = ran.report().device(1);
    assert_eq!(
        (d.used, d.peak, d.allocs, d.frees, d.total_allocated),
        (24, 1024, 3, 2, 1032)
    );
    let modules: Vec<(&str, u64, u64, u64)> = d
        .by_module
        .iter()
        .map(|m| (m.module.as_str(), m.used, m.peak, m.live_allocs))
        .collect();
    assert_eq!(modules, [("simrun", 24, 1024, 1)]);
}

#[test]
fn every_module_load_is_measured_on_an_emulated_card() {
    // docs/emulation.md: a load long enough after the last measurement is measured at once, so
    // the overhead charged inside the card grows by the module. A load that fails grows nothing.
    let module = 100 * MIB;
    let dir = scratch("entries-modules");
    let image = dir.join("kernels.cubin");
    std::fs::write(&image, b"module image").unwrap();
    let image = image.to_str().unwrap();
    let missing = dir.join("missing.cubin");
    let missing = missing.to_str().unwrap();
    // Each load that succeeds charges one module; one of a missing file charges nothing.
    for (load, charged) in [
        (format!("drv.module_file:{image}"), CONTEXT + module),
        ("drv.module_ex".to_string(), CONTEXT + module),
        ("drv.module_fatbin".to_string(), CONTEXT + module),
        (format!("drv.library_file:{image}"), CONTEXT + module),
        (format!("drv.module_file:{missing}=301"), CONTEXT),
        (format!("drv.library_file:{missing}=301"), CONTEXT),
    ] {
        let ops = ["rt.malloc:a:1000", "sleep:80", "drv.ctx:0", &load];
        let ran = emulated("t4", &ops)
            .env("FAKECUDA_MODULE_BYTES", module.to_string())
            .run()
            .ok();
        let overhead = ran.report().device(0).emulated.unwrap().overhead;
        assert_eq!(overhead, charged, "{load}");
    }
}

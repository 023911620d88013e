//! The child of `overhead`: one process, one side (hooked or not), one driver. It finds the
//! allocation and free entry points as the real runtime does, holds the live allocations and times
//! the pairs on each thread (wall time and the thread's CPU time), and prints its samples as JSON
//! for the orchestrator. With `--gate PATH` (several children at once, `--groups`) it says it is
//! ready with a file `PATH.ready.<pid>` and starts its pairs only once PATH exists.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use gpumemhook_bench::{Args, XorShift};
use libloading::os::unix::Library;
use serde_json::json;

/// Bytes per allocation. The hook's work does not depend on the size; small enough that a million
/// live allocations fit the simulated driver's default capacity.
pub(crate) const BYTES: usize = 4096;

pub(crate) type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
pub(crate) type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> c_int;
pub(crate) type FreeFn = unsafe extern "C" fn(u64) -> c_int;
pub(crate) type InitFn = unsafe extern "C" fn(u32) -> c_int;
pub(crate) type RetainFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
pub(crate) type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> c_int;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pattern {
    Pair,
    Replace,
}

impl Pattern {
    pub(crate) fn parse(s: &str) -> Result<Pattern, String> {
        match s {
            "pair" => Ok(Pattern::Pair),
            "replace" => Ok(Pattern::Replace),
            other => Err(format!("unknown pattern {other:?} (pair, replace)")),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Pattern::Pair => "pair",
            Pattern::Replace => "replace",
        }
    }
}

/// The driver functions the loop calls, as handed out by `cuGetProcAddress_v2`.
#[derive(Clone, Copy)]
pub(crate) struct Driver {
    alloc: AllocFn,
    free: FreeFn,
    /// The simulated test driver needs a current context per thread; the fast one has none.
    set_current: Option<(SetCurrentFn, usize)>,
}

impl Driver {
    /// `cudaMalloc`/`cudaFree` of the runtime at `path`, found in the global scope as a program
    /// linked to the runtime finds them: under the hook, its runtime shadows.
    fn load_runtime(path: &Path) -> Result<Driver, String> {
        open(path, libc::RTLD_NOW | libc::RTLD_GLOBAL)?;
        let global = Library::this();
        // SAFETY: cudaMalloc(void **, size_t) and cudaFree(void *) have these ABIs (a device
        // pointer is 64 bits either way).
        let (alloc, free) = unsafe {
            (
                symbol(&global, c"cudaMalloc")?,
                symbol(&global, c"cudaFree")?,
            )
        };
        Ok(Driver {
            alloc,
            free,
            set_current: None,
        })
    }

    fn load(path: &Path) -> Result<Driver, String> {
        let library = open(path, libc::RTLD_NOW | libc::RTLD_LOCAL)?;
        // As the CUDA runtime does: dlsym the v2 lookup, then everything through it. Under the hook
        // this dlsym is the hook's, which hands out its wrapper of cuGetProcAddress_v2.
        // SAFETY: cuGetProcAddress_v2 has this C signature.
        let gpa: GetProcAddressV2 = unsafe { symbol(library, c"cuGetProcAddress_v2")? };
        let missing =
            |name: &CStr| format!("{}: cuGetProcAddress_v2 has no {name:?}", path.display());
        // SAFETY: cuInit(unsigned int) is the driver's function of this signature.
        let init: InitFn =
            unsafe { proc_address(gpa, c"cuInit") }.ok_or_else(|| missing(c"cuInit"))?;
        // SAFETY: cuInit(0) takes no pointers.
        let rc = unsafe { init(0) };
        if rc != 0 {
            return Err(format!("cuInit returned {rc}"));
        }
        // SAFETY: cuMemAlloc(CUdeviceptr *, size_t) is the driver's function of this signature.
        let alloc: AllocFn =
            unsafe { proc_address(gpa, c"cuMemAlloc") }.ok_or_else(|| missing(c"cuMemAlloc"))?;
        // SAFETY: cuMemFree(CUdeviceptr) is the driver's function of this signature.
        let free: FreeFn =
            unsafe { proc_address(gpa, c"cuMemFree") }.ok_or_else(|| missing(c"cuMemFree"))?;
        let mut set_current = None;
        // SAFETY: cuDevicePrimaryCtxRetain(CUcontext *, CUdevice) and cuCtxSetCurrent(CUcontext)
        // have these signatures.
        let (retain, set): (Option<RetainFn>, Option<SetCurrentFn>) = unsafe {
            (
                proc_address(gpa, c"cuDevicePrimaryCtxRetain"),
                proc_address(gpa, c"cuCtxSetCurrent"),
            )
        };
        if let (Some(retain), Some(set)) = (retain, set) {
            let mut ctx = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let rc = unsafe { retain(&mut ctx, 0) };
            if rc != 0 {
                return Err(format!("cuDevicePrimaryCtxRetain returned {rc}"));
            }
            set_current = Some((set, ctx as usize));
        }
        let driver = Driver {
            alloc,
            free,
            set_current,
        };
        driver.enter_context();
        Ok(driver)
    }

    /// Makes device 0's context current on this thread (contexts are per thread).
    fn enter_context(&self) {
        if let Some((set, ctx)) = self.set_current {
            // SAFETY: a context handle the driver gave us.
            unsafe { set(ctx as *mut c_void) };
        }
    }
}

/// Opens the library at `path` for the rest of the process (leaked, never closed: the functions
/// taken from it are called until the end).
fn open(path: &Path, flags: c_int) -> Result<&'static Library, String> {
    // SAFETY: a plain dlopen; the library's constructors are the stand-in's or runtime's own.
    let library = unsafe { Library::open(Some(path), flags) }
        .map_err(|e| format!("dlopen {}: {e}", path.display()))?;
    Ok(Box::leak(Box::new(library)))
}

/// The function `name` of `library`, as `F`.
///
/// # Safety
/// `F` must be the C signature of `name` (a function pointer type).
unsafe fn symbol<F: Copy>(library: &Library, name: &CStr) -> Result<F, String> {
    // SAFETY: the caller's contract.
    let found = unsafe { library.get::<F>(name.to_bytes_with_nul()) };
    found.map(|f| *f).map_err(|e| format!("no {name:?}: {e}"))
}

/// `cuGetProcAddress_v2`'s function `name`, written by the driver straight into a slot of type
/// `Option<F>` (a function pointer's: the size of a `void *`, null for none).
///
/// # Safety
/// `F` must be the C signature of the driver's `name` (a function pointer type).
unsafe fn proc_address<F: Copy>(gpa: GetProcAddressV2, name: &CStr) -> Option<F> {
    const { assert!(std::mem::size_of::<Option<F>>() == std::mem::size_of::<*mut c_void>()) };
    let mut slot: Option<F> = None;
    let mut status = 0;
    // SAFETY: the slot holds one pointer, null until the driver writes the function's address;
    // a NUL-terminated name; a valid status out-pointer.
    let rc = unsafe {
        gpa(
            name.as_ptr(),
            (&mut slot as *mut Option<F>).cast(),
            12000,
            0,
            &mut status,
        )
    };
    slot.filter(|_| rc == 0)
}

/// The file of the loaded object that holds address `p`.
pub(crate) fn object_of(p: usize) -> String {
    // SAFETY: Dl_info is plain data; dladdr fills it or returns 0.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is only looked up.
    if unsafe { libc::dladdr(p as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return String::new();
    }
    // SAFETY: dladdr returned a NUL-terminated name owned by the loader.
    unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

/// This thread's CPU time in ns: what its pairs cost whether or not other processes share its core.
fn thread_cpu_ns() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

/// One thread's samples: its live set, ns per pair per repeat (wall and CPU), and failed calls.
pub(crate) type WorkerResult = (Vec<u64>, Vec<f64>, Vec<f64>, u64);

/// One thread's timed work: `repeats` times `pairs` pairs, each repeat started at a barrier that all
/// threads pass together.
#[allow(clippy::too_many_arguments)]
pub(crate) fn worker(
    driver: Driver,
    mut live: Vec<u64>,
    pattern: Pattern,
    pairs: u64,
    warmup: u64,
    repeats: u64,
    barrier: &Barrier,
    seed: u64,
) -> WorkerResult {
    driver.enter_context();
    let mut rng = XorShift::new(seed);
    let mut failures = 0u64;
    let (alloc, free) = (driver.alloc, driver.free);
    let mut run = |n: u64, live: &mut Vec<u64>| {
        if pattern == Pattern::Replace && !live.is_empty() {
            for _ in 0..n {
                let i = rng.below(live.len());
                let mut p = 0u64;
                // SAFETY: a valid out-pointer; frees only addresses this driver handed out.
                unsafe {
                    failures += u64::from(alloc(&mut p, BYTES) != 0);
                    failures += u64::from(free(live[i]) != 0);
                }
                live[i] = p;
            }
        } else {
            for _ in 0..n {
                let mut p = 0u64;
                // SAFETY: as above.
                unsafe {
                    failures += u64::from(alloc(&mut p, BYTES) != 0);
                    failures += u64::from(free(p) != 0);
                }
            }
        }
    };
    run(warmup, &mut live);
    let mut samples = Vec::with_capacity(repeats as usize);
    let mut cpu_samples = Vec::with_capacity(repeats as usize);
    for _ in 0..repeats {
        barrier.wait();
        let (start, cpu_start) = (Instant::now(), thread_cpu_ns());
        run(pairs, &mut live);
        samples.push(start.elapsed().as_nanos() as f64 / pairs as f64);
        cpu_samples.push((thread_cpu_ns() - cpu_start) / pairs as f64);
    }
    (live, samples, cpu_samples, failures)
}

pub(crate) fn child(args: &Args) -> Result<(), String> {
    let driver_path = args.path("driver", "target/bench/fastcuda/libcuda.so.1");
    let threads = args.number("threads", 1)?.max(1) as usize;
    let live_count = args.number("live", 1000)? as usize;
    let scope_counts = args.list("scopes", &[0])?;
    let pattern = Pattern::parse(args.string("pattern").unwrap_or("pair"))?;
    let pairs = args.number("pairs", 200_000)?.max(1);
    let repeats = args.number("repeats", 5)?.max(1);
    let warmup = args.number("warmup", pairs.max(20_000))?;

    let driver = match args.string("api").unwrap_or("driver") {
        "driver" => Driver::load(&driver_path)?,
        "runtime" => Driver::load_runtime(&driver_path)?,
        other => return Err(format!("unknown api {other:?} (driver, runtime)")),
    };
    let process = gpumemhook_reader::Process::current().ok();
    let hooked = process.is_some();
    let alloc_object = object_of(driver.alloc as usize);
    // SAFETY: a lookup of a NUL-terminated name in the global scope.
    let hook_symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"gpumemhook_segment".as_ptr()) };
    let hook_object = (!hook_symbol.is_null()).then(|| object_of(hook_symbol as usize));
    // The whole point: under the hook, cuGetProcAddress_v2 must have handed out the hook's wrapper.
    if hooked != (hook_object.as_deref() == Some(alloc_object.as_str())) {
        return Err(format!(
            "hooked={hooked} but cuMemAlloc came from {alloc_object:?}: not the path to measure"
        ));
    }

    let mut live = Vec::with_capacity(live_count);
    for _ in 0..live_count {
        let mut p = 0u64;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (driver.alloc)(&mut p, BYTES) };
        if rc != 0 {
            return Err(format!(
                "cuMemAlloc_v2 failed ({rc}) after {} allocations",
                live.len()
            ));
        }
        live.push(p);
    }
    if let Some(p) = &process {
        let expected = (live_count * BYTES) as u64;
        if p.used(0) != expected {
            return Err(format!(
                "the hook counts {} bytes, {expected} are live: it is not counting these calls",
                p.used(0)
            ));
        }
    }
    if let Some(name) = std::env::var_os(gpumemhook_reader::env::GROUP) {
        check_group_member(&name.to_string_lossy(), (live_count * BYTES) as u64)?;
    }
    if let Some(gate) = args.string("gate") {
        wait_at_gate(Path::new(gate))?;
    }
    // Split the live set between threads (each frees only from its own share).
    let mut shares: Vec<Vec<u64>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, p) in live.into_iter().enumerate() {
        shares[i % threads].push(p);
    }

    for &scopes in &scope_counts {
        if scopes > 0 && !hooked {
            continue;
        }
        let open: Vec<_> = match &process {
            Some(p) => (0..scopes)
                .map(|i| p.open_scope(&format!("bench-{i}"), Some(0)))
                .collect::<Result<_, _>>()
                .map_err(|e| format!("open_scope: {e}"))?,
            None => Vec::new(),
        };
        let barrier = Arc::new(Barrier::new(threads));
        // The window of the pairs (warm-up included), for the orchestrator's measure of how many
        // processes ran theirs at once.
        let window_start = gpumemhook_reader::unix_now_ns();
        let handles: Vec<_> = shares
            .drain(..)
            .enumerate()
            .map(|(t, share)| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    worker(
                        driver,
                        share,
                        pattern,
                        pairs,
                        warmup,
                        repeats,
                        &barrier,
                        t as u64 + 1,
                    )
                })
            })
            .collect();
        let mut per_thread = Vec::new();
        let mut per_thread_cpu = Vec::new();
        let mut failures = 0;
        for h in handles {
            let (share, samples, cpu, f) = h.join().map_err(|_| "a worker thread panicked")?;
            shares.push(share);
            per_thread.push(samples);
            per_thread_cpu.push(cpu);
            failures += f;
        }
        let window_end = gpumemhook_reader::unix_now_ns();
        if failures > 0 {
            return Err(format!("{failures} driver calls failed"));
        }
        // A repeat's figure: the mean over threads of each thread's ns per pair.
        let mean_of = |per_thread: &[Vec<f64>]| -> Vec<f64> {
            (0..repeats as usize)
                .map(|r| per_thread.iter().map(|s| s[r]).sum::<f64>() / threads as f64)
                .collect()
        };
        let (samples, cpu_samples) = (mean_of(&per_thread), mean_of(&per_thread_cpu));
        if let Some(p) = &process {
            let expected = (live_count * BYTES) as u64;
            if p.used(0) != expected {
                return Err(format!(
                    "after the run the hook counts {} bytes, {expected} are live",
                    p.used(0)
                ));
            }
        }
        println!(
            "{}",
            json!({
                "hooked": hooked, "threads": threads, "live": live_count, "scopes": scopes,
                "pattern": pattern.name(), "pairs": pairs, "samples": samples,
                "cpu_samples": cpu_samples, "window_ns": [window_start, window_end],
            })
        );
        drop(open);
    }
    Ok(())
}

/// Under `GPUMEMHOOK_GROUP`: this process must be a live member of the group holding its live set,
/// or the group's path is not the one being measured.
fn check_group_member(name: &str, expected: u64) -> Result<(), String> {
    let dir = std::env::var_os(gpumemhook_reader::env::SHM_DIR)
        .ok_or("GPUMEMHOOK_GROUP without GPUMEMHOOK_SHM_DIR")?;
    let uid = gpumemhook_reader::current_uid();
    let group = gpumemhook_reader::open_group(Path::new(&dir), uid, name)
        .map_err(|e| format!("group {name}: {e}"))?;
    let me = std::process::id();
    let stats = group.stats(0);
    match stats.members.iter().find(|m| m.pid == me) {
        Some(m) if m.bytes == expected => Ok(()),
        other => Err(format!(
            "group {name}: this process ({me}) holds {other:?} there, {expected} bytes are live"
        )),
    }
}

/// Says this child is ready (`GATE.ready.<pid>`), then waits until GATE exists (at most 120 s).
fn wait_at_gate(gate: &Path) -> Result<(), String> {
    let ready = format!("{}.ready.{}", gate.display(), std::process::id());
    std::fs::write(&ready, b"").map_err(|e| format!("{ready}: {e}"))?;
    let deadline = Instant::now() + std::time::Duration::from_secs(120);
    while !gate.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} never appeared", gate.display()));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok(())
}

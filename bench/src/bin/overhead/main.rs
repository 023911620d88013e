//! `overhead`: what the hook adds to one `cuMemAlloc_v2` + `cuMemFree_v2` pair.
//!
//! The program dlopens a driver (by default the fast stand-in of `bench/fastcuda`, whose own pair
//! costs a few nanoseconds, so the hook's addition is not drowned in the driver's cost), asks it for
//! `cuGetProcAddress_v2` with `dlsym` and for `"cuMemAlloc"`/`"cuMemFree"` through that, at
//! version 12000: the path the real CUDA runtime takes, so under `LD_PRELOAD` the hook's address
//! wrappers are what gets called. It then holds N live allocations and times alloc+free pairs on
//! 1..T threads with 0, 1, 16 or 64 scopes open (opened in-process with
//! `gpumemhook_reader::Process::current()`).
//!
//! Run without `--child`, it is the orchestrator: it runs itself as a child once without and once
//! with `LD_PRELOAD` of the hook for every configuration, alternating the order between rounds so
//! that drift in the machine's load falls on both sides alike, and prints the medians side by side.
//! With `--callgrind` it also counts instructions per pair under `valgrind --tool=callgrind`
//! (noise-free: the difference of two runs that differ only in the number of pairs).
//!
//! Two access patterns:
//! - `pair`: allocate X, free X, the N others untouched (the goal's definition: the cost of one
//!   pair "with N live allocations held");
//! - `replace`: allocate X, free a randomly chosen live Y, keep X in Y's place: every free touches a
//!   cold, random place of the hook's ledger, the worst case for a large live set.
//!
//! With `--groups`, it compares instead N processes at once in one group against the same N
//! hooked without a group and without the hook (`groups.rs`).
//!
//! Usage: see `--help`, or `scripts/bench/cpu`, which builds everything and runs this.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod child;
mod children;
mod groups;

use child::{child, Pattern, BYTES};
use children::{callgrind_per_pair, run_child, Config, Setup};
use gpumemhook_bench::{machine, median, ns, quantile, short_count, Args, Table};
use serde_json::{json, Value};

const HELP: &str = "\
overhead: ns per cuMemAlloc_v2+cuMemFree_v2 pair with and without the gpumemhook LD_PRELOAD

  --driver PATH       libcuda.so.1 to benchmark over (default target/bench/fastcuda/libcuda.so.1)
  --hook PATH         the hook (default target/release/libgpumemhook.so)
  --sim-driver PATH   also measure over this driver (the test suite's simulated one), for comparison
  --runtime PATH      also measure cudaMalloc+cudaFree through this runtime (over --driver)
  --threads LIST      thread counts (default 1,<logical CPUs>)
  --live LIST         live allocations held (default 1k,100k,1M)
  --scopes LIST       scopes open during the hooked runs (default 0,1,16,64)
  --pairs N           pairs per timed repeat and thread (default 20k: about 1 ms)
  --repeats N         timed repeats per child process (default 21)
  --rounds N          child processes per side and configuration (default 3)
  --fresh             the driver hands out a fresh address every time (FASTCUDA_FRESH=1)
  --devices N         the driver reports N devices (FASTCUDA_DEVICES; with more than one the hook
                      asks the driver for the device of every allocation)
  --callgrind         also count instructions per pair with valgrind (1 thread)
  --callgrind-only    only that (no timings)
  --json PATH         write every sample as JSON
  --groups            instead: N processes at once (1 thread, the first --live count, default 1k)
                      in one group (GPUMEMHOOK_GROUP), hooked without a group, and without the
                      hook; CPU and wall ns per pair per process, and with --callgrind the
                      instructions per pair of one process on each side (--runtime adds that path)
  --members LIST      with --groups: processes at once (default 1,4,16); --rounds default 5
  --quick             fewer pairs, repeats and rounds (a smoke run; noisier)";

fn main() {
    let result = Args::parse().and_then(|args| {
        if args.flag("help") {
            println!("{HELP}");
            Ok(())
        } else if args.flag("child") {
            child(&args)
        } else {
            orchestrate(&args)
        }
    });
    if let Err(e) = result {
        eprintln!("overhead: {e}");
        std::process::exit(1);
    }
}

// ---- the orchestrator ----

/// Samples gathered per (driver, threads, live, scopes, pattern, hooked).
type Key = (String, u64, u64, u64, &'static str, bool);

/// Runs the comparison in a private segment directory, removed afterwards whatever happened.
fn orchestrate(args: &Args) -> Result<(), String> {
    let shm_dir = std::env::temp_dir().join(format!("gpumemhook-bench-{}", std::process::id()));
    std::fs::create_dir_all(&shm_dir).map_err(|e| format!("{}: {e}", shm_dir.display()))?;
    let result = compare(args, &shm_dir);
    let _ = std::fs::remove_dir_all(&shm_dir);
    result
}

fn compare(args: &Args, shm_dir: &Path) -> Result<(), String> {
    let quick = args.flag("quick");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let setup = Setup {
        exe,
        hook: args.path("hook", "target/release/libgpumemhook.so"),
        shm_dir: shm_dir.to_path_buf(),
        // Many short samples rather than a few long ones: on a shared machine a preemption then spoils a
        // few samples outright instead of inflating every one, and the median stays clean.
        pairs: args.number("pairs", 20_000)?,
        repeats: args.number("repeats", if quick { 5 } else { 21 })?,
        fresh: args.flag("fresh"),
        devices: args.number("devices", 1)?,
    };
    let rounds = args.number("rounds", if quick { 1 } else { 3 })?.max(1);
    let driver = args.path("driver", "target/bench/fastcuda/libcuda.so.1");
    for (what, p) in [("driver", &driver), ("hook", &setup.hook)] {
        if !p.exists() {
            return Err(format!(
                "{what} {} not found (scripts/bench/cpu builds it)",
                p.display()
            ));
        }
    }
    if args.flag("groups") {
        return groups::compare(args, &setup, &driver);
    }
    let mut thread_counts = args.list("threads", &[1, cpus])?;
    thread_counts.dedup();
    let lives = args.list("live", &[1_000, 100_000, 1_000_000])?;
    let scope_counts = args.list("scopes", &[0, 1, 16, 64])?;

    let mut configs = Vec::new();
    for &threads in &thread_counts {
        for &live in &lives {
            configs.push(Config {
                api: "driver",
                driver: driver.clone(),
                threads,
                live,
                scopes: scope_counts.clone(),
                pattern: Pattern::Pair,
            });
            configs.push(Config {
                api: "driver",
                driver: driver.clone(),
                threads,
                live,
                scopes: vec![0],
                pattern: Pattern::Replace,
            });
        }
    }
    let runtime = args.string("runtime").map(PathBuf::from);
    if let Some(rt) = &runtime {
        for &threads in &thread_counts {
            for &live in &lives {
                configs.push(Config {
                    api: "runtime",
                    driver: rt.clone(),
                    threads,
                    live,
                    scopes: vec![0],
                    pattern: Pattern::Pair,
                });
            }
        }
    }
    let sim_driver = args.string("sim-driver").map(PathBuf::from);
    if let Some(sim) = &sim_driver {
        for &live in &[1_000u64, 100_000] {
            configs.push(Config {
                api: "driver",
                driver: sim.clone(),
                threads: 1,
                live,
                scopes: vec![0],
                pattern: Pattern::Pair,
            });
        }
    }

    if args.flag("callgrind-only") {
        configs.clear();
    }
    let started = Instant::now();
    let mut samples: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        for config in &configs {
            // Alternate which side goes first, so slow drift in the machine's load is shared.
            let sides = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for hooked in sides {
                eprintln!(
                    "overhead: round {}/{rounds}: {} threads={} live={} pattern={} hooked={hooked}",
                    round + 1,
                    config.driver.display(),
                    config.threads,
                    short_count(config.live),
                    config.pattern.name()
                );
                for v in run_child(&setup, config, hooked)? {
                    let key: Key = (
                        config.driver.display().to_string(),
                        v["threads"].as_u64().unwrap_or(0),
                        v["live"].as_u64().unwrap_or(0),
                        v["scopes"].as_u64().unwrap_or(0),
                        config.pattern.name(),
                        v["hooked"].as_bool().unwrap_or(false),
                    );
                    let s = v["samples"].as_array().cloned().unwrap_or_default();
                    samples
                        .entry(key)
                        .or_default()
                        .extend(s.iter().filter_map(Value::as_f64));
                }
            }
        }
    }

    let drv = driver.display().to_string();
    let get = |driver: &str, threads, live, scopes, pattern: &'static str, hooked| {
        samples
            .get(&(driver.to_string(), threads, live, scopes, pattern, hooked))
            .cloned()
            .unwrap_or_default()
    };
    let mut results = Vec::new();
    let mut text = String::new();
    text.push_str(&format!(
        "\nHook overhead per alloc+free pair; ns per pair per thread, median of {} samples per cell \
         ({} pairs each, {} child processes per side); `added ns` is the difference of the medians, \
         `added, of minima` that of the fastest samples (what background load cannot inflate); \
         driver addresses: {}; devices reported: {}; machine: {}\n\n",
        setup.repeats * rounds,
        short_count(setup.pairs),
        rounds,
        if setup.fresh { "fresh every time" } else { "freed ones reused" },
        setup.devices,
        machine()
    ));
    let mut sections: Vec<(String, String, Pattern, Vec<u64>)> = vec![
        (
            format!(
                "cuMemAlloc_v2+cuMemFree_v2 through cuGetProcAddress_v2 (the hook's driver wrappers), \
                 fast stand-in driver {}; pattern `pair`: allocate X, free X, the live set untouched",
                driver.display()
            ),
            drv.clone(),
            Pattern::Pair,
            scope_counts.clone(),
        ),
        (
            "the same, pattern `replace`: allocate X, free a random live Y (a cold ledger entry), \
             X takes Y's place"
                .to_string(),
            drv.clone(),
            Pattern::Replace,
            vec![0],
        ),
    ];
    if let Some(rt) = &runtime {
        sections.push((
            format!(
                "cudaMalloc+cudaFree from the global scope (as PyTorch calls them: the hook's runtime \
                 shadow, then its driver wrapper beneath), simulated runtime {} over the fast \
                 stand-in driver; pattern `pair`",
                rt.display()
            ),
            rt.display().to_string(),
            Pattern::Pair,
            vec![0],
        ));
    }
    for (title, path, pattern, scopes_here) in &sections {
        let mut table = Table::new(&[
            "threads",
            "live",
            "scopes",
            "no hook ns",
            "hook ns",
            "added ns",
            "added, of minima",
            "hook p25-p75",
            "ratio",
        ]);
        for &threads in &thread_counts {
            for &live in &lives {
                let base = get(path, threads, live, 0, pattern.name(), false);
                let base_median = median(&base);
                for &scopes in scopes_here {
                    let hooked = get(path, threads, live, scopes, pattern.name(), true);
                    let m = median(&hooked);
                    table.row(vec![
                        threads.to_string(),
                        short_count(live),
                        scopes.to_string(),
                        ns(base_median),
                        ns(m),
                        ns(m - base_median),
                        ns(quantile(&hooked, 0.0) - quantile(&base, 0.0)),
                        format!(
                            "{}-{}",
                            ns(quantile(&hooked, 0.25)),
                            ns(quantile(&hooked, 0.75))
                        ),
                        format!("{:.2}", m / base_median),
                    ]);
                    results.push(json!({
                        "added_min_ns": quantile(&hooked, 0.0) - quantile(&base, 0.0),
                        "path": path, "pattern": pattern.name(), "threads": threads, "live": live,
                        "scopes": scopes, "no_hook_samples": base, "hook_samples": hooked,
                        "no_hook_ns": base_median, "hook_ns": m, "added_ns": m - base_median,
                    }));
                }
            }
        }
        text.push_str(&format!("{title}\n\n"));
        text.push_str(&table.render());
        text.push('\n');
    }

    // Goals (1 thread, pattern `pair`), judged on the medians and, beside them, on the minima.
    let added = |live, scopes, q: f64| {
        quantile(&get(&drv, 1, live, scopes, "pair", true), q)
            - quantile(&get(&drv, 1, live, 0, "pair", false), q)
    };
    let (first, last) = (lives[0], *lives.last().unwrap_or(&lives[0]));
    let worst = |q: f64, scopes: &[u64]| {
        lives
            .iter()
            .flat_map(|&l| scopes.iter().map(move |&s| (l, s)))
            .map(|(l, s)| added(l, s, q))
            .fold(f64::NAN, f64::max)
    };
    let (worst_all, worst_all_min) = (worst(0.5, &scope_counts), worst(0.0, &scope_counts));
    let flat = added(last, 0, 0.5) / added(first, 0, 0.5);
    let flat_min = added(last, 0, 0.0) / added(first, 0, 0.0);
    text.push_str(&format!(
        "goal, 1 thread, pattern pair: added <= 60 ns per pair. Worst with 0 scopes: {} ns \
         (minima: {} ns); with up to {} scopes: {} ns (minima: {} ns): {}\n",
        ns(worst(0.5, &[0])),
        ns(worst(0.0, &[0])),
        scope_counts.iter().max().unwrap_or(&0),
        ns(worst_all),
        ns(worst_all_min),
        if worst_all <= 60.0 && worst_all_min <= 60.0 {
            "met"
        } else {
            "MISSED"
        }
    ));
    text.push_str(&format!(
        "goal, flat in live allocations: added at {} / added at {} = {:.2} (minima: {:.2}); \
         goal <= 1.5: {}\n",
        short_count(last),
        short_count(first),
        flat,
        flat_min,
        if flat <= 1.5 && flat_min <= 1.5 {
            "met"
        } else {
            "MISSED"
        }
    ));

    if let Some(sim) = &sim_driver {
        let s = sim.display().to_string();
        let mut table = Table::new(&[
            "driver",
            "live",
            "no hook ns",
            "hook ns",
            "added ns",
            "no-hook p25-p75",
        ]);
        for &live in &[1_000u64, 100_000] {
            for (name, d) in [("fast stand-in", &drv), ("tests/sim", &s)] {
                let base = get(d, 1, live, 0, "pair", false);
                let hooked = get(d, 1, live, 0, "pair", true);
                table.row(vec![
                    name.to_string(),
                    short_count(live),
                    ns(median(&base)),
                    ns(median(&hooked)),
                    ns(median(&hooked) - median(&base)),
                    format!(
                        "{}-{}",
                        ns(quantile(&base, 0.25)),
                        ns(quantile(&base, 0.75))
                    ),
                ]);
                if d == &s {
                    results.push(json!({
                        "driver": s, "pattern": "pair", "threads": 1, "live": live, "scopes": 0,
                        "no_hook_samples": base, "hook_samples": hooked,
                    }));
                }
            }
        }
        text.push_str(
            "\nWhy a fast stand-in driver: the test suite's simulated driver (mutex, hash table, \
             malloc per allocation) costs this much per pair on its own (1 thread, pattern pair):\n\n",
        );
        text.push_str(&table.render());
    }

    if args.flag("callgrind-only") {
        // Nothing was timed: only the instruction counts below are reported.
        text.clear();
        results.clear();
    }
    let mut instructions = Vec::new();
    if args.flag("callgrind") || args.flag("callgrind-only") {
        let mut table = Table::new(&[
            "path",
            "live",
            "scopes",
            "no hook instr",
            "hook instr",
            "added instr",
        ]);
        let cg_lives: Vec<u64> = lives.iter().copied().filter(|&l| l <= 100_000).collect();
        let cg_scopes: Vec<u64> = [0u64, 64]
            .into_iter()
            .filter(|s| scope_counts.contains(s))
            .collect();
        let mut paths = vec![("driver", driver.clone(), cg_scopes.clone())];
        if let Some(rt) = &runtime {
            paths.push(("runtime", rt.clone(), vec![0]));
        }
        for (api, path, scopes_here) in &paths {
            for &live in &cg_lives {
                let config = |scopes: u64| Config {
                    api,
                    driver: path.clone(),
                    threads: 1,
                    live,
                    scopes: vec![scopes],
                    pattern: Pattern::Pair,
                };
                eprintln!("overhead: callgrind, {api}, live={}", short_count(live));
                let base = callgrind_per_pair(&setup, &config(0), false, &[])?;
                for &scopes in scopes_here {
                    let hooked = callgrind_per_pair(&setup, &config(scopes), true, &[])?;
                    table.row(vec![
                        if *api == "driver" {
                            "cuMemAlloc_v2+cuMemFree_v2".to_string()
                        } else {
                            "cudaMalloc+cudaFree".to_string()
                        },
                        short_count(live),
                        scopes.to_string(),
                        format!("{base:.1}"),
                        format!("{hooked:.1}"),
                        format!("{:.1}", hooked - base),
                    ]);
                    instructions.push(json!({
                        "api": api, "live": live, "scopes": scopes,
                        "no_hook_instructions": base, "hook_instructions": hooked,
                    }));
                }
            }
        }
        text.push_str(
            "\nInstructions per pair (valgrind --tool=callgrind, 1 thread, pattern pair; the \
             difference of a 120k-pair and a 20k-pair run, so set-up is not counted):\n\n",
        );
        text.push_str(&table.render());
    }
    text.push_str(&format!(
        "\n(overhead: {:.0} s in all)\n",
        started.elapsed().as_secs_f64()
    ));
    print!("{text}");

    if let Some(path) = args.string("json") {
        let doc = json!({
            "machine": machine(), "pairs": setup.pairs, "repeats": setup.repeats, "rounds": rounds,
            "bytes": BYTES, "results": results, "instructions": instructions,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

//! `reader_latency`: how long one read of the counters takes from Rust.
//!
//! `Process::used`/`peak` are meant to be single atomic loads of the shared segment, cheap enough to
//! call on every training step or inside a tight loop. This measures them (and the heavier reads
//! beside them) in a process running under the hook, against the floor of a plain atomic load.
//! The hook is needed only for `Process::current()`: without `LD_PRELOAD`, the program re-runs
//! itself under `--hook` (default `target/release/libgpumemhook.so`). No driver is needed: the
//! hook creates its segment when it loads.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use gpumemhook_bench::{machine, median, ns, quantile, short_count, Args, Table};
use gpumemhook_reader::Process;
use serde_json::json;

const RERUN_MARK: &str = "GPUMEMHOOK_BENCH_RERUN";

fn main() {
    if let Err(e) = Args::parse().and_then(|a| run(&a)) {
        eprintln!("reader_latency: {e}");
        std::process::exit(1);
    }
}

/// ns per call of `f`, `repeats` times over `iters` calls.
fn per_call(iters: u64, repeats: usize, mut f: impl FnMut() -> u64) -> Vec<f64> {
    (0..repeats)
        .map(|_| {
            let start = Instant::now();
            let mut acc = 0u64;
            for _ in 0..iters {
                acc = acc.wrapping_add(f());
            }
            black_box(acc);
            start.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect()
}

fn run(args: &Args) -> Result<(), String> {
    let process = match Process::current() {
        Ok(p) => p,
        Err(_) if std::env::var_os(RERUN_MARK).is_none() => return rerun_under_hook(args),
        Err(e) => return Err(format!("the hook is preloaded but not readable: {e}")),
    };
    let quick = args.flag("quick");
    let iters = args.number("iters", if quick { 2_000_000 } else { 20_000_000 })?;
    let repeats = args.number("repeats", if quick { 3 } else { 7 })? as usize;
    let slow_iters = (iters / 1000).max(1000);

    let pid = std::process::id();
    let attached = Process::attach(pid).map_err(|e| format!("attach({pid}): {e}"))?;
    let scope = process
        .open_scope("latency", Some(0))
        .map_err(|e| format!("open_scope: {e}"))?;
    static FLOOR: AtomicU64 = AtomicU64::new(1);

    let mut rows: Vec<(&str, u64, Vec<f64>)> = Vec::new();
    rows.push((
        "floor: one Relaxed AtomicU64 load",
        iters,
        per_call(iters, repeats, || black_box(&FLOOR).load(Ordering::Relaxed)),
    ));
    rows.push((
        "Process::current().used(0)",
        iters,
        per_call(iters, repeats, || black_box(&process).used(black_box(0))),
    ));
    rows.push((
        "Process::current().peak(0)",
        iters,
        per_call(iters, repeats, || black_box(&process).peak(black_box(0))),
    ));
    rows.push((
        "used(0) + peak(0)",
        iters,
        per_call(iters, repeats, || {
            let p = black_box(&process);
            p.used(black_box(0)) + p.peak(black_box(0))
        }),
    ));
    rows.push((
        "Process::attach(pid).used(0) (file mapping)",
        iters,
        per_call(iters, repeats, || black_box(&attached).used(black_box(0))),
    ));
    rows.push((
        "Scope::reading(0)",
        iters / 10,
        per_call(iters / 10, repeats, || {
            black_box(&scope)
                .reading(black_box(0))
                .map_or(0, |r| r.peak)
        }),
    ));
    rows.push((
        "Process::device(0) (all counters)",
        iters / 10,
        per_call(iters / 10, repeats, || {
            black_box(&process)
                .device(black_box(0))
                .map_or(0, |d| d.used)
        }),
    ));
    rows.push((
        "Process::snapshot() (every device and scope)",
        slow_iters,
        per_call(slow_iters, repeats, || {
            black_box(&process).snapshot().devices.len() as u64
        }),
    ));
    rows.push((
        "Process::current() (once per program)",
        slow_iters,
        per_call(slow_iters, repeats, || {
            Process::current().map_or(0, |p| p.used(0))
        }),
    ));
    rows.push((
        "Process::attach(pid) (once per reader)",
        slow_iters,
        per_call(slow_iters, repeats, || {
            Process::attach(pid).map_or(0, |p| p.used(0))
        }),
    ));
    drop(scope);

    let mut table = Table::new(&["read (Rust, in-process)", "calls", "ns per call", "p25-p75"]);
    let mut results = Vec::new();
    for (name, n, samples) in &rows {
        table.row(vec![
            name.to_string(),
            short_count(*n),
            ns(median(samples)),
            format!(
                "{}-{}",
                ns(quantile(samples, 0.25)),
                ns(quantile(samples, 0.75))
            ),
        ]);
        results.push(
            json!({"read": name, "calls": n, "samples": samples, "median_ns": median(samples)}),
        );
    }
    let used_ns = median(&rows[1].2).max(median(&rows[2].2));
    println!(
        "\nReader latency from Rust (median of {repeats} repeats); machine: {}\n\n{}\ngoal: one \
         read of used/peak <= 50 ns: {} ns: {}",
        machine(),
        table.render(),
        ns(used_ns),
        if used_ns <= 50.0 { "met" } else { "MISSED" }
    );
    if let Some(path) = args.string("json") {
        let doc = json!({"machine": machine(), "results": results});
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// Runs this program again with the hook preloaded, passing the arguments along.
fn rerun_under_hook(args: &Args) -> Result<(), String> {
    let hook = args.path("hook", "target/release/libgpumemhook.so");
    if !hook.exists() {
        return Err(format!(
            "not running under the hook and {} does not exist (scripts/bench/cpu builds it)",
            hook.display()
        ));
    }
    let hook: PathBuf = hook.canonicalize().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_PRELOAD", &hook)
        .env(RERUN_MARK, "1")
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the run under the hook failed: {status}"))
    }
}

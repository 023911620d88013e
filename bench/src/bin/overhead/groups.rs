//! `overhead --groups`: what a group (`GPUMEMHOOK_GROUP`, `docs/groups.md`) adds to a pair when
//! 1, 4 or 16 members allocate at once, against the same processes hooked without a group and
//! without the hook.
//!
//! Each run starts N children of one side together: each loads the driver, holds its live set,
//! says it is ready and waits at a gate; the gate opens when all N are ready, so their timed pairs
//! overlap. The group side's children all join one group, `bench-<orchestrator pid>`, and each
//! checks that it holds its live set there before timing. Sides alternate in a rotating order
//! between rounds. Every child reports wall and CPU ns per pair: with more members than cores the
//! wall time of one process includes the others' turns, its CPU time only its own pairs (cache
//! misses on the group's shared lines included).
//!
//! With `--callgrind` it also counts instructions per pair for one process without the hook,
//! hooked without a group and hooked in a group.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::child::{Pattern, BYTES};
use crate::children::{callgrind_per_pair, side_env, Config, Setup};
use gpumemhook_bench::{machine, median, ns, quantile, short_count, Args, Table};

/// The three sides compared, in the order of the first round.
const SIDES: [&str; 3] = ["no hook", "hook", "group"];

/// Wall and CPU samples (ns per pair per process) of one (members, side).
#[derive(Default)]
struct Samples {
    wall: Vec<f64>,
    cpu: Vec<f64>,
    /// Per run: how many processes ran their pairs at once, on average (the sum of their windows
    /// over the span from the first start to the last end).
    at_once: Vec<f64>,
}

/// How many of `lines`' processes ran their pairs at once, on average.
fn at_once(lines: &[Value]) -> f64 {
    let windows: Vec<(f64, f64)> = lines
        .iter()
        .filter_map(|v| Some((v["window_ns"][0].as_f64()?, v["window_ns"][1].as_f64()?)))
        .collect();
    let first = windows.iter().map(|w| w.0).fold(f64::INFINITY, f64::min);
    let last = windows
        .iter()
        .map(|w| w.1)
        .fold(f64::NEG_INFINITY, f64::max);
    windows.iter().map(|w| w.1 - w.0).sum::<f64>() / (last - first)
}

/// Runs the group comparison (what `--groups` asks for) in the segment directory `setup.shm_dir`.
pub(crate) fn compare(args: &Args, setup: &Setup, driver: &Path) -> Result<(), String> {
    let quick = args.flag("quick");
    let rounds = args.number("rounds", if quick { 1 } else { 5 })?.max(1);
    let member_counts = args.list("members", &[1, 4, 16])?;
    let live = args.list("live", &[1_000])?[0];
    let group = format!("bench-{}", std::process::id());
    let config = |api: &'static str, path: &Path| Config {
        api,
        driver: path.to_path_buf(),
        threads: 1,
        live,
        scopes: vec![0],
        pattern: Pattern::Pair,
    };
    let started = Instant::now();
    let mut samples: BTreeMap<(u64, &'static str), Samples> = BTreeMap::new();
    if !args.flag("callgrind-only") {
        for round in 0..rounds {
            for &members in &member_counts {
                for i in 0..SIDES.len() {
                    // Rotate which side goes first, so slow drift in the machine's load is shared.
                    let side = SIDES[(i + round as usize) % SIDES.len()];
                    eprintln!(
                        "overhead: groups, round {}/{rounds}: {members} processes, {side}",
                        round + 1
                    );
                    let gate = setup.shm_dir.join(format!("gate.{round}.{members}.{i}"));
                    let env_group = (side == "group").then_some(group.as_str());
                    let lines = run_together(
                        setup,
                        &config("driver", driver),
                        side != "no hook",
                        env_group,
                        members,
                        &gate,
                    )?;
                    let cell = samples.entry((members, side)).or_default();
                    cell.at_once.push(at_once(&lines));
                    for v in lines {
                        let get = |key: &str| -> Vec<f64> {
                            v[key]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_f64)
                                .collect()
                        };
                        cell.wall.extend(get("samples"));
                        cell.cpu.extend(get("cpu_samples"));
                    }
                }
            }
        }
    }

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut text = format!(
        "\nGroups: N processes at once, each 1 thread, {} live, pattern pair, over the fast \
         stand-in driver {}; ns per cuMemAlloc_v2+cuMemFree_v2 pair per process, {} samples of {} \
         pairs per process and side ({} rounds, sides alternating); `cpu`: the thread's CPU time, \
         `wall`: elapsed; machine: {} (more processes than CPUs share them in turns)\n\n",
        short_count(live),
        driver.display(),
        setup.repeats * rounds,
        short_count(setup.pairs),
        rounds,
        machine(),
    );
    let mut table = Table::new(&[
        "members",
        "no hook cpu",
        "hook cpu",
        "group cpu",
        "group added cpu",
        "group added, of minima",
        "hook wall",
        "group wall",
        "hook cpu p75 / p90",
        "group cpu p75 / p90",
        "at once (hook, group)",
    ]);
    let mut results = Vec::new();
    let none = Samples::default();
    for &members in &member_counts {
        let s = |side: &'static str| samples.get(&(members, side)).unwrap_or(&none);
        let (bare, hook, grouped) = (s("no hook"), s("hook"), s("group"));
        let min = |v: &[f64]| quantile(v, 0.0);
        let med = median;
        let cell = |v: &[f64]| format!("{} / {}", ns(med(v)), ns(min(v)));
        // The slow repeats: those in which another member allocated on the other CPU.
        let upper = |v: &[f64]| format!("{} / {}", ns(quantile(v, 0.75)), ns(quantile(v, 0.9)));
        table.row(vec![
            format!(
                "{members}{}",
                if members as usize > cpus { " *" } else { "" }
            ),
            cell(&bare.cpu),
            cell(&hook.cpu),
            cell(&grouped.cpu),
            ns(med(&grouped.cpu) - med(&hook.cpu)),
            ns(min(&grouped.cpu) - min(&hook.cpu)),
            cell(&hook.wall),
            cell(&grouped.wall),
            upper(&hook.cpu),
            upper(&grouped.cpu),
            format!(
                "{:.2}, {:.2}",
                median(&hook.at_once),
                median(&grouped.at_once)
            ),
        ]);
        results.push(json!({
            "members": members, "live": live,
            "no_hook_cpu": bare.cpu, "hook_cpu": hook.cpu, "group_cpu": grouped.cpu,
            "no_hook_wall": bare.wall, "hook_wall": hook.wall, "group_wall": grouped.wall,
            "hook_at_once": hook.at_once, "group_at_once": grouped.at_once,
        }));
    }
    if !args.flag("callgrind-only") {
        text.push_str(
            "cells: median / fastest sample, ns per pair; `at once`: the median over runs of how \
             many processes ran their pairs at the same time, on average\n\n",
        );
        text.push_str(&table.render());
        if member_counts.iter().any(|&m| m as usize > cpus) {
            text.push_str(&format!(
                "* more processes than the {cpus} CPUs: they take turns, so at any instant at most \
                 {cpus} allocate at once; their wall ns per pair include the others' turns\n"
            ));
        }
    }

    let mut instructions = Vec::new();
    if args.flag("callgrind") || args.flag("callgrind-only") {
        let mut table = Table::new(&[
            "path",
            "no hook instr",
            "hook instr",
            "group instr",
            "group added",
        ]);
        let mut paths = vec![("driver", driver.to_path_buf())];
        if let Some(rt) = args.string("runtime") {
            paths.push(("runtime", rt.into()));
        }
        for (api, path) in &paths {
            eprintln!("overhead: groups, callgrind, {api}");
            let c = config(api, path);
            let bare = callgrind_per_pair(setup, &c, false, &[])?;
            let hook = callgrind_per_pair(setup, &c, true, &[])?;
            let grouped = callgrind_per_pair(
                setup,
                &c,
                true,
                &[(gpumemhook_reader::env::GROUP, group.as_str())],
            )?;
            table.row(vec![
                if *api == "driver" {
                    "cuMemAlloc_v2+cuMemFree_v2".to_string()
                } else {
                    "cudaMalloc+cudaFree".to_string()
                },
                format!("{bare:.1}"),
                format!("{hook:.1}"),
                format!("{grouped:.1}"),
                format!("{:.1}", grouped - hook),
            ]);
            instructions.push(json!({
                "api": api, "live": live, "no_hook_instructions": bare,
                "hook_instructions": hook, "group_instructions": grouped,
            }));
        }
        text.push_str(&format!(
            "\nInstructions per pair, one process (valgrind --tool=callgrind, 1 thread, {} live, \
             pattern pair; the difference of a 120k-pair and a 20k-pair run):\n\n",
            short_count(live)
        ));
        text.push_str(&table.render());
    }
    text.push_str(&format!(
        "\n(overhead --groups: {:.0} s in all)\n",
        started.elapsed().as_secs_f64()
    ));
    print!("{text}");
    if let Some(path) = args.string("json") {
        let doc = json!({
            "machine": machine(), "pairs": setup.pairs, "repeats": setup.repeats, "rounds": rounds,
            "bytes": BYTES, "groups": results, "instructions": instructions,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// Runs `count` children of one side at once behind `gate`, and returns their JSON result lines.
fn run_together(
    setup: &Setup,
    config: &Config,
    hooked: bool,
    group: Option<&str>,
    count: u64,
    gate: &Path,
) -> Result<Vec<Value>, String> {
    let mut children: Vec<Child> = Vec::new();
    let result = start_and_collect(setup, config, hooked, group, count, gate, &mut children);
    // On an error, no child is left waiting at the gate.
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    result
}

fn start_and_collect(
    setup: &Setup,
    config: &Config,
    hooked: bool,
    group: Option<&str>,
    count: u64,
    gate: &Path,
    children: &mut Vec<Child>,
) -> Result<Vec<Value>, String> {
    for _ in 0..count {
        let mut cmd = Command::new(&setup.exe);
        cmd.args(config.words(setup.pairs, setup.repeats, None))
            .arg("--gate")
            .arg(gate)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        side_env(&mut cmd, setup, hooked);
        if let Some(name) = group {
            cmd.env(gpumemhook_reader::env::GROUP, name);
        }
        children.push(
            cmd.spawn()
                .map_err(|e| format!("{}: {e}", setup.exe.display()))?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    for c in children.iter_mut() {
        let ready = format!("{}.ready.{}", gate.display(), c.id());
        while !Path::new(&ready).exists() {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(format!("a child ended before the gate ({status})"));
            }
            if Instant::now() > deadline {
                return Err("a child never reached the gate".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    std::fs::write(gate, b"").map_err(|e| format!("{}: {e}", gate.display()))?;
    let mut lines = Vec::new();
    for c in std::mem::take(children) {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "child (hooked={hooked}, group={group:?}) failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        lines.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok()),
        );
    }
    Ok(lines)
}

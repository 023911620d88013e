//! Emulating a smaller card (`GPUMEMHOOK_EMULATE`, `gpumemhook run --emulate`): the overhead charged
//! inside the card, refusals at the right byte, one view of the card everywhere (CUDA and NVML, by
//! each door), and bad values refused.
//!
//! The stand-in NVML reports this process's use as the stand-in driver's `used` plus an overhead:
//! `FAKECUDA_CONTEXT_BYTES` once a context exists, `FAKECUDA_MODULE_BYTES` per loaded module.

use gpumemhook_tests::{cli, scratch, sim_dir, Ran, Run};
use std::collections::BTreeMap;

pub(crate) const MIB: u64 = 1 << 20;
/// The T4 preset: what `nvidia-smi` shows on a T4.
const T4: u64 = 15360 * MIB;
/// The stand-in context's overhead (`FAKECUDA_CONTEXT_BYTES`) in these runs.
pub(crate) const CONTEXT: u64 = 500 * MIB;
/// The real (stand-in) card: 40 GiB, larger than the emulated one.
const REAL: u64 = 40 << 30;

/// `simrun` emulating `card` over a larger stand-in card whose contexts cost [`CONTEXT`].
pub(crate) fn emulated(card: &str, ops: &[&str]) -> Run {
    Run::sim("simrun", ops)
        .env("GPUMEMHOOK_EMULATE", card)
        .env("FAKECUDA_MEM_BYTES", REAL.to_string())
        .env("FAKECUDA_CONTEXT_BYTES", CONTEXT.to_string())
}

fn num(fields: &BTreeMap<String, String>, key: &str) -> u64 {
    fields
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {fields:?}"))
        .parse()
        .unwrap()
}

/// The `key=value` numbers of every stdout line starting with `prefix`, in order.
fn lines(ran: &Ran, prefix: &str) -> Vec<BTreeMap<String, String>> {
    ran.stdout()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn the_context_is_charged_inside_the_card_and_the_next_byte_is_refused() {
    let room = T4 - CONTEXT;
    let ran = emulated(
        "t4",
        &[
            "rt.malloc:a:1000",
            &format!("rt.malloc:b:{}=2", room - 1000 + 1),
            &format!("drv.alloc:b:{}=2", room - 1000 + 1),
            &format!("drv.alloc:b:{}", room - 1000),
            "rt.malloc:c:1=2",
            "print.used:0",
        ],
    )
    .run()
    .ok();
    let d = ran.report().device(0);
    assert_eq!((d.used, d.denied), (room, 3));
    let e = d.emulated.expect("the report names the emulated card");
    assert_eq!((e.card.as_str(), e.total, e.overhead), ("t4", T4, CONTEXT));
    assert!(
        ran.stdout().contains(&format!("used dev=0 bytes={room}")),
        "the driver saw only admitted allocations: {}",
        ran.stdout()
    );
}

#[test]
fn module_loads_grow_the_charge() {
    let module = 100 * MIB;
    // A load long enough after the last measurement is measured at once.
    let ran = emulated(
        "t4",
        &["rt.malloc:a:1000", "sleep:80", "drv.ctx:0", "drv.module"],
    )
    .env("FAKECUDA_MODULE_BYTES", module.to_string())
    .run()
    .ok();
    assert_eq!(
        ran.report().device(0).emulated.unwrap().overhead,
        CONTEXT + module
    );
    // Loads in a burst are measured at the next memory query (or refusal).
    let room = T4 - CONTEXT - 2 * module;
    let ran = emulated(
        "t4",
        &[
            "rt.malloc:a:1000",
            "drv.ctx:0",
            "drv.module",
            "drv.library",
            "rt.meminfo",
            &format!("rt.malloc:b:{}=2", room - 1000 + 1),
            &format!("rt.malloc:b:{}", room - 1000),
            "rt.meminfo",
        ],
    )
    .env("FAKECUDA_MODULE_BYTES", module.to_string())
    .run()
    .ok();
    let d = ran.report().device(0);
    assert_eq!(d.emulated.unwrap().overhead, CONTEXT + 2 * module);
    assert_eq!((d.used, d.denied), (room, 1));
    let info = lines(&ran, "rt.meminfo");
    assert_eq!(
        (num(&info[0], "free"), num(&info[0], "total")),
        (room - 1000, T4)
    );
    assert_eq!((num(&info[1], "free"), num(&info[1], "total")), (0, T4));
}

#[test]
fn a_refusal_measures_again_before_it_is_final() {
    // The context shrinks after first contact (the stand-in reads the variable at every call): the
    // stale figure would refuse, the fresh one admits.
    let smaller = 100 * MIB;
    let room = T4 - smaller;
    let ran = emulated(
        "t4",
        &[
            "rt.malloc:a:1000",
            &format!("setenv:FAKECUDA_CONTEXT_BYTES:{smaller}"),
            &format!("rt.malloc:b:{}", room - 1000),
            "rt.malloc:c:1=2",
        ],
    )
    .run()
    .ok();
    let d = ran.report().device(0);
    assert_eq!((d.used, d.denied), (room, 1), "one refusal: the last byte");
    assert_eq!(d.emulated.unwrap().overhead, smaller);
}

/// Runs `ops` then every view of device 0, and checks they describe one card of `total` bytes.
fn check_views(run: Run, total: u64, own_extra: u64) -> Ran {
    let ran = run.run().ok();
    let used = ran.report().device(0).used;
    let cuda: Vec<(u64, u64)> = ["drv.meminfo", "rt.meminfo"]
        .iter()
        .map(|p| {
            let f = &lines(&ran, p)[0];
            (num(f, "free"), num(f, "total"))
        })
        .collect();
    let (free, cuda_total) = cuda[0];
    assert_eq!(cuda[1], cuda[0], "runtime and driver agree");
    assert_eq!(cuda_total, total);
    assert_eq!(num(&lines(&ran, "drv.total")[0], "total"), total);
    let mems = lines(&ran, "nvml.mem ");
    assert_eq!(mems.len(), 2, "one per door");
    for m in &mems {
        assert_eq!(num(m, "total"), total, "{m:?}");
        assert_eq!(num(m, "free"), free, "NVML's free is CUDA's: {m:?}");
        assert_eq!(num(m, "used") + num(m, "free"), total, "{m:?}");
    }
    let m2 = &lines(&ran, "nvml.mem2")[0];
    assert_eq!(
        num(m2, "used") + num(m2, "free") + num(m2, "reserved"),
        total
    );
    assert_eq!(num(m2, "free"), free);
    let procs = lines(&ran, "nvml.procs");
    assert_eq!(procs.len(), 4, "v1, v2, v3 and v3 by the other door");
    for p in &procs {
        let own = num(p, "self");
        assert_eq!(own, used + own_extra, "{p:?}");
        assert!(
            own <= total,
            "the process never uses more than the card: {p:?}"
        );
    }
    ran
}

const VIEWS: &[&str] = &[
    "drv.meminfo",
    "rt.meminfo",
    "drv.total:0",
    "nvml.mem:0:dl",
    "nvml.mem:0:sym",
    "nvml.mem2:0:dl",
    "nvml.procs:0:1:dl",
    "nvml.procs:0:2:dl",
    "nvml.procs:0:3:dl",
    "nvml.procs:0:3:sym",
];

fn with_views(first: &[&str]) -> Vec<String> {
    first
        .iter()
        .chain(VIEWS.iter())
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn every_view_shows_the_emulated_card() {
    let ops = with_views(&["rt.malloc:a:3000000", "drv.ctx:0", "drv.alloc:b:5000"]);
    let ops: Vec<&str> = ops.iter().map(String::as_str).collect();
    // Another process holding memory on the real card changes nothing in this process's card.
    let ran = check_views(
        emulated("t4", &ops).env("FAKENVML_OTHER_USED", (1u64 << 30).to_string()),
        T4,
        CONTEXT,
    );
    for p in lines(&ran, "nvml.procs") {
        assert_eq!(num(&p, "others"), 1 << 30, "other processes pass unchanged");
    }
    assert_eq!(
        num(&lines(&ran, "drv.meminfo")[0], "free"),
        T4 - CONTEXT - 3_005_000
    );
}

#[test]
fn a_plain_ceiling_gives_one_view_too() {
    let ops = with_views(&["rt.malloc:a:3000000"]);
    let ops: Vec<&str> = ops.iter().map(String::as_str).collect();
    let run = Run::sim("simrun", &ops)
        .env("GPUMEMHOOK_LIMIT", "1GiB")
        .env("FAKECUDA_MEM_BYTES", REAL.to_string())
        .env("FAKECUDA_CONTEXT_BYTES", CONTEXT.to_string());
    // Under a ceiling the overhead lies outside it: the process's figure is what it allocated.
    let ran = check_views(run, 1 << 30, 0);
    assert!(ran.report().device(0).emulated.is_none());
}

#[test]
fn without_a_view_nvml_passes_unchanged() {
    let ran = Run::sim(
        "simrun",
        &["rt.malloc:a:3000000", "nvml.mem:0:dl", "nvml.procs:0:3:dl"],
    )
    .env("FAKECUDA_MEM_BYTES", REAL.to_string())
    .env("FAKECUDA_CONTEXT_BYTES", CONTEXT.to_string())
    .run()
    .ok();
    let m = &lines(&ran, "nvml.mem ")[0];
    assert_eq!(num(m, "total"), REAL);
    assert_eq!(num(m, "used"), 3_000_000 + CONTEXT);
    assert_eq!(
        num(&lines(&ran, "nvml.procs")[0], "self"),
        3_000_000 + CONTEXT
    );
}

#[test]
fn nvml_devices_are_matched_to_cuda_devices_by_uuid() {
    // NVML lists the devices in the other order; only device 1 (CUDA's numbering) is emulated.
    let ran = Run::sim(
        "simrun",
        &[
            "rt.setdev:1",
            "rt.malloc:a:1000",
            "nvml.mem:0:dl",
            "nvml.mem:1:sym",
            "nvml.procs:0:2:dl",
        ],
    )
    .env("GPUMEMHOOK_EMULATE_1", "l4")
    .env("FAKENVML_REVERSED", "1")
    .env("FAKECUDA_MEM_BYTES", REAL.to_string())
    .env("FAKECUDA_CONTEXT_BYTES", CONTEXT.to_string())
    .run()
    .ok();
    let l4 = 23034 * MIB;
    let mems = lines(&ran, "nvml.mem ");
    assert_eq!(num(&mems[0], "total"), l4, "NVML 0 is CUDA 1: {mems:?}");
    assert_eq!(num(&mems[1], "total"), REAL, "NVML 1 is CUDA 0: {mems:?}");
    assert_eq!(num(&lines(&ran, "nvml.procs")[0], "self"), 1000 + CONTEXT);
    let d = ran.report().device(1);
    assert_eq!(d.emulated.unwrap().total, l4);
}

#[test]
fn without_nvml_the_overhead_is_not_charged_and_that_is_said_once() {
    let ran = emulated(
        "12GiB",
        &[
            "rt.malloc:a:1000",
            "drv.ctx:0",
            "drv.module",
            &format!("rt.malloc:b:{}", (12u64 << 30) - 1000),
            "rt.malloc:c:1=2",
        ],
    )
    .env("FAKENVML_FAIL", "1")
    .run()
    .ok();
    let stderr = ran.stderr();
    assert_eq!(
        stderr.matches("not charged").count(),
        1,
        "said once: {stderr}"
    );
    let d = ran.report().device(0);
    let e = d.emulated.unwrap();
    assert_eq!(
        (e.card.as_str(), e.total, e.overhead),
        ("12.00 GiB", 12 << 30, 0)
    );
    assert_eq!((d.used, d.denied), (12 << 30, 1));
}

#[test]
fn bad_cards_stop_the_program_with_one_line_listing_the_presets() {
    for (var, value) in [
        ("GPUMEMHOOK_EMULATE", "t5"),
        ("GPUMEMHOOK_EMULATE", "0"),
        ("GPUMEMHOOK_EMULATE", "0GiB"),
        ("GPUMEMHOOK_EMULATE_1", "biggest"),
    ] {
        let ran = Run::sim("simrun", &["rt.malloc:a:1"]).env(var, value).run();
        assert_eq!(ran.output.status.code(), Some(2), "{var}={value}");
        let stderr = ran.stderr();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(var) && stderr.contains("t4") && stderr.contains("a100-80gb"),
            "{stderr}"
        );
        assert!(ran.stdout().is_empty(), "the program never ran");
    }
    let ran = Run::sim("simrun", &["rt.malloc:a:1"])
        .env("GPUMEMHOOK_EMULATE_64", "t4")
        .run();
    assert_eq!(ran.output.status.code(), Some(2));
    assert!(ran.stderr().contains("below 64"), "{}", ran.stderr());
}

#[test]
fn the_cli_lists_the_cards_and_runs_a_program_on_one() {
    let dir = scratch("emulate-cli");
    let o = cli(&dir, &["cards"]).output().unwrap();
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("t4") && out.contains("15360 MiB"), "{out}");
    assert!(
        out.contains("a100-80gb") && out.contains("81920 MiB"),
        "{out}"
    );

    let simrun = sim_dir().join("simrun");
    let o = cli(
        &dir,
        &[
            "run",
            "--emulate",
            "t4",
            "--report",
            "rep.json",
            "--",
            simrun.to_str().unwrap(),
            "rt.malloc:a:1000",
            "rt.meminfo",
        ],
    )
    .env("FAKECUDA_MEM_BYTES", REAL.to_string())
    .env("FAKECUDA_CONTEXT_BYTES", CONTEXT.to_string())
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("free={} total={T4}", T4 - CONTEXT - 1000)),
        "{stdout}"
    );
    assert!(
        stderr.contains("t4"),
        "the summary names the card: {stderr}"
    );

    let o = cli(
        &dir,
        &["run", "--emulate", "t5", "--", simrun.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("--emulate") && stderr.contains("a100-80gb"),
        "{stderr}"
    );
}

#[test]
fn ls_shows_the_card_and_the_charged_overhead_of_a_live_process() {
    let run = emulated("t4", &["rt.malloc:a:1000"]);
    let ready = run.dir().join("ready");
    let go = run.dir().join("go");
    let (mut command, dir) = run
        .arg(format!("touch:{}", ready.display()))
        .arg(format!("wait:{}", go.display()))
        .into_command();
    // The CLI built first: a build under load can outlast the program's wait.
    gpumemhook_tests::cli_bin();
    let mut child = command.spawn().expect("simrun starts");
    gpumemhook_tests::wait_for(&ready);
    let listed = cli(&dir, &["ls"]).output().unwrap();
    let json = cli(&dir, &["ls", "--json"]).output().unwrap();
    std::fs::write(&go, b"").unwrap();
    assert!(child.wait().unwrap().success());
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(table.contains("t4 -500.0 MiB ctx"), "{table}");
    let json = String::from_utf8_lossy(&json.stdout);
    let value: serde_json::Value = serde_json::from_str(&json).expect("ls --json is JSON");
    let emulated = &value[0]["devices"][0]["emulated"];
    assert_eq!(emulated["card"], "t4", "{json}");
    assert_eq!(emulated["total"], T4, "{json}");
    assert_eq!(emulated["overhead"], CONTEXT, "{json}");
}

#[test]
fn a_memory_query_before_any_allocation_already_charges_the_context() {
    // XLA sizes its preallocation from cuMemGetInfo before allocating anything.
    let ran = emulated(
        "t4",
        &["drv.init", "drv.ctx:0", "drv.meminfo", "rt.meminfo"],
    )
    .run()
    .ok();
    for prefix in ["drv.meminfo", "rt.meminfo"] {
        let f = &lines(&ran, prefix)[0];
        assert_eq!(
            (num(f, "free"), num(f, "total")),
            (T4 - CONTEXT, T4),
            "{prefix}"
        );
    }
}

#[test]
fn with_no_nvml_library_at_all_the_card_still_caps_allocations() {
    // The simulated stack without its NVML: simrun and the two libraries copied alone.
    let bare = scratch("no-nvml");
    for f in ["simrun", "libcuda.so.1", "libcudart.so.13"] {
        std::fs::copy(sim_dir().join(f), bare.join(f)).unwrap();
    }
    let ran = emulated(
        "rtx3060",
        &[
            &format!("rt.malloc:a:{}", 12288 * MIB),
            "rt.malloc:b:1=2",
            "rt.meminfo",
        ],
    )
    .env("LD_LIBRARY_PATH", &bare)
    .arg("print.used:0");
    let (mut command, dir) = run_with_program(ran, &bare.join("simrun"));
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // (On a machine with a real NVML, that one is found instead and does not know the stand-in's
    // device: the same single line, with another reason.)
    assert_eq!(stderr.matches("not charged").count(), 1, "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("free=0 total={}", 12288 * MIB)),
        "{stdout}"
    );
    let _ = dir;
}

/// The command of `run` with another program in place of `simrun` (same arguments and environment).
fn run_with_program(
    run: Run,
    program: &std::path::Path,
) -> (std::process::Command, std::path::PathBuf) {
    let (command, dir) = run.into_command();
    let mut other = std::process::Command::new(program);
    other.args(command.get_args());
    for (k, v) in command.get_envs() {
        match v {
            Some(v) => other.env(k, v),
            None => other.env_remove(k),
        };
    }
    other.stdin(std::process::Stdio::null());
    (other, dir)
}

/// The context shrinks after first contact (as in
/// [`a_refusal_measures_again_before_it_is_final`]), then one allocation fills the card's fresh room
/// exactly (`fill`) or passes it by one 1024-byte row (`past`). Every door judges it alike: the
/// pitched ones (width 513 is padded to a 1024-byte pitch, so the width × height estimate fits the
/// stale room and only the padding needs the fresh figure), at the driver, through the runtime
/// and through the runtime out of the driver wrapper's sight, and a plain `cuMemAlloc`.
#[test]
fn a_pitched_allocation_is_refused_exactly_where_a_plain_one_is() {
    const ROW: u64 = 1024;
    let smaller = 100 * MIB;
    let room = T4 - smaller;
    // Rows that fill the fresh room after the first allocation (one row) exactly; the stale room
    // (the first context figure) is 400 MiB smaller, but holds the unpadded estimate.
    let rows = (room - ROW) / ROW;
    assert!(rows * 513 < T4 - CONTEXT - ROW && rows * ROW > T4 - CONTEXT - ROW);
    let plain = |rows: u64, rc: &str| format!("drv.alloc:b:{}{rc}", rows * ROW);
    let driver_pitch = |rows: u64, rc: &str| format!("drv.alloc_pitch:b:513:{rows}:4{rc}");
    let runtime_pitch = |rows: u64, rc: &str| format!("rt.malloc_pitch:b:513:{rows}{rc}");
    // (door, its simrun operation for a count of rows and an expected code, driver unseen)
    type Op<'a> = &'a dyn Fn(u64, &str) -> String;
    let doors: [(&str, Op, bool); 4] = [
        ("cuMemAlloc", &plain, false),
        ("cuMemAllocPitch", &driver_pitch, false),
        ("cudaMallocPitch", &runtime_pitch, false),
        ("cudaMallocPitch, driver unseen", &runtime_pitch, true),
    ];
    for (door, op, hidden) in doors {
        for (rows, rc, used) in [(rows, "", room), (rows + 1, "=2", ROW)] {
            let mut run = emulated(
                "t4",
                &[
                    "drv.init",
                    "drv.ctx:0",
                    &format!("drv.alloc:a:{ROW}"),
                    &format!("setenv:FAKECUDA_CONTEXT_BYTES:{smaller}"),
                    &op(rows, rc),
                    "print.used:0",
                ],
            );
            if hidden {
                run = run.env("FAKECUDART_HIDDEN", "1");
            }
            let ran = run.run().ok();
            let d = ran.report().device(0);
            let denied = u64::from(!rc.is_empty());
            assert_eq!(
                (d.used, d.denied),
                (used, denied),
                "{door}, {rows} rows: {}",
                ran.stdout()
            );
            assert!(
                ran.stdout().contains(&format!("used dev=0 bytes={used}")),
                "{door}, {rows} rows: the driver holds only what was admitted: {}",
                ran.stdout()
            );
        }
    }
}

//! Groups (`GPUMEMHOOK_GROUP`, `docs/groups.md`): processes that share one exact count, one peak,
//! one ceiling and one emulated card. Every member is a real `simrun` process under the hook, all
//! in one segment directory; the group is read through `gpumemhook group NAME --json`, a real
//! reader process (which sweeps out dead members first).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use gpumemhook_reader::Snapshot;
use gpumemhook_tests::{cli, cli_bin, scratch, wait_for, Run};

pub(crate) const MIB: u64 = 1 << 20;

/// A group of members sharing one segment directory (`<dir>/shm`); `group_members` uses it too.
pub(crate) struct Group {
    pub(crate) dir: PathBuf,
    pub(crate) name: &'static str,
}

impl Group {
    pub(crate) fn new(name: &'static str) -> Group {
        // Built before any member starts: members wait at most 120 s for the test's signal.
        cli_bin();
        let dir = scratch(name);
        std::fs::create_dir_all(dir.join("shm")).unwrap();
        Group { dir, name }
    }

    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub(crate) fn touch(&self, name: &str) {
        touch(&self.file(name));
    }

    pub(crate) fn wait(&self, name: &str) {
        wait_for(&self.file(name));
    }

    /// `touch:PATH` / `wait:PATH` operations on a file of the group's directory.
    pub(crate) fn op(&self, verb: &str, name: &str) -> String {
        format!("{verb}:{}", self.file(name).display())
    }

    /// A member running `ops`, with `extra` variables; its reports go to the group's directory.
    pub(crate) fn member(&self, ops: &[String], extra: &[(&str, String)]) -> Child {
        self.member_from(Run::sim("simrun", &[]), ops, extra)
    }

    /// [`Group::member`] made from `run` (one in a pod, say).
    pub(crate) fn member_from(&self, run: Run, ops: &[String], extra: &[(&str, String)]) -> Child {
        let mut run = run
            .env("GPUMEMHOOK_SHM_DIR", self.dir.join("shm"))
            .env("GPUMEMHOOK_REPORT", self.dir.join("report.%p.json"))
            .env("GPUMEMHOOK_GROUP", self.name);
        for (key, value) in extra {
            run = run.env(key, value);
        }
        let (mut command, _) = run.into_command();
        command
            .args(ops)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("simrun starts")
    }

    /// The group's figures on device 0, as `gpumemhook group NAME --json` reads them.
    pub(crate) fn read(&self) -> serde_json::Value {
        let out = cli(&self.dir, &["group", self.name, "--json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        value["devices"][0].clone()
    }

    /// `count` members (with `extra` variables) that each hold 100 MiB and, one after the other,
    /// spike 600 MiB and free it; back once every spike is over, the members holding their 100 MiB
    /// until `end` is touched.
    fn spikes_in_turn(&self, count: usize, extra: &[(&str, String)]) -> Vec<Child> {
        let members: Vec<Child> = (0..count)
            .map(|i| {
                self.member(
                    &[
                        format!("rt.malloc:base:{}", 100 * MIB),
                        self.op("touch", &format!("base.{i}")),
                        self.op("wait", &format!("turn.{i}")),
                        format!("rt.malloc:spike:{}", 600 * MIB),
                        "rt.free:spike".to_string(),
                        self.op("touch", &format!("turn.{}", i + 1)),
                        self.op("wait", "end"),
                    ],
                    extra,
                )
            })
            .collect();
        for i in 0..count {
            self.wait(&format!("base.{i}"));
        }
        self.touch("turn.0");
        self.wait(&format!("turn.{count}"));
        members
    }

    /// Every exit report of the group's members, by pid.
    fn reports(&self) -> BTreeMap<u32, Snapshot> {
        std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|e| {
                let path = e.ok()?.path();
                let name = path.file_name()?.to_str()?.to_string();
                name.starts_with("report.").then_some(path)
            })
            .map(|path| {
                let s: Snapshot =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                (s.pid, s)
            })
            .collect()
    }
}

pub(crate) fn finish(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "member failed: {text}");
    text
}

fn n(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

fn touch(path: &Path) {
    std::fs::write(path, b"").unwrap();
}

#[test]
fn the_groups_figures_are_the_sums_of_its_members_with_frees_on_other_threads() {
    let g = Group::new("group-sums");
    let members: Vec<Child> = (0..4)
        .map(|i| {
            g.member(
                &[
                    format!("threads:8:7000:{}:1000000", 100 * i + 1),
                    "handoff:8:100:4096".to_string(),
                    format!("touch:{}", g.file(&format!("done.{i}")).display()),
                    format!("wait:{}", g.file("go").display()),
                ],
                &[],
            )
        })
        .collect();
    for i in 0..4 {
        wait_for(&g.file(&format!("done.{i}")));
    }
    let during = g.read();
    touch(&g.file("go"));
    for m in members {
        finish(m);
    }
    let reports = g.reports();
    assert_eq!(reports.len(), 4);
    let sum = |f: fn(&gpumemhook_reader::DeviceStats) -> u64| -> u64 {
        reports.values().map(|r| f(&r.devices[0])).sum()
    };
    assert_eq!(n(&during, "used"), sum(|d| d.used), "{during}");
    assert_eq!(n(&during, "allocs"), sum(|d| d.allocs), "{during}");
    assert_eq!(n(&during, "frees"), sum(|d| d.frees), "{during}");
    assert!(n(&during, "allocs") > 100_000, "{during}");
    assert_eq!(during["members"].as_array().unwrap().len(), 4, "{during}");
    // Every member gone: what each held is given back, once.
    let after = g.read();
    assert_eq!(n(&after, "used"), 0, "{after}");
    assert_eq!(n(&after, "allocs"), n(&during, "allocs"), "{after}");
}

/// The group counts an allocation at its reservation (one check of the group per allocation): one
/// the driver fails is taken out again, a pitch's padding is no second allocation, and a free
/// counts once, of device memory only.
#[test]
fn the_groups_allocations_are_those_that_happened_once_each() {
    let g = Group::new("group-counts");
    let m = g.member(
        &[
            "drv.init".to_string(),
            "drv.ctx:0".to_string(),
            format!("drv.alloc:a:{}", 100 * MIB),
            // Past the driver's memory: it fails (2), and the group's reservation is given back.
            format!("drv.alloc:b:{}=2", 2048 * MIB),
            // 1000 bytes a row padded to 1024: one allocation, its padding reserved after the call.
            "drv.alloc_pitch:c:1000:1000:4".to_string(),
            format!("rt.malloc:d:{}", MIB),
            format!("drv.alloc_managed:e:{MIB}"),
            "drv.free:a".to_string(),
            "drv.free:e".to_string(),
            format!("touch:{}", g.file("done").display()),
            format!("wait:{}", g.file("go").display()),
        ],
        &[("FAKECUDA_MEM_BYTES", (1024 * MIB).to_string())],
    );
    wait_for(&g.file("done"));
    let during = g.read();
    touch(&g.file("go"));
    finish(m);
    let reports = g.reports();
    let own = &reports.values().next().expect("a report").devices[0];
    assert_eq!(n(&during, "used"), 1024 * 1000 + MIB, "{during}");
    assert_eq!(n(&during, "allocs"), 3, "{during}");
    assert_eq!(n(&during, "frees"), 1, "{during}");
    assert_eq!((own.allocs, own.frees), (3, 1), "{own:?}");
}

#[test]
fn the_groups_peak_is_the_exact_joint_peak_not_the_sum_of_the_members_peaks() {
    let g = Group::new("group-peak");
    let members = g.spikes_in_turn(4, &[]);
    let group = g.read();
    touch(&g.file("end"));
    for m in members {
        finish(m);
    }
    let peak_sum: u64 = g.reports().values().map(|r| r.devices[0].peak).sum();
    assert_eq!(peak_sum, 4 * 700 * MIB);
    assert_eq!(n(&group, "peak"), 4 * 100 * MIB + 600 * MIB, "{group}");
    assert_eq!(n(&group, "used"), 4 * 100 * MIB, "{group}");
}

#[test]
fn a_group_ceiling_refuses_whichever_member_crosses_it_and_the_report_names_the_others() {
    let g = Group::new("group-ceiling");
    let limit = [
        ("GPUMEMHOOK_GROUP_LIMIT", "1GiB".to_string()),
        (
            "GPUMEMHOOK_OOM_REPORT",
            g.file("oom.%p.json").display().to_string(),
        ),
    ];
    let a = g.member(
        &[
            format!("rt.malloc:a:{}", 600 * MIB),
            format!("touch:{}", g.file("a").display()),
            format!("wait:{}", g.file("b").display()),
            // Over the group's ceiling though alone it holds 600 MiB.
            format!("rt.malloc:c:{}=2", 200 * MIB),
            format!("drv.alloc:c:{}=2", 200 * MIB),
            format!("rt.malloc:c:{}", 124 * MIB),
            "print.used:0".to_string(),
            format!("touch:{}", g.file("a.done").display()),
            format!("wait:{}", g.file("end").display()),
        ],
        &limit,
    );
    wait_for(&g.file("a"));
    let b = g.member(
        &[
            format!("rt.malloc:b:{}", 300 * MIB),
            format!("rt.malloc:c:{}=2", 200 * MIB),
            format!("touch:{}", g.file("b").display()),
            format!("wait:{}", g.file("end").display()),
        ],
        &limit,
    );
    let b_pid = b.id();
    let a_pid = a.id();
    wait_for(&g.file("a.done"));
    let group = g.read();
    touch(&g.file("end"));
    let a_out = finish(a);
    finish(b);
    assert!(a_out.contains(&format!("bytes={}", 724 * MIB)), "{a_out}");
    assert_eq!(n(&group, "used"), 1024 * MIB, "{group}");
    assert_eq!(n(&group, "limit"), 1024 * MIB, "{group}");
    assert_eq!(n(&group, "refusals"), 3, "{group}");
    let oom_of = |pid: u32| -> serde_json::Value {
        let text = std::fs::read_to_string(g.file(&format!("oom.{pid}.json"))).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["oom"].clone()
    };
    let b_oom = oom_of(b_pid);
    assert_eq!(b_oom["reason"], "ceiling", "{b_oom}");
    assert_eq!(n(&b_oom["group"], "used"), 900 * MIB, "{b_oom}");
    assert_eq!(
        b_oom["group"]["others"],
        serde_json::json!([{"pid": a_pid, "bytes": 600 * MIB}]),
        "{b_oom}"
    );
    let a_oom = oom_of(a_pid);
    assert_eq!(
        a_oom["group"]["others"],
        serde_json::json!([{"pid": b_pid, "bytes": 300 * MIB}]),
        "{a_oom}"
    );
    // The refusals are the process's too, as under its own ceiling.
    let reports = g.reports();
    assert_eq!(reports[&a_pid].devices[0].denied, 2);
    assert_eq!(reports[&b_pid].devices[0].denied, 1);
}

#[test]
fn a_member_killed_holding_memory_gives_it_back_once_whoever_finds_it() {
    let g = Group::new("group-death");
    let holder = g.member(
        &[
            format!("rt.malloc:b:{}", 100 * MIB),
            format!("touch:{}", g.file("b").display()),
            format!("wait:{}", g.file("end").display()),
        ],
        &[],
    );
    let mut victim = g.member(
        &[
            format!("rt.malloc:a:{}", 300 * MIB),
            format!("touch:{}", g.file("a").display()),
            "sleep:60000".to_string(),
        ],
        &[],
    );
    wait_for(&g.file("a"));
    wait_for(&g.file("b"));
    assert_eq!(n(&g.read(), "used"), 400 * MIB);
    victim.kill().unwrap();
    victim.wait().unwrap();
    // Eight readers race to find the dead member: each sees its bytes gone, exactly once.
    let readers: Vec<_> = (0..8)
        .map(|_| {
            cli(&g.dir, &["group", g.name, "--json"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for r in readers {
        let out = r.wait_with_output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(n(&v["devices"][0], "used"), 100 * MIB, "{v}");
    }
    let group = g.read();
    assert_eq!(n(&group, "used"), 100 * MIB, "{group}");
    assert_eq!(group["members"].as_array().unwrap().len(), 1, "{group}");
    touch(&g.file("end"));
    finish(holder);
}

#[test]
fn members_under_one_emulated_card_see_each_others_use() {
    const CONTEXT: u64 = 50 * MIB;
    let g = Group::new("group-card");
    let card = [
        ("GPUMEMHOOK_EMULATE", "1GiB".to_string()),
        ("FAKECUDA_CONTEXT_BYTES", CONTEXT.to_string()),
    ];
    let a = g.member(
        &[
            format!("rt.malloc:a:{}", 300 * MIB),
            format!("touch:{}", g.file("a").display()),
            format!("wait:{}", g.file("b").display()),
            "rt.meminfo".to_string(),
            format!("touch:{}", g.file("a.done").display()),
        ],
        &card,
    );
    wait_for(&g.file("a"));
    let b = g.member(
        &[
            format!("rt.malloc:b:{}", 200 * MIB),
            "rt.meminfo".to_string(),
            // The card has 1 GiB less two contexts and 500 MiB: 424 MiB left, not 774.
            format!("rt.malloc:c:{}=2", 425 * MIB),
            format!("touch:{}", g.file("b").display()),
            format!("wait:{}", g.file("a.done").display()),
        ],
        &card,
    );
    let a_out = finish(a);
    let b_out = finish(b);
    let free = 1024 * MIB - 2 * CONTEXT - 500 * MIB;
    let line = format!("rt.meminfo free={free} total={}", 1024 * MIB);
    assert!(b_out.contains(&line), "{b_out}");
    assert!(a_out.contains(&line), "{a_out}");
}

/// A member that cannot join says why in one line and runs on, counting alone (its allocation
/// succeeds); a reader refuses too.
fn refused_everywhere(g: &Group, why: &str) {
    let member = g.member(&[format!("rt.malloc:a:{MIB}")], &[]);
    let out = member.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(&format!("cannot join group {}", g.name)))
        .collect();
    assert!(
        said.len() == 1 && said[0].contains(why) && said[0].contains("counts alone"),
        "{err}"
    );
    let read = cli(&g.dir, &["group", g.name]).output().unwrap();
    let err = String::from_utf8_lossy(&read.stderr);
    assert!(!read.status.success() && err.contains(why), "{err}");
}

#[test]
fn planted_and_forged_group_segments_are_refused_and_never_written() {
    let g = Group::new("group-planted");
    let uid = gpumemhook_reader::current_uid();
    let path = gpumemhook_reader::group_path(&g.dir.join("shm"), uid, g.name);
    let fifo = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; mkfifo creates a FIFO there.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    refused_everywhere(&g, "FIFO");
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(g.file("elsewhere"), &path).unwrap();
    refused_everywhere(&g, "symbolic link");
    std::fs::remove_file(&path).unwrap();

    // A real group's bytes, then forged: another mode, another owner, another magic.
    let real = g.member(
        &[
            format!("rt.malloc:a:{MIB}"),
            format!("touch:{}", g.file("a").display()),
        ],
        &[],
    );
    finish(real);
    let bytes = std::fs::read(&path).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused_everywhere(&g, "mode is 0644");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut wrong = bytes.clone();
    wrong[0] ^= 1;
    std::fs::write(&path, &wrong).unwrap();
    refused_everywhere(&g, "not a gpumemhook segment");
    std::fs::write(&path, &bytes[..4096]).unwrap();
    refused_everywhere(&g, "4096");
    std::fs::write(&path, &bytes).unwrap();
    if uid == 0 {
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        refused_everywhere(&g, "owned by uid 65534");
    } else {
        eprintln!("skipping the foreign-owned group file: chown to another user needs root");
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nobody wrote into it");
}

#[test]
fn ls_by_job_ls_group_and_the_exporter_show_the_groups_joint_peak() {
    let g = Group::new("group-ls");
    let job = [("GPUMEMHOOK_JOB", "train".to_string())];
    let members = g.spikes_in_turn(2, &job);
    let ls = cli(&g.dir, &["ls", "--by-job", "--json"]).output().unwrap();
    let table = cli(&g.dir, &["ls", "--by-job"]).output().unwrap();
    // `--group NAME` means a group, as in `run`: its processes, each shown with its group beside
    // its job; another name lists none of them.
    let mine = cli(&g.dir, &["ls", "--group", g.name]).output().unwrap();
    let other = cli(&g.dir, &["ls", "--group", "nobody-here"])
        .output()
        .unwrap();
    let metrics = cli(&g.dir, &["exporter", "--once"]).output().unwrap();
    touch(&g.file("end"));
    for m in members {
        finish(m);
    }
    let mine = String::from_utf8_lossy(&mine.stdout);
    let cell = format!("[train group:{}]", g.name);
    assert_eq!(mine.matches(&cell).count(), 2, "{mine}");
    assert!(!String::from_utf8_lossy(&other.stdout).contains(&cell));
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let row = &rows[0];
    assert_eq!(row["group"], g.name, "{rows}");
    assert_eq!(n(row, "peak"), 800 * MIB, "{rows}");
    assert_eq!(n(row, "peak_sum"), 1400 * MIB, "{rows}");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("PEAK ") && !table.contains("PEAK SUM") && table.contains("800.0 MiB"),
        "{table}"
    );
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    let labels = format!("{{group=\"{}\",device=\"0\",user=", g.name);
    for (name, value) in [
        ("gpumemhook_group_used_bytes", 200 * MIB),
        ("gpumemhook_group_peak_bytes", 800 * MIB),
    ] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{labels}")))
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"));
        assert!(
            line.contains("job_id=\"train\"") && line.ends_with(&format!(" {value}")),
            "{line}"
        );
    }
    assert!(
        !metrics.contains("gpumemhook_group_limit_bytes{"),
        "{metrics}"
    );
}

impl Group {
    /// Runs `gpumemhook ARGS` over the group's directory; its stdout, or its stderr on failure.
    fn gpumemhook(&self, args: &[&str]) -> Result<String, String> {
        let out = cli(&self.dir, args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// `gpumemhook group NAME scope ARGS`, which must succeed.
    fn scope(&self, args: &[&str]) -> String {
        let mut all = vec!["group", self.name, "scope"];
        all.extend_from_slice(args);
        self.gpumemhook(&all)
            .unwrap_or_else(|e| panic!("{all:?}: {e}"))
    }

    /// A scope's reading, as `scope read|close ID --json` gives it.
    fn scope_json(&self, verb: &str, id: &str) -> serde_json::Value {
        serde_json::from_str(&self.scope(&[verb, id, "--json"])).expect("JSON")
    }
}

#[test]
fn a_group_scope_opened_from_the_cli_measures_the_groups_peak_above_its_start() {
    let g = Group::new("group-scope");
    let (x_a, x_b, spike, kept) = (100 * MIB, 50 * MIB, 600 * MIB, 200 * MIB);
    let a = g.member(
        &[
            format!("rt.malloc:x:{x_a}"),
            format!("touch:{}", g.file("a.ready").display()),
            format!("wait:{}", g.file("a.go").display()),
            format!("rt.malloc:spike:{spike}"),
            "rt.free:spike".to_string(),
            format!("touch:{}", g.file("a.done").display()),
            format!("wait:{}", g.file("end").display()),
        ],
        &[],
    );
    let b = g.member(
        &[
            format!("rt.malloc:x:{x_b}"),
            format!("touch:{}", g.file("b.ready").display()),
            format!("wait:{}", g.file("b.go").display()),
            format!("rt.malloc:kept:{kept}"),
            format!("touch:{}", g.file("b.done").display()),
            format!("wait:{}", g.file("end").display()),
        ],
        &[],
    );
    wait_for(&g.file("a.ready"));
    wait_for(&g.file("b.ready"));
    // Two scopes opened by short-lived CLI processes, while the members hold X.
    let whole = g.scope(&["open", "whole"]).trim().to_string();
    let restarted = g
        .scope(&["open", "restarted", "--device", "0"])
        .trim()
        .to_string();
    assert_ne!(whole, restarted);
    let start = g.scope_json("read", &whole);
    assert_eq!(n(&start, "base"), x_a + x_b, "{start}");
    assert_eq!(n(&start, "delta_peak"), 0, "{start}");
    // A spikes by S and frees it; then one scope restarts; then B allocates T and keeps it.
    touch(&g.file("a.go"));
    wait_for(&g.file("a.done"));
    let listed = g.gpumemhook(&["group", g.name]).unwrap();
    assert!(
        listed.contains("whole") && listed.contains("600.0 MiB"),
        "{listed}"
    );
    g.scope(&["reset", &restarted]);
    touch(&g.file("b.go"));
    wait_for(&g.file("b.done"));
    let during = g.scope_json("read", &restarted);
    let whole_end = g.scope_json("close", &whole);
    let restarted_end = g.scope_json("close", &restarted);
    touch(&g.file("end"));
    finish(a);
    finish(b);
    assert_eq!(n(&whole_end, "base"), x_a + x_b, "{whole_end}");
    assert_eq!(n(&whole_end, "delta_peak"), spike.max(kept), "{whole_end}");
    assert_eq!(
        whole_end["delta_used"].as_i64(),
        Some(kept as i64),
        "{whole_end}"
    );
    assert_eq!(whole_end["label"], "whole", "{whole_end}");
    // The reset restarted the peak after the spike: only T is above its start.
    assert_eq!(n(&during, "base"), x_a + x_b, "{during}");
    assert_eq!(n(&restarted_end, "delta_peak"), kept, "{restarted_end}");
    assert_eq!(restarted_end["delta_used"].as_i64(), Some(kept as i64));
    // Closed: gone from the group's listing, and a second close says so.
    let closed = g.gpumemhook(&["group", g.name, "scope", "close", &whole]);
    assert!(
        closed.as_ref().is_err_and(|e| e.contains("no open scope")),
        "{closed:?}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&g.gpumemhook(&["group", g.name, "--json"]).unwrap()).unwrap();
    assert_eq!(listed["scopes"], serde_json::json!([]), "{listed}");
}

#[test]
fn a_seventeenth_group_scope_is_refused_naming_the_open_ones() {
    let g = Group::new("group-scope-full");
    let member = g.member(
        &[
            format!("rt.malloc:x:{}", MIB),
            format!("touch:{}", g.file("ready").display()),
            format!("wait:{}", g.file("end").display()),
        ],
        &[],
    );
    wait_for(&g.file("ready"));
    let ids: Vec<String> = (0..16)
        .map(|i| g.scope(&["open", &format!("s{i}")]).trim().to_string())
        .collect();
    let refused = g.gpumemhook(&["group", g.name, "scope", "open", "one-more"]);
    let closed = g.scope(&["close", &ids[3]]);
    let reopened = g.gpumemhook(&["group", g.name, "scope", "open", "one-more"]);
    touch(&g.file("end"));
    finish(member);
    let refused = refused.expect_err("the 17th open is refused");
    assert!(refused.contains("all 16 scope slots"), "{refused}");
    for (i, id) in ids.iter().enumerate() {
        assert!(refused.contains(&format!("{id} \"s{i}\"")), "{refused}");
    }
    assert!(closed.contains("closed"), "{closed}");
    assert!(
        reopened.is_ok(),
        "a closed slot is free again: {reopened:?}"
    );
}

#[test]
fn top_shows_each_groups_members_used_and_exact_joint_peak() {
    let g = Group::new("group-top");
    let members = g.spikes_in_turn(2, &[]);
    let frame = g.gpumemhook(&["top", "--once"]);
    touch(&g.file("end"));
    for m in members {
        finish(m);
    }
    let frame = frame.unwrap();
    let header = frame
        .lines()
        .position(|l| {
            l.split_whitespace()
                .eq(["GROUP", "DEV", "MEMBERS", "USED", "PEAK", "LIMIT"])
        })
        .unwrap_or_else(|| panic!("no group header in:\n{frame}"));
    let row: Vec<&str> = frame
        .lines()
        .nth(header + 1)
        .unwrap()
        .split_whitespace()
        .collect();
    // The joint peak (both bases and one spike), not the sum of the members' peaks (1.37 GiB).
    assert_eq!(
        row,
        ["group-top", "0", "2", "200.0", "MiB", "800.0", "MiB", "-"],
        "{frame}"
    );
}

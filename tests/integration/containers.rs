//! Containers (issue 51): processes in a pid namespace of their own, as in a pod without `hostPID`
//! (`gpumemhook_tests::POD`), sharing the node's segment directory. The node never removes what a
//! pod's live process holds and sees it by its node pid and its pod; two pods whose processes have
//! the same pid keep two segments; a reader in a pod leaves the node's live segments alone and
//! lists its own pod's processes by the pids it sees; a pod's process that ended is swept as any;
//! `top` in a pod shows NVML's processes by the node's pids, never matched to the pod's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use crate::exporter::{parse_samples, value};
use crate::groups::{finish, Group, MIB};
use gpumemhook_tests::{cli, pods_supported, scratch, wait_for, wrapped, Run, POD};

/// A simulated program in a pod of its own, held after its operations until [`Pod::finish`].
struct Pod {
    /// `unshare`, whose one child is the program (pid 1 in the pod).
    child: Child,
    go: PathBuf,
}

impl Pod {
    /// Runs `ops` in a fresh pod with `env`, segments in `dir/shm`; back once they are done.
    fn start(dir: &Path, name: &str, ops: &[String], env: &[(&str, &str)]) -> Pod {
        let (ready, go) = (
            dir.join(format!("{name}.ready")),
            dir.join(format!("{name}.go")),
        );
        let mut run = Run::sim("simrun", &["drv.init", "drv.ctx:0"]).in_pod();
        for op in ops {
            run = run.arg(op);
        }
        run = run
            .arg(format!("touch:{}", ready.display()))
            .arg(format!("wait:{}", go.display()))
            .env("GPUMEMHOOK_SHM_DIR", dir.join("shm"));
        for (key, value) in env {
            run = run.env(key, value);
        }
        let (mut command, _) = run.into_command();
        let child = command.spawn().expect("unshare starts");
        wait_for(&ready);
        Pod { child, go }
    }

    /// The program's pid on the node.
    fn node_pid(&self) -> u32 {
        let children = gpumemhook_reader::children_of(self.child.id());
        assert_eq!(children.len(), 1, "{children:?}");
        children[0]
    }

    /// `gpumemhook ARGS` run inside the pod (its pid namespace and its `/proc`).
    fn gpumemhook(&self, dir: &Path, args: &[&str]) -> Output {
        self.run_inside(&cli(dir, args))
    }

    /// `command` run inside the pod, with its environment.
    fn run_inside(&self, command: &Command) -> Output {
        let pid = self.node_pid().to_string();
        let enter = ["nsenter", "--target", &pid, "--pid", "--mount"].map(Into::into);
        wrapped(command, &enter).output().unwrap()
    }

    fn finish(mut self) {
        std::fs::write(&self.go, b"").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

/// A directory for one test, with its segment directory.
fn node(name: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::create_dir_all(dir.join("shm")).unwrap();
    dir
}

/// The JSON a successful `gpumemhook ... --json` printed.
fn json(out: Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `(pid, pid in its namespace, device 0's used)` of every process of an `ls --json`.
fn rows(listing: &serde_json::Value) -> Vec<(u64, Option<u64>, u64)> {
    let mut rows: Vec<_> = listing
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| {
            let used = s["devices"][0]["used"].as_u64().unwrap_or(0);
            (
                s["pid"].as_u64().unwrap(),
                s["pid_in_namespace"].as_u64(),
                used,
            )
        })
        .collect();
    rows.sort_unstable();
    rows
}

fn segments(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("shm"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

#[test]
fn the_node_keeps_a_live_pods_segment_and_shows_it_by_its_node_pid_and_pod() {
    if !pods_supported() {
        return;
    }
    let dir = node("pod-seen");
    let labels = [("POD_NAME", "trainer-0"), ("POD_NAMESPACE", "ml")];
    let pod = Pod::start(&dir, "a", &[format!("rt.malloc:a:{}", 42 * MIB)], &labels);
    let node_pid = u64::from(pod.node_pid());
    let expected = vec![(node_pid, Some(1), 42 * MIB)];
    for round in ["first", "second"] {
        let listing = json(cli(&dir, &["ls", "--json"]).output().unwrap());
        assert_eq!(rows(&listing), expected, "{round} ls: {listing}");
    }
    assert_eq!(segments(&dir).len(), 1, "{:?}", segments(&dir));
    let by_pid = cli(&dir, &["ls", &node_pid.to_string(), "--json"]).output();
    assert_eq!(rows(&json(by_pid.unwrap())), expected, "ls PID");
    let jobs = json(cli(&dir, &["ls", "--by-job", "--json"]).output().unwrap());
    assert_eq!(jobs[0]["job"], "pod:ml/trainer-0", "{jobs}");
    assert_eq!(jobs[0]["pids"], serde_json::json!([node_pid]), "{jobs}");
    let scrape = cli(&dir, &["exporter", "--once"]).output().unwrap();
    let samples = parse_samples(&String::from_utf8_lossy(&scrape.stdout));
    let used = value(&samples, "gpumemhook_used_bytes", node_pid as u32, 0);
    assert_eq!(used, Some((42 * MIB).to_string()), "{samples:?}");
    let inside = json(pod.gpumemhook(&dir, &["ls", "--json"]));
    assert_eq!(rows(&inside), vec![(1, None, 42 * MIB)], "{inside}");
    pod.finish();
    assert_eq!(segments(&dir), Vec::<String>::new());
}

#[test]
fn a_pod_process_killed_is_swept_by_the_next_reader() {
    if !pods_supported() {
        return;
    }
    let dir = node("pod-killed");
    let mut pod = Pod::start(&dir, "k", &[format!("rt.malloc:a:{}", 5 * MIB)], &[]);
    assert_eq!(segments(&dir).len(), 1);
    let program = pod.node_pid() as i32;
    // SAFETY: kill sends a signal to the pod's program, which this test started.
    let killed = unsafe { libc::kill(program, libc::SIGKILL) };
    assert_eq!(killed, 0);
    pod.child.wait().unwrap();
    let listing = json(cli(&dir, &["ls", "--json"]).output().unwrap());
    assert_eq!(rows(&listing), vec![], "{listing}");
    assert_eq!(segments(&dir), Vec::<String>::new(), "swept");
}

#[test]
fn two_pods_whose_processes_have_the_same_pid_keep_two_segments() {
    if !pods_supported() {
        return;
    }
    let dir = node("pod-twins");
    let a = Pod::start(&dir, "a", &[format!("rt.malloc:a:{}", 10 * MIB)], &[]);
    let b = Pod::start(&dir, "b", &[format!("rt.malloc:b:{}", 20 * MIB)], &[]);
    assert_eq!(segments(&dir).len(), 2, "{:?}", segments(&dir));
    let listing = json(cli(&dir, &["ls", "--json"]).output().unwrap());
    let mut expected = vec![
        (u64::from(a.node_pid()), Some(1), 10 * MIB),
        (u64::from(b.node_pid()), Some(1), 20 * MIB),
    ];
    expected.sort_unstable();
    assert_eq!(rows(&listing), expected, "{listing}");
    for (pod, used) in [(&a, 10 * MIB), (&b, 20 * MIB)] {
        let inside = json(pod.gpumemhook(&dir, &["ls", "--json"]));
        assert_eq!(rows(&inside), vec![(1, None, used)], "{inside}");
    }
    a.finish();
    b.finish();
}

#[test]
fn readers_in_a_pod_leave_the_nodes_live_segments_alone() {
    if !pods_supported() {
        return;
    }
    let dir = node("pod-reader");
    let (ready, go) = (dir.join("ready"), dir.join("go"));
    let ops = [
        "drv.init".to_string(),
        format!("rt.malloc:a:{}", 30 * MIB),
        format!("touch:{}", ready.display()),
        format!("wait:{}", go.display()),
    ];
    let (mut command, _) = Run::sim("simrun", &[])
        .env("GPUMEMHOOK_SHM_DIR", dir.join("shm"))
        .into_command();
    let mut held = command.args(&ops).spawn().unwrap();
    wait_for(&ready);
    let before = segments(&dir);
    let pod = POD.map(Into::into);
    for args in [
        &["ls", "--all"][..],
        &["top", "--once"],
        &["exporter", "--once"],
    ] {
        let out = wrapped(&cli(&dir, args), &pod).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert_eq!(segments(&dir), before, "after {args:?} in a pod");
    }
    let inside = json(
        wrapped(&cli(&dir, &["ls", "--json"]), &pod)
            .output()
            .unwrap(),
    );
    assert_eq!(
        rows(&inside),
        vec![],
        "the node's process is not the pod's: {inside}"
    );
    let listing = json(cli(&dir, &["ls", "--json"]).output().unwrap());
    assert_eq!(rows(&listing), vec![(u64::from(held.id()), None, 30 * MIB)]);
    std::fs::write(&go, b"").unwrap();
    assert!(held.wait().unwrap().success());
}

#[test]
fn a_group_with_a_member_on_the_node_and_one_in_a_pod_keeps_its_ceiling() {
    if !pods_supported() {
        return;
    }
    let g = Group::new("pod-group");
    let limit = [("GPUMEMHOOK_GROUP_LIMIT", "1GiB".to_string())];
    let on_node = g.member(
        &[
            format!("rt.malloc:a:{}", 600 * MIB),
            g.op("touch", "a"),
            g.op("wait", "b"),
            // Over the group's ceiling with the pod's member's 300 MiB, under it alone.
            format!("rt.malloc:c:{}=2", 200 * MIB),
            g.op("touch", "a.done"),
            g.op("wait", "end"),
        ],
        &limit,
    );
    g.wait("a");
    let in_pod = g.member_from(
        Run::sim("simrun", &[]).in_pod(),
        &[
            format!("rt.malloc:b:{}", 300 * MIB),
            g.op("touch", "b"),
            g.op("wait", "end"),
        ],
        &limit,
    );
    g.wait("a.done");
    let mut expected = vec![
        u64::from(on_node.id()),
        u64::from(gpumemhook_reader::children_of(in_pod.id())[0]),
    ];
    expected.sort_unstable();
    let ls = cli(&g.dir, &["ls"]).output().unwrap();
    assert!(ls.status.success());
    let group = g.read();
    let members: Vec<u64> = group["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_u64().unwrap())
        .collect();
    g.touch("end");
    finish(on_node);
    finish(in_pod);
    assert_eq!(group["used"], 900 * MIB, "{group}");
    assert_eq!(group["refusals"], 1, "{group}");
    let mut members = members;
    members.sort_unstable();
    assert_eq!(members, expected, "{group}");
}

/// A cgroup named as the kubelet names a pod's (`kubepods/burstable/pod<uid>`, the cgroupfs
/// driver), in the first hierarchy mounted here that lets root make one; removed when dropped.
struct PodCgroup {
    dir: PathBuf,
    uid: String,
}

impl PodCgroup {
    fn new() -> Option<PodCgroup> {
        let uid = format!("{:08x}-0000-4000-8000-000000000051", std::process::id());
        [
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
        ]
        .iter()
        .map(|root| Path::new(root).join(format!("kubepods/burstable/pod{uid}")))
        .find(|dir| std::fs::create_dir_all(dir).is_ok() && dir.join("cgroup.procs").exists())
        .map(|dir| PodCgroup { dir, uid })
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        // The pod's program has ended: the cgroups are empty, leaf first.
        for dir in self.dir.ancestors().take(3) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[test]
fn the_node_names_a_pod_by_its_cgroup_where_no_label_does() {
    if !pods_supported() {
        return;
    }
    let Some(cgroup) = PodCgroup::new() else {
        eprintln!("skipping: no cgroup hierarchy here lets root make one");
        return;
    };
    let dir = node("pod-cgroup");
    let pod = Pod::start(&dir, "c", &[format!("rt.malloc:a:{}", 7 * MIB)], &[]);
    let node_pid = pod.node_pid();
    cgroup.enter(node_pid);
    let job = format!("pod:{}", cgroup.uid);
    let jobs = json(cli(&dir, &["ls", "--by-job", "--json"]).output().unwrap());
    assert_eq!(jobs[0]["job"], job.as_str(), "{jobs}");
    assert_eq!(jobs[0]["pids"], serde_json::json!([node_pid]), "{jobs}");
    let scrape = cli(&dir, &["exporter", "--once"]).output().unwrap();
    let samples = parse_samples(&String::from_utf8_lossy(&scrape.stdout));
    let used = samples
        .iter()
        .find(|s| s.name == "gpumemhook_used_bytes" && s.labels["pid"] == node_pid.to_string())
        .unwrap_or_else(|| panic!("{samples:?}"));
    assert_eq!(used.labels["job_id"], job, "{used:?}");
    assert_eq!(used.labels["pod_uid"], cgroup.uid, "{used:?}");
    assert_eq!(used.labels["pid_in_namespace"], "1", "{used:?}");
    assert_eq!(used.value, (7 * MIB).to_string());
    pod.finish();
}

/// NVML gives the node's pids, also to a reader in a pod: `top` there shows them as node pids and
/// never takes one for the pod's process of the same number (the pod's program is pid 1 in the pod,
/// and NVML lists a pid 1 that is the node's init). On the node, NVML's pid of the pod's process is
/// its node pid, matched to the hooked row.
#[test]
fn top_in_a_pod_shows_nvmls_pids_as_the_nodes_never_as_the_pods() {
    if !pods_supported() {
        return;
    }
    let dir = node("pod-top-nvml");
    let pod = Pod::start(&dir, "top", &["rt.malloc:a:3145728".into()], &[]);
    let inside =
        pod.run_inside(cli(&dir, &["top", "--once"]).env("FAKENVML_PROCESSES", "1:3145728"));
    let out = String::from_utf8_lossy(&inside.stdout).into_owned();
    assert!(inside.status.success(), "{out}");
    let nvml_rows: Vec<&str> = out.lines().filter(|l| l.contains("node pid")).collect();
    assert_eq!(nvml_rows.len(), 2, "one per device: {out}");
    for row in nvml_rows {
        assert!(row.trim_start().starts_with("node pid 1 "), "{row}");
        assert!(
            row.contains("3.00 MiB") && !row.contains("(not hooked)"),
            "{row}"
        );
    }
    let node_pid = pod.node_pid();
    let on_node = cli(&dir, &["top", "--once"])
        .env("FAKENVML_PROCESSES", format!("{node_pid}:3145728"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&on_node.stdout).into_owned();
    assert!(out.contains(&node_pid.to_string()), "{out}");
    assert!(
        !out.contains("node pid") && !out.contains("not hooked"),
        "{out}"
    );
    pod.finish();
}

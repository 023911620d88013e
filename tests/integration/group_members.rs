//! Who is a member of a group (`docs/groups.md`, "Joining"): a forked child joins as a member of
//! its own, an `exec`ed image joins again and the old image's slot is given back, and every
//! member's NVML view of an emulated group card is the card less the whole group's use. Every
//! member is a real `simrun` process under the hook; the group is read through
//! `gpumemhook group NAME --json`, a real reader process that sweeps out dead members first.

use std::collections::BTreeMap;

use crate::groups::{finish, Group, MIB};
use gpumemhook_tests::{hook_lib, sim_dir};

impl Group {
    /// The group's figures on device 0.
    fn figures(&self) -> Figures {
        Figures(self.read())
    }
}

/// One device's figures of a group.
struct Figures(serde_json::Value);

impl Figures {
    fn n(&self, key: &str) -> u64 {
        self.0[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no {key} in {}", self.0))
    }

    /// The live members: pid -> bytes held.
    fn members(&self) -> BTreeMap<u32, u64> {
        self.0["members"]
            .as_array()
            .unwrap_or_else(|| panic!("no members in {}", self.0))
            .iter()
            .map(|m| {
                (
                    m["pid"].as_u64().unwrap() as u32,
                    m["bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Sends SIGKILL to a process when dropped.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: signals a process this test started (an orphaned child of one of its members).
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
    }
}

#[test]
fn a_forked_child_is_a_member_of_its_own_and_its_exit_or_death_leaves_the_parents_bytes() {
    let g = Group::new("members-fork");
    // The stand-in driver lets the children allocate (a real one wants its own initialisation in a
    // forked child): this checks the group's bookkeeping across fork.
    let parent = g.member(
        &[
            format!("rt.malloc:a:{}", 100 * MIB),
            g.op("touch", "parent"),
            g.op("wait", "fork"),
            "fork".into(),
            // The parent's block, freed in the child, is not the child's to give back.
            "rt.free:a".into(),
            format!("rt.malloc:b:{}", 200 * MIB),
            g.op("touch", "child1"),
            g.op("wait", "exit1"),
            // The child exits holding b.
            "endfork".into(),
            g.op("touch", "after1"),
            g.op("wait", "fork2"),
            "fork.sigkill".into(),
            format!("rt.malloc:c:{}", 300 * MIB),
            g.op("touch", "child2"),
            "sleep:120000".into(),
            "endfork".into(),
            g.op("touch", "after2"),
            g.op("wait", "end"),
            "rt.free:a".into(),
        ],
        &[("FAKECUDA_FORK_OK", "1".into())],
    );
    let parent_pid = parent.id();
    g.wait("parent");
    let alone = g.figures();
    assert_eq!(alone.members(), BTreeMap::from([(parent_pid, 100 * MIB)]));

    g.touch("fork");
    g.wait("child1");
    let with_child = g.figures();
    let members = with_child.members();
    assert_eq!(
        members.len(),
        2,
        "the child is a member of its own: {with_child}"
    );
    assert_eq!(members[&parent_pid], 100 * MIB, "{with_child}");
    let (&child, &child_bytes) = members.iter().find(|(&p, _)| p != parent_pid).unwrap();
    assert_eq!(child_bytes, 200 * MIB, "{with_child}");
    assert_eq!(with_child.n("used"), 300 * MIB, "{with_child}");

    g.touch("exit1");
    g.wait("after1");
    let after_exit = g.figures();
    assert_eq!(
        after_exit.members(),
        BTreeMap::from([(parent_pid, 100 * MIB)]),
        "child {child} exited: {after_exit}"
    );
    assert_eq!(after_exit.n("used"), 100 * MIB, "{after_exit}");

    g.touch("fork2");
    g.wait("child2");
    let with_second = g.figures();
    let members = with_second.members();
    assert_eq!(members.len(), 2, "{with_second}");
    let (&second, _) = members.iter().find(|(&p, _)| p != parent_pid).unwrap();
    assert_eq!(
        members,
        BTreeMap::from([(parent_pid, 100 * MIB), (second, 300 * MIB)])
    );
    assert_eq!(with_second.n("used"), 400 * MIB, "{with_second}");
    // SAFETY: sends SIGKILL to the parent's forked child, whose pid the group just listed.
    let killed = unsafe { libc::kill(second as libc::pid_t, libc::SIGKILL) };
    assert_eq!(killed, 0);
    g.wait("after2");
    let after_kill = g.figures();
    assert_eq!(
        after_kill.members(),
        BTreeMap::from([(parent_pid, 100 * MIB)]),
        "{after_kill}"
    );
    assert_eq!(after_kill.n("used"), 100 * MIB, "{after_kill}");

    g.touch("end");
    let out = finish(parent);
    assert!(out.contains("forked child killed"), "{out}");
    let last = g.figures();
    assert_eq!(last.n("used"), 0, "{last}");
    assert!(last.members().is_empty(), "{last}");
    // Three allocations, one in each image; one counted free, the parent's own (the child's free
    // of the parent's block was not its to count).
    assert_eq!((last.n("allocs"), last.n("frees")), (3, 1), "{last}");
}

#[test]
fn a_member_killed_while_its_forked_child_lives_gives_its_bytes_back() {
    let g = Group::new("members-orphan");
    // The child inherits the parent's mapping of the group file, which holds an open file
    // description of its own for as long as the child lives: were the parent's slot lock on that
    // description, the dead parent would look alive until the child ended.
    let mut parent = g.member(
        &[
            format!("rt.malloc:a:{}", 100 * MIB),
            "fork".into(),
            format!("rt.malloc:b:{}", 200 * MIB),
            g.op("touch", "child"),
            "sleep:120000".into(),
            "endfork".into(),
        ],
        &[("FAKECUDA_FORK_OK", "1".into())],
    );
    let parent_pid = parent.id();
    g.wait("child");
    let both = g.figures();
    let members = both.members();
    assert_eq!(members.len(), 2, "{both}");
    let (&child, _) = members.iter().find(|(&p, _)| p != parent_pid).unwrap();
    // An orphan the test cannot wait for: killed however the test ends.
    let _orphan = KillOnDrop(child);
    assert_eq!(
        members,
        BTreeMap::from([(parent_pid, 100 * MIB), (child, 200 * MIB)])
    );
    parent.kill().unwrap();
    parent.wait().unwrap();
    let orphan = g.figures();
    assert_eq!(
        orphan.members(),
        BTreeMap::from([(child, 200 * MIB)]),
        "the killed parent's slot is given back while its child lives: {orphan}"
    );
    assert_eq!(orphan.n("used"), 200 * MIB, "{orphan}");
    // SAFETY: sends SIGKILL to the orphaned child, whose pid the group just listed.
    let killed = unsafe { libc::kill(child as libc::pid_t, libc::SIGKILL) };
    assert_eq!(killed, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let last = loop {
        let last = g.figures();
        if last.members().is_empty() || std::time::Instant::now() > deadline {
            break last;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(last.members().is_empty(), "{last}");
    assert_eq!(last.n("used"), 0, "{last}");
}

#[test]
fn an_exec_keeps_the_membership_and_gives_back_the_old_images_slot() {
    let g = Group::new("members-exec");
    // The new image: simrun under the hook again (exec.unhooked drops LD_PRELOAD; the script
    // puts it back), with GPUMEMHOOK_GROUP inherited through the environment.
    let second = g.file("second.sh");
    std::fs::write(
        &second,
        format!(
            "#!/bin/sh\nLD_PRELOAD='{}' exec '{}' rt.malloc:b:{} '{}' '{}'\n",
            hook_lib().display(),
            sim_dir().join("simrun").display(),
            50 * MIB,
            g.op("touch", "second"),
            g.op("wait", "end"),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&second, std::fs::Permissions::from_mode(0o755)).unwrap();
    let member = g.member(
        &[
            format!("rt.malloc:a:{}", 100 * MIB),
            g.op("touch", "first"),
            g.op("wait", "go"),
            format!("exec.unhooked:{}", second.display()),
        ],
        &[],
    );
    let pid = member.id();
    g.wait("first");
    let first = g.figures();
    assert_eq!(
        first.members(),
        BTreeMap::from([(pid, 100 * MIB)]),
        "{first}"
    );
    assert_eq!(first.n("used"), 100 * MIB, "{first}");

    g.touch("go");
    g.wait("second");
    // The same pid and start time in a new image: the old slot is known dead by its lock alone.
    let after = g.figures();
    assert_eq!(
        after.members(),
        BTreeMap::from([(pid, 50 * MIB)]),
        "{after}"
    );
    assert_eq!(after.n("used"), 50 * MIB, "{after}");
    assert_eq!(after.n("allocs"), 2, "{after}");
    assert_eq!(after.n("peak"), 100 * MIB, "{after}");
    g.touch("end");
    finish(member);
}

/// The `key=value` numbers of every line of `out` starting with `prefix`.
fn lines(out: &str, prefix: &str) -> Vec<BTreeMap<String, u64>> {
    out.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                .collect()
        })
        .collect()
}

#[test]
fn every_members_nvml_view_of_a_group_card_is_what_the_whole_group_leaves() {
    const CONTEXT: u64 = 50 * MIB;
    const CARD: u64 = 1024 * MIB;
    let g = Group::new("members-nvml");
    let card = [
        ("GPUMEMHOOK_EMULATE", "1GiB".to_string()),
        ("FAKECUDA_CONTEXT_BYTES", CONTEXT.to_string()),
    ];
    let views = || {
        [
            "rt.meminfo",
            "nvml.mem:0:dl",
            "nvml.mem:0:sym",
            "nvml.mem2:0:dl",
        ]
        .map(String::from)
        .to_vec()
    };
    let a = g.member(
        &[
            vec![
                format!("rt.malloc:a:{}", 300 * MIB),
                g.op("touch", "a"),
                g.op("wait", "b"),
            ],
            views(),
            vec![g.op("touch", "a.done"), g.op("wait", "end")],
        ]
        .concat(),
        &card,
    );
    g.wait("a");
    let b = g.member(
        &[
            vec![format!("rt.malloc:b:{}", 200 * MIB)],
            views(),
            vec![g.op("touch", "b"), g.op("wait", "end")],
        ]
        .concat(),
        &card,
    );
    g.wait("a.done");
    // A member that asks NVML only, before any CUDA call of its own (a monitoring thread, say).
    let watcher = g.member(
        &[
            vec!["nvml.mem:0:dl".to_string(), "nvml.mem2:0:dl".to_string()],
            vec![g.op("touch", "watcher.done"), g.op("wait", "end")],
        ]
        .concat(),
        &card,
    );
    let watcher_pid = watcher.id();
    // The others stay until the watcher has asked: their exit would give their bytes back.
    g.wait("watcher.done");
    g.touch("end");
    let free = CARD - 2 * CONTEXT - 500 * MIB;
    for (who, out) in [
        ("a", finish(a)),
        ("b", finish(b)),
        ("watcher", finish(watcher)),
    ] {
        let rt = lines(&out, "rt.meminfo");
        if who != "watcher" {
            assert_eq!(
                (rt[0]["free"], rt[0]["total"]),
                (free, CARD),
                "{who}: the CUDA view\n{out}"
            );
        }
        let mems = lines(&out, "nvml.mem ");
        assert_eq!(mems.len(), if who == "watcher" { 1 } else { 2 }, "{out}");
        for m in &mems {
            assert_eq!(
                (m["total"], m["free"], m["used"]),
                (CARD, free, CARD - free),
                "{who} (watcher {watcher_pid}): NVML shows the group's card\n{out}"
            );
        }
        let m2 = &lines(&out, "nvml.mem2")[0];
        assert_eq!(
            (m2["total"], m2["free"], m2["reserved"], m2["used"]),
            (CARD, free, 0, CARD - free),
            "{who}: NVML v2 shows the group's card\n{out}"
        );
    }
}

/// A process joins at its first call that counts, not at load: until it allocates, the group has no
/// file (nobody created it) and, beside a member, a program that never allocates takes no slot.
#[test]
fn a_process_joins_at_its_first_allocation_and_one_that_never_allocates_takes_no_slot() {
    let g = Group::new("members-lazy");
    let path =
        gpumemhook_reader::group_path(&g.dir.join("shm"), gpumemhook_reader::current_uid(), g.name);
    let idle = g.member(&[g.op("touch", "idle.ready"), g.op("wait", "end")], &[]);
    let mut busy = g.member(
        &[
            g.op("touch", "busy.ready"),
            g.op("wait", "go"),
            format!("rt.malloc:a:{}", 100 * MIB),
            g.op("touch", "allocated"),
            g.op("wait", "end"),
        ],
        &[],
    );
    g.wait("idle.ready");
    g.wait("busy.ready");
    assert!(
        !path.exists(),
        "the group was made at load: {}",
        path.display()
    );
    g.touch("go");
    g.wait("allocated");
    let figures = g.figures();
    assert_eq!(
        figures.members(),
        BTreeMap::from([(busy.id(), 100 * MIB)]),
        "only the process that allocated is a member: {figures}"
    );
    g.touch("end");
    finish(idle);
    let _ = busy.wait();
}

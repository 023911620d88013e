//! Groups tried as an adversary would (`docs/groups.md`, "Under kills, closed descriptors and
//! other users"): a member that closes its descriptors, a storm of SIGKILLs among busy members, a
//! sweeper killed mid-sweep (the crash-point tests in `reader/tests/crash_points.rs` stop it at
//! every step; here a frozen tally is planted as a killed sweeper leaves it), a member's child that
//! skips the atfork handlers, and a group whose members have all ended. Every member is a real
//! `simrun` process under the hook; the group is read by a real reader process.

use gpumemhook_reader::{open_group, open_or_create_group};
use std::time::{Duration, Instant};

use crate::groups::{finish, Group, MIB};
use gpumemhook_tests::{cli, wait_for};

fn used(v: &serde_json::Value) -> u64 {
    v["used"]
        .as_u64()
        .unwrap_or_else(|| panic!("no used in {v}"))
}

fn members(v: &serde_json::Value) -> usize {
    v["members"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_member_that_closes_every_descriptor_stays_a_member_and_listed() {
    let g = Group::new("attack-closefds");
    let daemon = g.member(
        &[
            format!("rt.malloc:a:{}", 100 * MIB),
            "closefds".to_string(),
            g.op("touch", "a"),
            g.op("wait", "a.go"),
            "rt.free:a".to_string(),
            g.op("touch", "a.freed"),
            g.op("wait", "end"),
        ],
        &[],
    );
    let other = g.member(
        &[
            format!("rt.malloc:b:{}", 50 * MIB),
            g.op("touch", "b"),
            g.op("wait", "end"),
        ],
        &[],
    );
    g.wait("a");
    g.wait("b");
    // Readers sweep before they read: the daemon, alive, keeps its slot and its bytes.
    let v = g.read();
    assert_eq!((used(&v), members(&v)), (150 * MIB, 2), "{v}");
    let ls = cli(&g.dir, &["ls", "--json"]).output().unwrap();
    let listed = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listed.contains(&format!("\"pid\":{}", daemon.id()))
            || listed.contains(&format!("\"pid\": {}", daemon.id())),
        "ls lists the daemon: {listed}"
    );
    g.touch("a.go");
    g.wait("a.freed");
    let v = g.read();
    assert_eq!(
        (used(&v), members(&v)),
        (50 * MIB, 2),
        "its free lands in its own slot: {v}"
    );
    g.touch("end");
    finish(daemon);
    finish(other);
}

#[test]
fn a_sigkill_storm_among_busy_members_leaves_exactly_what_the_survivors_hold() {
    let g = Group::new("attack-storm");
    let survivors: Vec<_> = (0..2)
        .map(|i| {
            g.member(
                &[
                    format!("threads:2:40000:{}:1048576", 7 + i),
                    "print.used:0".to_string(),
                    g.op("touch", &format!("s{i}")),
                    g.op("wait", "end"),
                ],
                &[],
            )
        })
        .collect();
    let mut victims: Vec<_> = (0..8)
        .map(|i| g.member(&[format!("threads:2:100000000:{}:1048576", 100 + i)], &[]))
        .collect();
    // Let them all get going, then kill one every 20 ms.
    std::thread::sleep(Duration::from_millis(300));
    for victim in victims.iter_mut() {
        std::thread::sleep(Duration::from_millis(20));
        victim.kill().unwrap();
        victim.wait().unwrap();
    }
    g.wait("s0");
    g.wait("s1");
    let v = g.read();
    g.touch("end");
    let held: u64 = survivors
        .into_iter()
        .map(|s| {
            let out = finish(s);
            let line = out
                .lines()
                .find_map(|l| l.strip_prefix("used dev=0 bytes="))
                .unwrap_or_else(|| panic!("no used line in {out}"));
            line.trim().parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(used(&v), held, "the group after the storm: {v}");
    assert_eq!(members(&v), 2, "{v}");
}

/// Writes a ticket into device 0's tally of the group file at `path`, as a sweeper killed between
/// its freeze and its set leaves it (the word's high half; `docs/groups.md` gives the layout).
fn freeze_as_a_killed_sweeper_would(path: &std::path::Path) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let offset = std::mem::offset_of!(gpumemhook_reader::GroupSegment, devices) as u64
        + std::mem::offset_of!(gpumemhook_reader::GroupDevice, used) as u64;
    file.write_all_at(&0xdead_u64.to_le_bytes(), offset + 8)
        .unwrap();
}

#[test]
fn a_sweeper_killed_mid_sweep_stalls_nobody_and_the_next_sweep_repairs() {
    let g = Group::new("attack-sweeper");
    let holder = g.member(
        &[
            format!("rt.malloc:b:{}", 100 * MIB),
            g.op("touch", "b"),
            g.op("wait", "b.go"),
            "rt.meminfo".to_string(),
            format!("rt.malloc:c:{}", 10 * MIB),
            g.op("touch", "b.done"),
            g.op("wait", "end"),
        ],
        &[],
    );
    let mut victim = g.member(
        &[
            format!("rt.malloc:a:{}", 300 * MIB),
            g.op("touch", "a"),
            "sleep:60000".to_string(),
        ],
        &[],
    );
    g.wait("a");
    g.wait("b");
    victim.kill().unwrap();
    victim.wait().unwrap();
    let path = g.dir.join("shm").join(format!(
        "gpumemhook-group-{}-{}",
        gpumemhook_reader::current_uid(),
        g.name
    ));
    freeze_as_a_killed_sweeper_would(&path);
    // Reads stay fast, the member's query and allocation go on, and the dead member's bytes go.
    let started = Instant::now();
    let v = g.read();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a read took {:?}",
        started.elapsed()
    );
    assert_eq!(used(&v), 100 * MIB, "{v}");
    let started = Instant::now();
    g.touch("b.go");
    g.wait("b.done");
    assert!(started.elapsed() < Duration::from_secs(2));
    let v = g.read();
    assert_eq!((used(&v), members(&v)), (110 * MIB, 1), "{v}");
    g.touch("end");
    finish(holder);
}

#[test]
fn a_members_raw_clone_child_does_not_keep_a_dead_member_alive() {
    let g = Group::new("attack-clone");
    let holder = g.member(
        &[
            format!("rt.malloc:b:{}", 100 * MIB),
            g.op("touch", "b"),
            g.op("wait", "end"),
        ],
        &[],
    );
    // The parent allocates, makes a raw child that sleeps 30 s, and exits at once.
    let parent = g.member(
        &[
            format!("rt.malloc:a:{}", 300 * MIB),
            "clone.raw:30000".to_string(),
        ],
        &[],
    );
    // Its status only: the child holds the parent's output pipes for as long as it sleeps.
    let mut parent = parent;
    assert!(parent.wait().unwrap().success());
    g.wait("b");
    let v = g.read();
    assert_eq!((used(&v), members(&v)), (100 * MIB, 1), "{v}");
    g.touch("end");
    finish(holder);
}

#[test]
fn a_new_job_in_an_ended_group_starts_afresh_without_the_old_ceiling_or_card() {
    let g = Group::new("attack-ended");
    let old = g.member(
        &[
            format!("rt.malloc:a:{}", 600 * MIB),
            "rt.free:a".to_string(),
        ],
        &[("GPUMEMHOOK_GROUP_LIMIT", "1GiB".to_string())],
    );
    finish(old);
    let v = g.read();
    assert_eq!(
        v["limit"].as_u64(),
        Some(1 << 30),
        "the old job's figures stay readable: {v}"
    );
    // A new job with no ceiling: 2 GiB is not refused by the old job's.
    let new = g.member(
        &[
            format!("rt.malloc:b:{}", 2048 * MIB),
            g.op("touch", "b"),
            g.op("wait", "end"),
        ],
        &[],
    );
    wait_for(&g.file("b"));
    let v = g.read();
    assert_eq!(v["limit"], serde_json::Value::Null, "{v}");
    assert_eq!(
        (used(&v), v["peak"].as_u64()),
        (2048 * MIB, Some(2048 * MIB)),
        "{v}"
    );
    // A group with a live member is not removed.
    let out = cli(&g.dir, &["group", g.name, "--remove"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has live members"));
    g.touch("end");
    finish(new);
    // An ended group is removed by name.
    let out = cli(&g.dir, &["group", g.name, "--remove"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!g.dir.join("shm").read_dir().unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("gpumemhook-group-")));
}

/// Another user's group file holding the worst state a reader could meet: every device's tally
/// frozen by a sweep that never ends, every slot live and unlocked with a change under way on every
/// device. Root reads it (as its exporter does, for the groups other users' processes name): the
/// read costs no wait, and root never writes a byte of it.
#[test]
fn another_users_hostile_group_file_costs_roots_reader_nothing_and_is_never_written() {
    use gpumemhook_reader::MAX_DEVICES;
    use gpumemhook_reader::{GroupDevice, GroupSegment, MemberSlot, MAX_MEMBERS};
    use std::mem::offset_of;
    use std::os::unix::fs::FileExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("needs root (to own a file as another user); CI runs as root");
        return;
    }
    const OTHER: u32 = 65534;
    let dir = gpumemhook_tests::scratch("attack-other-user");
    let mapping = open_or_create_group(&dir, OTHER, "h").unwrap();
    let path = mapping.path().to_path_buf();
    drop(mapping);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let put = |offset: usize, value: u64| {
        file.write_all_at(&value.to_le_bytes(), offset as u64)
            .unwrap()
    };
    for d in 0..MAX_DEVICES {
        let device = offset_of!(GroupSegment, devices) + d * std::mem::size_of::<GroupDevice>();
        put(device + offset_of!(GroupDevice, used), 1 << 30);
        put(device + offset_of!(GroupDevice, used) + 8, 0xbad);
    }
    for m in 0..MAX_MEMBERS {
        let slot = offset_of!(GroupSegment, members) + m * std::mem::size_of::<MemberSlot>();
        put(slot + offset_of!(MemberSlot, state), 2); // live, generation 0
        put(slot + offset_of!(MemberSlot, share), 1); // a change under way
        put(slot + offset_of!(MemberSlot, share) + 8, u64::MAX); // on every device
    }
    std::os::unix::fs::chown(&path, Some(OTHER), Some(OTHER)).unwrap();
    let before = std::fs::read(&path).unwrap();
    let started = Instant::now();
    let reader = open_group(&dir, OTHER, "h").unwrap();
    let used: Vec<u64> = (0..MAX_DEVICES as u32)
        .map(|d| reader.stats(d).used)
        .collect();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(200),
        "root's read took {took:?}"
    );
    assert!(used.iter().all(|&u| u == 1 << 30), "{used:?}");
    drop(reader);
    assert!(
        std::fs::read(&path).unwrap() == before,
        "root wrote into another user's group file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

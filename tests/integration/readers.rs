//! Readers no other user can hang, fool or crash, and scopes that survive killed readers: FIFOs,
//! symlinks and foreign-owned files planted at segment names; readers SIGKILLed in the middle of
//! scope operations; a segment file shrunk under an attached reader; writes to processes that are
//! gone or that `exec`'d away from the hook; a full segment filesystem.
//!
//! Every CLI reader runs under a time limit ([`within`]) so that a hang fails the test instead of
//! blocking it. Cases that need root (chown to another user, mounting a tmpfs) print why they are
//! skipped when not root.

use gpumemhook_reader::CHANGE_ENTRIES;
use gpumemhook_reader::{command_line, current_uid, open_segment_file, segment_path, start_ticks};
use gpumemhook_reader::{scope_phase_of, SCOPE_FREE, SCOPE_OPEN};
use gpumemhook_reader::{Error, Process};
use gpumemhook_tests::{cli, wait_for, Run};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

/// How long any reader may take before the test calls it a hang.
const ANSWER: Duration = Duration::from_secs(2);

/// Runs `command` to completion within `limit`, or kills it and fails.
fn within(command: &mut Command, limit: Duration) -> Output {
    let started = Instant::now();
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("waits"),
        Err(_) => {
            // SAFETY: kills the child this function spawned (by its pid).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!(
                "{command:?} did not answer within {limit:?} (ran {:?})",
                started.elapsed()
            );
        }
    }
}

/// `gpumemhook ARGS` in `dir` within [`ANSWER`]: (success, stdout, stderr).
fn reader(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = within(&mut cli(dir, args), ANSWER);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Pids in `ls --json` output.
fn json_pids(text: &str) -> Vec<u32> {
    let v: serde_json::Value = serde_json::from_str(text).expect("ls --json prints JSON");
    v.as_array()
        .expect("a list")
        .iter()
        .map(|s| s["pid"].as_u64().expect("pid") as u32)
        .collect()
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo");
}

fn is_root() -> bool {
    current_uid() == 0
}

/// A hooked `simrun` holding `bytes` on device 0, stopped at `touch:ready`, then running `after`
/// once `go` exists, touching `after-done`, and exiting once `done` exists.
struct Target {
    child: Child,
    dir: PathBuf,
}

impl Target {
    fn start(bytes: u64, after: &[&str]) -> Target {
        Target::start_with(bytes, after, |run| run)
    }

    fn start_with(bytes: u64, after: &[&str], adjust: impl FnOnce(Run) -> Run) -> Target {
        let probe = Run::sim("simrun", &[]);
        let dir = probe.dir().to_path_buf();
        let flag = |name: &str| dir.join(name).display().to_string();
        let mut ops = vec![
            "drv.init".to_string(),
            "drv.ctx:0".to_string(),
            format!("rt.malloc:a:{bytes}"),
            format!("touch:{}", flag("ready")),
            format!("wait:{}", flag("go")),
        ];
        ops.extend(after.iter().map(|s| s.to_string()));
        ops.push(format!("touch:{}", flag("after-done")));
        ops.push(format!("wait:{}", flag("done")));
        let mut run = probe;
        for op in &ops {
            run = run.arg(op);
        }
        let (mut command, dir) = adjust(run).into_command();
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("simrun starts");
        wait_for(&dir.join("ready"));
        Target { child, dir }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn shm(&self) -> PathBuf {
        self.dir.join("shm")
    }

    fn segment(&self) -> PathBuf {
        segment_path(&self.shm(), current_uid(), self.pid())
    }

    /// Lets the scenario run its `after` operations and waits for them.
    fn go(&self) {
        std::fs::write(self.dir.join("go"), "").unwrap();
        wait_for(&self.dir.join("after-done"));
    }

    /// Lets it exit; returns its output, which must be a success.
    fn finish(&mut self) -> Output {
        if !self.dir.join("go").exists() {
            self.go();
        }
        std::fs::write(self.dir.join("done"), "").unwrap();
        let mut out = String::new();
        let mut err = String::new();
        use std::io::Read;
        let status = self.child.wait().expect("simrun exits");
        if let Some(mut s) = self.child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = self.child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        assert!(status.success(), "simrun: {status}\n{out}\n{err}");
        Output {
            status,
            stdout: out.into_bytes(),
            stderr: err.into_bytes(),
        }
    }

    /// The exit report (after [`Target::finish`]).
    fn report(&self) -> gpumemhook_reader::Snapshot {
        let path = self.dir.join(format!("report.{}.json", self.pid()));
        serde_json::from_str(&std::fs::read_to_string(&path).expect("report")).expect("report JSON")
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A long-lived process without the hook, whose pid gets planted files.
fn bystander() -> Child {
    Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep starts")
}

#[test]
fn planted_fifos_symlinks_and_foreign_files_leave_every_reader_answering() {
    let mut target = Target::start(1000, &[]);
    let shm_dir = target.shm();
    let uid = current_uid();
    let dir = target.dir.clone();
    let mut bystander = bystander();
    let other = bystander.id();
    let planted = segment_path(&shm_dir, uid, other);
    // A FIFO at a live process's name and at one that does not exist; a symlink to a real segment.
    mkfifo(&planted);
    mkfifo(&segment_path(&shm_dir, uid, 999_999_999));
    std::os::unix::fs::symlink(target.segment(), segment_path(&shm_dir, uid, 999_999_998)).unwrap();
    let pid = target.pid().to_string();
    let other_s = other.to_string();

    let check_all = |what: &str, planted_reason: &str| {
        let (ok, out, err) = reader(&dir, &["ls"]);
        assert!(ok && out.contains(&pid), "{what}: ls\n{out}\n{err}");
        assert!(
            !out.contains(&other_s),
            "{what}: ls shows the planted pid\n{out}"
        );
        let (ok, out, err) = reader(&dir, &["ls", "--json"]);
        assert!(ok, "{what}: ls --json: {err}");
        assert_eq!(json_pids(&out), vec![target.pid()], "{what}: ls --json");
        let (ok, out, err) = reader(&dir, &["ls", "--all"]);
        assert!(ok, "{what}: ls --all: {err}");
        assert!(
            out.contains(&planted.display().to_string()) && out.contains(planted_reason),
            "{what}: ls --all names the planted file and why\n{out}"
        );
        assert!(out.contains("symbolic link"), "{what}: ls --all\n{out}");
        let (ok, out, err) = reader(&dir, &["top", "--once"]);
        assert!(ok && out.contains(&pid), "{what}: top --once\n{out}\n{err}");
        let (ok, out, err) = reader(&dir, &["ls", &pid]);
        assert!(ok && out.contains(&pid), "{what}: ls PID\n{out}\n{err}");
        for args in [
            vec!["ls", other_s.as_str()],
            vec!["limit", other_s.as_str(), "1GiB"],
            vec!["reset-peak", other_s.as_str()],
        ] {
            let (ok, out, err) = reader(&dir, &args);
            assert!(!ok, "{what}: {args:?} must fail\n{out}");
            assert!(
                err.contains(planted_reason) && !err.contains("is not hooked"),
                "{what}: {args:?} says why: {err}"
            );
        }
        // The real process is still writable.
        let (ok, _, err) = reader(&dir, &["reset-peak", &pid]);
        assert!(ok, "{what}: reset-peak of the real process: {err}");
    };
    check_all("FIFO", "FIFO");

    if is_root() {
        // A forged segment: the real one's bytes, naming the bystander, owned by nobody, mode 0666.
        std::fs::remove_file(&planted).unwrap();
        let mut bytes = std::fs::read(target.segment()).unwrap();
        bytes[24..28].copy_from_slice(&other.to_ne_bytes());
        let ticks = start_ticks(other).unwrap();
        bytes[40..48].copy_from_slice(&ticks.to_ne_bytes());
        std::fs::write(&planted, &bytes).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
        check_all("foreign file", "owned by uid 65534");
        assert_eq!(
            std::fs::read(&planted).unwrap(),
            bytes,
            "no reader wrote into the forged file"
        );
    } else {
        eprintln!("skipping the foreign-owned file case: chown to another user needs root");
    }
    let _ = bystander.kill();
    let _ = bystander.wait();
    target.finish();
}

/// Helper run as a child process by `killed_readers_never_wedge_the_targets_scopes` (it does nothing
/// unless `GPUMEMHOOK_TEST_HAMMER` names a segment): opens, resets and closes scopes on that segment
/// until it is killed.
#[test]
fn scope_hammer_child() {
    let Some(path) = std::env::var_os("GPUMEMHOOK_TEST_HAMMER") else {
        return;
    };
    let p = Process::open(Path::new(&path)).expect("hammer attaches");
    loop {
        if let Ok(s) = p.open_scope("hammer", Some(0)) {
            let _ = s.reset();
            let _ = s.close();
        }
    }
}

/// A small deterministic pseudo-random sequence (no dependency needed for jitter).
fn jitter(state: &mut u64, below: u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*state >> 33) % below
}

#[test]
fn killed_readers_never_wedge_the_targets_scopes() {
    let mut target = Target::start(1000, &["rt.malloc:b:500"]);
    let path = target.segment();
    let p = Process::open(&path).expect("attach");
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let mut seed = 0x5eed_u64 ^ u64::from(target.pid());
    let (mut kills, mut entries_left, mut slots_left) = (0, 0, 0);
    let rounds = 250;
    for _ in 0..rounds {
        let mut hammers: Vec<Child> = (0..2)
            .map(|_| {
                Command::new(&exe)
                    .args(["--exact", "readers::scope_hammer_child", "--nocapture"])
                    .env("GPUMEMHOOK_TEST_HAMMER", &path)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("hammer starts")
            })
            .collect();
        std::thread::sleep(Duration::from_micros(3000 + jitter(&mut seed, 9000)));
        for h in &mut hammers {
            let _ = h.kill();
            let _ = h.wait();
            kills += 1;
        }
        let seg = p.segment();
        entries_left += seg
            .header
            .change_owners
            .iter()
            .filter(|e| e.load(SeqCst) != 0)
            .count();
        slots_left += seg
            .scopes
            .iter()
            .filter(|s| {
                let phase = scope_phase_of(s.state.load(SeqCst));
                phase != SCOPE_FREE && phase != SCOPE_OPEN
            })
            .count();
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the kill loop took too long"
        );
    }
    eprintln!(
        "{kills} readers killed in {:?}; seen left behind after kills: {entries_left} change \
         entries, {slots_left} slots mid-operation",
        started.elapsed()
    );
    // The next scope opens at once, repairs what the dead left, and measures exactly.
    let opened = Instant::now();
    let scope = p.open_scope("after", Some(0)).expect("opens");
    assert!(
        opened.elapsed() < Duration::from_millis(500),
        "open took {:?}",
        opened.elapsed()
    );
    let seg = p.segment();
    assert!(seg.header.change_owners.iter().all(|e| e.load(SeqCst) == 0));
    assert_eq!(
        seg.open_scopes().count(),
        1,
        "dead readers' scopes were reaped"
    );
    assert!(seg.scopes.iter().all(|s| {
        let phase = scope_phase_of(s.state.load(SeqCst));
        phase == SCOPE_FREE || phase == SCOPE_OPEN
    }));
    assert_eq!(CHANGE_ENTRIES, seg.header.change_owners.len());
    target.go();
    let r = scope.reading(0).unwrap();
    assert_eq!((r.base, r.peak, r.used), (1000, 1500, 1500));
    let d = p.device(0).unwrap();
    assert_eq!((d.used, d.peak, d.allocs), (1500, 1500, 2));
    let floor = seg.devices[0].scope_floor.load(SeqCst);
    assert_eq!(floor >> 48 & 1, 0, "no change is in progress any more");
    scope.close().unwrap();
    target.finish();
}

#[test]
fn a_segment_shrunk_under_an_attached_reader_reads_as_gone_without_sigbus() {
    let target = Target::start(1000, &[]);
    let path = target.segment();
    let p = Process::open(&path).expect("attach");
    assert_eq!(p.used(0), 1000);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(0).unwrap();
    // Reading and writing the shrunk mapping must not kill this process.
    assert_eq!(p.used(0), 0);
    assert!(!p.is_alive());
    assert!(matches!(
        p.set_limit(None, Some(1)),
        Err(Error::ProcessGone { .. })
    ));
    // Give the watched process its pages back before it touches them again.
    file.set_len(gpumemhook_reader::SEGMENT_SIZE as u64)
        .unwrap();
    drop(target);
}

#[test]
fn writes_to_a_gone_process_raise_process_gone() {
    let mut target = Target::start(1000, &[]);
    let pid = target.pid();
    let dir = target.dir.clone();
    let p = Process::open(&target.segment()).expect("attach");
    let scope = p.open_scope("s", Some(0)).unwrap();
    assert!(p.is_alive());
    target.finish();
    assert!(!p.is_alive());
    for (what, result) in [
        ("set_limit", p.set_limit(None, Some(1 << 30))),
        ("reset_peak", p.reset_peak(None)),
        ("open_scope", p.open_scope("t", None).map(drop)),
        ("scope reset", scope.reset()),
    ] {
        assert!(
            matches!(result, Err(Error::ProcessGone { pid: gone }) if gone == pid),
            "{what}: {result:?}"
        );
    }
    let (ok, _, err) = reader(&dir, &["limit", &pid.to_string(), "1GiB"]);
    assert!(!ok && err.contains("no process"), "{err}");
}

#[test]
fn a_process_that_execs_away_from_the_hook_is_never_listed_and_its_file_is_removed() {
    exec_away("exec-away", "");
}

/// The same while a forked child (a subshell: a fork with no exec, which inherits the parent's
/// mapping of its segment, and with it the description the mapping was made from) still runs:
/// the liveness lock is not on that description, so the exec'd image is not taken for alive.
#[test]
fn a_process_that_execs_away_while_its_forked_child_lives_is_never_listed() {
    exec_away(
        "exec-away-child",
        "( while [ ! -e {d}/stop ]; do sleep 0.05; done ) & ",
    );
}

/// A hooked `sh` that runs `before` (with `{d}` the run's directory), says it is ready, then execs
/// an unhooked `sleep` when told to: its pid must leave `ls` and its file be removed.
fn exec_away(name: &str, before: &str) {
    let run = Run::program("/bin/sh", name);
    let dir = run.dir().to_path_buf();
    let d = dir.display().to_string();
    let script = format!(
        "{}touch {d}/ready; while [ ! -e {d}/go ]; do sleep 0.01; done; \
         exec env -u LD_PRELOAD sleep 5",
        before.replace("{d}", &d)
    );
    let (mut command, _) = run.arg("-c").arg(script).into_command();
    let mut child = command.spawn().expect("sh starts");
    let pid = child.id();
    wait_for(&dir.join("ready"));
    let (ok, out, err) = reader(&dir, &["ls", "--all", "--json"]);
    assert!(ok, "{err}");
    assert!(json_pids(&out).contains(&pid), "hooked sh is listed: {out}");
    std::fs::write(dir.join("go"), "").unwrap();
    // Wait until the image without the hook runs.
    let start = Instant::now();
    while command_line(pid).is_none_or(|c| !c.starts_with("sleep")) {
        assert!(start.elapsed() < Duration::from_secs(10), "never exec'd");
        std::thread::sleep(Duration::from_millis(5));
    }
    let file = segment_path(&dir.join("shm"), current_uid(), pid);
    assert!(file.exists(), "the exec'd image left its file behind");
    // The liveness lock went with the image, whatever else still maps the file.
    let mapping = open_segment_file(&file).expect("the left file opens");
    assert_eq!(
        mapping.lock_held(),
        Some(false),
        "the exec'd image's lock is held"
    );
    drop(mapping);
    let (ok, out, err) = reader(&dir, &["ls", "--all", "--json"]);
    assert!(ok, "{err}");
    assert!(!json_pids(&out).contains(&pid), "exec'd pid listed: {out}");
    assert!(!file.exists(), "the stale file was removed");
    let (ok, _, err) = reader(&dir, &["ls", &pid.to_string()]);
    assert!(!ok && err.contains("is not hooked"), "{err}");
    std::fs::write(dir.join("stop"), "").unwrap();
    let _ = child.kill();
    let _ = child.wait();
}

/// A small tmpfs mounted for one test, unmounted on drop; `None` (with the reason printed) when
/// this is not root or the mount fails.
struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    fn mount(name: &str, size: &str) -> Option<SmallTmpfs> {
        if !is_root() {
            eprintln!("skipping {name}: mounting a small tmpfs needs root");
            return None;
        }
        let dir = gpumemhook_tests::scratch(name).join("mnt");
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=1777"),
                "tmpfs",
            ])
            .arg(&dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(SmallTmpfs(dir)),
            Ok(o) => {
                eprintln!(
                    "skipping {name}: mount -t tmpfs failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipping {name}: cannot run mount: {e}");
                None
            }
        }
    }

    /// Fills the filesystem until it refuses another byte.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = [7u8; 4096];
        while f.write_all(&block).is_ok() {}
        let mut byte = 0;
        while f.write_all(&[1]).is_ok() {
            byte += 1;
            assert!(byte < 8192);
        }
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Lines of the hook's warnings in `stderr`.
fn warnings(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.starts_with("gpumemhook:"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_full_segment_filesystem_means_private_counting_with_one_warning() {
    let Some(fs) = SmallTmpfs::mount("full-tmpfs", "1m") else {
        return;
    };
    fs.fill();
    let ran = Run::program("/bin/true", "true-full")
        .env("GPUMEMHOOK_SHM_DIR", &fs.0)
        .run()
        .ok();
    assert_eq!(warnings(&ran.output.stderr).len(), 1, "{}", ran.stderr());
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:100",
            "rt.malloc:b:200",
            "rt.free:a",
        ],
    )
    .env("GPUMEMHOOK_SHM_DIR", &fs.0)
    .run()
    .ok();
    let w = warnings(&ran.output.stderr);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("No space left"), "{w:?}");
    let d = ran.report().device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (200, 300, 2, 1));
    let left: Vec<_> = std::fs::read_dir(&fs.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("gpumemhook-"))
        .collect();
    assert!(left.is_empty(), "no half-made segment left: {left:?}");
}

/// A group whose file cannot be made (the segment filesystem is full): the member says so in one
/// line, counts alone and exactly, and leaves no half-made group file.
#[test]
fn a_full_segment_filesystem_at_a_groups_creation_leaves_the_member_counting_alone() {
    let Some(fs) = SmallTmpfs::mount("full-tmpfs-group", "1m") else {
        return;
    };
    fs.fill();
    let ran = Run::sim(
        "simrun",
        &["rt.malloc:a:100", "rt.malloc:b:200", "rt.free:a"],
    )
    .env("GPUMEMHOOK_SHM_DIR", &fs.0)
    .env("GPUMEMHOOK_GROUP", "full")
    .run()
    .ok();
    let w = warnings(&ran.output.stderr);
    let group: Vec<_> = w
        .iter()
        .filter(|l| l.contains("cannot join group full"))
        .collect();
    assert!(
        group.len() == 1 && group[0].contains("No space left") && group[0].contains("counts alone"),
        "{w:?}"
    );
    let d = ran.report().device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (200, 300, 2, 1));
    let left: Vec<_> = std::fs::read_dir(&fs.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("gpumemhook-"))
        .collect();
    assert!(left.is_empty(), "no half-made file left: {left:?}");
}

#[test]
fn a_segment_filesystem_that_fills_after_creation_never_raises_sigbus() {
    let Some(fs) = SmallTmpfs::mount("fills-later", "1m") else {
        return;
    };
    let mut target = Target::start_with(1000, &["rt.malloc:b:500", "rt.free:a"], |run| {
        run.env("GPUMEMHOOK_SHM_DIR", &fs.0)
    });
    let path = segment_path(&fs.0, current_uid(), target.pid());
    assert!(
        path.exists(),
        "the segment was made before the filesystem filled"
    );
    fs.fill();
    let p = Process::open(&path).expect("attach");
    let scope = p.open_scope("late", Some(0)).expect("scopes still work");
    target.go();
    let r = scope.reading(0).unwrap();
    assert_eq!((r.base, r.peak, r.used), (1000, 1500, 500));
    scope.close().unwrap();
    let out = target.finish();
    assert!(
        warnings(&out.stderr).is_empty(),
        "{:?}",
        warnings(&out.stderr)
    );
    let d = target.report().device(0);
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (500, 1500, 2, 1));
}

#[test]
fn another_users_process_gets_its_own_message_not_is_not_hooked() {
    if !is_root() {
        eprintln!("skipping: running a reader as another user needs root");
        return;
    }
    let mut target = Target::start(1000, &[]);
    let pid = target.pid().to_string();
    for args in [
        vec!["ls", pid.as_str()],
        vec!["limit", pid.as_str(), "1GiB"],
        vec!["reset-peak", pid.as_str()],
    ] {
        use std::os::unix::process::CommandExt;
        let mut command = cli(&target.dir, &args);
        command.uid(65534).gid(65534);
        let out = within(&mut command, ANSWER);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} as nobody must fail");
        assert!(
            err.contains("runs as uid 0, another user") && !err.contains("is not hooked"),
            "{args:?}: {err}"
        );
    }
    // Root reads it.
    let (ok, out, err) = reader(&target.dir, &["ls", &pid]);
    assert!(ok && out.contains(&pid), "{out}{err}");
    target.finish();
}

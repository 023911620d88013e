//! Nothing done to the flight recorder's file harms the program (issue 48, item 2): truncating,
//! replacing or rewriting the live timeline, by its owner or by another user, never kills it and
//! never changes its counts; the hook never writes into a file, FIFO or link another user planted
//! at the path; and device entries named as the path stay what they were.

use std::path::Path;
use std::process::{Command, Stdio};

use gpumemhook_tests::Run;

/// What the recorder says, once, when its file was cut under the program.
const CUT: &str = "was cut under the program";

/// What a test does to the live timeline `trace` from outside, with the shell's tools.
#[derive(Clone, Copy, Debug)]
enum Harm {
    /// `truncate -s SIZE`, by its owner.
    Truncate(&'static str),
    /// `cp old trace`: an older, shorter timeline copied over it (the file keeps its inode and is
    /// cut to the old one's length first).
    CopyOver,
    /// Zeroes written over every byte, in place (`dd conv=notrunc`): the length stays.
    Rewrite,
    /// `truncate -s 0` by another user, to whom the owner gave the file (`chmod 666`).
    TruncateByOther,
}

fn shell(command: &mut Command) {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `program` with `args`, run as another user (nobody, 65534).
fn as_nobody(program: &str, args: &[&str]) -> Command {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(program);
    command.args(args).uid(65534).gid(65534);
    command
}

fn harm(trace: &Path, how: Harm) {
    let path = trace.to_str().unwrap();
    match how {
        Harm::Truncate(size) => shell(Command::new("truncate").args(["-s", size, path])),
        Harm::CopyOver => {
            let old = trace.with_extension("old");
            let mut header = std::fs::read(trace).unwrap();
            header.truncate(4096);
            std::fs::write(&old, header).unwrap();
            shell(Command::new("cp").arg(&old).arg(trace));
        }
        Harm::Rewrite => shell(Command::new("dd").args([
            "if=/dev/zero",
            &format!("of={path}"),
            "conv=notrunc",
            &format!("bs={}", std::fs::metadata(trace).unwrap().len()),
            "count=1",
        ])),
        Harm::TruncateByOther => {
            shell(Command::new("chmod").args(["666", path]));
            shell(&mut as_nobody("truncate", &["-s", "0", path]));
        }
    }
}

/// Whether this test process may act as another user (root only).
fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn truncating_replacing_or_rewriting_the_live_timeline_never_harms_the_program() {
    let mut harms = vec![
        Harm::Truncate("4096"),
        Harm::Truncate("0"),
        Harm::CopyOver,
        Harm::Rewrite,
    ];
    if root() {
        harms.push(Harm::TruncateByOther);
    }
    for how in harms {
        harmed_run(how, None);
    }
}

/// The same with the timeline a ring (`GPUMEMHOOK_TRACE_MAX`): the summary and the slots, mapped
/// and written at every overwrite, cut or replaced under the program, never harm it; the ring
/// wraps after the harm (120,000 events in a 2 MiB ring), so the hook writes into what was cut.
#[test]
fn truncating_or_replacing_a_ring_timeline_never_harms_the_program() {
    for how in [Harm::Truncate("4096"), Harm::Truncate("0"), Harm::CopyOver] {
        harmed_run(how, Some("2M"));
    }
}

/// Runs threads that allocate before and after `how` is done to the live timeline (a ring of
/// `ring` bytes, or none), then checks the program's counts and the one line the hook says.
fn harmed_run(how: Harm, ring: Option<&str>) {
    // Allocations before the harm (the main thread's chunk stays mapped, threads' chunks are
    // done), then after it: in the main thread's chunk, and in new threads' new chunks.
    let run = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:1048576",
            "threads:2:3000:7:65536",
        ],
    );
    let dir = run.dir().to_path_buf();
    let trace = dir.join("t");
    let threads_after = if ring.is_some() {
        "threads:3:20000:9:65536"
    } else {
        "threads:3:5000:9:65536"
    };
    let after = [
        "rt.malloc:b:2097152",
        threads_after,
        "rt.free:a",
        "print.used:0",
    ];
    let mut run = after.iter().fold(
        run.arg(format!("wait:{}", dir.join("go").display())),
        Run::arg,
    );
    if let Some(max) = ring {
        run = run.env("GPUMEMHOOK_TRACE_MAX", max);
    }
    let (mut command, _) = run.env("GPUMEMHOOK_TRACE", &trace).into_command();
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first threads' 6,000 steps are in the file once it holds more than three chunks (a
    // ring's reserved summary and names already are: its harm may come before them).
    wait_for_len(&trace, 4096 + 3 * 65536);
    harm(&trace, how);
    std::fs::write(dir.join("go"), b"").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let what = format!("{how:?} (ring {ring:?})");
    assert!(out.status.success(), "{what}: {:?}\n{stderr}", out.status);
    // The exit report stays the driver's truth.
    let ran = gpumemhook_tests::Ran {
        output: out.clone(),
        dir: dir.clone(),
    };
    let used: u64 = ran.line_fields("used dev=0")["bytes"].parse().unwrap();
    let allocs: u64 = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("threads allocs="))
        .map(|rest| rest.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    let device = ran.report().device(0);
    assert_eq!((device.used, device.allocs), (used, allocs + 2), "{what}");
    // A cut that the hook ran into is said once; a rewrite in place may go unseen.
    let said = stderr.lines().filter(|l| l.contains(CUT)).count();
    match how {
        Harm::Rewrite => assert!(said <= 1, "{what}: {stderr}"),
        _ => assert_eq!(said, 1, "{what}: {stderr}"),
    }
    // What is left reads to where it stops, without a crash of the reader.
    let report = gpumemhook_tests::cli(&dir, &["report", trace.to_str().unwrap()])
        .output()
        .unwrap();
    let report_err = String::from_utf8_lossy(&report.stderr);
    assert!(!report_err.contains("panicked"), "{what}: {report_err}");
}

/// Waits (up to 60 s) until the file at `path` is at least `len` bytes long.
fn wait_for_len(path: &Path, len: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::metadata(path).map_or(0, |m| m.len()) < len {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never reached {len} bytes",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A directory anyone may write and only an entry's owner may remove from, as `/tmp`.
fn sticky_dir(name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = gpumemhook_tests::scratch(name);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// What another user may plant at the timeline's path.
#[derive(Clone, Copy, Debug)]
enum Planted {
    File(u32),
    Fifo,
    Link,
}

/// Plants `what` at `path` as nobody's (made by root, then given away: the same entry she would
/// have made herself), a link pointing at `victim`.
fn plant(path: &Path, what: Planted, victim: &Path) {
    use std::os::unix::fs::PermissionsExt;
    match what {
        Planted::File(mode) => {
            std::fs::write(path, b"hers").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        Planted::Fifo => shell(Command::new("mkfifo").args(["-m", "666"]).arg(path)),
        Planted::Link => std::os::unix::fs::symlink(victim, path).unwrap(),
    }
    std::os::unix::fs::lchown(path, Some(65534), Some(65534)).unwrap();
}

/// An entry's owner, kind and mode, without following a link.
fn entry(path: &Path) -> (u32, std::fs::FileType, u32) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.uid(), meta.file_type(), meta.mode())
}

#[test]
fn another_users_file_fifo_or_link_at_the_timeline_path_is_refused_in_one_line_and_left_as_it_was()
{
    if !root() {
        eprintln!("skipped: only root can make an entry owned by another user");
        return;
    }
    let dir = sticky_dir("planted-timeline");
    let victim = dir.join("victim");
    std::fs::write(&victim, b"keep me").unwrap();
    for what in [
        Planted::File(0o644),
        Planted::File(0o444),
        Planted::Fifo,
        Planted::Link,
    ] {
        let trace = dir.join(format!("t-{what:?}"));
        plant(&trace, what, &victim);
        let before = entry(&trace);
        // A FIFO with a reader: written through, it would take the whole timeline.
        let reader = matches!(what, Planted::Fifo).then(|| {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&trace)
                .unwrap()
        });
        let ran = Run::sim("simrun", &["drv.init", "drv.ctx:0", "rt.malloc:a:4096"])
            .env("GPUMEMHOOK_TRACE", &trace)
            .run()
            .ok();
        let refused = ran
            .stderr()
            .lines()
            .filter(|l| l.contains("belongs to another user"))
            .count();
        assert_eq!(refused, 1, "{what:?}: {}", ran.stderr());
        assert_eq!(ran.report().device(0).used, 4096);
        assert_eq!(entry(&trace), before, "{what:?}: the entry stays hers");
        match what {
            Planted::File(_) => assert_eq!(std::fs::read(&trace).unwrap(), b"hers"),
            Planted::Fifo => {
                let mut got = Vec::new();
                let _ = std::io::Read::read_to_end(&mut reader.unwrap(), &mut got);
                assert!(got.is_empty(), "the FIFO received {} bytes", got.len());
            }
            Planted::Link => assert_eq!(std::fs::read(&victim).unwrap(), b"keep me"),
        }
    }
}

#[test]
fn temporary_names_planted_in_advance_never_stop_the_timeline() {
    let dir = sticky_dir("planted-names");
    let trace = dir.join("t");
    let run = Run::sim("simrun", &[])
        .arg(format!("wait:{}", dir.join("go").display()))
        .arg("drv.init")
        .arg("drv.ctx:0")
        .arg("rt.malloc:a:4096");
    let (mut command, _) = run.env("GPUMEMHOOK_TRACE", &trace).into_command();
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Every name of the old pattern for this pid, made before the program's first event.
    for attempt in 0..8 {
        let name = dir.join(format!(".t.{}-{attempt}.tmp", child.id()));
        std::fs::write(&name, b"").unwrap();
        if root() {
            std::os::unix::fs::lchown(&name, Some(65534), Some(65534)).unwrap();
        }
    }
    std::fs::write(dir.join("go"), b"").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("timeline"), "{stderr}");
    assert_eq!(gpumemhook_tests::timeline(&trace).counts["alloc"], 1);
}

/// How a test leaves the standard output and error of a program it runs.
#[derive(Clone, Copy, Debug)]
enum Streams {
    Open,
    Closed,
    File,
}

/// `command` run with its stdout and stderr as `how` says (a file in `dir`); its output is dropped.
fn run_with(mut command: Command, how: Streams, dir: &Path) {
    use std::os::unix::process::CommandExt;
    match how {
        Streams::Open => {
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        Streams::Closed => {
            // SAFETY: close is async-signal-safe and touches only the child's descriptors.
            unsafe {
                command.pre_exec(|| {
                    libc::close(1);
                    libc::close(2);
                    Ok(())
                })
            };
        }
        Streams::File => {
            let log = std::fs::File::create(dir.join("log")).unwrap();
            command.stdout(log.try_clone().unwrap()).stderr(log);
        }
    }
    let _ = command.output().unwrap();
}

/// What `/dev/stdout`, `/dev/full` and `/dev/null` are: kind, device number, link target; and the
/// names in `/dev` that start as theirs (`stdout.123`, `.null.…tmp`).
fn devices() -> (Vec<(String, String)>, Vec<String>) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let entries = ["/dev/stdout", "/dev/full", "/dev/null"]
        .iter()
        .map(|path| {
            let meta = std::fs::symlink_metadata(path).unwrap();
            let kind = meta.file_type();
            let what = if kind.is_symlink() {
                format!("link to {}", std::fs::read_link(path).unwrap().display())
            } else if kind.is_char_device() {
                format!("char device {:x}", meta.rdev())
            } else {
                format!("{kind:?} of {} bytes", meta.len())
            };
            (path.to_string(), what)
        })
        .collect();
    let mut names: Vec<String> = std::fs::read_dir("/dev")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| ["stdout", "full", "null"].iter().any(|d| n.contains(d)))
        .collect();
    names.sort();
    (entries, names)
}

#[test]
fn dev_stdout_dev_full_and_dev_null_stay_what_they_were_whatever_writes_a_timeline_there() {
    let before = devices();
    let run = Run::sim("simrun", &["drv.init", "drv.ctx:0", "rt.malloc:a:4096"]);
    let dir = run.dir().to_path_buf();
    let trace = dir.join("t");
    run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
    let trace = trace.to_str().unwrap();
    let sim = gpumemhook_tests::sim_dir().join("simrun");
    let sim = sim.to_str().unwrap();
    let mut tried = Vec::new();
    for how in [Streams::Open, Streams::Closed, Streams::File] {
        // The hook itself, in a process whose forked children record too.
        for target in ["/dev/stdout", "/dev/full", "/dev/null"] {
            let (command, _) = Run::sim(
                "simrun",
                &["drv.init", "drv.ctx:0", "rt.malloc:a:4096", "forkstorm:3:2"],
            )
            .env("GPUMEMHOOK_TRACE", target)
            .into_command();
            run_with(command, how, &dir);
            tried.push(format!("GPUMEMHOOK_TRACE={target} ({how:?})"));
        }
        for target in ["/dev/stdout", "/dev/full"] {
            for args in [
                vec!["run", "--trace", target, "--", sim, "drv.init", "drv.ctx:0"],
                vec!["view", trace, "-o", target],
                vec!["plot", trace, "-o", target, "--format", "svg"],
                vec!["export", trace, "--chrome", target],
            ] {
                run_with(gpumemhook_tests::cli(&dir, &args), how, &dir);
                tried.push(format!("{args:?} ({how:?})"));
            }
        }
    }
    let after = devices();
    restore_devices(&before, &after);
    assert_eq!(after, before, "after {tried:#?}");
}

/// Puts `/dev` back as `before` found it, before the verdict, so that a failure leaves the
/// machine as it was: new names removed, and an entry no longer what it was made again (the link
/// `/dev/stdout`, the null device 1:3 and the full device 1:7, mode 0666).
fn restore_devices(
    before: &(Vec<(String, String)>, Vec<String>),
    after: &(Vec<(String, String)>, Vec<String>),
) {
    for name in after.1.iter().filter(|n| !before.1.contains(n)) {
        let _ = std::fs::remove_file(Path::new("/dev").join(name));
    }
    for (was, now) in before.0.iter().zip(&after.0) {
        if was == now {
            continue;
        }
        let _ = std::fs::remove_file(&was.0);
        match was.0.as_str() {
            "/dev/stdout" => std::os::unix::fs::symlink("/proc/self/fd/1", &was.0).unwrap(),
            device => {
                let minor = if device == "/dev/null" { 3 } else { 7 };
                let path = std::ffi::CString::new(device).unwrap();
                // SAFETY: a valid NUL-terminated path; mknod and chmod only make the node.
                unsafe {
                    libc::mknod(
                        path.as_ptr(),
                        libc::S_IFCHR | 0o666,
                        libc::makedev(1, minor),
                    );
                    libc::chmod(path.as_ptr(), 0o666);
                }
            }
        }
    }
}

#[test]
fn a_dev_without_its_stdout_link_never_gets_a_regular_file_in_its_place() {
    // A minimal /dev (a container's, a sandbox's) may lack the link /dev/stdout: the output rule
    // then took the path for a new file and renamed the timeline, then the exit report, over it,
    // leaving a regular file /dev/stdout that every later writer replaced again. Here in a mount
    // namespace of its own, over a /dev of its own: nothing leaks to the machine's.
    if !root() {
        eprintln!("skipped: only root can mount a /dev of its own");
        return;
    }
    let (inner, _) = Run::sim("simrun", &["drv.init", "drv.ctx:0", "rt.malloc:a:4096"])
        .env("GPUMEMHOOK_TRACE", "/dev/stdout")
        .env("GPUMEMHOOK_REPORT", "/dev/stdout")
        .into_command();
    let script = r#"mount -t tmpfs tmpfs /dev || exit 99
"$@"
rc=$?
if [ -e /dev/stdout ] || [ -L /dev/stdout ]; then echo "made: $(stat -c %F /dev/stdout)" >&2; fi
exit $rc"#;
    // The hook for the program alone, through `env`, not for `unshare` and the shell.
    let preload = inner
        .get_envs()
        .find(|(key, _)| *key == "LD_PRELOAD")
        .and_then(|(_, value)| value)
        .expect("the hook is preloaded");
    let mut assignment = std::ffi::OsString::from("LD_PRELOAD=");
    assignment.push(preload);
    let mut outer = Command::new("unshare");
    outer
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg("env")
        .arg(assignment)
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs().filter(|(key, _)| *key != "LD_PRELOAD") {
        match value {
            Some(value) => outer.env(key, value),
            None => outer.env_remove(key),
        };
    }
    outer.env_remove("LD_PRELOAD");
    let out = outer.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(99), "no mount: {stderr}");
    assert!(!stderr.contains("made:"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    // Both went to the program's standard output: the exit report, then the timeline.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with('{'), "{:.200}", stdout);
    assert!(stdout.contains("\"used\": 4096"), "{:.200}", stdout);
    assert!(out.stdout.windows(8).any(|w| w == b"GMHTRACE"));
}

//! What a report path may name (`docs/output-files.md`): a device, a FIFO, `/dev/stdout` and a link
//! to `/proc/self/fd/1` are written through and stay what they were; a link another user planted
//! is never followed. Also the faulty driver that answers success with a null address, and the
//! one parser of sizes and counts. Everything happens in private scratch directories: the
//! system's `/dev` is never touched.

use gpumemhook_reader::Snapshot;
use gpumemhook_tests::{cli, scratch, Run};
use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// A character device node with `/dev/null`'s numbers (1, 3) at `path`; false where this user may
/// not make one (not root, or a container without CAP_MKNOD).
fn make_null_device(path: &Path) -> bool {
    // SAFETY: a valid NUL-terminated path; mknod only creates the node.
    let rc = unsafe {
        libc::mknod(
            c_path(path).as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
    };
    rc == 0 && std::fs::OpenOptions::new().write(true).open(path).is_ok()
}

/// What `path` itself is (a link is not followed).
fn kind(path: &Path) -> std::fs::FileType {
    std::fs::symlink_metadata(path).unwrap().file_type()
}

/// A FIFO `report.fifo` in a fresh scratch directory named `name`.
fn fifo_in(name: &str) -> std::path::PathBuf {
    let fifo = scratch(name).join("report.fifo");
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);
    fifo
}

const ALLOCATE: [&str; 3] = ["drv.init", "drv.ctx:0", "rt.malloc:a:100"];

#[test]
fn a_device_node_at_the_report_oom_report_and_timeline_paths_stays_a_device() {
    let dir = scratch("device-node");
    let (report, oom, trace) = (dir.join("r"), dir.join("oom"), dir.join("t"));
    for path in [&report, &oom, &trace] {
        if !make_null_device(path) {
            eprintln!("skipped: this user cannot make a device node (needs root and CAP_MKNOD)");
            return;
        }
    }
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "rt.malloc:a:100",
            "rt.malloc:b:200=2",
        ],
    )
    .env("GPUMEMHOOK_REPORT", &report)
    .env("GPUMEMHOOK_OOM_REPORT", &oom)
    .env("GPUMEMHOOK_TRACE", &trace)
    .env("GPUMEMHOOK_LIMIT", "150B")
    .run()
    .ok();
    for path in [&report, &oom, &trace] {
        assert!(
            kind(path).is_char_device(),
            "{} is no longer a device",
            path.display()
        );
    }
    assert!(
        !ran.stderr().contains("cannot write"),
        "a device that takes writes takes the report: {}",
        ran.stderr()
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_fifo_with_a_reader_receives_the_report_and_stays_a_fifo() {
    let fifo = fifo_in("fifo");
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            std::fs::File::open(&fifo)
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            text
        })
    };
    // The reader must have opened its end before the program exits: the hook does not wait for
    // one. A FIFO's open for reading blocks until a writer comes, so give the thread its turn by
    // opening (and keeping) a writer of our own until the program is done.
    let keep_open = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    Run::sim("simrun", &ALLOCATE)
        .env("GPUMEMHOOK_REPORT", &fifo)
        .run()
        .ok();
    drop(keep_open);
    let text = reader.join().unwrap();
    let snapshot: Snapshot = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(snapshot.device(0).used, 100);
    assert!(kind(&fifo).is_fifo());
}

#[test]
fn a_fifo_nobody_reads_is_said_and_never_hangs_the_program() {
    let fifo = fifo_in("fifo-unread");
    let ran = Run::sim("simrun", &ALLOCATE)
        .env("GPUMEMHOOK_REPORT", &fifo)
        .run()
        .ok();
    assert!(
        ran.stderr().contains("FIFO that no process reads"),
        "{}",
        ran.stderr()
    );
    assert!(kind(&fifo).is_fifo());
}

#[test]
fn a_fifo_whose_reader_stops_reading_delays_the_exit_but_never_hangs_it() {
    let fifo = fifo_in("fifo-stalled");
    // A reader that never reads: the FIFO held open for reading and writing, as a paused collector
    // (`exec 3<>report.fifo`) holds it.
    let _stalled = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    // About 2000 live allocations: a report far larger than a pipe's 64 KiB buffer.
    let (command, _) = Run::sim("simrun", &["drv.init", "drv.ctx:0", "race:1:1024"])
        .env("GPUMEMHOOK_REPORT", &fifo)
        .env("GPUMEMHOOK_LIMIT", "2MiB")
        .into_command();
    let (status, stderr, _) = exit_within(
        command,
        std::time::Duration::from_secs(120),
        "the program hung at its exit writing to a FIFO nobody reads",
    );
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(stderr.contains("stopped reading"), "{stderr}");
}

/// The report printed on the standard output: the JSON object after the program's own lines.
fn report_on_stdout(stdout: &str) -> Snapshot {
    let start = stdout
        .find("{\n")
        .unwrap_or_else(|| panic!("no report on stdout:\n{stdout}"));
    serde_json::from_str(&stdout[start..]).unwrap_or_else(|e| panic!("{e}:\n{stdout}"))
}

#[test]
fn dev_stdout_and_a_link_to_proc_self_fd_1_print_the_report() {
    let dir = scratch("stdout");
    let link = dir.join("out.json");
    std::os::unix::fs::symlink("/proc/self/fd/1", &link).unwrap();
    for target in [Path::new("/dev/stdout"), &link] {
        let ran = Run::sim("simrun", &ALLOCATE)
            .env("GPUMEMHOOK_REPORT", target)
            .run()
            .ok();
        assert_eq!(report_on_stdout(&ran.stdout()).device(0).used, 100);
    }
    assert!(kind(&link).is_symlink(), "the link stays a link");
    // Standard output redirected to a file: the report comes after what the program wrote there,
    // which stays.
    let log = dir.join("log.txt");
    let (mut command, _) = Run::sim("simrun", &[&ALLOCATE[..], &["print.used:0"]].concat())
        .env("GPUMEMHOOK_REPORT", "/dev/stdout")
        .into_command();
    let status = command
        .stdout(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.starts_with('{'),
        "the program's own lines come first:\n{text}"
    );
    assert_eq!(report_on_stdout(&text).device(0).used, 100);
}

#[test]
fn the_cli_writes_its_report_and_plot_to_dev_stdout() {
    let dir = scratch("cli-stdout");
    let sim = gpumemhook_tests::sim_dir().join("simrun");
    let sim = sim.to_str().unwrap();
    let out = cli(&dir, &["run", "--report", "/dev/stdout", "--", sim])
        .args(ALLOCATE)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(report_on_stdout(&stdout).device(0).used, 100);
    let trace = dir.join("t.json");
    let out = cli(
        &dir,
        &["run", "--trace", trace.to_str().unwrap(), "--", sim],
    )
    .args(ALLOCATE)
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(
        &dir,
        &[
            "plot",
            trace.to_str().unwrap(),
            "-o",
            "/dev/stdout",
            "--format",
            "svg",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("<svg"));
}

/// Makes the link at `path` another user's (nobody's), as if that user had planted it.
fn give_to_nobody(path: &Path) {
    // SAFETY: a valid NUL-terminated path; lchown changes the link's owner only.
    let rc = unsafe { libc::lchown(c_path(path).as_ptr(), 65534, 65534) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn a_symlink_another_user_planted_is_never_followed() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only root can make a link owned by another user");
        return;
    }
    let dir = scratch("planted");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let report = dir.join("r.json");
    std::os::unix::fs::symlink(&victim, &report).unwrap();
    give_to_nobody(&report);
    let oom = dir.join("oom.json");
    std::os::unix::fs::symlink(&victim, &oom).unwrap();
    give_to_nobody(&oom);
    Run::sim("simrun", &["rt.malloc:a:100", "rt.malloc:b:200=2"])
        .env("GPUMEMHOOK_REPORT", &report)
        .env("GPUMEMHOOK_OOM_REPORT", &oom)
        .env("GPUMEMHOOK_LIMIT", "150B")
        .run()
        .ok();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    for replaced in [&report, &oom] {
        assert!(kind(replaced).is_file(), "the link itself is replaced");
    }
    let oom: Snapshot = serde_json::from_slice(&std::fs::read(&oom).unwrap()).unwrap();
    assert_eq!(oom.oom.map(|o| o.bytes), Some(200));
}

#[test]
fn no_dev_fd_names_the_hooks_own_segment_and_every_count_stays_intact() {
    // The hook keeps no descriptor of its segment (its liveness lock is pinned to the process
    // image, `LockAnchor`), so no `/dev/fd/N` a user names as an output can reach it: each run
    // ends with its counts intact, whatever the report did with the descriptor.
    for fd in 3..10 {
        let ran = Run::sim("simrun", &[&ALLOCATE[..], &["print.used:0"]].concat())
            .env("GPUMEMHOOK_REPORT", format!("/dev/fd/{fd}"))
            .run()
            .ok();
        assert!(
            !ran.stderr().contains("a gpumemhook segment"),
            "{}",
            ran.stderr()
        );
        assert!(
            ran.stdout().contains("used dev=0 bytes=100"),
            "{}",
            ran.stdout()
        );
    }
}

#[test]
fn a_users_own_link_to_a_file_is_followed_and_stays_a_link() {
    let dir = scratch("own-link");
    let real = dir.join("real.json");
    std::fs::write(&real, "old").unwrap();
    let report = dir.join("r.json");
    std::os::unix::fs::symlink("real.json", &report).unwrap();
    Run::sim("simrun", &ALLOCATE)
        .env("GPUMEMHOOK_REPORT", &report)
        .run()
        .ok();
    assert!(kind(&report).is_symlink());
    let snapshot: Snapshot = serde_json::from_slice(&std::fs::read(&real).unwrap()).unwrap();
    assert_eq!(snapshot.device(0).used, 100);
}

#[test]
fn a_directory_or_a_block_device_is_refused_with_a_message() {
    let dir = scratch("refused-targets");
    let ran = Run::sim("simrun", &ALLOCATE)
        .env("GPUMEMHOOK_REPORT", &dir)
        .run()
        .ok();
    assert!(ran.stderr().contains("is a directory"), "{}", ran.stderr());
    let block = dir.join("disk");
    // SAFETY: a valid path; mknod only creates the node (loop0's numbers), never opened here.
    let made = unsafe {
        libc::mknod(
            c_path(&block).as_ptr(),
            libc::S_IFBLK | 0o600,
            libc::makedev(7, 0),
        )
    } == 0;
    if made {
        let ran = Run::sim("simrun", &ALLOCATE)
            .env("GPUMEMHOOK_REPORT", &block)
            .run()
            .ok();
        assert!(ran.stderr().contains("block device"), "{}", ran.stderr());
        assert!(kind(&block).is_block_device());
    }
}

#[test]
fn a_null_address_from_the_driver_is_counted_nowhere() {
    // Zero bytes: the runtime answers NULL, as the real one does; counted nowhere, said nowhere.
    let ran = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "rt.malloc:z:0", "rt.malloc:a:100"],
    )
    .run()
    .ok();
    let d = ran.report().device(0).clone();
    assert_eq!((d.used, d.allocs), (100, 1), "{d:?}");
    assert!(!ran.stderr().contains("null address"), "{}", ran.stderr());
    // A faulty driver: success and 0 for 4 MiB.
    let ran = Run::sim(
        "simrun",
        &[
            "drv.init",
            "drv.ctx:0",
            "drv.alloc:a:4194304",
            "drv.alloc:b:4194304",
        ],
    )
    .env("FAKECUDA_NULL_ADDRESS", "1")
    .run()
    .ok();
    let d = ran.report().device(0).clone();
    assert_eq!((d.used, d.peak, d.allocs, d.frees), (0, 0, 0, 0), "{d:?}");
    assert_eq!(
        ran.stderr().matches("null address").count(),
        1,
        "said once: {}",
        ran.stderr()
    );
}

#[test]
fn sizes_that_are_not_whole_bytes_and_counts_out_of_range_stop_the_program() {
    for (name, value, says) in [
        ("GPUMEMHOOK_LIMIT", "0.5B", "whole number of bytes"),
        ("GPUMEMHOOK_LIMIT", "1e3", "exponents"),
        ("GPUMEMHOOK_LIMIT_0", "0.1GiB", "whole number of bytes"),
    ] {
        let ran = Run::sim("simrun", &ALLOCATE).env(name, value).run();
        assert_eq!(ran.output.status.code(), Some(2), "{name}={value}");
        let stderr = ran.stderr();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(name) && stderr.contains(says), "{stderr}");
    }
    // Space around a value is ignored, as the docs say.
    Run::sim("simrun", &ALLOCATE)
        .env("GPUMEMHOOK_LIMIT", " 1.5KiB ")
        .run()
        .ok();
}

/// A copy of `simrun` in `dir` under a 250-byte name: every live allocation of its exit report
/// names that module, so that with [`MANY_LIVE`] the report (about 380 KB) and the timeline (2 MB)
/// are larger than what a Unix socket's send buffer takes (about 200 KB by default).
fn simrun_with_a_long_name(dir: &Path) -> std::path::PathBuf {
    let program = dir.join(format!("simrun-{}", "x".repeat(243)));
    std::fs::copy(gpumemhook_tests::sim_dir().join("simrun"), &program).unwrap();
    program
}

/// Allocations until the 2 MiB ceiling refuses: 8192 live blocks, a report listing 1000 of them.
const MANY_LIVE: [&str; 3] = ["drv.init", "drv.ctx:0", "race:1:256"];

/// Runs `program` with [`MANY_LIVE`] and `variable` set to `path` (waiting at most 60 s); its exit
/// status, its stderr, and how long it ran.
fn run_writing_to(
    program: &Path,
    variable: &str,
    path: &Path,
) -> (std::process::ExitStatus, String, std::time::Duration) {
    let (mut command, _) = Run::program(program, "simrun")
        .env("GPUMEMHOOK_LIMIT", "2MiB")
        .env(variable, path)
        .into_command();
    command.args(MANY_LIVE);
    exit_within(
        command,
        std::time::Duration::from_secs(60),
        &format!(
            "the program hung at its exit writing {variable} to {}",
            path.display()
        ),
    )
}

/// Runs `command` (stdout discarded) and waits for it at most `limit`, killing it and failing with
/// `hung` past that; its exit status, its stderr and how long it ran.
fn exit_within(
    mut command: std::process::Command,
    limit: std::time::Duration,
    hung: &str,
) -> (std::process::ExitStatus, String, std::time::Duration) {
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{hung}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr, elapsed)
}

/// The hook's lines in `stderr`.
fn hook_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("gpumemhook:"))
        .collect()
}

/// Connects to the socket at `path` without waiting; true when the connection was queued, false
/// when the listener's backlog is full.
fn queue_a_connection(path: &Path) -> bool {
    // SAFETY: socket only makes a descriptor, checked below.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    assert!(raw >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: zeroes are a valid sockaddr_un; the name is copied in below, NUL-terminated.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, &from) in address.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *to = from as libc::c_char;
    }
    // SAFETY: a valid sockaddr_un and its size. The descriptor is leaked on purpose: the queued
    // connection stays for the rest of the test process.
    let rc = unsafe {
        libc::connect(
            raw,
            (&address as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    let e = std::io::Error::last_os_error();
    match rc {
        0 => true,
        _ if e.raw_os_error() == Some(libc::EAGAIN) => false,
        _ => panic!("connect: {e}"),
    }
}

#[test]
fn a_socket_whose_listener_never_reads_delays_the_exit_by_at_most_five_seconds() {
    let dir = scratch("socket-stalled");
    let program = simrun_with_a_long_name(&dir);
    for variable in ["GPUMEMHOOK_REPORT", "GPUMEMHOOK_TRACE"] {
        // What the program takes with a file there: the bound is on top of that.
        let file = dir.join(format!("{variable}.json"));
        let (status, stderr, baseline) = run_writing_to(&program, variable, &file);
        assert!(status.success(), "{status:?}: {stderr}");
        assert!(
            std::fs::metadata(&file).unwrap().len() > 300_000,
            "the {variable} file must be larger than a socket's buffer"
        );
        // A collector that listens but never accepts, so never reads: the connection is queued
        // and the writes fill its buffer.
        let socket = dir.join(format!("{variable}.sock"));
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let (status, stderr, elapsed) = run_writing_to(&program, variable, &socket);
        assert!(status.success(), "{status:?}: {stderr}");
        let said = hook_lines(&stderr);
        assert_eq!(said.len(), 1, "one line: {stderr}");
        assert!(said[0].contains("stopped reading"), "{stderr}");
        assert!(
            elapsed < baseline + std::time::Duration::from_secs(7),
            "{variable}: {elapsed:?} against {baseline:?} with a file"
        );
        assert!(kind(&socket).is_socket());
    }
}

#[test]
fn a_socket_with_a_full_backlog_or_no_listener_is_said_at_once() {
    let dir = scratch("socket-full");
    let program = simrun_with_a_long_name(&dir);
    for variable in ["GPUMEMHOOK_REPORT", "GPUMEMHOOK_TRACE"] {
        let socket = dir.join(format!("{variable}.sock"));
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        // A backlog of none, filled by connections nobody accepts (a stuck collector).
        let listening = std::os::fd::AsRawFd::as_raw_fd(&listener);
        // SAFETY: listen on a socket the listener owns, to shorten its queue.
        let rc = unsafe { libc::listen(listening, 0) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        assert!(
            (0..16).any(|_| !queue_a_connection(&socket)),
            "the backlog never filled"
        );
        let (status, stderr, elapsed) = run_writing_to(&program, variable, &socket);
        assert!(status.success(), "{status:?}: {stderr}");
        let said = hook_lines(&stderr);
        assert_eq!(said.len(), 1, "one line: {stderr}");
        assert!(said[0].contains("backlog is full"), "{stderr}");
        assert!(
            elapsed < std::time::Duration::from_secs(7),
            "a full backlog is said at once, not waited on: {elapsed:?}"
        );
        // The socket file of a listener that is gone: nobody listens.
        drop(listener);
        let (status, stderr, _) = run_writing_to(&program, variable, &socket);
        assert!(status.success(), "{status:?}: {stderr}");
        let said = hook_lines(&stderr);
        assert_eq!(said.len(), 1, "one line: {stderr}");
        assert!(said[0].contains("no process listens on"), "{stderr}");
    }
}

/// The permission bits of `path`.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Runs [`ALLOCATE`] with the exit report at `report`, with `umask`, as this user or (`as_nobody`,
/// when this user is root) as nobody.
fn report_with(report: &Path, umask: libc::mode_t, as_nobody: bool) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let (mut command, _) = Run::sim("simrun", &ALLOCATE)
        .env("GPUMEMHOOK_REPORT", report)
        .into_command();
    // SAFETY: umask, setgid and setuid are async-signal-safe, and touch nothing of the parent.
    unsafe {
        command.pre_exec(move || {
            libc::umask(umask);
            if as_nobody && (libc::setgid(65534) != 0 || libc::setuid(65534) != 0) {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.output().unwrap()
}

#[test]
fn a_report_over_an_existing_file_keeps_its_mode_and_a_new_one_follows_the_umask() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = scratch("modes");
    // A private report stays private.
    let private = dir.join("private.json");
    std::fs::write(&private, "old").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = report_with(&private, 0o022, false);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mode(&private), 0o600);
    let report: Snapshot = serde_json::from_slice(&std::fs::read(&private).unwrap()).unwrap();
    assert_eq!(report.device(0).used, 100);
    // A new file: 0666 less the umask, as a shell's `>` makes it.
    for (umask, want) in [(0o077, 0o600), (0o022, 0o644)] {
        let new = dir.join(format!("new-{umask:o}.json"));
        let out = report_with(&new, umask, false);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(mode(&new), want, "umask {umask:o}");
    }
    // A file this user may not write is refused and left as it was. As root, every file is
    // writable: the refusal is tried as nobody, and root's own write over a file of nobody's keeps
    // its owner, group and mode.
    // SAFETY: geteuid cannot fail and reads only this process's credentials.
    let root = unsafe { libc::geteuid() } == 0;
    let read_only = dir.join("read-only.json");
    std::fs::write(&read_only, "old").unwrap();
    std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o444)).unwrap();
    let out = report_with(&read_only, 0o022, root);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr.contains("exists and this user may not write it"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&read_only).unwrap(), "old");
    assert_eq!(mode(&read_only), 0o444);
    if root {
        let theirs = dir.join("theirs.json");
        std::fs::write(&theirs, "old").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let out = report_with(&theirs, 0o022, false);
        assert!(out.status.success(), "{out:?}");
        let meta = std::fs::metadata(&theirs).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), mode(&theirs)),
            (65534, 65534, 0o640)
        );
        assert_ne!(std::fs::read_to_string(&theirs).unwrap(), "old");
    }
}

#[test]
fn a_variable_that_is_no_setting_is_said_once_with_the_setting_it_meant() {
    for (name, meant) in [
        ("GPUMEMHOOK_LIMITS", "GPUMEMHOOK_LIMIT"),
        ("GPUMEMHOOK_limit", "GPUMEMHOOK_LIMIT"),
        // The prefix itself a near miss: no longer ignored without a word.
        ("GPUMEMHOK_LIMIT", "GPUMEMHOOK_LIMIT"),
    ] {
        let line = format!("gpumemhook: {name} is not a setting; did you mean {meant}?");
        // Not a ceiling: 200 bytes are allocated under a "ceiling" of 100.
        let ran = Run::sim("simrun", &ALLOCATE)
            .env(name, "100")
            .arg("rt.malloc:b:200")
            .run()
            .ok();
        assert_eq!(
            ran.stderr().lines().filter(|l| *l == line).count(),
            1,
            "{}",
            ran.stderr()
        );
        // Under `gpumemhook run`, said once as well: by the hook, not again by the CLI.
        let dir = scratch("not-a-setting-cli");
        let sim = gpumemhook_tests::sim_dir().join("simrun");
        let out = cli(&dir, &["run", "--", sim.to_str().unwrap()])
            .args(ALLOCATE)
            .env(name, "100")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(stderr.lines().filter(|l| *l == line).count(), 1, "{stderr}");
    }
    // The settings, and the variables the test harness itself sets, are said nothing of.
    let ran = Run::sim("simrun", &ALLOCATE)
        .env("GPUMEMHOOK_LIMIT", "1GiB")
        .env("GPUMEMHOOK_TEST_RUNNER", "")
        .run()
        .ok();
    assert!(
        !ran.stderr().contains("is not a setting"),
        "{}",
        ran.stderr()
    );
}

#[test]
fn the_report_on_stdout_comes_after_what_c_stdio_still_held() {
    let dir = scratch("stdout-buffered");
    let link = dir.join("out.json");
    std::os::unix::fs::symlink("/proc/self/fd/1", &link).unwrap();
    for target in [
        Path::new("/dev/stdout"),
        Path::new("/proc/self/fd/1"),
        &link,
    ] {
        let log = dir.join("log.txt");
        // Text without a newline: still in stdio's buffer when the exit handlers run.
        let (mut command, _) = Run::sim(
            "simrun",
            &[&ALLOCATE[..], &["print.partial:unflushed"]].concat(),
        )
        .env("GPUMEMHOOK_REPORT", target)
        .into_command();
        let status = command
            .stdout(std::fs::File::create(&log).unwrap())
            .status()
            .unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.starts_with("unflushed{\n"),
            "{}: the program's text comes first:\n{text}",
            target.display()
        );
        assert_eq!(report_on_stdout(&text).device(0).used, 100);
    }
}

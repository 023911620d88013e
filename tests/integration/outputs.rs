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
    let (mut command, _) = Run::sim("simrun", &["drv.init", "drv.ctx:0", "race:1:1024"])
        .env("GPUMEMHOOK_REPORT", &fifo)
        .env("GPUMEMHOOK_LIMIT", "2MiB")
        .into_command();
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
        if start.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the program hung at its exit writing to a FIFO nobody reads");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
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
fn dev_fd_naming_the_hooks_own_segment_is_refused_and_the_segment_kept() {
    // The segment's descriptor is the first the hook opens; `/dev/fd/N` for each N from 3 to 9
    // names it for one of them (the others are not open: "not open" errors).
    for fd in 3..10 {
        let ran = Run::sim("simrun", &[&ALLOCATE[..], &["print.used:0"]].concat())
            .env("GPUMEMHOOK_REPORT", format!("/dev/fd/{fd}"))
            .run()
            .ok();
        if ran.stderr().contains("a gpumemhook segment") {
            // The program ran to its end with its counts intact (the report was not written over
            // the segment while it was live).
            assert!(
                ran.stdout().contains("used dev=0 bytes=100"),
                "{}",
                ran.stdout()
            );
            return;
        }
    }
    panic!("no /dev/fd/N from 3 to 9 named the segment");
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
        (
            "GPUMEMHOOK_TRACE_EVENTS",
            "99999999999999",
            "from 1 to 4294967296",
        ),
        ("GPUMEMHOOK_TRACE_EVENTS", "1e6", "from 1 to 4294967296"),
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
        .env("GPUMEMHOOK_TRACE_EVENTS", " 1000 ")
        .run()
        .ok();
}

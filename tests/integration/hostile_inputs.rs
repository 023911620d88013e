//! The readers (`report`, `plot`, `view`, `export`) on inputs that are no timeline, or a timeline
//! made to cost: devices that never end, a huge file of zeros, a FIFO with no writer or a junk
//! writer, a timeline followed by a terabyte of holes, forged files of millions of strings, open
//! scopes or thread records. Each is refused or read within a time bound and a bound on memory
//! measured by `wait4`, every command run under `timeout` and an address-space limit so that a
//! reader that fails the bound is stopped rather than left to take the machine.

use gpumemhook_segment::{
    EventKind, EventRecord, Record, TextClass, CHUNK_BYTES, RECORDING_HEADER_BYTES,
    RECORDS_PER_CHUNK, RECORD_BYTES,
};
use gpumemhook_tests::{cli, measured, measured_rss, scratch, wrapped, Run};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The address space a reader is given here: far more than any bound below, far less than what
/// an unbounded reader would take of the machine.
const ADDRESS_SPACE: &str = "--as=2147483648";

/// What one command did: its exit code, stderr, wall time and peak resident memory (KiB).
struct Bounded {
    code: Option<i32>,
    stderr: String,
    stdout: String,
    took: Duration,
    rss_kib: i64,
}

/// Starts `gpumemhook ARGS` in `dir`, killed after `limit_s`, under the address-space limit, its
/// peak memory measured ([`measured`]).
fn start(dir: &Path, args: &[&str], limit_s: u32, name: &str) -> (std::process::Child, Instant) {
    let prefix: Vec<OsString> = ["prlimit", ADDRESS_SPACE, "--"]
        .iter()
        .map(OsString::from)
        .collect();
    let limited = wrapped(&cli(dir, args), &prefix);
    let mut command = measured(&limited, limit_s, &dir.join(format!("{name}.rss")));
    let file = |suffix: &str| std::fs::File::create(dir.join(format!("{name}.{suffix}"))).unwrap();
    command
        .stdout(Stdio::from(file("out")))
        .stderr(Stdio::from(file("err")));
    (command.spawn().expect("gpumemhook starts"), Instant::now())
}

/// Waits for a command [`start`] started.
fn finish(dir: &Path, started: (std::process::Child, Instant), name: &str) -> Bounded {
    let (mut child, at) = started;
    let status = child.wait().expect("the measurer ends");
    let took = at.elapsed();
    let read = |suffix: &str| {
        std::fs::read_to_string(dir.join(format!("{name}.{suffix}"))).unwrap_or_default()
    };
    Bounded {
        code: status.code(),
        stderr: read("err"),
        stdout: read("out"),
        took,
        rss_kib: measured_rss(&dir.join(format!("{name}.rss"))),
    }
}

/// `gpumemhook ARGS`, bounded.
fn bounded(dir: &Path, args: &[&str], limit_s: u32) -> Bounded {
    let started = start(dir, args, limit_s, "run");
    finish(dir, started, "run")
}

/// Each reading command on `input`, writing into `dir`.
fn readers(dir: &Path, input: &Path) -> Vec<Vec<String>> {
    let input = input.to_str().unwrap().to_string();
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    vec![
        vec!["report".into(), input.clone()],
        vec!["plot".into(), input.clone(), "-o".into(), out("p.png")],
        vec!["view".into(), input.clone(), "-o".into(), out("v.html")],
        vec![
            "export".into(),
            input,
            "--perfetto".into(),
            out("e.pftrace"),
        ],
    ]
}

/// Asserts that `ran` was a refusal in one line that says `says`.
fn refused_in_one_line(ran: &Bounded, what: &str, says: &str) {
    assert_eq!(ran.code, Some(1), "{what}: {}", ran.stderr);
    assert_eq!(ran.stderr.lines().count(), 1, "{what}: {}", ran.stderr);
    assert!(ran.stderr.contains(says), "{what}: {}", ran.stderr);
    assert!(ran.rss_kib < 32 * 1024, "{what}: {} KiB", ran.rss_kib);
}

#[test]
fn devices_that_never_end_and_huge_files_of_zeros_are_refused_in_one_line_within_a_second() {
    let dir = scratch("hostile-devices");
    let zeros = dir.join("zeros");
    std::fs::File::create(&zeros)
        .unwrap()
        .set_len(6 << 30)
        .unwrap();
    // JSON's first byte, then 6 GiB of zeros: not read whole.
    let json_then_zeros = dir.join("json-then-zeros");
    std::fs::write(&json_then_zeros, b"{").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&json_then_zeros)
        .unwrap()
        .set_len(6 << 30)
        .unwrap();
    let inputs = [
        (PathBuf::from("/dev/zero"), "starts with bytes 00 00"),
        (PathBuf::from("/dev/urandom"), ""),
        (zeros, "starts with bytes 00 00"),
        (json_then_zeros, "not a gpumemhook timeline"),
    ];
    for (input, says) in &inputs {
        for args in readers(&dir, input) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let ran = bounded(&dir, &args, 20);
            let what = args.join(" ");
            refused_in_one_line(&ran, &what, says);
            assert!(ran.took < Duration::from_secs(1), "{what}: {:?}", ran.took);
        }
    }
}

/// Makes a FIFO at `path`.
fn fifo(path: &Path) {
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that lives through the call.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_fifo_no_one_writes_to_is_given_up_after_ten_seconds_in_one_line() {
    let dir = scratch("hostile-fifo");
    let path = dir.join("fifo");
    fifo(&path);
    // The four readers wait at once: ten seconds in all, not forty.
    let started: Vec<_> = readers(&dir, &path)
        .into_iter()
        .enumerate()
        .map(|(i, args)| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (args.join(" "), start(&dir, &args, 30, &format!("r{i}")))
        })
        .collect();
    for (i, (what, started)) in started.into_iter().enumerate() {
        let ran = finish(&dir, started, &format!("r{i}"));
        refused_in_one_line(&ran, &what, "nothing came in 10 s");
        let took = ran.took.as_secs_f64();
        assert!((9.5..20.0).contains(&took), "{what}: {took} s");
    }
}

#[test]
fn a_fifo_whose_writer_sends_junk_is_refused_in_one_line() {
    let dir = scratch("hostile-junk");
    let path = dir.join("fifo");
    fifo(&path);
    let writer = {
        let path = path.clone();
        // Bytes that are no UTF-8 and no format, for as long as the reader reads.
        std::thread::spawn(move || {
            let junk: Vec<u8> = (0..1 << 16).map(|i| (i * 131 % 251) as u8 | 0x80).collect();
            let mut fifo = std::fs::File::options().write(true).open(&path).unwrap();
            while std::io::Write::write_all(&mut fifo, &junk).is_ok() {}
        })
    };
    let ran = bounded(&dir, &["report", path.to_str().unwrap()], 20);
    refused_in_one_line(
        &ran,
        "report of junk",
        "not a gpumemhook timeline or report",
    );
    assert!(!ran.stderr.contains("UTF-8"), "{}", ran.stderr);
    assert!(ran.took < Duration::from_secs(2), "{:?}", ran.took);
    writer.join().unwrap();
}

/// A small real timeline (two threads, 6,000 events) in `dir`.
fn real_timeline(name: &str) -> (PathBuf, PathBuf) {
    let run = Run::sim(
        "simrun",
        &["drv.init", "drv.ctx:0", "threads:2:3000:7:65536"],
    );
    let dir = run.dir().to_path_buf();
    let trace = dir.join(name);
    run.env("GPUMEMHOOK_TRACE", &trace).run().ok();
    (dir, trace)
}

#[test]
fn a_timeline_followed_by_a_terabyte_of_holes_is_read_without_walking_them() {
    let (dir, trace) = real_timeline("t.trace");
    let holed = dir.join("holed.trace");
    std::fs::copy(&trace, &holed).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&holed)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let whole = bounded(&dir, &["report", trace.to_str().unwrap()], 20);
    let ran = bounded(&dir, &["report", holed.to_str().unwrap()], 20);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(ran.took < Duration::from_secs(2), "{:?}", ran.took);
    assert!(ran.rss_kib < 32 * 1024, "{} KiB", ran.rss_kib);
    // The same figures as the file without its holes.
    let figures = |b: &Bounded| b.stdout.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(figures(&ran), figures(&whole));
    assert!(ran.stdout.contains("6,000 events"), "{}", ran.stdout);
}

/// The words of one record, as the file holds them.
fn put(chunk: &mut [u8], index: u64, record: Record) {
    let at = (index * RECORD_BYTES) as usize;
    chunk[at..at + RECORD_BYTES as usize].copy_from_slice(&record.to_le_bytes());
}

/// Appends to the timeline at `path` whole chunks of thread 4242 filled with `count` records
/// that `record` makes (given its number), after each chunk's own first record; a chunk at a time,
/// so that this process stays small (its peak would count in the reader's, see `start`).
fn append_forged(path: &Path, count: u64, record: impl Fn(u64) -> Record) {
    let mut file = std::fs::File::options().append(true).open(path).unwrap();
    let len = file.metadata().unwrap().len();
    let whole = (len - RECORDING_HEADER_BYTES).div_ceil(CHUNK_BYTES);
    file.set_len(RECORDING_HEADER_BYTES + whole * CHUNK_BYTES)
        .unwrap();
    let mut made = 0;
    let mut chunk = vec![0u8; CHUNK_BYTES as usize];
    while made < count {
        chunk.fill(0);
        let head = Record::Chunk {
            tid: 4242,
            clock_ns: 1_000,
        };
        put(&mut chunk, 0, head);
        for index in 1..RECORDS_PER_CHUNK {
            if made == count {
                break;
            }
            put(&mut chunk, index, record(made));
            made += 1;
        }
        std::io::Write::write_all(&mut file, &chunk).unwrap();
    }
}

#[test]
fn forged_strings_scopes_and_thread_records_cost_no_more_memory_than_the_real_events() {
    const FORGED: u64 = 2_000_000;
    let (dir, trace) = real_timeline("t.trace");
    let strings = |n: u64| Record::Text {
        class: Some(TextClass::Site),
        number: (n % (1 << 24)) as u32,
        len: 0,
    };
    let scope = |n: u64| {
        Record::Event(EventRecord {
            kind: EventKind::ScopeOpen as u8,
            address: n + 1_000,
            ..EventRecord::default()
        })
    };
    let threads = |n: u64| Record::Thread {
        tid: (5_000 + n) as u32,
        clock_ns: 2_000,
    };
    type Forge = fn(u64) -> Record;
    let forged: [(&str, Forge); 3] = [
        ("empty strings", strings),
        ("open scopes", scope),
        ("thread records", threads),
    ];
    for command in ["report", "view"] {
        let args = |input: &Path| {
            let mut args = vec![command.to_string(), input.to_str().unwrap().to_string()];
            if command == "view" {
                args.extend(["-o".into(), dir.join("v.html").to_str().unwrap().into()]);
            }
            args
        };
        let run = |input: &Path| {
            let args = args(input);
            bounded(
                &dir,
                &args.iter().map(String::as_str).collect::<Vec<_>>(),
                60,
            )
        };
        let real = run(&trace);
        assert_eq!(real.code, Some(0), "{}", real.stderr);
        for (what, record) in forged {
            let path = dir.join(what.replace(' ', "-"));
            std::fs::copy(&trace, &path).unwrap();
            append_forged(&path, FORGED, record);
            let ran = run(&path);
            assert_eq!(ran.code, Some(0), "{command} of {what}: {}", ran.stderr);
            assert!(ran.took < Duration::from_secs(30), "{what}: {:?}", ran.took);
            // Two million forged records, 64 MiB of file: 16 MiB more than the real file's.
            assert!(
                ran.rss_kib < real.rss_kib + 16 * 1024,
                "{command} of {what}: {} KiB, the real timeline {} KiB",
                ran.rss_kib,
                real.rss_kib
            );
        }
    }
}

#[test]
fn forged_refusals_cost_plot_and_view_only_the_first_and_last_they_draw() {
    const FORGED: u64 = 2_000_000;
    let (dir, trace) = real_timeline("t.trace");
    let refusal = |n: u64| {
        Record::Event(EventRecord {
            kind: EventKind::Denied as u8,
            delta_ns: 1_000,
            bytes: 4096 + n % 100,
            used: 1 << 20,
            ..EventRecord::default()
        })
    };
    let path = dir.join("refusals.trace");
    std::fs::copy(&trace, &path).unwrap();
    append_forged(&path, FORGED, refusal);
    for command in ["plot", "view"] {
        let output = dir.join(if command == "plot" { "p.png" } else { "v.html" });
        let run = |input: &Path| {
            let args = [
                command,
                input.to_str().unwrap(),
                "-o",
                output.to_str().unwrap(),
            ];
            bounded(&dir, &args, 60)
        };
        let real = run(&trace);
        assert_eq!(real.code, Some(0), "{}", real.stderr);
        let ran = run(&path);
        assert_eq!(ran.code, Some(0), "{command}: {}", ran.stderr);
        // Two million refusals, 64 MiB of file: each kept would take over 100 MiB.
        assert!(
            ran.rss_kib < real.rss_kib + 24 * 1024,
            "{command} of two million refusals: {} KiB, the real timeline {} KiB",
            ran.rss_kib,
            real.rss_kib
        );
    }
    // The page says how many it left out, and holds the first and last MARKS_KEPT.
    let page = std::fs::read_to_string(dir.join("v.html")).unwrap();
    let left_out = FORGED.saturating_sub(2 * gpumemhook_timeline::MARKS_KEPT as u64);
    assert!(
        page.contains(&format!("\"marks_left_out\":{left_out}")),
        "the page's data says {left_out} refusals left out"
    );
}

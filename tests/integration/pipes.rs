//! A reader that goes away (`gpumemhook ls | head -1`, or a pipe closed before the command
//! writes), of its standard output or its standard error: every command `gpumemhook --help` lists
//! ends quietly, by SIGPIPE as `ls` does (status 141 in a shell), or with its own status when all
//! it printed fit in the pipe before the reader left; never a panic ("failed printing to stdout")
//! and never an abort with a core (134).

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use crate::groups::{finish, Group, MIB};
use gpumemhook_tests::cli;

/// A pipe whose reading end is already closed: its writing end, for a child's stdout.
fn pipe_nobody_reads() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: pipe fills the two-element array; the result is checked.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just made and are owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

/// A quiet end: by SIGPIPE, with the command's own status, or with an error it says (a file
/// output such as `-o /dev/stdout` that cannot be written); never a panic (101, "panicked") or an
/// abort (134).
fn ended_quietly(what: &str, status: std::process::ExitStatus, stderr: &[u8]) {
    let err = String::from_utf8_lossy(stderr);
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(
        status.code().is_some_and(|c| c != 101 && c != 134)
            || status.signal() == Some(libc::SIGPIPE),
        "{what}: {status:?} {err}"
    );
}

/// Runs `command` with its stdout closed before it starts, then again with a reader that takes
/// 16 bytes and goes.
fn check(mut command: impl FnMut() -> Command, what: &str) {
    let out = command()
        .stdout(Stdio::from(pipe_nobody_reads()))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    ended_quietly(
        &format!("{what}, stdout closed before"),
        out.status,
        &out.stderr,
    );
    let mut child = command()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 16];
    let _ = child.stdout.take().unwrap().read(&mut head);
    let out = child.wait_with_output().unwrap();
    ended_quietly(
        &format!("{what}, reader gone after 16 bytes"),
        out.status,
        &out.stderr,
    );
}

/// The commands `gpumemhook --help` lists, `help` aside: what the tests below must cover.
fn commands_in_help(dir: &std::path::Path) -> Vec<String> {
    let help = cli(dir, &["--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout).into_owned();
    text.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|name| name != "help")
        .collect()
}

/// Runs `command` with its standard error a pipe nobody reads (its stdout thrown away).
fn check_stderr(mut command: impl FnMut() -> Command, what: &str) {
    let out = command()
        .stdout(Stdio::null())
        .stderr(Stdio::from(pipe_nobody_reads()))
        .output()
        .unwrap();
    ended_quietly(&format!("{what}, stderr closed before"), out.status, &[]);
}

#[test]
fn every_command_in_help_ends_quietly_when_its_reader_goes() {
    let g = Group::new("pipes");
    let member = g.member(
        &[
            format!("rt.malloc:a:{}", 100 * MIB),
            g.op("touch", "a"),
            g.op("wait", "end"),
        ],
        &[],
    );
    g.wait("a");
    let pid = member.id().to_string();
    let report = g.dir.join("report.json");
    let trace = g.dir.join("t.trace");
    std::fs::write(&report, "").unwrap();
    let ran = gpumemhook_tests::Run::sim("simrun", &["rt.malloc:x:4096", "rt.malloc:y:8192"])
        .env("GPUMEMHOOK_REPORT", &report)
        .env("GPUMEMHOOK_TRACE", &trace)
        .run();
    ran.ok();
    let (report, trace) = (report.display().to_string(), trace.display().to_string());
    let simrun = gpumemhook_tests::sim_dir()
        .join("simrun")
        .display()
        .to_string();
    let fit_op = "rt.malloc:x:{n}000000".to_string();
    // Each command of the help, with arguments that make it print (several for the listings).
    let table: Vec<(&str, Vec<&str>)> = vec![
        ("run", vec!["run", "--", &simrun, "rt.malloc:x:4096"]),
        ("ls", vec!["ls"]),
        ("ls", vec!["ls", "--json"]),
        ("top", vec!["top", "-n", "1"]),
        ("report", vec!["report", &report]),
        ("report", vec!["report", "--json", &trace]),
        (
            "plot",
            vec!["plot", &trace, "-o", "/dev/stdout", "--format", "svg"],
        ),
        ("limit", vec!["limit", &pid, "1GiB"]),
        ("reset-peak", vec!["reset-peak", &pid]),
        ("exporter", vec!["exporter", "--once"]),
        ("cards", vec!["cards"]),
        ("cards", vec!["cards", "--json"]),
        (
            "fit",
            vec![
                "fit", "--limit", "8MiB", "--param", "n=1..12", "--", &simrun, &fit_op,
            ],
        ),
        ("group", vec!["group", g.name]),
        ("kernel", vec!["kernel", "list"]),
        ("view", vec!["view", &trace, "-o", "/dev/stdout"]),
        ("export", vec!["export", &trace, "--chrome", "/dev/stdout"]),
        ("env", vec!["env"]),
    ];
    let missing: Vec<String> = commands_in_help(&g.dir)
        .into_iter()
        .filter(|name| !table.iter().any(|(n, _)| n == name))
        .collect();
    assert!(
        missing.is_empty(),
        "commands of --help this test does not run: {missing:?}"
    );
    for (_, args) in &table {
        check(|| cli(&g.dir, args), &args.join(" "));
        check_stderr(|| cli(&g.dir, args), &args.join(" "));
    }
    g.touch("end");
    finish(member);
}

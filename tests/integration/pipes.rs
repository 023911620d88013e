//! A reader that goes away (`gpumemhook ls | head -1`, or a pipe closed before the command
//! writes): every command that prints a listing ends quietly, by SIGPIPE as `ls` does (status 141
//! in a shell), or with 0 when all it printed fit in the pipe before the reader left; never a panic
//! ("failed printing to stdout") and never an abort with a core (134).

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

fn ended_quietly(what: &str, status: std::process::ExitStatus, stderr: &[u8]) {
    let err = String::from_utf8_lossy(stderr);
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
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

#[test]
fn every_listing_command_ends_quietly_when_its_reader_goes() {
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
    let report = g.dir.join("report.json");
    std::fs::write(&report, "").unwrap();
    let ran = gpumemhook_tests::Run::sim("simrun", &["rt.malloc:x:4096"])
        .env("GPUMEMHOOK_REPORT", &report)
        .run();
    ran.ok();
    let report = report.display().to_string();
    let commands: [&[&str]; 8] = [
        &["cards"],
        &["cards", "--json"],
        &["ls"],
        &["ls", "--json"],
        &["top", "-n", "1"],
        &["report", &report],
        &["group", g.name],
        &["kernel", "list"],
    ];
    for args in commands {
        check(|| cli(&g.dir, args), &args.join(" "));
    }
    g.touch("end");
    finish(member);
}

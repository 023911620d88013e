//! The group's accounting under a kill at every step (`src/tally.rs`): a member killed after each
//! step of an allocation and of a free, and a sweeper killed after each step of its sweep, leave a
//! group that the next sweep repairs exactly: `used` equals what the survivor holds, no slot stays
//! taken, no tally stays frozen, and that sweep takes milliseconds.
//!
//! Every actor is a real process on a real group file: this test binary runs again as the child
//! (the ignored test [`crash_child`], chosen by `GPUMEMHOOK_CRASH_CHILD`), joins the group, and
//! sends itself SIGKILL from the step observer at the step named. The code run is the product's
//! (`tally::change`, `GroupSegment::sweep`); only the observer is the test's.
#![cfg(not(loom))]

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpumemhook_reader::{current_uid, open_group, open_or_create_group, GroupMapping, Membership};
use gpumemhook_segment::tally::{self, Change, Step, Steps, MEMBER_STEPS, SWEEP_STEPS};
use gpumemhook_segment::NO_LIMIT;

const CHILD: &str = "GPUMEMHOOK_CRASH_CHILD";
const HELD: u64 = 100;
const DEAD_HOLDS: u64 = 1000;

/// Sends this process SIGKILL at one step.
struct KillAt(Step);

impl Steps for KillAt {
    fn after(&mut self, step: Step) -> ControlFlow<()> {
        if step == self.0 {
            // SAFETY: kill of this very process; it does not return.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        ControlFlow::Continue(())
    }
}

fn step_named(name: &str) -> Step {
    MEMBER_STEPS
        .iter()
        .chain(SWEEP_STEPS.iter())
        .copied()
        .find(|s| format!("{s:?}") == name)
        .expect("a step's name")
}

fn joined(dir: &Path, name: &str) -> GroupMapping {
    open_or_create_group(dir, current_uid(), name).expect("the group")
}

/// The child's part: `member:STEP:add|sub` or `sweeper:STEP` (a member that died holding
/// [`DEAD_HOLDS`] bytes is left for the sweeper by the parent).
#[test]
#[ignore = "the child process of the crash-point tests, run by them"]
fn crash_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let dir = PathBuf::from(std::env::var("GPUMEMHOOK_CRASH_DIR").unwrap());
    let words: Vec<&str> = spec.split(':').collect();
    match words[..] {
        ["member", step, kind] => {
            let me = joined(&dir, "g")
                .join(std::process::id(), 0)
                .expect("a slot");
            let device = &me.group.devices[0];
            device.take(me.slot(), 0, DEAD_HOLDS).expect("room");
            let change = if kind == "add" {
                Change::Add(50)
            } else {
                Change::Sub(DEAD_HOLDS)
            };
            let slot = me.slot();
            tally::change(
                &device.used,
                &slot.share,
                &slot.bytes[0],
                0,
                change,
                NO_LIMIT,
                &mut KillAt(step_named(step)),
            );
            // Step `Done` is the last: the kill above has happened.
        }
        ["dies"] => {
            let me = joined(&dir, "g")
                .join(std::process::id(), 0)
                .expect("a slot");
            me.group.devices[0]
                .take(me.slot(), 0, DEAD_HOLDS)
                .expect("room");
            // SAFETY: ends this process at once, its lock with it.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        ["sweeper", step] => {
            let mapping = open_group(&dir, current_uid(), "g").unwrap();
            mapping.sweep_with(&mut KillAt(step_named(step)));
        }
        _ => panic!("bad spec {spec}"),
    }
    std::process::exit(3); // not killed: the parent fails on the status
}

/// Runs the child part `spec` in `dir`; true when it was killed (as it must be).
fn child(dir: &Path, spec: &str) -> bool {
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, spec)
        .env("GPUMEMHOOK_CRASH_DIR", dir)
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(libc::SIGKILL)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumemhook-crash-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// This process as the survivor holding [`HELD`] bytes; checks, after one sweep by a reader,
/// that the group holds exactly that, with one live member and nothing frozen.
fn check_repaired(dir: &Path, survivor: &Membership, what: &str) {
    let reader = open_group(dir, current_uid(), "g").unwrap();
    let started = Instant::now();
    let stats = reader.stats(0);
    let took = started.elapsed();
    let g = reader.group();
    assert_eq!(stats.used, HELD, "{what}: used after the sweep");
    assert_eq!(
        stats.members.len(),
        1,
        "{what}: live members {:?}",
        stats.members
    );
    assert_eq!(g.devices[0].used.ticket(), 0, "{what}: left frozen");
    assert_eq!(
        survivor.slot().bytes[0].load(std::sync::atomic::Ordering::SeqCst),
        HELD
    );
    assert!(
        took < Duration::from_millis(500),
        "{what}: the sweep took {took:?}"
    );
}

#[test]
fn a_member_killed_after_any_step_of_a_change_is_repaired_exactly() {
    for kind in ["add", "sub"] {
        for step in MEMBER_STEPS {
            let dir = scratch(&format!("member-{kind}-{step:?}"));
            let survivor = joined(&dir, "g").join(std::process::id(), 0).unwrap();
            survivor.group.devices[0]
                .take(survivor.slot(), 0, HELD)
                .unwrap();
            assert!(
                child(&dir, &format!("member:{step:?}:{kind}")),
                "killed at {step:?}"
            );
            check_repaired(
                &dir,
                &survivor,
                &format!("member killed after {step:?} of an {kind}"),
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[test]
fn a_sweeper_killed_after_any_step_leaves_what_the_next_sweep_repairs() {
    for step in SWEEP_STEPS {
        let dir = scratch(&format!("sweeper-{step:?}"));
        let survivor = joined(&dir, "g").join(std::process::id(), 0).unwrap();
        survivor.group.devices[0]
            .take(survivor.slot(), 0, HELD)
            .unwrap();
        assert!(child(&dir, "dies"));
        assert_eq!(survivor.group.devices[0].used.get(), HELD + DEAD_HOLDS);
        assert!(
            child(&dir, &format!("sweeper:{step:?}")),
            "killed at {step:?}"
        );
        // The survivor allocates and frees meanwhile: a frozen tally holds it up only briefly.
        let started = Instant::now();
        survivor.group.devices[0]
            .take(survivor.slot(), 0, 7)
            .unwrap();
        survivor.group.devices[0].give(survivor.slot(), 0, 7);
        assert!(started.elapsed() < Duration::from_millis(500));
        check_repaired(&dir, &survivor, &format!("sweeper killed after {step:?}"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

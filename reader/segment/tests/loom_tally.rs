//! A `loom` model of the group's tally (`src/tally.rs`), running that module's own code over loom's
//! atomics (`src/sync.rs`): members changing the tally and their cells while a sweeper settles it.
//!
//! The state a dead member leaves is the worst one: it changed the tally and died before its cell
//! (so the tally is off by what it was adding, and nobody can tell from the two words). The
//! property: once every thread is done, `used` equals the sum of the live members' cells, and it is
//! open (no ticket left), whichever of the sweeps succeeded or gave up. A sweep that gives up
//! (its freeze lifted by a waiting member, or a change under way that outlasted its patience)
//! must change nothing; one that succeeds must give the exact sum.
//!
//! [`flawed_sweep`] is the order the sweep must not use: summing the live cells without first
//! freezing the tally and waiting for changes under way. The test asserts that loom finds the
//! allocation it loses, so the freeze is shown needed.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p gpumemhook-segment --test loom_tally
//! --target-dir target/loom` (`scripts/test` does).
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;

use gpumemhook_segment::sync::Patience;
use gpumemhook_segment::tally::{self, Change, LiveCells, NoSteps, Share, Tally};

struct Member {
    share: Share,
    bytes: AtomicU64,
    overhead: AtomicU64,
}

impl Member {
    fn new() -> Member {
        Member {
            share: Share {
                under_way: AtomicU64::new(0),
                devices: AtomicU64::new(0),
            },
            bytes: AtomicU64::new(0),
            overhead: AtomicU64::new(0),
        }
    }

    fn cells(&self) -> LiveCells<'_> {
        LiveCells {
            share: &self.share,
            bytes: &self.bytes,
            overhead: &self.overhead,
        }
    }

    fn change(&self, used: &Tally, change: Change) {
        tally::change(
            used,
            &self.share,
            &self.bytes,
            0,
            change,
            u64::MAX,
            &mut NoSteps,
        );
    }
}

struct Group {
    used: Tally,
    overhead: Tally,
    live: Member,
}

/// A group whose dead member added 64 to the tally and died before its cell; the live member
/// holds 10.
fn group() -> Arc<Group> {
    let g = Group {
        used: Tally::new(0),
        overhead: Tally::new(0),
        live: Member::new(),
    };
    g.live.change(&g.used, Change::Add(10));
    g.used.reset(g.used.get() + 64);
    Arc::new(g)
}

fn sweep(g: &Group, ticket: u64) -> bool {
    let patience = Patience::new(std::time::Duration::ZERO);
    tally::settle(
        &g.used,
        &g.overhead,
        ticket,
        std::iter::once(g.live.cells()),
        &patience,
        &mut NoSteps,
    )
}

/// Sums the live cells and stores the sum, without the freeze and the wait.
fn flawed_sweep(g: &Group) -> bool {
    let sum = g.live.bytes.load(SeqCst);
    g.used.reset(sum);
    true
}

fn check(g: &Group) {
    assert_eq!(g.used.ticket(), 0, "left frozen");
    let held = g.live.bytes.load(SeqCst);
    let used = g.used.get();
    // The dead member's 64 may stay (every sweep gave up), never anything else.
    assert!(
        used == held || used == held + 64,
        "used {used}, live cells {held}"
    );
}

fn member_against(sweeper: fn(&Group, u64) -> bool) {
    loom::model(move || {
        let g = group();
        let m = {
            let g = g.clone();
            thread::spawn(move || {
                g.live.change(&g.used, Change::Add(5));
                g.live.change(&g.used, Change::Sub(3));
            })
        };
        let swept = sweeper(&g, 1);
        m.join().unwrap();
        check(&g);
        if swept {
            // A sweep that succeeded removed the dead member's bytes for good.
            assert_eq!(g.used.get(), g.live.bytes.load(SeqCst));
        }
    });
}

#[test]
fn a_member_changing_while_a_sweep_settles_loses_nothing() {
    member_against(sweep);
}

#[test]
fn two_sweepers_at_once_settle_it_once_and_exactly() {
    loom::model(|| {
        let g = group();
        let other = {
            let g = g.clone();
            thread::spawn(move || sweep(&g, 2))
        };
        let mine = sweep(&g, 1);
        let theirs = other.join().unwrap();
        check(&g);
        if mine || theirs {
            assert_eq!(g.used.get(), 10);
        }
    });
}

#[test]
fn the_sweep_without_its_freeze_is_caught() {
    let caught = std::panic::catch_unwind(|| member_against(|g, _| flawed_sweep(g)));
    assert!(
        caught.is_err(),
        "loom found no lost change in the flawed sweep"
    );
}

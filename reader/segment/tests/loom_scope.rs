//! `loom` models of the scope protocol, running this crate's own code over loom's atomics
//! (`src/sync.rs`): the slot state machine and the window restart (`src/window.rs`: `claim`,
//! `open`, `reset`, `repair`, `restart_window`, `fold_marked`), which process and group scopes
//! share, and the process's floor word (`src/floor.rs`: `commit`, `changing`).
//!
//! Each model is one device and one scope slot. Its table ([`Table`]) supplies what a layout
//! supplies in the product (`Slots`: where the state word is, how a slot is marked, how its window
//! is restarted: `restart_window` alone, as a group's; or inside a floor change, as a process's).
//! Members allocate as the hook does: the add to `used`, then, for a group, `read_marks` and
//! `fold_marked`; for a process, `floor::commit` with its ticket.
//!
//! The property: once every thread is done, the scope is OPEN and its peak is exactly `used` (the
//! allocations only add, so that is the most `used` reached after its base was read): no
//! allocation is lost, a reset leaves no peak from before it, and a repair completes a dead
//! actor's open exactly once, however many repairers race.
//!
//! The negative controls show the orders needed: a restart that reads the base before zeroing the
//! peak ([`Restart::BaseFirst`]), and a process's restart made outside a floor change
//! ([`Restart::Unbracketed`]), which leaves standing a floor that a fold from before the reset
//! raised. loom must find the allocation each one loses.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p gpumemhook-segment --test loom_scope
//! --target-dir target/loom` (`scripts/test` does).
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;

use gpumemhook_segment::floor;
use gpumemhook_segment::sync::Patience;
use gpumemhook_segment::window::{self, SlotError, Slots, SCOPE_OPEN, SCOPE_OPENING};

/// An actor token `Table::alive` calls dead.
const DEAD: u64 = 99;

/// How the table restarts a window.
#[derive(Clone, Copy, PartialEq)]
enum Restart {
    /// `window::restart_window`, as a group's slot.
    Group,
    /// `window::restart_window` inside `floor::changing`, as a process's slot.
    Process,
    /// The order that must not be used: the base read, then the peak zeroed.
    BaseFirst,
    /// A process's restart without the floor change around it.
    Unbracketed,
}

/// One device and one scope slot.
struct Table {
    restart: Restart,
    used: AtomicU64,
    marks: AtomicU64,
    state: AtomicU64,
    peak: AtomicU64,
    base: AtomicU64,
    floor: AtomicU64,
    entries: [AtomicU64; 1],
}

impl Table {
    fn new(restart: Restart, used: u64) -> Table {
        Table {
            restart,
            used: AtomicU64::new(used),
            marks: AtomicU64::new(0),
            state: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            base: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            entries: [AtomicU64::new(0)],
        }
    }

    /// A scope already open, its peak at `peak` from before.
    fn opened(restart: Restart, used: u64, peak: u64) -> Table {
        let t = Table::new(restart, used);
        t.marks.store(1, SeqCst);
        t.state.store(SCOPE_OPEN, SeqCst);
        t.peak.store(peak, SeqCst);
        t
    }

    /// A group member's allocation.
    fn allocate_in_group(&self, bytes: u64) {
        let new_used = self.used.fetch_add(bytes, SeqCst) + bytes;
        let marks = window::read_marks(&self.marks);
        window::fold_marked(marks, 0, new_used, |slot| (slot == 0).then_some(&self.peak));
    }

    /// A process's allocation: ticket, count, commit (the hook counts in `used` at the commit).
    fn allocate_in_process(&self, bytes: u64) {
        let ticket = floor::ticket(&self.floor);
        let new_used = self.used.fetch_add(bytes, SeqCst) + bytes;
        let any_open = || window::read_marks(&self.marks) != 0;
        floor::commit(&self.floor, any_open, new_used, ticket, || {
            window::fold_marked(self.marks.load(SeqCst), 0, new_used, |slot| {
                (slot == 0).then_some(&self.peak)
            })
        });
    }

    fn restart_window(&self) {
        window::restart_window(&self.peak, &self.base, || self.used.load(SeqCst));
    }
}

impl Slots for Table {
    fn count(&self) -> usize {
        1
    }

    fn state(&self, _index: usize) -> &AtomicU64 {
        &self.state
    }

    fn mark(&self, _index: usize) {
        self.marks.fetch_or(1, SeqCst);
    }

    fn unmark(&self, _index: usize) {
        self.marks.fetch_and(!1, SeqCst);
    }

    fn restart(&self, _index: usize, actor: u64) -> Result<(), SlotError> {
        match self.restart {
            Restart::Group => self.restart_window(),
            Restart::Process => {
                let floors = || std::iter::once(&self.floor);
                let patience = Patience::new(std::time::Duration::ZERO);
                let alive = |a| a != DEAD;
                floor::changing(&self.entries, floors, actor, alive, &patience, || {
                    self.restart_window()
                })?;
            }
            Restart::Unbracketed => self.restart_window(),
            Restart::BaseFirst => {
                let used = self.used.load(SeqCst);
                self.base.store(used, SeqCst);
                self.peak.store(0, SeqCst);
                window::fold_max(&self.peak, used);
            }
        }
        Ok(())
    }

    fn alive(&self, actor: u64) -> bool {
        actor != DEAD
    }
}

/// What the actor does to the scope while members allocate 10 and 20.
#[derive(Clone, Copy)]
enum Act {
    Open,
    Reset,
    /// Two repairers finish an open a dead actor left OPENING.
    Repair,
}

fn model(restart: Restart, act: Act) {
    loom::model(move || {
        let table = Arc::new(match act {
            Act::Open => Table::new(restart, 100),
            // Open with a peak of 500 from before the reset.
            Act::Reset => Table::opened(restart, 100, 500),
            Act::Repair => {
                let t = Table::opened(restart, 100, 500);
                t.state.store(window::state(SCOPE_OPENING, DEAD), SeqCst);
                t
            }
        });
        // Two members racing each other and the actor; one (allocating twice) where the actor's
        // side is already long (a floor change, or a second repairer), to keep the model small.
        let sizes: &[&[u64]] = match (restart, act) {
            (Restart::Process, _) | (_, Act::Repair) => &[&[10, 20]],
            _ => &[&[10], &[20]],
        };
        let members: Vec<_> = sizes
            .iter()
            .map(|&sizes| {
                let table = table.clone();
                thread::spawn(move || {
                    for &bytes in sizes {
                        match restart {
                            Restart::Process => table.allocate_in_process(bytes),
                            _ => table.allocate_in_group(bytes),
                        }
                    }
                })
            })
            .collect();
        let second = matches!(act, Act::Repair).then(|| {
            let table = table.clone();
            thread::spawn(move || window::repair(&*table, 2))
        });
        let patience = Patience::new(std::time::Duration::ZERO);
        let acted = match act {
            Act::Open => window::claim(&*table, 1).and_then(|i| window::open(&*table, i, 1)),
            Act::Reset => window::reset(&*table, 0, 1, &|| true, &patience),
            Act::Repair => {
                window::repair(&*table, 1);
                Ok(())
            }
        };
        for t in members.into_iter().chain(second) {
            t.join().unwrap();
        }
        // A process's restart may find the change entry held by the other side's (bounded
        // patience): then nothing was changed, and the scope is as it was.
        if acted == Err(SlotError::Busy) {
            return;
        }
        acted.unwrap();
        let (peak, used) = (table.peak.load(SeqCst), table.used.load(SeqCst));
        assert_eq!(table.state.load(SeqCst), SCOPE_OPEN, "the scope is open");
        assert!(
            peak >= used,
            "an allocation was lost: peak {peak} below used {used}"
        );
        assert_eq!(peak, used, "a peak from before the restart stayed");
        assert!(table.base.load(SeqCst) <= used);
    });
}

/// A scope is open; one thread allocates 100 bytes, then 50, as a process does. Another frees the
/// 100 once they are allocated, then resets the scope. Whatever the interleaving, the scope's peak
/// must cover `used` at the end: a floor raised by a fold made before the reset, and left standing
/// after it, would let the 50 skip the reset scope.
fn free_then_reset(restart: Restart) {
    loom::model(move || {
        let table = Arc::new(Table::opened(restart, 0, 0));
        let allocator = {
            let table = table.clone();
            thread::spawn(move || {
                table.allocate_in_process(100);
                table.allocate_in_process(50);
            })
        };
        while table.used.load(SeqCst) < 100 {
            thread::yield_now();
        }
        table.used.fetch_sub(100, SeqCst);
        let patience = Patience::new(std::time::Duration::ZERO);
        let reset = window::reset(&*table, 0, 1, &|| true, &patience);
        allocator.join().unwrap();
        assert_eq!(reset, Ok(()));
        let (peak, used) = (table.peak.load(SeqCst), table.used.load(SeqCst));
        assert!(
            peak >= used,
            "a fold was skipped: peak {peak} below used {used}"
        );
    });
}

#[test]
fn a_group_scopes_open_misses_no_allocation() {
    model(Restart::Group, Act::Open);
}

#[test]
fn a_group_scopes_reset_misses_no_allocation_and_forgets_the_old_peak() {
    model(Restart::Group, Act::Reset);
}

#[test]
fn repairers_racing_finish_a_dead_actors_open_once_and_exactly() {
    model(Restart::Group, Act::Repair);
}

#[test]
fn a_process_scopes_open_misses_no_allocation_that_the_floor_lets_skip() {
    model(Restart::Process, Act::Open);
}

#[test]
fn a_process_scopes_reset_misses_no_allocation_that_the_floor_lets_skip() {
    model(Restart::Process, Act::Reset);
}

#[test]
fn a_floor_raised_before_a_reset_never_hides_a_later_allocation() {
    free_then_reset(Restart::Process);
}

#[test]
#[should_panic(expected = "an allocation was lost")]
fn reading_the_base_before_zeroing_the_peak_loses_an_allocation() {
    model(Restart::BaseFirst, Act::Reset);
}

#[test]
#[should_panic(expected = "a fold was skipped")]
fn a_reset_outside_a_floor_change_lets_the_floor_hide_an_allocation() {
    free_then_reset(Restart::Unbracketed);
}

//! A `loom` model of the group scopes' open and reset (`reader/src/group/scope.rs`:
//! `GroupSegment::open_scope`, `settle`) against members allocating (`GroupDevice::take` without a
//! ceiling, then `GroupSegment::fold_scopes`). The property: once everything is done, the scope's
//! peak is exactly the group's `used` at the end (the allocations only add, so that is the most
//! `used` reached after the scope's base was read): no allocation is lost, and a reset leaves no
//! peak from before it. The reader's code is restated step by step: one device, one scope slot,
//! two members.
//!
//! The argument is the store-buffering one: each side writes one word, then reads the other's, all
//! `SeqCst`, so one of them sees the other's write. loom models `SeqCst` accesses as acquire/release
//! only (it would report that outcome as possible), but it does model `SeqCst` fences: the model
//! puts one between each side's write and its read, the order the `SeqCst` accesses of the reader's
//! code already give in the language's memory model. The zeroing of the peak is a swap in the
//! reader's code, so that a fold landing just before it is read by it (and the member's add to
//! `used` is then seen by the base read) without leaning on that either.
//!
//! [`Steps::Late`] is the order the reader must not use: the base read before the slot's bit is
//! set (an open), or the peak zeroed after the base is read (a reset). The tests assert that loom
//! finds the allocation each one loses, so the order is shown needed.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p gpumemhook --test loom_group_scope
//! --target-dir target/loom` (`scripts/test` does).
#![cfg(loom)]

mod loom_shared;
use loom_shared::fold_max;

use loom::sync::atomic::{fence, AtomicU64, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;

/// The order of the opener's (or resetter's) steps.
#[derive(Clone, Copy, PartialEq)]
enum Steps {
    /// The reader's: bit, peak to 0, then the base read.
    InOrder,
    /// The base read first.
    Late,
}

/// One device of the group and one scope slot.
#[derive(Default)]
struct Group {
    used: AtomicU64,
    /// `GroupDevice::scopes_open`, one slot.
    scopes_open: AtomicU64,
    base: AtomicU64,
    peak: AtomicU64,
}

impl Group {
    /// A member's allocation: the add to `used`, then `fold_scopes`.
    fn allocate(&self, bytes: u64) {
        let new_used = self.used.fetch_add(bytes, SeqCst) + bytes;
        fence(SeqCst);
        if self.scopes_open.load(SeqCst) != 0 {
            fold_max(&self.peak, new_used);
        }
    }

    /// `open_scope` from setting the bit (`reopen`: the bit is already set, a reset), then `settle`.
    fn open(&self, steps: Steps, reopen: bool) {
        if steps == Steps::Late {
            let used = self.used.load(SeqCst);
            if !reopen {
                self.scopes_open.fetch_or(1, SeqCst);
            }
            self.peak.store(0, SeqCst);
            fence(SeqCst);
            self.base.store(used, SeqCst);
            fold_max(&self.peak, used);
            return;
        }
        if !reopen {
            self.scopes_open.fetch_or(1, SeqCst);
        }
        // A swap, as the reader's: a member's fold that lands before it is read by it.
        self.peak.swap(0, SeqCst);
        fence(SeqCst);
        let used = self.used.load(SeqCst);
        self.base.store(used, SeqCst);
        fold_max(&self.peak, used);
    }
}

/// The members hold 100; one allocates 10, the other 20, while the scope opens (or, already open
/// with a peak of 500 from before, is reset).
fn model(steps: Steps, reopen: bool) {
    loom::model(move || {
        let group = Arc::new(Group::default());
        group.used.store(100, SeqCst);
        if reopen {
            group.scopes_open.store(1, SeqCst);
            group.peak.store(500, SeqCst);
        }
        let members: Vec<_> = [10, 20]
            .into_iter()
            .map(|bytes| {
                let group = group.clone();
                thread::spawn(move || group.allocate(bytes))
            })
            .collect();
        group.open(steps, reopen);
        for m in members {
            m.join().unwrap();
        }
        let (peak, used) = (group.peak.load(SeqCst), group.used.load(SeqCst));
        assert!(
            peak >= used,
            "an allocation was lost: peak {peak} below used {used}"
        );
        assert_eq!(peak, used, "a peak from before the reset stayed");
        assert!(group.base.load(SeqCst) <= used);
    });
}

#[test]
fn an_open_misses_no_allocation() {
    model(Steps::InOrder, false);
}

#[test]
fn a_reset_misses_no_allocation_and_forgets_the_old_peak() {
    model(Steps::InOrder, true);
}

#[test]
#[should_panic(expected = "an allocation was lost")]
fn reading_the_base_before_the_bit_loses_an_allocation() {
    model(Steps::Late, false);
}

#[test]
#[should_panic(expected = "an allocation was lost")]
fn zeroing_the_peak_after_the_base_read_loses_an_allocation() {
    model(Steps::Late, true);
}

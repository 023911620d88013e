//! A `loom` model of the scope protocol (the opening and resetting side in `reader/src/scope.rs`,
//! the allocation side `Segment::scope_ticket` / `commit_alloc` / `fold_into_scopes`): a scope is
//! reset on a device while allocations on it reserve, skip the scopes when the floor word says no
//! peak could change, or fold into the open scopes and raise the floor. The property: once
//! everything is done, the scope's peak is at least the `used` reached after its reset (no
//! allocation skipped a scope that needed it). The reader's code is restated step by step with its orderings
//! (all `SeqCst`), one device, one scope slot and one change entry, so the model stays small.
//!
//! [`Floor::Unguarded`] drops the ticket's check before raising the floor (an allocation raises it
//! even when a scope was opened since it read its ticket); the test asserts that loom finds the
//! skipped fold it allows, so the check is shown needed.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p gpumemhook --test loom_scope
//! --target-dir target/loom` (`scripts/test` does).
#![cfg(loom)]

mod loom_shared;
use loom_shared::fold_max;

use loom::sync::atomic::{AtomicU64, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;

// The floor word: the floor, BUSY, the generation above (as in `reader/src/layout.rs`).
const FLOOR_MASK: u64 = (1 << 48) - 1;
const BUSY: u64 = 1 << 48;
const GENERATION_ONE: u64 = 1 << 49;
const GENERATION_MASK: u64 = !(FLOOR_MASK | BUSY);

fn next_generation(word: u64) -> u64 {
    (word & GENERATION_MASK).wrapping_add(GENERATION_ONE) & GENERATION_MASK
}

fn floor_epoch(word: u64) -> u64 {
    word & !FLOOR_MASK
}

/// Whether an allocation checks its ticket before raising the floor.
#[derive(Clone, Copy, PartialEq)]
enum Floor {
    /// The reader's: only when no scope was opened or reset since the ticket.
    Guarded,
    /// Without the check.
    Unguarded,
}

/// One device and one scope slot of the segment.
#[derive(Default)]
struct Segment {
    used: AtomicU64,
    scope_floor: AtomicU64,
    /// `header.scopes_active`, one slot.
    active: AtomicU64,
    /// `header.change_owners`, one entry.
    change_owner: AtomicU64,
    scope_peak: AtomicU64,
}

impl Segment {
    /// `Segment::open_scope`'s (and a reset's) steps from taking the change entry to ending the
    /// change.
    fn open_scope(&self) {
        // begin_scope_change
        while self
            .change_owner
            .compare_exchange(0, 1, SeqCst, SeqCst)
            .is_err()
        {
            thread::yield_now();
        }
        let mut word = self.scope_floor.load(SeqCst);
        while let Err(seen) =
            self.scope_floor
                .compare_exchange(word, next_generation(word) | BUSY, SeqCst, SeqCst)
        {
            word = seen;
        }
        self.scope_peak.store(0, SeqCst);
        self.active.fetch_or(1, SeqCst);
        // fold_base
        fold_max(&self.scope_peak, self.used.load(SeqCst));
        // end_scope_change: give the entry back, then settle the floor.
        let _ = self.change_owner.compare_exchange(1, 0, SeqCst, SeqCst);
        for _ in 0..4 {
            let word = self.scope_floor.load(SeqCst);
            if word & BUSY == 0 || self.change_owner.load(SeqCst) != 0 {
                break;
            }
            if self
                .scope_floor
                .compare_exchange(word, next_generation(word), SeqCst, SeqCst)
                .is_ok()
            {
                break;
            }
        }
    }

    /// An allocation of `bytes`: `scope_ticket`, the reservation (no ceiling), `commit_alloc`.
    fn allocate(&self, bytes: u64, floor: Floor) {
        let ticket = self.scope_floor.load(SeqCst);
        let new_used = self.used.fetch_add(bytes, SeqCst) + bytes;
        if self.active.load(SeqCst) == 0 {
            return;
        }
        let now = self.scope_floor.load(SeqCst);
        if now & BUSY == 0 && new_used <= now & FLOOR_MASK {
            return;
        }
        // fold_into_scopes
        if self.active.load(SeqCst) & 1 != 0 {
            fold_max(&self.scope_peak, new_used);
        }
        let guarded = floor == Floor::Guarded;
        if !guarded || (ticket & BUSY == 0 && new_used <= FLOOR_MASK) {
            let mut current = now;
            while (!guarded || floor_epoch(current) == floor_epoch(ticket))
                && current & FLOOR_MASK < new_used
            {
                let raised = floor_epoch(current) | new_used;
                match self
                    .scope_floor
                    .compare_exchange(current, raised, SeqCst, SeqCst)
                {
                    Ok(_) => break,
                    Err(seen) => current = seen,
                }
            }
        }
    }
}

/// A scope is open; one thread allocates 100 bytes, then 50. Another frees the 100 once they are
/// allocated, then resets the scope (the same steps as an open). Whatever the interleaving, the
/// scope's peak must cover `used` at the end: an allocation that raised the floor on the strength
/// of a fold made before the reset would let the 50 skip the reset scope.
fn model(floor: Floor) {
    loom::model(move || {
        let segment = Arc::new(Segment::default());
        segment.active.store(1, SeqCst);
        let allocator = {
            let segment = segment.clone();
            thread::spawn(move || {
                segment.allocate(100, floor);
                segment.allocate(50, floor);
            })
        };
        while segment.used.load(SeqCst) < 100 {
            thread::yield_now();
        }
        segment.used.fetch_sub(100, SeqCst);
        segment.open_scope();
        allocator.join().unwrap();
        let used = segment.used.load(SeqCst);
        assert!(
            segment.scope_peak.load(SeqCst) >= used,
            "a fold was skipped: the scope's peak {} is below used {used}",
            segment.scope_peak.load(SeqCst)
        );
    });
}

#[test]
fn an_open_scope_sees_every_allocation() {
    model(Floor::Guarded);
}

#[test]
#[should_panic(expected = "a fold was skipped")]
fn without_the_ticket_a_fold_is_skipped() {
    model(Floor::Unguarded);
}

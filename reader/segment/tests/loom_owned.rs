//! A `loom` model of the per-thread table's cross-thread free, running this crate's own protocol
//! code over loom's atomics (`src/owned.rs`, over `src/sync.rs`): `TableSync::begin` and `end`
//! around the owner's change, `consistent`, `claim` and `pending`, and `attend` (which runs
//! `remove_claimed`). The hook's tables (`interceptor/src/owned.rs`) run the same code.
//!
//! The model's table ([`Slots`]) supplies what the hook's table supplies (`Entries`: a read that
//! may race the owner, the owner's removal), with two slots and no hashing; its claims set
//! ([`Claims`]) holds one key. The owner moves its entry from one slot to the other with plain
//! (relaxed) stores inside a change (the hook's backward shift after a removal), while another
//! thread, holding the lock, reads the table under the sequence count and claims the entry; then
//! the owner makes its next call.
//!
//! Two claims are modelled:
//! - the hook's ([`Claim::Beside`], `TableSync::claim` itself): the claim goes into the set beside
//!   the table, and the owner removes claimed entries at its next call. In every interleaving and
//!   every value the orderings allow, the entry is freed exactly once and no claimed entry stays
//!   live;
//! - the version a review found flawed ([`Claim::InPlace`]): the claimer marks the entry in the
//!   owner's table with a compare-and-swap. No code of the product does that, so this variant is a
//!   small restatement here: it finds the slot with the real `TableSync::consistent`, then marks it.
//!   The owner's store to its sequence count may not yet be visible when the claimer checks it, so
//!   the owner can copy the unmarked entry it had already read over the mark: the claim is lost,
//!   and the entry stays live after its free was counted. The test asserts that loom finds that
//!   interleaving.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p gpumemhook-segment --test loom_owned
//! --target-dir target/loom` (`scripts/test` does).
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use gpumemhook_segment::owned::{ClaimSet, Entries, TableSync};

/// The entry's key; 0 is an empty slot.
const KEY: u64 = 0x1000;
/// The in-place claim's mark (the flawed version's).
const MARK: u64 = 1 << 63;

/// How the freeing thread claims the entry.
#[derive(Clone, Copy, PartialEq)]
enum Claim {
    /// In the set beside the owner's table: `TableSync::claim` (the hook's).
    Beside,
    /// By marking the owner's slot with a compare-and-swap (the flawed version, restated here).
    InPlace,
}

/// The owner's table: two slots of one key each (the hook's slots are atomic words written with
/// relaxed stores too).
struct Slots([AtomicU64; 2]);

impl Entries for Slots {
    type Value = u64;

    fn probe_racy(&self, key: u64) -> Option<u64> {
        self.0
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .find(|&k| k == key)
    }

    fn remove(&self, key: u64) {
        for slot in &self.0 {
            if slot.load(Ordering::Relaxed) == key {
                slot.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// The claims set: one key, 0 when empty. Used under the lock only.
struct Claims(AtomicU64);

impl ClaimSet for Claims {
    fn contains(&self, key: u64) -> bool {
        self.0.load(Ordering::Relaxed) == key
    }

    fn insert(&self, key: u64) -> bool {
        if self.0.load(Ordering::Relaxed) != 0 {
            return false;
        }
        self.0.store(key, Ordering::Relaxed);
        true
    }

    fn is_empty(&self) -> bool {
        self.0.load(Ordering::Relaxed) == 0
    }

    fn for_each(&self, mut visit: impl FnMut(u64)) {
        let key = self.0.load(Ordering::Relaxed);
        if key != 0 {
            visit(key);
        }
    }

    fn clear(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// One thread's table with its protocol words, its claims set, and the process-wide lock.
struct ThreadTable {
    sync: TableSync,
    slots: Slots,
    claims: Claims,
    lock: Mutex<()>,
}

impl ThreadTable {
    fn new() -> Self {
        ThreadTable {
            sync: TableSync::new(),
            slots: Slots([AtomicU64::new(KEY), AtomicU64::new(0)]),
            claims: Claims(AtomicU64::new(0)),
            lock: Mutex::new(()),
        }
    }

    /// The owner moves slot 0's entry to slot 1 (a backward shift): plain stores in a change.
    fn owner_moves(&self) {
        self.sync.begin();
        let entry = self.slots.0[0].load(Ordering::Relaxed);
        self.slots.0[1].store(entry, Ordering::Relaxed);
        self.slots.0[0].store(0, Ordering::Relaxed);
        self.sync.end();
    }

    /// The owner's next call, as the hook's `insert` and `take` begin: when its flag is up, it
    /// attends under the lock.
    fn owner_calls(&self) {
        if self.sync.pending() {
            let _lock = self.lock.lock().unwrap();
            self.sync.attend(&self.slots, &self.claims);
        }
    }

    /// Another thread's free of `KEY`, under the lock: true when it claimed the entry (its free is
    /// counted).
    fn free_elsewhere(&self, how: Claim) -> bool {
        let _lock = self.lock.lock().unwrap();
        match how {
            Claim::Beside => self.sync.claim(&self.slots, &self.claims, KEY).is_some(),
            // The flawed claim: finds the slot consistently, then marks it; a mark that fails (the
            // entry moved) searches again.
            Claim::InPlace => (0..2).any(|_| {
                let at = self.sync.consistent(|| {
                    self.slots
                        .0
                        .iter()
                        .position(|s| s.load(Ordering::Relaxed) == KEY)
                });
                at.is_some_and(|i| {
                    self.slots.0[i]
                        .compare_exchange(KEY, KEY | MARK, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                })
            }),
        }
    }

    /// Entries still live (neither empty nor marked claimed in place).
    fn live(&self) -> usize {
        self.slots
            .0
            .iter()
            .filter(|s| {
                let v = s.load(Ordering::Relaxed);
                v != 0 && v & MARK == 0
            })
            .count()
    }
}

/// The owner moves its entry while another thread frees it, then the owner makes its next call,
/// and another after the free is done. Whatever the interleaving: the free was counted (the entry
/// was found) and the entry is gone.
fn model(how: Claim) {
    loom::model(move || {
        let table = Arc::new(ThreadTable::new());
        let freer = {
            let table = table.clone();
            thread::spawn(move || table.free_elsewhere(how))
        };
        table.owner_moves();
        table.owner_calls();
        let claimed = freer.join().unwrap();
        table.owner_calls();
        assert_eq!(
            (claimed, table.live()),
            (true, 0),
            "the claim was lost: (free counted, entries live)"
        );
        assert!(table.claims.is_empty(), "the owner removed its claims");
        assert!(!table.sync.pending(), "and lowered its flag");
    });
}

#[test]
fn a_claim_beside_the_table_is_never_lost() {
    model(Claim::Beside);
}

/// The litmus test of the review: loom finds the lost claim of the in-place version.
#[test]
#[should_panic(expected = "the claim was lost")]
fn a_claim_in_the_owners_table_is_lost() {
    model(Claim::InPlace);
}

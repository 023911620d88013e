//! A `loom` model of the per-thread table's cross-thread free (`interceptor/src/owned.rs`): the
//! owner moves an entry inside its own table with plain stores bracketed by a sequence count (a
//! backward shift after a removal), while another thread, holding the lock, reads the table under
//! the sequence count and claims the entry. The hook is a `cdylib`, so the model restates the
//! essential atomic steps with the same orderings (`begin`, `end`, `consistent`, `claim`,
//! `remove_claimed`) rather than calling them.
//!
//! Two claims are modelled:
//! - the hook's: the claim goes into a set beside the table, and the owner removes claimed entries
//!   at its next call. In every interleaving and every value the orderings allow, the entry is
//!   freed exactly once and no claimed entry stays live;
//! - the version a review found flawed ([`Claim::InPlace`]): the claimer marks the entry in the
//!   owner's table with a compare-and-swap. The owner's store to its sequence count may not yet be
//!   visible when the claimer checks it, so the owner can copy the unmarked entry it had already
//!   read over the mark: the claim is lost, and the entry stays live after its free was counted.
//!   The test asserts that loom finds that interleaving.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p gpumemhook --test loom_owned
//! --target-dir target/loom` (`scripts/test` does).
#![cfg(loom)]

use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// The entry's key; 0 is an empty slot.
const KEY: u64 = 0x1000;
/// The in-place claim's mark (the flawed version's).
const MARK: u64 = 1 << 63;

/// How the freeing thread claims the entry.
#[derive(Clone, Copy, PartialEq)]
enum Claim {
    /// In a set beside the owner's table (the hook's).
    Beside,
    /// By marking the owner's slot with a compare-and-swap (the flawed version).
    InPlace,
}

/// One thread's table: two slots, the sequence count, the claims set and the attention flag.
struct ThreadTable {
    slots: [AtomicU64; 2],
    seq: AtomicU64,
    /// The claims set; the mutex is the process-wide lock every claimer holds.
    claims: Mutex<Option<u64>>,
    attention: AtomicBool,
}

impl ThreadTable {
    fn new() -> Self {
        ThreadTable {
            slots: [AtomicU64::new(KEY), AtomicU64::new(0)],
            seq: AtomicU64::new(0),
            claims: Mutex::new(None),
            attention: AtomicBool::new(false),
        }
    }

    /// `ThreadTable::begin`: the owner starts a change.
    fn begin(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// `ThreadTable::end`: the owner's change is complete.
    fn end(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Release);
    }

    /// The owner moves slot 0's entry to slot 1 (a backward shift), plain stores in a change.
    fn owner_moves(&self) {
        self.begin();
        let entry = self.slots[0].load(Ordering::Relaxed);
        self.slots[1].store(entry, Ordering::Relaxed);
        self.slots[0].store(0, Ordering::Relaxed);
        self.end();
    }

    /// `ThreadTable::consistent`: `look` repeated until the count was even and held still.
    fn consistent<T>(&self, look: impl Fn(&[AtomicU64; 2]) -> T) -> T {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let seen = look(&self.slots);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return seen;
                }
            }
            thread::yield_now();
        }
    }

    /// Another thread's free of `KEY`: true when it claimed the entry (its free is counted).
    fn claim(&self, how: Claim) -> bool {
        let mut claims = self.claims.lock().unwrap();
        match how {
            Claim::Beside => {
                let found =
                    self.consistent(|slots| slots.iter().any(|s| s.load(Ordering::Relaxed) == KEY));
                if !found || claims.is_some() {
                    return false;
                }
                *claims = Some(KEY);
                self.attention.store(true, Ordering::Release);
                true
            }
            // Finds the slot consistently, then marks it; a mark that fails (the entry moved)
            // searches again.
            Claim::InPlace => (0..2).any(|_| {
                let at = self.consistent(|slots| {
                    slots.iter().position(|s| s.load(Ordering::Relaxed) == KEY)
                });
                at.is_some_and(|i| {
                    self.slots[i]
                        .compare_exchange(KEY, KEY | MARK, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                })
            }),
        }
    }

    /// The owner's next call: `remove_claimed` when its flag is up (under the lock).
    fn owner_attends(&self) {
        if !self.attention.load(Ordering::Acquire) {
            return;
        }
        let mut claims = self.claims.lock().unwrap();
        if let Some(key) = claims.take() {
            self.begin();
            for slot in &self.slots {
                if slot.load(Ordering::Relaxed) == key {
                    slot.store(0, Ordering::Relaxed);
                }
            }
            self.end();
        }
        self.attention.store(false, Ordering::Release);
    }

    /// Entries still live (neither empty nor marked claimed in place).
    fn live(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| {
                let v = s.load(Ordering::Relaxed);
                v != 0 && v & MARK == 0
            })
            .count()
    }
}

/// The owner moves its entry while another thread frees it, then the owner makes its next call.
/// Whatever the interleaving: the free was counted (the entry was found) and the entry is gone.
fn model(how: Claim) {
    loom::model(move || {
        let table = Arc::new(ThreadTable::new());
        let freer = {
            let table = table.clone();
            thread::spawn(move || table.claim(how))
        };
        table.owner_moves();
        table.owner_attends();
        let claimed = freer.join().unwrap();
        table.owner_attends();
        assert_eq!(
            (claimed, table.live()),
            (true, 0),
            "the claim was lost: (free counted, entries live)"
        );
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

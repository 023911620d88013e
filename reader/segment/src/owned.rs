//! The protocol of a table that one thread owns and other threads read and claim from: the hook's
//! per-thread tables of live pointers (`interceptor/src/owned.rs`, which keeps their memory, the
//! registry of tables, the process-wide lock and the thread-exit handler). Only the protocol is
//! here, over [`crate::sync`], so that the loom model (`tests/loom_owned.rs`) runs it as it is; the
//! table and the claims set are the caller's ([`Entries`], [`ClaimSet`]).
//!
//! - **The owner** changes its table with plain stores (relaxed atomic words), each change between
//!   [`TableSync::begin`] and [`TableSync::end`]: a sequence count, odd while a change is under way.
//! - **Another thread**, holding the lock, reads the table with [`TableSync::consistent`]: the read
//!   is repeated until the count was even and held still around it.
//! - **A free on another thread** claims the entry ([`TableSync::claim`]): in the claims set beside
//!   the table, never in the owner's table, and raises [`CLAIMED`]. A writer beside the owner could
//!   not know whether the owner had already read a slot it was about to move (the owner's stores to
//!   the count may not be visible yet), so a mark in the table could be copied over and lost; the
//!   model keeps that version as its negative control.
//! - **The owner's next call** sees a flag ([`TableSync::pending`]) and, under the lock, removes the
//!   claimed entries ([`TableSync::attend`]). Until then a search skips them (a claim finds its key
//!   already claimed).
//!
//! The caller holds the lock for everything but the owner's own changes and [`TableSync::pending`]:
//! it guards the claims set, the flags' writers, and the table's shape.

use crate::sync::{back_off, fence, AtomicU32, AtomicU64, Ordering};

/// `attention`: another thread claimed entries of this table.
pub const CLAIMED: u32 = 1;
/// `attention`: a report is reading this table.
pub const FROZEN: u32 = 2;

/// The owner's table, as the protocol reads and changes it.
pub trait Entries {
    type Value;
    /// The value of `key`, read while the owner may be changing the table: bounded however torn
    /// the read (the caller of [`TableSync::consistent`] checks whether the answer stands).
    fn probe_racy(&self, key: u64) -> Option<Self::Value>;
    /// Removes `key`, if there: a change of the owner's (or of an exiting owner's), inside a
    /// bracket.
    fn remove(&self, key: u64);
}

/// The keys other threads claimed from one table and its owner has not yet removed. Every user
/// holds the lock.
pub trait ClaimSet {
    fn contains(&self, key: u64) -> bool;
    /// Adds `key`; false when there is no memory to remember it.
    fn insert(&self, key: u64) -> bool;
    fn is_empty(&self) -> bool;
    /// Calls `visit` with every key.
    fn for_each(&self, visit: impl FnMut(u64));
    fn clear(&self);
}

/// The words that order a table's owner with the other threads: the sequence count and the
/// attention flags. `repr(C)`, so that a table that starts with it keeps its words where they were.
#[repr(C)]
pub struct TableSync {
    /// Odd while the owner changes the table.
    seq: AtomicU64,
    /// [`CLAIMED`] and [`FROZEN`]: the owner's next call goes to the lock first.
    attention: AtomicU32,
}

impl Default for TableSync {
    fn default() -> Self {
        TableSync::new()
    }
}

impl TableSync {
    pub fn new() -> TableSync {
        TableSync {
            seq: AtomicU64::new(0),
            attention: AtomicU32::new(0),
        }
    }

    /// The owner starts a change of its table.
    #[inline(always)]
    pub fn begin(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// The owner's change is complete.
    #[inline(always)]
    pub fn end(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Release);
    }

    /// Whether the owner's call must first attend (under the lock): entries were claimed, or a
    /// report is reading the table.
    #[inline(always)]
    pub fn pending(&self) -> bool {
        self.attention.load(Ordering::Acquire) != 0
    }

    /// Raises `flag`: every writer of the word holds the lock, so a load and a store lose nothing.
    /// Caller holds the lock.
    #[inline]
    pub fn raise(&self, flag: u32) {
        let now = self.attention.load(Ordering::Relaxed);
        self.attention.store(now | flag, Ordering::Release);
    }

    /// Lowers `flag`. Caller holds the lock.
    #[inline]
    pub fn lower(&self, flag: u32) {
        let now = self.attention.load(Ordering::Relaxed);
        self.attention.store(now & !flag, Ordering::Release);
    }

    /// `look()` at the table, read consistently while the owner may be changing it: repeated
    /// until the sequence count was even and held still around it. Caller holds the lock, so the
    /// table's shape is stable. After 64 tries it raises [`FROZEN`] (unless the caller did), so
    /// that the owner's next call waits on the lock instead of starting another change.
    pub fn consistent<T>(&self, look: impl Fn() -> T) -> T {
        let mut spins = 0u32;
        let mut froze = false;
        let seen = loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let seen = look();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    break seen;
                }
            }
            spins += 1;
            if spins == 64 && self.attention.load(Ordering::Relaxed) & FROZEN == 0 {
                self.raise(FROZEN);
                froze = true;
            }
            back_off(spins);
        };
        if froze {
            self.lower(FROZEN);
        }
        seen
    }

    /// Claims `key` in `table` (another thread's) for the calling thread's free: its value when
    /// the table holds it unclaimed, `None` otherwise (or when `claims` has no memory to remember
    /// the claim: then the free is not counted and the entry stays, so a report shows more in
    /// use, never less). Caller holds the lock.
    pub fn claim<E: Entries, C: ClaimSet>(
        &self,
        table: &E,
        claims: &C,
        key: u64,
    ) -> Option<E::Value> {
        let value = self.consistent(|| table.probe_racy(key))?;
        if claims.contains(key) || !claims.insert(key) {
            return None;
        }
        self.raise(CLAIMED);
        Some(value)
    }

    /// Removes from `table` the entries other threads claimed, in one change: the owner's call
    /// (or its exit's), the lock held by the caller.
    pub fn remove_claimed<E: Entries, C: ClaimSet>(&self, table: &E, claims: &C) {
        if claims.is_empty() {
            return;
        }
        self.begin();
        claims.for_each(|key| table.remove(key));
        self.end();
        claims.clear();
    }

    /// The owner's call when [`TableSync::pending`]: removes the claimed entries and lowers
    /// [`CLAIMED`]. Caller holds the lock (which also waits out a report reading the table).
    pub fn attend<E: Entries, C: ClaimSet>(&self, table: &E, claims: &C) {
        self.remove_claimed(table, claims);
        self.lower(CLAIMED);
    }
}

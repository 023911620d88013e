//! The live pointer allocations, one table per thread: an allocation and its free on the same
//! thread (the common case) take no lock and no atomic read-modify-write at all.
//!
//! Why: an atomic read-modify-write costs about 10 ns on some server processors, and the sharded
//! map this replaces took a shard lock (one `cmpxchg`) at every allocation and every free. Here:
//!
//! - **Each thread writes only its own table**, with plain stores, bracketed by a sequence count
//!   (odd while a change is under way), so that other threads can read it consistently.
//! - **A free of another thread's allocation** (autograd's backward thread allocates, the main
//!   thread frees) is the slower path: under one process-wide spin lock, the freeing thread finds
//!   the entry in the other tables (read under their sequence counts) and *claims* it, in a set kept
//!   beside that table. It never writes the owner's table: a writer beside the owner could not know
//!   whether the owner had already read a slot it was about to move (its stores to the sequence
//!   count may not be visible yet). The owner removes its claimed entries at its next call, seeing
//!   a flag; until then a search skips them. So a free is counted once, and an address the driver
//!   hands out again after the free is never confused with the old one.
//! - **A thread that exits hands over** its live entries to the shared table (under the lock), from a
//!   `pthread` key destructor; frees of them then find them there. Threads past [`MAX_TABLES`], and
//!   a thread that is exiting, use the shared table directly, under the lock.
//! - **Changes of a table's shape** (its growth, the owner's removal of claimed entries) happen under
//!   the lock, so a reader on another thread, which holds it, never reads memory being unmapped.
//! - **Reports** read every table under the lock: they set a flag that sends the owner's next call
//!   to wait on the lock, so the copy is made at most twice.
//! - **Fork:** a forked child never touches its parent's tables (the ledger it uses is its own);
//!   [`forked`] marks the parent's as left behind, so a thread-exit handler in the child never
//!   takes their lock, which a parent thread may have held at the instant of `fork`.
//!
//! The protocol itself (the sequence count, the consistent read, the claim, the owner's removal of
//! claimed entries, the flags) is the segment crate's (`gpumemhook_segment::owned`), over its sync
//! facade, so that its loom model (`reader/segment/tests/loom_owned.rs`) runs it as it is; this
//! module keeps the tables' memory, the registry, the lock, the thread keys and fork.
//!
//! What this does not make exact is a double free of one allocation raced from two threads: both
//! can count it (the owner's removal and another thread's claim), and when the driver then refuses
//! one of the two frees, the hook restores that one's entry (`crate::skeletons::release_taking`),
//! which leaves an entry for memory the driver freed. The sharded map this replaced had the same
//! window, the whole driver call.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use gpumemhook_segment::{ClaimSet, Entries, TableSync, FROZEN};

use crate::local::LOCAL;
use crate::maps::{map_zeroed, SpinLock, Table, Value};

/// Most threads with a table of their own at once; later ones use the shared table, under the lock.
pub const MAX_TABLES: usize = 1024;
/// Slots each thread's table starts with.
const INITIAL_SLOTS: usize = 32;

/// What an entry holds (the ledger's packed entry).
pub type Words = [u64; 2];

impl Value for Words {
    #[inline(always)]
    fn to_words(self) -> [u64; 2] {
        self
    }
    #[inline(always)]
    fn from_words(words: [u64; 2]) -> Self {
        words
    }
}

/// Who counts a change: the calling thread's table (its index, which selects the count stripe it
/// alone writes), or nobody's (counted with atomic read-modify-writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    Thread(usize),
    Shared,
}

/// The table as the protocol reads and changes it.
impl Entries for Table<Words> {
    type Value = Words;
    #[inline]
    fn probe_racy(&self, key: u64) -> Option<Words> {
        Table::probe_racy(self, key)
    }
    #[inline]
    fn remove(&self, key: u64) {
        Table::remove(self, key);
    }
}

/// A claims set: the keys, each with the value 1.
impl ClaimSet for Table<u64> {
    #[inline]
    fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }
    #[inline]
    fn insert(&self, key: u64) -> bool {
        Table::insert(self, key, 1)
    }
    #[inline]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    #[inline]
    fn for_each(&self, mut visit: impl FnMut(u64)) {
        for c in self.entries() {
            visit(c.key);
        }
    }
    #[inline]
    fn clear(&self) {
        Table::clear(self);
    }
}

/// One thread's table, on cache lines of its own.
#[repr(C, align(128))]
struct ThreadTable {
    /// The sequence count (odd while the owner changes `table`) and the attention flags
    /// (`CLAIMED`, [`FROZEN`]: the owner's next call goes to the lock first).
    sync: TableSync,
    /// Its place in the registry (and its count stripe).
    index: usize,
    /// The set of tables it belongs to.
    owner: *const ThreadTables,
    /// Written by the owner only; its shape (slots, size) only under the lock.
    table: UnsafeCell<Table<Words>>,
    /// Keys other threads took from `table` and the owner has not yet removed. Under the lock.
    claims: UnsafeCell<Table<u64>>,
}

impl ThreadTable {
    /// The table. Its slots are atomic words and its shape and length cells, so a shared
    /// reference is all anyone holds; only the owner's thread changes it, and its shape only under
    /// the lock.
    #[inline(always)]
    fn table(&self) -> &Table<Words> {
        // SAFETY: no `&mut` to the table is ever made after registration; see above.
        unsafe { &*self.table.get() }
    }

    /// The claims set.
    ///
    /// # Safety
    /// The caller holds the lock (every user of the set does).
    unsafe fn claims(&self) -> &Table<u64> {
        &*self.claims.get()
    }

    /// Claims `key` in this (another thread's) table for the calling thread's free
    /// (`TableSync::claim`). Caller holds the lock.
    fn claim(&self, key: u64) -> Option<Words> {
        // SAFETY: the caller holds the lock.
        let claims = unsafe { self.claims() };
        self.sync.claim(self.table(), claims, key)
    }

    /// Every entry not claimed by another thread, read consistently. Caller holds the lock and has
    /// set [`FROZEN`], so the owner finishes at most the change it began.
    fn copy(&self) -> Vec<(u64, Words)> {
        // SAFETY: the caller holds the lock.
        let claims = unsafe { self.claims() };
        let table = self.table();
        self.sync.consistent(|| {
            table
                .entries()
                .filter(|s| claims.get(s.key).is_none())
                .map(|s| (s.key, s.value))
                .collect()
        })
    }
}

/// This thread's table (`crate::local::Local::table`): null before its first use, [`EXITED`] once
/// handed over at its exit.
#[inline(always)]
fn mine_pointer() -> *mut ThreadTable {
    LOCAL.with(|l| l.table.get().cast())
}

fn set_mine(table: *mut ThreadTable) {
    LOCAL.with(|l| l.table.set(table.cast()));
}

/// The table pointer of a thread whose table was handed over (it is exiting).
const EXITED: *mut ThreadTable = std::ptr::without_provenance_mut(1);

/// Bumped in a forked child: sets of tables of an earlier value belong to a parent.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// The `pthread` key whose destructor hands a table over; [`KEY_NONE`] until made.
static EXIT_KEY: AtomicU32 = AtomicU32::new(KEY_NONE);
const KEY_NONE: u32 = u32::MAX;
const KEY_MAKING: u32 = u32::MAX - 1;

/// In a forked child (async-signal-safe: one atomic add): every set of tables made so far is the
/// parent's, never to be locked again.
pub fn forked() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
    // A parent thread making the exit key at the instant of `fork` never finishes in the child.
    if EXIT_KEY.load(Ordering::Relaxed) == KEY_MAKING {
        EXIT_KEY.store(KEY_NONE, Ordering::Relaxed);
    }
}

/// The live pointer allocations of a process, one table per thread and a shared one.
pub struct ThreadTables {
    /// Guards the registry, every claims set, the shared table, and changes of a table's shape.
    lock: SpinLock,
    epoch: u64,
    registry: [AtomicPtr<ThreadTable>; MAX_TABLES],
    /// Registry slots ever used: searches stop there.
    high: AtomicUsize,
    /// Entries of exited threads and of threads without a table. Under the lock.
    shared: UnsafeCell<Table<Words>>,
}

// SAFETY: a thread table is written by its owner only, read by others under the lock and its
// sequence count; everything else is under the lock.
unsafe impl Sync for ThreadTables {}
// SAFETY: as above.
unsafe impl Send for ThreadTables {}

impl ThreadTables {
    /// The shared table. Caller holds the lock.
    fn shared(&self) -> &Table<Words> {
        // SAFETY: only touched under the lock, and only through shared references (its shape and
        // length are cells).
        unsafe { &*self.shared.get() }
    }

    /// The registered tables. Caller holds the lock, which keeps them mapped.
    fn registered(&self) -> impl Iterator<Item = &ThreadTable> + '_ {
        self.registry[..self.high.load(Ordering::Relaxed)]
            .iter()
            // SAFETY: a registered table stays mapped until it is unregistered, under the lock.
            .filter_map(|slot| unsafe { slot.load(Ordering::Acquire).as_ref() })
    }

    /// A new, empty set, alive for the rest of the process (a thread's exit handler may reach it at
    /// any time), or `None` when its memory cannot be mapped.
    pub fn new() -> Option<&'static ThreadTables> {
        let shared = Table::new(INITIAL_SLOTS)?;
        Some(Box::leak(Box::new(ThreadTables {
            lock: SpinLock::new(),
            epoch: EPOCH.load(Ordering::Relaxed),
            registry: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_TABLES],
            high: AtomicUsize::new(0),
            shared: UnsafeCell::new(shared),
        })))
    }

    /// The calling thread's table in this set, made at its first call; `None` for a thread past
    /// [`MAX_TABLES`], an exiting one, or when no memory can be mapped.
    #[inline(always)]
    fn mine(&'static self) -> Option<&'static ThreadTable> {
        let p = mine_pointer();
        // SAFETY: a table pointer other than null and EXITED points to a live table (unmapped only
        // after the pointer becomes EXITED); tables of a set are never freed while registered.
        if !p.is_null() && p != EXITED && std::ptr::eq(unsafe { (*p).owner }, self) {
            // SAFETY: as above.
            return Some(unsafe { &*p });
        }
        self.register(p)
    }

    #[cold]
    fn register(&'static self, current: *mut ThreadTable) -> Option<&'static ThreadTable> {
        if current == EXITED {
            return None;
        }
        let key = exit_key()?;
        let table = Table::new(INITIAL_SLOTS)?;
        let Some(claims) = Table::new(8) else {
            table.unmap();
            return None;
        };
        let Some(memory) = map_table() else {
            table.unmap();
            claims.unmap();
            return None;
        };
        let guard = self.lock.lock();
        let Some(index) = self
            .registry
            .iter()
            .position(|p| p.load(Ordering::Relaxed).is_null())
        else {
            drop(guard);
            table.unmap();
            claims.unmap();
            unmap_table(memory);
            return None;
        };
        // SAFETY: `memory` is a fresh private mapping large and aligned enough for one table.
        unsafe {
            memory.write(ThreadTable {
                sync: TableSync::new(),
                index,
                owner: self,
                table: UnsafeCell::new(table),
                claims: UnsafeCell::new(claims),
            })
        };
        self.registry[index].store(memory, Ordering::Release);
        self.high.fetch_max(index + 1, Ordering::Relaxed);
        drop(guard);
        // SAFETY: `key` was made by pthread_key_create; the value is this thread's table, handed to
        // `thread_exit` when the thread ends.
        if unsafe { libc::pthread_setspecific(key, memory.cast()) } != 0 {
            // Its exit could not hand the table over: give it back now, and let this thread use
            // the shared table.
            self.hand_over(memory);
            set_mine(EXITED);
            return None;
        }
        set_mine(memory);
        // SAFETY: just written above, and alive until this thread's exit.
        Some(unsafe { &*memory })
    }

    /// Records `key` on the calling thread's table. `None` when it could not be recorded (no memory).
    #[inline(always)]
    pub fn insert(&'static self, key: u64, value: Words) -> Option<Holder> {
        let Some(t) = self.mine() else {
            return self.insert_shared(key, value);
        };
        if t.sync.pending() {
            self.attend(t);
        }
        // This is the owner's thread, the table's one writer.
        let table = t.table();
        if table.full() {
            return self.insert_growing(t, key, value);
        }
        t.sync.begin();
        table.insert(key, value);
        t.sync.end();
        Some(Holder::Thread(t.index))
    }

    /// [`ThreadTables::insert`] into a table that must grow first: under the lock, since the
    /// growth unmaps the slots another thread may be reading.
    #[cold]
    fn insert_growing(&self, t: &ThreadTable, key: u64, value: Words) -> Option<Holder> {
        let _guard = self.lock.lock();
        t.sync.begin();
        // This is the owner's thread, the table's one writer.
        let inserted = t.table().insert(key, value);
        t.sync.end();
        inserted.then_some(Holder::Thread(t.index))
    }

    #[cold]
    fn insert_shared(&self, key: u64, value: Words) -> Option<Holder> {
        let _guard = self.lock.lock();
        self.shared().insert(key, value).then_some(Holder::Shared)
    }

    /// Removes `key`, wherever it was recorded, and returns its value and who counts the free (the
    /// calling thread).
    #[inline(always)]
    pub fn take(&'static self, key: u64) -> Option<(Words, Holder)> {
        let Some(t) = self.mine() else {
            return self.take_elsewhere(None, key);
        };
        if t.sync.pending() {
            self.attend(t);
        }
        // This is the owner's thread, the table's one writer.
        let table = t.table();
        if let Some(at) = table.position(key) {
            t.sync.begin();
            let value = table.remove_at(at);
            t.sync.end();
            return Some((value, Holder::Thread(t.index)));
        }
        self.take_elsewhere(Some(t), key)
    }

    /// A free of an allocation another thread recorded (or that was handed over): claimed in its
    /// owner's table, or taken from the shared one, under the lock.
    #[cold]
    fn take_elsewhere(&self, me: Option<&ThreadTable>, key: u64) -> Option<(Words, Holder)> {
        let holder = me.map_or(Holder::Shared, |t| Holder::Thread(t.index));
        let _guard = self.lock.lock();
        let others = self
            .registered()
            .filter(|t| !me.is_some_and(|m| std::ptr::eq(m, *t)));
        for other in others {
            if let Some(value) = other.claim(key) {
                return Some((value, holder));
            }
        }
        self.shared().remove(key).map(|value| (value, holder))
    }

    /// The owner's call when its flag is up: removes the entries other threads claimed, and waits
    /// out a report reading its table.
    #[cold]
    fn attend(&self, t: &ThreadTable) {
        let _guard = self.lock.lock();
        // SAFETY: the lock is held.
        let claims = unsafe { t.claims() };
        // Called on the owner's thread.
        t.sync.attend(t.table(), claims);
    }

    /// Calls `visit(key, value)` for every live entry: for reports, never on the allocation path.
    pub fn for_each(&self, mut visit: impl FnMut(u64, Words)) {
        let _guard = self.lock.lock();
        for t in self.registered() {
            t.sync.raise(FROZEN);
            let entries = t.copy();
            t.sync.lower(FROZEN);
            for (key, value) in entries {
                visit(key, value);
            }
        }
        for s in self.shared().entries() {
            visit(s.key, s.value);
        }
    }

    /// A thread's exit: its live entries move to the shared table, its table is unregistered and
    /// unmapped. Entries the shared table has no memory for are dropped (their frees are then not
    /// counted: the figures show more in use, never less).
    fn hand_over(&self, t: *mut ThreadTable) {
        {
            let _guard = self.lock.lock();
            // SAFETY: `t` is the exiting thread's registered table; the lock is held.
            let table = unsafe { &*t };
            // SAFETY: the lock is held.
            let claims = unsafe { table.claims() };
            // The owner is this (exiting) thread.
            table.sync.remove_claimed(table.table(), claims);
            for s in table.table().entries() {
                self.shared().insert(s.key, s.value);
            }
            self.registry[table.index].store(std::ptr::null_mut(), Ordering::Release);
        }
        // SAFETY: unregistered under the lock, so no other thread can reach it any more; its owner
        // is exiting and its table pointer is EXITED.
        unsafe {
            let ThreadTable { table, claims, .. } = std::ptr::read(t);
            table.into_inner().unmap();
            claims.into_inner().unmap();
        }
        unmap_table(t);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let mut n = 0;
        self.for_each(|_, _| n += 1);
        n
    }
}

/// The `pthread` key of the exit handler, made once; `None` while another thread makes it or
/// when the system has none left.
fn exit_key() -> Option<libc::pthread_key_t> {
    match EXIT_KEY.load(Ordering::Acquire) {
        KEY_NONE => {}
        KEY_MAKING => return None,
        key => return Some(key),
    }
    if EXIT_KEY
        .compare_exchange(KEY_NONE, KEY_MAKING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None;
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out-pointer; `thread_exit` is a C destructor.
    let rc = unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) };
    if rc != 0 || key >= KEY_MAKING {
        EXIT_KEY.store(KEY_NONE, Ordering::Release);
        return None;
    }
    EXIT_KEY.store(key, Ordering::Release);
    Some(key)
}

/// The `pthread` key's destructor: hands the exiting thread's table over, unless it belongs to a
/// parent process (in a forked child), which is never touched.
unsafe extern "C" fn thread_exit(p: *mut c_void) {
    let t = p.cast::<ThreadTable>();
    if t.is_null() {
        return;
    }
    set_mine(EXITED);
    // SAFETY: `p` is the table this thread registered; sets of tables are never freed.
    let owner = unsafe { &*(*t).owner };
    if owner.epoch == EPOCH.load(Ordering::Relaxed) {
        owner.hand_over(t);
    }
}

/// Maps the memory of one thread table.
fn map_table() -> Option<*mut ThreadTable> {
    // Page-aligned, so aligned for the table.
    map_zeroed(std::mem::size_of::<ThreadTable>()).map(|p| p.cast())
}

fn unmap_table(t: *mut ThreadTable) {
    // SAFETY: `t` was mapped by `map_table` with this size and nothing refers to it any more.
    unsafe { libc::munmap(t.cast(), std::mem::size_of::<ThreadTable>()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(v: u64) -> Words {
        [v, !v]
    }

    #[test]
    fn own_frees_take_no_lock_and_cross_thread_frees_are_claimed_once() {
        let tables = ThreadTables::new().unwrap();
        assert_eq!(tables.insert(0x1000, w(1)), Some(Holder::Thread(0)));
        let (value, holder) = tables.take(0x1000).unwrap();
        assert_eq!((value, holder), (w(1), Holder::Thread(0)));
        assert_eq!(tables.take(0x1000), None);
        // Allocated on another thread, freed here; a second free finds nothing.
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..=100u64 {
                    tables.insert(i << 9, w(i)).unwrap();
                }
            });
        });
        // The thread has exited: its entries were handed over.
        for i in 1..=100u64 {
            assert_eq!(tables.take(i << 9).map(|(v, _)| v), Some(w(i)));
            assert_eq!(tables.take(i << 9), None);
        }
        assert_eq!(tables.len(), 0);
    }

    #[test]
    fn a_claim_is_removed_by_its_owner_before_the_address_is_recorded_again() {
        let tables = ThreadTables::new().unwrap();
        let (to_main, from_worker) = std::sync::mpsc::channel();
        let (to_worker, from_main) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
                let worker = tables.insert(0x4000, w(7)).unwrap();
                to_main.send(worker).unwrap();
                from_main.recv().unwrap();
                // The main thread freed 0x4000; the driver hands it out again to this thread.
                tables.insert(0x4000, w(8)).unwrap();
                assert_eq!(tables.take(0x4000).map(|(v, _)| v), Some(w(8)));
                assert_eq!(
                    tables.take(0x4000),
                    None,
                    "the old entry is gone, not found again"
                );
                to_main.send(worker).unwrap();
                from_main.recv().unwrap();
            });
            let worker = from_worker.recv().unwrap();
            let (value, holder) = tables.take(0x4000).unwrap();
            assert_eq!(value, w(7));
            assert!(
                matches!(holder, Holder::Thread(_)) && holder != worker,
                "the freeing thread counts"
            );
            assert_eq!(tables.take(0x4000), None, "claimed once");
            to_worker.send(()).unwrap();
            from_worker.recv().unwrap();
            assert_eq!(tables.len(), 0);
            to_worker.send(()).unwrap();
        });
    }

    #[test]
    fn threads_allocating_and_freeing_each_others_entries_lose_nothing() {
        let tables = ThreadTables::new().unwrap();
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let barrier = &barrier;
                s.spawn(move || {
                    for i in 1..=5_000u64 {
                        tables.insert((t << 40) | (i << 9), w(i)).unwrap();
                    }
                    barrier.wait();
                    // Each thread frees its neighbour's even entries, and its own odd ones.
                    let other = (t + 1) % 4;
                    for i in 1..=5_000u64 {
                        let (owner, key_i) = if i % 2 == 0 { (other, i) } else { (t, i) };
                        let key = (owner << 40) | (key_i << 9);
                        assert_eq!(tables.take(key).map(|(v, _)| v), Some(w(i)), "{key:#x}");
                    }
                    barrier.wait();
                });
            }
        });
        assert_eq!(tables.len(), 0);
    }

    #[test]
    fn a_report_sees_every_live_entry_while_owners_keep_changing_their_tables() {
        let tables = ThreadTables::new().unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let filled = std::sync::Barrier::new(3);
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (stop, filled) = (&stop, &filled);
                s.spawn(move || {
                    for i in 1..=1000u64 {
                        tables.insert((t << 40) | (i << 9), w(i)).unwrap();
                    }
                    filled.wait();
                    let churn = (t << 40) | (1 << 30);
                    while !stop.load(Ordering::Relaxed) {
                        tables.insert(churn, w(0)).unwrap();
                        tables.take(churn).unwrap();
                    }
                });
            }
            filled.wait();
            for _ in 0..50 {
                let mut stable = 0;
                tables.for_each(|k, _| stable += u64::from(k & (1 << 30) == 0));
                assert_eq!(stable, 2000);
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(tables.len(), 2000, "handed over at exit");
    }
}

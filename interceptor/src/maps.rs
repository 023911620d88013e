//! The ledger's tables: small open-addressing tables of nonzero `u64` keys, and a sharded map of
//! them, each shard behind its own one-word lock.
//!
//! Why written here rather than taken from a concurrent-map crate: the tables sit on the hot path of
//! a process that may `fork` at any instant while other threads allocate, and a lock that `fork`
//! copies in its held state hangs the child. These tables take their memory from `mmap` (never from
//! `malloc`, so the hook never enters the C allocator's locks on the allocation path), and a forked
//! child never touches its parent's tables (`crate::state` gives it a ledger of its own).
//!
//! Each table is a power-of-two array of slots with linear probing; deletion shifts the following
//! entries back (no tombstones), so a driver that hands out a fresh address every time never
//! degrades a table. A table doubles when half full. Slots are atomic words written with relaxed
//! stores (plain moves on x86-64 and aarch64): a table has one writer at a time, and
//! `crate::owned` lets other threads read a thread's table while its owner writes it, checked by a
//! sequence count.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Where a key lives: its shard and its home slot (before masking to the table's size).
///
/// Keys are device addresses or handles, and every bit of the key is mixed (MurmurHash3's
/// finaliser), so keys at any regular stride spread evenly. An earlier version kept the order of
/// addresses within a 64 KiB window (neighbouring home slots, for a bump-allocating driver's cache
/// lines); in one table per thread that made addresses at a 512-byte stride collide in whole runs
/// (24 probes per lookup on average at 1000 live, against 1.5 here), and frees in random order cost
/// twice the instructions. The measurements are in `BENCHMARKS.md`, item 11.
#[inline(always)]
pub fn home(key: u64) -> (usize, usize) {
    let mut x = key;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    let shard = (x >> (64 - SHARD_BITS)) as usize;
    (shard, x as usize)
}

const SHARD_BITS: u32 = 6;
/// Number of shards (each with its own lock).
pub const SHARDS: usize = 1 << SHARD_BITS;

/// What a map holds per key: plain data of at most two words, all-zero when empty.
pub trait Value: Copy + Default {
    fn to_words(self) -> [u64; 2];
    fn from_words(words: [u64; 2]) -> Self;
}
impl Value for u64 {
    #[inline(always)]
    fn to_words(self) -> [u64; 2] {
        [self, 0]
    }
    #[inline(always)]
    fn from_words(words: [u64; 2]) -> Self {
        words[0]
    }
}

/// One slot as read or written: `key == 0` is empty (no driver hands out address or handle 0 on
/// success).
#[derive(Clone, Copy, Default)]
pub struct Slot<V> {
    pub key: u64,
    pub value: V,
}

/// One slot as stored: atomic words, so that a reader on another thread (`crate::owned`) never
/// races with the writer in the language's sense; relaxed loads and stores are plain moves.
#[repr(C)]
pub struct StoredSlot {
    key: AtomicU64,
    value: [AtomicU64; 2],
}

impl StoredSlot {
    #[inline(always)]
    fn load<V: Value>(&self) -> Slot<V> {
        Slot {
            key: self.key.load(Ordering::Relaxed),
            value: V::from_words([
                self.value[0].load(Ordering::Relaxed),
                self.value[1].load(Ordering::Relaxed),
            ]),
        }
    }

    #[inline(always)]
    fn store<V: Value>(&self, slot: Slot<V>) {
        let [a, b] = slot.value.to_words();
        self.key.store(slot.key, Ordering::Relaxed);
        self.value[0].store(a, Ordering::Relaxed);
        self.value[1].store(b, Ordering::Relaxed);
    }
}

/// A table: `mask + 1` slots (a power of two) at `slots`.
///
/// Its shape (`slots`, `mask`) and length are cells: the owner of a thread's table changes them
/// through a shared reference while other threads hold one too (`crate::owned` reads the shape
/// only under its lock, and never the length), so no `&mut` to a table ever coexists with a
/// reader's `&`.
pub struct Table<V> {
    slots: Cell<*mut StoredSlot>,
    mask: Cell<usize>,
    len: Cell<usize>,
    /// True when `slots` is a mapping of its own (after a growth), which the next growth unmaps;
    /// false for the first slots, which share one mapping with the other shards'.
    own_mapping: Cell<bool>,
    kind: std::marker::PhantomData<V>,
}

/// A one-word spin lock: one `cmpxchg` takes it, a plain store releases it. Held for a few dozen
/// instructions (or a rare growth), so a waiter spins, then yields (`crate::spin`).
pub struct SpinLock(AtomicU32);

/// A held [`SpinLock`], released when dropped.
pub struct SpinGuard<'a>(&'a AtomicU32);

impl SpinLock {
    pub const fn new() -> SpinLock {
        SpinLock(AtomicU32::new(0))
    }

    #[inline]
    pub fn lock(&self) -> SpinGuard<'_> {
        let mut spins = 0u32;
        while self
            .0
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            crate::spin::back_off(spins);
        }
        SpinGuard(&self.0)
    }
}

impl Drop for SpinGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

/// One shard on cache lines of its own. `table` is only touched while `lock` is held.
#[repr(align(128))]
struct Shard<V> {
    lock: SpinLock,
    table: UnsafeCell<Table<V>>,
}

/// The lock of a shard, held until dropped.
struct Held<'a, V> {
    shard: &'a Shard<V>,
    _guard: SpinGuard<'a>,
}

impl<V> Shard<V> {
    #[inline]
    fn lock(&self) -> Held<'_, V> {
        Held {
            shard: self,
            _guard: self.lock.lock(),
        }
    }
}

impl<V> Held<'_, V> {
    #[inline]
    fn table(&mut self) -> &mut Table<V> {
        // SAFETY: the shard's lock is held by this guard, so no other thread touches its table, and
        // the guard is borrowed mutably, so no second reference exists on this thread.
        unsafe { &mut *self.shard.table.get() }
    }
}

/// Maps `bytes` of zeroed, page-aligned private memory (never `malloc`'s: the ledger grows on the
/// allocation path), `None` when the system has none to give.
pub fn map_zeroed(bytes: usize) -> Option<*mut u8> {
    // SAFETY: a fresh anonymous private mapping (zero-filled by the kernel); the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// Maps `slots` zeroed slots, `None` when the system has no memory to give.
fn map_slots(slots: usize) -> Option<*mut StoredSlot> {
    map_zeroed(slots.checked_mul(std::mem::size_of::<StoredSlot>())?).map(|p| p.cast())
}

impl<V: Value> Table<V> {
    /// A table of `slots` slots (a power of two, at least 2) in a mapping of its own.
    pub fn new(slots: usize) -> Option<Table<V>> {
        let count = slots.max(2).next_power_of_two();
        Some(Table::at(map_slots(count)?, count, true))
    }

    fn at(slots: *mut StoredSlot, count: usize, own_mapping: bool) -> Table<V> {
        Table {
            slots: Cell::new(slots),
            mask: Cell::new(count - 1),
            len: Cell::new(0),
            own_mapping: Cell::new(own_mapping),
            kind: std::marker::PhantomData,
        }
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.mask.get()
    }

    /// Live entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.len.get()
    }

    /// True when the next insert grows the table first.
    #[inline]
    pub fn full(&self) -> bool {
        (self.len() + 1) * 2 > self.mask() + 1
    }

    #[inline]
    fn stored(&self, index: usize) -> &StoredSlot {
        // SAFETY: `index & mask` is below the table's slot count and `slots` is a live mapping of
        // that many slots for as long as this table owns it.
        unsafe { &*self.slots.get().add(index & self.mask()) }
    }

    #[inline]
    pub fn slot(&self, index: usize) -> Slot<V> {
        self.stored(index).load()
    }

    #[inline]
    fn set(&self, index: usize, slot: Slot<V>) {
        self.stored(index).store(slot);
    }

    /// Slots in the table (a power of two).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.mask() + 1
    }

    /// Every entry, in slot order (the owner's, or under the table's lock; a reader beside the
    /// owner checks its sequence count around the walk).
    pub fn entries(&self) -> impl Iterator<Item = Slot<V>> + '_ {
        (0..self.capacity())
            .map(|i| self.slot(i))
            .filter(|s| s.key != 0)
    }

    /// The index of `key`, or of the empty slot where it would go. Always inlined, as
    /// [`Table::insert`] is.
    #[inline(always)]
    fn find(&self, key: u64) -> usize {
        let mask = self.mask();
        let mut i = home(key).1 & mask;
        loop {
            let k = self.slot(i).key;
            if k == key || k == 0 {
                return i & mask;
            }
            i = (i + 1) & mask;
        }
    }

    /// Doubles the table when it is half full. Returns false when it is full and cannot grow.
    #[cold]
    pub fn grow(&self) -> bool {
        let old_slots = self.capacity();
        let Some(new_count) = old_slots.checked_mul(2) else {
            return self.len() < self.mask();
        };
        let Some(fresh) = map_slots(new_count) else {
            // No memory: keep filling the old table while one free slot remains (a probe must
            // always end at an empty slot).
            return self.len() < self.mask();
        };
        let old = Table::<V>::at(self.slots.get(), old_slots, self.own_mapping.get());
        self.slots.set(fresh);
        self.mask.set(new_count - 1);
        self.len.set(0);
        self.own_mapping.set(true);
        for s in old.entries() {
            let at = self.find(s.key);
            self.set(at, s);
            self.len.set(self.len() + 1);
        }
        old.unmap();
        true
    }

    /// Inserts or replaces `key`; false when the table is full and could not grow. Always inlined
    /// (with [`Table::find`]): it is on every allocation's path, and left to itself the compiler
    /// stopped inlining one or the other when code elsewhere in the crate grew (callgrind: 20
    /// instructions a pair more; BENCHMARKS row 18).
    #[inline(always)]
    pub fn insert(&self, key: u64, value: V) -> bool {
        if self.full() && !self.grow() {
            return false;
        }
        let at = self.find(key);
        if self.slot(at).key == 0 {
            self.len.set(self.len() + 1);
        }
        self.set(at, Slot { key, value });
        true
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<V> {
        let slot = self.slot(self.find(key));
        (slot.key != 0).then_some(slot.value)
    }

    /// Removes `key`, shifting back the entries that follow it so no probe ever needs a tombstone.
    #[inline]
    pub fn remove(&self, key: u64) -> Option<V> {
        let at = self.position(key)?;
        Some(self.remove_at(at))
    }

    /// The slot of `key`, `None` when it is not in the table.
    #[inline]
    pub fn position(&self, key: u64) -> Option<usize> {
        let at = self.find(key);
        (self.slot(at).key != 0).then_some(at)
    }

    /// Removes the entry in slot `at` (found by [`Table::position`]) and returns its value.
    #[inline]
    pub fn remove_at(&self, at: usize) -> V {
        let mask = self.mask();
        let mut hole = at & mask;
        let found = self.slot(hole);
        let mut next = hole;
        loop {
            next = (next + 1) & mask;
            let s = self.slot(next);
            if s.key == 0 {
                break;
            }
            // `s` may fill the hole unless its home lies cyclically in (hole, next].
            let home = home(s.key).1 & mask;
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.set(hole, s);
                hole = next;
            }
        }
        self.set(hole, Slot::default());
        self.len.set(self.len() - 1);
        found.value
    }

    /// The value of `key` read while another thread may be writing the table (its owner, in
    /// `crate::owned`): the probe is bounded by the table's size, so a torn read can never loop,
    /// and the caller checks the owner's sequence count to know whether the answer stands. It
    /// only reads: a writer beside the owner could not tell when the owner had read a slot it was
    /// about to move.
    #[inline]
    pub fn probe_racy(&self, key: u64) -> Option<V> {
        let mask = self.mask();
        let mut i = home(key).1;
        for _ in 0..=mask {
            let s = self.slot(i);
            if s.key == key {
                return Some(s.value);
            }
            if s.key == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// Gives the table's memory back (a table that owns its mapping).
    pub fn unmap(self) {
        if self.own_mapping.get() {
            // SAFETY: `slots` was mapped by `map_slots` with exactly `mask + 1` slots, and the table
            // is consumed, so nothing refers to it any more.
            unsafe {
                libc::munmap(
                    self.slots.get().cast(),
                    self.capacity() * std::mem::size_of::<StoredSlot>(),
                )
            };
        }
    }

    pub fn clear(&self) {
        for i in 0..self.capacity() {
            self.set(i, Slot::default());
        }
        self.len.set(0);
    }
}

/// A sharded map from a nonzero `u64` key to a value.
pub struct ShardedMap<V> {
    shards: [Shard<V>; SHARDS],
}

// SAFETY: every access to a shard's table goes through that shard's lock; the raw slot pointers
// are owned by the map and never shared outside it.
unsafe impl<V> Sync for ShardedMap<V> {}
// SAFETY: as above; the map owns its mappings.
unsafe impl<V> Send for ShardedMap<V> {}

impl<V: Value> ShardedMap<V> {
    /// A map whose shards start with `slots_per_shard` slots (a power of two, at least 2), or
    /// `None` when the memory cannot be mapped.
    pub fn new(slots_per_shard: usize) -> Option<ShardedMap<V>> {
        let per = slots_per_shard.max(2).next_power_of_two();
        let block = map_slots(per.checked_mul(SHARDS)?)?;
        Some(ShardedMap {
            shards: std::array::from_fn(|i| Shard {
                lock: SpinLock::new(),
                // SAFETY: `block` holds `per * SHARDS` slots; shard `i` takes the `i`-th run.
                table: UnsafeCell::new(Table::at(unsafe { block.add(i * per) }, per, false)),
            }),
        })
    }

    #[inline]
    fn shard(&self, key: u64) -> &Shard<V> {
        &self.shards[home(key).0]
    }

    /// Inserts or replaces; false when the key is 0 or the shard is full and could not grow.
    #[inline]
    pub fn insert(&self, key: u64, value: V) -> bool {
        self.insert_then(key, value, |_| {})
    }

    /// [`ShardedMap::insert`], then, after a successful insert and still holding the shard's lock,
    /// `then(shard index)`.
    #[inline]
    pub fn insert_then(&self, key: u64, value: V, then: impl FnOnce(usize)) -> bool {
        if key == 0 {
            return false;
        }
        let shard = home(key).0;
        let mut held = self.shards[shard].lock();
        let inserted = held.table().insert(key, value);
        if inserted {
            then(shard);
        }
        inserted
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<V> {
        if key == 0 {
            return None;
        }
        self.shard(key).lock().table().get(key)
    }

    #[inline]
    pub fn remove(&self, key: u64) -> Option<V> {
        self.remove_then(key, |_, _| {})
    }

    /// [`ShardedMap::remove`], then, when the key was there and still holding the shard's lock,
    /// `then(shard index, value)`.
    #[inline]
    pub fn remove_then(&self, key: u64, then: impl FnOnce(usize, V)) -> Option<V> {
        if key == 0 {
            return None;
        }
        let shard = home(key).0;
        let mut held = self.shards[shard].lock();
        let value = held.table().remove(key)?;
        then(shard, value);
        Some(value)
    }

    /// Calls `visit(key, value)` for every entry, one shard (under its lock) at a time: for
    /// reports, never on the allocation path.
    pub fn for_each(&self, mut visit: impl FnMut(u64, V)) {
        for shard in &self.shards {
            let mut held = shard.lock();
            for slot in held.table().entries() {
                visit(slot.key, slot.value);
            }
        }
    }

    /// Empties every shard (rare: a context was destroyed).
    pub fn clear(&self) {
        for shard in &self.shards {
            shard.lock().table().clear();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().table().len())
            .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model check of the table against a `HashMap`: fresh keys (the pattern of a driver that
    /// never reuses addresses), reused keys, frees in any order, growth far past the first size.
    #[test]
    fn matches_a_reference_map_under_fresh_and_reused_keys() {
        let map = ShardedMap::new(2).unwrap();
        let mut reference = std::collections::HashMap::new();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut next_fresh = 1u64;
        for round in 0..200_000u64 {
            let r = rand();
            let live: Vec<u64> = if round % 1000 == 0 {
                reference.keys().copied().collect()
            } else {
                Vec::new()
            };
            for k in live {
                assert_eq!(map.get(k), reference.get(&k).copied());
            }
            match r % 4 {
                0 | 1 if reference.len() < 5000 => {
                    let key = if r % 8 < 4 {
                        next_fresh += 1;
                        next_fresh << 9
                    } else {
                        (rand() % 4096 + 1) << 9
                    };
                    assert!(map.insert(key, round));
                    reference.insert(key, round);
                }
                _ => {
                    let key = if reference.is_empty() || r % 16 == 0 {
                        (rand() % 8192 + 1) << 9
                    } else {
                        *reference
                            .keys()
                            .nth((r as usize >> 8) % reference.len())
                            .unwrap()
                    };
                    assert_eq!(map.remove(key), reference.remove(&key), "key {key:#x}");
                }
            }
        }
        assert_eq!(map.len(), reference.len());
    }

    #[test]
    fn concurrent_threads_never_lose_an_entry() {
        let map = ShardedMap::new(2).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let map = &map;
                s.spawn(move || {
                    for i in 1..=20_000u64 {
                        let key = (t << 40) | (i << 9);
                        assert!(map.insert(key, i));
                        if i % 3 != 0 {
                            assert_eq!(map.remove(key), Some(i));
                        }
                    }
                });
            }
        });
        assert_eq!(map.len(), 4 * (20_000 / 3));
    }
}

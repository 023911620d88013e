//! The ledger: what each live allocation the hook saw was (device, bytes, kind), so that a free can
//! be counted, plus two small side tables (pool → device, stream → device).
//!
//! Why not a general-purpose concurrent map: the ledger sits on the hot path of a process that may
//! `fork` at any instant while other threads allocate (PyTorch DataLoader workers, `multiprocessing`).
//! A lock that `fork` copies in its held state hangs the child forever. So:
//!
//! - **A child never touches its parent's ledger.** A forked child starts with a ledger of its own
//!   ([`crate::state`] drops the parent's in the `atfork` child handler and makes a new one at the
//!   child's first CUDA call), so a shard lock some parent thread held at the instant of `fork` is
//!   never waited on: nothing in the child ever looks at that memory again.
//! - **Shards, each a tiny open-addressing table behind its own one-word lock.** One `cmpxchg` takes
//!   a shard, a plain store releases it; a critical section is a few loads and stores (no allocation,
//!   no system call) except when its shard grows. 64 shards keep threads apart.
//! - **Sized to the live set.** Every shard starts with [`INITIAL_SLOTS`] slots (16 bytes each: a
//!   thousand live allocations fit in 32 KiB, cache-resident) and doubles when half full. Growing
//!   rehashes one shard (1/64 of the set) under its own lock: allocations that hash to the other 63
//!   shards never wait for it. Deletion shifts the following entries back (no tombstones), so a
//!   driver that hands out a fresh address every time never degrades the table.
//!
//! Memory for the slot arrays comes from `mmap`, never from `malloc`, so the ledger never enters the
//! C allocator's locks on the allocation path of the program.

use gpumemhook_reader::layout::{CountStripe, COUNT_STRIPES, SHARED_STRIPE};
use gpumemhook_reader::{MemKind, Segment, MAX_DEVICES};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// One live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub bytes: u64,
    pub device: u32,
    pub kind: MemKind,
}

/// Bits of a packed value that hold the byte count: 2^56 bytes (64 PiB) is more than any device holds.
const BYTES_BITS: u32 = 56;
const BYTES_MASK: u64 = (1 << BYTES_BITS) - 1;
const DEVICE_SHIFT: u32 = BYTES_BITS;
const KIND_SHIFT: u32 = 62;
const _: () = assert!(
    MAX_DEVICES <= 64,
    "six bits of a packed entry hold the device"
);

impl Entry {
    /// Packs the entry into one word; `None` when it does not fit (a byte count of 64 PiB or more).
    #[inline]
    fn pack(self) -> Option<u64> {
        if self.bytes > BYTES_MASK || self.device as usize >= MAX_DEVICES {
            return None;
        }
        Some(
            self.bytes
                | (u64::from(self.device) << DEVICE_SHIFT)
                | ((self.kind as u64) << KIND_SHIFT),
        )
    }

    #[inline]
    fn unpack(word: u64) -> Entry {
        Entry {
            bytes: word & BYTES_MASK,
            device: ((word >> DEVICE_SHIFT) & 0x3f) as u32,
            kind: match word >> KIND_SHIFT {
                1 => MemKind::Managed,
                2 => MemKind::HostPinned,
                _ => MemKind::Device,
            },
        }
    }
}

/// Where a key lives: its shard and its home slot (before masking to the shard's size).
///
/// Keys are device addresses (512-byte aligned at least) or handles. Addresses within one 64 KiB
/// window keep their order: they map to consecutive home slots, offset from a well-mixed position of
/// the window. A driver that hands out fresh addresses one after another (a bump allocator) then
/// fills neighbouring slots, whose cache lines are already hot, instead of a random line each time;
/// windows (and 2 MiB-aligned allocations) still spread evenly over the shards and the slots.
#[inline(always)]
fn home(key: u64) -> (usize, usize) {
    let mut x = key >> 16;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    let shard = (x >> (64 - SHARD_BITS)) as usize;
    let offset = ((key >> 9) & 0x7f) as usize;
    (shard, (x as usize).wrapping_add(offset))
}

const SHARD_BITS: u32 = 6;
/// Number of shards (each with its own lock).
pub const SHARDS: usize = 1 << SHARD_BITS;
const _: () = assert!(
    SHARDS == SHARED_STRIPE && SHARED_STRIPE + 1 == COUNT_STRIPES,
    "one count stripe per pointer shard, then the shared one"
);
/// Slots each shard of the allocation table starts with.
pub const INITIAL_SLOTS: usize = 32;

/// One slot: `key == 0` is empty (no driver hands out address or handle 0 on success).
#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    key: u64,
    value: u64,
}

/// A shard's table: `mask + 1` slots (a power of two) at `slots`.
struct Table {
    slots: *mut Slot,
    mask: usize,
    len: usize,
    /// True when `slots` is a mapping of its own (after a growth), which the next growth unmaps;
    /// false for the first slots, which share one mapping with the other shards'.
    own_mapping: bool,
}

/// One shard on cache lines of its own. `table` is only touched while `lock` is held.
#[repr(align(128))]
struct Shard {
    lock: AtomicU32,
    table: UnsafeCell<Table>,
}

/// The lock of a shard, held until dropped.
struct Held<'a> {
    shard: &'a Shard,
}

impl Shard {
    #[inline]
    fn lock(&self) -> Held<'_> {
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Held by another thread for a few dozen instructions (or a rare growth): spin briefly,
            // then let the holder run.
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
        Held { shard: self }
    }
}

impl Drop for Held<'_> {
    #[inline]
    fn drop(&mut self) {
        self.shard.lock.store(0, Ordering::Release);
    }
}

impl Held<'_> {
    #[inline]
    fn table(&mut self) -> &mut Table {
        // SAFETY: the shard's lock is held by this guard, so no other thread touches its table, and
        // the guard is borrowed mutably, so no second reference exists on this thread.
        unsafe { &mut *self.shard.table.get() }
    }
}

/// Maps `slots` zeroed slots, `None` when the system has no memory to give.
fn map_slots(slots: usize) -> Option<*mut Slot> {
    let bytes = slots.checked_mul(std::mem::size_of::<Slot>())?;
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

impl Table {
    #[inline]
    fn slot(&self, index: usize) -> Slot {
        // SAFETY: `index & mask` is below the table's slot count and `slots` is a live mapping of
        // that many slots, which only the holder of the shard lock touches.
        unsafe { *self.slots.add(index & self.mask) }
    }

    #[inline]
    fn set(&mut self, index: usize, slot: Slot) {
        // SAFETY: as in `slot`; `&mut self` means the shard lock is held by the caller.
        unsafe { *self.slots.add(index & self.mask) = slot }
    }

    /// The index of `key`, or of the empty slot where it would go.
    #[inline]
    fn find(&self, key: u64) -> usize {
        let mut i = home(key).1 & self.mask;
        loop {
            let k = self.slot(i).key;
            if k == key || k == 0 {
                return i & self.mask;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Doubles the table when it is half full. Returns false when it is full and cannot grow.
    #[cold]
    fn grow(&mut self) -> bool {
        let old_slots = self.mask + 1;
        let Some(new_count) = old_slots.checked_mul(2) else {
            return self.len < self.mask;
        };
        let Some(fresh) = map_slots(new_count) else {
            // No memory: keep filling the old table while one free slot remains (a probe must
            // always end at an empty slot).
            return self.len < self.mask;
        };
        let old = std::mem::replace(
            self,
            Table {
                slots: fresh,
                mask: new_count - 1,
                len: 0,
                own_mapping: true,
            },
        );
        for i in 0..old_slots {
            let s = old.slot(i);
            if s.key != 0 {
                let at = self.find(s.key);
                self.set(at, s);
                self.len += 1;
            }
        }
        if old.own_mapping {
            // SAFETY: the old slots were mapped by `map_slots` with exactly this size, and nothing
            // refers to them any more (the shard lock is held and the table was replaced).
            unsafe { libc::munmap(old.slots.cast(), old_slots * std::mem::size_of::<Slot>()) };
        }
        true
    }

    /// Inserts or replaces `key`; false when the table is full and could not grow.
    #[inline]
    fn insert(&mut self, key: u64, value: u64) -> bool {
        if (self.len + 1) * 2 > self.mask + 1 && !self.grow() {
            return false;
        }
        let at = self.find(key);
        if self.slot(at).key == 0 {
            self.len += 1;
        }
        self.set(at, Slot { key, value });
        true
    }

    #[inline]
    fn get(&self, key: u64) -> Option<u64> {
        let slot = self.slot(self.find(key));
        (slot.key != 0).then_some(slot.value)
    }

    /// Removes `key`, shifting back the entries that follow it so no probe ever needs a tombstone.
    #[inline]
    fn remove(&mut self, key: u64) -> Option<u64> {
        let mut hole = self.find(key);
        let found = self.slot(hole);
        if found.key == 0 {
            return None;
        }
        let mut next = hole;
        loop {
            next = (next + 1) & self.mask;
            let s = self.slot(next);
            if s.key == 0 {
                break;
            }
            // `s` may fill the hole unless its home lies cyclically in (hole, next].
            let home = home(s.key).1 & self.mask;
            if next.wrapping_sub(home) & self.mask >= next.wrapping_sub(hole) & self.mask {
                self.set(hole, s);
                hole = next;
            }
        }
        self.set(hole, Slot { key: 0, value: 0 });
        self.len -= 1;
        Some(found.value)
    }

    fn clear(&mut self) {
        for i in 0..=self.mask {
            self.set(i, Slot { key: 0, value: 0 });
        }
        self.len = 0;
    }
}

/// A sharded map from a nonzero `u64` key to a `u64` value.
pub struct ShardedMap {
    shards: [Shard; SHARDS],
}

// SAFETY: every access to a shard's table goes through that shard's lock; the raw slot pointers
// are owned by the map and never shared outside it.
unsafe impl Sync for ShardedMap {}
// SAFETY: as above; the map owns its mappings.
unsafe impl Send for ShardedMap {}

impl ShardedMap {
    /// A map whose shards start with `slots_per_shard` slots (a power of two, at least 2), or
    /// `None` when the memory cannot be mapped.
    pub fn new(slots_per_shard: usize) -> Option<ShardedMap> {
        let per = slots_per_shard.max(2).next_power_of_two();
        let block = map_slots(per.checked_mul(SHARDS)?)?;
        Some(ShardedMap {
            shards: std::array::from_fn(|i| Shard {
                lock: AtomicU32::new(0),
                table: UnsafeCell::new(Table {
                    // SAFETY: `block` holds `per * SHARDS` slots; shard `i` takes the `i`-th run.
                    slots: unsafe { block.add(i * per) },
                    mask: per - 1,
                    len: 0,
                    own_mapping: false,
                }),
            }),
        })
    }

    #[inline]
    fn shard(&self, key: u64) -> &Shard {
        &self.shards[home(key).0]
    }

    /// Inserts or replaces; false when the key is 0 or the shard is full and could not grow.
    #[inline]
    pub fn insert(&self, key: u64, value: u64) -> bool {
        self.insert_then(key, value, |_| {})
    }

    /// [`ShardedMap::insert`], then, after a successful insert and still holding the shard's lock,
    /// `then(shard index)`.
    #[inline]
    pub fn insert_then(&self, key: u64, value: u64, then: impl FnOnce(usize)) -> bool {
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
    pub fn get(&self, key: u64) -> Option<u64> {
        if key == 0 {
            return None;
        }
        self.shard(key).lock().table().get(key)
    }

    #[inline]
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.remove_then(key, |_, _| {})
    }

    /// [`ShardedMap::remove`], then, when the key was there and still holding the shard's lock,
    /// `then(shard index, value)`.
    #[inline]
    pub fn remove_then(&self, key: u64, then: impl FnOnce(usize, u64)) -> Option<u64> {
        if key == 0 {
            return None;
        }
        let shard = home(key).0;
        let mut held = self.shards[shard].lock();
        let value = held.table().remove(key)?;
        then(shard, value);
        Some(value)
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
            .map(|s| s.lock().table().len)
            .sum::<usize>()
    }
}

/// Which table a key belongs to: pointers (device, managed, pinned host; distinct under unified
/// addressing) and physical-memory handles (`cuMemCreate`) live apart, so a handle value can never
/// collide with a pointer.
#[derive(Clone, Copy)]
pub enum Key {
    Pointer(u64),
    Handle(u64),
}

impl Key {
    /// The address or handle itself.
    #[inline]
    pub fn value(self) -> u64 {
        match self {
            Key::Pointer(v) | Key::Handle(v) => v,
        }
    }
}

/// Where a device allocation of the ledger is counted: a stripe, written by its one writer (plain
/// stores) or shared (atomic read-modify-writes).
struct Counting<'a> {
    stripe: &'a CountStripe,
    shared: bool,
}

impl<'a> Counting<'a> {
    /// The counting of `entry` found in `shard`, `None` for memory that is not device memory.
    #[inline]
    fn of(segment: &'a Segment, entry: Entry, shard: usize, shared: bool) -> Option<Counting<'a>> {
        if entry.kind != MemKind::Device {
            return None;
        }
        let index = if shared { SHARED_STRIPE } else { shard };
        Some(Counting {
            stripe: segment.count_stripe(entry.device, index)?,
            shared,
        })
    }

    #[inline]
    fn alloc(&self, bytes: u64) {
        if self.shared {
            self.stripe.count_alloc_shared(bytes);
        } else {
            self.stripe.count_alloc(bytes);
        }
    }

    #[inline]
    fn free(&self) {
        if self.shared {
            self.stripe.count_free_shared();
        } else {
            self.stripe.count_free();
        }
    }

    #[inline]
    fn unfree(&self) {
        if self.shared {
            self.stripe.uncount_free_shared();
        } else {
            self.stripe.uncount_free();
        }
    }
}

/// The process's live allocations and the side tables. One per process image: a forked child
/// makes its own.
pub struct Ledger {
    pointers: ShardedMap,
    handles: ShardedMap,
    /// Memory pool → device, learned when the driver hands a pool out.
    pools: ShardedMap,
    /// Stream → device, learned at a stream's first stream-ordered allocation, forgotten when the
    /// stream (or any context) is destroyed.
    streams: ShardedMap,
}

impl Ledger {
    /// A new, empty ledger, `None` when its memory cannot be mapped.
    pub fn new() -> Option<Ledger> {
        Some(Ledger {
            pointers: ShardedMap::new(INITIAL_SLOTS)?,
            handles: ShardedMap::new(4)?,
            pools: ShardedMap::new(2)?,
            streams: ShardedMap::new(4)?,
        })
    }

    /// The map of `key`, the key itself, and whether its counts go to the shared stripe: pointers
    /// count in the stripe of their shard (their shard's lock makes its holder the one writer);
    /// handles, whose shards are other locks, in [`SHARED_STRIPE`] with atomic read-modify-writes.
    fn place(&self, key: Key) -> (&ShardedMap, u64, bool) {
        match key {
            Key::Pointer(k) => (&self.pointers, k, false),
            Key::Handle(k) => (&self.handles, k, true),
        }
    }

    /// Records a live allocation and, for device memory, counts it in `segment` (in the count stripe
    /// of its shard, under the shard's lock). False when it could not be recorded: its free will then
    /// not be counted either.
    #[inline]
    pub fn insert(&self, key: Key, entry: Entry, segment: &Segment) -> bool {
        let Some(value) = entry.pack() else {
            return false;
        };
        let (map, k, shared) = self.place(key);
        map.insert_then(k, value, |shard| {
            if let Some(c) = Counting::of(segment, entry, shard, shared) {
                c.alloc(entry.bytes);
            }
        })
    }

    /// Removes and returns the entry of `key`, counting the free of device memory in `segment`.
    /// Called before the real free, so the address cannot be handed out again, and recorded by
    /// another thread, between the free and its accounting.
    #[inline]
    pub fn take(&self, key: Key, segment: &Segment) -> Option<Entry> {
        let (map, k, shared) = self.place(key);
        map.remove_then(k, |shard, value| {
            if let Some(c) = Counting::of(segment, Entry::unpack(value), shard, shared) {
                c.free();
            }
        })
        .map(Entry::unpack)
    }

    /// Puts back an entry taken by [`Ledger::take`] whose free the driver refused, taking back the
    /// free it counted.
    #[inline]
    pub fn restore(&self, key: Key, entry: Entry, segment: &Segment) {
        let Some(value) = entry.pack() else {
            return;
        };
        let (map, k, shared) = self.place(key);
        map.insert_then(k, value, |shard| {
            if let Some(c) = Counting::of(segment, entry, shard, shared) {
                c.unfree();
            }
        });
    }

    /// Remembers (or with `None` forgets) the device of a memory pool.
    pub fn set_pool_device(&self, pool: u64, device: Option<u32>) {
        match device {
            Some(d) => {
                self.pools.insert(pool, u64::from(d));
            }
            None => {
                self.pools.remove(pool);
            }
        }
    }

    /// The device of a pool the hook saw handed out.
    #[inline]
    pub fn pool_device(&self, pool: u64) -> Option<u32> {
        self.pools.get(pool).map(|d| d as u32)
    }

    /// The cached device of a stream.
    #[inline]
    pub fn stream_device(&self, stream: u64) -> Option<u32> {
        self.streams.get(stream).map(|d| d as u32)
    }

    pub fn set_stream_device(&self, stream: u64, device: u32) {
        self.streams.insert(stream, u64::from(device));
    }

    pub fn forget_stream(&self, stream: u64) {
        self.streams.remove(stream);
    }

    /// Forgets every stream (a context was destroyed or reset: its streams died with it).
    pub fn forget_all_streams(&self) {
        self.streams.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment() -> Box<Segment> {
        // SAFETY: every field of `Segment` is an atomic integer (or an array of them), for which the
        // all-zero bit pattern is a valid value.
        unsafe { Box::new_zeroed().assume_init() }
    }

    fn entry(bytes: u64, device: u32) -> Entry {
        Entry {
            bytes,
            device,
            kind: MemKind::Device,
        }
    }

    #[test]
    fn take_removes_once_and_pointer_and_handle_spaces_are_apart() {
        let (l, seg) = (Ledger::new().unwrap(), segment());
        assert!(l.insert(Key::Pointer(0x1000), entry(10, 0), &seg));
        assert!(l.insert(Key::Handle(0x1000), entry(20, 1), &seg));
        assert_eq!(
            l.take(Key::Pointer(0x1000), &seg).map(|e| e.bytes),
            Some(10)
        );
        assert_eq!(l.take(Key::Pointer(0x1000), &seg), None);
        assert_eq!(l.take(Key::Handle(0x1000), &seg).map(|e| e.device), Some(1));
        assert_eq!(seg.allocation_counts(0), (1, 1, 10));
        assert_eq!(seg.allocation_counts(1), (1, 1, 20));
    }

    #[test]
    fn entries_round_trip_and_oversized_ones_are_refused() {
        let (l, seg) = (Ledger::new().unwrap(), segment());
        let e = Entry {
            bytes: BYTES_MASK,
            device: 63,
            kind: MemKind::HostPinned,
        };
        assert!(l.insert(Key::Pointer(7), e, &seg));
        assert_eq!(l.take(Key::Pointer(7), &seg), Some(e));
        assert!(!l.insert(Key::Pointer(8), entry(BYTES_MASK + 1, 0), &seg));
        assert!(
            !l.insert(Key::Pointer(0), entry(1, 0), &seg),
            "key 0 is never recorded"
        );
        assert_eq!(
            seg.allocation_counts(63),
            (0, 0, 0),
            "pinned memory is not device memory"
        );
    }

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

    #[test]
    fn striped_counts_are_exact_under_threads_and_refused_frees() {
        let (l, seg) = (Ledger::new().unwrap(), segment());
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (l, seg) = (&l, &*seg);
                s.spawn(move || {
                    for i in 1..=10_000u64 {
                        let key = Key::Pointer((t << 40) | (i << 9));
                        assert!(l.insert(key, entry(i, (t % 2) as u32), seg));
                        if i % 4 != 0 {
                            let e = l.take(key, seg).unwrap();
                            if i % 8 == 1 {
                                // The driver refused this free: the entry goes back, uncounted.
                                l.restore(key, e, seg);
                            }
                        }
                    }
                });
            }
        });
        let sum: u64 = (1..=10_000u64).sum();
        let frees = 10_000 - 2_500 - 1_250;
        for d in 0..2 {
            assert_eq!(seg.allocation_counts(d), (20_000, 2 * frees, 2 * sum));
        }
    }

    #[test]
    fn streams_are_forgotten_one_by_one_or_all_at_once() {
        let l = Ledger::new().unwrap();
        l.set_stream_device(0x55, 1);
        l.set_stream_device(0x66, 2);
        l.forget_stream(0x55);
        assert_eq!(
            (l.stream_device(0x55), l.stream_device(0x66)),
            (None, Some(2))
        );
        l.forget_all_streams();
        assert_eq!(l.stream_device(0x66), None);
    }
}

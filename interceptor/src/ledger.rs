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

use gpumemhook_reader::layout::{
    CountStripe, ModuleCell, COUNT_STRIPES, MODULE_CELLS, MODULE_MAX_ALLOCATION, SHARED_STRIPE,
};
use gpumemhook_reader::{MemKind, Segment, MAX_DEVICES};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// One live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub bytes: u64,
    pub device: u32,
    pub kind: MemKind,
    /// The module charged with it (a cell index of the segment's breakdown; device memory only).
    pub module: u8,
    /// When it was made, in milliseconds since the hook started; 0 when nobody will read it.
    pub born_ms: u64,
    /// Its Python call site ([`crate::stacks`]), 0 for none.
    pub site: u32,
}

/// Whether allocations are stamped with their birth: only when a report will list them (the
/// stamp is a clock read, which nothing else on the hot path needs).
static STAMP_BIRTHS: AtomicBool = AtomicBool::new(false);

/// Stamps every later allocation with its birth (at start-up, when a report is asked for).
pub fn stamp_births() {
    STAMP_BIRTHS.store(true, Ordering::Relaxed);
}

/// The birth stamp of an allocation made now ([`birth_stamp_now`]), 0 when births are not stamped.
#[inline]
pub fn birth_stamp() -> u64 {
    if !STAMP_BIRTHS.load(Ordering::Relaxed) {
        return 0;
    }
    birth_stamp_now()
}

/// The coarse monotonic clock in milliseconds (a read of the vDSO's page, a few nanoseconds),
/// never 0.
pub fn birth_stamp_now() -> u64 {
    (crate::trace::clock_ns(libc::CLOCK_MONOTONIC_COARSE) / 1_000_000).max(1)
}

/// An entry as stored: `word` = bytes (48 bits) | device (6) | kind (2) | module (8), `extra` =
/// birth in ms (40 bits) | site (24).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    word: u64,
    extra: u64,
}
impl Value for Packed {}

/// Bits of a packed value that hold the byte count: 2^48 bytes (256 TiB) is more than any device
/// holds, and the breakdown's cells count bytes in as many bits.
const BYTES_BITS: u32 = gpumemhook_reader::layout::MODULE_BYTES_BITS;
const BYTES_MASK: u64 = (1 << BYTES_BITS) - 1;
const DEVICE_SHIFT: u32 = BYTES_BITS;
const KIND_SHIFT: u32 = DEVICE_SHIFT + 6;
const MODULE_SHIFT: u32 = KIND_SHIFT + 2;
const BORN_MASK: u64 = (1 << 40) - 1;
const SITE_SHIFT: u32 = 40;
/// The largest site number an entry can hold.
pub const MAX_SITE: u32 = (1 << 24) - 1;
// The timeline's slots carry an entry's site too.
const _: () = assert!(MAX_SITE <= crate::trace::MAX_SLOT_SITE);
const _: () = assert!(
    MAX_DEVICES <= 64,
    "six bits of a packed entry hold the device"
);
const _: () = assert!(MODULE_CELLS <= 256, "eight bits hold the module");

impl Entry {
    /// Packs the entry; `None` when it does not fit (a byte count of 256 TiB or more).
    #[inline]
    fn pack(self) -> Option<Packed> {
        if self.bytes > BYTES_MASK || self.device as usize >= MAX_DEVICES {
            return None;
        }
        Some(Packed {
            word: self.bytes
                | (u64::from(self.device) << DEVICE_SHIFT)
                | ((self.kind as u64) << KIND_SHIFT)
                | (u64::from(self.module) << MODULE_SHIFT),
            extra: (self.born_ms & BORN_MASK) | (u64::from(self.site.min(MAX_SITE)) << SITE_SHIFT),
        })
    }

    #[inline]
    fn unpack(p: Packed) -> Entry {
        Entry {
            bytes: p.word & BYTES_MASK,
            device: ((p.word >> DEVICE_SHIFT) & 0x3f) as u32,
            kind: match (p.word >> KIND_SHIFT) & 0x3 {
                1 => MemKind::Managed,
                2 => MemKind::HostPinned,
                _ => MemKind::Device,
            },
            module: (p.word >> MODULE_SHIFT) as u8,
            born_ms: p.extra & BORN_MASK,
            site: (p.extra >> SITE_SHIFT) as u32,
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

/// What a map holds per key: plain data, all-zero when empty.
pub trait Value: Copy + Default {}
impl Value for u64 {}

/// One slot: `key == 0` is empty (no driver hands out address or handle 0 on success).
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Slot<V> {
    key: u64,
    value: V,
}

/// A shard's table: `mask + 1` slots (a power of two) at `slots`.
struct Table<V> {
    slots: *mut Slot<V>,
    mask: usize,
    len: usize,
    /// True when `slots` is a mapping of its own (after a growth), which the next growth unmaps;
    /// false for the first slots, which share one mapping with the other shards'.
    own_mapping: bool,
}

/// One shard on cache lines of its own. `table` is only touched while `lock` is held.
#[repr(align(128))]
struct Shard<V> {
    lock: AtomicU32,
    table: UnsafeCell<Table<V>>,
}

/// The lock of a shard, held until dropped.
struct Held<'a, V> {
    shard: &'a Shard<V>,
}

impl<V> Shard<V> {
    #[inline]
    fn lock(&self) -> Held<'_, V> {
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Held by another thread for a few dozen instructions (or a rare growth).
            spins += 1;
            crate::spin::back_off(spins);
        }
        Held { shard: self }
    }
}

impl<V> Drop for Held<'_, V> {
    #[inline]
    fn drop(&mut self) {
        self.shard.lock.store(0, Ordering::Release);
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

/// Maps `slots` zeroed slots, `None` when the system has no memory to give.
fn map_slots<V>(slots: usize) -> Option<*mut Slot<V>> {
    let bytes = slots.checked_mul(std::mem::size_of::<Slot<V>>())?;
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

impl<V: Value> Table<V> {
    #[inline]
    fn slot(&self, index: usize) -> Slot<V> {
        // SAFETY: `index & mask` is below the table's slot count and `slots` is a live mapping of
        // that many slots, which only the holder of the shard lock touches.
        unsafe { *self.slots.add(index & self.mask) }
    }

    #[inline]
    fn set(&mut self, index: usize, slot: Slot<V>) {
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
            unsafe { libc::munmap(old.slots.cast(), old_slots * std::mem::size_of::<Slot<V>>()) };
        }
        true
    }

    /// Inserts or replaces `key`; false when the table is full and could not grow.
    #[inline]
    fn insert(&mut self, key: u64, value: V) -> bool {
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
    fn get(&self, key: u64) -> Option<V> {
        let slot = self.slot(self.find(key));
        (slot.key != 0).then_some(slot.value)
    }

    /// Removes `key`, shifting back the entries that follow it so no probe ever needs a tombstone.
    #[inline]
    fn remove(&mut self, key: u64) -> Option<V> {
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
        self.set(hole, Slot::default());
        self.len -= 1;
        Some(found.value)
    }

    fn clear(&mut self) {
        for i in 0..=self.mask {
            self.set(i, Slot::default());
        }
        self.len = 0;
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
            let table = held.table();
            for i in 0..=table.mask {
                let slot = table.slot(i);
                if slot.key != 0 {
                    visit(slot.key, slot.value);
                }
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
    /// The breakdown cell of the allocation's device and module (`None` for one too large to
    /// attribute). Charged and discharged under the same shard lock as the entry, so an
    /// allocation's charge always comes before its discharge.
    module: Option<&'a ModuleCell>,
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
            module: if entry.bytes < MODULE_MAX_ALLOCATION {
                segment.modules.cell(entry.device, entry.module.into())
            } else {
                None
            },
        })
    }

    #[inline]
    fn alloc(&self, bytes: u64) {
        if self.shared {
            self.stripe.count_alloc_shared(bytes);
        } else {
            self.stripe.count_alloc(bytes);
        }
        if let Some(cell) = self.module {
            cell.charge(bytes);
        }
    }

    #[inline]
    fn free(&self, bytes: u64) {
        if self.shared {
            self.stripe.count_free_shared();
        } else {
            self.stripe.count_free();
        }
        if let Some(cell) = self.module {
            cell.discharge(bytes);
        }
    }

    #[inline]
    fn unfree(&self, bytes: u64) {
        if self.shared {
            self.stripe.uncount_free_shared();
        } else {
            self.stripe.uncount_free();
        }
        if let Some(cell) = self.module {
            cell.charge(bytes);
        }
    }
}

/// The process's live allocations and the side tables. One per process image: a forked child
/// makes its own.
pub struct Ledger {
    pointers: ShardedMap<Packed>,
    handles: ShardedMap<Packed>,
    /// Memory pool → device, learned when the driver hands a pool out.
    pools: ShardedMap<u64>,
    /// Stream → device, learned at a stream's first stream-ordered allocation, forgotten when the
    /// stream (or any context) is destroyed.
    streams: ShardedMap<u64>,
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
    fn place(&self, key: Key) -> (&ShardedMap<Packed>, u64, bool) {
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
            let entry = Entry::unpack(value);
            if let Some(c) = Counting::of(segment, entry, shard, shared) {
                c.free(entry.bytes);
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
                c.unfree(entry.bytes);
            }
        });
    }

    /// Calls `visit(key value, entry)` for every live allocation (pointers, then handles), a
    /// shard at a time: for reports, never on the allocation path.
    pub fn for_each_live(&self, mut visit: impl FnMut(u64, Entry)) {
        self.pointers
            .for_each(|key, value| visit(key, Entry::unpack(value)));
        self.handles
            .for_each(|key, value| visit(key, Entry::unpack(value)));
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
            module: 3,
            born_ms: 0,
            site: 0,
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
            module: 255,
            born_ms: BORN_MASK,
            site: MAX_SITE,
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

    #[test]
    fn device_entries_charge_their_module_cell_until_freed_and_a_refused_free_charges_again() {
        let (l, seg) = (Ledger::new().unwrap(), segment());
        let mut handle = entry(4096, 2);
        handle.module = 7;
        assert!(l.insert(Key::Pointer(0x2000), entry(100, 2), &seg));
        assert!(l.insert(Key::Handle(0x2000), handle, &seg));
        let cell = |m| seg.modules.cell(2, m).unwrap().read();
        assert_eq!(cell(3), (100, 100, 1));
        assert_eq!(cell(7), (4096, 4096, 1));
        let taken = l.take(Key::Pointer(0x2000), &seg).unwrap();
        assert_eq!((taken.module, taken.bytes), (3, 100));
        assert_eq!(cell(3), (0, 100, 0));
        l.restore(Key::Pointer(0x2000), taken, &seg);
        assert_eq!(cell(3), (100, 100, 1));
        let mut live = Vec::new();
        l.for_each_live(|k, e| live.push((k, e.module, e.bytes)));
        live.sort_unstable();
        assert_eq!(live, vec![(0x2000, 3, 100), (0x2000, 7, 4096)]);
        // Memory that is not device memory charges no module.
        let mut pinned = entry(64, 2);
        pinned.kind = MemKind::HostPinned;
        assert!(l.insert(Key::Pointer(0x3000), pinned, &seg));
        assert_eq!(cell(3), (100, 100, 1));
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

//! The ledger: what each live allocation the hook saw was (device, bytes, kind), so that a free can
//! be counted, plus three side tables (handles, pool → device, stream → device), and the counts it
//! keeps in the segment as entries come and go.
//!
//! Pointers (device, managed and pinned host memory) live in one table per thread
//! ([`crate::owned`]): an allocation and its free on one thread take no lock and no atomic
//! read-modify-write, and their counts go to that thread's count stripe with plain stores. The
//! other tables are sharded maps ([`crate::maps`]), each shard behind a one-word lock. A forked
//! child never touches its parent's ledger: it makes its own at its first CUDA call
//! ([`crate::state`]), so no lock a parent thread held at the instant of `fork` is ever waited on.

use gpumemhook_segment::{
    CountStripe, ModuleCell, MODULE_CELLS, MODULE_MAX_ALLOCATION, SHARED_STRIPE,
};
use gpumemhook_segment::{MemKind, Segment, MAX_DEVICES};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::maps::{ShardedMap, Value};
use crate::owned::{Holder, ThreadTables};

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
    (gpumemhook_segment::clock_ns(libc::CLOCK_MONOTONIC_COARSE) / 1_000_000).max(1)
}

/// An entry as stored: `word` = bytes (48 bits) | device (6) | kind (2) | module (8), `extra` =
/// birth in ms (40 bits) | site (24).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    word: u64,
    extra: u64,
}
impl Value for Packed {
    #[inline(always)]
    fn to_words(self) -> [u64; 2] {
        [self.word, self.extra]
    }
    #[inline(always)]
    fn from_words(words: [u64; 2]) -> Self {
        Packed {
            word: words[0],
            extra: words[1],
        }
    }
}

/// Bits of a packed value that hold the byte count: 2^48 bytes (256 TiB) is more than any device
/// holds, and the breakdown's cells count bytes in as many bits.
const BYTES_BITS: u32 = gpumemhook_segment::MODULE_BYTES_BITS;
const BYTES_MASK: u64 = (1 << BYTES_BITS) - 1;
const DEVICE_SHIFT: u32 = BYTES_BITS;
const KIND_SHIFT: u32 = DEVICE_SHIFT + 6;
const MODULE_SHIFT: u32 = KIND_SHIFT + 2;
const BORN_MASK: u64 = (1 << 40) - 1;
const SITE_SHIFT: u32 = 40;
/// The largest site number an entry can hold.
pub const MAX_SITE: u32 = (1 << 24) - 1;
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

/// The breakdown cell of a device allocation: `None` for other memory, or for one too large to
/// attribute.
#[inline(always)]
fn module_cell(segment: &Segment, entry: Entry) -> Option<&ModuleCell> {
    if entry.kind != MemKind::Device || entry.bytes >= MODULE_MAX_ALLOCATION {
        return None;
    }
    segment.modules.cell(entry.device, entry.module.into())
}

/// The count stripe of thread table `index` (below [`SHARED_STRIPE`], 64): a permutation that puts
/// the stripes of tables 0 to 7 eight stripes (192 bytes) apart. Stripes are 24 bytes, so
/// neighbouring ones share a cache line, and two threads writing one line move it between their
/// cores at every allocation (measured: 2 threads, 154 ns a pair instead of 131).
#[inline(always)]
fn spread(index: usize) -> usize {
    (index % 8) * 8 + index / 8
}

const _: () = assert!(SHARED_STRIPE == 64, "spread() permutes 0..64");

/// Where the counts of a change to device memory go: the count stripe of the thread that makes it,
/// written by that thread alone with plain stores, or the shared stripe, written with atomic
/// read-modify-writes (handles, and threads without a table of their own).
#[derive(Clone, Copy)]
struct Counting<'a> {
    stripe: &'a CountStripe,
    shared: bool,
}

impl<'a> Counting<'a> {
    #[inline(always)]
    fn of(segment: &'a Segment, entry: Entry, holder: Holder) -> Option<Counting<'a>> {
        if entry.kind != MemKind::Device {
            return None;
        }
        let (index, shared) = match holder {
            Holder::Thread(i) if i < SHARED_STRIPE => (spread(i), false),
            _ => (SHARED_STRIPE, true),
        };
        Some(Counting {
            stripe: segment.count_stripe(entry.device, index)?,
            shared,
        })
    }

    #[inline(always)]
    fn alloc(self, bytes: u64) {
        if self.shared {
            self.stripe.count_alloc_shared(bytes);
        } else {
            self.stripe.count_alloc(bytes);
        }
    }

    #[inline(always)]
    fn free(self) {
        if self.shared {
            self.stripe.count_free_shared();
        } else {
            self.stripe.count_free();
        }
    }

    #[inline(always)]
    fn unfree(self) {
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
    /// Device, managed and pinned host pointers, one table per thread.
    pointers: &'static ThreadTables,
    /// Physical-memory handles (`cuMemCreate`), a value space of their own.
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
            pointers: ThreadTables::new()?,
            handles: ShardedMap::new(4)?,
            pools: ShardedMap::new(2)?,
            streams: ShardedMap::new(4)?,
        })
    }

    /// Records `value` under `key`: who counts it, `None` when it could not be recorded.
    #[inline(always)]
    fn put(&self, key: Key, value: Packed) -> Option<Holder> {
        match key {
            Key::Pointer(0) => None,
            Key::Pointer(k) => self.pointers.insert(k, value.to_words()),
            Key::Handle(k) => self.handles.insert(k, value).then_some(Holder::Shared),
        }
    }

    /// Records `entry` under `key` with its module's cell charged: who counts it, `None` (nothing
    /// charged) when it could not be recorded.
    ///
    /// The cell is charged before the entry is recorded, so that a free on another thread, which
    /// can find the entry from then on, always discharges after the charge.
    #[inline(always)]
    fn put_charged(&self, key: Key, entry: Entry, segment: &Segment) -> Option<Holder> {
        let value = entry.pack()?;
        let cell = module_cell(segment, entry);
        if let Some(c) = cell {
            c.charge(entry.bytes);
        }
        let holder = self.put(key, value);
        if let (None, Some(c)) = (holder, cell) {
            c.discharge(entry.bytes);
        }
        holder
    }

    /// Records a live allocation and, for device memory, counts it in `segment`. False when it
    /// could not be recorded: its free will then not be counted either.
    #[inline(always)]
    pub fn insert(&self, key: Key, entry: Entry, segment: &Segment) -> bool {
        let Some(holder) = self.put_charged(key, entry, segment) else {
            return false;
        };
        // After the entry is visible, so a free on another thread can count its free first: for
        // that instant a reader may see `frees` one ahead of `allocs` (two counters shown apart;
        // no reader subtracts them).
        if let Some(c) = Counting::of(segment, entry, holder) {
            c.alloc(entry.bytes);
        }
        true
    }

    /// Removes and returns the entry of `key`, counting the free of device memory in `segment`.
    /// Called before the real free, so the address cannot be handed out again, and recorded by
    /// another thread, between the free and its accounting.
    #[inline(always)]
    pub fn take(&self, key: Key, segment: &Segment) -> Option<Entry> {
        let (value, holder) = match key {
            Key::Pointer(0) => return None,
            Key::Pointer(k) => {
                let (words, holder) = self.pointers.take(k)?;
                (Packed::from_words(words), holder)
            }
            Key::Handle(k) => (self.handles.remove(k)?, Holder::Shared),
        };
        let entry = Entry::unpack(value);
        if let Some(c) = Counting::of(segment, entry, holder) {
            c.free();
        }
        if let Some(c) = module_cell(segment, entry) {
            c.discharge(entry.bytes);
        }
        Some(entry)
    }

    /// Puts back an entry taken by [`Ledger::take`] whose free the driver refused, taking back the
    /// free it counted.
    #[inline]
    pub fn restore(&self, key: Key, entry: Entry, segment: &Segment) {
        if let Some(holder) = self.put_charged(key, entry, segment) {
            if let Some(c) = Counting::of(segment, entry, holder) {
                c.unfree();
            }
        }
    }

    /// Calls `visit(key value, entry)` for every live allocation (pointers, then handles): for
    /// reports, never on the allocation path.
    pub fn for_each_live(&self, mut visit: impl FnMut(u64, Entry)) {
        self.pointers
            .for_each(|key, words| visit(key, Entry::unpack(Packed::from_words(words))));
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

    #[test]
    fn spread_permutes_the_stripes() {
        let mut seen: Vec<usize> = (0..SHARED_STRIPE).map(spread).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..SHARED_STRIPE).collect::<Vec<_>>());
        assert_eq!((spread(0), spread(1), spread(7), spread(8)), (0, 8, 56, 1));
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

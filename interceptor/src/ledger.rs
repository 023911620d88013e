//! The ledger: what each live allocation the hook saw was (device, bytes, kind), so that a free can
//! be counted. A concurrent map, sharded (no global lock), pre-sized so it does not grow, and so
//! allocate, until a process holds many allocations at once.

use dashmap::DashMap;
use gpumemhook_reader::MemKind;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

/// One live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub bytes: u64,
    pub device: u32,
    pub kind: MemKind,
    /// The fork generation that made it: a forked child never counts its parent's frees.
    pub epoch: u32,
}

/// Hashes a pointer or handle: a 64-bit finaliser, so the low bits that aligned addresses share
/// (all zero) do not crowd the map's buckets.
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type Map = DashMap<u64, Entry, BuildHasherDefault<AddressHasher>>;

/// Pointers (device, managed, pinned host: distinct under unified addressing) and physical-memory
/// handles (`cuMemCreate`) live in separate maps, so a handle value can never collide with a pointer.
pub struct Ledger {
    pointers: Map,
    handles: Map,
    /// Memory pool → device, learned when the driver hands a pool out.
    pools: DashMap<u64, u32, BuildHasherDefault<AddressHasher>>,
    /// Bumped in a forked child, so entries inherited from the parent are ignored there.
    epoch: AtomicU32,
}

/// Which map a key belongs to.
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

impl Ledger {
    pub fn new() -> Ledger {
        let map =
            || Map::with_capacity_and_hasher_and_shard_amount(1 << 16, Default::default(), 64);
        Ledger {
            pointers: map(),
            handles: Map::with_capacity_and_hasher_and_shard_amount(
                1 << 10,
                Default::default(),
                16,
            ),
            epoch: AtomicU32::new(0),
            pools: DashMap::with_capacity_and_hasher_and_shard_amount(64, Default::default(), 4),
        }
    }

    fn map(&self, key: Key) -> (&Map, u64) {
        match key {
            Key::Pointer(k) => (&self.pointers, k),
            Key::Handle(k) => (&self.handles, k),
        }
    }

    /// Records a live allocation.
    #[inline]
    pub fn insert(&self, key: Key, bytes: u64, device: u32, kind: MemKind) {
        let (map, k) = self.map(key);
        let epoch = self.epoch.load(Ordering::Relaxed);
        map.insert(
            k,
            Entry {
                bytes,
                device,
                kind,
                epoch,
            },
        );
    }

    /// Puts back an entry taken by [`Ledger::take`] whose free the driver refused.
    #[inline]
    pub fn restore(&self, key: Key, entry: Entry) {
        let (map, k) = self.map(key);
        map.insert(k, entry);
    }

    /// Removes and returns the entry of `key` if it was made in this process (not inherited over
    /// `fork`). Called before the real free, so the address cannot be handed out again, and
    /// recorded by another thread, between the free and its accounting.
    #[inline]
    pub fn take(&self, key: Key) -> Option<Entry> {
        let (map, k) = self.map(key);
        let (_, entry) = map.remove(&k)?;
        (entry.epoch == self.epoch.load(Ordering::Relaxed)).then_some(entry)
    }

    /// Remembers (or with `None` forgets) the device of a memory pool.
    pub fn set_pool_device(&self, pool: u64, device: Option<u32>) {
        match device {
            Some(d) => {
                self.pools.insert(pool, d);
            }
            None => {
                self.pools.remove(&pool);
            }
        }
    }

    /// The device of a pool the hook saw handed out.
    #[inline]
    pub fn pool_device(&self, pool: u64) -> Option<u32> {
        self.pools.get(&pool).map(|d| *d)
    }

    /// Starts a new epoch (in a forked child): every entry made before is ignored from now on.
    pub fn new_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pointers.len() + self.handles.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_removes_once_and_pointer_and_handle_spaces_are_apart() {
        let l = Ledger::new();
        l.insert(Key::Pointer(0x1000), 10, 0, MemKind::Device);
        l.insert(Key::Handle(0x1000), 20, 1, MemKind::Device);
        assert_eq!(l.take(Key::Pointer(0x1000)).map(|e| e.bytes), Some(10));
        assert_eq!(l.take(Key::Pointer(0x1000)), None);
        assert_eq!(l.take(Key::Handle(0x1000)).map(|e| e.device), Some(1));
    }

    #[test]
    fn entries_of_an_older_epoch_are_not_counted() {
        let l = Ledger::new();
        l.insert(Key::Pointer(0x2000), 10, 0, MemKind::Device);
        l.new_epoch();
        assert_eq!(l.take(Key::Pointer(0x2000)), None);
        assert!(l.is_empty());
    }
}

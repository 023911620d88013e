//! The shared-memory segment: its one and only definition.
//!
//! The interceptor writes through these types and every reader reads through them, so writer and
//! reader can never disagree about an offset. Everything in the segment is an atomic, which makes
//! `&Segment` safe to share between threads and between processes that map the same file.
//!
//! The hot-path operations (reserve, commit, release, the peak fold into scopes) live here too, as
//! `#[inline]` methods that never allocate, never lock and never panic: the semantics of `used`,
//! `peak` and scopes have a single home. Opening, resetting and closing scopes (the protocol that
//! any process may run against the segment) is `crate::scope`'s, which uses these types.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};

pub use crate::text::{read_text, write_bytes, write_text};
use std::time::Duration;

/// `b"GPUMEMHK"` read as a little-endian integer: the first eight bytes of every segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPUMEMHK");
/// The time of `clock` in nanoseconds, never 0 (which marks "not yet" or "never"): the one clock
/// reading of the hook and of the segment's time stamps (the vDSO serves the monotonic clocks
/// without a system call).
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; only clocks every Linux the hook loads on has are asked
    // for (CLOCK_MONOTONIC, CLOCK_MONOTONIC_COARSE: 2.6.32+).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
        .max(1)
}

/// Readers refuse a segment whose major version differs from theirs.
pub const LAYOUT_MAJOR: u32 = 2;
/// Additions that old readers can ignore bump the minor version.
pub const LAYOUT_MINOR: u32 = 3;
/// Device ordinals `0..MAX_DEVICES` are counted; larger ones pass through uncounted.
pub const MAX_DEVICES: usize = 64;
/// Number of scope slots (concurrently open peak markers) per segment.
pub const MAX_SCOPES: usize = 256;
const SCOPE_MASK_WORDS: usize = MAX_SCOPES / 64;
/// Scope changes that may be in progress at once (more wait, bounded, for an entry).
pub const CHANGE_ENTRIES: usize = 8;
/// The longest any scope operation waits for another actor before failing with
/// [`ScopeSlotError::Busy`].
pub const CHANGE_WAIT: Duration = Duration::from_millis(500);
/// Value of a device's `limit` when no ceiling is set.
pub const NO_LIMIT: u64 = u64::MAX;
/// Bytes of the command line kept in the header (NUL-padded, truncated).
pub const COMMAND_LEN: usize = 256;
/// Bytes of a scope name (NUL-padded, truncated).
pub const SCOPE_NAME_LEN: usize = 64;
/// Bytes of the job labels text (`VARIABLE=value` lines, NUL-padded; see [`crate::labels`]).
pub const JOB_LABELS_LEN: usize = 1024;

/// Shared objects the hook can name per process; allocations of any further one are charged to the
/// `other` cell ([`OTHER_MODULE`]).
pub const MODULE_SLOTS: usize = 32;
/// Index of the `other` cell in each device's row of [`Modules::cells`].
pub const OTHER_MODULE: usize = MODULE_SLOTS;
/// Bytes of a module's path kept in the segment (NUL-padded, truncated).
pub const MODULE_PATH_LEN: usize = 256;
/// Low bits of [`ModuleCell::held`] that hold bytes; the bits above count live allocations.
pub const MODULE_BYTES_BITS: u32 = 48;
/// The largest single allocation a module cell can take: larger ones (no device has that much
/// memory) are left out of the breakdown, so they can never carry into the allocation count.
pub const MODULE_MAX_ALLOCATION: u64 = 1 << (MODULE_BYTES_BITS - 1);

/// Python call sites (`GPUMEMHOOK_STACKS`) a segment holds: the first ones the process records, in
/// the order it records them. Later ones stay in the hook's reports and timeline, not here.
pub const SITE_SLOTS: usize = 256;
/// Bytes of a site's text kept in the segment (NUL-padded, cut at a character boundary).
pub const SITE_TEXT_LEN: usize = 480;

/// Header flag: the segment lives in process memory only (no file could be created).
pub const FLAG_PRIVATE: u32 = 1;

/// Process-wide facts, written once before `magic` is published, plus the scope bitmask.
#[repr(C, align(128))]
pub struct Header {
    /// [`MAGIC`], stored last (release) when the segment is created.
    pub magic: AtomicU64,
    pub layout_major: AtomicU32,
    pub layout_minor: AtomicU32,
    /// `size_of::<Header>()` of the writer.
    pub header_size: AtomicU32,
    /// `size_of::<Segment>()` of the writer.
    pub segment_size: AtomicU32,
    pub pid: AtomicU32,
    pub flags: AtomicU32,
    /// Wall-clock time the hook started, nanoseconds since the Unix epoch.
    pub start_unix_ns: AtomicU64,
    /// Field 22 of `/proc/<pid>/stat` (start time in clock ticks): with `pid`, tells a live process
    /// from a later one that reused its pid.
    pub proc_start_ticks: AtomicU64,
    /// Bit `d` is set once device `d` saw any allocation activity.
    pub devices_touched: AtomicU64,
    /// Live pinned host bytes (`cuMemHostAlloc`, `cuMemAllocHost`, host-located `cuMemCreate`).
    pub host_pinned: AtomicU64,
    pub host_pinned_peak: AtomicU64,
    pub host_allocs: AtomicU64,
    pub host_frees: AtomicU64,
    /// Bit `i` set: scope slot `i` is open and folds every allocation into its peaks.
    pub scopes_active: [AtomicU64; SCOPE_MASK_WORDS],
    /// Generation counter handed to scopes, so a stale handle never touches a reused slot.
    pub scope_generation: AtomicU64,
    /// Actor tokens of the scope changes (opens, resets) in progress, 0 for a free entry; see the
    /// scope protocol in [`Segment::repair_scopes`]'s section.
    pub change_owners: [AtomicU64; CHANGE_ENTRIES],
    /// The command line, space-joined, NUL-padded.
    pub command: [AtomicU8; COMMAND_LEN],
    /// Where the process belongs (rank, Slurm job, pod): [`crate::labels`] writes and reads it.
    /// Added in layout 2.
    pub job_labels: [AtomicU8; JOB_LABELS_LEN],
    /// The version of the gpumemhook that wrote the segment ([`VERSION`]), NUL-padded.
    pub version: [AtomicU8; VERSION_LEN],
}

/// The release of gpumemhook this crate belongs to: the workspace's one version, which the hook,
/// the CLI, the Python package and the wheel all show.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Bytes of the version kept in the header (NUL-padded).
pub const VERSION_LEN: usize = 32;

/// One device's counters. Each device sits on its own cache lines, so devices never share one.
#[repr(C, align(128))]
pub struct DeviceCounters {
    /// Device bytes held now through intercepted allocations.
    pub used: AtomicU64,
    /// Largest `used` since start or the last [`DeviceCounters::reset_peak`].
    pub peak: AtomicU64,
    /// Allocation ceiling in bytes, [`NO_LIMIT`] when none.
    pub limit: AtomicU64,
    /// Allocations refused by the ceiling (the driver was never called).
    pub denied: AtomicU64,
    /// Allocations the driver itself failed.
    pub failed: AtomicU64,
    /// Live managed (unified) bytes whose allocation happened with this device current.
    pub managed: AtomicU64,
    pub managed_peak: AtomicU64,
    /// The scope floor: every scope open now has a peak of at least `floor` on this device, so an
    /// allocation that leaves `used` at or below it need not visit any scope. Packed as
    /// `generation:15 | busy:1 | floor:48`, busy meaning a scope change may be in progress; see
    /// [`Segment::commit_alloc`] and the scope protocol.
    pub scope_floor: AtomicU64,
    /// Total memory of the emulated card in bytes, 0 when the device is not emulated
    /// (`GPUMEMHOOK_EMULATE`, see `docs/emulation.md`).
    pub emulated_total: AtomicU64,
    /// Device memory of this process that no allocation accounts for (context, loaded modules),
    /// charged inside the emulated total: NVML's per-process figure minus `used`, last measured.
    pub overhead: AtomicU64,
    /// The emulated card: index in `cards::CARDS` plus one, 0 for a bare size.
    pub emulated_card: AtomicU64,
    /// When the peak was last restarted ([`DeviceCounters::reset_peak`]), `CLOCK_MONOTONIC`
    /// nanoseconds (the clock is the machine's, so any process's reading compares); 0 for never.
    /// The hook puts the restart on its timeline when it next sees this change. Added in layout 2.3.
    pub peak_reset_ns: AtomicU64,
    /// When the ceiling was last set ([`Segment::set_limit`]), `CLOCK_MONOTONIC` nanoseconds; 0 for
    /// never. Lets the timeline place a ceiling set by another process where it took effect, even
    /// after the last allocation. Added in layout 2.3.
    pub limit_set_ns: AtomicU64,
}

pub(crate) const FLOOR_MASK: u64 = (1 << 48) - 1;
pub(crate) const BUSY: u64 = 1 << 48;
const GENERATION_ONE: u64 = 1 << 49;
const GENERATION_MASK: u64 = !(FLOOR_MASK | BUSY);

/// The floor word with the next generation, BUSY off and the floor at zero.
#[inline]
pub(crate) fn next_generation(word: u64) -> u64 {
    (word & GENERATION_MASK).wrapping_add(GENERATION_ONE) & GENERATION_MASK
}

/// The generation and in-progress bits of a floor word.
#[inline]
fn floor_epoch(word: u64) -> u64 {
    word & !FLOOR_MASK
}

/// A resettable peak marker. Open scopes fold every allocation's new `used` into `peak[device]`.
#[repr(C, align(128))]
pub struct ScopeSlot {
    /// `actor token << PHASE_BITS | phase`; see the scope protocol.
    pub state: AtomicU64,
    /// Device the scope reports by default, -1 for every device.
    pub device: AtomicI32,
    pub generation: AtomicU64,
    pub owner_pid: AtomicU32,
    pub opened_unix_ns: AtomicU64,
    pub name: [AtomicU8; SCOPE_NAME_LEN],
    /// `used` of each device when the scope was opened or last reset.
    pub base: [AtomicU64; MAX_DEVICES],
    /// Largest `used` of each device while the scope was open (since its last reset).
    pub peak: [AtomicU64; MAX_DEVICES],
}

/// The whole segment, as mapped from `/dev/shm/gpumemhook-<uid>-<pid>`.
#[repr(C)]
pub struct Segment {
    pub header: Header,
    pub devices: [DeviceCounters; MAX_DEVICES],
    pub scopes: [ScopeSlot; MAX_SCOPES],
    /// Allocation counts per device, in [`COUNT_STRIPES`] stripes (see [`CountStripe`]).
    pub counts: [[CountStripe; COUNT_STRIPES]; MAX_DEVICES],
    /// Device memory per (device, shared object that asked for it). Added in layout 2.1.
    pub modules: Modules,
    /// Device memory per Python call site, all devices together. Added in layout 2.2.
    pub sites: Sites,
}

/// The Python call sites of a process (`GPUMEMHOOK_STACKS`), all devices together.
#[repr(C, align(64))]
pub struct Sites {
    /// The highest site number named so far: readers look at `slots[..named]` only, so a process
    /// with few sites costs a reader a few cache lines.
    pub named: AtomicU64,
    pub slots: [SiteSlot; SITE_SLOTS],
}

impl Sites {
    /// The slot of site `number` (numbers start at 1), `None` for 0 and numbers past
    /// [`SITE_SLOTS`].
    #[inline]
    pub fn slot(&self, number: u32) -> Option<&SiteSlot> {
        self.slots
            .get(usize::try_from(number).ok()?.checked_sub(1)?)
    }

    /// Names site `number` (before its first charge).
    pub fn name(&self, number: u32, text: &str) {
        if let Some(slot) = self.slot(number) {
            slot.name(text);
            self.named.fetch_max(u64::from(number), Ordering::Release);
        }
    }

    /// `(text, used, peak, allocs)` of every named site, in number order.
    pub fn read(&self) -> Vec<(String, u64, u64, u64)> {
        let named = (self.named.load(Ordering::Acquire) as usize).min(SITE_SLOTS);
        self.slots[..named]
            .iter()
            .filter_map(|slot| {
                Some((
                    slot.text()?,
                    slot.used.load(Ordering::Relaxed),
                    slot.peak.load(Ordering::Relaxed),
                    slot.allocs.load(Ordering::Relaxed),
                ))
            })
            .collect()
    }
}

/// One Python call site's device memory, all devices together: site number `i + 1` of the process
/// is slot `i`. Written by the hook (charged and discharged with atomic read-modify-writes: only
/// allocations whose site is recorded, an opt-in path), named once, before its first charge.
#[repr(C, align(64))]
pub struct SiteSlot {
    /// 1 once `text` is written (release; readers load it with acquire before the text).
    pub named: AtomicU32,
    pub reserved: AtomicU32,
    /// Bytes its allocations hold now.
    pub used: AtomicU64,
    /// Largest `used` since the process started.
    pub peak: AtomicU64,
    /// Its allocations still held.
    pub allocs: AtomicU64,
    /// `file:line in function < file:line in caller ...`, innermost first.
    pub text: [AtomicU8; SITE_TEXT_LEN],
}

const _: () = assert!(std::mem::size_of::<SiteSlot>() == 512);

impl SiteSlot {
    /// Names the slot (the writer does it before its first charge; naming twice writes the same
    /// text again).
    fn name(&self, text: &str) {
        write_text(&self.text, text);
        self.named.store(1, Ordering::Release);
    }

    /// The site's text, `None` while the slot is unnamed.
    pub fn text(&self) -> Option<String> {
        (self.named.load(Ordering::Acquire) == 1).then(|| read_text(&self.text))
    }

    /// Charges an allocation of `bytes` made at this site.
    #[inline]
    pub fn charge(&self, bytes: u64) {
        let used = self
            .used
            .fetch_add(bytes, Ordering::Relaxed)
            .wrapping_add(bytes);
        fold_max(&self.peak, used);
        self.allocs.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes back an allocation of `bytes` charged here.
    #[inline]
    pub fn discharge(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        self.allocs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The breakdown of device memory by the shared object (library or executable) that called into
/// CUDA for it. The hook names a module in `names` the first time one of its allocations is
/// counted, and charges each device allocation to the cell of its device and module.
#[repr(C)]
pub struct Modules {
    pub names: [ModuleName; MODULE_SLOTS],
    /// `cells[device][slot]`, slot [`OTHER_MODULE`] for modules past the named ones.
    pub cells: [[ModuleCell; MODULE_CELLS]; MAX_DEVICES],
}

/// Cells per device: one per named module and `other`.
pub const MODULE_CELLS: usize = MODULE_SLOTS + 1;

/// The name of one module slot: its full path, published by `named`.
#[repr(C)]
pub struct ModuleName {
    /// 1 once `path` is written (release; readers load it with acquire before the path).
    pub named: AtomicU32,
    /// Full path of the shared object, or of the executable for the main program.
    pub path: [AtomicU8; MODULE_PATH_LEN],
}

/// One module's device memory on one device. Each cell has its own cache line, so two modules
/// allocating on two threads never share one.
///
/// `held` packs bytes (low [`MODULE_BYTES_BITS`] bits) and the live allocation count (the 16 bits
/// above) into one word, so that charging an allocation is one read-modify-write: the cost the
/// breakdown adds to the hot path. The count wraps at 65536; `wraps` counts the wraps (up when a
/// charge carries out of the top, down when a discharge borrows), so the live count is
/// `wraps × 65536 + count` whatever the number of allocations. Bytes cannot carry into the count:
/// a device holds far less than 2⁴⁸ bytes and larger single allocations are refused
/// ([`MODULE_MAX_ALLOCATION`]).
#[repr(C, align(64))]
pub struct ModuleCell {
    pub held: AtomicU64,
    /// Largest held bytes since the process started.
    pub peak: AtomicU64,
    /// Wraps of the 16-bit live allocation count (two's complement, may go down).
    pub wraps: AtomicU64,
}

const MODULE_BYTES_MASK: u64 = (1 << MODULE_BYTES_BITS) - 1;
const MODULE_ONE_ALLOCATION: u64 = 1 << MODULE_BYTES_BITS;

impl ModuleCell {
    /// Charges a live allocation of `bytes`; false (nothing charged) for one too large to attribute.
    #[inline]
    pub fn charge(&self, bytes: u64) -> bool {
        if bytes >= MODULE_MAX_ALLOCATION {
            return false;
        }
        let before = self
            .held
            .fetch_add(MODULE_ONE_ALLOCATION | bytes, Ordering::Relaxed);
        if before >> MODULE_BYTES_BITS == u64::MAX >> MODULE_BYTES_BITS {
            self.wraps.fetch_add(1, Ordering::Relaxed);
        }
        fold_max(&self.peak, (before & MODULE_BYTES_MASK) + bytes);
        true
    }

    /// Takes back an allocation of `bytes` that [`ModuleCell::charge`] accepted.
    #[inline]
    pub fn discharge(&self, bytes: u64) {
        let before = self
            .held
            .fetch_sub(MODULE_ONE_ALLOCATION | bytes, Ordering::Relaxed);
        if before >> MODULE_BYTES_BITS == 0 {
            self.wraps.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// `(bytes held, peak bytes, live allocations)`.
    pub fn read(&self) -> (u64, u64, u64) {
        let held = self.held.load(Ordering::Relaxed);
        let wraps = self.wraps.load(Ordering::Relaxed);
        let count = wraps
            .wrapping_shl(64 - MODULE_BYTES_BITS)
            .wrapping_add(held >> MODULE_BYTES_BITS);
        (
            held & MODULE_BYTES_MASK,
            self.peak.load(Ordering::Relaxed),
            count,
        )
    }
}

impl Modules {
    /// The cell of `device` and module `slot` ([`OTHER_MODULE`] included).
    #[inline]
    pub fn cell(&self, device: u32, slot: usize) -> Option<&ModuleCell> {
        self.cells.get(device as usize)?.get(slot)
    }

    /// Names slot `slot` (the writer does it once per slot, before charging its cells).
    pub fn name(&self, slot: usize, path: &[u8]) {
        if let Some(n) = self.names.get(slot) {
            write_bytes(&n.path, path);
            n.named.store(1, Ordering::Release);
        }
    }

    /// The path of slot `slot`, `None` while it is unnamed.
    pub fn path(&self, slot: usize) -> Option<String> {
        let n = self.names.get(slot)?;
        (n.named.load(Ordering::Acquire) == 1).then(|| read_text(&n.path))
    }
}

/// Stripes of each device's allocation counts: one per shard of the hook's ledger of pointers
/// (written with plain stores by the shard's lock holder), and [`SHARED_STRIPE`] for the rest.
pub const COUNT_STRIPES: usize = 65;
/// The stripe written with atomic read-modify-writes by any thread (physical-memory handles, whose
/// ledger shards are not the pointers'): never mixed with plain stores.
pub const SHARED_STRIPE: usize = COUNT_STRIPES - 1;

/// A part of one device's allocation counts (successful allocations, frees of allocations the hook
/// saw, bytes ever allocated). The device's counts are the sums over its stripes.
///
/// Why stripes: an atomic read-modify-write costs 10 ns or more on some server processors, and a
/// counter shared by every thread moves between cores on each one. The hook updates stripe `s` only
/// while it holds shard `s` of its ledger (the shard of the allocation's address), so each stripe has
/// one writer at a time, which uses plain loads and stores; readers in any process load them. The
/// last stripe ([`SHARED_STRIPE`]) is only ever written with atomic read-modify-writes.
#[repr(C)]
pub struct CountStripe {
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub total_allocated: AtomicU64,
}

impl CountStripe {
    /// Counts a successful allocation of `bytes`. Only the holder of the stripe's ledger shard calls it.
    #[inline]
    pub fn count_alloc(&self, bytes: u64) {
        bump(&self.allocs, 1);
        bump(&self.total_allocated, bytes);
    }

    /// Counts a free. Only the holder of the stripe's ledger shard calls it.
    #[inline]
    pub fn count_free(&self) {
        bump(&self.frees, 1);
    }

    /// Takes back a free counted for a free the driver then refused.
    #[inline]
    pub fn uncount_free(&self) {
        let n = self.frees.load(Ordering::Relaxed);
        self.frees.store(n.wrapping_sub(1), Ordering::Relaxed);
    }

    /// [`CountStripe::count_alloc`] for the shared stripe (any number of writers).
    #[inline]
    pub fn count_alloc_shared(&self, bytes: u64) {
        self.allocs.fetch_add(1, Ordering::Relaxed);
        self.total_allocated.fetch_add(bytes, Ordering::Relaxed);
    }

    /// [`CountStripe::count_free`] for the shared stripe.
    #[inline]
    pub fn count_free_shared(&self) {
        self.frees.fetch_add(1, Ordering::Relaxed);
    }

    /// [`CountStripe::uncount_free`] for the shared stripe.
    #[inline]
    pub fn uncount_free_shared(&self) {
        self.frees.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `cell += by` by its only writer: a load and a store, no read-modify-write.
#[inline]
fn bump(cell: &AtomicU64, by: u64) {
    let n = cell.load(Ordering::Relaxed);
    cell.store(n.wrapping_add(by), Ordering::Relaxed);
}

/// Size in bytes of a segment of this layout.
pub const SEGMENT_SIZE: usize = std::mem::size_of::<Segment>();

/// Where an intercepted allocation's bytes are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MemKind {
    Device = 0,
    Managed = 1,
    HostPinned = 2,
}

impl MemKind {
    /// The kind whose `repr(u8)` code is `code`, `None` for a code no kind has.
    pub const fn from_code(code: u8) -> Option<MemKind> {
        match code {
            0 => Some(MemKind::Device),
            1 => Some(MemKind::Managed),
            2 => Some(MemKind::HostPinned),
            _ => None,
        }
    }

    /// The kind's name in a timeline's events (`device`, `managed`, `host_pinned`): the one mapping
    /// from kind to name, for the writer and the readers of timelines.
    pub const fn name(self) -> &'static str {
        match self {
            MemKind::Device => "device",
            MemKind::Managed => "managed",
            MemKind::HostPinned => "host_pinned",
        }
    }
}

/// Why a scope operation did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScopeSlotError {
    /// Every slot is taken.
    Full,
    /// The handle's slot was closed (and maybe reused) since the handle was made.
    Stale,
    /// Another live actor held what this operation needs for longer than [`CHANGE_WAIT`].
    Busy,
}

/// Names a scope slot at one generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScopeId {
    pub index: u32,
    pub generation: u64,
}

impl DeviceCounters {
    /// Reserves `bytes` before the real allocation is attempted. Returns the new `used`, or `None`
    /// when the ceiling refuses (then `denied` is counted and nothing else changes).
    ///
    /// Without a ceiling this is one `fetch_add`; with one, a compare-and-swap loop, so `used` never
    /// passes the ceiling even for an instant and concurrent requests are refused exactly.
    /// The reader's own tests only: the hook reserves through [`DeviceCounters::reserve_or`] alone.
    #[cfg(test)]
    pub(crate) fn reserve(&self, bytes: u64) -> Option<u64> {
        self.reserve_or(bytes, || false)
    }

    /// [`DeviceCounters::reserve`], with a second chance: when the reservation would be refused,
    /// `retry` is asked (the hook measures an emulated card's overhead again, which may have
    /// shrunk) and, if it says so, the reservation is tried once more. A refusal is counted here
    /// only, once, when it is final: the one owner of `denied`.
    #[inline]
    pub fn reserve_or(&self, bytes: u64, retry: impl FnOnce() -> bool) -> Option<u64> {
        self.try_reserve(bytes)
            .or_else(|| self.reserve_after(bytes, retry))
    }

    #[cold]
    fn reserve_after(&self, bytes: u64, retry: impl FnOnce() -> bool) -> Option<u64> {
        let reserved = if retry() {
            self.try_reserve(bytes)
        } else {
            None
        };
        if reserved.is_none() {
            self.denied.fetch_add(1, Ordering::Relaxed);
        }
        reserved
    }

    /// The reservation itself, without counting a refusal.
    #[inline]
    fn try_reserve(&self, bytes: u64) -> Option<u64> {
        let limit = self.allocation_cap();
        if limit == NO_LIMIT {
            return Some(
                self.used
                    .fetch_add(bytes, Ordering::SeqCst)
                    .wrapping_add(bytes),
            );
        }
        let mut current = self.used.load(Ordering::SeqCst);
        loop {
            let wanted = match current.checked_add(bytes) {
                // Zero bytes take nothing, so nothing refuses them, not even a ceiling lowered
                // below what the process holds (`cudaMalloc(&p, 0)` answers NULL and success).
                Some(w) if w <= limit || bytes == 0 => w,
                _ => return None,
            };
            match self.used.compare_exchange_weak(
                current,
                wanted,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return Some(wanted),
                Err(seen) => current = seen,
            }
        }
    }

    /// Gives back a reservation whose allocation the driver failed.
    #[inline]
    pub fn cancel(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives back reserved bytes without counting a failure (a reservation that was too large).
    #[inline]
    pub fn unreserve(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
    }

    /// Takes a free of `bytes` that this hook saw allocated out of `used`; returns the new `used`.
    /// (The free itself is counted in the device's [`CountStripe`].)
    #[inline]
    pub fn release(&self, bytes: u64) -> u64 {
        self.used
            .fetch_sub(bytes, Ordering::SeqCst)
            .wrapping_sub(bytes)
    }

    /// Sets the peak to the current `used` (the start of a new measuring window), and stamps when.
    pub fn reset_peak(&self) {
        self.peak.store(0, Ordering::SeqCst);
        fold_max(&self.peak, self.used.load(Ordering::SeqCst));
        self.peak_reset_ns
            .store(clock_ns(libc::CLOCK_MONOTONIC), Ordering::Release);
    }

    /// Sets the ceiling (`NO_LIMIT` for none) and stamps when.
    fn store_limit(&self, value: u64) {
        self.limit.store(value, Ordering::SeqCst);
        self.limit_set_ns
            .store(clock_ns(libc::CLOCK_MONOTONIC), Ordering::Release);
    }

    /// The ceiling, if one is set.
    pub fn limit(&self) -> Option<u64> {
        match self.limit.load(Ordering::Relaxed) {
            NO_LIMIT => None,
            l => Some(l),
        }
    }

    /// What `cuMemGetInfo`/`cudaMemGetInfo` should report under the ceiling: `total = min(real,
    /// limit)`, `free = min(real free, limit - used, total)`; never negative, never above total.
    /// Under emulation the total is the card's and the room is [`DeviceCounters::allocation_cap`]
    /// (the card less the charged overhead, and the ceiling if lower).
    #[inline]
    pub fn ceiling_view(&self, real_free: u64, real_total: u64) -> (u64, u64) {
        let cap = self.allocation_cap();
        let emulated = self.emulated_total.load(Ordering::Relaxed);
        if cap == NO_LIMIT {
            return (real_free, real_total);
        }
        let total = if emulated != 0 {
            emulated
        } else {
            real_total.min(cap)
        };
        let headroom = cap.saturating_sub(self.used.load(Ordering::Relaxed));
        (real_free.min(headroom).min(total), total)
    }

    /// The most `used` may reach: the ceiling, and under emulation also the card's total less the
    /// charged overhead. [`NO_LIMIT`] when neither applies.
    #[inline]
    pub fn allocation_cap(&self) -> u64 {
        let limit = self.limit.load(Ordering::Relaxed);
        match self.emulated_total.load(Ordering::Relaxed) {
            0 => limit,
            total => limit.min(total.saturating_sub(self.overhead.load(Ordering::Relaxed))),
        }
    }

    /// This process's own use of the device as the views report it (NVML's per-process figure):
    /// `used` plus, under emulation, the charged overhead; never above the view's `total`.
    #[inline]
    pub fn process_view(&self, total: u64) -> u64 {
        let used = self.used.load(Ordering::Relaxed);
        let charged = match self.emulated_total.load(Ordering::Relaxed) {
            0 => 0,
            _ => self.overhead.load(Ordering::Relaxed),
        };
        used.saturating_add(charged).min(total)
    }

    /// True when the views are changed at all (a ceiling or an emulated card).
    #[inline]
    pub fn has_view(&self) -> bool {
        self.allocation_cap() != NO_LIMIT
    }
}

/// `fetch_max` that skips the read-modify-write when the value is already at least `value`: the
/// common case, and a plain load.
#[inline]
pub(crate) fn fold_max(cell: &AtomicU64, value: u64) {
    if value > cell.load(Ordering::Relaxed) {
        cell.fetch_max(value, Ordering::SeqCst);
    }
}

impl Segment {
    /// Sums of the allocation counts of `device`: `(allocs, frees, total_allocated)`.
    pub fn allocation_counts(&self, device: u32) -> (u64, u64, u64) {
        self.counts
            .get(device as usize)
            .map_or((0, 0, 0), |stripes| {
                stripes.iter().fold((0u64, 0u64, 0u64), |(a, f, t), s| {
                    (
                        a.wrapping_add(s.allocs.load(Ordering::Relaxed)),
                        f.wrapping_add(s.frees.load(Ordering::Relaxed)),
                        t.wrapping_add(s.total_allocated.load(Ordering::Relaxed)),
                    )
                })
            })
    }

    /// The counts stripe `stripe` of `device`.
    #[inline]
    pub fn count_stripe(&self, device: u32, stripe: usize) -> Option<&CountStripe> {
        self.counts.get(device as usize)?.get(stripe)
    }

    /// The counters of `device`, `None` past [`MAX_DEVICES`].
    #[inline]
    pub fn device(&self, device: u32) -> Option<&DeviceCounters> {
        self.devices.get(device as usize)
    }

    /// Read before an allocation's reservation and handed to [`Segment::commit_alloc`].
    #[inline]
    pub fn scope_ticket(&self, device: u32) -> u64 {
        self.device(device)
            .map_or(BUSY, |c| c.scope_floor.load(Ordering::SeqCst))
    }

    /// Records a successful device allocation whose reservation left `used` at `new_used`: folds
    /// `new_used` into the device peak and into every open scope. (The allocation itself is counted
    /// in the device's [`CountStripe`].)
    ///
    /// The scope floor spares the visit to every open scope when it could change nothing: if the
    /// floor word (read after the reservation) shows no scope being opened or reset and a floor at
    /// or above `new_used`, every open scope already has a peak at least that high. After a visit,
    /// the floor is raised to `new_used`, but only if no scope was opened or reset since `ticket`
    /// (read before the reservation, by [`Segment::scope_ticket`]): then every open scope was open
    /// before the reservation, so its bit was seen and its peak received `new_used`. Opening and
    /// resetting bracket their work with [`Segment::begin_scope_change`] and its end, which drop
    /// the floor to zero and change the generation.
    #[inline]
    pub fn commit_alloc(&self, device: u32, new_used: u64, ticket: u64) {
        let Some(counters) = self.device(device) else {
            return;
        };
        fold_max(&counters.peak, new_used);
        self.mark_touched(device);
        if self
            .header
            .scopes_active
            .iter()
            .all(|w| w.load(Ordering::SeqCst) == 0)
        {
            return;
        }
        let now = counters.scope_floor.load(Ordering::SeqCst);
        if now & BUSY == 0 && new_used <= now & FLOOR_MASK {
            return;
        }
        self.fold_into_scopes(device, new_used);
        if ticket & BUSY == 0 && new_used <= FLOOR_MASK {
            let mut current = now;
            while floor_epoch(current) == floor_epoch(ticket) && current & FLOOR_MASK < new_used {
                let raised = floor_epoch(current) | new_used;
                match counters.scope_floor.compare_exchange_weak(
                    current,
                    raised,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => break,
                    Err(seen) => current = seen,
                }
            }
        }
    }

    /// Folds `new_used` into the peak of `device` of every open scope.
    #[inline]
    fn fold_into_scopes(&self, device: u32, new_used: u64) {
        for (word_index, word) in self.header.scopes_active.iter().enumerate() {
            let mut bits = word.load(Ordering::SeqCst);
            while bits != 0 {
                let slot = word_index * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(scope) = self.scopes.get(slot) {
                    if let Some(peak) = scope.peak.get(device as usize) {
                        fold_max(peak, new_used);
                    }
                }
            }
        }
    }

    /// Marks `device` as having seen activity (shown in snapshots and reports).
    #[inline]
    pub fn mark_touched(&self, device: u32) {
        if device < 64 {
            let bit = 1u64 << device;
            if self.header.devices_touched.load(Ordering::Relaxed) & bit == 0 {
                self.header.devices_touched.fetch_or(bit, Ordering::Relaxed);
            }
        }
    }

    /// Counts a managed allocation (never in device `used`).
    #[inline]
    pub fn add_managed(&self, device: u32, bytes: u64) {
        if let Some(c) = self.device(device) {
            let now = c
                .managed
                .fetch_add(bytes, Ordering::Relaxed)
                .wrapping_add(bytes);
            fold_max(&c.managed_peak, now);
            self.mark_touched(device);
        }
    }

    #[inline]
    pub fn sub_managed(&self, device: u32, bytes: u64) {
        if let Some(c) = self.device(device) {
            c.managed.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Counts a pinned host allocation (never in device `used`).
    #[inline]
    pub fn add_host_pinned(&self, bytes: u64) {
        let h = &self.header;
        let now = h
            .host_pinned
            .fetch_add(bytes, Ordering::Relaxed)
            .wrapping_add(bytes);
        fold_max(&h.host_pinned_peak, now);
        h.host_allocs.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub fn sub_host_pinned(&self, bytes: u64) {
        self.header.host_pinned.fetch_sub(bytes, Ordering::Relaxed);
        self.header.host_frees.fetch_add(1, Ordering::Relaxed);
    }

    /// The ceiling `device` starts with (`None` for none), set by the hook as it starts: not a
    /// change during the run, so not stamped in `limit_set_ns`.
    pub fn start_limit(&self, device: u32, limit: Option<u64>) {
        if let Some(c) = self.device(device) {
            c.limit.store(limit.unwrap_or(NO_LIMIT), Ordering::SeqCst);
        }
    }

    /// Sets (or with `None` lifts) the ceiling of one device or, with `device = None`, of all, and
    /// stamps when (the timeline places the change there).
    pub fn set_limit(&self, device: Option<u32>, limit: Option<u64>) {
        let value = limit.unwrap_or(NO_LIMIT);
        match device {
            Some(d) => {
                if let Some(c) = self.device(d) {
                    c.store_limit(value);
                }
            }
            None => self.devices.iter().for_each(|c| c.store_limit(value)),
        }
    }

    /// Devices that saw activity or carry a ceiling of their own, in ordinal order.
    pub fn active_devices(&self) -> Vec<u32> {
        let touched = self.header.devices_touched.load(Ordering::Relaxed);
        let all_limit = self.devices[0].limit.load(Ordering::Relaxed);
        (0..MAX_DEVICES as u32)
            .filter(|&d| {
                let limit = self.devices[d as usize].limit.load(Ordering::Relaxed);
                touched & (1u64 << d) != 0 || (limit != NO_LIMIT && limit != all_limit)
            })
            .collect()
    }

    /// Initialises a zeroed segment's header and publishes it (magic last).
    pub fn initialise(
        &self,
        pid: u32,
        proc_start_ticks: u64,
        start_unix_ns: u64,
        command: &str,
        flags: u32,
    ) {
        let h = &self.header;
        h.layout_major.store(LAYOUT_MAJOR, Ordering::Relaxed);
        h.layout_minor.store(LAYOUT_MINOR, Ordering::Relaxed);
        h.header_size
            .store(std::mem::size_of::<Header>() as u32, Ordering::Relaxed);
        h.segment_size.store(SEGMENT_SIZE as u32, Ordering::Relaxed);
        h.pid.store(pid, Ordering::Relaxed);
        h.flags.store(flags, Ordering::Relaxed);
        h.start_unix_ns.store(start_unix_ns, Ordering::Relaxed);
        h.proc_start_ticks
            .store(proc_start_ticks, Ordering::Relaxed);
        write_text(&h.command, command);
        write_text(&h.version, VERSION);
        for c in &self.devices {
            c.limit.store(NO_LIMIT, Ordering::Relaxed);
        }
        h.magic.store(MAGIC, Ordering::Release);
    }

    /// The version of the gpumemhook that wrote the segment (empty from a writer that did not say).
    pub fn writer_version(&self) -> String {
        read_text(&self.header.version)
    }

    /// The command line kept in the header.
    pub fn command(&self) -> String {
        read_text(&self.header.command)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// This thread's actor token.
    pub(crate) fn me() -> u64 {
        crate::process::actor_token()
    }

    pub(crate) fn zeroed() -> Box<Segment> {
        // SAFETY: every field of `Segment` is an atomic integer (or an array of them), for which the
        // all-zero bit pattern is a valid value.
        let seg: Box<Segment> = unsafe { Box::new_zeroed().assume_init() };
        seg.initialise(1, 2, 3, "test", 0);
        seg
    }

    #[test]
    fn a_module_cell_counts_bytes_and_allocations_past_the_packed_count() {
        let seg = zeroed();
        let cell = seg.modules.cell(3, 5).unwrap();
        // 70 000 live allocations wrap the packed 16-bit count once.
        for i in 0..70_000u64 {
            assert!(cell.charge(i % 7 + 1));
        }
        let held: u64 = (0..70_000u64).map(|i| i % 7 + 1).sum();
        assert_eq!(cell.read(), (held, held, 70_000));
        // Freed in another order, down through the wrap and back to zero.
        for i in (0..70_000u64).rev() {
            cell.discharge(i % 7 + 1);
            if i == 65_536 {
                assert_eq!(cell.read().2, 65_536);
            }
            if i == 65_535 {
                assert_eq!(cell.read().2, 65_535);
            }
        }
        assert_eq!(cell.read(), (0, held, 0));
        // An allocation no device could hold is refused, and leaves the count untouched.
        assert!(!cell.charge(MODULE_MAX_ALLOCATION));
        assert!(cell.charge(MODULE_MAX_ALLOCATION - 1));
        assert_eq!(
            cell.read(),
            (MODULE_MAX_ALLOCATION - 1, MODULE_MAX_ALLOCATION - 1, 1)
        );
        assert!(seg.modules.cell(MAX_DEVICES as u32, 0).is_none());
        assert!(seg.modules.cell(0, MODULE_CELLS).is_none());
    }

    #[test]
    fn module_names_are_published_and_truncated() {
        let seg = zeroed();
        assert_eq!(seg.modules.path(0), None);
        seg.modules.name(0, b"/usr/lib/libnccl.so.2");
        assert_eq!(
            seg.modules.path(0).as_deref(),
            Some("/usr/lib/libnccl.so.2")
        );
        let long = vec![b'x'; MODULE_PATH_LEN * 2];
        seg.modules.name(1, &long);
        assert_eq!(seg.modules.path(1).unwrap().len(), MODULE_PATH_LEN - 1);
        assert_eq!(seg.modules.path(MODULE_SLOTS), None);
    }

    #[test]
    fn ceiling_refuses_past_the_limit_and_admits_the_boundary_byte() {
        let seg = zeroed();
        let dev = seg.device(0).unwrap();
        seg.set_limit(Some(0), Some(100));
        assert_eq!(dev.reserve(60), Some(60));
        assert_eq!(dev.reserve(41), None);
        assert_eq!(dev.reserve(40), Some(100));
        assert_eq!(dev.denied.load(Ordering::Relaxed), 1);
        assert_eq!(dev.ceiling_view(1000, 2000), (0, 100));
        // A ceiling lowered below what is held still admits zero bytes, which take nothing.
        seg.set_limit(Some(0), Some(50));
        assert_eq!(dev.reserve(0), Some(100));
        assert_eq!(dev.reserve(1), None);
        assert_eq!(dev.denied.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_emulated_card_charges_its_overhead_and_reports_its_total() {
        let seg = zeroed();
        let c = &seg.devices[0];
        c.emulated_total.store(10_000, Ordering::Relaxed);
        c.overhead.store(1_500, Ordering::Relaxed);
        assert_eq!(c.allocation_cap(), 8_500);
        assert_eq!(c.reserve(8_000), Some(8_000));
        assert_eq!(c.reserve(501), None);
        assert_eq!(c.reserve(500), Some(8_500));
        // The real card is larger: the view is the emulated card's.
        assert_eq!(c.ceiling_view(u64::MAX / 2, 80_000), (0, 10_000));
        assert_eq!(c.process_view(10_000), 10_000);
        c.release(2_000);
        assert_eq!(c.ceiling_view(u64::MAX / 2, 80_000), (2_000, 10_000));
        assert_eq!(c.process_view(10_000), 8_000);
        // A ceiling below the card caps allocations too; the total stays the card's.
        c.limit.store(7_000, Ordering::Relaxed);
        assert_eq!(c.allocation_cap(), 7_000);
        assert_eq!(c.ceiling_view(u64::MAX / 2, 80_000), (500, 10_000));
        // An overhead larger than the card leaves nothing, and the process never exceeds the card.
        c.overhead.store(20_000, Ordering::Relaxed);
        assert_eq!(c.allocation_cap(), 0);
        assert_eq!(c.process_view(10_000), 10_000);
        // Without a card, the overhead is not charged.
        c.emulated_total.store(0, Ordering::Relaxed);
        assert_eq!(c.allocation_cap(), 7_000);
        assert_eq!(c.process_view(7_000), 6_500);
    }

    #[test]
    fn ceiling_view_never_underflows_when_used_exceeds_a_lowered_limit() {
        let seg = zeroed();
        let dev = seg.device(1).unwrap();
        dev.reserve(500);
        seg.set_limit(None, Some(100));
        assert_eq!(dev.ceiling_view(10_000, 50), (0, 50));
        assert_eq!(dev.ceiling_view(10_000, 20_000), (0, 100));
    }

    #[test]
    fn text_is_truncated_at_a_character_boundary() {
        let seg = zeroed();
        let long = "é".repeat(200);
        write_text(&seg.header.command, &long);
        assert_eq!(seg.command().chars().count(), (COMMAND_LEN - 1) / 2);
    }
}

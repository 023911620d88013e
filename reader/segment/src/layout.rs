//! The shared-memory segment: its one and only definition, types and constants only.
//!
//! The interceptor writes through these types and every reader reads through them, so writer and
//! reader can never disagree about an offset. Everything in the segment is an atomic, which makes
//! `&Segment` safe to share between threads and between processes that map the same file.
//!
//! What is done with the types lives beside them, each job in one module: the counting of
//! allocations, frees, modules and sites ([`crate::counters`]), the ceiling and the views of free
//! and total memory under it ([`crate::ceiling`]), and the scope protocol, both the allocation's
//! side and the openers' ([`crate::scope`]). Their hot-path operations are `#[inline]` methods that
//! never allocate, never lock and never panic.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8};
use std::time::Duration;

/// `b"GPUMEMHK"` read as a little-endian integer: the first eight bytes of every segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPUMEMHK");

/// Readers refuse a segment whose major version differs from theirs.
pub const LAYOUT_MAJOR: u32 = 5;
/// Additions that old readers can ignore bump the minor version.
pub const LAYOUT_MINOR: u32 = 0;
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
/// Bytes of the job labels text (`VARIABLE=value` lines, NUL-padded; see
/// `gpumemhook_reader::JobLabels`).
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
    /// Where the process belongs (rank, Slurm job, pod): `gpumemhook_reader::JobLabels` writes and
    /// reads it.
    /// Added in layout 2.
    pub job_labels: [AtomicU8; JOB_LABELS_LEN],
    /// The version of the gpumemhook that wrote the segment ([`VERSION`]), NUL-padded.
    pub version: [AtomicU8; VERSION_LEN],
    /// The pid namespace `pid` is a pid of (the inode of `/proc/self/ns/pid`; see
    /// [`crate::process::pid_namespace_of`]), 0 where the writer did not say: a reader in another
    /// namespace cannot judge the process by its pid. Added in layout 4.2.
    pub pid_namespace: AtomicU64,
}

/// The release of gpumemhook this crate belongs to: the workspace's one version, which the hook,
/// the CLI, the Python package and the wheel all show.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Bytes of the version kept in the header (NUL-padded).
pub const VERSION_LEN: usize = 32;

/// One device's counters. Each device sits on its own cache lines, so devices never share one.
#[repr(C, align(128))]
pub struct DeviceCounters {
    /// Device bytes held now through intercepted allocations: those the driver made, counted
    /// when the allocation is committed, never a request still in the driver's hands (a request
    /// that fails or is refused never raises it). The hook's figures (`peak`, scopes, the
    /// timeline) fold the values of `changes`, which moves with it change for change.
    pub used: AtomicU64,
    /// Largest `used` since start or the last [`DeviceCounters::reset_peak`], in the low 48 bits
    /// ([`DeviceCounters::peak_bytes`]); above them the last restart's number among the changes
    /// (15 bits) and a bit set while a restart is under way, so that a change counted before a
    /// restart never folds into the window after it (`crate::peak`). Packed since layout 5.0.
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
    /// `used` plus the requests reserved under the ceiling and still in the driver's hands: what
    /// the ceiling admits against, so concurrent requests never pass it together. Only the hook
    /// reads it. Added in layout 4.1 (in what was padding: no field moved).
    pub claimed: AtomicU64,
    /// The changes of `used` (commits, frees, peak restarts) as one word: how many there were,
    /// modulo 2^16, in the top 16 bits, `used` in the low 48 (see [`Change`]). One atomic add per
    /// change gives it its value and its place in the order, which the timeline records so a
    /// reader replays the changes in the counter's own order. Only the hook and a peak restart
    /// write it. Added in layout 4.1.
    pub changes: AtomicU64,
    /// The last peak restart's place among the changes: its [`Change`] packed as in `changes`
    /// (number high, `used` then low), 0 for none. Added in layout 4.1.
    pub peak_reset_mark: AtomicU64,
}

/// The low bits of [`DeviceCounters::changes`] that hold `used`.
pub const CHANGE_USED_MASK: u64 = (1 << 48) - 1;
/// One change counted in [`DeviceCounters::changes`].
pub const CHANGE_ONE: u64 = 1 << 48;

/// One change of a device's `used`, as the change word gave it: `used` after it, and its number
/// among the device's changes (modulo 2^16; consecutive changes have consecutive numbers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub used: u64,
    pub number: u16,
}

impl Change {
    /// The change whose add left the word at `word`.
    #[inline]
    pub const fn of_word(word: u64) -> Change {
        Change {
            used: word & CHANGE_USED_MASK,
            number: (word >> 48) as u16,
        }
    }

    /// The change packed as the word holds it.
    #[inline]
    pub const fn word(self) -> u64 {
        ((self.number as u64) << 48) | (self.used & CHANGE_USED_MASK)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layout's version and sizes as the code has them: (what, kind, value), in the form of the
    /// rows of the table under "## Sizes" in `docs/segment-layout.md`.
    fn facts() -> Vec<(&'static str, &'static str, String)> {
        let size = |name, bytes: usize| (name, "size", bytes.to_string());
        let offset = |name, bytes: usize| (name, "offset", bytes.to_string());
        vec![
            (
                "layout",
                "version",
                format!("{LAYOUT_MAJOR}.{LAYOUT_MINOR}"),
            ),
            size("Segment", size_of::<Segment>()),
            size("Header", size_of::<Header>()),
            size("DeviceCounters", size_of::<DeviceCounters>()),
            size("ScopeSlot", size_of::<ScopeSlot>()),
            size("CountStripe", size_of::<CountStripe>()),
            size("Modules", size_of::<Modules>()),
            size("ModuleCell", size_of::<ModuleCell>()),
            size("Sites", size_of::<Sites>()),
            size("SiteSlot", size_of::<SiteSlot>()),
            offset("Segment.devices", offset_of!(Segment, devices)),
            offset("Segment.scopes", offset_of!(Segment, scopes)),
            offset("Segment.counts", offset_of!(Segment, counts)),
            offset("Segment.modules", offset_of!(Segment, modules)),
            offset("Segment.sites", offset_of!(Segment, sites)),
            offset("Header.layout_major", offset_of!(Header, layout_major)),
            offset("Header.layout_minor", offset_of!(Header, layout_minor)),
            offset("Header.segment_size", offset_of!(Header, segment_size)),
            offset("Header.pid", offset_of!(Header, pid)),
            offset("Header.pid_namespace", offset_of!(Header, pid_namespace)),
            offset("DeviceCounters.limit", offset_of!(DeviceCounters, limit)),
            offset(
                "DeviceCounters.scope_floor",
                offset_of!(DeviceCounters, scope_floor),
            ),
            offset(
                "DeviceCounters.limit_set_ns",
                offset_of!(DeviceCounters, limit_set_ns),
            ),
            offset("Sites.slots", offset_of!(Sites, slots)),
            offset("SiteSlot.text", offset_of!(SiteSlot, text)),
        ]
    }

    /// The rows of the table under "## Sizes" in `doc`: (what, kind, value), backticks removed.
    fn documented(doc: &str) -> Vec<(String, String, String)> {
        let section = doc.split("\n## Sizes").nth(1).unwrap_or("");
        let section = section.split("\n## ").next().unwrap_or(section);
        section
            .lines()
            .filter_map(|line| {
                let cells: Vec<String> = line
                    .split('|')
                    .map(|c| c.trim().trim_matches('`').to_string())
                    .collect();
                // ["", what, kind, value, ""]
                let known = ["size", "offset", "version"];
                (cells.len() == 5 && known.contains(&cells[2].as_str()))
                    .then(|| (cells[1].clone(), cells[2].clone(), cells[3].clone()))
            })
            .collect()
    }

    /// The doc states the version and sizes the code has, every one, and no other: a field resized
    /// or moved shows here, next to the version the rules of that page then require raising.
    #[test]
    fn the_docs_give_the_layouts_version_and_sizes() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/segment-layout.md"),
        )
        .expect("docs/segment-layout.md is readable");
        let code: Vec<(String, String, String)> = facts()
            .into_iter()
            .map(|(what, kind, value)| (what.to_string(), kind.to_string(), value))
            .collect();
        assert_eq!(
            documented(&doc),
            code,
            "docs/segment-layout.md's table under \"## Sizes\" differs from reader/segment/src/layout.rs"
        );
        for stated in [
            format!("(`LAYOUT_MAJOR`, now {LAYOUT_MAJOR})"),
            format!("(`LAYOUT_MINOR`, now {LAYOUT_MINOR})"),
            format!("## Sizes of layout {LAYOUT_MAJOR}.{LAYOUT_MINOR}"),
        ] {
            assert!(
                doc.contains(&stated),
                "docs/segment-layout.md does not say {stated:?}"
            );
        }
    }

    #[test]
    fn the_sizes_are_read_from_their_section_only() {
        let doc = "Intro\n## Sizes of layout 9.1\n\n| what | kind | value |\n| --- | --- | --- |\n\
                   | layout | version | 9.1 |\n| `Segment` | size | 12 |\n\n## Next\n| `Header` | size | 3 |\n";
        assert_eq!(
            documented(doc),
            [
                ("layout".into(), "version".into(), "9.1".into()),
                ("Segment".into(), "size".into(), "12".into())
            ]
        );
    }
}

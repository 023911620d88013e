//! The timeline recorder (`GPUMEMHOOK_TRACE=path`).
//!
//! Recording: events go into one preallocated buffer (an anonymous mapping the kernel backs page by
//! page as it fills): a thread claims a slot with one `fetch_add` and writes it; nothing is
//! formatted, locked or allocated on the hot path. Scope names go into a second mapping, a byte
//! arena claimed the same way, so a name is stored once, whole, and can never be confused with
//! another scope's (no small code that wraps, no lock a `fork` could copy held). Events past the
//! buffer's capacity (`GPUMEMHOOK_TRACE_EVENTS`, default 4 Mi events) are counted as dropped and
//! reported in the file and on stderr.
//!
//! Changes made through the segment, possibly by another process (`gpumemhook limit PID`,
//! `reset-peak`, `set_limit`), are seen by the hook only when it next records an event of that
//! device, or at exit: then it compares the device's time stamps of the last ceiling change and
//! peak restart with the ones it recorded last, and records a change it had not seen at the time
//! the segment says it happened (so a change after the last allocation is still on the timeline).
//!
//! Writing, at exit: recording stops, the slots are sorted by time in place (no copy), and each is
//! streamed through the format's writer (`gpumemhook_reader::ChromeTraceWriter`) into a
//! buffered file. Memory at exit is the writer's buffer, whatever the number of events. A process
//! killed before exit writes no timeline.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use gpumemhook_reader::{ChromeTraceWriter, Event, EventKind};
use gpumemhook_segment::{MemKind, Segment};
use gpumemhook_segment::{MAX_DEVICES, SCOPE_NAME_LEN};

/// Entry-point codes: driver functions by [`crate::driver::DriverFn`] index, runtime functions
/// from [`RUNTIME_BASE`] on.
pub type EntryCode = u16;
pub const RUNTIME_BASE: EntryCode = 64;
// Checked here, where the codes are given out: every driver row has a code below the runtime's,
// and every runtime row one that fits.
const _: () = assert!(
    crate::driver::COUNT <= RUNTIME_BASE as usize,
    "the driver's table has outgrown RUNTIME_BASE: raise it (the timeline's codes move)"
);
const _: () = assert!(
    RUNTIME_BASE as usize + crate::runtime::COUNT <= EntryCode::MAX as usize,
    "the runtime's codes do not fit an EntryCode"
);

/// One slot, generic over its timestamp's type: [`LiveSlot`] while recording, [`StoppedSlot`]
/// after. `ts_ns` is written last (release): a zero timestamp marks a slot still being written. For
/// scope events `address` is the scope slot, `bytes` the name's offset in the arena and `used` its
/// length. One field list for both, so the two layouts cannot drift apart.
#[repr(C)]
struct Slot<Ts> {
    ts_ns: Ts,
    address: u64,
    bytes: u64,
    used: u64,
    limit: u64,
    device: u32,
    tid: u32,
    entry: EntryCode,
    kind: u8,
    mem: u8,
    /// The module charged ([`crate::modules`]), [`NO_MODULE`] for none.
    module: u8,
    /// The Python call site ([`crate::stacks`], 24 bits, little-endian), 0 for none: in the
    /// slot's padding, which it does not grow.
    site: [u8; 3],
}

/// A slot while recording: its timestamp is atomic.
type LiveSlot = Slot<AtomicU64>;
/// The same slot once recording has stopped: plain data, sortable in place.
type StoppedSlot = Slot<u64>;

const _: () = assert!(std::mem::size_of::<LiveSlot>() == std::mem::size_of::<StoppedSlot>());
const _: () = assert!(std::mem::size_of::<LiveSlot>() == 56);

static BUFFER: AtomicPtr<LiveSlot> = AtomicPtr::new(std::ptr::null_mut());
static CAPACITY: AtomicU64 = AtomicU64::new(0);
static NEXT: AtomicU64 = AtomicU64::new(0);
/// The scope-name arena and the next free byte in it.
static NAMES: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static NAMES_NEXT: AtomicU64 = AtomicU64::new(0);
/// Arena bytes: room for a full-length name for one event in 16, reserved, not committed.
fn names_capacity(events: u64) -> u64 {
    (events / 16)
        .max(1024)
        .saturating_mul(SCOPE_NAME_LEN as u64)
}
/// A name that could not be stored (arena full) is written as this, never as another's.
const UNRECORDED_NAME: &str = "(name not recorded)";
/// The length value that marks it.
const NO_NAME: u64 = u64::MAX;

/// Per device, the time stamps of the last peak restart and ceiling change already recorded (the
/// segment's `peak_reset_ns` and `limit_set_ns`; 0 before any).
static RESETS_SEEN: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static CEILINGS_SEEN: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
}

fn tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            // The system call, not glibc's gettid(), which only glibc 2.30+ has (the library must
            // load on glibc 2.17).
            // SAFETY: SYS_gettid takes no arguments and cannot fail; called once per thread.
            t.set(unsafe { libc::syscall(libc::SYS_gettid) } as u32);
        }
        t.get()
    })
}

/// Monotonic time in nanoseconds (the vDSO, no system call); never 0, which marks "not yet".
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

pub use gpumemhook_segment::clock_ns;

/// Reserves `bytes` of zeroed address space; only pages written take memory.
fn reserve(bytes: u64) -> Option<*mut libc::c_void> {
    let bytes = usize::try_from(bytes).ok()?;
    // SAFETY: an anonymous private mapping, zero-filled; checked below. MAP_NORESERVE: only the
    // pages actually filled take memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p)
}

/// Turns recording on with room for `capacity` events (at start-up).
pub fn enable(capacity: u64) -> bool {
    let Some(bytes) = capacity.checked_mul(std::mem::size_of::<LiveSlot>() as u64) else {
        return false;
    };
    let (Some(slots), Some(names)) = (reserve(bytes), reserve(names_capacity(capacity))) else {
        return false;
    };
    CAPACITY.store(capacity, Ordering::Relaxed);
    NAMES.store(names.cast(), Ordering::Release);
    BUFFER.store(slots.cast(), Ordering::Release);
    true
}

/// What one event says, for [`record`].
pub struct Record {
    pub kind: EventKind,
    pub entry: EntryCode,
    pub device: u32,
    pub bytes: u64,
    pub used: u64,
    pub address: u64,
    pub mem: MemKind,
    /// The device's ceiling in force (`NO_LIMIT` when none).
    pub limit: u64,
    /// The module charged with a device allocation or free, [`NO_MODULE`] for none.
    pub module: u8,
    /// The Python call site of a device allocation, refusal or free ([`crate::stacks`]), 0 for none.
    pub site: u32,
}

/// The largest site number a slot holds (24 bits).
pub const MAX_SLOT_SITE: u32 = (1 << 24) - 1;

/// The module of an event that has none (scopes, memory that is not device memory).
pub const NO_MODULE: u8 = u8::MAX;

/// Records one event, first any ceiling change or peak restart of its device made through the
/// segment since the last event; a no-op (one load) when recording is off.
#[inline]
pub fn record(segment: &Segment, event: impl FnOnce() -> Record) {
    let buffer = BUFFER.load(Ordering::Relaxed);
    if buffer.is_null() {
        return;
    }
    let event = event();
    notice_changes(buffer, segment, event.device);
    write_slot(buffer, event, None);
}

/// Records the ceiling change and the peak restart of `device` that the segment's time stamps show
/// and the timeline does not have yet, each at the time it happened. Two threads noticing the same
/// change record it once (the swap decides).
fn notice_changes(buffer: *mut LiveSlot, segment: &Segment, device: u32) {
    let (Some(counters), Some(resets_seen), Some(ceilings_seen)) = (
        segment.device(device),
        RESETS_SEEN.get(device as usize),
        CEILINGS_SEEN.get(device as usize),
    ) else {
        return;
    };
    // Records `kind` at `stamp` (the segment's time stamp of the change) once per new stamp.
    let notice = |kind, stamp: &AtomicU64, seen: &AtomicU64| {
        let at = stamp.load(Ordering::Acquire);
        if at != seen.load(Ordering::Relaxed) && seen.swap(at, Ordering::Relaxed) != at && at != 0 {
            let marker = Record {
                kind,
                entry: 0,
                device,
                bytes: 0,
                used: counters.used.load(Ordering::Relaxed),
                address: 0,
                mem: MemKind::Device,
                limit: counters.allocation_cap(),
                module: NO_MODULE,
                site: 0,
            };
            write_slot(buffer, marker, Some(at));
        }
    };
    notice(EventKind::PeakReset, &counters.peak_reset_ns, resets_seen);
    notice(EventKind::Ceiling, &counters.limit_set_ns, ceilings_seen);
}

/// Writes `r` into the next slot, stamped `at` (nanoseconds of `CLOCK_MONOTONIC`), or now.
fn write_slot(buffer: *mut LiveSlot, r: Record, at: Option<u64>) {
    let index = NEXT.fetch_add(1, Ordering::Relaxed);
    if index >= CAPACITY.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: `index` is below the capacity the buffer was mapped with and was claimed by this
    // thread alone through `fetch_add`, so nobody else writes this slot.
    let slot = unsafe { &mut *buffer.add(index as usize) };
    slot.address = r.address;
    slot.bytes = r.bytes;
    slot.used = r.used;
    slot.limit = r.limit;
    slot.device = r.device;
    slot.tid = tid();
    slot.entry = r.entry;
    slot.kind = r.kind as u8;
    slot.mem = r.mem as u8;
    slot.module = r.module;
    let [a, b, c, _] = r.site.min(MAX_SLOT_SITE).to_le_bytes();
    slot.site = [a, b, c];
    slot.ts_ns
        .store(at.map_or_else(now_ns, |ns| ns.max(1)), Ordering::Release);
}

/// In a forked child: start an empty timeline (both mappings are the child's private copies).
pub fn forked() {
    NEXT.store(0, Ordering::Relaxed);
    NAMES_NEXT.store(0, Ordering::Relaxed);
    // The child's segment is new: none of its changes is recorded yet.
    for seen in RESETS_SEEN.iter().chain(&CEILINGS_SEEN) {
        seen.store(0, Ordering::Relaxed);
    }
}

/// Stores a scope name in the arena; returns `(offset, length)`, length [`NO_NAME`] when full.
fn store_name(name: &[u8]) -> (u64, u64) {
    let arena = NAMES.load(Ordering::Acquire);
    let len = name.len().min(SCOPE_NAME_LEN) as u64;
    let at = NAMES_NEXT.fetch_add(len, Ordering::Relaxed);
    let capacity = names_capacity(CAPACITY.load(Ordering::Relaxed));
    if arena.is_null() || at.saturating_add(len) > capacity {
        return (0, NO_NAME);
    }
    // SAFETY: `[at, at + len)` lies inside the arena (checked above) and was claimed by this thread
    // alone through `fetch_add`.
    unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), arena.add(at as usize), len as usize) };
    (at, len)
}

/// Marks a scope opening (`open`) or closing on the timeline, `name` read only when recording
/// (in-process readers call it through the exported `gpumemhook_trace_scope`, `crate::exports`).
pub fn scope_mark<'a>(open: bool, slot: u32, name: impl FnOnce() -> &'a [u8]) {
    let buffer = BUFFER.load(Ordering::Relaxed);
    if buffer.is_null() {
        return;
    }
    let (offset, len) = store_name(name());
    let kind = if open {
        EventKind::ScopeOpen
    } else {
        EventKind::ScopeClose
    };
    write_slot(
        buffer,
        Record {
            kind,
            entry: 0,
            device: 0,
            bytes: offset,
            used: len,
            address: u64::from(slot),
            mem: MemKind::Device,
            limit: gpumemhook_segment::NO_LIMIT,
            module: NO_MODULE,
            site: 0,
        },
        None,
    );
}

/// The event kind of a slot (its code is `EventKind as u8`; nothing else is ever stored).
fn kind_of(code: u8) -> EventKind {
    EventKind::from_code(code).unwrap_or(EventKind::ScopeClose)
}

/// The memory kind of a slot (its code is `MemKind as u8`).
fn mem_of(code: u8) -> MemKind {
    MemKind::from_code(code).unwrap_or(MemKind::Device)
}

/// Stops recording and returns the recorded slots as plain data, sorted by time, with the number of
/// events dropped past the buffer.
fn stop() -> Option<(&'static mut [StoppedSlot], u64, u64)> {
    let buffer = BUFFER.load(Ordering::Acquire);
    if buffer.is_null() {
        return None;
    }
    let capacity = CAPACITY.load(Ordering::Relaxed);
    // Every later claim lands past the capacity and is ignored.
    let claimed = NEXT.swap(u64::MAX / 2, Ordering::AcqRel);
    let recorded = claimed.min(capacity);
    // Threads still running at exit may be writing a slot they claimed just before: give them a
    // moment (bounded), then treat an unfinished slot as not recorded.
    for _ in 0..10 {
        let unfinished = (0..recorded).any(|i| {
            // SAFETY: slots below `recorded` lie inside the mapping; only their timestamps are read.
            unsafe { &*buffer.add(i as usize) }
                .ts_ns
                .load(Ordering::Acquire)
                == 0
        });
        if !unfinished {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: recording has stopped (every new claim is past the capacity), so nothing writes these
    // slots any more; `StoppedSlot` is `LiveSlot` with a plain integer in place of the
    // atomic, and the mapping outlives the process's exit path.
    let slots =
        unsafe { std::slice::from_raw_parts_mut(buffer.cast::<StoppedSlot>(), recorded as usize) };
    // Slots are claimed in almost increasing time order, which the sort handles in close to one pass.
    slots.sort_unstable_by_key(|s| s.ts_ns);
    Some((slots, claimed - recorded, capacity))
}

/// The scope name stored at `(offset, len)` in the arena.
fn name_at(offset: u64, len: u64) -> std::borrow::Cow<'static, str> {
    let arena = NAMES.load(Ordering::Acquire);
    if len == NO_NAME || arena.is_null() {
        return UNRECORDED_NAME.into();
    }
    // SAFETY: `(offset, len)` was stored by `store_name` after checking it lies inside the arena.
    let bytes = unsafe { std::slice::from_raw_parts(arena.add(offset as usize), len as usize) };
    String::from_utf8_lossy(bytes)
}

/// The last `count` allocation events recorded so far (refusals and failures included), oldest
/// first, for an out-of-memory report, with `site` naming their call sites; empty without a
/// timeline. Recording goes on.
pub fn recent(
    count: usize,
    site: impl Fn(u32) -> Option<String>,
) -> Vec<gpumemhook_reader::RecentEvent> {
    let buffer = BUFFER.load(Ordering::Acquire);
    if buffer.is_null() {
        return Vec::new();
    }
    let end = NEXT
        .load(Ordering::Acquire)
        .min(CAPACITY.load(Ordering::Relaxed));
    let module_names = crate::modules::file_names();
    let mut events: Vec<gpumemhook_reader::RecentEvent> = (end.saturating_sub(count as u64)..end)
        .filter_map(|i| {
            // SAFETY: slots below the claimed count lie inside the mapping; a slot whose timestamp
            // (stored last, with release) is set is complete and no longer written.
            let slot = unsafe { &*buffer.add(i as usize) };
            let ts_ns = slot.ts_ns.load(Ordering::Acquire);
            let kind = kind_of(slot.kind);
            if ts_ns == 0 || !kind.is_allocation() {
                return None;
            }
            Some(gpumemhook_reader::RecentEvent {
                ts: ts_ns as f64 / 1000.0,
                event: kind.category().to_string(),
                entry: entry_name(slot.entry).to_string(),
                device: slot.device,
                bytes: slot.bytes,
                used: slot.used,
                module: module_names.of(slot.module).to_string(),
                site: site(site_of(slot)),
            })
        })
        .collect();
    events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    events
}

/// Writes the timeline at exit to `path`; `sites[i]` is the text of call site `i + 1`.
pub fn write(path: &Path, segment: &Segment, sites: &[String]) {
    let buffer = BUFFER.load(Ordering::Acquire);
    let devices = segment.active_devices();
    if !buffer.is_null() {
        // Changes since each device's last event, at the time they happened.
        for &device in &devices {
            notice_changes(buffer, segment, device);
        }
    }
    let end_ns = now_ns();
    let Some((slots, dropped, capacity)) = stop() else {
        return;
    };
    let limits: BTreeMap<u32, u64> = segment
        .active_devices()
        .into_iter()
        .filter_map(|d| Some((d, segment.device(d)?.limit()?)))
        .collect();
    let pid = std::process::id();
    let module_names = crate::modules::file_names();
    let written = gpumemhook_reader::write_file(path, |out| {
        let mut writer = ChromeTraceWriter::new(out, pid, &segment.command())?;
        for slot in slots.iter().filter(|s| s.ts_ns != 0) {
            let kind = kind_of(slot.kind);
            let scope_name;
            let name: &str = match kind {
                EventKind::ScopeOpen | EventKind::ScopeClose => {
                    scope_name = name_at(slot.bytes, slot.used);
                    &scope_name
                }
                _ => entry_name(slot.entry),
            };
            let is_scope = matches!(kind, EventKind::ScopeOpen | EventKind::ScopeClose);
            writer.event(&Event {
                ts_ns: slot.ts_ns,
                kind,
                device: slot.device,
                bytes: if is_scope { 0 } else { slot.bytes },
                used: if is_scope { 0 } else { slot.used },
                address: slot.address,
                name,
                mem: mem_of(slot.mem),
                tid: slot.tid,
                scope: slot.address as u32,
                limit: (slot.limit != gpumemhook_segment::NO_LIMIT).then_some(slot.limit),
                module: module_names.of(slot.module),
                site: site_of(slot)
                    .checked_sub(1)
                    .and_then(|i| sites.get(i as usize))
                    .map_or("", String::as_str),
            })?;
        }
        // The ceilings in force at the end, where they differ from the last written (a change the
        // segment did not stamp, or one past the buffer).
        for &device in &devices {
            // The cap allocations are judged by (`account::limit_of`, which this layer may not call).
            let cap = segment
                .device(device)
                .map_or(gpumemhook_segment::NO_LIMIT, |c| c.allocation_cap());
            let limit = (cap != gpumemhook_segment::NO_LIMIT).then_some(cap);
            writer.ceiling_at_exit(end_ns, device, limit)?;
        }
        let info = gpumemhook_reader::RunInfo {
            labels: gpumemhook_reader::JobLabels::read_from(segment),
            host: None,
            wall_offset_us: None,
        };
        writer.finish(&limits, dropped, end_ns, &info).map(drop)
    });
    match written {
        Err(e) => crate::diag::warn(&format!(
            "cannot write the timeline to {}: {e}",
            path.display()
        )),
        Ok(()) if dropped > 0 => crate::diag::warn(&format!(
            "the timeline {} misses the last {dropped} events (buffer of {capacity}; raise \
             GPUMEMHOOK_TRACE_EVENTS)",
            path.display()
        )),
        Ok(()) => {}
    }
}

/// The site number a slot holds.
fn site_of<T>(slot: &Slot<T>) -> u32 {
    let [a, b, c] = slot.site;
    u32::from_le_bytes([a, b, c, 0])
}

/// The name of an entry point code.
pub fn entry_name(code: EntryCode) -> &'static str {
    if code >= RUNTIME_BASE {
        crate::runtime::name_by_index(usize::from(code - RUNTIME_BASE))
    } else {
        crate::driver::NAMES
            .get(usize::from(code))
            .and_then(|n| n.to_str().ok())
            .unwrap_or("?")
    }
}

//! The flight recorder (`GPUMEMHOOK_TRACE=path`): every event the hook counts is written, as it is
//! counted, into the file the variable names, in the compact format of
//! `gpumemhook_segment::recording` (one definition, shared with the reader).
//!
//! Writing: each thread owns a chunk of the file at a time. It claims one with one atomic add,
//! extends the file by it (`posix_fallocate`: a full disk is an answer then, never a SIGBUS later)
//! and maps it shared; it then writes each event as one 32-byte record with plain stores, its first
//! word last. A thread that ends hands the rest of its chunk on ([`FileFacts::pool`]); a thread
//! that starts takes such a rest before it claims a chunk of its own, and writes there after a
//! record that names it. Nothing on the per-event path makes a system call, takes a lock or
//! allocates; a chunk costs five system calls per 2,047 records (with the `fstat` that looks for a
//! cut). The kernel's page cache holds what was stored, so SIGKILL, SIGTERM, a crash or `os._exit`
//! lose no event that was counted; a clean exit stamps the header's end, and a file without one
//! reads as cut short.
//!
//! Another process may truncate the file, or copy a shorter one over it, while the program runs: a
//! store into a page the file no longer has would raise SIGBUS. The header and every chunk are
//! registered with the readers' SIGBUS guard (`gpumemhook_reader::GuardSlot`), which replaces a
//! faulting range with zeroed memory; at the thread's next chunk, or at exit, the hook sees the
//! trip or the file shorter than it reserved (one `fstat`), says so once, and stops recording.
//! Nothing is added per event. The counts are the segment's, untouched.
//!
//! With `GPUMEMHOOK_TRACE_MAX` the chunks are a ring within that size ([`ring`]): a new chunk takes
//! the slot of the oldest one no thread writes, which is first folded into the file's summary.
//! Threads then do not hand on the rest of their chunks: a slot is released instead.
//!
//! Strings (entry points, modules, call sites, scope names) are written once, as a numbered text
//! record in the thread's chunk before the first event that names them.
//!
//! The file is made at the first event (a forked child that never uses CUDA makes none): a
//! temporary file in the target's folder under a name no one can guess, its header written,
//! renamed to the path (`gpumemhook_reader::create_own`). The live file is always this user's: a
//! file, FIFO or link another user planted at the path is refused in one line, never written
//! into, through or over (`gpumemhook_reader::live_target`). A forked child records into a
//! file of its own: the pattern's `%p` is its pid, or `.<pid>` follows a pattern without one (a
//! device's or `/dev/stdout`'s child writes there as its parent does, never a file in `/dev`). A
//! target that cannot be mapped (a FIFO, a device, `/dev/stdout`) is recorded into an unnamed
//! temporary file and copied there at exit: that one is lost if the process is killed.
//!
//! The recorder's life (off, unopened, opening, open, failed) is one type, [`state`]: its states
//! in one atomic, moved only by named transitions, and the facts of the file being written in one
//! struct that a forked child forgets in one call.
//!
//! Changes made through the segment, possibly by another process (`gpumemhook limit PID`,
//! `reset-peak`), are seen when the hook next records an event of that device, or at exit, and
//! are recorded at the time the segment stamped them.

mod file;
mod ring;
mod state;

use file::{guarded, map_shared, store};
use state::{FileFacts, Lifecycle, Opened, RecorderState};

use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use gpumemhook_reader::{EventKind, GuardSlot, OutputTarget};
use gpumemhook_segment::{
    chunk_offset, fill_field, text_records, Change, DeviceCounters, EventRecord, MemKind, Record,
    RecordingHeader, Segment, TextClass, CEILING_AT_EXIT, CEILING_CHANGED, CEILING_IN_FORCE,
    CHUNK_BYTES, MAX_NARROW, MAX_TEXT_LEN, NO_CEILING, RECORDING_HEADER_BYTES, RECORDING_MAGIC,
    RECORDING_VERSION, RECORDS_PER_CHUNK, RECORD_BYTES,
};

/// Entry-point codes: driver functions by [`crate::driver::DriverFn`] index, runtime functions
/// from [`RUNTIME_BASE`] on.
pub type EntryCode = u16;
pub const RUNTIME_BASE: EntryCode = 64;
// Checked here, where the codes are given out: every driver row has a code below the runtime's,
// and every code fits the record's byte.
const _: () = assert!(
    crate::driver::COUNT <= RUNTIME_BASE as usize,
    "the driver's table has outgrown RUNTIME_BASE: raise it (the timeline's codes move)"
);
const _: () = assert!(
    RUNTIME_BASE as usize + crate::runtime::COUNT <= u8::MAX as usize,
    "the runtime's codes do not fit a record's entry byte"
);

pub use gpumemhook_segment::NO_MODULE;

/// The largest site number a record holds (24 bits).
pub const MAX_SLOT_SITE: u32 = (1 << 24) - 1;
// A record carries a ledger entry's site.
const _: () = assert!(crate::ledger::MAX_SITE <= MAX_SLOT_SITE);

/// The recorder's state, moved only by its named transitions ([`state`]'s header draws them).
static STATE: Lifecycle = Lifecycle::new();
/// The facts of the file this process image writes (a forked child forgets them).
static FILE: FileFacts = FileFacts::new();
/// Only one in this many tries at a new chunk goes on while the disk is full.
const FULL_RETRY: u64 = 4096;

// What the process image sets up once and a forked child keeps (the path's pattern, the thread
// key, the table of written sites, emptied at the fork) or moves on (the generation).
/// Bumped in a forked child: a thread's chunk of an older generation is the parent's.
static GENERATION: AtomicU64 = AtomicU64::new(1);
static FORKED: AtomicBool = AtomicBool::new(false);
/// The path pattern (at start-up).
static PATTERN: OnceLock<PathBuf> = OnceLock::new();
/// Which call sites have their text in the file: 2^24 bits, reserved at start-up (pages are taken
/// only as sites appear).
static SITES_WRITTEN: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
const SITE_WORDS: usize = (MAX_SLOT_SITE as usize + 1) / 64;
/// The `pthread` key whose destructor unmaps an exiting thread's chunk (a thread that ends would
/// otherwise leave 64 KiB of address space and a mapping behind: thousands of short-lived threads
/// would reach the kernel's limit on mappings); [`NO_KEY`] when none could be made.
static CHUNK_KEY: AtomicU32 = AtomicU32::new(NO_KEY);
const NO_KEY: u32 = u32::MAX;

/// A thread's place in its chunk.
#[derive(Clone, Copy)]
struct Cursor {
    /// The chunk's mapping, null before the thread's first.
    chunk: *mut u64,
    /// The next record's index in the chunk.
    next: u64,
    /// The time of the thread's last record, ns: the next one's delta counts from it.
    clock: u64,
    generation: u64,
}

/// What only a change of chunk needs to know of the thread's chunk, kept apart from the
/// [`Cursor`] that every event copies in and out.
#[derive(Clone, Copy)]
struct Held {
    /// The chunk's index in the file (to hand its rest on).
    index: u64,
    /// The chunk's slot in the SIGBUS guard: tripped when the file shrank under it, released when
    /// the chunk is unmapped.
    guard: Option<GuardSlot>,
}

thread_local! {
    static CURSOR: Cell<Cursor> = const {
        Cell::new(Cursor { chunk: std::ptr::null_mut(), next: 0, clock: 0, generation: 0 })
    };
    static HELD: Cell<Held> = const { Cell::new(Held { index: 0, guard: None }) };
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

/// The segment whose peaks a ring's evictions copy (at start-up, and in a forked child).
pub fn attach(segment: &'static Segment) {
    ring::attach(segment);
}

/// When recording started (the header's `start_ns`), 0 before the file is made.
fn start_ns() -> u64 {
    let header = FILE.header.load(Ordering::Acquire);
    if header.is_null() {
        return 0;
    }
    // SAFETY: the header page stays mapped for the life of the process image.
    unsafe { &*header }.start_ns
}

/// Turns recording on (at start-up): the file is made at the first event; with `max_bytes`, its
/// chunks are a ring within that size ([`ring`]). False when the table of written sites (or the
/// ring's states) cannot be reserved.
pub fn enable(pattern: &Path, max_bytes: Option<u64>) -> bool {
    if max_bytes.is_some_and(|max| !ring::configure(max)) {
        return false;
    }
    // SAFETY: an anonymous private mapping, zero-filled; checked below. MAP_NORESERVE: only the
    // pages of bits actually set take memory.
    let sites = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SITE_WORDS * 8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if sites == libc::MAP_FAILED {
        return false;
    }
    SITES_WRITTEN.store(sites.cast(), Ordering::Release);
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out-pointer; `chunk_done` is a C destructor.
    if unsafe { libc::pthread_key_create(&mut key, Some(chunk_done)) } == 0 && key < NO_KEY {
        CHUNK_KEY.store(key, Ordering::Release);
    }
    let _ = PATTERN.set(pattern.to_path_buf());
    STATE.enable();
    true
}

/// What one event the hook counted says, for [`record`] (which encodes it as the file's
/// [`Record`]s).
pub struct CountedEvent {
    pub kind: EventKind,
    pub entry: EntryCode,
    pub device: u32,
    pub bytes: u64,
    pub used: u64,
    /// The number of the change of `used` the event made (`gpumemhook_segment::Change`), 0 for
    /// an event that made none.
    pub order: u16,
    pub address: u64,
    pub mem: MemKind,
    /// The device's ceiling in force (`NO_LIMIT` when none).
    pub limit: u64,
    /// The module charged with a device allocation or free, [`NO_MODULE`] for none.
    pub module: u8,
    /// The Python call site of a device allocation, refusal or free ([`crate::stacks`]), 0 for none.
    pub site: u32,
}

/// Records one event, first any ceiling change or peak restart of its device made through the
/// segment since the last event; a no-op (one load) when recording is off. Called right after the
/// count: the event is timed first thing, so its time is as close to the count as it can be (the
/// reader orders changes of `used` by the values they carry, and the time only places them).
#[inline]
pub fn record(segment: &Segment, event: impl FnOnce() -> CountedEvent) {
    if STATE.is_off() {
        return;
    }
    let now = now_ns();
    record_now(segment, event(), now);
}

#[inline(never)]
fn record_now(segment: &Segment, r: CountedEvent, now: u64) {
    notice_changes(segment, r.device);
    write_names(r.entry, r.module, r.site);
    let device = r.device.min(u32::from(u8::MAX)) as u8;
    // The ceiling in force, recorded where it differs from the one recorded last (as a step of the
    // device's ceiling, not an event of the count).
    let in_force = (r.mem == MemKind::Device)
        .then(|| ceiling_word(r.limit))
        .filter(|&limit| seen_limit(r.device, limit));
    let wide = r.bytes > MAX_NARROW || r.used > MAX_NARROW;
    let records = 1 + u64::from(in_force.is_some()) + u64::from(wide);
    let written = append(records, now, Timing::Delta, |slots, delta| {
        let mut at = 0;
        let mut delta = Some(delta);
        if let Some(limit) = in_force {
            let step = EventRecord {
                kind: EventKind::Ceiling as u8,
                delta_ns: delta.take().unwrap_or(0),
                device,
                entry: CEILING_IN_FORCE,
                bytes: limit,
                used: r.used.min(MAX_NARROW),
                address: now,
                ..EventRecord::default()
            };
            store(slots, at, Record::Event(step).encode());
            at += 1;
        }
        if wide {
            let wide = Record::Wide {
                bytes: r.bytes,
                used: r.used,
            };
            store(slots, at, wide.encode());
            at += 1;
        }
        let event = EventRecord {
            kind: r.kind as u8,
            delta_ns: delta.take().unwrap_or(0),
            mem: r.mem as u8,
            order: r.order as u8,
            device,
            module: r.module,
            entry: r.entry as u8,
            address: r.address,
            bytes: r.bytes.min(MAX_NARROW),
            used: r.used.min(MAX_NARROW),
            site: r.site.min(MAX_SLOT_SITE),
        };
        store(slots, at, Record::Event(event).encode());
    });
    if !written {
        lose();
    }
}

/// The ceiling as a record holds it ([`NO_CEILING`] for none).
fn ceiling_word(limit: u64) -> u64 {
    if limit == gpumemhook_segment::NO_LIMIT || limit >= NO_CEILING {
        NO_CEILING
    } else {
        limit
    }
}

/// Whether `limit` differs from the ceiling last recorded for `device`; it is the last from now.
fn seen_limit(device: u32, limit: u64) -> bool {
    FILE.limits_seen.get(device as usize).is_some_and(|seen| {
        seen.load(Ordering::Relaxed) != limit && seen.swap(limit, Ordering::Relaxed) != limit
    })
}

/// Records the ceiling change and the peak restart of `device` that the segment's time stamps show
/// and the timeline does not have yet, each at the time it happened. Two threads noticing the same
/// change record it once (the swap decides).
fn notice_changes(segment: &Segment, device: u32) {
    let (Some(counters), Some(resets_seen), Some(ceilings_seen)) = (
        segment.device(device),
        FILE.resets_seen.get(device as usize),
        FILE.ceilings_seen.get(device as usize),
    ) else {
        return;
    };
    let notice = |kind: EventKind, stamp: &AtomicU64, seen: &AtomicU64| {
        let at = stamp.load(Ordering::Acquire);
        if at != seen.load(Ordering::Relaxed) && seen.swap(at, Ordering::Relaxed) != at && at != 0 {
            let limit = ceiling_word(counters.allocation_cap());
            seen_limit(device, limit);
            let change = stamped_change(kind, counters);
            let marker = EventRecord {
                kind: kind as u8,
                device: device as u8,
                entry: CEILING_CHANGED,
                bytes: limit,
                used: change.used.min(MAX_NARROW),
                order: change.number as u8,
                address: at,
                ..EventRecord::default()
            };
            // Stamped with its own time: the record's delta is 0 and the thread's clock stays.
            if !append(1, now_ns(), Timing::Untimed, |slots, _| {
                store(slots, 0, Record::Event(marker).encode())
            }) {
                lose();
            }
        }
    };
    notice(EventKind::PeakReset, &counters.peak_reset_ns, resets_seen);
    notice(EventKind::Ceiling, &counters.limit_set_ns, ceilings_seen);
}

/// What a stamped record of `kind` says of `used`: for a peak restart, the change it took its
/// place as (`used` then, and its number); for a ceiling change, `used` now.
fn stamped_change(kind: EventKind, counters: &DeviceCounters) -> Change {
    if kind == EventKind::PeakReset {
        Change::of_word(counters.peak_reset_mark.load(Ordering::Acquire))
    } else {
        Change {
            used: counters.used.load(Ordering::Relaxed),
            number: 0,
        }
    }
}

/// Writes the names an event refers to that the file does not have yet.
fn write_names(entry: EntryCode, module: u8, site: u32) {
    if first_time(&FILE.entries_written, usize::from(entry)) {
        write_text(
            TextClass::Entry,
            u32::from(entry),
            entry_name(entry).as_bytes(),
        );
    }
    if module != NO_MODULE && first_time(&FILE.modules_written, usize::from(module)) {
        let mut name = [0u8; 256];
        let len = crate::modules::file_name_into(module, &mut name);
        write_text(TextClass::Module, u32::from(module), &name[..len]);
    }
    if site != 0 && site <= MAX_SLOT_SITE {
        let bits = SITES_WRITTEN.load(Ordering::Acquire);
        if bits.is_null() {
            return;
        }
        // SAFETY: the mapping holds SITE_WORDS words and `site >> 6` is below it (site < 2^24);
        // the words are only touched atomically.
        let word = unsafe { &*bits.add(site as usize >> 6) };
        let bit = 1u64 << (site & 63);
        if word.load(Ordering::Relaxed) & bit == 0
            && word.fetch_or(bit, Ordering::Relaxed) & bit == 0
        {
            if let Some(text) = crate::stacks::describe(site) {
                write_text(TextClass::Site, site, text.as_bytes());
            }
        }
    }
}

/// Sets bit `index` of `bits`; true when this call set it.
fn first_time(bits: &[AtomicU64; 4], index: usize) -> bool {
    let Some(word) = bits.get(index / 64) else {
        return false;
    };
    let bit = 1u64 << (index % 64);
    word.load(Ordering::Relaxed) & bit == 0 && word.fetch_or(bit, Ordering::Relaxed) & bit == 0
}

/// Writes a numbered string, its bytes in the records after it.
fn write_text(class: TextClass, number: u32, text: &[u8]) {
    let text = &text[..text.len().min(MAX_TEXT_LEN)];
    let record = Record::Text {
        class: Some(class),
        number,
        len: text.len() as u64,
    };
    // A name that finds no room is not an event: nothing is counted lost.
    let _ = append(
        1 + text_records(text.len()),
        now_ns(),
        Timing::Untimed,
        |slots, _| {
            // SAFETY: `append` hands this thread's own records `slots[..1 + text_records(len)]`, which
            // nobody reads before the first word of the first is stored (below, last).
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), slots.add(4).cast::<u8>(), text.len())
            };
            store(slots, 0, record.encode());
        },
    );
}

/// How a record placed by [`append`] is timed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Timing {
    /// Its first record carries the nanoseconds since the thread's previous timed record (the
    /// reader adds them up): an event.
    Delta,
    /// Carries no delta and leaves the thread's clock alone: a name, or a record stamped with its
    /// own time.
    Untimed,
}

/// Gives `fill` room for `records` records in this thread's chunk (a new chunk when short), and,
/// for [`Timing::Delta`], the nanoseconds since the thread's previous timed record at `now`;
/// false when there is none (a full disk, no file): the caller counts an event it could not
/// write as lost.
#[must_use]
fn append(records: u64, now: u64, timing: Timing, fill: impl FnOnce(*mut u64, u32)) -> bool {
    let generation = GENERATION.load(Ordering::Acquire);
    let mut c = CURSOR.with(Cell::get);
    // One record more than asked: a time record may go first.
    let short =
        c.chunk.is_null() || c.generation != generation || c.next + records + 1 > RECORDS_PER_CHUNK;
    if short && !new_chunk(&mut c, generation, now) {
        CURSOR.with(|cell| cell.set(c));
        return false;
    }
    let mut delta = 0;
    if timing == Timing::Delta {
        let now = now.max(c.clock);
        delta = u32::try_from(now - c.clock).unwrap_or_else(|_| {
            // SAFETY: `c.next` is below the chunk's records (room for one more was checked).
            let slot = unsafe { c.chunk.add(c.next as usize * 4) };
            store(slot, 0, Record::Time { clock_ns: now }.encode());
            c.next += 1;
            0
        });
        c.clock = now;
    }
    // SAFETY: records `c.next .. c.next + records` lie inside the thread's own chunk.
    let slots = unsafe { c.chunk.add(c.next as usize * 4) };
    c.next += records;
    CURSOR.with(|cell| cell.set(c));
    fill(slots, delta);
    true
}

/// Counts an event that could not be written.
fn lose() {
    let header = FILE.header.load(Ordering::Acquire);
    if header.is_null() {
        FILE.lost_before_header.fetch_add(1, Ordering::Relaxed);
    } else {
        // SAFETY: the header page stays mapped for the life of the process image.
        unsafe { &*header }.lost.fetch_add(1, Ordering::Relaxed);
    }
}

/// Gives this thread a chunk to write: for a thread without one, the rest of a chunk a thread that
/// ended handed on ([`FileFacts::pool`]), else a new chunk claimed, reserved on disk and mapped;
/// its first record says whose run starts there.
fn new_chunk(c: &mut Cursor, generation: u64, now: u64) -> bool {
    if FILE.full.load(Ordering::Relaxed)
        && !FILE
            .retries
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(FULL_RETRY)
    {
        return false;
    }
    let Some(fd) = file() else {
        return false;
    };
    // A cut is seen here, at the thread's next chunk, or at exit: until then the thread's stores
    // into a page the file lost go to the zeroed memory the guard put there.
    let faulted = HELD.with(Cell::get).guard.is_some_and(GuardSlot::tripped);
    if faulted || file_was_cut(fd) {
        cut();
        return false;
    }
    if c.chunk.is_null() {
        if let Some((index, at)) = take_handed_on(generation) {
            return start_run(c, fd, index, at, generation, now, false);
        }
    }
    let (index, evicts) = match ring::layout() {
        Some(layout) => match ring::claim(&layout, &FILE.next_chunk) {
            Some(claimed) => (claimed.index, claimed.evicts),
            // Every slot is being written by a thread of its own: this event finds no room.
            None => return false,
        },
        None => (FILE.next_chunk.fetch_add(1, Ordering::Relaxed), false),
    };
    let offset = chunk_offset(index);
    // Extends our own file over a range no other thread was given (a slot used before has it).
    if !evicts {
        if let Err(e) = gpumemhook_reader::reserve_file_range(fd, offset, CHUNK_BYTES as usize) {
            ring::forget(index);
            full(e.raw_os_error().unwrap_or(libc::ENOSPC));
            return false;
        }
        FILE.reserved_end
            .fetch_max(offset + CHUNK_BYTES, Ordering::Release);
    }
    start_run(c, fd, index, 0, generation, now, evicts)
}

/// Maps chunk `index` (reserved already) for this thread, which writes it from record `at` on
/// (0: a new chunk, its own first record; else the rest of a chunk handed on, after a record
/// saying this thread's run starts there). The thread's previous chunk is dropped.
#[allow(clippy::too_many_arguments)]
fn start_run(
    c: &mut Cursor,
    fd: i32,
    index: u64,
    at: u64,
    generation: u64,
    now: u64,
    evicts: bool,
) -> bool {
    let chunk = match map_shared(fd, chunk_offset(index) as libc::off_t, CHUNK_BYTES) {
        Ok(chunk) => chunk,
        Err(e) => {
            ring::release(index);
            full(e.raw_os_error().unwrap_or(libc::ENOMEM));
            return false;
        }
    };
    // Unguarded, a truncation of the file would kill the program at the chunk's next store: with
    // every slot of the guard taken, the chunk goes unused and its events are counted lost.
    let Some(guard) = GuardSlot::new(chunk as usize, CHUNK_BYTES as usize) else {
        // SAFETY: the mapping just made, which nothing refers to.
        unsafe { libc::munmap(chunk, CHUNK_BYTES as usize) };
        ring::release(index);
        return false;
    };
    if evicts {
        ring::evict(chunk.cast(), start_ns());
    }
    FILE.full.store(false, Ordering::Relaxed);
    // The thread's previous chunk (or, in a forked child, its copy of the parent's mapping): in a
    // ring, its slot may be evicted from now on.
    let previous = HELD.with(Cell::get);
    if !c.chunk.is_null() && c.generation == generation {
        ring::release(previous.index);
    }
    drop_chunk(c.chunk, previous.guard);
    HELD.with(|held| {
        held.set(Held {
            index,
            guard: Some(guard),
        })
    });
    let key = CHUNK_KEY.load(Ordering::Acquire);
    if key != NO_KEY {
        // SAFETY: a key made by pthread_key_create; the value is this thread's chunk, unmapped by
        // `chunk_done` when the thread ends. A failure only leaves the chunk mapped at its end.
        unsafe { libc::pthread_setspecific(key, chunk) };
    }
    *c = Cursor {
        chunk: chunk.cast(),
        next: at + 1,
        clock: now,
        generation,
    };
    let (tid, clock_ns) = (tid(), now);
    let record = if at == 0 {
        Record::Chunk { tid, clock_ns }
    } else {
        Record::Thread { tid, clock_ns }
    };
    // SAFETY: record `at` lies inside the chunk (a chunk handed on has room past it).
    let head = unsafe { c.chunk.add(at as usize * 4) };
    store(head, 0, record.encode());
    true
}

/// Where a thread that ends leaves the rest of its chunk for the next thread that needs one: each
/// slot 0 (empty) or [`handed_on`]'s word. A fixed array of words, each taken or given with one
/// compare-and-swap: no lock, no allocation; past [`state::POOL_SLOTS`] the rest is left unused. Threads
/// that come and go then share chunks (10,000 threads of two events: kilobytes, not 655 MB), and
/// no mapping outlives its thread (a chunk handed on is mapped again by its next thread).
/// The room a chunk must have left to be handed on: the next thread's first record, then the
/// largest request `append` makes (a name: its record and 128 of bytes, after a time record).
const POOL_MIN_ROOM: u64 = 256;
const _: () = assert!(POOL_MIN_ROOM > 1 + 1 + text_records(MAX_TEXT_LEN) + 1);
/// A slot's fields: the chunk's index (40 bits), the next free record (12), and the low 12 bits of
/// the generation that wrote it (a parent's, inherited at `fork`, is not this process's file).
const AT_BITS: u32 = 12;
const GENERATION_BITS: u32 = 12;
const FIELD_MASK: u64 = (1 << 12) - 1;
const _: () = assert!(RECORDS_PER_CHUNK <= FIELD_MASK);

/// A slot's word for the rest of chunk `index` from record `at` on (never 0: `at` is at least 1).
fn handed_on(index: u64, at: u64, generation: u64) -> u64 {
    (index << (AT_BITS + GENERATION_BITS)) | (at << GENERATION_BITS) | (generation & FIELD_MASK)
}

/// Hands on what is left of the ending thread's chunk, number `index` (when enough is); true when a
/// slot took it.
fn hand_on(c: &Cursor, index: u64) -> bool {
    // A ring's slot is simply released: the next claim of it evicts what it holds.
    if ring::layout().is_some() {
        if c.generation == GENERATION.load(Ordering::Acquire) {
            ring::release(index);
        }
        return true;
    }
    if STATE.now() != RecorderState::Open
        || c.generation != GENERATION.load(Ordering::Acquire)
        || c.next + POOL_MIN_ROOM > RECORDS_PER_CHUNK
    {
        return false;
    }
    let word = handed_on(index, c.next, c.generation);
    FILE.pool.iter().any(|slot| {
        slot.load(Ordering::Relaxed) == 0
            && slot
                .compare_exchange(0, word, Ordering::Release, Ordering::Relaxed)
                .is_ok()
    })
}

/// Takes the rest of a chunk handed on in this generation: its index and first free record.
fn take_handed_on(generation: u64) -> Option<(u64, u64)> {
    for slot in &FILE.pool {
        let word = slot.load(Ordering::Relaxed);
        if word == 0
            || slot
                .compare_exchange(word, 0, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        if word & FIELD_MASK == generation & FIELD_MASK {
            let at = (word >> GENERATION_BITS) & FIELD_MASK;
            return Some((word >> (AT_BITS + GENERATION_BITS), at));
        }
    }
    None
}

/// The key's destructor: the rest of the exiting thread's chunk is handed on
/// ([`FileFacts::pool`]), its mapping unmapped, and the chunk forgotten by the thread (a later
/// destructor of another library that frees memory starts a new run, after the old one).
unsafe extern "C" fn chunk_done(chunk: *mut libc::c_void) {
    if chunk.is_null() {
        return;
    }
    // Only the chunk the thread still writes is unmapped: a key value left behind by a failed
    // `pthread_setspecific` could name an address mapped again since.
    let mine = CURSOR
        .try_with(|cell| {
            let mut c = cell.get();
            if c.chunk.cast() != chunk {
                return None;
            }
            let held = HELD.with(|held| {
                held.replace(Held {
                    index: 0,
                    guard: None,
                })
            });
            hand_on(&c, held.index);
            c.chunk = std::ptr::null_mut();
            cell.set(c);
            Some(held.guard)
        })
        .unwrap_or(None);
    if let Some(guard) = mine {
        drop_chunk(chunk.cast(), guard);
    }
}

/// Unmaps a chunk the thread no longer writes (null: none), its guard released first.
fn drop_chunk(chunk: *mut u64, guard: Option<GuardSlot>) {
    if let Some(guard) = guard {
        guard.release();
    }
    if !chunk.is_null() {
        // SAFETY: a chunk mapped by `new_chunk` with this length, which no thread writes or refers
        // to any more.
        unsafe { libc::munmap(chunk.cast(), CHUNK_BYTES as usize) };
    }
}

/// Whether the file was cut under the program by another process: the header's page faulted, or
/// the file is shorter than the range reserved for it (truncated, or copied over by a shorter
/// file). A rewrite in place that keeps the length goes unseen: it changes what the file says,
/// never what the program does.
fn file_was_cut(fd: i32) -> bool {
    let header_faulted = GuardSlot::from_raw(FILE.header_guard.load(Ordering::Relaxed))
        .is_some_and(GuardSlot::tripped);
    // Read before the length: every range counted here was reserved before it was counted.
    let reserved = FILE.reserved_end.load(Ordering::Acquire);
    // SAFETY: `stat` is plain data; all zeroes is a valid value.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of our own descriptor into a live local; a failure is no answer.
    let shorter = unsafe { libc::fstat(fd, &mut stat) } == 0 && (stat.st_size as u64) < reserved;
    header_faulted || shorter
}

/// The file was cut under the program: recording stops (the events already stored stay where the
/// file still has them), said once; the counts are the segment's and go on exactly.
#[cold]
fn cut() {
    STATE.stop();
    if !FILE.said_cut.swap(true, Ordering::Relaxed) {
        let path = PATTERN.get().map(|p| this_path(p)).unwrap_or_default();
        crate::diag::warn(&format!(
            "the timeline {} was cut under the program (truncated or copied over by another \
             process): recording stops here; the counts go on exactly",
            path.display()
        ));
    }
}

/// Says once that the disk is full (or the file cannot grow), with the error.
fn full(errno: i32) {
    FILE.full.store(true, Ordering::Relaxed);
    if !FILE.said_full.swap(true, Ordering::Relaxed) {
        crate::diag::warn(&format!(
            "the timeline cannot grow ({}): events are lost until it can; the counts go on \
             exactly",
            std::io::Error::from_raw_os_error(errno)
        ));
    }
}

/// The recording's file, made at the first call; `None` when it cannot be.
fn file() -> Option<i32> {
    let mut spins = 0;
    loop {
        match STATE.now() {
            RecorderState::Open => return Some(FILE.fd.load(Ordering::Relaxed)),
            RecorderState::Unopened => {
                if STATE.begin_open() {
                    STATE.opened(open_file());
                }
            }
            RecorderState::Opening => {
                crate::spin::back_off(spins);
                spins += 1;
            }
            RecorderState::Off | RecorderState::Failed => return None,
        }
    }
}

/// The path this process records to: the pattern's `%p` is the pid; a forked child of a pattern
/// without `%p` records to the path with `.<pid>` after it (never over its parent's file), unless
/// the path leads to a device, a FIFO, a socket or an open descriptor (`/dev/stdout`), which the
/// child writes as its parent does: a file beside a device would be made in `/dev`.
fn this_path(pattern: &Path) -> PathBuf {
    let path = gpumemhook_reader::expand_output(pattern);
    if FORKED.load(Ordering::Relaxed)
        && !pattern
            .as_os_str()
            .as_encoded_bytes()
            .windows(2)
            .any(|w| w == b"%p")
        && matches!(
            gpumemhook_reader::output_target(&path),
            Ok(OutputTarget::Replace(_))
        )
    {
        let mut name = path.into_os_string();
        name.push(format!(".{}", std::process::id()));
        return PathBuf::from(name);
    }
    path
}

/// Makes the file (see the module's rule) and maps its header: [`Opened::Open`];
/// [`Opened::Failed`], said once, when it cannot; [`Opened::Discarded`] for `/dev/null`, which
/// keeps nothing (a copy kept until exit would only fill the temporary folder).
#[cold]
fn open_file() -> Opened {
    let Some(pattern) = PATTERN.get() else {
        return Opened::Failed;
    };
    let path = this_path(pattern);
    let made = match gpumemhook_reader::live_target(&path) {
        Ok(OutputTarget::Device(at)) if is_null_device(&at) => return Opened::Discarded,
        Ok(OutputTarget::Replace(at)) => {
            let mut header = std::ptr::null_mut();
            gpumemhook_reader::create_own(&at, |file| {
                header = start_file(file)?;
                Ok(())
            })
            .map(|file| (file, header))
        }
        Ok(_) => unnamed_file().and_then(|file| {
            let header = start_file(&file)?;
            FILE.copy_to
                .store(Box::into_raw(Box::new(path.clone())), Ordering::Release);
            Ok((file, header))
        }),
        Err(e) => Err(e),
    };
    match made {
        Ok((file, header)) => {
            // SAFETY: the header was mapped by `start_file`; a count of events lost before it.
            unsafe { &*header }.lost.fetch_add(
                FILE.lost_before_header.swap(0, Ordering::Relaxed),
                Ordering::Relaxed,
            );
            FILE.header.store(header, Ordering::Release);
            FILE.fd.store(file.into_raw_fd(), Ordering::Relaxed);
            Opened::Open
        }
        Err(e) => {
            crate::diag::warn(&format!(
                "cannot record the timeline to {}: {e}; no timeline will be written",
                path.display()
            ));
            Opened::Failed
        }
    }
}

/// Whether `path` is the null device (character device 1:3, whatever its name).
fn is_null_device(path: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    std::fs::metadata(path)
        .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == libc::makedev(1, 3))
}

/// A file in the temporary folder with no name, for a target that cannot be mapped.
fn unnamed_file() -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir();
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&dir);
    if unnamed.is_ok() {
        return unnamed;
    }
    // A file system without O_TMPFILE: a new private file, its name removed at once.
    let path = dir.join(format!(
        ".gpumemhook-timeline-{}-{}",
        std::process::id(),
        now_ns()
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// Extends `file` by its header, maps the header and fills it.
fn start_file(file: &std::fs::File) -> std::io::Result<*mut RecordingHeader> {
    let fd = file.as_raw_fd();
    let ring = ring::layout();
    // A ring's summary and names are reserved with the header (its slots as they are claimed).
    let reserved = ring.map_or(RECORDING_HEADER_BYTES, |r| chunk_offset(r.first_slot()));
    gpumemhook_reader::reserve_file_range(fd, 0, reserved as usize)?;
    let header = map_shared(fd, 0, RECORDING_HEADER_BYTES)?.cast::<RecordingHeader>();
    FILE.header_guard.store(
        guarded(header.cast(), RECORDING_HEADER_BYTES)?,
        Ordering::Relaxed,
    );
    if let Some(ring) = &ring {
        ring::start_file(fd, ring)?;
    }
    FILE.reserved_end.store(reserved, Ordering::Release);
    // SAFETY: the page is ours, zero-filled and page-aligned, and `RecordingHeader` (plain integers
    // and byte arrays, all-zero valid) fits it (checked where the format is defined).
    let h = unsafe { &mut *header };
    let pid = std::process::id();
    h.magic = RECORDING_MAGIC;
    h.version = RECORDING_VERSION;
    if let Some(ring) = ring {
        h.version = gpumemhook_segment::RING_RECORDING_VERSION;
        h.ring_summary_chunks = ring.summary_chunks as u32;
        h.ring_name_chunks = ring.name_chunks as u32;
        h.ring_slots = ring.slots;
    }
    h.header_bytes = RECORDING_HEADER_BYTES as u32;
    h.chunk_bytes = CHUNK_BYTES as u32;
    h.record_bytes = RECORD_BYTES as u32;
    h.pid = pid;
    h.start_ns = now_ns();
    h.start_unix_ns = gpumemhook_segment::unix_now_ns();
    fill_field(
        &mut h.command,
        gpumemhook_segment::command_line(pid)
            .unwrap_or_default()
            .as_bytes(),
    );
    fill_field(&mut h.host, host_name().as_bytes());
    let labels = gpumemhook_reader::JobLabels::of_this_process();
    fill_field(
        &mut h.labels,
        &serde_json::to_vec(&labels).unwrap_or_default(),
    );
    Ok(header)
}

/// This machine's host name (`uname`), `""` when unknown.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// In a forked child: the parent's file and chunks are not the child's; it records, from its first
/// event, into a file of its own (async-signal-safe: atomic stores and `close`).
pub fn forked() {
    // Recording was asked for (a parent whose file was cut or sent to /dev/null stopped, and its
    // child starts afresh).
    if PATTERN.get().is_none() {
        return;
    }
    FORKED.store(true, Ordering::Relaxed);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    let fd = FILE.forget();
    if fd >= 0 {
        // SAFETY: the child's copy of the parent's descriptor, which only this module used.
        unsafe { libc::close(fd) };
    }
    ring::forked();
    let sites = SITES_WRITTEN.load(Ordering::Relaxed);
    if !sites.is_null() {
        // SAFETY: the child's private copy of the table: dropping its pages empties it (an
        // anonymous private mapping reads back as zeroes).
        unsafe { libc::madvise(sites.cast(), SITE_WORDS * 8, libc::MADV_DONTNEED) };
    }
    STATE.restart_in_child();
}

/// Marks a scope opening (`open`) or closing on the timeline, `name` read only when recording
/// (in-process readers call it through the exported `gpumemhook_trace_scope`, `crate::exports`).
pub fn scope_mark<'a>(open: bool, slot: u32, name: impl FnOnce() -> &'a [u8]) {
    if STATE.is_off() {
        return;
    }
    let (kind, number) = if open {
        let number = FILE.scope_names.fetch_add(1, Ordering::Relaxed);
        write_text(TextClass::Scope, number, name());
        (EventKind::ScopeOpen, number)
    } else {
        (EventKind::ScopeClose, 0)
    };
    let mark = EventRecord {
        kind: kind as u8,
        address: EventRecord::scope_address(slot, number),
        ..EventRecord::default()
    };
    let written = append(1, now_ns(), Timing::Delta, |slots, delta| {
        let mark = EventRecord {
            delta_ns: delta,
            ..mark
        };
        store(slots, 0, Record::Event(mark).encode())
    });
    if !written {
        lose();
    }
}

/// The last `count` allocation events recorded so far (refusals and failures included), oldest
/// first, for an out-of-memory report, with `site` naming their call sites; empty without a
/// timeline. Read back from the file's last chunks; recording goes on.
pub fn recent(
    count: usize,
    site: impl Fn(u32) -> Option<String>,
) -> Vec<gpumemhook_reader::RecentEvent> {
    let fd = FILE.fd.load(Ordering::Relaxed);
    if STATE.now() != RecorderState::Open || fd < 0 {
        return Vec::new();
    }
    let claimed = FILE.next_chunk.load(Ordering::Acquire);
    let module_names = crate::modules::file_names();
    let mut events = Vec::new();
    let mut chunk = vec![0u8; CHUNK_BYTES as usize];
    // SAFETY: a second handle on our own descriptor, never closed (ManuallyDrop).
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let ring = ring::layout();
    // A ring holds fewer chunks than that, perhaps: each of its slots is read once.
    let chunks = ring.map_or(RECENT_CHUNKS, |r| RECENT_CHUNKS.min(r.slots));
    for number in claimed.saturating_sub(chunks)..claimed {
        use std::os::unix::fs::FileExt;
        let index = ring.map_or(number, |ring| ring.chunk_of(number));
        if file.read_exact_at(&mut chunk, chunk_offset(index)).is_err() {
            continue;
        }
        for (ts_ns, r) in gpumemhook_segment::chunk_events(&chunk) {
            let Some(kind) = EventKind::from_code(r.kind).filter(|k| k.is_allocation()) else {
                continue;
            };
            events.push(gpumemhook_reader::RecentEvent {
                ts: ts_ns as f64 / 1000.0,
                event: kind.category().to_string(),
                entry: entry_name(EntryCode::from(r.entry)).to_string(),
                device: u32::from(r.device),
                bytes: r.bytes,
                used: r.used,
                module: module_names.of(r.module).to_string(),
                site: site(r.site),
            });
        }
    }
    events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    let skip = events.len().saturating_sub(count);
    events.split_off(skip)
}

/// Chunks read back for [`recent`]: the last claimed, whatever thread wrote them.
const RECENT_CHUNKS: u64 = 32;

/// Finishes the timeline at exit: the changes since each device's last event, the ceilings in
/// force at exit where they differ from the last recorded, then the header's end (the file now
/// reads as whole). A target that could not be mapped gets its copy now.
pub fn finish(segment: &Segment) {
    if STATE.now() == RecorderState::Off {
        return;
    }
    let devices = segment.active_devices();
    for &device in &devices {
        notice_changes(segment, device);
    }
    let end_ns = now_ns();
    for &device in &devices {
        // The cap allocations are judged by (`account::limit_of`, which this layer may not call).
        let cap = segment
            .device(device)
            .map_or(gpumemhook_segment::NO_LIMIT, |c| c.allocation_cap());
        let limit = ceiling_word(cap);
        if seen_limit(device, limit) {
            let step = EventRecord {
                kind: EventKind::Ceiling as u8,
                device: device as u8,
                entry: CEILING_AT_EXIT,
                bytes: limit,
                address: end_ns,
                ..EventRecord::default()
            };
            // A step, not an event: nothing is counted lost without room.
            let _ = append(1, end_ns, Timing::Untimed, |slots, _| {
                store(slots, 0, Record::Event(step).encode())
            });
        }
    }
    // A process that recorded no event still leaves its (empty) timeline.
    let Some(fd) = file() else {
        return;
    };
    if file_was_cut(fd) {
        cut();
        return;
    }
    let header = FILE.header.load(Ordering::Acquire);
    if header.is_null() {
        return;
    }
    // SAFETY: the header page stays mapped for the life of the process image.
    let header = unsafe { &*header };
    header.end_ns.store(end_ns, Ordering::Release);
    let lost = header.lost.load(Ordering::Relaxed);
    let path = PATTERN.get().map(|p| this_path(p)).unwrap_or_default();
    if lost > 0 {
        crate::diag::warn(&format!(
            "the timeline {} misses {lost} events (it could not grow)",
            path.display()
        ));
    }
    let copy_to = FILE.copy_to.load(Ordering::Acquire);
    if !copy_to.is_null() {
        // SAFETY: a `PathBuf` leaked by `open_file` for the life of the process image.
        let target = unsafe { &*copy_to };
        // SAFETY: a second handle on our own descriptor, never closed here.
        let mut file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        let copied = gpumemhook_reader::write_file(target, |out| {
            use std::io::Seek;
            file.seek(std::io::SeekFrom::Start(0))?;
            std::io::copy(&mut *file, out).map(drop)
        });
        if let Err(e) = copied {
            crate::diag::warn(&format!(
                "cannot write the timeline to {}: {e}",
                target.display()
            ));
        }
    }
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

//! The timeline as a ring (`GPUMEMHOOK_TRACE_MAX`): which slot a new chunk takes, and what is kept
//! of the chunk it evicts (the format and its reasons: the segment crate's `ring` module).
//!
//! A slot's state lives in this process's memory (an anonymous mapping made at start-up, one word a
//! slot): the claim number it holds plus one, shifted, and a busy bit while a thread writes it. A
//! claim takes the next number and its slot with one compare-and-swap; a busy slot is skipped. The
//! thread that evicts a chunk folds it into the file's summary under the summary's lock, which only
//! evicting threads take and which lives in this process's own file (a forked child records into a
//! file of its own and never touches it), then zeroes the slot before its new first record.
//!
//! Nothing here allocates: the fold walks the evicted chunk where it is mapped.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use gpumemhook_reader::EventKind;
use gpumemhook_segment::{
    bucket_of, chunk_offset, module_cell, ring_layout_for, text_records, ChunkItem, ChunkReader,
    MemKind, Record, RingDevice, RingLayout, RingSummary, Segment, CHUNK_BYTES, FIRST_BUCKET_NS,
    MAX_DEVICES, MODULE_CELLS, RECORDS_PER_CHUNK, RECORD_BYTES, RING_BUCKETS, RING_MODULE_CELLS,
    SUMMARY_MAGIC,
};

use super::file::{guarded, map_shared, store};

/// The ring's layout (slots 0: no ring), set at start-up.
static SLOTS: AtomicU64 = AtomicU64::new(0);
static NAME_CHUNKS: AtomicU64 = AtomicU64::new(0);
static SUMMARY_CHUNKS: AtomicU64 = AtomicU64::new(0);
/// The slots' states (see the module's header), an anonymous mapping of one word a slot.
static STATES: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
/// The file's summary and its name chunks, mapped when the file is made; null before.
static SUMMARY: AtomicPtr<RingSummary> = AtomicPtr::new(std::ptr::null_mut());
static NAMES: AtomicPtr<u64> = AtomicPtr::new(std::ptr::null_mut());
/// The segment whose peaks the summary copies at each eviction.
static SEGMENT: AtomicPtr<Segment> = AtomicPtr::new(std::ptr::null_mut());

const BUSY: u64 = 1;

/// The ring's layout, `None` when the timeline has none.
pub fn layout() -> Option<RingLayout> {
    let slots = SLOTS.load(Ordering::Relaxed);
    (slots != 0).then(|| RingLayout {
        summary_chunks: SUMMARY_CHUNKS.load(Ordering::Relaxed),
        name_chunks: NAME_CHUNKS.load(Ordering::Relaxed),
        slots,
    })
}

/// Makes the timeline a ring within `max_bytes` (at start-up); false when the slots' states
/// cannot be mapped.
pub fn configure(max_bytes: u64) -> bool {
    let Some(ring) = ring_layout_for(max_bytes) else {
        return false;
    };
    // Zeroed: every slot never used.
    let Some(states) = crate::maps::map_zeroed(ring.slots as usize * 8) else {
        return false;
    };
    STATES.store(states.cast(), Ordering::Release);
    SUMMARY_CHUNKS.store(ring.summary_chunks, Ordering::Relaxed);
    NAME_CHUNKS.store(ring.name_chunks, Ordering::Relaxed);
    SLOTS.store(ring.slots, Ordering::Release);
    true
}

/// The segment whose peaks evictions copy.
pub fn attach(segment: &'static Segment) {
    SEGMENT.store(std::ptr::from_ref(segment).cast_mut(), Ordering::Release);
}

fn states(ring: &RingLayout) -> Option<&'static [AtomicU64]> {
    let states = STATES.load(Ordering::Acquire);
    // SAFETY: `configure` mapped `slots` words there for the life of the process image.
    (!states.is_null()).then(|| unsafe { std::slice::from_raw_parts(states, ring.slots as usize) })
}

/// Maps the new file's summary and names (reserved with the header by the caller), and stamps
/// the summary; the header's ring fields are the caller's.
pub fn start_file(fd: i32, ring: &RingLayout) -> std::io::Result<()> {
    let summary = map_shared(
        fd,
        chunk_offset(0) as libc::off_t,
        ring.summary_chunks * CHUNK_BYTES,
    )?;
    let names = map_shared(
        fd,
        chunk_offset(ring.first_name_chunk()) as libc::off_t,
        ring.name_chunks * CHUNK_BYTES,
    )?;
    // A cut file must not kill the program at a fold's next store (the header's rule).
    guarded(summary, ring.summary_chunks * CHUNK_BYTES)?;
    guarded(names, ring.name_chunks * CHUNK_BYTES)?;
    // SAFETY: the summary's pages, zero-filled and page-aligned, fit `RingSummary` (plain atomics
    // and bytes, all-zero valid): `summary_chunks` was sized for it.
    unsafe { &mut *summary.cast::<RingSummary>() }.magic = SUMMARY_MAGIC;
    SUMMARY.store(summary.cast(), Ordering::Release);
    NAMES.store(names.cast(), Ordering::Release);
    Ok(())
}

/// A slot claimed for this thread: its chunk index, and whether a chunk is evicted from it.
pub struct Claimed {
    pub index: u64,
    pub evicts: bool,
}

/// Claims the next slot not being written, taking claim numbers from `next`; `None` when every
/// slot is busy (each thread of as many holds one).
pub fn claim(ring: &RingLayout, next: &AtomicU64) -> Option<Claimed> {
    let states = states(ring)?;
    for _ in 0..ring.slots {
        let number = next.fetch_add(1, Ordering::Relaxed);
        let slot = (number % ring.slots) as usize;
        let state = &states[slot];
        let old = state.load(Ordering::Acquire);
        if old & BUSY != 0 {
            continue;
        }
        let mine = ((number + 1) << 1) | BUSY;
        if state
            .compare_exchange(old, mine, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Some(Claimed {
                index: ring.chunk_of(number),
                evicts: old != 0,
            });
        }
    }
    None
}

/// The thread no longer writes chunk `index`: its slot may be evicted.
pub fn release(index: u64) {
    if let Some(state) = state_of(index) {
        state.fetch_and(!BUSY, Ordering::Release);
    }
}

/// Chunk `index` was claimed but its range could not be reserved in the file: its slot is as
/// never used (the next claim reserves it again rather than map a range the file lacks).
pub fn forget(index: u64) {
    if let Some(state) = state_of(index) {
        state.store(0, Ordering::Release);
    }
}

fn state_of(index: u64) -> Option<&'static AtomicU64> {
    let ring = layout()?;
    let slot = index.checked_sub(ring.first_slot())?;
    states(&ring)?.get(slot as usize)
}

/// Keeps what the chunk mapped at `chunk` holds in the summary and the names, then zeroes it, its
/// first record first (a reader then skips it until its new first record).
pub fn evict(chunk: *mut u64, start_ns: u64) {
    let summary = SUMMARY.load(Ordering::Acquire);
    if !summary.is_null() {
        // SAFETY: the summary stays mapped for the life of the file.
        let summary = unsafe { &*summary };
        // SAFETY: the chunk is this thread's (its slot is busy with our claim), CHUNK_BYTES long and
        // mapped; no thread of this process writes it until we do. Another process rewriting the
        // file in place changes only what is read here (and a cut file reads as zeroes: the guard).
        let bytes = unsafe { std::slice::from_raw_parts(chunk.cast::<u8>(), CHUNK_BYTES as usize) };
        lock(summary);
        fold(summary, bytes, start_ns);
        unlock(summary);
    }
    // SAFETY: as above: our chunk, CHUNK_BYTES long; the first word first, through an atomic store.
    unsafe {
        AtomicU64::from_ptr(chunk).store(0, Ordering::Release);
        std::ptr::write_bytes(chunk.cast::<u8>(), 0, CHUNK_BYTES as usize);
    }
}

fn lock(summary: &RingSummary) {
    let mut spins = 0;
    while summary
        .lock
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        crate::spin::back_off(spins);
        spins += 1;
    }
}

fn unlock(summary: &RingSummary) {
    summary.lock.store(0, Ordering::Release);
}

/// Adds an evicted chunk's events and names to the summary (the lock held).
fn fold(summary: &RingSummary, bytes: &[u8], start_ns: u64) {
    let Some(walk) = ChunkReader::new(bytes) else {
        return;
    };
    relaxed_add(&summary.evicted_chunks, 1);
    let (mut events, mut newest) = (0, 0);
    for item in walk {
        match item {
            ChunkItem::Event { ts_ns, record } => {
                events += 1;
                newest = newest.max(ts_ns);
                fold_event(summary, ts_ns, &record, start_ns);
            }
            ChunkItem::Text {
                class: Some(class),
                number,
                text,
            } => keep_name(summary, class, number, text),
            ChunkItem::Text { .. } | ChunkItem::Thread { .. } => {}
        }
    }
    relaxed_add(&summary.evicted_events, events);
    relaxed_max(&summary.detail_from_ns, newest);
    copy_peaks(summary);
}

/// Adds to a summary word: a load and a store, no locked instruction (only the lock's holder
/// writes the summary; readers in other processes read it as it is).
fn relaxed_add(word: &AtomicU64, value: u64) {
    word.store(
        word.load(Ordering::Relaxed).wrapping_add(value),
        Ordering::Relaxed,
    );
}

/// Raises a summary word to `value` (as [`relaxed_add`]: the lock's holder alone writes).
fn relaxed_max(word: &AtomicU64, value: u64) {
    if value > word.load(Ordering::Relaxed) {
        word.store(value, Ordering::Relaxed);
    }
}

/// One evicted event: what it adds to its device's counts, modules and intervals.
fn fold_event(
    summary: &RingSummary,
    ts_ns: u64,
    r: &gpumemhook_segment::EventRecord,
    start_ns: u64,
) {
    let (Some(kind), Some(d)) = (
        EventKind::from_code(r.kind),
        summary.devices.get(usize::from(r.device)),
    ) else {
        return;
    };
    let Some(mem) = MemKind::from_code(r.mem) else {
        return;
    };
    let cell = module_cell(r.module);
    match (kind, mem) {
        (EventKind::Alloc, MemKind::Device) => {
            relaxed_add(&d.allocs, 1);
            relaxed_add(&d.total_allocated, r.bytes);
            relaxed_add(&d.module_bytes[cell], r.bytes);
            relaxed_add(&d.module_allocs[cell], 1);
        }
        (EventKind::Free, MemKind::Device) => {
            relaxed_add(&d.frees, 1);
            relaxed_add(&d.module_bytes[cell], r.bytes.wrapping_neg());
            relaxed_add(&d.module_allocs[cell], u64::MAX);
        }
        (EventKind::Denied, _) => relaxed_add(&d.denied, 1),
        (EventKind::Failed, _) => relaxed_add(&d.failed, 1),
        (EventKind::Alloc, MemKind::Managed) => relaxed_add(&d.managed, r.bytes),
        (EventKind::Free, MemKind::Managed) => relaxed_add(&d.managed, r.bytes.wrapping_neg()),
        (EventKind::Alloc, MemKind::HostPinned) => {
            relaxed_add(&summary.host_allocs, 1);
            relaxed_add(&summary.host_pinned, r.bytes);
        }
        (EventKind::Free, MemKind::HostPinned) => {
            relaxed_add(&summary.host_frees, 1);
            relaxed_add(&summary.host_pinned, r.bytes.wrapping_neg());
        }
        (EventKind::Ceiling, _) if ts_ns >= d.ceiling_ns.load(Ordering::Relaxed) => {
            d.ceiling.store(r.bytes, Ordering::Relaxed);
            d.ceiling_ns.store(ts_ns, Ordering::Relaxed);
        }
        _ => {}
    }
    let changes_used = matches!(
        (kind, mem),
        (EventKind::Alloc | EventKind::Free, MemKind::Device) | (EventKind::PeakReset, _)
    );
    if changes_used {
        fold_used(summary, d, ts_ns, r.used, start_ns);
    }
}

/// `used` after an evicted change: its interval's lowest and highest, and the newest.
fn fold_used(summary: &RingSummary, d: &RingDevice, ts_ns: u64, used: u64, start: u64) {
    if ts_ns >= d.last_used_ns.load(Ordering::Relaxed) {
        d.last_used.store(used, Ordering::Relaxed);
        d.last_used_ns.store(ts_ns, Ordering::Relaxed);
    }
    let mut width = summary.bucket_ns.load(Ordering::Relaxed);
    if width == 0 {
        width = FIRST_BUCKET_NS;
        summary.bucket_ns.store(width, Ordering::Relaxed);
    }
    while bucket_of(ts_ns, start, width) >= RING_BUCKETS as u64 {
        widen(summary);
        width *= 2;
        summary.bucket_ns.store(width, Ordering::Relaxed);
    }
    let bucket = bucket_of(ts_ns, start, width) as usize;
    let kept = used.saturating_add(1);
    let low = &d.low[bucket];
    let old = low.load(Ordering::Relaxed);
    if old == 0 || kept < old {
        low.store(kept, Ordering::Relaxed);
    }
    relaxed_max(&d.high[bucket], kept);
}

/// Doubles the intervals' width: each pair becomes one (every device), the later half empties.
fn widen(summary: &RingSummary) {
    for d in &summary.devices {
        for i in 0..RING_BUCKETS {
            let (low, high) = if i < RING_BUCKETS / 2 {
                let (a, b) = (2 * i, 2 * i + 1);
                let lows = [
                    d.low[a].load(Ordering::Relaxed),
                    d.low[b].load(Ordering::Relaxed),
                ];
                let low = lows.into_iter().filter(|&l| l != 0).min().unwrap_or(0);
                let high = d.high[a]
                    .load(Ordering::Relaxed)
                    .max(d.high[b].load(Ordering::Relaxed));
                (low, high)
            } else {
                (0, 0)
            };
            d.low[i].store(low, Ordering::Relaxed);
            d.high[i].store(high, Ordering::Relaxed);
        }
    }
}

/// The first record of a name chunk: a chunk's, of no thread and no clock (it holds no event).
const NAMES_CHUNK_HEAD: Record = Record::Chunk {
    tid: 0,
    clock_ns: 0,
};

/// Copies an evicted name into the name chunks (each starts with a chunk's first record, so a
/// reader reads them as chunks of names); a name that finds no room is counted dropped.
fn keep_name(
    summary: &RingSummary,
    class: gpumemhook_segment::TextClass,
    number: u32,
    text: &[u8],
) {
    let names = NAMES.load(Ordering::Acquire);
    let Some(ring) = layout() else { return };
    if names.is_null() {
        return;
    }
    let need = 1 + text_records(text.len());
    let mut at = summary.name_records.load(Ordering::Relaxed);
    // Records 0 of each chunk are its first record; a name does not cross chunks.
    if at.is_multiple_of(RECORDS_PER_CHUNK) {
        at += 1;
    }
    if at % RECORDS_PER_CHUNK + need > RECORDS_PER_CHUNK {
        at = (at / RECORDS_PER_CHUNK + 1) * RECORDS_PER_CHUNK + 1;
    }
    if at + need > ring.name_chunks * RECORDS_PER_CHUNK {
        relaxed_add(&summary.names_dropped, 1);
        return;
    }
    let words_per_record = (RECORD_BYTES / 8) as usize;
    // SAFETY: records `at .. at + need` and the chunk's first record lie inside the name chunks
    // mapped by `start_file` (checked above); only the lock holder writes them.
    unsafe {
        let chunk_head = names.add((at / RECORDS_PER_CHUNK * RECORDS_PER_CHUNK) as usize * 4);
        if AtomicU64::from_ptr(chunk_head).load(Ordering::Relaxed) == 0 {
            store(chunk_head, 0, NAMES_CHUNK_HEAD.encode());
        }
        let record = names.add(at as usize * words_per_record);
        std::ptr::copy_nonoverlapping(text.as_ptr(), record.add(4).cast::<u8>(), text.len());
        let name = Record::Text {
            class: Some(class),
            number,
            len: text.len() as u64,
        };
        store(record, 0, name.encode());
    }
    summary.name_records.store(at + need, Ordering::Relaxed);
}

/// Copies the segment's peaks (each device's since its last restart, with the restart's time;
/// each module's; managed and pinned) into the summary: the peaks of what was evicted, exactly.
fn copy_peaks(summary: &RingSummary) {
    let segment = SEGMENT.load(Ordering::Acquire);
    if segment.is_null() {
        return;
    }
    // SAFETY: the segment of this process image, published at start-up and never unmapped.
    let segment = unsafe { &*segment };
    for (device, d) in segment.devices.iter().enumerate().take(MAX_DEVICES) {
        let s = &summary.devices[device];
        // The restart's time read on both sides of the peak: a restart between them is read again.
        let (peak, reset_ns) = (0..4)
            .map(|_| {
                let before = d.peak_reset_ns.load(Ordering::Acquire);
                let peak = d.peak_bytes();
                (peak, before, d.peak_reset_ns.load(Ordering::Acquire))
            })
            .find(|&(_, before, after)| before == after)
            .map_or((0, 0), |(peak, at, _)| (peak, at));
        s.peak.store(peak, Ordering::Relaxed);
        s.peak_reset_ns.store(reset_ns, Ordering::Relaxed);
        s.managed_peak
            .store(d.managed_peak.load(Ordering::Relaxed), Ordering::Relaxed);
        for cell in 0..MODULE_CELLS.min(RING_MODULE_CELLS) {
            if let Some(m) = segment.modules.cell(device as u32, cell) {
                s.module_peak[cell].store(m.peak.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }
    summary.host_pinned_peak.store(
        segment.header.host_pinned_peak.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
}

/// In a forked child: the parent's ring is not the child's (its states emptied, the summary and
/// names its parent's mapping, forgotten).
pub fn forked() {
    SUMMARY.store(std::ptr::null_mut(), Ordering::Relaxed);
    NAMES.store(std::ptr::null_mut(), Ordering::Relaxed);
    let states = STATES.load(Ordering::Relaxed);
    let slots = SLOTS.load(Ordering::Relaxed);
    if !states.is_null() {
        // SAFETY: the child's private copy of the states' mapping: dropping its pages zeroes it.
        unsafe { libc::madvise(states.cast(), slots as usize * 8, libc::MADV_DONTNEED) };
    }
}

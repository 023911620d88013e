//! The bounded timeline (`GPUMEMHOOK_TRACE_MAX=SIZE`): a recording whose chunks are a ring, and the
//! summary that keeps, for the whole run, what the events the ring overwrote added up to. One
//! definition for the hook that writes it and the readers.
//!
//! A ring recording is a recording of version `RING_RECORDING_VERSION` whose header says how its
//! chunks are laid out (`RingLayout`, both in [`crate::recording`]): after the header come [`RingLayout::summary_chunks`]
//! chunks holding the [`RingSummary`], then [`RingLayout::name_chunks`] chunks of names, then the
//! ring's [`RingLayout::slots`]. The whole file stays within the size asked for.
//!
//! A thread that needs a chunk claims the next number, as without a ring; the number's slot is
//! `number % slots`. The chunk that was there is *evicted*: before the slot is written again, the
//! claiming thread folds its events into the summary (under the summary's lock, which only
//! evicting threads take, once per 2,047 records at most) and copies its names into the name
//! chunks, so that nothing the reader needs of it is lost. A slot whose chunk a thread still
//! writes is skipped (its number goes unused).
//!
//! What the summary keeps is what can be summed or maxed whatever the order the evicted chunks
//! come in: per device the counts of allocations, frees, refusals and failures, each module's net
//! bytes, the managed and pinned bytes; the lowest and highest `used` in each of
//! [`RING_BUCKETS`] intervals of time (for plots); the newest ceiling. The peaks are the
//! segment's own, read at each eviction: the counter's peak since its last restart (with that
//! restart's time), each module's, the managed and pinned peaks. A reader adds the ring's events
//! to these to get the whole run's figures; [`RingSummary::detail_from_ns`] is the time of the
//! newest event evicted: every event after it is in the file.

use std::sync::atomic::AtomicU64;

use crate::layout::{MAX_DEVICES, MODULE_CELLS};
use crate::recording::{RingLayout, CHUNK_BYTES, RECORDING_HEADER_BYTES};
/// The summary's first bytes (its chunk is then no chunk of records to a reader).
pub const SUMMARY_MAGIC: [u8; 8] = *b"GMHRSUMM";
/// Intervals of time the summary keeps `used`'s lowest and highest for, per device.
pub const RING_BUCKETS: usize = 256;
/// The first width of an interval, ns; doubled (pairs of intervals merged) whenever an evicted
/// event falls past the last.
pub const FIRST_BUCKET_NS: u64 = 1_000_000;
/// Module cells per device in the summary: the segment's, then one for events of no module.
pub const RING_MODULE_CELLS: usize = MODULE_CELLS + 1;
/// The smallest `GPUMEMHOOK_TRACE_MAX`: the header, the summary, the names and 24 slots (a
/// thread holds one while it writes: more threads than slots lose events).
pub const MIN_RING_BYTES: u64 = 2 << 20;

/// One device's part of the summary. Every counter is 0 in a new file; `low` and `high` hold
/// `used + 1` (0: no event in the interval).
#[repr(C)]
pub struct RingDevice {
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub denied: AtomicU64,
    pub failed: AtomicU64,
    pub total_allocated: AtomicU64,
    /// Net managed bytes of the evicted events (wrapping: may be "negative").
    pub managed: AtomicU64,
    /// The segment's managed peak at the last eviction.
    pub managed_peak: AtomicU64,
    /// The segment's peak at the last eviction.
    pub peak: AtomicU64,
    /// The time of the peak restart that `peak` counts from (the segment's stamp; 0: none).
    pub peak_reset_ns: AtomicU64,
    /// The newest ceiling step evicted: its value (a record's ceiling word) and time (0: none).
    pub ceiling: AtomicU64,
    pub ceiling_ns: AtomicU64,
    /// `used` after the newest evicted change of `used`, and its time (0: none).
    pub last_used: AtomicU64,
    pub last_used_ns: AtomicU64,
    /// Per module cell (the record's module; the last for none): net bytes and net allocations
    /// of the evicted events (wrapping), and the segment's module peak at the last eviction.
    pub module_bytes: [AtomicU64; RING_MODULE_CELLS],
    pub module_allocs: [AtomicU64; RING_MODULE_CELLS],
    pub module_peak: [AtomicU64; RING_MODULE_CELLS],
    /// Per interval: the lowest and highest `used` after an evicted change, plus one.
    pub low: [AtomicU64; RING_BUCKETS],
    pub high: [AtomicU64; RING_BUCKETS],
}

/// The summary of what the ring evicted, at the start of the file's chunks.
#[repr(C)]
pub struct RingSummary {
    pub magic: [u8; 8],
    /// Held by the one thread folding an eviction (its thread id; 0: free).
    pub lock: AtomicU64,
    pub evicted_chunks: AtomicU64,
    pub evicted_events: AtomicU64,
    /// The time of the newest evicted event (ns of `CLOCK_MONOTONIC`; 0: nothing evicted yet).
    pub detail_from_ns: AtomicU64,
    /// The width of an interval now (0: not yet set; then [`FIRST_BUCKET_NS`], doubling), the
    /// intervals counted from the header's `start_ns`.
    pub bucket_ns: AtomicU64,
    /// The next free record in the name chunks (counted across them), and names that found no
    /// room there (their events read as unnamed).
    pub name_records: AtomicU64,
    pub names_dropped: AtomicU64,
    /// Pinned host memory: the evicted events' allocations, frees and net bytes, and the
    /// segment's peak at the last eviction.
    pub host_allocs: AtomicU64,
    pub host_frees: AtomicU64,
    pub host_pinned: AtomicU64,
    pub host_pinned_peak: AtomicU64,
    pub devices: [RingDevice; MAX_DEVICES],
}

/// Chunks the summary takes.
pub const SUMMARY_CHUNKS: u64 = (std::mem::size_of::<RingSummary>() as u64).div_ceil(CHUNK_BYTES);

/// The layout of a ring file of at most `max_bytes`; `None` below [`MIN_RING_BYTES`]. Names get
/// a sixteenth of the chunks (2 to 64).
pub fn ring_layout_for(max_bytes: u64) -> Option<RingLayout> {
    if max_bytes < MIN_RING_BYTES {
        return None;
    }
    let chunks = (max_bytes - RECORDING_HEADER_BYTES) / CHUNK_BYTES;
    let name_chunks = (chunks / 16).clamp(2, 64);
    let slots = chunks.checked_sub(SUMMARY_CHUNKS + name_chunks)?;
    (slots >= 4).then_some(RingLayout {
        summary_chunks: SUMMARY_CHUNKS,
        name_chunks,
        slots,
    })
}

/// The interval `ts_ns` falls in, of width `width` counted from `start_ns`.
pub fn bucket_of(ts_ns: u64, start_ns: u64, width: u64) -> u64 {
    ts_ns.saturating_sub(start_ns) / width.max(1)
}

/// A module cell of the summary for a record's module (the last cell for none or one past the
/// segment's).
pub fn module_cell(module: u8) -> usize {
    usize::from(module).min(RING_MODULE_CELLS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_fits_the_size_asked_and_smaller_sizes_are_refused() {
        assert!(ring_layout_for(MIN_RING_BYTES - 1).is_none());
        for size in [MIN_RING_BYTES, 16 << 20, (16 << 20) + 12345, 1 << 34] {
            let ring = ring_layout_for(size).unwrap();
            assert!(ring.file_bytes() <= size, "{size}: {ring:?}");
            assert!(size - ring.file_bytes() < CHUNK_BYTES, "{size}: {ring:?}");
            assert_eq!(ring.chunk_of(ring.slots), ring.first_slot());
        }
        // The summary is read as no chunk of records: its magic is no chunk's first record.
        assert!(!matches!(
            crate::recording::Record::decode([u64::from_le_bytes(SUMMARY_MAGIC), 0, 0, 0]),
            Ok(crate::recording::Record::Chunk { .. })
        ));
    }

    #[test]
    fn intervals_count_from_the_start() {
        assert_eq!(bucket_of(5, 10, 3), 0);
        assert_eq!(bucket_of(10 + 7, 10, 3), 2);
        assert_eq!(module_cell(3), 3);
        assert_eq!(
            module_cell(crate::recording::NO_MODULE),
            RING_MODULE_CELLS - 1
        );
    }
}

/// What a summary says, read from bytes that may be anyone's (every value is taken as it is:
/// a forged summary gives wrong figures, never a crash or unbounded memory).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SummaryFigures {
    /// When recording started (the header's `start_ns`): the intervals count from it.
    pub start_ns: u64,
    pub evicted_chunks: u64,
    pub evicted_events: u64,
    /// See [`RingSummary::detail_from_ns`]; 0 when nothing was evicted.
    pub detail_from_ns: u64,
    /// Width of [`DeviceFigures::intervals`], ns.
    pub bucket_ns: u64,
    pub names_dropped: u64,
    pub host_allocs: u64,
    pub host_frees: u64,
    /// Net pinned bytes of the evicted events (may be negative: frees of what the ring keeps).
    pub host_pinned: i64,
    pub host_pinned_peak: u64,
    /// The devices the summary has anything of, by ordinal.
    pub devices: Vec<DeviceFigures>,
}

/// One device's part of [`SummaryFigures`] (see [`RingDevice`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceFigures {
    pub device: u32,
    pub allocs: u64,
    pub frees: u64,
    pub denied: u64,
    pub failed: u64,
    pub total_allocated: u64,
    pub managed: i64,
    pub managed_peak: u64,
    pub peak: u64,
    /// The time of the restart `peak` counts from, ns; 0 for none.
    pub peak_reset_ns: u64,
    /// The newest evicted ceiling step: (ns, the record's ceiling word).
    pub ceiling: Option<(u64, u64)>,
    /// `used` after the newest evicted change: (ns, used).
    pub last_used: Option<(u64, u64)>,
    /// Modules with anything evicted or a peak: (the record's module number, [`crate::recording::NO_MODULE`]
    /// for none; net bytes; net allocations; the segment's peak).
    pub modules: Vec<(u8, i64, i64, u64)>,
    /// Intervals with an evicted change of `used`: (start ns, lowest, highest).
    pub intervals: Vec<(u64, u64, u64)>,
}

impl DeviceFigures {
    /// Whether the device saw any memory activity in what was overwritten (a peak restart or a
    /// ceiling alone is none).
    pub fn is_active(&self) -> bool {
        self.allocs + self.frees + self.denied + self.failed > 0
            || self.peak > 0
            || self.managed_peak > 0
            || !self.modules.is_empty()
            || self.last_used.is_some()
    }
}

/// Reads the summary from the bytes of its chunks; `None` without the summary's magic. `start_ns`
/// is the header's: the intervals count from it.
pub fn read_summary(bytes: &[u8], start_ns: u64) -> Option<SummaryFigures> {
    use std::sync::atomic::Ordering::Relaxed;
    if bytes.len() < std::mem::size_of::<RingSummary>() || bytes[..8] != SUMMARY_MAGIC {
        return None;
    }
    // Copied into 8-aligned words: the summary is plain atomics and bytes, every bit pattern valid.
    let mut words = vec![0u64; std::mem::size_of::<RingSummary>().div_ceil(8)];
    for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *word = u64::from_ne_bytes(chunk.try_into().unwrap_or([0; 8]));
    }
    // SAFETY: `words` is 8-aligned and at least `size_of::<RingSummary>()` bytes long; every field
    // of `RingSummary` is an `AtomicU64` or a byte array, valid for any bits.
    let s = unsafe { &*words.as_ptr().cast::<RingSummary>() };
    let load = |w: &AtomicU64| u64::from_le(w.load(Relaxed));
    let bucket_ns = load(&s.bucket_ns).max(1);
    let devices = s
        .devices
        .iter()
        .enumerate()
        .map(|(device, d)| read_device(device as u32, d, start_ns, bucket_ns))
        .filter(|d| d.is_active() || d.ceiling.is_some())
        .collect();
    Some(SummaryFigures {
        start_ns,
        evicted_chunks: load(&s.evicted_chunks),
        evicted_events: load(&s.evicted_events),
        detail_from_ns: load(&s.detail_from_ns),
        bucket_ns,
        names_dropped: load(&s.names_dropped),
        host_allocs: load(&s.host_allocs),
        host_frees: load(&s.host_frees),
        host_pinned: load(&s.host_pinned) as i64,
        host_pinned_peak: load(&s.host_pinned_peak),
        devices,
    })
}

fn read_device(device: u32, d: &RingDevice, start_ns: u64, bucket_ns: u64) -> DeviceFigures {
    use std::sync::atomic::Ordering::Relaxed;
    let load = |w: &AtomicU64| u64::from_le(w.load(Relaxed));
    let stamped = |value: u64, at: u64| (at != 0).then_some((at, value));
    let modules = (0..RING_MODULE_CELLS)
        .map(|cell| {
            let number = if cell == RING_MODULE_CELLS - 1 {
                crate::recording::NO_MODULE
            } else {
                cell as u8
            };
            let bytes = load(&d.module_bytes[cell]) as i64;
            let allocs = load(&d.module_allocs[cell]) as i64;
            (number, bytes, allocs, load(&d.module_peak[cell]))
        })
        .filter(|&(_, bytes, allocs, peak)| bytes != 0 || allocs != 0 || peak != 0)
        .collect();
    let intervals = (0..RING_BUCKETS)
        .filter_map(|i| {
            let (low, high) = (load(&d.low[i]), load(&d.high[i]));
            let start = start_ns.saturating_add((i as u64).saturating_mul(bucket_ns));
            (low != 0 && high != 0).then(|| (start, low - 1, (high - 1).max(low - 1)))
        })
        .collect();
    DeviceFigures {
        device,
        allocs: load(&d.allocs),
        frees: load(&d.frees),
        denied: load(&d.denied),
        failed: load(&d.failed),
        total_allocated: load(&d.total_allocated),
        managed: load(&d.managed) as i64,
        managed_peak: load(&d.managed_peak),
        peak: load(&d.peak),
        peak_reset_ns: load(&d.peak_reset_ns),
        ceiling: stamped(load(&d.ceiling), load(&d.ceiling_ns)),
        last_used: stamped(load(&d.last_used), load(&d.last_used_ns)),
        modules,
        intervals,
    }
}

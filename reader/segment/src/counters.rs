//! The counting on the segment that is neither the ceiling's nor the scopes': an allocation's and
//! a free's counts (striped per ledger shard), managed and pinned host memory, the devices touched,
//! the modules' and the Python call sites' cells, the header's initialisation, and
//! the one clock the segment's time stamps read. The types are [`crate::layout`]'s.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::layout::{
    CountStripe, DeviceCounters, Header, ModuleCell, Modules, Segment, SiteSlot, Sites,
    LAYOUT_MAJOR, LAYOUT_MINOR, MAGIC, MAX_DEVICES, MODULE_BYTES_BITS, MODULE_MAX_ALLOCATION,
    NO_LIMIT, SEGMENT_SIZE, SITE_SLOTS, VERSION,
};
use crate::text::{read_text, write_bytes, write_text};

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
    /// The cell of `device` and module `slot` ([`OTHER_MODULE`](crate::layout::OTHER_MODULE) included).
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

pub(crate) use crate::window::fold_max;

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
    use crate::layout::{Change, COMMAND_LEN, MODULE_CELLS, MODULE_PATH_LEN, MODULE_SLOTS};

    #[test]
    fn every_change_of_used_is_numbered_in_the_counters_order_and_a_refusal_is_none() {
        let seg = zeroed();
        let c = &seg.devices[0];
        c.reserve(100).unwrap();
        assert_eq!(
            c.commit(100),
            Change {
                used: 100,
                number: 1
            }
        );
        // A request in the driver's hands is claimed, not used; its failure changes nothing.
        c.reserve(1 << 40).unwrap();
        assert_eq!(c.used.load(Ordering::SeqCst), 100);
        c.cancel(1 << 40);
        assert_eq!(c.claimed.load(Ordering::SeqCst), 100);
        c.reset_peak();
        assert_eq!(
            Change::of_word(c.peak_reset_mark.load(Ordering::SeqCst)),
            Change {
                used: 100,
                number: 2
            }
        );
        assert_eq!(
            c.release(40),
            Change {
                used: 60,
                number: 3
            }
        );
        assert_eq!(c.used.load(Ordering::SeqCst), 60);
        assert_eq!(c.peak_bytes(), 100);
    }

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
    fn text_is_truncated_at_a_character_boundary() {
        let seg = zeroed();
        let long = "é".repeat(200);
        write_text(&seg.header.command, &long);
        assert_eq!(seg.command().chars().count(), (COMMAND_LEN - 1) / 2);
    }
}

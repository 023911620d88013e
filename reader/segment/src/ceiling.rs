//! The ceiling: reserving an allocation's bytes under it (and giving them back), setting it, and
//! the views of free and total memory, and of this process's use, that the hook reports under it
//! or under an emulated card. The types are [`crate::layout`]'s; the one owner of `denied`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::counters::clock_ns;
use crate::layout::{Change, DeviceCounters, Segment, CHANGE_ONE, CHANGE_USED_MASK, NO_LIMIT};
use crate::tally::admit;

/// A ceiling as read at one moment: the limit ([`NO_LIMIT`] for none), the emulated card's total
/// (0 for none) and the overhead charged to the card. The one rule of how much may be held and of
/// what a memory query shows under it, for a process's counters and a group's devices alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceiling {
    pub limit: u64,
    pub emulated_total: u64,
    pub overhead: u64,
}

impl Ceiling {
    /// The most `used` may reach: the limit, and under an emulated card also the card's total less
    /// the charged overhead. [`NO_LIMIT`] when neither applies.
    #[inline]
    pub fn cap(&self) -> u64 {
        match self.emulated_total {
            0 => self.limit,
            total => self.limit.min(total.saturating_sub(self.overhead)),
        }
    }

    /// What `cuMemGetInfo`/`cudaMemGetInfo` should report to a holder of `used` under it:
    /// `total` the card's under emulation, else `min(real, cap)`; `free = min(real free, cap -
    /// used, total)`; never negative, never above total. Unchanged without a cap.
    #[inline]
    pub fn view(&self, used: u64, real_free: u64, real_total: u64) -> (u64, u64) {
        let cap = self.cap();
        if cap == NO_LIMIT {
            return (real_free, real_total);
        }
        let total = match self.emulated_total {
            0 => real_total.min(cap),
            card => card,
        };
        (real_free.min(cap.saturating_sub(used)).min(total), total)
    }
}

/// Adds `bytes` to `used` only while [`admit`] allows it, in one compare-and-swap loop, so `used`
/// never passes `cap` even for an instant and concurrent requests are refused exactly; the new sum,
/// or `None` when `cap` refuses.
#[inline]
pub(crate) fn add_within(used: &AtomicU64, bytes: u64, cap: u64) -> Option<u64> {
    let mut current = used.load(Ordering::SeqCst);
    loop {
        let wanted = admit(current, bytes, cap)?;
        match used.compare_exchange_weak(current, wanted, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return Some(wanted),
            Err(seen) => current = seen,
        }
    }
}

impl DeviceCounters {
    /// Reserves `bytes` before the real allocation is attempted. Returns the new `claimed`, or `None`
    /// when the ceiling refuses (then `denied` is counted and nothing else changes).
    ///
    /// Without a ceiling this is one `fetch_add`; with one, a compare-and-swap loop, so `claimed`
    /// never passes the ceiling even for an instant and concurrent requests are refused exactly.
    /// The reader's own tests only: the hook reserves through [`DeviceCounters::reserve_or`] alone.
    #[cfg(test)]
    pub(crate) fn reserve(&self, bytes: u64) -> Option<u64> {
        self.reserve_or(bytes, || false)
    }

    /// [`DeviceCounters::reserve`], with a second chance: when the reservation would be refused,
    /// `retry` is asked (the hook measures an emulated card's overhead again, which may have
    /// shrunk) and, if it says so, the reservation is tried once more. A refusal is counted here
    /// only, once, when it is final (this module is the one writer of `denied`).
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

    /// The reservation itself, without counting a refusal: on `claimed`, the word the ceiling
    /// admits against; `used` moves only when the allocation is committed ([`DeviceCounters::commit`]).
    #[inline]
    fn try_reserve(&self, bytes: u64) -> Option<u64> {
        let limit = self.allocation_cap();
        if limit == NO_LIMIT {
            return Some(
                self.claimed
                    .fetch_add(bytes, Ordering::SeqCst)
                    .wrapping_add(bytes),
            );
        }
        add_within(&self.claimed, bytes, limit)
    }

    /// Counts a reserved allocation the driver made as held: `used` rises by `bytes`; returns the
    /// change (the new `used` and its number), what every figure folds (the peak, open scopes,
    /// the timeline's record).
    #[inline]
    pub fn commit(&self, bytes: u64) -> Change {
        let word = self.changes.fetch_add(
            CHANGE_ONE.wrapping_add(bytes & CHANGE_USED_MASK),
            Ordering::SeqCst,
        );
        self.used.fetch_add(bytes, Ordering::SeqCst);
        Change::of_word(
            word.wrapping_add(CHANGE_ONE)
                .wrapping_add(bytes & CHANGE_USED_MASK),
        )
    }

    /// Gives back a reservation whose allocation the driver failed.
    #[inline]
    pub fn cancel(&self, bytes: u64) {
        self.claimed.fetch_sub(bytes, Ordering::SeqCst);
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives back a reservation that another ceiling refused after this one admitted it (the
    /// group's, which is asked second), and counts the refusal: this process's refusal too.
    #[inline]
    pub fn refuse_reserved(&self, bytes: u64) {
        self.claimed.fetch_sub(bytes, Ordering::SeqCst);
        self.denied.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives back reserved bytes without counting a failure (a reservation that was too large).
    #[inline]
    pub fn unreserve(&self, bytes: u64) {
        self.claimed.fetch_sub(bytes, Ordering::SeqCst);
    }

    /// Takes a free of `bytes` that this hook saw allocated (and committed) out of `used` and of
    /// `claimed`; returns the change (the new `used` and its number). (The free itself is counted
    /// in the device's [`CountStripe`](crate::layout::CountStripe).)
    #[inline]
    pub fn release(&self, bytes: u64) -> Change {
        let step = CHANGE_ONE.wrapping_sub(bytes & CHANGE_USED_MASK);
        let word = self.changes.fetch_add(step, Ordering::SeqCst);
        self.used.fetch_sub(bytes, Ordering::SeqCst);
        self.claimed.fetch_sub(bytes, Ordering::SeqCst);
        Change::of_word(word.wrapping_add(step))
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

    /// The ceiling of this device now ([`Ceiling`]).
    #[inline]
    pub fn ceiling(&self) -> Ceiling {
        Ceiling {
            limit: self.limit.load(Ordering::Relaxed),
            emulated_total: self.emulated_total.load(Ordering::Relaxed),
            overhead: self.overhead.load(Ordering::Relaxed),
        }
    }

    /// What `cuMemGetInfo`/`cudaMemGetInfo` should report under the ceiling ([`Ceiling::view`]).
    #[inline]
    pub fn ceiling_view(&self, real_free: u64, real_total: u64) -> (u64, u64) {
        // What the next reservation is judged against: requests in flight included.
        let used = self.claimed.load(Ordering::Relaxed);
        self.ceiling().view(used, real_free, real_total)
    }

    /// The most `used` may reach ([`Ceiling::cap`]).
    #[inline]
    pub fn allocation_cap(&self) -> u64 {
        self.ceiling().cap()
    }

    /// This process's own use of the device as the views report it (NVML's per-process figure):
    /// `claimed` (what the driver holds or is being asked for) plus, under emulation, the charged
    /// overhead; never above the view's `total`.
    #[inline]
    pub fn process_view(&self, total: u64) -> u64 {
        let used = self.claimed.load(Ordering::Relaxed);
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

impl Segment {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::tests::zeroed;

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
}

//! A device's peak word ([`DeviceCounters::peak`]) and the two things done to it: an allocation's
//! fold of its new `used`, and a restart (`reset-peak`), which any process mapping the segment may
//! make while the hook's threads allocate.
//!
//! An allocation counts (one atomic add of the change word gives its number and `used` after it)
//! and then folds; a restart that lands between the two must not let that change's fold into the
//! new window, or the peak since the restart would hold a value from before it, which no replay of
//! the changes after the restart can give. So the word carries, above the peak's 48 bits, the
//! restart's number among the changes (15 bits) and a bit set while a restart is under way:
//!
//! - an allocation reads the word before its count (its ticket); when it folds, a word of the
//!   same restart means no restart came since the ticket, and it folds as a plain maximum; a word
//!   of another restart came since, close in the order, so comparing its own number with the
//!   restart's tells which side of it the change is on, and only a change after it folds;
//! - a restart sets the bit (keeping the peak readable), takes its number in the change word
//!   (`used` then is the new window's start), and writes peak and number in one store, by a CAS
//!   that only the first finisher wins; an allocation that finds the bit set waits for it to clear,
//!   and after [`PATIENCE_NS`] finishes the restart itself (its maker was killed or stalled), so no
//!   thread ever waits on a dead process.
//!
//! A change and the restart it is compared with are at most a few changes apart (those made while
//! one allocation counted and folded); the numbers compare within 16,384 changes either side.

use std::sync::atomic::Ordering::SeqCst;

use crate::counters::clock_ns;
use crate::layout::{Change, DeviceCounters, CHANGE_ONE};

/// The peak's bits of the word.
pub const PEAK_BYTES_MASK: u64 = (1 << 48) - 1;
const EPOCH_SHIFT: u32 = 48;
/// The restart's number (modulo 2^15) in bits 48..63.
const EPOCH_MASK: u64 = 0x7fff << EPOCH_SHIFT;
/// Set while a restart is under way.
const RESTARTING: u64 = 1 << 63;
/// How long an allocation waits for a restart under way before finishing it itself.
pub const PATIENCE_NS: u64 = 20_000_000;

/// The restart a word belongs to (its number modulo 2^15).
#[inline]
fn epoch(word: u64) -> u64 {
    word & EPOCH_MASK
}

/// Whether change `number` comes after the restart of `epoch` (the change numbers close, modulo
/// 2^15).
#[inline]
fn after(number: u16, epoch: u64) -> bool {
    let distance = u64::from(number).wrapping_sub(epoch >> EPOCH_SHIFT) & 0x7fff;
    distance != 0 && distance < 0x4000
}

impl DeviceCounters {
    /// The peak in bytes since start or the last restart.
    #[inline]
    pub fn peak_bytes(&self) -> u64 {
        self.peak.load(SeqCst) & PEAK_BYTES_MASK
    }

    /// The allocation's ticket: the peak word, read before its count ([`DeviceCounters::commit`]).
    #[inline(always)]
    pub fn peak_ticket(&self) -> u64 {
        self.peak.load(SeqCst)
    }

    /// Folds a committed allocation's `change` into the peak, unless a restart that came after
    /// the change (since `ticket`) opened the window the peak now holds.
    #[inline(always)]
    pub fn fold_peak(&self, ticket: u64, change: Change) {
        let mut word = self.peak.load(SeqCst);
        loop {
            if word & RESTARTING != 0 {
                word = self.sit_out_restart(word);
                continue;
            }
            let new_window = epoch(word) != epoch(ticket);
            if new_window && !after(change.number, epoch(word)) {
                return;
            }
            if word & PEAK_BYTES_MASK >= change.used {
                return;
            }
            let raised = (word & !PEAK_BYTES_MASK) | (change.used & PEAK_BYTES_MASK);
            match self
                .peak
                .compare_exchange_weak(word, raised, SeqCst, SeqCst)
            {
                Ok(_) => return,
                Err(seen) => word = seen,
            }
        }
    }

    /// Restarts the peak at the current `used` (the start of a new measuring window), and stamps
    /// when. The restart takes its place among the changes of `used` (a change of nothing in the
    /// change word), kept in `peak_reset_mark` for the hook's timeline, so a reader knows which
    /// changes came before it. A restart already under way is this one too.
    pub fn reset_peak(&self) {
        let mut word = self.peak.load(SeqCst);
        loop {
            if word & RESTARTING != 0 {
                self.sit_out_restart(word);
                return;
            }
            let restarting = word | RESTARTING;
            match self
                .peak
                .compare_exchange_weak(word, restarting, SeqCst, SeqCst)
            {
                Ok(_) => return self.finish_restart(restarting),
                Err(seen) => word = seen,
            }
        }
    }

    /// Takes the restart's place among the changes and opens its window, if the word is still
    /// `restarting` (the first finisher wins; a later one's number is a change of nothing that no
    /// record names, which a reader passes over).
    #[cold]
    fn finish_restart(&self, restarting: u64) {
        let mark = Change::of_word(
            self.changes
                .fetch_add(CHANGE_ONE, SeqCst)
                .wrapping_add(CHANGE_ONE),
        );
        let opened =
            ((u64::from(mark.number) << EPOCH_SHIFT) & EPOCH_MASK) | (mark.used & PEAK_BYTES_MASK);
        if self
            .peak
            .compare_exchange(restarting, opened, SeqCst, SeqCst)
            .is_ok()
        {
            self.peak_reset_mark.store(mark.word(), SeqCst);
            self.peak_reset_ns
                .store(clock_ns(libc::CLOCK_MONOTONIC), SeqCst);
        }
    }

    /// Waits while the restart of `restarting` is under way; past [`PATIENCE_NS`] finishes it.
    /// The word after.
    #[cold]
    #[inline(never)]
    fn sit_out_restart(&self, restarting: u64) -> u64 {
        let mut deadline = 0;
        for spins in 0u32.. {
            let word = self.peak.load(SeqCst);
            if word != restarting {
                return word;
            }
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            let now = clock_ns(libc::CLOCK_MONOTONIC);
            if deadline == 0 {
                deadline = now.saturating_add(PATIENCE_NS);
            } else if now >= deadline {
                self.finish_restart(restarting);
                return self.peak.load(SeqCst);
            }
            std::thread::yield_now();
        }
        self.peak.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::tests::zeroed;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Barrier, Mutex};

    #[test]
    fn changes_compare_with_a_restart_close_to_them_across_the_wrap() {
        let epoch_of = |n: u16| (u64::from(n) << EPOCH_SHIFT) & EPOCH_MASK;
        assert!(after(11, epoch_of(10)));
        assert!(!after(10, epoch_of(10)));
        assert!(!after(9, epoch_of(10)));
        // Numbers wrap at 2^16, epochs at 2^15.
        assert!(after(2, epoch_of(u16::MAX)));
        assert!(after(0x8001, epoch_of(0x7fff)));
        assert!(!after(0x7ffe, epoch_of(0xffff)));
    }

    #[test]
    fn a_restart_left_under_way_by_a_dead_maker_is_finished_by_the_next_allocation() {
        let seg = zeroed();
        let c = &seg.devices[0];
        let ticket = c.peak_ticket();
        c.fold_peak(ticket, c.commit(100));
        // A maker killed between its two steps: the bit set, no number taken.
        c.peak.fetch_or(RESTARTING, Ordering::SeqCst);
        assert_eq!(c.peak_bytes(), 100, "the peak stays readable meanwhile");
        c.release(60);
        let ticket = c.peak_ticket();
        let change = c.commit(10);
        c.fold_peak(ticket, change);
        // The allocation waited, then restarted the window itself, after its own change: from
        // `used` 50 at the restart's mark, which its change precedes.
        let mark = Change::of_word(c.peak_reset_mark.load(Ordering::SeqCst));
        assert_eq!(change.number, 3);
        assert_eq!(
            mark,
            Change {
                used: 50,
                number: 4
            }
        );
        assert_eq!(c.peak.load(Ordering::SeqCst) & RESTARTING, 0);
        assert_eq!(c.peak_bytes(), 50);
        assert_ne!(c.peak_reset_ns.load(Ordering::SeqCst), 0);
    }

    /// Threads allocate and free while another restarts the peak again and again: the peak always
    /// equals the replay of the changes (`used` at the last restart, then the maximum of the
    /// changes numbered after it), whichever instruction the restart lands between.
    #[test]
    fn a_restart_racing_allocations_leaves_exactly_the_changes_after_it_in_the_peak() {
        const THREADS: usize = 4;
        const ROUNDS: usize = 1500;
        for round in 0..40u64 {
            let seg: Arc<Box<crate::layout::Segment>> = Arc::new(zeroed());
            let changes = Arc::new(Mutex::new(Vec::new()));
            let start = Arc::new(Barrier::new(THREADS + 1));
            let workers: Vec<_> = (0..THREADS as u64)
                .map(|t| {
                    let (seg, changes, start) = (seg.clone(), changes.clone(), start.clone());
                    std::thread::spawn(move || {
                        let c = &seg.devices[0];
                        let mut mine = Vec::new();
                        start.wait();
                        for i in 0..ROUNDS as u64 {
                            let bytes = 1 + (t * 7919 + i * 104_729 + round) % 4096;
                            let ticket = c.peak_ticket();
                            let change = c.commit(bytes);
                            if i % 4 == 0 {
                                // Descheduled between the count and the fold, as a thread can be.
                                std::thread::yield_now();
                            }
                            c.fold_peak(ticket, change);
                            mine.push(change);
                            mine.push(c.release(bytes));
                        }
                        changes.lock().unwrap().extend(mine);
                    })
                })
                .collect();
            start.wait();
            let c = &seg.devices[0];
            // At most 2,000 restarts: with the 12,000 changes, under 2^16 numbers in all.
            for _ in 0..2000 {
                if workers.iter().all(|w| w.is_finished()) {
                    break;
                }
                c.reset_peak();
                std::thread::yield_now();
            }
            workers.into_iter().for_each(|w| w.join().unwrap());
            // Under 2^16 changes in all: numbers order them without wrapping.
            let mut all = changes.lock().unwrap().clone();
            let mark = Change::of_word(c.peak_reset_mark.load(Ordering::SeqCst));
            all.sort_by_key(|ch| ch.number);
            let replayed = all
                .iter()
                .filter(|ch| ch.number > mark.number)
                .map(|ch| ch.used)
                .fold(mark.used, u64::max);
            assert_eq!(c.peak_bytes(), replayed, "round {round}");
        }
    }
}

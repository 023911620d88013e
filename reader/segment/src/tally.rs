//! The crash-consistent core of a group's accounting (`docs/groups.md`, "Under kills"): how a
//! member adds and subtracts bytes, and how a sweeper gives a dead member's bytes back, such that a
//! process killed at any instruction of either leaves a state the next sweep repairs exactly.
//!
//! Each device of a group has a [`Tally`]: one 128-bit word holding the group's `used` and, while a
//! sweep holds it still, that sweep's ticket. Each member has a [`Share`] (how many of its changes
//! are under way, which devices it touched) and one cell per device with the bytes it holds.
//!
//! A member's change ([`change`]): mark the device, count itself under way, compare-and-swap the
//! tally (only an open one, and for an add only within the cap), change its cell, count itself
//! done. A member killed anywhere in there leaves its cell and the tally disagreeing by at most
//! what it was changing, and nobody can tell from the two words which way: so a sweep never
//! subtracts a dead member's cell. It recomputes the tally instead.
//!
//! A sweep ([`settle`]): freeze the tally with a fresh ticket (a compare-and-swap: a member's change
//! that landed before it is seen through that word, one after it fails and waits), wait for every
//! live member's changes under way to finish (bounded), and set the tally to the sum of the live
//! members' cells: that is exactly what they hold, whatever the dead left half-done. The set is a
//! compare-and-swap that names the ticket, so a sweep that was overtaken (its freeze lifted by a
//! member that waited too long, or completed by another) changes nothing. Running it again gives the
//! same sum: a sweeper killed at any step leaves either the old tally, a frozen one (which the next
//! member or sweep lifts after a bounded wait), or the right one.
//!
//! What it costs a member: one more atomic add and subtract (the count under way) and a
//! compare-and-swap of 16 bytes instead of an add of 8: about 155 instructions more per
//! allocation and free in a group, nothing without one (BENCHMARKS.md, item 16).
//!
//! Every step of both sides reports to a [`Steps`] observer: a no-op in the product, compiled away;
//! the crash-point tests stop the actor after each step in turn.

use std::ops::ControlFlow;

use crate::sync::{AtomicU64, Ordering::SeqCst, Patience, Word128};

/// The group's `used` (low 64 bits) and the ticket of the sweep holding it still (high 64 bits,
/// 0 while open).
#[repr(C, align(16))]
pub struct Tally(Word128);

/// A member's bookkeeping shared by all its devices.
#[repr(C)]
pub struct Share {
    /// Changes of this member under way (between their count and their cell).
    pub under_way: AtomicU64,
    /// A bit per device this member ever changed, set before its first change there.
    pub devices: AtomicU64,
}

/// What a member does to a tally and its own cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Add bytes, refused past the cap.
    Add(u64),
    /// Subtract bytes.
    Sub(u64),
}

/// The points of the protocols, in order, for [`Steps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A member: the device is marked.
    Marked,
    /// A member: counted under way.
    UnderWay,
    /// A member: the tally changed.
    Tallied,
    /// A member: its cell changed.
    Recorded,
    /// A member: counted done.
    Done,
    /// A sweep: the tally is frozen under its ticket.
    Frozen,
    /// A sweep: the overhead tally is frozen too.
    OverheadFrozen,
    /// A sweep: the live members are summed.
    Summed,
    /// A sweep: the overhead tally is set.
    OverheadSet,
    /// A sweep: the tally is set.
    Set,
}

/// The steps of a member's change, in order (for the crash-point tests).
pub const MEMBER_STEPS: [Step; 5] = [
    Step::Marked,
    Step::UnderWay,
    Step::Tallied,
    Step::Recorded,
    Step::Done,
];

/// The steps of a sweep of one device, in order.
pub const SWEEP_STEPS: [Step; 5] = [
    Step::Frozen,
    Step::OverheadFrozen,
    Step::Summed,
    Step::OverheadSet,
    Step::Set,
];

/// Observes each step; `Break` stops the actor there, as if it died (tests only).
pub trait Steps {
    fn after(&mut self, step: Step) -> ControlFlow<()>;
}

/// The product's observer: nothing, compiled away.
pub struct NoSteps;

impl Steps for NoSteps {
    #[inline(always)]
    fn after(&mut self, _: Step) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

/// The one rule of a cap, for a process's ceiling (`crate::ceiling`) and a group's alike: `used`
/// after adding `bytes`, or `None` when that passes `cap`. Zero bytes take nothing, so nothing
/// refuses them, not even a cap lowered below what is held (`cudaMalloc(&p, 0)` answers NULL and
/// success).
#[inline(always)]
pub fn admit(used: u64, bytes: u64, cap: u64) -> Option<u64> {
    used.checked_add(bytes).filter(|&n| n <= cap || bytes == 0)
}

const fn split(word: u128) -> (u64, u64) {
    (word as u64, (word >> 64) as u64)
}

const fn join(used: u64, ticket: u64) -> u128 {
    (ticket as u128) << 64 | used as u128
}

impl Tally {
    pub fn new(used: u64) -> Tally {
        Tally(Word128::new(join(used, 0)))
    }

    /// The count now (frozen or not: a freeze never changes it).
    #[inline(always)]
    pub fn get(&self) -> u64 {
        split(self.0.load()).0
    }

    /// The ticket of the sweep holding it still, 0 when open.
    pub fn ticket(&self) -> u64 {
        split(self.0.load()).1
    }

    /// Sets the count outright, open (a group made afresh, and tests).
    pub fn reset(&self, used: u64) {
        loop {
            let word = self.0.load();
            if self.0.compare_exchange(word, join(used, 0)).is_ok() {
                return;
            }
        }
    }

    /// Holds the tally still under `ticket`; false when another sweep's freeze outlasted
    /// `patience` even after being lifted, or time ran out.
    fn freeze(&self, ticket: u64, patience: &Patience) -> bool {
        loop {
            let word = self.0.load();
            let (used, held) = split(word);
            if held == ticket {
                return true;
            }
            if held == 0 && self.0.compare_exchange(word, join(used, ticket)).is_ok() {
                return true;
            }
            if patience.over() {
                return false;
            }
            if held != 0 {
                self.wait_for_thaw(held, patience);
            }
        }
    }

    /// Waits for the sweep of `ticket` to finish; past `patience`, lifts its freeze (never
    /// wrong: a frozen count is unchanged, and that sweep's set then fails).
    fn wait_for_thaw(&self, ticket: u64, patience: &Patience) {
        while !patience.over() {
            if split(self.0.load()).1 != ticket {
                return;
            }
            patience.pause();
        }
        self.thaw(ticket);
    }

    /// Lifts the freeze of `ticket`, if it still holds, leaving the count.
    pub fn thaw(&self, ticket: u64) {
        loop {
            let word = self.0.load();
            let (used, held) = split(word);
            if held != ticket || self.0.compare_exchange(word, join(used, 0)).is_ok() {
                return;
            }
        }
    }

    /// Sets the count to `used` and opens the tally, only if `ticket` still holds it.
    fn set(&self, ticket: u64, used: u64) -> bool {
        loop {
            let word = self.0.load();
            if split(word).1 != ticket {
                return false;
            }
            if self.0.compare_exchange(word, join(used, 0)).is_ok() {
                return true;
            }
        }
    }
}

/// How long a member waits for a sweep to finish before lifting its freeze.
pub const MEMBER_PATIENCE: std::time::Duration = std::time::Duration::from_millis(2);

/// A member's change of `tally` and of its own `cell` (on `device`, under its `share`): the
/// tally's new count, or `None` when an add would pass `cap` (then nothing changed). A sweep
/// under way is waited for (at most [`MEMBER_PATIENCE`], then lifted).
#[inline(always)]
pub fn change<S: Steps>(
    tally: &Tally,
    share: &Share,
    cell: &AtomicU64,
    device: usize,
    change: Change,
    cap: u64,
    steps: &mut S,
) -> Option<u64> {
    let bit = 1u64 << (device % 64);
    if share.devices.load(SeqCst) & bit == 0 {
        share.devices.fetch_or(bit, SeqCst);
    }
    if steps.after(Step::Marked).is_break() {
        return None;
    }
    share.under_way.fetch_add(1, SeqCst);
    if steps.after(Step::UnderWay).is_break() {
        return None;
    }
    let mut word = tally.0.load();
    let new_used = loop {
        let (used, ticket) = split(word);
        if ticket != 0 {
            // Not counted under way while waiting: the sweep waits for exactly that.
            share.under_way.fetch_sub(1, SeqCst);
            tally.wait_for_thaw(ticket, &Patience::new(MEMBER_PATIENCE));
            share.under_way.fetch_add(1, SeqCst);
            word = tally.0.load();
            continue;
        }
        let new_used = match change {
            Change::Add(bytes) => match admit(used, bytes, cap) {
                Some(n) => n,
                None => {
                    share.under_way.fetch_sub(1, SeqCst);
                    return None;
                }
            },
            Change::Sub(bytes) => used.wrapping_sub(bytes),
        };
        match tally.0.compare_exchange(word, join(new_used, 0)) {
            Ok(_) => break new_used,
            Err(now) => word = now,
        }
    };
    if steps.after(Step::Tallied).is_break() {
        return None;
    }
    match change {
        Change::Add(bytes) => cell.fetch_add(bytes, SeqCst),
        Change::Sub(bytes) => cell.fetch_sub(bytes, SeqCst),
    };
    if steps.after(Step::Recorded).is_break() {
        return None;
    }
    share.under_way.fetch_sub(1, SeqCst);
    let _ = steps.after(Step::Done);
    Some(new_used)
}

/// A live member's cells on the device being swept.
pub struct LiveCells<'a> {
    pub share: &'a Share,
    pub bytes: &'a AtomicU64,
    pub overhead: &'a AtomicU64,
}

/// Sets `used` and `overhead` (one device's tallies) to the sums of the live members' cells, which
/// `live` gives (it is walked after the freeze, so a member that joins meanwhile is seen or holds
/// nothing); `ticket` must be fresh. True when both were set; false (nothing wrong left behind)
/// when a live member's change did not finish within `patience` or the freeze was lifted.
pub fn settle<'a, S: Steps>(
    used: &Tally,
    overhead: &Tally,
    ticket: u64,
    live: impl Iterator<Item = LiveCells<'a>>,
    patience: &Patience,
    steps: &mut S,
) -> bool {
    if !used.freeze(ticket, patience) {
        return false;
    }
    if steps.after(Step::Frozen).is_break() {
        return false;
    }
    if !overhead.freeze(ticket, patience) {
        used.thaw(ticket);
        return false;
    }
    if steps.after(Step::OverheadFrozen).is_break() {
        return false;
    }
    let (mut bytes, mut charged) = (0u64, 0u64);
    for member in live {
        while member.share.under_way.load(SeqCst) != 0 {
            if patience.over() {
                overhead.thaw(ticket);
                used.thaw(ticket);
                return false;
            }
            patience.pause();
        }
        bytes = bytes.wrapping_add(member.bytes.load(SeqCst));
        charged = charged.wrapping_add(member.overhead.load(SeqCst));
    }
    if steps.after(Step::Summed).is_break() {
        return false;
    }
    let overhead_set = overhead.set(ticket, charged);
    if steps.after(Step::OverheadSet).is_break() {
        return false;
    }
    let used_set = used.set(ticket, bytes);
    let _ = steps.after(Step::Set);
    overhead_set && used_set
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn share() -> Share {
        Share {
            under_way: AtomicU64::new(0),
            devices: AtomicU64::new(0),
        }
    }

    #[test]
    fn a_change_moves_tally_and_cell_together_and_the_cap_refuses() {
        let (tally, s, cell) = (Tally::new(0), share(), AtomicU64::new(0));
        assert_eq!(
            change(&tally, &s, &cell, 3, Change::Add(70), 100, &mut NoSteps),
            Some(70)
        );
        assert_eq!(
            change(&tally, &s, &cell, 3, Change::Add(31), 100, &mut NoSteps),
            None
        );
        assert_eq!(
            change(&tally, &s, &cell, 3, Change::Sub(20), 100, &mut NoSteps),
            Some(50)
        );
        assert_eq!((tally.get(), cell.load(SeqCst)), (50, 50));
        assert_eq!(
            (s.under_way.load(SeqCst), s.devices.load(SeqCst)),
            (0, 1 << 3)
        );
    }

    #[test]
    fn a_settle_drops_what_the_dead_left_half_done_and_a_stale_one_changes_nothing() {
        let (used, overhead) = (Tally::new(0), Tally::new(0));
        let (live, dead) = (share(), share());
        let (live_cell, dead_cell, zero) =
            (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        change(
            &used,
            &live,
            &live_cell,
            0,
            Change::Add(10),
            u64::MAX,
            &mut NoSteps,
        );
        // The dead member stopped after changing the tally, before its cell.
        let mut stop = |s: Step| {
            if s == Step::Tallied {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        struct F<'a>(&'a mut dyn FnMut(Step) -> ControlFlow<()>);
        impl Steps for F<'_> {
            fn after(&mut self, s: Step) -> ControlFlow<()> {
                (self.0)(s)
            }
        }
        change(
            &used,
            &dead,
            &dead_cell,
            0,
            Change::Add(5),
            u64::MAX,
            &mut F(&mut stop),
        );
        assert_eq!(used.get(), 15);
        let cells = || {
            std::iter::once(LiveCells {
                share: &live,
                bytes: &live_cell,
                overhead: &zero,
            })
        };
        let patience = Patience::new(std::time::Duration::from_millis(50));
        assert!(settle(
            &used,
            &overhead,
            7,
            cells(),
            &patience,
            &mut NoSteps
        ));
        assert_eq!((used.get(), used.ticket()), (10, 0));
        // A settle under a ticket lifted meanwhile sets nothing.
        assert!(used.freeze(8, &patience));
        used.thaw(8);
        change(
            &used,
            &live,
            &live_cell,
            0,
            Change::Add(1),
            u64::MAX,
            &mut NoSteps,
        );
        assert!(!used.set(8, 999));
        assert_eq!(used.get(), 11);
    }
}

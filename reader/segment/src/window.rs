//! The one scope protocol: how a scope (a resettable peak window) is opened, reset, closed and
//! repaired, and how an allocation folds into the open ones. Process scopes (`crate::scope`, slots
//! of the process segment) and group scopes (`crate::group`'s `GroupSlots`, slots of the group
//! file) are both driven by this code; each supplies only its layout, through [`Slots`]. It is
//! built over [`crate::sync`], so the loom models (`tests/loom_scope.rs`) run it as it is.
//!
//! Any process that maps a segment read-write may change its scopes, and any of them may be
//! SIGKILLed at any instruction, so nothing here is a lock only its holder can release: every
//! transient state names its actor (an actor token, see `crate::process::actor_token`), and a
//! transient state whose actor is dead is finished or undone by whoever sees it next. Every wait
//! is bounded ([`crate::sync::Patience`]).
//!
//! Slot states (`phase` in the low [`PHASE_BITS`], the actor token above in a transient phase; the
//! phases below are the constants [`SCOPE_FREE`], [`SCOPE_CLAIMED`], [`SCOPE_OPENING`],
//! [`SCOPE_OPEN`] and [`SCOPE_CLOSING`], read by [`scope_phase_of`]):
//!
//! ```text
//!   FREE --claim--> CLAIMED(a) --mark--> OPENING(a) --restart--> OPEN
//!                                           ^                     |  |
//!                                           +------reset----------+  +--close--> CLOSING(a) --> FREE
//!
//!   CLAIMED(a), CLOSING(a) or an unknown phase, `a` dead: whoever sees it next releases the slot.
//!   OPENING(a), `a` dead: whoever sees it next takes it over and completes the open or reset.
//! ```
//!
//! Exactness of an open and a reset ([`restart_window`]): the slot's mark (its bit in the words an
//! allocation reads) is set before the slot turns OPENING and stays set until its closer clears it.
//! The restart sets the window's peak to 0 (a swap), then reads `used` U, sets base = U and folds U
//! into the peak. An allocation adds to `used`, then reads the marks and folds its new `used` into
//! every marked slot ([`fold_marked`]). All of these are `SeqCst`: in their single order either the
//! allocation's add comes before the read of U (it is in U), or the mark and the zeroing come before
//! the add, so the allocation sees the mark and folds after the zeroing. No allocation from the read
//! of U on is missed; one that raced the open may fold a `used` from just before it (the peak never
//! misses, and can include an allocation in flight at the open).

use crate::sync::{order_store_load, AtomicU64, Ordering::SeqCst, Patience};

/// Bits of a slot's state word holding the phase; the actor token sits above them.
pub const PHASE_BITS: u32 = 3;
const PHASE_MASK: u64 = (1 << PHASE_BITS) - 1;
pub const SCOPE_FREE: u64 = 0;
/// Taken by an actor that writes the scope's fields (name, device, id), not yet measuring.
pub const SCOPE_CLAIMED: u64 = 1;
/// Marked (allocations fold into it); an actor is restarting its window (an open or a reset).
pub const SCOPE_OPENING: u64 = 2;
pub const SCOPE_OPEN: u64 = 3;
/// An actor is clearing its marks.
pub const SCOPE_CLOSING: u64 = 4;

/// A state word: `phase` held by `actor`.
#[inline]
pub fn state(phase: u64, actor: u64) -> u64 {
    (actor << PHASE_BITS) | phase
}

#[inline]
pub fn scope_phase_of(word: u64) -> u64 {
    word & PHASE_MASK
}

#[inline]
pub fn actor_of(word: u64) -> u64 {
    word >> PHASE_BITS
}

/// Measuring, and listed: OPEN, or OPENING (an open or a reset under way).
#[inline]
pub fn is_measuring(word: u64) -> bool {
    matches!(scope_phase_of(word), SCOPE_OPENING | SCOPE_OPEN)
}

/// Why an operation on a slot did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotError {
    /// Another live actor held the slot (or what a restart needs) past the operation's patience.
    Busy,
    /// The slot no longer holds the scope: closed, being closed, or taken by a repairer that judged
    /// this actor dead.
    Gone,
    /// Every slot is taken.
    Full,
}

/// A table of scope slots, as a layout gives it: the slots' state words, how a slot is marked so
/// that allocations fold into it, and how its window is restarted.
pub trait Slots {
    fn count(&self) -> usize;
    /// The state word of slot `index` (`index < count()`).
    fn state(&self, index: usize) -> &AtomicU64;
    /// Makes allocations fold into slot `index` (sets its bits).
    fn mark(&self, index: usize);
    /// Undoes [`Slots::mark`], on every device.
    fn unmark(&self, index: usize);
    /// Restarts the window of slot `index`: [`restart_window`] on each device it measures, with
    /// whatever the layout must do around it (the process's floor words). [`SlotError::Busy`]
    /// when that could not begin; then nothing was changed.
    fn restart(&self, index: usize, actor: u64) -> Result<(), SlotError>;
    /// Whether the actor named in a transient state still runs.
    fn alive(&self, actor: u64) -> bool;
}

/// Sets a window's peak to 0 and its base to `used` now, folding that into the peak (see the module
/// docs for why in this order). A swap, not a store: an allocation's fold that lands just before it
/// is read by it, so that allocation's add to `used` is seen by the read below.
#[inline]
pub fn restart_window(peak: &AtomicU64, base: &AtomicU64, read_used: impl FnOnce() -> u64) {
    peak.swap(0, SeqCst);
    order_store_load();
    let used = read_used();
    base.store(used, SeqCst);
    fold_max(peak, used);
}

/// Raises `cell` to `value` if it is lower: `fetch_max` that skips the read-modify-write in the
/// common case, where the load shows it at least `value`. The load is `SeqCst` (a plain load on
/// x86-64 as a relaxed one is) so that it cannot see a peak from before a restart's zeroing that
/// the allocation's read of the marks already follows.
#[inline]
pub fn fold_max(cell: &AtomicU64, value: u64) {
    if value > cell.load(SeqCst) {
        cell.fetch_max(value, SeqCst);
    }
}

/// The allocation's side, after its add to `used`: folds `new_used` into the peak of every slot
/// whose bit is set in `marks` (bit i names slot `first + i`); `peak(slot)` is that slot's peak
/// for the allocation's device, `None` past the table.
#[inline]
pub fn fold_marked<'a>(
    mut marks: u64,
    first: usize,
    new_used: u64,
    peak: impl Fn(usize) -> Option<&'a AtomicU64>,
) {
    while marks != 0 {
        let slot = first + marks.trailing_zeros() as usize;
        marks &= marks - 1;
        if let Some(cell) = peak(slot) {
            fold_max(cell, new_used);
        }
    }
}

/// Reads the marks an allocation folds by, after its add to `used`.
#[inline]
pub fn read_marks(word: &AtomicU64) -> u64 {
    order_store_load();
    word.load(SeqCst)
}

/// Claims a FREE slot for `actor` (CLAIMED); its index. The caller writes the scope's fields, then
/// calls [`open`].
pub fn claim(slots: &impl Slots, actor: u64) -> Result<usize, SlotError> {
    let claimed = state(SCOPE_CLAIMED, actor);
    (0..slots.count())
        .find(|&i| {
            slots
                .state(i)
                .compare_exchange(SCOPE_FREE, claimed, SeqCst, SeqCst)
                .is_ok()
        })
        .ok_or(SlotError::Full)
}

/// Opens the slot `actor` claimed: marks it, turns it OPENING, restarts its window, turns it OPEN.
/// A restart that cannot begin releases the slot ([`SlotError::Busy`]).
pub fn open(slots: &impl Slots, index: usize, actor: u64) -> Result<(), SlotError> {
    slots.mark(index);
    let opening = state(SCOPE_OPENING, actor);
    if slots
        .state(index)
        .compare_exchange(state(SCOPE_CLAIMED, actor), opening, SeqCst, SeqCst)
        .is_err()
    {
        // A repairer judged this actor dead and released the slot.
        return Err(SlotError::Gone);
    }
    if let Err(e) = slots.restart(index, actor) {
        release(slots, index, opening);
        return Err(e);
    }
    publish(slots, index, opening)
}

/// OPENING (held as `opening`) to OPEN; [`SlotError::Gone`] if a repairer took the slot meanwhile.
fn publish(slots: &impl Slots, index: usize, opening: u64) -> Result<(), SlotError> {
    slots
        .state(index)
        .compare_exchange(opening, SCOPE_OPEN, SeqCst, SeqCst)
        .map(|_| ())
        .map_err(|_| SlotError::Gone)
}

/// Clears the marks of the slot held as `held`, then frees it.
fn release(slots: &impl Slots, index: usize, held: u64) {
    slots.unmark(index);
    let _ = slots
        .state(index)
        .compare_exchange(held, SCOPE_FREE, SeqCst, SeqCst);
}

/// Moves the measuring slot `index` from OPEN to `wanted` (a transient phase of `actor`), once no
/// live actor holds it mid-open (waiting, bounded by `patience`), and checks with `same` that it
/// still holds the caller's scope (its id or generation). A slot a dead actor left mid-change is
/// repaired on the way.
fn acquire(
    slots: &impl Slots,
    index: usize,
    wanted: u64,
    actor: u64,
    same: &dyn Fn() -> bool,
    patience: &Patience,
) -> Result<(), SlotError> {
    if index >= slots.count() {
        return Err(SlotError::Gone);
    }
    let word = slots.state(index);
    loop {
        let seen = word.load(SeqCst);
        match scope_phase_of(seen) {
            SCOPE_OPEN => {
                if word
                    .compare_exchange(SCOPE_OPEN, wanted, SeqCst, SeqCst)
                    .is_err()
                {
                    continue;
                }
                if same() {
                    return Ok(());
                }
                let _ = word.compare_exchange(wanted, SCOPE_OPEN, SeqCst, SeqCst);
                return Err(SlotError::Gone);
            }
            SCOPE_OPENING if !same() => return Err(SlotError::Gone),
            SCOPE_OPENING => {
                if !slots.alive(actor_of(seen)) {
                    repair_slot(slots, index, seen, actor);
                } else if patience.over() {
                    return Err(SlotError::Busy);
                } else {
                    patience.pause();
                }
                // A repair that could not restart the window leaves it OPENING: bounded too.
                if patience.over() && scope_phase_of(word.load(SeqCst)) == SCOPE_OPENING {
                    return Err(SlotError::Busy);
                }
            }
            // FREE, CLAIMED, CLOSING or an unknown phase: not (or no longer) this scope.
            _ => return Err(SlotError::Gone),
        }
    }
}

/// Restarts the window of the scope in slot `index` (`same` tells it is still the caller's). The
/// caller has run [`repair`] first (each layout's repair also settles what is its own).
pub fn reset(
    slots: &impl Slots,
    index: usize,
    actor: u64,
    same: &dyn Fn() -> bool,
    patience: &Patience,
) -> Result<(), SlotError> {
    let opening = state(SCOPE_OPENING, actor);
    acquire(slots, index, opening, actor, same, patience)?;
    if let Err(e) = slots.restart(index, actor) {
        let _ = slots
            .state(index)
            .compare_exchange(opening, SCOPE_OPEN, SeqCst, SeqCst);
        return Err(e);
    }
    publish(slots, index, opening)
}

/// Closes the scope in slot `index`. `last` runs once the slot is held (CLOSING), before its marks
/// are cleared: the final reading. The caller has run [`repair`] first, as for [`reset`].
pub fn close<R>(
    slots: &impl Slots,
    index: usize,
    actor: u64,
    same: &dyn Fn() -> bool,
    patience: &Patience,
    last: impl FnOnce() -> R,
) -> Result<R, SlotError> {
    let closing = state(SCOPE_CLOSING, actor);
    acquire(slots, index, closing, actor, same, patience)?;
    let reading = last();
    release(slots, index, closing);
    Ok(reading)
}

/// Closes the OPEN scope in slot `index` if `dead` says its owner is gone; whether it did.
pub fn close_if(slots: &impl Slots, index: usize, actor: u64, dead: impl FnOnce() -> bool) -> bool {
    let closing = state(SCOPE_CLOSING, actor);
    if scope_phase_of(slots.state(index).load(SeqCst)) != SCOPE_OPEN || !dead() {
        return false;
    }
    if slots
        .state(index)
        .compare_exchange(SCOPE_OPEN, closing, SeqCst, SeqCst)
        .is_err()
    {
        return false;
    }
    release(slots, index, closing);
    true
}

/// Finishes what dead actors left in every slot. Reads liveness only for a slot in a transient
/// phase, so it is cheap when there is nothing to do.
pub fn repair(slots: &impl Slots, actor: u64) {
    for index in 0..slots.count() {
        let seen = slots.state(index).load(SeqCst);
        let phase = scope_phase_of(seen);
        if phase != SCOPE_FREE && phase != SCOPE_OPEN && !slots.alive(actor_of(seen)) {
            repair_slot(slots, index, seen, actor);
        }
    }
}

/// Takes over slot `index`, seen as `seen` with a dead actor: completes an open or reset (OPENING),
/// releases anything else. A restart that cannot begin now leaves the slot as it was, for the next
/// repair.
fn repair_slot(slots: &impl Slots, index: usize, seen: u64, actor: u64) {
    let word = slots.state(index);
    if scope_phase_of(seen) == SCOPE_OPENING {
        let mine = state(SCOPE_OPENING, actor);
        if word.compare_exchange(seen, mine, SeqCst, SeqCst).is_err() {
            return;
        }
        match slots.restart(index, actor) {
            Ok(()) => {
                let _ = publish(slots, index, mine);
            }
            Err(_) => {
                let _ = word.compare_exchange(mine, seen, SeqCst, SeqCst);
            }
        }
    } else {
        let mine = state(SCOPE_CLOSING, actor);
        if word.compare_exchange(seen, mine, SeqCst, SeqCst).is_ok() {
            release(slots, index, mine);
        }
    }
}

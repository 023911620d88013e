//! The scope floor of a process segment: what lets an allocation skip the visit to every open
//! scope when that visit could change nothing, and how opens and resets switch it off while they
//! lower peaks. Process scopes only (a group's allocations are rarer: they always visit). Built
//! over [`crate::sync`], so the loom model (`tests/loom_scope.rs`) runs it as it is.
//!
//! Each device has a floor word: the floor in the low 48 bits, [`BUSY`] while a scope change (an
//! open or a reset) is under way, and a generation above, changed by every change. Every open scope
//! has a peak at least the floor, so an allocation whose new `used` is at most the floor, with BUSY
//! off, changes no peak. An allocation reads the word twice: a ticket before its reservation
//! ([`ticket`]), and the word after it. After visiting the scopes it raises the floor to its new
//! `used` ([`raise`]), but only while the generation is still the ticket's: then every scope open
//! now was open before the reservation, so it received the fold.
//!
//! A change takes an entry of the segment's change owners (CAS 0 → its actor token), then sets BUSY
//! under a new generation with the floor at zero on every device ([`begin_change`]). At its end
//! ([`end_change`]) it frees its entry and settles: for each device it reads the word, then, only if
//! every entry is free, clears BUSY (another generation). Because an entry is taken before BUSY is
//! set, a change that begins during a settle either changes the word (the CAS fails and is retried)
//! or is seen in the entries. An entry whose actor is dead is cleared by anyone
//! ([`reclaim_dead`]): a dead actor leaves at worst BUSY set until the next scope operation, which
//! costs allocations a visit to the open scopes, never a wait.

use crate::sync::{AtomicU64, Ordering::SeqCst, Patience};
use crate::window::SlotError;

const FLOOR_MASK: u64 = (1 << 48) - 1;
/// Set while a scope change is under way: no allocation skips the scopes or raises the floor.
pub const BUSY: u64 = 1 << 48;
const GENERATION_ONE: u64 = 1 << 49;
const GENERATION_MASK: u64 = !(FLOOR_MASK | BUSY);

/// The word with the next generation, BUSY off and the floor at zero.
#[inline]
fn next_generation(word: u64) -> u64 {
    (word & GENERATION_MASK).wrapping_add(GENERATION_ONE) & GENERATION_MASK
}

/// The generation and BUSY bits of a word.
#[inline]
fn epoch(word: u64) -> u64 {
    word & !FLOOR_MASK
}

/// The floor a word holds.
#[inline]
pub fn floor_of(word: u64) -> u64 {
    word & FLOOR_MASK
}

/// Read before an allocation's reservation and handed to [`raise`].
#[inline(always)]
pub fn ticket(floor: &AtomicU64) -> u64 {
    floor.load(SeqCst)
}

/// Whether an allocation that left `used` at `new_used`, reading the word `now` after its
/// reservation, may skip the open scopes.
#[inline(always)]
fn covers(now: u64, new_used: u64) -> bool {
    now & BUSY == 0 && new_used <= now & FLOOR_MASK
}

/// After the visit: raises the floor to `new_used`, unless a change began since `ticket`.
#[inline(always)]
fn raise(floor: &AtomicU64, now: u64, ticket: u64, new_used: u64) {
    if ticket & BUSY != 0 || new_used > FLOOR_MASK {
        return;
    }
    let mut current = now;
    while epoch(current) == epoch(ticket) && current & FLOOR_MASK < new_used {
        let raised = epoch(current) | new_used;
        match floor.compare_exchange_weak(current, raised, SeqCst, SeqCst) {
            Ok(_) => break,
            Err(seen) => current = seen,
        }
    }
}

/// The allocation's side after its reservation left `used` at `new_used`: unless no scope is
/// open (`any_open`) or the floor covers `new_used`, visits the open scopes (`visit`) and raises
/// the floor. Never waits.
#[inline(always)]
pub fn commit(
    floor: &AtomicU64,
    any_open: impl FnOnce() -> bool,
    new_used: u64,
    ticket: u64,
    visit: impl FnOnce(),
) {
    if !any_open() {
        return;
    }
    let now = floor.load(SeqCst);
    if !covers(now, new_used) {
        visit_and_raise(floor, now, ticket, new_used, visit);
    }
}

/// The visit and the raise, out of line: the common case (the floor covers) then needs none of
/// their registers saved.
#[cold]
#[inline(never)]
fn visit_and_raise(floor: &AtomicU64, now: u64, ticket: u64, new_used: u64, visit: impl FnOnce()) {
    visit();
    raise(floor, now, ticket, new_used);
}

/// Runs `work` (lowering peaks) inside a change: [`begin_change`], `work`, [`end_change`].
pub fn changing<'a, F, R>(
    entries: &[AtomicU64],
    floors: impl Fn() -> F,
    actor: u64,
    alive: impl Fn(u64) -> bool,
    patience: &Patience,
    work: impl FnOnce() -> R,
) -> Result<R, SlotError>
where
    F: Iterator<Item = &'a AtomicU64>,
{
    let entry = begin_change(entries, floors(), actor, alive, patience)?;
    let done = work();
    end_change(entries, floors(), entry, actor);
    Ok(done)
}

/// Clears the change entries whose actor `alive` says is dead; how many.
pub fn reclaim_dead(entries: &[AtomicU64], alive: impl Fn(u64) -> bool) -> usize {
    entries
        .iter()
        .filter(|entry| {
            let token = entry.load(SeqCst);
            token != 0 && !alive(token) && entry.compare_exchange(token, 0, SeqCst, SeqCst).is_ok()
        })
        .count()
}

/// Clears BUSY on every floor word when no change is under way.
pub fn settle<'a>(entries: &[AtomicU64], floors: impl Iterator<Item = &'a AtomicU64>) {
    for floor in floors {
        // Each failed CAS means another actor changed the word meanwhile; bounded regardless.
        for _ in 0..64 {
            let word = floor.load(SeqCst);
            if word & BUSY == 0 || entries.iter().any(|e| e.load(SeqCst) != 0) {
                break;
            }
            if floor
                .compare_exchange(word, next_generation(word), SeqCst, SeqCst)
                .is_ok()
            {
                break;
            }
        }
    }
}

/// Begins a change for `actor`: takes an entry (taking dead actors' entries, waiting for live
/// ones within `patience`), then sets every floor word BUSY under a new generation, floor zero.
/// The entry, for [`end_change`].
pub fn begin_change<'a>(
    entries: &[AtomicU64],
    floors: impl Iterator<Item = &'a AtomicU64>,
    actor: u64,
    alive: impl Fn(u64) -> bool,
    patience: &Patience,
) -> Result<usize, SlotError> {
    let entry = loop {
        let taken = entries
            .iter()
            .position(|e| e.compare_exchange(0, actor, SeqCst, SeqCst).is_ok());
        if let Some(entry) = taken {
            break entry;
        }
        if reclaim_dead(entries, &alive) == 0 {
            if patience.over() {
                return Err(SlotError::Busy);
            }
            patience.pause();
        }
    };
    for floor in floors {
        // The closure always returns `Some`, so this cannot fail.
        let _ = floor.fetch_update(SeqCst, SeqCst, |w| Some(next_generation(w) | BUSY));
    }
    Ok(entry)
}

/// Ends the change begun by [`begin_change`] as `entry`.
pub fn end_change<'a>(
    entries: &[AtomicU64],
    floors: impl Iterator<Item = &'a AtomicU64>,
    entry: usize,
    actor: u64,
) {
    if let Some(e) = entries.get(entry) {
        let _ = e.compare_exchange(actor, 0, SeqCst, SeqCst);
    }
    settle(entries, floors);
}

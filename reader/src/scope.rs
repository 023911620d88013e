//! The scope protocol: opening, resetting, closing and repairing the segment's scopes (resettable
//! peak markers), by any process that maps the segment read-write, and the allocation's side of it
//! (the floor word, [`Segment::scope_ticket`], [`Segment::commit_alloc`] and the fold into every
//! open scope). The segment's types are `crate::layout`'s.
//!
//! Scopes are opened, reset and closed by any process that maps the segment read-write: the
//! watched process itself, or a reader in another process. Any of them may be SIGKILLed at any
//! instruction, so nothing here is a lock that only its holder can release:
//!
//! * Every transient state names its actor: a token (`process::actor_token`: thread id and the
//!   thread's start time) that anyone can check for liveness through `/proc`. A transient state
//!   whose actor is dead is finished (or undone) by whoever sees it next ("repair").
//! * Every wait is bounded ([`CHANGE_WAIT`]); past it the operation fails with
//!   [`ScopeSlotError::Busy`]. No value read from the segment can make a loop run longer.
//! * The allocation path ([`Segment::commit_alloc`]) never waits for any of this: it reads one
//!   floor word and, at worst, visits every open scope.
//!
//! Slot states (`ScopeSlot::state`, phase in the low bits, actor token above):
//!
//! ```text
//!   FREE --claim(CAS)--> OPENING(a) --publish--> OPEN --reset(CAS)--> RESETTING(a) --> OPEN
//!                          |                      |                       |
//!                          | a dead: repair       +--close(CAS)--> CLOSING(a) --> FREE
//!                          v                                           ^
//!                        CLOSING(repairer) ----------------------------+
//!
//!   RESETTING(a) with `a` dead: the repairer takes it over and completes the reset.
//!   CLOSING(a) with `a` dead: the repairer completes the close.
//!   An unknown phase (a corrupt word) with a dead actor: the slot is closed.
//! ```
//!
//! Scope changes (open and reset lower a scope's peak, which the floor must not hide): the actor
//! takes an entry of `Header::change_owners` (CAS 0 -> token), then sets the BUSY bit (and a new
//! generation, floor 0) on every device's floor word. While BUSY is set no allocation skips the
//! scopes and none raises a floor. At the end the actor clears its entry and "settles": for each
//! device it reads the floor word, then, only if every entry is free, CASes BUSY off (another
//! generation). Because an entry is taken before BUSY is set, a change that begins during a settle
//! either changes the word (the CAS fails and is retried) or is seen in the entries. An entry
//! whose actor is dead is cleared by anyone (`reclaim_dead_changes`) and the floors settled: a
//! dead actor leaves at worst BUSY set until the next scope operation, which costs the
//! allocation path a visit to the open scopes, never a wait.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::counters::fold_max;
use crate::layout::{ScopeId, ScopeSlot, ScopeSlotError, Segment, CHANGE_WAIT};
use crate::text::{read_text, write_text};

// The floor word of each device (`DeviceCounters::scope_floor`): the floor in the low 48 bits,
// BUSY while a scope change is under way, and a generation above, changed by every open or reset.
const FLOOR_MASK: u64 = (1 << 48) - 1;
const BUSY: u64 = 1 << 48;
const GENERATION_ONE: u64 = 1 << 49;
const GENERATION_MASK: u64 = !(FLOOR_MASK | BUSY);

/// The floor word with the next generation, BUSY off and the floor at zero.
#[inline]
fn next_generation(word: u64) -> u64 {
    (word & GENERATION_MASK).wrapping_add(GENERATION_ONE) & GENERATION_MASK
}

/// The generation and in-progress bits of a floor word.
#[inline]
fn floor_epoch(word: u64) -> u64 {
    word & !FLOOR_MASK
}

/// The allocation's side of the protocol: it never waits.
impl Segment {
    /// Read before an allocation's reservation and handed to [`Segment::commit_alloc`].
    #[inline]
    pub fn scope_ticket(&self, device: u32) -> u64 {
        self.device(device)
            .map_or(BUSY, |c| c.scope_floor.load(Ordering::SeqCst))
    }

    /// Records a successful device allocation whose reservation left `used` at `new_used`: folds
    /// `new_used` into the device peak and into every open scope. (The allocation itself is counted
    /// in the device's [`CountStripe`](crate::layout::CountStripe).)
    ///
    /// The scope floor spares the visit to every open scope when it could change nothing: if the
    /// floor word (read after the reservation) shows no scope being opened or reset and a floor at
    /// or above `new_used`, every open scope already has a peak at least that high. After a visit,
    /// the floor is raised to `new_used`, but only if no scope was opened or reset since `ticket`
    /// (read before the reservation, by [`Segment::scope_ticket`]): then every open scope was open
    /// before the reservation, so its bit was seen and its peak received `new_used`. Opening and
    /// resetting bracket their work with [`Segment::begin_scope_change`] and its end, which drop
    /// the floor to zero and change the generation.
    #[inline]
    pub fn commit_alloc(&self, device: u32, new_used: u64, ticket: u64) {
        let Some(counters) = self.device(device) else {
            return;
        };
        fold_max(&counters.peak, new_used);
        self.mark_touched(device);
        if self
            .header
            .scopes_active
            .iter()
            .all(|w| w.load(Ordering::SeqCst) == 0)
        {
            return;
        }
        let now = counters.scope_floor.load(Ordering::SeqCst);
        if now & BUSY == 0 && new_used <= now & FLOOR_MASK {
            return;
        }
        self.fold_into_scopes(device, new_used);
        if ticket & BUSY == 0 && new_used <= FLOOR_MASK {
            let mut current = now;
            while floor_epoch(current) == floor_epoch(ticket) && current & FLOOR_MASK < new_used {
                let raised = floor_epoch(current) | new_used;
                match counters.scope_floor.compare_exchange_weak(
                    current,
                    raised,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => break,
                    Err(seen) => current = seen,
                }
            }
        }
    }

    /// Folds `new_used` into the peak of `device` of every open scope.
    #[inline]
    fn fold_into_scopes(&self, device: u32, new_used: u64) {
        for (word_index, word) in self.header.scopes_active.iter().enumerate() {
            let mut bits = word.load(Ordering::SeqCst);
            while bits != 0 {
                let slot = word_index * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(scope) = self.scopes.get(slot) {
                    if let Some(peak) = scope.peak.get(device as usize) {
                        fold_max(peak, new_used);
                    }
                }
            }
        }
    }
}

/// Bits of [`ScopeSlot::state`] holding the phase; the actor token sits above them.
pub const PHASE_BITS: u32 = 3;
const PHASE_MASK: u64 = (1 << PHASE_BITS) - 1;
/// Scope slot phases (the states of the scope protocol).
pub const PHASE_FREE: u64 = 0;
/// Claimed by an actor that is setting it up.
pub const PHASE_OPENING: u64 = 1;
pub const PHASE_OPEN: u64 = 2;
/// Open, its window being restarted by an actor.
pub const PHASE_RESETTING: u64 = 3;
/// Being closed by an actor.
pub const PHASE_CLOSING: u64 = 4;

/// A slot state word: `phase` of `actor`.
#[inline]
fn slot_state(phase: u64, actor: u64) -> u64 {
    (actor << PHASE_BITS) | phase
}

#[inline]
fn phase_of(state: u64) -> u64 {
    state & PHASE_MASK
}

#[inline]
fn actor_of(state: u64) -> u64 {
    state >> PHASE_BITS
}

/// Open for measuring: OPEN, or OPEN while being reset.
#[inline]
fn is_open(state: u64) -> bool {
    matches!(phase_of(state), PHASE_OPEN | PHASE_RESETTING)
}

/// Sleeps a little unless `deadline` has passed; false when it has.
fn pause_until(deadline: Instant) -> bool {
    if Instant::now() >= deadline {
        return false;
    }
    std::thread::sleep(Duration::from_micros(50));
    true
}

impl ScopeSlot {
    /// The scope's name.
    pub fn name(&self) -> String {
        read_text(&self.name)
    }

    /// The default device of the scope, `None` for all.
    pub fn default_device(&self) -> Option<u32> {
        u32::try_from(self.device.load(Ordering::Relaxed)).ok()
    }
}

impl Segment {
    /// Clears change entries whose actor is dead; returns how many.
    fn reclaim_dead_changes(&self) -> usize {
        let mut reclaimed = 0;
        for entry in &self.header.change_owners {
            let token = entry.load(Ordering::SeqCst);
            if token != 0
                && !crate::process::token_alive(token)
                && entry
                    .compare_exchange(token, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                reclaimed += 1;
            }
        }
        reclaimed
    }

    /// Clears BUSY on every device's floor word when no change is in progress (see above).
    fn settle_floors(&self) {
        for c in &self.devices {
            // Each failed CAS means another actor changed the word meanwhile; bounded regardless.
            for _ in 0..64 {
                let word = c.scope_floor.load(Ordering::SeqCst);
                if word & BUSY == 0
                    || self
                        .header
                        .change_owners
                        .iter()
                        .any(|e| e.load(Ordering::SeqCst) != 0)
                {
                    break;
                }
                if c.scope_floor
                    .compare_exchange(
                        word,
                        next_generation(word),
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    )
                    .is_ok()
                {
                    break;
                }
            }
        }
    }

    /// Starts lowering scope peaks (an open or a reset): takes a change entry, then marks every
    /// device's floor word BUSY under a new generation with the floor at zero, so no allocation
    /// skips scopes or raises a floor on the strength of a visit made before the change. Returns
    /// the entry, for [`Segment::end_scope_change`].
    fn begin_scope_change(&self, actor: u64) -> Result<usize, ScopeSlotError> {
        let deadline = Instant::now() + CHANGE_WAIT;
        let entry = loop {
            let taken = self.header.change_owners.iter().position(|e| {
                e.compare_exchange(0, actor, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            });
            if let Some(entry) = taken {
                break entry;
            }
            // Every entry is held: by dead actors (take theirs) or by live ones (wait, bounded).
            if self.reclaim_dead_changes() == 0 && !pause_until(deadline) {
                return Err(ScopeSlotError::Busy);
            }
        };
        for c in &self.devices {
            // The closure always returns `Some`, so this cannot fail.
            let _ = c
                .scope_floor
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                    Some(next_generation(w) | BUSY)
                });
        }
        Ok(entry)
    }

    /// Ends a change begun by [`Segment::begin_scope_change`].
    fn end_scope_change(&self, entry: usize, actor: u64) {
        if let Some(e) = self.header.change_owners.get(entry) {
            let _ = e.compare_exchange(actor, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
        self.settle_floors();
    }

    /// Finishes what dead actors left: change entries, BUSY floors, and slots in a transient phase.
    /// Cheap when there is nothing to do (no `/proc` read unless a transient state is found).
    pub fn repair_scopes(&self, actor: u64) {
        self.reclaim_dead_changes();
        self.settle_floors();
        for (index, slot) in self.scopes.iter().enumerate() {
            let state = slot.state.load(Ordering::SeqCst);
            let phase = phase_of(state);
            if phase == PHASE_FREE || phase == PHASE_OPEN {
                continue;
            }
            if crate::process::token_alive(actor_of(state)) {
                continue;
            }
            if phase == PHASE_RESETTING {
                let mine = slot_state(PHASE_RESETTING, actor);
                if slot
                    .state
                    .compare_exchange(state, mine, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                    && self.finish_reset(slot, mine, actor).is_err()
                {
                    // Could not begin a change now: leave it for the next repair.
                    let _ = slot.state.compare_exchange(
                        mine,
                        state,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                }
            } else {
                // OPENING, CLOSING or an unknown phase: the slot is closed.
                let mine = slot_state(PHASE_CLOSING, actor);
                if slot
                    .state
                    .compare_exchange(state, mine, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    self.finish_close(index, slot);
                }
            }
        }
    }

    /// Opens a scope for `actor` (see [`crate::process::actor_token`]): claims a free slot, zeroes
    /// its peaks, publishes its active bit, then folds the current `used` of every device into its
    /// peaks and remembers it as the base, all inside a scope change. Any allocation after the bit is
    /// visible is folded by its allocating thread; any before is in `used`.
    pub fn open_scope(
        &self,
        name: &str,
        device: Option<u32>,
        owner_pid: u32,
        now_unix_ns: u64,
        actor: u64,
    ) -> Result<ScopeId, ScopeSlotError> {
        self.repair_scopes(actor);
        let claimed = slot_state(PHASE_OPENING, actor);
        for (index, slot) in self.scopes.iter().enumerate() {
            if slot
                .state
                .compare_exchange(PHASE_FREE, claimed, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            let generation = self.header.scope_generation.fetch_add(1, Ordering::SeqCst) + 1;
            slot.generation.store(generation, Ordering::SeqCst);
            slot.owner_pid.store(owner_pid, Ordering::Relaxed);
            slot.opened_unix_ns.store(now_unix_ns, Ordering::Relaxed);
            slot.device
                .store(device.map_or(-1, |d| d as i32), Ordering::Relaxed);
            write_text(&slot.name, name);
            let entry = match self.begin_scope_change(actor) {
                Ok(entry) => entry,
                Err(e) => {
                    let _ = slot.state.compare_exchange(
                        claimed,
                        PHASE_FREE,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                    return Err(e);
                }
            };
            for p in &slot.peak {
                p.store(0, Ordering::SeqCst);
            }
            let (word, bit) = (index / 64, 1u64 << (index % 64));
            self.header.scopes_active[word].fetch_or(bit, Ordering::SeqCst);
            self.fold_base(slot);
            self.end_scope_change(entry, actor);
            // Publish, unless a repairer took the slot (it judged this actor dead).
            slot.state
                .compare_exchange(claimed, PHASE_OPEN, Ordering::SeqCst, Ordering::SeqCst)
                .map_err(|_| ScopeSlotError::Stale)?;
            return Ok(ScopeId {
                index: index as u32,
                generation,
            });
        }
        Err(ScopeSlotError::Full)
    }

    fn fold_base(&self, slot: &ScopeSlot) {
        for (d, counters) in self.devices.iter().enumerate() {
            let used = counters.used.load(Ordering::SeqCst);
            slot.base[d].store(used, Ordering::SeqCst);
            fold_max(&slot.peak[d], used);
        }
    }

    /// The slot of an open scope (open or being reset), if `id` still names it.
    pub fn scope(&self, id: ScopeId) -> Result<&ScopeSlot, ScopeSlotError> {
        let slot = self
            .scopes
            .get(id.index as usize)
            .ok_or(ScopeSlotError::Stale)?;
        if is_open(slot.state.load(Ordering::SeqCst))
            && slot.generation.load(Ordering::SeqCst) == id.generation
        {
            Ok(slot)
        } else {
            Err(ScopeSlotError::Stale)
        }
    }

    /// Moves the open slot `id` from OPEN to `wanted` (a transient phase of `actor`). Waits
    /// (bounded) while a live actor holds it in a transient phase; takes over a dead actor's reset;
    /// completes a dead actor's close (and then reports the scope closed).
    fn acquire_open_slot(
        &self,
        id: ScopeId,
        wanted: u64,
        actor: u64,
    ) -> Result<&ScopeSlot, ScopeSlotError> {
        let deadline = Instant::now() + CHANGE_WAIT;
        loop {
            let slot = self.scope(id)?;
            let state = slot.state.load(Ordering::SeqCst);
            let phase = phase_of(state);
            let holder = actor_of(state);
            let free_to_take =
                phase == PHASE_OPEN || (holder != actor && !crate::process::token_alive(holder));
            if free_to_take {
                if slot
                    .state
                    .compare_exchange(state, wanted, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    continue;
                }
                if phase == PHASE_CLOSING {
                    self.finish_close(id.index as usize, slot);
                    return Err(ScopeSlotError::Stale);
                }
                // Recheck the generation: the slot cannot have been reused while we hold it.
                return match slot.generation.load(Ordering::SeqCst) == id.generation {
                    true => Ok(slot),
                    false => {
                        let _ = slot.state.compare_exchange(
                            wanted,
                            state,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                        Err(ScopeSlotError::Stale)
                    }
                };
            }
            if !pause_until(deadline) {
                return Err(ScopeSlotError::Busy);
            }
        }
    }

    /// Starts a new measuring window: peaks drop to the current `used`, which becomes the base.
    pub fn reset_scope(&self, id: ScopeId, actor: u64) -> Result<(), ScopeSlotError> {
        self.repair_scopes(actor);
        let mine = slot_state(PHASE_RESETTING, actor);
        let slot = self.acquire_open_slot(id, mine, actor)?;
        self.finish_reset(slot, mine, actor).inspect_err(|_| {
            let _ =
                slot.state
                    .compare_exchange(mine, PHASE_OPEN, Ordering::SeqCst, Ordering::SeqCst);
        })
    }

    /// The reset itself, on a slot this actor holds as `mine` (RESETTING); leaves it OPEN.
    fn finish_reset(&self, slot: &ScopeSlot, mine: u64, actor: u64) -> Result<(), ScopeSlotError> {
        let entry = self.begin_scope_change(actor)?;
        for p in &slot.peak {
            p.store(0, Ordering::SeqCst);
        }
        self.fold_base(slot);
        self.end_scope_change(entry, actor);
        slot.state
            .compare_exchange(mine, PHASE_OPEN, Ordering::SeqCst, Ordering::SeqCst)
            .map(|_| ())
            .map_err(|_| ScopeSlotError::Stale)
    }

    /// Closes a scope: clears its active bit, then frees the slot.
    pub fn close_scope(&self, id: ScopeId, actor: u64) -> Result<(), ScopeSlotError> {
        self.repair_scopes(actor);
        let slot = self.acquire_open_slot(id, slot_state(PHASE_CLOSING, actor), actor)?;
        self.finish_close(id.index as usize, slot);
        Ok(())
    }

    /// The close itself, on a slot this actor holds in CLOSING.
    fn finish_close(&self, index: usize, slot: &ScopeSlot) {
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        if let Some(w) = self.header.scopes_active.get(word) {
            w.fetch_and(!bit, Ordering::SeqCst);
        }
        slot.state.store(PHASE_FREE, Ordering::SeqCst);
    }

    /// Repairs (see [`Segment::repair_scopes`]), then closes every open scope whose owner is not
    /// alive according to `is_alive`; returns how many were closed.
    pub fn reap_scopes(&self, is_alive: impl Fn(u32) -> bool, actor: u64) -> usize {
        self.repair_scopes(actor);
        let mut reaped = 0;
        for (index, slot) in self.scopes.iter().enumerate() {
            let state = slot.state.load(Ordering::SeqCst);
            if phase_of(state) == PHASE_OPEN
                && !is_alive(slot.owner_pid.load(Ordering::Relaxed))
                && slot
                    .state
                    .compare_exchange(
                        state,
                        slot_state(PHASE_CLOSING, actor),
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    )
                    .is_ok()
            {
                self.finish_close(index, slot);
                reaped += 1;
            }
        }
        reaped
    }

    /// Open scopes, in slot order.
    pub fn open_scopes(&self) -> impl Iterator<Item = (ScopeId, &ScopeSlot)> {
        self.scopes
            .iter()
            .enumerate()
            .filter(|(_, slot)| is_open(slot.state.load(Ordering::SeqCst)))
            .map(|(index, slot)| {
                let generation = slot.generation.load(Ordering::SeqCst);
                (
                    ScopeId {
                        index: index as u32,
                        generation,
                    },
                    slot,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::tests::{me, zeroed};
    use std::sync::atomic::Ordering;

    #[test]
    fn scopes_fold_peaks_and_reset_to_current_use() {
        let seg = zeroed();
        let dev = seg.device(0).unwrap();
        let n = dev.reserve(10).unwrap();
        seg.commit_alloc(0, n, seg.scope_ticket(0));
        let outer = seg.open_scope("outer", None, 1, 0, me()).unwrap();
        let n = dev.reserve(90).unwrap();
        seg.commit_alloc(0, n, seg.scope_ticket(0));
        let inner = seg.open_scope("inner", Some(0), 1, 0, me()).unwrap();
        dev.release(90);
        let n = dev.reserve(30).unwrap();
        seg.commit_alloc(0, n, seg.scope_ticket(0));
        assert_eq!(
            seg.scope(outer).unwrap().peak[0].load(Ordering::Relaxed),
            100
        );
        assert_eq!(
            seg.scope(inner).unwrap().peak[0].load(Ordering::Relaxed),
            100
        );
        assert_eq!(
            seg.scope(inner).unwrap().base[0].load(Ordering::Relaxed),
            100
        );
        seg.reset_scope(inner, me()).unwrap();
        assert_eq!(
            seg.scope(inner).unwrap().peak[0].load(Ordering::Relaxed),
            40
        );
        seg.close_scope(outer, me()).unwrap();
        assert_eq!(seg.scope(outer).err(), Some(ScopeSlotError::Stale));
        assert_eq!(seg.open_scopes().count(), 1);
        assert_eq!(dev.peak.load(Ordering::Relaxed), 100);
    }

    /// Allocates `bytes` on device 0 the way the hook does: ticket, reserve, commit.
    fn alloc(seg: &Segment, bytes: u64) {
        let ticket = seg.scope_ticket(0);
        let n = seg.devices[0].reserve(bytes).unwrap();
        seg.commit_alloc(0, n, ticket);
    }

    fn floor(seg: &Segment) -> u64 {
        seg.devices[0].scope_floor.load(Ordering::SeqCst) & FLOOR_MASK
    }

    #[test]
    fn the_scope_floor_rises_with_visits_and_spares_lower_allocations() {
        let seg = zeroed();
        let s = seg.open_scope("s", None, 1, 0, me()).unwrap();
        alloc(&seg, 100);
        assert_eq!(floor(&seg), 100);
        seg.devices[0].release(50);
        alloc(&seg, 30);
        assert_eq!(
            floor(&seg),
            100,
            "80 is below the floor: no visit, no change"
        );
        assert_eq!(seg.scope(s).unwrap().peak[0].load(Ordering::Relaxed), 100);
        alloc(&seg, 40);
        assert_eq!(
            (
                floor(&seg),
                seg.scope(s).unwrap().peak[0].load(Ordering::Relaxed)
            ),
            (120, 120)
        );
    }

    #[test]
    fn a_reset_drops_the_floor_so_lower_peaks_are_caught() {
        let seg = zeroed();
        let s = seg.open_scope("s", None, 1, 0, me()).unwrap();
        alloc(&seg, 100);
        seg.devices[0].release(60);
        seg.reset_scope(s, me()).unwrap();
        assert_eq!(floor(&seg), 0);
        // used 40 -> 70: below the old floor of 100, above the reset scope's peak of 40.
        alloc(&seg, 30);
        assert_eq!(seg.scope(s).unwrap().peak[0].load(Ordering::Relaxed), 70);
        // A scope opened later starts from the current use, whatever the floor was.
        seg.devices[0].release(50);
        let t = seg.open_scope("t", None, 1, 0, me()).unwrap();
        alloc(&seg, 10);
        assert_eq!(seg.scope(t).unwrap().peak[0].load(Ordering::Relaxed), 30);
        assert_eq!(seg.scope(s).unwrap().peak[0].load(Ordering::Relaxed), 70);
    }

    #[test]
    fn a_visit_that_began_before_a_scope_change_never_raises_the_floor() {
        let seg = zeroed();
        let s = seg.open_scope("s", None, 1, 0, me()).unwrap();
        let ticket = seg.scope_ticket(0);
        let n = seg.devices[0].reserve(200).unwrap();
        // A scope opens between this allocation's reservation and its commit.
        let t = seg.open_scope("t", None, 1, 0, me()).unwrap();
        seg.commit_alloc(0, n, ticket);
        assert_eq!(
            floor(&seg),
            0,
            "the visit may have missed a scope opened meanwhile"
        );
        assert_eq!(seg.scope(s).unwrap().peak[0].load(Ordering::Relaxed), 200);
        assert_eq!(seg.scope(t).unwrap().peak[0].load(Ordering::Relaxed), 200);
    }

    #[test]
    fn concurrent_scope_changes_keep_every_scope_at_least_at_its_base() {
        let seg = zeroed();
        std::thread::scope(|threads| {
            for _ in 0..3 {
                threads.spawn(|| {
                    for i in 0..20_000u64 {
                        alloc(&seg, 1 + i % 7);
                        seg.devices[0].release(1 + i % 7);
                    }
                });
            }
            threads.spawn(|| {
                for _ in 0..500 {
                    let s = seg.open_scope("x", None, 1, 0, me()).unwrap();
                    seg.reset_scope(s, me()).unwrap();
                    let slot = seg.scope(s).unwrap();
                    assert!(
                        slot.peak[0].load(Ordering::SeqCst) >= slot.base[0].load(Ordering::SeqCst)
                    );
                    seg.close_scope(s, me()).unwrap();
                }
            });
        });
        let word = seg.devices[0].scope_floor.load(Ordering::SeqCst);
        assert_eq!(word & BUSY, 0, "every change ended");
        assert_eq!(seg.devices[0].used.load(Ordering::SeqCst), 0);
    }

    /// A token naming a thread that cannot exist (past any pid_max): always dead.
    const DEAD: u64 = 4_000_000_000 << 29;

    fn busy(seg: &Segment) -> bool {
        seg.devices
            .iter()
            .any(|c| c.scope_floor.load(Ordering::SeqCst) & BUSY != 0)
    }

    #[test]
    fn changes_left_by_dead_actors_are_reclaimed_and_the_floor_works_again() {
        let seg = zeroed();
        // Dead actors hold every change entry, with BUSY set, as a killed reader leaves them.
        for e in &seg.header.change_owners {
            e.store(DEAD, Ordering::SeqCst);
        }
        seg.devices[0].scope_floor.fetch_or(BUSY, Ordering::SeqCst);
        let started = Instant::now();
        let s = seg.open_scope("s", None, 1, 0, me()).unwrap();
        assert!(started.elapsed() < Duration::from_millis(100));
        assert!(!busy(&seg), "the floors settled");
        assert!(seg
            .header
            .change_owners
            .iter()
            .all(|e| e.load(Ordering::SeqCst) == 0));
        alloc(&seg, 100);
        assert_eq!(floor(&seg), 100, "the floor rises again");
        assert_eq!(seg.scope(s).unwrap().peak[0].load(Ordering::SeqCst), 100);
    }

    #[test]
    fn live_holders_make_a_change_fail_typed_after_a_bounded_wait() {
        let seg = zeroed();
        for e in &seg.header.change_owners {
            e.store(me(), Ordering::SeqCst);
        }
        let started = Instant::now();
        assert_eq!(
            seg.open_scope("s", None, 1, 0, me()),
            Err(ScopeSlotError::Busy)
        );
        assert!(started.elapsed() < CHANGE_WAIT + Duration::from_millis(200));
        assert_eq!(
            seg.open_scopes().count(),
            0,
            "the claimed slot was given back"
        );
    }

    #[test]
    fn slots_left_mid_operation_by_dead_actors_are_finished() {
        let seg = zeroed();
        alloc(&seg, 40);
        // Opening, died after publishing the active bit with the peak zeroed.
        seg.scopes[0].state.store(
            slot_state(PHASE_OPENING, DEAD >> PHASE_BITS),
            Ordering::SeqCst,
        );
        seg.header.scopes_active[0].fetch_or(1, Ordering::SeqCst);
        // Resetting, died with the peak zeroed and the base not yet folded.
        seg.scopes[1].generation.store(7, Ordering::SeqCst);
        seg.scopes[1].state.store(
            slot_state(PHASE_RESETTING, DEAD >> PHASE_BITS),
            Ordering::SeqCst,
        );
        seg.header.scopes_active[0].fetch_or(2, Ordering::SeqCst);
        // Closing, died after clearing nothing.
        seg.scopes[2].state.store(
            slot_state(PHASE_CLOSING, DEAD >> PHASE_BITS),
            Ordering::SeqCst,
        );
        // A corrupt phase.
        seg.scopes[3].state.store(7, Ordering::SeqCst);
        let s = seg.open_scope("s", None, 1, 0, me()).unwrap();
        assert_eq!(s.index, 0, "the dead opener's slot was freed and reused");
        let resumed = seg
            .scope(ScopeId {
                index: 1,
                generation: 7,
            })
            .unwrap();
        assert_eq!(
            (
                resumed.base[0].load(Ordering::SeqCst),
                resumed.peak[0].load(Ordering::SeqCst)
            ),
            (40, 40),
            "the dead actor's reset was completed"
        );
        assert_eq!(
            phase_of(seg.scopes[2].state.load(Ordering::SeqCst)),
            PHASE_FREE
        );
        assert_eq!(
            phase_of(seg.scopes[3].state.load(Ordering::SeqCst)),
            PHASE_FREE
        );
        assert_eq!(seg.open_scopes().count(), 2);
        assert_eq!(
            seg.header.scopes_active[0].load(Ordering::SeqCst),
            0b11,
            "only the open slots fold"
        );
    }

    #[test]
    fn hostile_words_never_make_a_scope_operation_spin() {
        let seg = zeroed();
        for c in &seg.devices {
            c.scope_floor.store(u64::MAX, Ordering::SeqCst);
        }
        for w in &seg.header.scopes_active {
            w.store(u64::MAX, Ordering::SeqCst);
        }
        seg.header
            .scope_generation
            .store(u64::MAX, Ordering::SeqCst);
        let started = Instant::now();
        let s = seg.open_scope("s", None, 1, 0, me()).unwrap();
        alloc(&seg, 10);
        seg.reset_scope(s, me()).unwrap();
        alloc(&seg, 5);
        assert_eq!(seg.scope(s).unwrap().peak[0].load(Ordering::SeqCst), 15);
        seg.close_scope(s, me()).unwrap();
        assert_eq!(seg.close_scope(s, me()), Err(ScopeSlotError::Stale));
        assert_eq!(
            seg.reset_scope(
                ScopeId {
                    index: u32::MAX,
                    generation: 0
                },
                me()
            ),
            Err(ScopeSlotError::Stale)
        );
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}

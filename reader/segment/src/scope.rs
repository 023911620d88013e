//! Process scopes: the slots of the process segment ([`ScopeSlot`]) driven by the one scope
//! protocol (`crate::window`: opening, resetting, closing, repairing), and the allocation's side
//! ([`Segment::scope_ticket`], [`Segment::commit_alloc`]), which skips the open scopes when the
//! floor word says no peak could change (`crate::floor`). The segment's types are `crate::layout`'s.
//!
//! Scopes are opened, reset and closed by any process that maps the segment read-write: the
//! watched process itself, or a reader in another process. The process's table has
//! [`MAX_SCOPES`](crate::layout::MAX_SCOPES) slots; a slot's mark is its bit in
//! `Header::scopes_active`, and its window is one peak and base per device, restarted inside a
//! floor change so that no allocation skips it while its peaks are lowered.

use std::sync::atomic::Ordering;

use crate::floor;
use crate::layout::{Change, ScopeId, ScopeSlot, ScopeSlotError, Segment, CHANGE_WAIT};
use crate::sync::Patience;
use crate::text::{read_text, write_text};
use crate::window::{self, SlotError, Slots};

/// The allocation's side of the protocol: it never waits.
impl Segment {
    /// Read before an allocation's reservation and handed to [`Segment::commit_alloc`].
    #[inline]
    pub fn scope_ticket(&self, device: u32) -> u64 {
        self.device(device)
            .map_or(floor::BUSY, |c| floor::ticket(&c.scope_floor))
    }

    /// Records a successful device allocation of `bytes` (reserved under the ceiling before):
    /// counts it in `used` ([`DeviceCounters::commit`](crate::layout::DeviceCounters)) and folds
    /// the new `used` into the device peak and into every open scope, unless the floor word (read
    /// after the count) shows that no open scope's peak could change. Returns the change: the
    /// value the timeline records (so the peaks are the maximum of recorded values) and its
    /// number. (The allocation itself is counted in the device's
    /// [`CountStripe`](crate::layout::CountStripe).)
    // Always inlined: its three callers are the hook's allocation paths, which it would
    // otherwise cost a call frame each (measured: 36 instructions a pair with callgrind).
    #[inline(always)]
    pub fn commit_alloc(&self, device: u32, bytes: u64, ticket: u64) -> Change {
        let Some(counters) = self.device(device) else {
            return Change::default();
        };
        let peak_ticket = counters.peak_ticket();
        let change = counters.commit(bytes);
        let new_used = change.used;
        counters.fold_peak(peak_ticket, change);
        self.mark_touched(device);
        let any_open = || (self.header.scopes_active.iter()).any(|w| w.load(Ordering::SeqCst) != 0);
        floor::commit(&counters.scope_floor, any_open, new_used, ticket, || {
            self.fold_into_scopes(device, new_used)
        });
        change
    }

    /// Folds `new_used` into the peak of `device` of every open scope.
    #[inline]
    fn fold_into_scopes(&self, device: u32, new_used: u64) {
        for (word_index, word) in self.header.scopes_active.iter().enumerate() {
            window::fold_marked(
                window::read_marks(word),
                word_index * 64,
                new_used,
                |slot| self.scopes.get(slot)?.peak.get(device as usize),
            );
        }
    }
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

/// The process's scope table as the protocol sees it.
struct ProcessSlots<'a>(&'a Segment);

impl Slots for ProcessSlots<'_> {
    fn count(&self) -> usize {
        self.0.scopes.len()
    }

    fn state(&self, index: usize) -> &crate::sync::AtomicU64 {
        &self.0.scopes[index].state
    }

    fn mark(&self, index: usize) {
        self.0.header.scopes_active[index / 64].fetch_or(1 << (index % 64), Ordering::SeqCst);
    }

    fn unmark(&self, index: usize) {
        self.0.header.scopes_active[index / 64].fetch_and(!(1 << (index % 64)), Ordering::SeqCst);
    }

    /// Every device's window, inside a floor change.
    fn restart(&self, index: usize, actor: u64) -> Result<(), SlotError> {
        let seg = self.0;
        let floors = || seg.devices.iter().map(|c| &c.scope_floor);
        let entries = &seg.header.change_owners;
        let patience = Patience::new(CHANGE_WAIT);
        let slot = &seg.scopes[index];
        floor::changing(entries, floors, actor, self_alive, &patience, || {
            for (d, counters) in seg.devices.iter().enumerate() {
                window::restart_window(&slot.peak[d], &slot.base[d], || {
                    counters.used.load(Ordering::SeqCst)
                });
            }
        })
    }

    fn alive(&self, actor: u64) -> bool {
        self_alive(actor)
    }
}

fn self_alive(actor: u64) -> bool {
    crate::process::token_alive(actor)
}

fn slot_error(e: SlotError) -> ScopeSlotError {
    match e {
        SlotError::Busy => ScopeSlotError::Busy,
        SlotError::Gone => ScopeSlotError::Stale,
        SlotError::Full => ScopeSlotError::Full,
    }
}

impl Segment {
    /// Finishes what dead actors left: change entries, BUSY floors, and slots in a transient phase.
    /// Cheap when there is nothing to do (no `/proc` read unless a transient state is found).
    pub fn repair_scopes(&self, actor: u64) {
        let entries = &self.header.change_owners;
        floor::reclaim_dead(entries, self_alive);
        floor::settle(entries, self.devices.iter().map(|c| &c.scope_floor));
        window::repair(&ProcessSlots(self), actor);
    }

    /// Opens a scope for `actor` (see [`crate::process::actor_token`]) owned by `owner_pid`.
    pub fn open_scope(
        &self,
        name: &str,
        device: Option<u32>,
        owner_pid: u32,
        now_unix_ns: u64,
        actor: u64,
    ) -> Result<ScopeId, ScopeSlotError> {
        self.repair_scopes(actor);
        let slots = ProcessSlots(self);
        let index = window::claim(&slots, actor).map_err(slot_error)?;
        let slot = &self.scopes[index];
        let generation = (self.header.scope_generation)
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_add(1);
        slot.generation.store(generation, Ordering::SeqCst);
        slot.owner_pid.store(owner_pid, Ordering::Relaxed);
        slot.opened_unix_ns.store(now_unix_ns, Ordering::Relaxed);
        slot.device
            .store(device.map_or(-1, |d| d as i32), Ordering::Relaxed);
        write_text(&slot.name, name);
        for cell in slot.peak.iter().chain(&slot.base) {
            cell.store(0, Ordering::SeqCst);
        }
        window::open(&slots, index, actor).map_err(slot_error)?;
        Ok(ScopeId {
            index: index as u32,
            generation,
        })
    }

    /// The slot of an open scope (open or being reset), if `id` still names it.
    pub fn scope(&self, id: ScopeId) -> Result<&ScopeSlot, ScopeSlotError> {
        let slot = self
            .scopes
            .get(id.index as usize)
            .ok_or(ScopeSlotError::Stale)?;
        if window::is_measuring(slot.state.load(Ordering::SeqCst))
            && slot.generation.load(Ordering::SeqCst) == id.generation
        {
            Ok(slot)
        } else {
            Err(ScopeSlotError::Stale)
        }
    }

    /// Whether slot `id.index` still holds scope `id`.
    fn same_scope(&self, id: ScopeId) -> impl Fn() -> bool + '_ {
        move || {
            self.scopes
                .get(id.index as usize)
                .is_some_and(|s| s.generation.load(Ordering::SeqCst) == id.generation)
        }
    }

    /// Starts a new measuring window: peaks drop to the current `used`, which becomes the base.
    pub fn reset_scope(&self, id: ScopeId, actor: u64) -> Result<(), ScopeSlotError> {
        self.repair_scopes(actor);
        let patience = Patience::new(CHANGE_WAIT);
        let same = self.same_scope(id);
        window::reset(
            &ProcessSlots(self),
            id.index as usize,
            actor,
            &same,
            &patience,
        )
        .map_err(slot_error)
    }

    /// Closes a scope: clears its active bit, then frees the slot.
    pub fn close_scope(&self, id: ScopeId, actor: u64) -> Result<(), ScopeSlotError> {
        self.repair_scopes(actor);
        let patience = Patience::new(CHANGE_WAIT);
        let same = self.same_scope(id);
        window::close(
            &ProcessSlots(self),
            id.index as usize,
            actor,
            &same,
            &patience,
            || (),
        )
        .map_err(slot_error)
    }

    /// Repairs (see [`Segment::repair_scopes`]), then closes every open scope whose owner is not
    /// alive according to `is_alive`; returns how many were closed.
    pub fn reap_scopes(&self, is_alive: impl Fn(u32) -> bool, actor: u64) -> usize {
        self.repair_scopes(actor);
        let slots = ProcessSlots(self);
        (0..self.scopes.len())
            .filter(|&index| {
                window::close_if(&slots, index, actor, || {
                    !is_alive(self.scopes[index].owner_pid.load(Ordering::Relaxed))
                })
            })
            .count()
    }

    /// Open scopes (open, or being opened or reset), in slot order.
    pub fn open_scopes(&self) -> impl Iterator<Item = (ScopeId, &ScopeSlot)> {
        self.scopes
            .iter()
            .enumerate()
            .filter(|(_, slot)| window::is_measuring(slot.state.load(Ordering::SeqCst)))
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
    use crate::floor::{floor_of, BUSY};
    use crate::window::{
        scope_phase_of, state as slot_state, SCOPE_CLOSING, SCOPE_FREE, SCOPE_OPENING,
    };
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    #[test]
    fn scopes_fold_peaks_and_reset_to_current_use() {
        let seg = zeroed();
        let dev = seg.device(0).unwrap();
        dev.reserve(10).unwrap();
        seg.commit_alloc(0, 10, seg.scope_ticket(0));
        let outer = seg.open_scope("outer", None, 1, 0, me()).unwrap();
        dev.reserve(90).unwrap();
        seg.commit_alloc(0, 90, seg.scope_ticket(0));
        let inner = seg.open_scope("inner", Some(0), 1, 0, me()).unwrap();
        dev.release(90);
        dev.reserve(30).unwrap();
        seg.commit_alloc(0, 30, seg.scope_ticket(0));
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
        assert_eq!(dev.peak_bytes(), 100);
    }

    /// Allocates `bytes` on device 0 the way the hook does: ticket, reserve, commit.
    fn alloc(seg: &Segment, bytes: u64) {
        let ticket = seg.scope_ticket(0);
        seg.devices[0].reserve(bytes).unwrap();
        seg.commit_alloc(0, bytes, ticket);
    }

    fn floor(seg: &Segment) -> u64 {
        floor_of(seg.devices[0].scope_floor.load(Ordering::SeqCst))
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
        seg.devices[0].reserve(200).unwrap();
        // A scope opens between this allocation's reservation and its commit.
        let t = seg.open_scope("t", None, 1, 0, me()).unwrap();
        seg.commit_alloc(0, 200, ticket);
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
        let dead = DEAD >> crate::window::PHASE_BITS;
        // Opening, died after its active bit with a peak from the slot's last scope: the open is
        // completed (its owner's death then closes it at the next reap).
        seg.scopes[0].generation.store(5, Ordering::SeqCst);
        seg.scopes[0].peak[0].store(12345, Ordering::SeqCst);
        seg.scopes[0]
            .state
            .store(slot_state(SCOPE_OPENING, dead), Ordering::SeqCst);
        seg.header.scopes_active[0].fetch_or(1, Ordering::SeqCst);
        // Resetting, died with the peak zeroed and the base not yet read: the reset is completed.
        seg.scopes[1].generation.store(7, Ordering::SeqCst);
        seg.scopes[1]
            .state
            .store(slot_state(SCOPE_OPENING, dead), Ordering::SeqCst);
        seg.header.scopes_active[0].fetch_or(2, Ordering::SeqCst);
        // Closing, died after clearing nothing; claimed, died before its bit; a corrupt phase.
        seg.scopes[2]
            .state
            .store(slot_state(SCOPE_CLOSING, dead), Ordering::SeqCst);
        seg.header.scopes_active[0].fetch_or(4, Ordering::SeqCst);
        seg.scopes[3].state.store(
            slot_state(crate::window::SCOPE_CLAIMED, dead),
            Ordering::SeqCst,
        );
        seg.scopes[4].state.store(7, Ordering::SeqCst);
        let s = seg.open_scope("s", None, 1, 0, me()).unwrap();
        assert_eq!(s.index, 2, "the dead closer's slot was freed and reused");
        for (index, generation) in [(0, 5), (1, 7)] {
            let resumed = seg.scope(ScopeId { index, generation }).unwrap();
            assert_eq!(
                (
                    resumed.base[0].load(Ordering::SeqCst),
                    resumed.peak[0].load(Ordering::SeqCst)
                ),
                (40, 40),
                "the dead actor's open or reset of slot {index} was completed"
            );
        }
        for index in [3, 4] {
            assert_eq!(
                scope_phase_of(seg.scopes[index].state.load(Ordering::SeqCst)),
                SCOPE_FREE
            );
        }
        assert_eq!(seg.open_scopes().count(), 3);
        assert_eq!(
            seg.header.scopes_active[0].load(Ordering::SeqCst),
            0b111,
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

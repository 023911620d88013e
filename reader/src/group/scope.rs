//! Group scopes (`docs/groups.md`): a window on one device of a group that measures the group's
//! peak above its start, opened, read, reset and closed by any process of the user (a CLI call, a
//! Python context manager, a member). The slots are [`GroupScopeSlot`]s of the group segment.
//!
//! A group scope has no owner whose death closes it: the process that opens one may be a CLI call
//! that exits at once. It lives until it is closed; the slots are few ([`super::MAX_GROUP_SCOPES`]) and an
//! open that finds none free names the open ones.
//!
//! Slot states (phase in the low bits of `state`, the actor token above in a transient phase):
//!
//! ```text
//!   FREE --claim(CAS)--> CLAIMED(a) --bit set--> OPENING(a) --base read--> OPEN
//!                                                   ^                        |  |
//!                                                   +-------reset(CAS)-------+  +--close(CAS)--> CLOSING(a) --> FREE
//!
//!   CLAIMED(a), CLOSING(a) with `a` dead: whoever sees it next clears the slot (FREE).
//!   OPENING(a) with `a` dead: whoever sees it next finishes the open (or reset) and makes it OPEN.
//! ```
//!
//! Exactness of open and reset: the slot's bit is set in the device's [`GroupDevice::scopes_open`]
//! word before the slot turns OPENING, and stays set until its closer clears it. Opening (and
//! resetting) then sets the slot's peak to 0 (a swap), reads the group's `used` U, sets base = U
//! and folds U into the peak. An allocating member adds to `used`, then loads the device's bit word and folds
//! its new `used` into every slot whose bit is set. All of these are `SeqCst`, so in their single
//! order either the allocation's add comes before the read of U (it is in U), or the opener's bit
//! and zeroing come before the add, so the member sees the bit and folds after the zeroing: no
//! allocation from the read of U on is missed. (An allocation that raced the open may fold a `used`
//! from just before it: the peak never misses, and can include an allocation in flight at the open.)
//! `interceptor/tests/loom_group_scope.rs` models this, and shows that the other orders lose an
//! allocation.
//!
//! Every wait is bounded ([`CHANGE_WAIT`]), and nothing here is a lock only its holder can release.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::Instant;

use super::{GroupDevice, GroupMapping, GroupScopeSlot, GroupSegment};
use crate::attach::{check_device, ScopeReading};
use crate::counters::fold_max;
use crate::error::{Error, Result};
use crate::layout::CHANGE_WAIT;
use crate::process::{actor_token, token_alive, unix_now_ns};
use crate::text::{read_text, write_text};

/// Bits of [`GroupScopeSlot::state`] holding the phase; the actor token sits above them.
const PHASE_BITS: u32 = 3;
const PHASE_MASK: u64 = (1 << PHASE_BITS) - 1;
const FREE: u64 = 0;
/// Claimed by an actor writing its id, device and label.
const CLAIMED: u64 = 1;
/// Its bit is set; an actor is reading its base (an open or a reset).
const OPENING: u64 = 2;
const OPEN: u64 = 3;
/// An actor is taking its final reading and clearing its bit.
const CLOSING: u64 = 4;

#[inline]
fn state(phase: u64, actor: u64) -> u64 {
    (actor << PHASE_BITS) | phase
}

#[inline]
fn phase_of(word: u64) -> u64 {
    word & PHASE_MASK
}

/// A group scope as read: its id, label, the reading of its device, and whether an open or reset
/// of it is under way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupScope {
    pub id: u64,
    pub label: String,
    pub opened_unix_ns: u64,
    /// False while an open or reset is under way (its base is being read).
    pub settled: bool,
    pub reading: ScopeReading,
}

impl GroupSegment {
    /// The allocation's side: folds the group's `new_used` on `device` into every scope whose bit
    /// is set there. With none open, one load and a predictable branch.
    #[inline(always)]
    pub fn fold_scopes(&self, device: &GroupDevice, new_used: u64) {
        let open = device.scopes_open.load(SeqCst);
        if open != 0 {
            self.fold_into(open, new_used);
        }
    }

    #[cold]
    fn fold_into(&self, mut open: u64, new_used: u64) {
        while open != 0 {
            let index = open.trailing_zeros() as usize;
            open &= open - 1;
            if let Some(slot) = self.scopes.get(index) {
                fold_max(&slot.peak, new_used);
            }
        }
    }

    /// Opens a scope on `device` labelled `label` for `actor` ([`actor_token`]); its id.
    pub fn open_scope(&self, label: &str, device: u32, actor: u64) -> Result<u64> {
        let device = check_device(device)?;
        self.repair_scopes(actor);
        let claimed = state(CLAIMED, actor);
        for (index, slot) in self.scopes.iter().enumerate() {
            if slot
                .state
                .compare_exchange(FREE, claimed, SeqCst, SeqCst)
                .is_err()
            {
                continue;
            }
            let id = self
                .header
                .scope_serial
                .fetch_add(1, SeqCst)
                .wrapping_add(1);
            slot.id.store(id, SeqCst);
            slot.device.store(device, SeqCst);
            slot.opened_unix_ns.store(unix_now_ns(), Relaxed);
            write_text(&slot.label, label);
            self.devices[device as usize]
                .scopes_open
                .fetch_or(1 << index, SeqCst);
            let opening = state(OPENING, actor);
            if slot
                .state
                .compare_exchange(claimed, opening, SeqCst, SeqCst)
                .is_err()
            {
                // A repairer judged this actor dead and cleared the slot.
                return Err(Error::ScopeBusy);
            }
            self.settle(slot, opening);
            return Ok(id);
        }
        Err(Error::GroupScopesFull {
            group: self.name(),
            slots: self.scopes.len(),
            open: self
                .scopes_listed()
                .iter()
                .map(|s| format!("{} {:?}", s.id, s.label))
                .collect(),
        })
    }

    /// The second half of an open or reset, by the actor holding the slot OPENING as `opening`:
    /// peak to 0, then the base read, then OPEN (see the module docs for why in this order).
    fn settle(&self, slot: &GroupScopeSlot, opening: u64) {
        let device = &self.devices[(slot.device.load(SeqCst) as usize).min(self.devices.len() - 1)];
        // A swap, not a store: a member's fold that lands just before it is read by it, so that
        // member's add to `used` is seen by the base read below (interceptor/tests/loom_group_scope.rs).
        slot.peak.swap(0, SeqCst);
        let used = device.used.get();
        slot.base.store(used, SeqCst);
        fold_max(&slot.peak, used);
        let _ = slot.state.compare_exchange(opening, OPEN, SeqCst, SeqCst);
    }

    /// Clears the slot held as `held` (CLAIMED or CLOSING): its bit on every device, then FREE.
    fn release(&self, slot: &GroupScopeSlot, index: usize, held: u64) {
        for device in &self.devices {
            device.scopes_open.fetch_and(!(1 << index), SeqCst);
        }
        let _ = slot.state.compare_exchange(held, FREE, SeqCst, SeqCst);
    }

    /// Finishes what dead actors left: a CLAIMED or CLOSING slot is freed, an OPENING one settled
    /// (the open or reset completed). Reads `/proc` only for a slot in a transient phase.
    pub fn repair_scopes(&self, actor: u64) {
        for (index, slot) in self.scopes.iter().enumerate() {
            let seen = slot.state.load(SeqCst);
            let phase = phase_of(seen);
            if phase == FREE || phase == OPEN || token_alive(seen >> PHASE_BITS) {
                continue;
            }
            let taken = state(if phase == OPENING { OPENING } else { CLOSING }, actor);
            if slot
                .state
                .compare_exchange(seen, taken, SeqCst, SeqCst)
                .is_err()
            {
                continue;
            }
            if phase == OPENING {
                self.settle(slot, taken);
            } else {
                self.release(slot, index, taken);
            }
        }
    }

    /// The slot of scope `id` once no live actor holds it mid-open (waiting, bounded): its index
    /// and the state it was seen in (OPEN, or CLOSING).
    fn find(&self, id: u64) -> Result<(usize, &GroupScopeSlot, u64)> {
        let deadline = Instant::now() + CHANGE_WAIT;
        loop {
            let found = self.scopes.iter().enumerate().find(|(_, s)| {
                s.id.load(SeqCst) == id && !matches!(phase_of(s.state.load(SeqCst)), FREE | CLAIMED)
            });
            let Some((index, slot)) = found else {
                return Err(self.gone(id));
            };
            let seen = slot.state.load(SeqCst);
            if phase_of(seen) != OPENING {
                return Ok((index, slot, seen));
            }
            if Instant::now() >= deadline {
                return Err(Error::ScopeBusy);
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    fn gone(&self, id: u64) -> Error {
        Error::GroupScopeGone {
            group: self.name(),
            id,
        }
    }

    /// Moves scope `id` from OPEN to `wanted`, making sure the slot still holds that scope after
    /// the change (a close and a reopen in between would give it another id).
    fn acquire(&self, id: u64, wanted: u64) -> Result<(usize, &GroupScopeSlot)> {
        let (index, slot, seen) = self.find(id)?;
        if phase_of(seen) != OPEN
            || slot
                .state
                .compare_exchange(OPEN, wanted, SeqCst, SeqCst)
                .is_err()
        {
            // Being closed by another, or changed since it was found.
            return Err(self.gone(id));
        }
        if slot.id.load(SeqCst) != id {
            let _ = slot.state.compare_exchange(wanted, OPEN, SeqCst, SeqCst);
            return Err(self.gone(id));
        }
        Ok((index, slot))
    }

    /// Restarts scope `id` from the group's `used` now: base and peak drop to it.
    pub fn reset_scope(&self, id: u64, actor: u64) -> Result<()> {
        self.repair_scopes(actor);
        let opening = state(OPENING, actor);
        let (_, slot) = self.acquire(id, opening)?;
        self.settle(slot, opening);
        Ok(())
    }

    /// Closes scope `id`; its final reading.
    pub fn close_scope(&self, id: u64, actor: u64) -> Result<GroupScope> {
        self.repair_scopes(actor);
        let closing = state(CLOSING, actor);
        let (index, slot) = self.acquire(id, closing)?;
        let last = self.listed(slot, true);
        self.release(slot, index, closing);
        Ok(last)
    }

    /// Scope `id` as it stands.
    pub fn read_scope(&self, id: u64) -> Result<GroupScope> {
        let (_, slot, _) = self.find(id)?;
        let reading = self.listed(slot, true);
        if reading.id != id {
            return Err(self.gone(id));
        }
        Ok(reading)
    }

    /// Every scope not free (being opened, open, being closed), by slot.
    pub fn scopes_listed(&self) -> Vec<GroupScope> {
        self.scopes
            .iter()
            .filter_map(|slot| {
                let phase = phase_of(slot.state.load(SeqCst));
                (phase != FREE && phase != CLAIMED).then(|| self.listed(slot, phase != OPENING))
            })
            .collect()
    }

    fn listed(&self, slot: &GroupScopeSlot, settled: bool) -> GroupScope {
        let device = slot.device.load(SeqCst);
        let used = self
            .devices
            .get(device as usize)
            .map_or(0, |d| d.used.get());
        let base = slot.base.load(SeqCst);
        GroupScope {
            id: slot.id.load(SeqCst),
            label: read_text(&slot.label),
            opened_unix_ns: slot.opened_unix_ns.load(Relaxed),
            settled,
            reading: ScopeReading {
                device,
                base,
                // Never below the base, even read in the middle of a reset.
                peak: slot.peak.load(SeqCst).max(base),
                used,
            },
        }
    }
}

/// A reader's group scopes: each operation sweeps out dead members first (so `used` and the base
/// count no dead member's bytes), and needs the file mapped read-write.
impl GroupMapping {
    fn writable_swept(&self) -> Result<&GroupSegment> {
        if !self.writable {
            return Err(Error::ReadOnly {
                path: self.path.clone(),
            });
        }
        if self
            .guard
            .as_ref()
            .is_some_and(crate::sigbus::Guarded::tripped)
        {
            return Err(Error::Truncated {
                path: self.path.clone(),
                len: 0,
            });
        }
        self.sweep();
        Ok(self.group())
    }

    /// Opens a group scope on `device`; its id.
    pub fn open_scope(&self, label: &str, device: u32) -> Result<u64> {
        self.writable_swept()?
            .open_scope(label, device, actor_token())
    }

    pub fn read_scope(&self, id: u64) -> Result<GroupScope> {
        let group = self.writable_swept()?;
        group.repair_scopes(actor_token());
        group.read_scope(id)
    }

    pub fn reset_scope(&self, id: u64) -> Result<()> {
        self.writable_swept()?.reset_scope(id, actor_token())
    }

    pub fn close_scope(&self, id: u64) -> Result<GroupScope> {
        self.writable_swept()?.close_scope(id, actor_token())
    }

    /// The scopes not free, after finishing what dead actors left (read-only: as they stand).
    pub fn scopes(&self) -> Vec<GroupScope> {
        if let Ok(group) = self.writable_swept() {
            group.repair_scopes(actor_token());
        }
        self.group().scopes_listed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group segment in plain memory (all atomics: zeroes are a valid, empty group).
    fn segment() -> Box<GroupSegment> {
        // SAFETY: every field is an atomic integer (or an array of them), for which all-zero bits
        // are a valid value.
        unsafe { Box::<GroupSegment>::new_zeroed().assume_init() }
    }

    /// An allocation of a member: the add to `used`, then the fold (the hook's order).
    fn allocate(g: &GroupSegment, device: usize, bytes: u64) {
        let d = &g.devices[device];
        let new_used = d.used.get() + bytes;
        d.used.reset(new_used);
        g.fold_scopes(d, new_used);
    }

    /// The token of a thread that does not exist (`token_alive` says dead).
    const DEAD: u64 = (u32::MAX as u64 - 1) << 29;

    #[test]
    fn a_scope_sees_the_peak_above_its_start_and_a_reset_restarts_it() {
        let g = segment();
        let me = actor_token();
        allocate(&g, 1, 100);
        let id = g.open_scope("w", 1, me).unwrap();
        assert_eq!(g.devices[1].scopes_open.load(SeqCst), 1);
        assert_eq!(g.devices[0].scopes_open.load(SeqCst), 0);
        allocate(&g, 1, 600);
        g.devices[1].used.reset(g.devices[1].used.get() - 600);
        allocate(&g, 0, 5000); // another device: not this scope's
        let r = g.read_scope(id).unwrap().reading;
        assert_eq!((r.base, r.delta_peak(), r.delta_used()), (100, 600, 0));
        g.reset_scope(id, me).unwrap();
        allocate(&g, 1, 50);
        let last = g.close_scope(id, me).unwrap();
        assert_eq!((last.reading.delta_peak(), last.label.as_str()), (50, "w"));
        assert_eq!(g.devices[1].scopes_open.load(SeqCst), 0);
        assert!(matches!(
            g.read_scope(id),
            Err(Error::GroupScopeGone { id: i, .. }) if i == id
        ));
    }

    #[test]
    fn what_a_dead_actor_left_is_finished_by_the_next_one() {
        let g = segment();
        let me = actor_token();
        g.devices[0].used.reset(300);
        // Killed mid-open, after its bit: the slot is settled OPEN from the `used` now.
        let opening = &g.scopes[0];
        opening.id.store(7, SeqCst);
        opening.peak.store(12345, SeqCst);
        g.devices[0].scopes_open.fetch_or(1, SeqCst);
        opening.state.store(state(OPENING, DEAD), SeqCst);
        // Killed while claiming, and while closing: both slots are freed and their bits cleared.
        g.scopes[1].state.store(state(CLAIMED, DEAD), SeqCst);
        g.devices[2].scopes_open.fetch_or(1 << 1, SeqCst);
        g.scopes[2].id.store(8, SeqCst);
        g.scopes[2].state.store(state(CLOSING, DEAD), SeqCst);
        g.devices[0].scopes_open.fetch_or(1 << 2, SeqCst);
        let listed = g.scopes_listed();
        assert!(listed.iter().any(|s| s.id == 7 && !s.settled), "{listed:?}");
        g.repair_scopes(me);
        let r = g.read_scope(7).unwrap();
        assert!(r.settled);
        assert_eq!((r.reading.base, r.reading.peak), (300, 300));
        assert_eq!(g.devices[0].scopes_open.load(SeqCst), 1);
        assert_eq!(g.devices[2].scopes_open.load(SeqCst), 0);
        assert!(g.read_scope(8).is_err());
        assert_eq!(g.scopes_listed().len(), 1);
    }

    #[test]
    fn a_full_group_names_its_open_scopes() {
        let g = segment();
        let me = actor_token();
        for i in 0..super::super::MAX_GROUP_SCOPES {
            g.open_scope(&format!("s{i}"), 0, me).unwrap();
        }
        let refused = g.open_scope("more", 0, me).unwrap_err().to_string();
        assert!(
            refused.contains("1 \"s0\"") && refused.contains("16 \"s15\""),
            "{refused}"
        );
    }
}

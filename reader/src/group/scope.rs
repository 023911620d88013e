//! Group scopes (`docs/groups.md`): a window on one device of a group that measures the group's
//! peak above its start, opened, read, reset and closed by any process of the user (a CLI call, a
//! Python context manager, a member). The slots are [`GroupScopeSlot`]s of the group segment,
//! driven by the one scope protocol (`gpumemhook_segment::window`) as the process's scopes are,
//! through the segment's [`GroupSlots`] (a slot's mark is its bit in its device's
//! `GroupDevice::scopes_open` word, its window one peak and base; an allocation folds into them
//! with `GroupSegment::fold_scopes`). This module holds what a user asks of them: [`GroupScopes`].
//!
//! A group scope has no owner whose death closes it: the process that opens one may be a CLI call
//! that exits at once. It lives until it is closed; the slots are few ([`super::MAX_GROUP_SCOPES`]) and an
//! open that finds none free names the open ones.

use std::ops::Deref;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use super::{GroupMapping, GroupScopeSlot, GroupSegment, GroupSlots};
use crate::attach::{check_device, ScopeReading};
use crate::error::{Error, Result};
use gpumemhook_segment::layout::CHANGE_WAIT;
use gpumemhook_segment::process::{actor_token, token_alive, unix_now_ns};
use gpumemhook_segment::sync::Patience;
use gpumemhook_segment::text::{read_text, write_text};
use gpumemhook_segment::window::{self, SlotError, SCOPE_OPEN, SCOPE_OPENING};

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

/// A group's scopes, as users open, read, reset and close them (with typed errors); it reads
/// the group through [`Deref`].
pub struct GroupScopes<'a>(pub &'a GroupSegment);

impl Deref for GroupScopes<'_> {
    type Target = GroupSegment;

    fn deref(&self) -> &GroupSegment {
        self.0
    }
}

impl GroupScopes<'_> {
    /// Opens a scope on `device` labelled `label` for `actor` ([`actor_token`]); its id.
    pub fn open_scope(&self, label: &str, device: u32, actor: u64) -> Result<u64> {
        let device = check_device(device)?;
        self.repair_scopes(actor);
        let slots = GroupSlots(self.0);
        let index = window::claim(&slots, actor).map_err(|_| Error::GroupScopesFull {
            group: self.name(),
            slots: self.scopes.len(),
            open: self
                .scopes_listed()
                .iter()
                .map(|s| format!("{} {:?}", s.id, s.label))
                .collect(),
        })?;
        let slot = &self.scopes[index];
        let id = self
            .header
            .scope_serial
            .fetch_add(1, SeqCst)
            .wrapping_add(1);
        slot.id.store(id, SeqCst);
        slot.device.store(device, SeqCst);
        slot.opened_unix_ns.store(unix_now_ns(), Relaxed);
        write_text(&slot.label, label);
        slot.peak.store(0, SeqCst);
        slot.base.store(0, SeqCst);
        // Gone: a repairer judged this actor dead and released the slot.
        window::open(&slots, index, actor).map_err(|_| Error::ScopeBusy)?;
        Ok(id)
    }

    /// Finishes what dead actors left: a CLAIMED or CLOSING slot is freed, an OPENING one settled
    /// (the open or reset completed). Reads `/proc` only for a slot in a transient phase.
    pub fn repair_scopes(&self, actor: u64) {
        window::repair(&GroupSlots(self.0), actor);
    }

    /// The slot measuring scope `id` (open, or being opened or reset), if any.
    fn slot_of(&self, id: u64) -> Result<usize> {
        self.scopes
            .iter()
            .position(|s| s.id.load(SeqCst) == id && window::is_measuring(s.state.load(SeqCst)))
            .ok_or_else(|| self.gone(id))
    }

    fn gone(&self, id: u64) -> Error {
        Error::GroupScopeGone {
            group: self.name(),
            id,
        }
    }

    fn slot_error(&self, id: u64, e: SlotError) -> Error {
        match e {
            SlotError::Busy => Error::ScopeBusy,
            SlotError::Gone | SlotError::Full => self.gone(id),
        }
    }

    /// Restarts scope `id` from the group's `used` now: base and peak drop to it.
    pub fn reset_scope(&self, id: u64, actor: u64) -> Result<()> {
        self.repair_scopes(actor);
        let index = self.slot_of(id)?;
        let same = || self.scopes[index].id.load(SeqCst) == id;
        window::reset(
            &GroupSlots(self.0),
            index,
            actor,
            &same,
            &Patience::new(CHANGE_WAIT),
        )
        .map_err(|e| self.slot_error(id, e))
    }

    /// Closes scope `id`; its final reading.
    pub fn close_scope(&self, id: u64, actor: u64) -> Result<GroupScope> {
        self.repair_scopes(actor);
        let index = self.slot_of(id)?;
        let slot = &self.scopes[index];
        let same = || slot.id.load(SeqCst) == id;
        let patience = Patience::new(CHANGE_WAIT);
        window::close(&GroupSlots(self.0), index, actor, &same, &patience, || {
            self.listed(slot, true)
        })
        .map_err(|e| self.slot_error(id, e))
    }

    /// Scope `id` as it stands, once no live actor holds it mid-open (waiting, bounded).
    pub fn read_scope(&self, id: u64) -> Result<GroupScope> {
        let patience = Patience::new(CHANGE_WAIT);
        loop {
            let slot = &self.scopes[self.slot_of(id)?];
            let seen = slot.state.load(SeqCst);
            if window::scope_phase_of(seen) == SCOPE_OPEN {
                let reading = self.listed(slot, true);
                return match reading.id == id {
                    true => Ok(reading),
                    false => Err(self.gone(id)),
                };
            }
            if window::scope_phase_of(seen) == SCOPE_OPENING && !token_alive(window::actor_of(seen))
            {
                self.repair_scopes(actor_token());
            } else if patience.over() {
                return Err(Error::ScopeBusy);
            } else {
                patience.pause();
            }
        }
    }

    /// Every scope measuring (open, or being opened or reset), by slot.
    pub fn scopes_listed(&self) -> Vec<GroupScope> {
        self.scopes
            .iter()
            .filter_map(|slot| {
                let phase = window::scope_phase_of(slot.state.load(SeqCst));
                window::is_measuring(phase).then(|| self.listed(slot, phase == SCOPE_OPEN))
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
        GroupScopes(self.writable_swept()?).open_scope(label, device, actor_token())
    }

    pub fn read_scope(&self, id: u64) -> Result<GroupScope> {
        let group = GroupScopes(self.writable_swept()?);
        group.repair_scopes(actor_token());
        group.read_scope(id)
    }

    pub fn reset_scope(&self, id: u64) -> Result<()> {
        GroupScopes(self.writable_swept()?).reset_scope(id, actor_token())
    }

    pub fn close_scope(&self, id: u64) -> Result<GroupScope> {
        GroupScopes(self.writable_swept()?).close_scope(id, actor_token())
    }

    /// The scopes not free, after finishing what dead actors left (read-only: as they stand).
    pub fn scopes(&self) -> Vec<GroupScope> {
        if let Ok(group) = self.writable_swept() {
            GroupScopes(group).repair_scopes(actor_token());
        }
        GroupScopes(self.group()).scopes_listed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumemhook_segment::window::{state, SCOPE_CLAIMED, SCOPE_CLOSING};

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
        let g = GroupScopes(&g);
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
        let g = GroupScopes(&g);
        let me = actor_token();
        g.devices[0].used.reset(300);
        // Killed mid-open, after its bit: the slot is settled OPEN from the `used` now.
        let opening = &g.scopes[0];
        opening.id.store(7, SeqCst);
        opening.peak.store(12345, SeqCst);
        g.devices[0].scopes_open.fetch_or(1, SeqCst);
        opening.state.store(state(SCOPE_OPENING, DEAD), SeqCst);
        // Killed while claiming, and while closing: both slots are freed and their bits cleared.
        g.scopes[1].state.store(state(SCOPE_CLAIMED, DEAD), SeqCst);
        g.devices[2].scopes_open.fetch_or(1 << 1, SeqCst);
        g.scopes[2].id.store(8, SeqCst);
        g.scopes[2].state.store(state(SCOPE_CLOSING, DEAD), SeqCst);
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
        let g = GroupScopes(&g);
        let me = actor_token();
        for i in 0..gpumemhook_segment::MAX_GROUP_SCOPES {
            g.open_scope(&format!("s{i}"), 0, me).unwrap();
        }
        let refused = g.open_scope("more", 0, me).unwrap_err().to_string();
        assert!(
            refused.contains("1 \"s0\"") && refused.contains("16 \"s15\""),
            "{refused}"
        );
    }
}

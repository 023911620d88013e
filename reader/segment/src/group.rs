//! The group file's format (`docs/groups.md`): processes of one user that share one exact count,
//! one peak, one ceiling and one emulated card keep them in one shared file, and every member maps
//! it. This module is its one definition and the protocols a member runs on it: claiming a slot,
//! taking and giving bytes under the group's ceiling, folding into group scopes ([`GroupSlots`],
//! the group's side of [`crate::window`]), and sweeping dead members out ([`crate::tally`]). The
//! file itself (its name, creation, checks, locks) is the reader's (`reader/src/group.rs`).
//!
//! Per device it holds the group's `used`, `peak`, allocations, frees and refusals, its ceiling and
//! emulated card; and one slot per member: pid, start ticks, per-device bytes held. A member adds
//! each allocation to the group's `used` with one atomic add (a compare-and-swap loop only under a
//! group ceiling or card) and folds the result into `peak`, so the peak is the exact most all the
//! members held at one instant.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use crate::ceiling::Ceiling;
use crate::layout::{MAX_DEVICES, NO_LIMIT};
use crate::process::token_alive;
use crate::sync::Patience;
use crate::tally::{self, Change, LiveCells, NoSteps, Share, Steps, Tally};
use crate::window::{self, fold_max, SlotError, Slots};

/// `GPUMEMGP`, little-endian: the first word of every group segment.
pub const GROUP_MAGIC: u64 = u64::from_le_bytes(*b"GPUMEMGP");
/// The group segment's layout version; a reader refuses any other.
pub const GROUP_LAYOUT: u32 = 3;
/// The longest group name, in bytes.
pub const GROUP_NAME_LEN: usize = 64;
/// Member slots per group.
pub const MAX_MEMBERS: usize = 256;
/// Scope slots per group (`docs/groups.md`, group scopes).
pub const MAX_GROUP_SCOPES: usize = 16;
/// Bytes of a group scope's label, its final NUL included.
pub const GROUP_SCOPE_LABEL_LEN: usize = 64;
/// The longest a sweep waits, in all, for live members' changes under way (then it leaves the
/// dead for a later sweep: nothing waits long on another process).
const SWEEP_PATIENCE: Duration = Duration::from_millis(5);

/// Slot phases (the low two bits of [`MemberSlot::state`]; the rest is the slot's generation).
const FREE: u64 = 0;
const LIVE: u64 = 2;
const PHASE: u64 = 3;
const GENERATION_ONE: u64 = 4;

#[repr(C)]
pub struct GroupHeader {
    /// [`GROUP_MAGIC`], stored last by the creator (release), so a joiner that sees it sees the rest.
    pub magic: AtomicU64,
    pub layout: AtomicU32,
    pub uid: AtomicU32,
    /// The file's size in bytes ([`GROUP_SIZE`]).
    pub size: AtomicU64,
    pub created_unix_ns: AtomicU64,
    pub name: [AtomicU8; GROUP_NAME_LEN],
    /// The id of the last group scope opened: each open takes the next one, so ids are never reused.
    pub scope_serial: AtomicU64,
    /// The last sweep ticket taken ([`crate::tally`]): each sweep of a device takes the next one.
    pub tickets: AtomicU64,
}

/// One device's figures for the whole group. Each on its own cache lines.
#[repr(C, align(128))]
pub struct GroupDevice {
    /// Bytes all members hold now (reservations included, as a process's `used`).
    pub used: Tally,
    /// Largest `used` ever: the exact joint peak.
    pub peak: AtomicU64,
    /// The group's ceiling, [`NO_LIMIT`] when none.
    pub limit: AtomicU64,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    /// Allocations the group's ceiling or card refused.
    pub refusals: AtomicU64,
    /// The card the group emulates, 0 when none; the first emulating member sets it.
    pub emulated_total: AtomicU64,
    /// The live members' charged overheads (contexts, modules), summed.
    pub overhead: Tally,
    /// One bit per group scope slot that measures this device ([`GroupSlots`]): while it is zero
    /// an allocation folds into no group scope, at the cost of this one load.
    pub scopes_open: AtomicU64,
}

/// One member.
#[repr(C, align(128))]
pub struct MemberSlot {
    /// `generation << 2 | phase`.
    pub state: AtomicU64,
    pub pid: AtomicU32,
    pub start_ticks: AtomicU64,
    pub joined_unix_ns: AtomicU64,
    /// Its changes under way and the devices it touched ([`crate::tally`]).
    pub share: Share,
    /// Device bytes this member holds.
    pub bytes: [AtomicU64; MAX_DEVICES],
    /// The overhead this member added to [`GroupDevice::overhead`].
    pub overhead: [AtomicU64; MAX_DEVICES],
    /// The pid namespace `pid` is a pid of ([`crate::process::pid_namespace_of`]), 0 where the
    /// member did not say: in room the slot's last cache line already had, so the layout is
    /// unchanged for a member that leaves it zero.
    pub pid_namespace: AtomicU64,
}

// The group file's layout ([`GROUP_LAYOUT`]) did not change when `pid_namespace` was added.
const _: () = assert!(std::mem::size_of::<MemberSlot>() == 1152);

/// One group scope ([`GroupSlots`]; `docs/scope-protocol.md` tells its states).
#[repr(C, align(128))]
pub struct GroupScopeSlot {
    /// `actor token << PHASE_BITS | phase`; the actor only in a transient phase.
    pub state: AtomicU64,
    /// The scope's id (from [`GroupHeader::scope_serial`]), set while the slot is claimed.
    pub id: AtomicU64,
    pub device: AtomicU32,
    /// The group's `used` at the open or last reset.
    pub base: AtomicU64,
    /// The largest `used` of the group since then.
    pub peak: AtomicU64,
    pub opened_unix_ns: AtomicU64,
    pub label: [AtomicU8; GROUP_SCOPE_LABEL_LEN],
}

/// The whole group file.
#[repr(C)]
pub struct GroupSegment {
    pub header: GroupHeader,
    pub devices: [GroupDevice; MAX_DEVICES],
    pub members: [MemberSlot; MAX_MEMBERS],
    pub scopes: [GroupScopeSlot; MAX_GROUP_SCOPES],
}

pub const GROUP_SIZE: usize = std::mem::size_of::<GroupSegment>();

impl GroupSegment {
    /// The live members.
    pub fn live_members(&self) -> impl Iterator<Item = &MemberSlot> {
        self.members
            .iter()
            .filter(|m| m.state.load(Ordering::Acquire) & PHASE == LIVE)
    }

    /// The group's name, from its header.
    pub fn name(&self) -> String {
        crate::text::read_text(&self.header.name)
    }

    /// Claims a free slot for process `pid` (started at `ticks`, `pid` a pid of pid namespace
    /// `namespace`, 0 for unknown); gives the slot's index and
    /// whether no other member is live. Sweeps dead members first (`alive` as for
    /// [`GroupSegment::sweep`]). `lock(slot, true)` takes the slot's liveness lock (false when
    /// another holds it), `lock(slot, false)` drops it: the file's locks are the reader's.
    ///
    /// The lock comes first, then the slot's fields, then the state, compare-and-swapped from
    /// free to live: a claimer killed before the swap leaves a free slot whose lock died with it,
    /// and a live slot is always locked by its member.
    pub fn claim(
        &self,
        lock: &dyn Fn(usize, bool) -> bool,
        alive: &dyn Fn(usize) -> Option<bool>,
        pid: u32,
        ticks: u64,
        namespace: u64,
    ) -> Option<(usize, bool)> {
        self.sweep(alive, &mut NoSteps);
        for (index, slot) in self.members.iter().enumerate() {
            let seen = slot.state.load(Ordering::SeqCst);
            if seen & PHASE != FREE || !lock(index, true) {
                continue;
            }
            let earlier_image_here = slot.pid.load(Ordering::Relaxed) == pid
                && slot.start_ticks.load(Ordering::Relaxed) == ticks;
            for cell in slot.bytes.iter().chain(slot.overhead.iter()) {
                cell.store(0, Ordering::SeqCst);
            }
            slot.share.under_way.store(0, Ordering::SeqCst);
            slot.share.devices.store(0, Ordering::SeqCst);
            slot.pid.store(pid, Ordering::Relaxed);
            slot.start_ticks.store(ticks, Ordering::Relaxed);
            slot.pid_namespace.store(namespace, Ordering::Relaxed);
            slot.joined_unix_ns
                .store(crate::process::unix_now_ns(), Ordering::Relaxed);
            let live = (seen & !PHASE).wrapping_add(GENERATION_ONE) | LIVE;
            if slot
                .state
                .compare_exchange(seen, live, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                lock(index, false);
                continue;
            }
            // Alone: no other member is live, and none was this very process in an image it
            // has since replaced with `exec` (that is the same job going on, not a new one).
            let alone = !earlier_image_here
                && self.members.iter().enumerate().all(|(i, m)| {
                    let earlier_image = m.pid.load(Ordering::Relaxed) == pid
                        && m.start_ticks.load(Ordering::Relaxed) == ticks;
                    i == index || (m.state.load(Ordering::SeqCst) & PHASE != LIVE && !earlier_image)
                });
            return Some((index, alone));
        }
        None
    }

    /// Gives back the bytes of every live slot whose lock nobody holds (`alive` asks about slot
    /// N: `Some(false)` is dead; its process died or `exec`ed): each device such a member touched
    /// is settled to the sum of the live members' cells ([`tally::settle`]), then the dead slots
    /// are freed. Bounded ([`SWEEP_PATIENCE`]): what it cannot finish is left for the next sweep,
    /// which finds it the same. Returns how many members were swept out.
    pub fn sweep<S: Steps>(&self, alive: &dyn Fn(usize) -> Option<bool>, steps: &mut S) -> usize {
        let mut dead = [0u64; MAX_MEMBERS];
        let mut devices = 0u64;
        for (index, slot) in self.members.iter().enumerate() {
            let seen = slot.state.load(Ordering::SeqCst);
            if seen & PHASE == LIVE && alive(index) == Some(false) {
                dead[index] = seen;
                devices |= slot.share.devices.load(Ordering::SeqCst);
            }
        }
        if dead.iter().all(|&d| d == 0) {
            return 0;
        }
        let patience = Patience::new(SWEEP_PATIENCE);
        while devices != 0 {
            let device = devices.trailing_zeros() as usize;
            devices &= devices - 1;
            let Some(d) = self.devices.get(device) else {
                continue;
            };
            let ticket = self
                .header
                .tickets
                .fetch_add(1, Ordering::SeqCst)
                .wrapping_add(1);
            let live = self
                .members
                .iter()
                .zip(dead.iter())
                .filter(|(m, &gone)| {
                    let state = m.state.load(Ordering::SeqCst);
                    state & PHASE == LIVE && state != gone
                })
                .map(|(m, _)| LiveCells {
                    share: &m.share,
                    bytes: &m.bytes[device],
                    overhead: &m.overhead[device],
                });
            if !tally::settle(&d.used, &d.overhead, ticket.max(1), live, &patience, steps) {
                return 0;
            }
        }
        self.members
            .iter()
            .zip(dead.iter())
            .filter(|(m, &gone)| {
                gone != 0
                    && m.state
                        .compare_exchange(gone, gone & !PHASE, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
            })
            .count()
    }

    /// The allocation's side: folds the group's `new_used` on `device` into every scope whose bit
    /// is set there. With none open, one load and a predictable branch.
    #[inline(always)]
    pub fn fold_scopes(&self, device: &GroupDevice, new_used: u64) {
        let open = window::read_marks(&device.scopes_open);
        if open != 0 {
            self.fold_into(open, new_used);
        }
    }

    #[cold]
    fn fold_into(&self, open: u64, new_used: u64) {
        window::fold_marked(open, 0, new_used, |slot| {
            self.scopes.get(slot).map(|s| &s.peak)
        });
    }
}

/// A member's change of one of a device's tallies and of its own `cell` there
/// ([`tally::change`], with no observer).
#[inline(always)]
fn member_change(
    tally: &Tally,
    slot: &MemberSlot,
    cell: &AtomicU64,
    device: usize,
    change: Change,
    cap: u64,
) -> Option<u64> {
    tally::change(tally, &slot.share, cell, device, change, cap, &mut NoSteps)
}

impl GroupDevice {
    /// The group's ceiling on this device now: its limit, its card and the members' charged
    /// overheads, under the one rule a process's ceiling follows too ([`Ceiling`]).
    #[inline]
    pub fn ceiling(&self) -> Ceiling {
        let emulated_total = self.emulated_total.load(Ordering::Relaxed);
        Ceiling {
            limit: self.limit.load(Ordering::Relaxed),
            emulated_total,
            // Only a card charges overhead: without one, its 16-byte word is not read at all
            // (an allocation checks the cap every time).
            overhead: if emulated_total == 0 {
                0
            } else {
                self.overhead.get()
            },
        }
    }

    /// The most `used` may reach ([`Ceiling::cap`]).
    #[inline]
    pub fn cap(&self) -> u64 {
        self.ceiling().cap()
    }

    /// Takes `bytes` on device `device` (this one) into the group for the member of `slot`; the
    /// group's new `used`, or `None` when the ceiling or card refuses (then nothing changed).
    /// `used` never passes the cap, even for an instant.
    #[inline]
    pub fn take(&self, slot: &MemberSlot, device: usize, bytes: u64) -> Option<u64> {
        let cell = slot.bytes.get(device)?;
        let new_used = member_change(
            &self.used,
            slot,
            cell,
            device,
            Change::Add(bytes),
            self.cap(),
        )?;
        fold_max(&self.peak, new_used);
        Some(new_used)
    }

    /// Gives back `bytes` on device `device` (this one) the member of `slot` held.
    #[inline]
    pub fn give(&self, slot: &MemberSlot, device: usize, bytes: u64) {
        if let Some(cell) = slot.bytes.get(device) {
            member_change(&self.used, slot, cell, device, Change::Sub(bytes), NO_LIMIT);
        }
    }

    /// Sets the member's charged overhead on device `device` (this one) to `overhead`.
    pub fn charge_overhead(&self, slot: &MemberSlot, device: usize, overhead: u64) {
        let Some(cell) = slot.overhead.get(device) else {
            return;
        };
        let before = cell.load(Ordering::SeqCst);
        let change = if overhead >= before {
            Change::Add(overhead - before)
        } else {
            Change::Sub(before - overhead)
        };
        member_change(&self.overhead, slot, cell, device, change, NO_LIMIT);
    }

    /// What a memory-info query shows for the group ([`Ceiling::view`]): `free` no more than the
    /// group leaves under its cap; `total` the emulated card's, when there is one.
    #[inline]
    pub fn view(&self, free: u64, total: u64) -> (u64, u64) {
        self.ceiling().view(self.used.get(), free, total)
    }

    /// Starts the device's figures afresh for a new job in an ended group: its own ceiling and
    /// card (none where it has none), the peak from what is held now, no counts.
    pub fn start_afresh(&self, limit: Option<u64>, emulated_total: u64) {
        self.limit
            .store(limit.unwrap_or(NO_LIMIT), Ordering::Relaxed);
        self.emulated_total.store(emulated_total, Ordering::Relaxed);
        self.peak.store(self.used.get(), Ordering::SeqCst);
        for count in [&self.allocs, &self.frees, &self.refusals] {
            count.store(0, Ordering::Relaxed);
        }
    }
}

/// The group's scope table as the protocol sees it.
pub struct GroupSlots<'a>(pub &'a GroupSegment);

impl GroupSlots<'_> {
    /// The device slot `index` measures (clamped: the word is in a file anyone may have written).
    fn device(&self, index: usize) -> &GroupDevice {
        let devices = &self.0.devices;
        &devices[(self.0.scopes[index].device.load(SeqCst) as usize).min(devices.len() - 1)]
    }
}

impl Slots for GroupSlots<'_> {
    fn count(&self) -> usize {
        self.0.scopes.len()
    }

    fn state(&self, index: usize) -> &crate::sync::AtomicU64 {
        &self.0.scopes[index].state
    }

    fn mark(&self, index: usize) {
        self.device(index).scopes_open.fetch_or(1 << index, SeqCst);
    }

    fn unmark(&self, index: usize) {
        for device in &self.0.devices {
            device.scopes_open.fetch_and(!(1 << index), SeqCst);
        }
    }

    fn restart(&self, index: usize, _actor: u64) -> std::result::Result<(), SlotError> {
        let slot = &self.0.scopes[index];
        let device = self.device(index);
        window::restart_window(&slot.peak, &slot.base, || device.used.get());
        Ok(())
    }

    fn alive(&self, actor: u64) -> bool {
        token_alive(actor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_words_sit_where_the_readers_check_reads_them() {
        assert_eq!(std::mem::offset_of!(GroupHeader, layout), 8);
        assert_eq!(std::mem::offset_of!(GroupHeader, size), 16);
    }
}

//! Membership of a group (`GPUMEMHOOK_GROUP`, `docs/groups.md`): joining it, and what each
//! allocation and free of this process writes into it. The group file's layout, taking and giving
//! bytes under its ceiling and the sweep of dead members are the segment crate's
//! (`reader/segment/src/group.rs`); opening and joining the file, the reader's
//! (`reader/src/group.rs`).
//!
//! Without a group the hook's hot path checks [`JOINED`] once per allocation ([`take`], at its
//! reservation, which also counts the allocation) and once per free ([`give`]): one load and one
//! predictable branch each. What a group does sits behind that branch, inline: out of line, a
//! member paid 18-34 instructions more per pair for the calls, and the path without a group saved
//! none (measured, BENCHMARKS.md item 14). In a group
//! an allocation adds its bytes to the group's `used` (one atomic add, a compare-and-swap loop under
//! a group ceiling or card) and to this member's slot, counts itself (at its reservation: one the
//! driver then fails is taken out again), and folds the group's peak, and then into
//! every open group scope of the device (`gpumemhook_segment::group`: with none open, one
//! more load and a predictable branch); a free subtracts them. The member's slot lock is taken once, at join.
//!
//! Joining: every process image joins at its first call that counts (an allocation, a free, a
//! memory query, a context charged to an emulated card), not at load, so programs that never use
//! the GPU take no slot; one that cannot join counts alone, said in one line.
//! Fork: a child joins as a member of its own, at its first such call, or never if it never uses
//! CUDA; the atfork handler drops the parent's membership in the child. The slot's lock is pinned
//! to this process image (`gpumemhook_reader::LockAnchor`), which no child inherits, with
//! atfork handlers or without (a raw `clone`, `vfork`): the parent's lock dies with the parent.
//! The member keeps no descriptor, so a program that closes them all stays a member.
//! Exec: the pinned page goes with the old image, so its slot is swept out, and the new image
//! joins again from `GPUMEMHOOK_GROUP` in its environment.

use gpumemhook_reader::{group_stats, open_or_create_group};
use gpumemhook_segment::{current_uid, start_ticks};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering, Ordering::Relaxed};
use std::sync::OnceLock;

use gpumemhook_reader::{GroupOom, Membership};
use gpumemhook_segment::MAX_DEVICES;
use gpumemhook_segment::{GroupDevice, MemberSlot};

use crate::diag::warn;

/// This process's membership: null outside a group; [`PENDING`] or [`JOINING`] until its first
/// CUDA call has joined; then the member, or null again when joining failed.
static JOINED: AtomicPtr<Member> = AtomicPtr::new(std::ptr::null_mut());
/// [`JOINED`] while this image has a group to join and no call has tried yet.
const PENDING: *mut Member = std::ptr::without_provenance_mut(1);
/// [`JOINED`] while one thread joins (the others wait for it: joining is bounded).
const JOINING: *mut Member = std::ptr::without_provenance_mut(2);
/// The group this process joins, set once at start-up ([`expect`]).
static PLAN: OnceLock<Plan> = OnceLock::new();

thread_local! {
    /// True on the thread that is joining, whose own re-entrant calls pass by the group.
    static JOINING_HERE: Cell<bool> = const { Cell::new(false) };
}

/// A joined group and this member's slot in it.
pub struct Member {
    of: Membership,
}

/// What joining needs: the group, its ceiling, and the emulated card of each device.
pub struct Plan {
    pub dir: PathBuf,
    pub name: String,
    pub limit: Option<u64>,
    pub emulated_totals: [u64; MAX_DEVICES],
}

/// Start-up: this process image is to join `plan`'s group at its first CUDA call (not at load: a
/// shell or launcher that never uses the GPU takes no member slot and pays nothing).
pub fn expect(plan: Plan) {
    if PLAN.set(plan).is_ok() {
        JOINED.store(PENDING, Ordering::Release);
        // SAFETY: plain C callbacks registered once; they only touch this module's statics.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), None) };
    }
}

/// Whether [`before_fork`] holds [`JOINED`] at [`JOINING`] for the fork under way.
static HELD_FOR_FORK: AtomicBool = AtomicBool::new(false);

/// Before a fork: no join may be under way while the process is copied. A joining thread holds its
/// slot's lock on a descriptor until it pins it to this image and closes it; a child copied in
/// between would keep that descriptor, and with it the parent's lock, so a dead parent would look
/// alive. So this waits for a join under way
/// (bounded: joining is) and, while the fork runs, holds a pending join off by marking it as under
/// way itself ([`after_fork_in_parent`] and the child's [`forked`] put it back).
extern "C" fn before_fork() {
    if JOINING_HERE.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    loop {
        match JOINED.load(Ordering::Acquire) {
            JOINING => std::thread::yield_now(),
            PENDING => {
                if JOINED
                    .compare_exchange(PENDING, JOINING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    HELD_FOR_FORK.store(true, Ordering::Release);
                    return;
                }
            }
            _ => return,
        }
    }
}

/// After a fork, in the parent: a pending join held off by [`before_fork`] is pending again.
extern "C" fn after_fork_in_parent() {
    if HELD_FOR_FORK.swap(false, Ordering::AcqRel) {
        JOINED.store(PENDING, Ordering::Release);
    }
}

/// The membership, if this process image is in a group (joining it on the first call that asks).
#[inline(always)]
fn joined() -> Option<&'static Member> {
    let p = JOINED.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    if p.addr() <= JOINING.addr() {
        return join_now();
    }
    // SAFETY: any other value of JOINED points at a leaked `Member` that lives for the rest of the
    // process.
    unsafe { p.as_ref() }
}

/// The first call of this image that asks for its membership joins (the others wait for it).
#[cold]
#[inline(never)]
fn join_now() -> Option<&'static Member> {
    loop {
        let p = JOINED.load(Ordering::Acquire);
        if p == PENDING {
            // Marked before the swap: a signal handler interrupting this thread from here on must
            // pass by the group, never wait for a join it interrupted.
            let _ = JOINING_HERE.try_with(|c| c.set(true));
            if JOINED
                .compare_exchange(PENDING, JOINING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                let _ = JOINING_HERE.try_with(|c| c.set(false));
                continue;
            }
            let member = PLAN.get().and_then(join);
            let _ = JOINING_HERE.try_with(|c| c.set(false));
            let published =
                member.map_or(std::ptr::null_mut(), |m| m as *const Member as *mut Member);
            JOINED.store(published, Ordering::Release);
            return member;
        }
        if p == JOINING {
            if JOINING_HERE.try_with(Cell::get).unwrap_or(true) {
                return None;
            }
            std::thread::yield_now();
            continue;
        }
        // SAFETY: null, or a leaked `Member` as in `joined`.
        return unsafe { p.as_ref() };
    }
}

impl Member {
    #[inline(always)]
    fn device(&self, device: u32) -> Option<(&'static GroupDevice, &'static MemberSlot)> {
        let group = self.of.group;
        Some((group.devices.get(device as usize)?, self.of.slot()))
    }
}

/// Joins the group `plan` names; `None` (said in one line) when it cannot: then this process
/// counts alone. Ending it instead would make the hook the reason a running job fails.
fn join(plan: &Plan) -> Option<&'static Member> {
    let cannot = |why: &dyn std::fmt::Display| {
        warn(&format!(
            "cannot join group {}: {why}; this process counts alone, outside the group's figures, \
             ceiling and card",
            plan.name
        ));
    };
    let uid = current_uid();
    let mapping = match open_or_create_group(&plan.dir, uid, &plan.name) {
        Ok(m) => m,
        Err(e) => {
            cannot(&e);
            return None;
        }
    };
    let pid = std::process::id();
    let ticks = start_ticks(pid).unwrap_or(0);
    let of = match mapping.join(pid, ticks) {
        Ok(of) => of,
        Err(e) => {
            cannot(&e);
            return None;
        }
    };
    let segment = of.group;
    for (device, total) in segment.devices.iter().zip(plan.emulated_totals) {
        if of.alone {
            // Every earlier member has ended: this job starts the group afresh, with its own
            // ceiling and card, not the last job's.
            device.start_afresh(plan.limit, total);
            continue;
        }
        if let Some(limit) = plan.limit {
            device.limit.store(limit, Relaxed);
        }
        if total != 0 {
            let _ = device
                .emulated_total
                .compare_exchange(0, total, Relaxed, Relaxed);
        }
    }
    Some(Box::leak(Box::new(Member { of })))
}

/// Takes an allocation's `bytes` on `device` into the group and, when `counted` (the allocation's
/// own reservation, not more bytes for one already taken: a pitch's padding), counts the
/// allocation; false when the group's ceiling or card refuses it (then nothing changed, and the
/// refusal is counted). Outside a group, true.
///
/// The allocation is counted here, at its reservation, so that it costs no second check of
/// [`JOINED`] at the record; one the driver then fails, or that is given back, is taken out again
/// by [`cancel`].
#[inline(always)]
pub fn take(device: u32, bytes: u64, counted: bool) -> bool {
    match joined() {
        None => true,
        Some(member) => member_take(member, device, bytes, counted),
    }
}

#[inline(always)]
fn member_take(member: &Member, device: u32, bytes: u64, counted: bool) -> bool {
    let Some((group, slot)) = member.device(device) else {
        return true;
    };
    if let Some(new_used) = group.take(slot, device as usize, bytes) {
        return taken(member, group, new_used, counted);
    }
    take_after_sweep(member, group, slot, device, bytes, counted)
}

/// What follows a successful take: the group scopes, and the allocation's count.
#[inline(always)]
fn taken(member: &Member, group: &GroupDevice, new_used: u64, counted: bool) -> bool {
    member.of.group.fold_scopes(group, new_used);
    if counted {
        group.allocs.fetch_add(1, Relaxed);
    }
    true
}

/// A refusal may be owed to a dead member's bytes: sweep, and try once more.
#[cold]
fn take_after_sweep(
    member: &Member,
    group: &GroupDevice,
    slot: &MemberSlot,
    device: u32,
    bytes: u64,
    counted: bool,
) -> bool {
    member.of.sweep();
    if let Some(new_used) = group.take(slot, device as usize, bytes) {
        return taken(member, group, new_used, counted);
    }
    group.refusals.fetch_add(1, Relaxed);
    false
}

/// Gives back `bytes` on `device` (part of a reservation whose allocation stays, or a free when
/// `freed`).
#[inline(always)]
pub fn give(device: u32, bytes: u64, freed: bool) {
    if let Some(member) = joined() {
        if let Some((group, slot)) = member.device(device) {
            group.give(slot, device as usize, bytes);
            if freed {
                group.frees.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Gives back the whole reservation, `bytes` on `device`, of an allocation [`take`] counted that
/// did not happen (the driver failed it, or it was given back), and takes the count out again.
#[cold]
pub fn cancel(device: u32, bytes: u64) {
    if let Some(member) = joined() {
        if let Some((group, slot)) = member.device(device) {
            group.give(slot, device as usize, bytes);
            group.allocs.fetch_sub(1, Relaxed);
        }
    }
}

/// The group's view of a memory-info answer of `device` (`free`, `total` after the process's own
/// view): no more free than the group leaves, the card's total under a group card. At a query
/// (never per allocation), dead members are swept out first.
#[cold]
pub fn view(device: u32, free: u64, total: u64) -> (u64, u64) {
    match joined() {
        None => (free, total),
        Some(member) => {
            member.of.sweep();
            member
                .device(device)
                .map_or((free, total), |(group, _)| group.view(free, total))
        }
    }
}

/// True when this process is in a group whose ceiling or card applies to `device`.
pub fn has_view(device: u32) -> bool {
    joined()
        .and_then(|m| m.device(device))
        .is_some_and(|(group, _)| group.cap() != gpumemhook_segment::NO_LIMIT)
}

/// Sets this member's charged overhead of `device` (the emulated card's context and modules).
#[cold]
pub fn charge_overhead(device: u32, overhead: u64) {
    if let Some(member) = joined() {
        if let Some((group, slot)) = member.device(device) {
            group.charge_overhead(slot, device as usize, overhead);
        }
    }
}

/// The group's part of an out-of-memory report on `device`.
#[cold]
pub fn out_of_memory(device: u32) -> Option<GroupOom> {
    let member = joined()?;
    let stats = group_stats(member.of.group, device);
    let me = std::process::id();
    Some(GroupOom {
        name: member.of.group.name(),
        used: stats.used,
        limit: stats.limit,
        others: stats.members.into_iter().filter(|m| m.pid != me).collect(),
    })
}

/// In a forked child (async-signal-safe: loads and stores): the parent's membership is not the
/// child's; the child joins as a member of its own at its first CUDA call. The child holds
/// nothing of the parent's lock (it is pinned to the parent's image), so nothing is closed.
pub fn forked() {
    HELD_FOR_FORK.store(false, Ordering::Relaxed);
    let next = if PLAN.get().is_some() {
        PENDING
    } else {
        std::ptr::null_mut()
    };
    JOINED.store(next, Ordering::Release);
}

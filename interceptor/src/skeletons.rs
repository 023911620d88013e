//! Policy, the shapes every body takes: a device allocation at the driver (which device, reserve
//! under the ceiling, call, record or refuse), a managed or pinned-host allocation, a free, and the
//! ceiling's view of a memory-info answer. The bodies (`crate::driver_hooks`,
//! `crate::runtime_hooks`) fill them in; each is given `call`, the row's real function already
//! bound to the caller's arguments (`crate::exports`).
//!
//! The hot path: no allocation (beyond the ledger's rare growth), no global lock, no environment
//! read, no formatting, no panic. Anything the hook does not understand (a NULL out-pointer, no
//! current context, a device past the segment, an unknown address) goes straight to the real
//! function and is not counted.

use std::ffi::c_int;

use gpumemhook_segment::{MemKind, Segment};

use crate::account::{
    counted_device, failed, module_of, record_device_alloc, record_free, record_side, refused,
};
use crate::driver::{self, DriverFn};
use crate::emulation;
use crate::ffi::*;
use crate::group;
use crate::guard;
use crate::ledger::Key;
use crate::modules::Caller;
use crate::runtime::RuntimeFn;
use crate::state;
use crate::table::Entry;
use crate::trace::{EntryCode, RUNTIME_BASE};

/// The timeline's code of a driver entry point.
#[inline(always)]
pub fn code(e: Entry<DriverFn>) -> EntryCode {
    e.function as EntryCode
}

/// The timeline's code of a runtime entry point.
#[inline(always)]
pub fn rt_code(e: Entry<RuntimeFn>) -> EntryCode {
    RUNTIME_BASE + e.function as EntryCode
}

/// Gives back reserved `bytes` of `device` without counting a failure (process and group): part of
/// a reservation whose allocation stays.
#[inline(always)]
pub fn unreserve(segment: &Segment, device: u32, bytes: u64) {
    if let Some(counters) = segment.device(device) {
        counters.unreserve(bytes);
        group::give(device, bytes, false);
    }
}

/// Gives back the whole reservation, `bytes` of `device`, of an allocation that does not happen,
/// without counting a failure: in a group, its count goes too (`group::cancel`).
#[cold]
pub fn cancel(segment: &Segment, device: u32, bytes: u64) {
    if let Some(counters) = segment.device(device) {
        counters.unreserve(bytes);
        group::cancel(device, bytes);
    }
}

/// A device allocation at the driver: reserve under the ceiling, call, then record. The driver is
/// never called for a refused allocation.
#[inline(always)]
pub fn device_alloc(
    caller: Caller,
    entry: EntryCode,
    key: impl FnOnce() -> Key,
    bytes: usize,
    device: impl FnOnce(&state::Active) -> Option<u32>,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    let bytes = bytes as u64;
    device_alloc_settled(caller, entry, bytes, device, call, |_, _, _| {
        Some((key(), bytes))
    })
}

/// The body of every device allocation at the driver: reserve `estimate` bytes under the ceiling,
/// call, then `settle` (given the state, the device and the module charged) says what was
/// allocated (`(key, bytes)`, having adjusted the reservation to `bytes`), or `None` when it gave
/// the allocation back and refused it (then the call answers out-of-memory).
///
/// The allocation is charged to the module of the runtime's caller inside a runtime frame, else to
/// the module of this wrapper's own `caller`.
#[inline(always)]
pub fn device_alloc_settled(
    caller: Caller,
    entry: EntryCode,
    estimate: u64,
    device: impl FnOnce(&state::Active) -> Option<u32>,
    call: impl FnOnce() -> CuResult,
    settle: impl FnOnce(&state::Active, u32, u8) -> Option<(Key, u64)>,
) -> CuResult {
    let frame = guard::mark_accounted();
    let Some(active) = state::active() else {
        return call();
    };
    let Some(dev) = counted_device(device(active)) else {
        return call();
    };
    let module = module_of(frame.module, caller, active.segment);
    let counters = &active.segment.devices[dev as usize];
    if emulation::emulated(counters) {
        emulation::first_contact(active.segment, dev);
    }
    let ticket = active.segment.scope_ticket(dev);
    if admit(
        active,
        entry,
        dev,
        Reserve::Before(estimate),
        estimate,
        module,
        || {},
    )
    .is_none()
    {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = call();
    if rc != CUDA_SUCCESS {
        failed(active, entry, dev, estimate, module, rc);
        return rc;
    }
    let Some((key, bytes)) = settle(active, dev, module) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    record_device_alloc(active, entry, key, dev, bytes, ticket, module);
    driver::learn_device_count();
    rc
}

/// The bytes [`admit`] reserves, and when against the real call.
#[derive(Clone, Copy)]
pub enum Reserve {
    /// Before the call: nothing is held yet.
    Before(u64),
    /// After a successful call: the process already holds these bytes.
    After(u64),
    /// After a successful call, more bytes for an allocation already reserved and counted (a
    /// pitch's padding): the process already holds them.
    Padding(u64),
}

/// The one refusal: reserves `reserve`'s bytes more on `dev` under the ceiling (on an emulated card the
/// overhead is measured again before a refusal is final, `emulation::retry_refusal`), or refuses:
/// reports `reported` bytes refused (what the caller asked for, which may be more than this
/// reservation) and runs `give_back` (what the caller already holds: an earlier reservation, an
/// allocation made before the count). [`Reserve::After`] when the driver already made them (a
/// runtime allocation counted after the fact), [`Reserve::Padding`] for a pitch's padding: the new
/// measurement must not take them for overhead. Every body's reservation comes here, before the call or after it, so an
/// allocation is judged the same whichever function made it.
#[inline(always)]
pub fn admit(
    active: &state::Active,
    entry: EntryCode,
    dev: u32,
    reserve: Reserve,
    reported: u64,
    module: u8,
    give_back: impl FnOnce(),
) -> Option<u64> {
    let counters = &active.segment.devices[dev as usize];
    // `counted`: the allocation's own reservation, which the group counts as an allocation.
    let (bytes, held_uncounted, counted) = match reserve {
        Reserve::Before(bytes) => (bytes, 0, true),
        Reserve::After(bytes) => (bytes, bytes, true),
        Reserve::Padding(bytes) => (bytes, bytes, false),
    };
    // `move`: the retry holds copies, not references, so nothing is spilled to the stack for it on
    // the path where the reservation fits (measured: 1 instruction fewer per pair than before
    // the one refusal, 6 fewer than capturing by reference).
    let admitted = counters
        .reserve_or(bytes, move || {
            emulation::retry_refusal(active.segment, dev, held_uncounted)
        })
        .and_then(|new_used| {
            // The group's ceiling second (one predictable branch without a group, the only one of
            // an allocation): a refusal there gives the process's reservation back and counts as
            // this process's refusal too.
            if group::take(dev, bytes, counted) {
                return Some(new_used);
            }
            counters.refuse_reserved(bytes);
            None
        });
    if admitted.is_none() {
        give_back();
        refused(active, entry, dev, reported, module);
    }
    admitted
}

/// A managed or pinned-host allocation: no ceiling, counted in its own fields after success.
#[inline(always)]
pub fn side_alloc(
    entry: EntryCode,
    kind: MemKind,
    key: impl FnOnce() -> Key,
    bytes: u64,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    guard::mark_accounted();
    let rc = call();
    if rc == CUDA_SUCCESS {
        if let Some(active) = state::active() {
            record_side(active, entry, kind, key(), bytes);
        }
    }
    rc
}

/// A free of any kind. The ledger entry is taken before the real call (so the address cannot be
/// reused and recorded by another thread in between) and put back if the driver refuses the free.
/// NULL and unknown addresses reach the driver and count nothing.
#[inline(always)]
pub fn release(code: EntryCode, key: Key, call: impl FnOnce() -> c_int) -> c_int {
    if guard::mark_accounted().taken {
        return call();
    }
    release_taking(code, key, call, false)
}

/// The body of [`release`]; `runtime` is true in a runtime free shadow, which runs the real call in
/// a frame telling the driver wrapper beneath that the entry is already taken.
#[inline(always)]
pub fn release_taking(
    code: EntryCode,
    key: Key,
    call: impl FnOnce() -> c_int,
    runtime: bool,
) -> c_int {
    let Some(active) = state::active() else {
        return call();
    };
    let entry = match key {
        Key::Pointer(0) => None,
        k => active.ledger.take(k, active.segment),
    };
    let rc = if runtime {
        let _frame = guard::RuntimeFrame::enter_taken();
        call()
    } else {
        call()
    };
    if let Some(entry) = entry {
        if rc == CUDA_SUCCESS {
            record_free(active, code, key, entry);
        } else {
            active.ledger.restore(key, entry, active.segment);
        }
    }
    rc
}

/// Applies the ceiling's view to a memory-info answer of `device`.
pub fn ceiling_view(device: Option<u32>, free: *mut usize, total: *mut usize) {
    let Some(active) = state::active() else {
        return;
    };
    let Some(dev) = counted_device(device) else {
        return;
    };
    let counters = &active.segment.devices[dev as usize];
    if emulation::emulated(counters) && !free.is_null() {
        // A memory-info query (it needs a context): frameworks size their pools from it before
        // they allocate, so the context is charged from the first answer on.
        emulation::memory_query(active.segment, dev);
    }
    // SAFETY: the caller passed these out-pointers and the real call just wrote through them; NULL
    // ones are skipped.
    unsafe {
        let real_free = if free.is_null() {
            u64::MAX
        } else {
            *free as u64
        };
        let real_total = if total.is_null() {
            u64::MAX
        } else {
            *total as u64
        };
        let (f, t) = counters.ceiling_view(real_free, real_total);
        let (f, t) = crate::group::view(dev, f, t);
        if !free.is_null() {
            *free = f as usize;
        }
        if !total.is_null() {
            *total = t as usize;
        }
    }
}

/// `cuMemGetInfo_v2` and `cudaMemGetInfo`: the current device under the ceiling's view.
pub fn mem_get_info<F>(
    _: Entry<F>,
    call: impl FnOnce() -> c_int,
    free: *mut usize,
    total: *mut usize,
) -> c_int {
    let rc = call();
    if rc == CUDA_SUCCESS {
        ceiling_view(driver::current_device(), free, total);
    }
    rc
}

//! Counting: what an allocation the driver made, one it failed, one the ceiling refused, and a free
//! change in the ledger, the device's counters (and open scopes) and the timeline. The policy
//! (`crate::skeletons` and the bodies) decides when; this module is the one place that says what is written.

use std::sync::atomic::Ordering::Relaxed;

use gpumemhook_reader::EventKind;
use gpumemhook_segment::NO_LIMIT;
use gpumemhook_segment::{Change, MemKind, Segment, MAX_DEVICES};

use crate::ledger::{self, Entry, Key};
use crate::state::Active;
use crate::trace::{self, EntryCode, NO_MODULE};
use crate::{driver, group};
use crate::{modules, report, stacks};

/// The ceiling of `device` in force now, for the timeline (under emulation, the card less its
/// overhead, when that is lower).
#[inline(always)]
pub fn limit_of(segment: &Segment, device: u32) -> u64 {
    segment
        .device(device)
        .map_or(NO_LIMIT, |c| c.allocation_cap())
}

#[inline(always)]
pub fn counted_device(device: Option<u32>) -> Option<u32> {
    device.filter(|&d| (d as usize) < MAX_DEVICES)
}

/// The module charged with a device allocation: the runtime frame's (the runtime's caller) inside
/// one, else the caller's own.
#[inline(always)]
pub fn module_of(frame_module: Option<u8>, caller: modules::Caller, segment: &Segment) -> u8 {
    match frame_module {
        Some(m) => m,
        None => modules::slot_of(caller.0, segment),
    }
}

/// Records a device allocation the driver made (its `bytes` reserved under the ceiling): its
/// ledger entry (charging `module`), the counters and open scopes (see `Segment::commit_alloc` for
/// `ticket`), and the timeline, whose record carries the `used` this commit made.
#[inline(always)]
pub fn record_device_alloc(
    active: &Active,
    entry: EntryCode,
    key: Key,
    dev: u32,
    bytes: u64,
    ticket: u64,
    module: u8,
) {
    if key.value() == 0 {
        null_address(active, entry, dev, bytes);
        return;
    }
    let site = stacks::site(bytes);
    stacks::charge(site, bytes, active.segment);
    // A key the ledger cannot hold (no memory to grow) is still counted: the report then shows
    // more in use, never less.
    active.ledger.insert(
        key,
        Entry {
            bytes,
            device: dev,
            kind: MemKind::Device,
            module,
            born_ms: ledger::birth_stamp(),
            site,
        },
        active.segment,
    );
    // The group counted the allocation at its reservation (`group::take`): no check of it here.
    let change = active.segment.commit_alloc(dev, bytes, ticket);
    trace::record(active.segment, || trace::CountedEvent {
        kind: EventKind::Alloc,
        entry,
        device: dev,
        bytes,
        used: change.used,
        order: change.number,
        address: key.value(),
        mem: MemKind::Device,
        limit: limit_of(active.segment, dev),
        module,
        site,
    });
}

/// An allocation answered with success and address (or handle) 0. Nothing could free it (a free of
/// 0 frees nothing), so it is not counted in any figure: the reservation is given back, and no
/// allocation, module or timeline event is recorded. For 0 bytes that is the runtime's documented
/// answer (`cudaMalloc(&p, 0)` gives NULL; PyTorch without its cache asks for it), said nowhere;
/// for more it is a faulty driver, said once.
#[cold]
fn null_address(active: &Active, entry: EntryCode, device: u32, bytes: u64) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Some(counters) = active.segment.device(device) {
        counters.unreserve(bytes);
        group::cancel(device, bytes);
    }
    if bytes > 0 && !SAID.swap(true, Relaxed) {
        crate::diag::warn(&format!(
            "{} returned success with a null address for {bytes} bytes on device {device}: not \
             counted (nothing can free it); further ones are not said",
            trace::entry_name(entry)
        ));
    }
}

/// Gives back the reservation of an allocation the driver failed with `rc`, and counts and records
/// it; the driver running out of memory writes the out-of-memory report.
#[cold]
pub fn failed(active: &Active, entry: EntryCode, device: u32, bytes: u64, module: u8, rc: i32) {
    let Some(counters) = active.segment.device(device) else {
        return;
    };
    counters.cancel(bytes);
    group::cancel(device, bytes);
    missed(active, EventKind::Failed, entry, device, bytes, module);
    if rc == crate::ffi::CUDA_ERROR_OUT_OF_MEMORY {
        out_of_memory(active, entry, device, bytes, module, "driver");
    }
}

/// Marks the device touched and records an allocation that did not happen (refused or failed) on
/// the timeline, at the device's `used` now.
fn missed(active: &Active, kind: EventKind, entry: EntryCode, device: u32, bytes: u64, module: u8) {
    let segment = active.segment;
    segment.mark_touched(device);
    let used = segment.device(device).map_or(0, |c| c.used.load(Relaxed));
    trace::record(segment, || trace::CountedEvent {
        kind,
        entry,
        device,
        bytes,
        used,
        order: 0,
        address: 0,
        mem: MemKind::Device,
        limit: limit_of(segment, device),
        module,
        site: stacks::site(bytes),
    });
}

/// The driver ran out of memory where only the runtime saw it (its error, after the fact).
#[cold]
pub fn failed_at_runtime(active: &Active, entry: EntryCode, bytes: u64, module: u8) {
    let device = counted_device(driver::current_device()).unwrap_or(0);
    out_of_memory(active, entry, device, bytes, module, "driver");
}

/// Counts and records an allocation the ceiling refused, and writes the out-of-memory report.
#[cold]
pub fn refused(active: &Active, entry: EntryCode, device: u32, bytes: u64, module: u8) {
    missed(active, EventKind::Denied, entry, device, bytes, module);
    out_of_memory(active, entry, device, bytes, module, "ceiling");
}

/// Writes the out-of-memory report (the first time, when one was asked for).
#[cold]
fn out_of_memory(
    active: &Active,
    entry: EntryCode,
    device: u32,
    bytes: u64,
    module: u8,
    reason: &str,
) {
    report::out_of_memory(
        active.segment,
        active.segment_path().as_deref(),
        &active.ledger,
        || gpumemhook_reader::OomInfo {
            device,
            bytes,
            entry: trace::entry_name(entry).to_string(),
            reason: reason.to_string(),
            used: active
                .segment
                .device(device)
                .map_or(0, |c| c.used.load(Relaxed)),
            limit: active.segment.device(device).and_then(|c| {
                let cap = c.allocation_cap();
                (cap != NO_LIMIT).then_some(cap)
            }),
            module: modules::file_names().of(module).to_string(),
            site: stacks::describe(stacks::site(bytes)),
            group: group::out_of_memory(device),
        },
    );
}

/// Counts a managed or pinned host allocation in its own fields (managed: on the current device).
pub fn record_side(active: &Active, entry: EntryCode, kind: MemKind, key: Key, bytes: u64) {
    let device = match kind {
        MemKind::Managed => counted_device(driver::current_device()).unwrap_or(0),
        _ => 0,
    };
    active.ledger.insert(
        key,
        Entry {
            bytes,
            device,
            kind,
            module: NO_MODULE,
            born_ms: ledger::birth_stamp(),
            site: 0,
        },
        active.segment,
    );
    match kind {
        MemKind::Managed => active.segment.add_managed(device, bytes),
        MemKind::HostPinned => active.segment.add_host_pinned(bytes),
        MemKind::Device => {}
    }
    trace::record(active.segment, || trace::CountedEvent {
        kind: EventKind::Alloc,
        entry,
        device,
        bytes,
        used: 0,
        order: 0,
        address: key.value(),
        mem: kind,
        limit: limit_of(active.segment, device),
        module: NO_MODULE,
        site: 0,
    });
}

/// Takes a freed allocation out of its counters; returns the change of the device's `used` (none
/// for the kinds that are not device memory).
#[inline(always)]
fn uncount(segment: &Segment, entry: Entry) -> Change {
    match entry.kind {
        MemKind::Device => {
            group::give(entry.device, entry.bytes, true);
            segment
                .device(entry.device)
                .map_or(Change::default(), |c| c.release(entry.bytes))
        }
        MemKind::Managed => {
            segment.sub_managed(entry.device, entry.bytes);
            Change::default()
        }
        MemKind::HostPinned => {
            segment.sub_host_pinned(entry.bytes);
            Change::default()
        }
    }
}

/// Takes a freed allocation (its ledger entry already taken) out of its counters and records the
/// free.
#[inline(always)]
pub fn record_free(active: &Active, code: EntryCode, key: Key, entry: Entry) {
    let change = uncount(active.segment, entry);
    stacks::discharge(entry.site, entry.bytes, active.segment);
    trace::record(active.segment, || trace::CountedEvent {
        kind: EventKind::Free,
        entry: code,
        device: entry.device,
        bytes: entry.bytes,
        used: change.used,
        order: change.number,
        address: key.value(),
        mem: entry.kind,
        limit: limit_of(active.segment, entry.device),
        module: if entry.kind == MemKind::Device {
            entry.module
        } else {
            NO_MODULE
        },
        site: entry.site,
    });
}

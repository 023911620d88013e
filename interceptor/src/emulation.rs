//! Emulating a smaller card (`GPUMEMHOOK_EMULATE`): the policy for charging the process's overhead.
//!
//! A process holds device memory that no allocation call accounts for: its context and its loaded
//! modules. On the emulated card that memory lives inside the card's total, so it is charged there:
//! the overhead is NVML's per-process figure for this process minus the bytes the hook counts, and
//! allocations may use the card's total less it ([`DeviceCounters::allocation_cap`]).
//!
//! Measured off the allocation path, with NVML (see [`crate::nvml::process_used`]): at first contact
//! with each emulated device (its first allocation or memory-info query, when its context surely
//! exists), after module loads (`cuModuleLoad*`, `cuLibraryLoad*`; at most every 50 ms, a load in
//! between marking the figure stale for the next memory-info query), and when a reservation would
//! be refused ([`retry_refusal`]: the allocation is then tried once more against the fresh figure;
//! the refusal itself is counted by the reader's `DeviceCounters::reserve_or`, its one owner).
//! Never per allocation.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use gpumemhook_segment::DeviceCounters;
use gpumemhook_segment::{Segment, MAX_DEVICES};

use crate::diag::warn;
use crate::nvml::{self, Unmeasured};
use crate::trace::now_ns;

/// Devices measured at first contact (in this process image).
static MEASURED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// Devices with a module load not measured yet (skipped by the throttle below).
static STALE: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// When each device was last measured, monotonic nanoseconds.
static LAST_NS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Module loads come in bursts (a framework registering hundreds of kernel images at start, or
/// loading them lazily one by one): within this long of the last measurement, a load only marks the
/// figure stale, and the next memory query or refusal measures it.
const MODULE_THROTTLE_NS: u64 = 50_000_000;
/// The "overhead is not charged" line was said.
static SAID: AtomicBool = AtomicBool::new(false);

/// True when `counters` belongs to an emulated device.
#[inline(always)]
pub fn emulated(counters: &DeviceCounters) -> bool {
    counters.emulated_total.load(Relaxed) != 0
}

/// At an allocation on emulated `device`: measure once, the first time.
#[inline(always)]
pub fn first_contact(segment: &Segment, device: u32) {
    if let Some(flag) = MEASURED.get(device as usize) {
        if !flag.load(Relaxed) {
            first_contact_slow(segment, device, flag);
        }
    }
}

/// At a memory-info query on emulated `device`: measure the first time, and after module loads
/// the throttle left unmeasured, so the answer is fresh.
#[cold]
pub fn memory_query(segment: &Segment, device: u32) {
    first_contact(segment, device);
    if STALE
        .get(device as usize)
        .is_some_and(|stale| stale.swap(false, Relaxed))
    {
        measure(segment, device);
    }
}

#[cold]
fn first_contact_slow(segment: &Segment, device: u32, flag: &AtomicBool) {
    if !flag.swap(true, Relaxed) {
        measure(segment, device);
    }
}

/// Asked when a reservation on `device` would be refused (`DeviceCounters::reserve_or`): on an
/// emulated device, measures the overhead again (it may have shrunk) and says whether to try once
/// more. Never asked for a reservation that fits. `held_uncounted` is what the process already
/// holds of the allocation being judged (one counted after the driver made it), which NVML sees
/// and the counters do not yet: it is not overhead.
#[cold]
pub fn retry_refusal(segment: &Segment, device: u32, held_uncounted: u64) -> bool {
    emulated(&segment.devices[device as usize]) && measure_holding(segment, device, held_uncounted)
}

/// After a module load on `device`: the context grew.
#[cold]
pub fn module_loaded(segment: &Segment, device: Option<u32>) {
    if let Some(d) = device.filter(|&d| (d as usize) < MAX_DEVICES) {
        if emulated(&segment.devices[d as usize]) {
            if now_ns().saturating_sub(LAST_NS[d as usize].load(Relaxed)) < MODULE_THROTTLE_NS {
                STALE[d as usize].store(true, Relaxed);
            } else {
                measure(segment, d);
            }
        }
    }
}

/// Measures and stores the overhead of emulated `device`; false when it could not be measured
/// (said once per process).
#[cold]
pub fn measure(segment: &Segment, device: u32) -> bool {
    measure_holding(segment, device, 0)
}

/// [`measure`], less `held_uncounted` bytes the caller holds and has not counted yet.
#[cold]
fn measure_holding(segment: &Segment, device: u32, held_uncounted: u64) -> bool {
    let Some(counters) = segment.device(device) else {
        return false;
    };
    if let Some(last) = LAST_NS.get(device as usize) {
        last.store(now_ns(), Relaxed);
    }
    match nvml::process_used(device) {
        Ok(process_bytes) => {
            // `claimed`, not `used`: an allocation the driver made and the hook has not committed
            // yet (a pitched one whose padding is being admitted) is in NVML's figure already.
            let counted = counters
                .claimed
                .load(Relaxed)
                .saturating_add(held_uncounted);
            let overhead = process_bytes.saturating_sub(counted);
            counters.overhead.store(overhead, Relaxed);
            crate::group::charge_overhead(device, overhead);
            true
        }
        Err(why) => {
            if !SAID.swap(true, Relaxed) {
                let reason = match why {
                    Unmeasured::NoLibrary => format!(
                        "NVML ({}) cannot be loaded",
                        gpumemhook_reader::env::NVML_LIB_NAME.to_string_lossy()
                    ),
                    Unmeasured::InitFailed(rc) => format!("nvmlInit_v2 failed ({rc})"),
                    Unmeasured::NoDevice => format!("NVML does not know CUDA device {device}"),
                    Unmeasured::QueryFailed(rc) => {
                        format!("NVML's per-process query failed ({rc})")
                    }
                    Unmeasured::NotListed => {
                        "NVML does not list this process (another PID namespace?)".to_string()
                    }
                };
                warn(&format!(
                    "emulating a card, but {reason}: the context's own memory is not charged, so \
                     allocations get up to the whole card"
                ));
            }
            false
        }
    }
}

/// In a forked child (plain stores only): its context is its own, so it is measured again.
pub fn forked() {
    for flag in MEASURED.iter().chain(STALE.iter()) {
        flag.store(false, Relaxed);
    }
    for last in &LAST_NS {
        last.store(0, Relaxed);
    }
    nvml::forked();
}

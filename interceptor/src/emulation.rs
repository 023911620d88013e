//! Emulating a smaller card (`GPUMEMHOOK_EMULATE`): the policy for charging the process's overhead.
//!
//! A process holds device memory that no allocation call accounts for: its context and its loaded
//! modules. On the emulated card that memory lives inside the card's total, so it is charged there:
//! the overhead is NVML's per-process figure for this process minus the bytes the hook counts, and
//! allocations may use the card's total less it ([`DeviceCounters::allocation_cap`]).
//!
//! Measured off the allocation path, with NVML (see [`crate::nvml::process_used`]): at first contact
//! with each emulated device (its first allocation, when its context surely exists), after each
//! module load (`cuModuleLoad*`, `cuLibraryLoad*`), and before a refusal (then the allocation is
//! tried once more against the fresh figure). Never per allocation.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use gpumemhook_reader::layout::DeviceCounters;
use gpumemhook_reader::{Segment, MAX_DEVICES};

use crate::diag::warn;
use crate::nvml::{self, Unmeasured};

/// Devices measured at first contact (in this process image).
static MEASURED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
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

#[cold]
fn first_contact_slow(segment: &Segment, device: u32, flag: &AtomicBool) {
    if !flag.swap(true, Relaxed) {
        measure(segment, device);
    }
}

/// Reserves `bytes` on `device`; when that is refused on an emulated device, measures the
/// overhead again and tries once more (the overhead may have shrunk since it was last measured).
#[inline(always)]
pub fn reserve(segment: &Segment, device: u32, bytes: u64) -> Option<u64> {
    let counters = &segment.devices[device as usize];
    counters
        .reserve(bytes)
        .or_else(|| reserve_after_measuring(segment, device, bytes))
}

#[cold]
fn reserve_after_measuring(segment: &Segment, device: u32, bytes: u64) -> Option<u64> {
    let counters = &segment.devices[device as usize];
    if !emulated(counters) || !measure(segment, device) {
        return None;
    }
    // The refusal just counted is decided again below.
    counters.denied.fetch_sub(1, Relaxed);
    counters.reserve(bytes)
}

/// After a module load on `device`: the context grew.
#[cold]
pub fn module_loaded(segment: &Segment, device: Option<u32>) {
    if let Some(d) = device.filter(|&d| (d as usize) < MAX_DEVICES) {
        if emulated(&segment.devices[d as usize]) {
            measure(segment, d);
        }
    }
}

/// Measures and stores the overhead of emulated `device`; false when it could not be measured
/// (said once per process).
#[cold]
pub fn measure(segment: &Segment, device: u32) -> bool {
    let Some(counters) = segment.device(device) else {
        return false;
    };
    match nvml::process_used(device) {
        Ok(process_bytes) => {
            let counted = counters.used.load(Relaxed);
            counters
                .overhead
                .store(process_bytes.saturating_sub(counted), Relaxed);
            true
        }
        Err(why) => {
            if !SAID.swap(true, Relaxed) {
                let reason = match why {
                    Unmeasured::NoLibrary => {
                        "NVML (libnvidia-ml.so.1) cannot be loaded".to_string()
                    }
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
    for flag in &MEASURED {
        flag.store(false, Relaxed);
    }
    nvml::forked();
}

//! Policy for NVML's wrapped functions: what each does (the rows of `crate::table::nvml_table`
//! name these bodies). Their figures are replaced by the CUDA views under a ceiling or an emulated
//! card (`docs/emulation.md`), so that NVML agrees with `cuMemGetInfo`; finding the real functions
//! is `crate::nvml`'s, the doors are `crate::exports`'s.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
};

use crate::nvml::{ordinal_of, NvmlFn, NvmlReturn, NVML_SUCCESS};
use crate::table::Entry;

/// The counters whose view applies to the NVML device `device`, if it has one (its own, or its
/// group's), and its CUDA ordinal.
fn view_of(device: nvmlDevice_t) -> Option<(&'static gpumemhook_segment::DeviceCounters, u32)> {
    let active = crate::state::active()?;
    let ordinal = ordinal_of(device)?;
    let counters = active.segment.device(ordinal)?;
    (counters.has_view() || crate::group::has_view(ordinal)).then_some((counters, ordinal))
}

/// The memory-info view of a device: the process's, then its group's.
fn memory_view(
    counters: &gpumemhook_segment::DeviceCounters,
    ordinal: u32,
    free: u64,
    total: u64,
) -> (u64, u64) {
    let (free, total) = counters.ceiling_view(free, total);
    crate::group::view(ordinal, free, total)
}

// ---- the wrapped functions' bodies ----

/// `nvmlDeviceGetMemoryInfo`: the device as the CUDA views show it.
pub fn memory_info(
    _: Entry<NvmlFn>,
    call: impl FnOnce() -> NvmlReturn,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> NvmlReturn {
    let rc = call();
    if rc == NVML_SUCCESS && !memory.is_null() {
        if let Some((counters, ordinal)) = view_of(device) {
            // SAFETY: `memory` is non-null and was filled by the successful call.
            let m = unsafe { &mut *memory };
            let (free, total) = memory_view(counters, ordinal, m.free, m.total);
            (m.total, m.free, m.used) = (total, free, total - free);
        }
    }
    rc
}

/// `nvmlDeviceGetMemoryInfo_v2`: as v1; the view has no reserved memory (what a card reserves is
/// outside the total it reports).
pub fn memory_info_v2(
    _: Entry<NvmlFn>,
    call: impl FnOnce() -> NvmlReturn,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> NvmlReturn {
    let rc = call();
    if rc == NVML_SUCCESS && !memory.is_null() {
        if let Some((counters, ordinal)) = view_of(device) {
            // SAFETY: as in `memory_info`.
            let m = unsafe { &mut *memory };
            let (free, total) = memory_view(counters, ordinal, m.free, m.total);
            (m.total, m.reserved, m.free, m.used) = (total, 0, free, total - free);
        }
    }
    rc
}

/// A process entry whose figure the view may replace.
pub trait ProcessEntry {
    fn pid(&self) -> u32;
    fn set_used(&mut self, bytes: u64);
}

impl ProcessEntry for nvmlProcessInfo_v1_t {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn set_used(&mut self, bytes: u64) {
        self.usedGpuMemory = bytes;
    }
}

impl ProcessEntry for nvmlProcessInfo_t {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn set_used(&mut self, bytes: u64) {
        self.usedGpuMemory = bytes;
    }
}

/// `nvmlDeviceGetComputeRunningProcesses` (every version): this process's entry shows its use as
/// the views count it (allocations, plus the charged overhead under emulation).
pub fn processes<T: ProcessEntry>(
    _: Entry<NvmlFn>,
    call: impl FnOnce() -> NvmlReturn,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
) -> NvmlReturn {
    let rc = call();
    if rc != NVML_SUCCESS || count.is_null() || infos.is_null() {
        return rc;
    }
    let Some((counters, _)) = view_of(device) else {
        return rc;
    };
    let (_, total) = counters.ceiling_view(u64::MAX, u64::MAX);
    let own = counters.process_view(total);
    let pid = std::process::id();
    // SAFETY: the successful call wrote `*count` entries into the caller's array.
    let entries = unsafe { std::slice::from_raw_parts_mut(infos, *count as usize) };
    for entry in entries.iter_mut().filter(|e| e.pid() == pid) {
        entry.set_used(own);
    }
    rc
}

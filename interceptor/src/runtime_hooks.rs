//! Policy, the runtime's bodies (the rows of `crate::table::runtime_table` name them): one body
//! for every allocation ([`rt_malloc`]: device, managed or pinned host memory, whatever the
//! function's other arguments), the pitched allocation, frees and the memory-info view. The driver
//! wrapper beneath a runtime allocation counts it; the runtime body counts only what no driver
//! wrapper saw.

use std::ffi::c_void;

use gpumemhook_segment::MemKind;
use gpumemhook_segment::OTHER_MODULE;

use crate::account::{counted_device, failed_at_runtime, record_device_alloc, record_side};
use crate::driver;
use crate::ffi::*;
use crate::guard::RuntimeFrame;
use crate::ledger::Key;
use crate::modules::{self, Caller};
use crate::runtime::{self, rows, RuntimeFn};
pub use crate::skeletons::mem_get_info;
use crate::skeletons::{admit, release_taking, rt_code, Reserve};
use crate::state;
use crate::table::{Entry, Via};
use crate::trace::EntryCode;

/// A runtime allocation: the driver wrapper beneath counts it; if none did (the runtime reached the
/// driver by a path the hook cannot see), it is counted here, after the fact, and an allocation
/// past the ceiling is given back and refused. The frame carries the module of `caller`, so the
/// wrapper beneath charges the program or library that called the runtime. `requested` is the size
/// asked for (what an out-of-memory report names), `bytes_after` the size allocated.
#[inline(always)]
fn runtime_alloc(
    caller: Caller,
    entry: EntryCode,
    kind: MemKind,
    out: *mut *mut c_void,
    requested: u64,
    call: impl FnOnce() -> CudaError,
    bytes_after: impl FnOnce() -> u64,
) -> CudaError {
    // Only device memory is charged to a module: managed and pinned host memory skip the lookup.
    let module = match (kind, state::active()) {
        (MemKind::Device, Some(a)) => modules::slot_of(caller.0, a.segment),
        _ => OTHER_MODULE as u8,
    };
    let frame = RuntimeFrame::enter(module);
    let rc = call();
    if rc != CUDA_SUCCESS || frame.accounted() || out.is_null() {
        if rc == CUDART_ERROR_MEMORY_ALLOCATION && !frame.accounted() && kind == MemKind::Device {
            drop(frame);
            if let Some(active) = state::active() {
                failed_at_runtime(active, entry, requested, module);
            }
        }
        return rc;
    }
    drop(frame);
    let Some(active) = state::active() else {
        return rc;
    };
    // SAFETY: `out` is non-null and was written by the successful call.
    let address = unsafe { *out } as u64;
    let bytes = bytes_after();
    if kind != MemKind::Device {
        record_side(active, entry, kind, Key::Pointer(address), bytes);
        return rc;
    }
    let Some(dev) = counted_device(driver::current_device().or(Some(0))) else {
        return rc;
    };
    let ticket = active.segment.scope_ticket(dev);
    let admitted = admit(
        active,
        entry,
        dev,
        Reserve::After(bytes),
        bytes,
        module,
        || {
            if let Some(free) = runtime::real::<rows::Free>(Via::Next) {
                // SAFETY: the address was just allocated by the runtime.
                unsafe { free(address as *mut c_void) };
            }
        },
    );
    if admitted.is_none() {
        // SAFETY: `out` is non-null; the refused allocation is not handed out.
        unsafe { *out = std::ptr::null_mut() };
        return CUDART_ERROR_MEMORY_ALLOCATION;
    }
    record_device_alloc(
        active,
        entry,
        Key::Pointer(address),
        dev,
        bytes,
        ticket,
        module,
    );
    rc
}

/// Every runtime allocation of a size (`cudaMalloc`, `cudaMallocAsync*`,
/// `cudaMallocFromPoolAsync*`, `cudaMallocManaged`, `cudaMallocHost`, `cudaHostAlloc`): counted as
/// `kind`; the function's other arguments (flags, stream, pool) are only passed on, in `call`.
#[inline(always)]
pub fn rt_malloc(
    e: Entry<RuntimeFn>,
    call: impl FnOnce() -> CudaError,
    caller: Caller,
    kind: MemKind,
    out: *mut *mut c_void,
    bytes: usize,
) -> CudaError {
    runtime_alloc(caller, rt_code(e), kind, out, bytes as u64, call, || {
        bytes as u64
    })
}

/// `cudaMallocPitch`: the width × height estimate is what a refusal names; the pitch the runtime
/// chose is what is counted.
pub fn rt_malloc_pitch(
    e: Entry<RuntimeFn>,
    call: impl FnOnce() -> CudaError,
    caller: Caller,
    out: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> CudaError {
    runtime_alloc(
        caller,
        rt_code(e),
        MemKind::Device,
        out,
        width.saturating_mul(height) as u64,
        call,
        || {
            if pitch.is_null() {
                width.saturating_mul(height) as u64
            } else {
                // SAFETY: read only after a successful call, which wrote the non-null `pitch`.
                unsafe { (*pitch as u64).saturating_mul(height as u64) }
            }
        },
    )
}

/// Every runtime free (`cudaFree`, `cudaFreeAsync*`, `cudaFreeHost`).
#[inline(always)]
pub fn rt_free(e: Entry<RuntimeFn>, call: impl FnOnce() -> CudaError, p: *mut c_void) -> CudaError {
    release_taking(rt_code(e), Key::Pointer(p as u64), call, true)
}

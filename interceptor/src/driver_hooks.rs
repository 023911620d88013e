//! Policy, the driver's bodies (the rows of `crate::table::driver_table` name them): device
//! allocations (on the current device, a stream's, a pool's, a location's), managed and pinned host
//! memory, frees, pools (which device each belongs to) and the memory-info views. Each is given the
//! row's entry and `call`, the real function bound to the caller's arguments, then the arguments it
//! reads.

use std::ffi::c_void;

use gpumemhook_segment::MemKind;

use crate::driver::{self, rows, DriverFn};
use crate::ffi::*;
use crate::guard;
use crate::ledger::Key;
use crate::modules::Caller;
use crate::skeletons::{
    admit, ceiling_view, code, device_alloc, device_alloc_settled, release, side_alloc, Reserve,
};
use crate::state;
use crate::streams::device_of_stream;
use crate::table::Entry;

/// `cuMemAlloc_v2`: on the current context's device.
#[inline(always)] // on the hot path: no call between the door and the body
pub fn mem_alloc(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    caller: Caller,
    dptr: *mut CuDevicePtr,
    bytes: usize,
) -> CuResult {
    if dptr.is_null() {
        return call();
    }
    // SAFETY: `dptr` is non-null and written by the successful real call before it is read.
    device_alloc(
        caller,
        code(e),
        || Key::Pointer(unsafe { *dptr }),
        bytes,
        |_| driver::current_device(),
        call,
    )
}

/// The pitch is known only after the call: the width × height estimate is reserved first (and is
/// what a refusal or a failure reports), the padding after; an allocation whose padding passes the
/// ceiling is freed and refused.
pub fn mem_alloc_pitch(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    caller: Caller,
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> CuResult {
    if dptr.is_null() || pitch.is_null() {
        guard::mark_accounted();
        return call();
    }
    let estimate = width.saturating_mul(height) as u64;
    let settle = |active: &state::Active, dev: u32, module: u8| {
        // SAFETY: both out-pointers are non-null and were written by the successful call.
        let (address, bytes) = unsafe { (*dptr, (*pitch as u64).saturating_mul(height as u64)) };
        if bytes > estimate {
            let padding = bytes - estimate;
            admit(
                active,
                code(e),
                dev,
                Reserve::Padding(padding),
                bytes,
                module,
                || {
                    crate::skeletons::cancel(active.segment, dev, estimate);
                    if let Some(free) = driver::real::<rows::MemFree>(e.via) {
                        // SAFETY: `address` was just allocated by the driver.
                        unsafe { free(address) };
                    }
                },
            )?;
        } else if bytes < estimate {
            crate::skeletons::unreserve(active.segment, dev, estimate - bytes);
        }
        Some((Key::Pointer(address), bytes))
    };
    device_alloc_settled(
        caller,
        code(e),
        estimate,
        |_| driver::current_device(),
        call,
        settle,
    )
}

/// `cuMemAllocManaged`: managed memory, counted in its own fields.
pub fn mem_alloc_managed(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    dptr: *mut CuDevicePtr,
    bytes: usize,
) -> CuResult {
    if dptr.is_null() {
        return call();
    }
    // SAFETY: as in `mem_alloc`.
    side_alloc(
        code(e),
        MemKind::Managed,
        || Key::Pointer(unsafe { *dptr }),
        bytes as u64,
        call,
    )
}

/// `cuMemAllocAsync*`: on the stream's device.
#[inline(always)] // on the hot path: no call between the door and the body
pub fn mem_alloc_async(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    caller: Caller,
    dptr: *mut CuDevicePtr,
    bytes: usize,
    stream: CuStream,
) -> CuResult {
    if dptr.is_null() {
        return call();
    }
    // SAFETY: as in `mem_alloc`.
    device_alloc(
        caller,
        code(e),
        || Key::Pointer(unsafe { *dptr }),
        bytes,
        |a| device_of_stream(a, stream),
        call,
    )
}

/// Counted on the pool's device, learned when the driver handed the pool out (the driver API has no
/// query for a pool's location); on the stream's device for a pool the hook never saw.
#[inline(always)] // on the hot path: no call between the door and the body
pub fn mem_alloc_from_pool(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    caller: Caller,
    dptr: *mut CuDevicePtr,
    bytes: usize,
    pool: CuMemPool,
    stream: CuStream,
) -> CuResult {
    if dptr.is_null() {
        return call();
    }
    let device = |a: &state::Active| {
        a.ledger
            .pool_device(pool as u64)
            .or_else(|| device_of_stream(a, stream))
    };
    device_alloc(
        caller,
        code(e),
        // SAFETY: `dptr` is non-null and written by the successful real call before it is read.
        || Key::Pointer(unsafe { *dptr }),
        bytes,
        device,
        call,
    )
}

/// Remembers the device of a pool created on one.
pub fn mem_pool_create(
    _: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    pool: *mut CuMemPool,
    props: *const CuLocationHead,
) -> CuResult {
    let rc = call();
    if rc == CUDA_SUCCESS && !pool.is_null() && !props.is_null() {
        // SAFETY: both pointers are non-null; `*pool` was written by the successful call and `props`
        // points at the caller's CUmemPoolProps, which opens with `CuLocationHead`.
        let (handle, location_type, id) =
            unsafe { (*pool as u64, (*props).location_type, (*props).location_id) };
        if let Some(active) = state::active() {
            let device = (location_type == CU_MEM_LOCATION_TYPE_DEVICE)
                .then(|| u32::try_from(id).ok())
                .flatten();
            active.ledger.set_pool_device(handle, device);
        }
    }
    rc
}

/// `cuMemPoolDestroy`: the pool's device is forgotten.
pub fn mem_pool_destroy(
    _: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    pool: CuMemPool,
) -> CuResult {
    let rc = call();
    if rc == CUDA_SUCCESS {
        if let Some(active) = state::active() {
            active.ledger.set_pool_device(pool as u64, None);
        }
    }
    rc
}

/// `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool`: the pool handed out belongs to `device`.
pub fn device_get_mem_pool(
    _: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    pool: *mut CuMemPool,
    device: CuDevice,
) -> CuResult {
    let rc = call();
    if rc == CUDA_SUCCESS && !pool.is_null() {
        if let Some(active) = state::active() {
            // SAFETY: `pool` is non-null and was written by the successful call.
            active
                .ledger
                .set_pool_device(unsafe { *pool } as u64, u32::try_from(device).ok());
        }
    }
    rc
}

/// Every free of an address (`cuMemFree_v2`, `cuMemFreeAsync*`, `cuMemFreeHost`).
#[inline(always)] // on the hot path: no call between the door and the body
pub fn mem_free(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    address: CuDevicePtr,
) -> CuResult {
    release(code(e), Key::Pointer(address), call)
}

/// Physical memory of the virtual memory management API, counted on the property's location.
pub fn mem_create(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    caller: Caller,
    handle: *mut CuMemHandle,
    bytes: usize,
    prop: *const CuLocationHead,
) -> CuResult {
    if handle.is_null() || prop.is_null() {
        return call();
    }
    // SAFETY: `prop` is non-null and points at the caller's CUmemAllocationProp, whose first four
    // ints are `CuLocationHead`.
    let (location_type, location_id) = unsafe { ((*prop).location_type, (*prop).location_id) };
    // SAFETY: `handle` is non-null and written by the successful real call before it is read.
    let key = || Key::Handle(unsafe { *handle });
    if location_type == CU_MEM_LOCATION_TYPE_DEVICE {
        device_alloc(
            caller,
            code(e),
            key,
            bytes,
            |_| u32::try_from(location_id).ok(),
            call,
        )
    } else {
        side_alloc(code(e), MemKind::HostPinned, key, bytes as u64, call)
    }
}

/// `cuMemRelease`: the free of a physical-memory handle.
pub fn mem_release(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    handle: CuMemHandle,
) -> CuResult {
    release(code(e), Key::Handle(handle), call)
}

/// `cuDeviceTotalMem_v2`: the total under the ceiling's view.
pub fn device_total_mem(
    _: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    bytes: *mut usize,
    device: CuDevice,
) -> CuResult {
    let rc = call();
    if rc == CUDA_SUCCESS {
        ceiling_view(u32::try_from(device).ok(), std::ptr::null_mut(), bytes);
    }
    rc
}

/// `cuMemHostAlloc` and `cuMemAllocHost_v2`: pinned host memory, counted in its own fields.
pub fn mem_host_alloc(
    e: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    pp: *mut *mut c_void,
    bytes: usize,
) -> CuResult {
    if pp.is_null() {
        return call();
    }
    // SAFETY: `pp` is non-null and written by the successful call before it is read.
    side_alloc(
        code(e),
        MemKind::HostPinned,
        || Key::Pointer(unsafe { *pp } as u64),
        bytes as u64,
        call,
    )
}

//! Policy: what each entry point does (the bodies that the rows of `crate::table` name): which
//! device an allocation is on, reserve under the ceiling, call the real function, then count it
//! (through `crate::account`), refuse it, or adjust a view. Each exported shadow and wrapper is one
//! call of one of these (`crate::exports`).
//!
//! The hot path: no allocation (beyond the ledger's rare growth), no global lock, no environment
//! read, no formatting, no panic. Anything the hook does not understand (a NULL out-pointer, no
//! current context, a device past the segment, an unknown address) goes straight to the real
//! function and is not counted.

use std::ffi::{c_int, c_uint, c_void};

use gpumemhook_reader::MemKind;

use crate::account::{
    counted_device, failed, failed_at_runtime, module_of, record_device_alloc, record_free,
    record_side, refused,
};
use crate::driver::{self, DriverFn, Via};
use crate::emulation;
use crate::ffi::*;
use crate::guard::{self, RuntimeFrame};
use crate::ledger::Key;
use crate::modules::{self, Caller};
use crate::runtime::{self, as_fn, RuntimeFn};
use crate::state;
use crate::trace::{EntryCode, RUNTIME_BASE};
use gpumemhook_reader::layout::OTHER_MODULE;

/// The timeline's code of a driver entry point.
#[inline(always)]
fn code(f: DriverFn) -> EntryCode {
    f as EntryCode
}

/// The timeline's code of a runtime entry point.
#[inline(always)]
fn rt_code(f: RuntimeFn) -> EntryCode {
    RUNTIME_BASE + f as EntryCode
}

/// The real driver function `f`, or an early return of "not initialized" when there is no driver.
macro_rules! real_driver {
    ($f:expr, $via:expr, $ty:ty) => {
        match driver::target($f, $via) {
            // SAFETY: the address was resolved under the exact versioned name of `$f`, whose C
            // signature is `$ty`.
            Some(p) => unsafe { as_fn::<$ty>(p) },
            None => return CUDA_ERROR_NOT_INITIALIZED,
        }
    };
}

/// The real runtime function `f`, or an early return of the runtime's "no driver" error.
macro_rules! real_runtime {
    ($f:expr, $ty:ty) => {
        match runtime::target($f) {
            // SAFETY: resolved under the exact name of `$f`, whose C signature is `$ty`.
            Some(p) => unsafe { as_fn::<$ty>(p) },
            None => return CUDART_ERROR_INSUFFICIENT_DRIVER,
        }
    };
}

/// A device allocation at the driver: reserve under the ceiling, call, then record. The driver is
/// never called for a refused allocation.
#[inline(always)]
fn device_alloc(
    caller: Caller,
    entry: EntryCode,
    key: impl FnOnce() -> Key,
    bytes: usize,
    device: impl FnOnce(&state::Active) -> Option<u32>,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    let bytes = bytes as u64;
    device_alloc_settled(caller, entry, bytes, device, call, |_, _, new_used, _| {
        Some((key(), bytes, new_used))
    })
}

/// The body of every device allocation at the driver: reserve `estimate` bytes under the ceiling,
/// call, then `settle` (given the state, the device, `used` after the reservation and the module
/// charged) says what was
/// allocated (`(key, bytes, used)`, having adjusted the reservation to `bytes`), or `None` when it
/// gave the allocation back and refused it (then the call answers out-of-memory).
///
/// The allocation is charged to the module of the runtime's caller inside a runtime frame, else to
/// the module of this wrapper's own `caller`.
#[inline(always)]
fn device_alloc_settled(
    caller: Caller,
    entry: EntryCode,
    estimate: u64,
    device: impl FnOnce(&state::Active) -> Option<u32>,
    call: impl FnOnce() -> CuResult,
    settle: impl FnOnce(&state::Active, u32, u64, u8) -> Option<(Key, u64, u64)>,
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
    let Some(new_used) = emulation::reserve(active.segment, dev, estimate) else {
        refused(active, entry, dev, estimate, module);
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let rc = call();
    if rc != CUDA_SUCCESS {
        failed(active, entry, dev, estimate, module, rc);
        return rc;
    }
    let Some((key, bytes, new_used)) = settle(active, dev, new_used, module) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    record_device_alloc(active, entry, key, dev, bytes, new_used, ticket, module);
    driver::learn_device_count();
    rc
}

/// The device of `stream`: device 0 when the process sees one device; otherwise the cached answer
/// of the driver, asked once per stream (the cache forgets a stream when it or any context is
/// destroyed, so a recycled stream handle is asked again).
#[inline]
fn device_of_stream(active: &state::Active, stream: CuStream) -> Option<u32> {
    if driver::single_device() {
        return Some(0);
    }
    if driver::is_special_stream(stream) {
        return driver::current_device();
    }
    if let Some(d) = active.ledger.stream_device(stream as u64) {
        return Some(d);
    }
    let device = driver::stream_device(stream)?;
    active.ledger.set_stream_device(stream as u64, device);
    Some(device)
}

/// A managed or pinned-host allocation: no ceiling, counted in its own fields after success.
#[inline(always)]
fn side_alloc(
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
fn release(code: EntryCode, key: Key, call: impl FnOnce() -> c_int) -> c_int {
    if guard::mark_accounted().taken {
        return call();
    }
    release_taking(code, key, call, false)
}

/// The body of [`release`]; `runtime` is true in a runtime free shadow, which runs the real call in
/// a frame telling the driver wrapper beneath that the entry is already taken.
#[inline(always)]
fn release_taking(code: EntryCode, key: Key, call: impl FnOnce() -> c_int, runtime: bool) -> c_int {
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
fn ceiling_view(device: Option<u32>, free: *mut usize, total: *mut usize) {
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
        if !free.is_null() {
            *free = f as usize;
        }
        if !total.is_null() {
            *total = t as usize;
        }
    }
}

// ---- driver bodies: (function, how to reach it, the C arguments) ----

type AllocFn = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;

pub fn mem_alloc(
    f: DriverFn,
    via: Via,
    caller: Caller,
    dptr: *mut CuDevicePtr,
    bytes: usize,
) -> CuResult {
    let real = real_driver!(f, via, AllocFn);
    if dptr.is_null() {
        // SAFETY: forwards the caller's arguments unchanged.
        return unsafe { real(dptr, bytes) };
    }
    // SAFETY: `dptr` is non-null and written by the successful real call before it is read.
    device_alloc(
        caller,
        code(f),
        || Key::Pointer(unsafe { *dptr }),
        bytes,
        |_| driver::current_device(),
        || unsafe { real(dptr, bytes) },
    )
}

type AllocPitchFn =
    unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, usize, usize, c_uint) -> CuResult;

/// The pitch is known only after the call: the width × height estimate is reserved first (and is
/// what a refusal or a failure reports), the padding after; an allocation whose padding passes the
/// ceiling is freed and refused.
#[allow(clippy::too_many_arguments)] // the C signature's five, and the row's three
pub fn mem_alloc_pitch(
    f: DriverFn,
    via: Via,
    caller: Caller,
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CuResult {
    let real = real_driver!(f, via, AllocPitchFn);
    // SAFETY: forwards the caller's arguments unchanged.
    let call = || unsafe { real(dptr, pitch, width, height, element) };
    if dptr.is_null() || pitch.is_null() {
        guard::mark_accounted();
        return call();
    }
    let estimate = width.saturating_mul(height) as u64;
    let settle = |active: &state::Active, dev: u32, new_used: u64, module: u8| {
        let counters = &active.segment.devices[dev as usize];
        // SAFETY: both out-pointers are non-null and were written by the successful call.
        let (address, bytes) = unsafe { (*dptr, (*pitch as u64).saturating_mul(height as u64)) };
        let mut new_used = new_used;
        if bytes > estimate {
            match counters.reserve(bytes - estimate) {
                Some(n) => new_used = n,
                None => {
                    counters.unreserve(estimate);
                    refused(active, code(f), dev, bytes, module);
                    if let Some(free) = driver::target(DriverFn::MemFree, via) {
                        // SAFETY: `free` is `cuMemFree_v2`; `address` was just allocated by the
                        // driver.
                        unsafe {
                            as_fn::<unsafe extern "C" fn(CuDevicePtr) -> CuResult>(free)(address)
                        };
                    }
                    return None;
                }
            }
        } else if bytes < estimate {
            counters.unreserve(estimate - bytes);
        }
        Some((Key::Pointer(address), bytes, new_used))
    };
    device_alloc_settled(
        caller,
        code(f),
        estimate,
        |_| driver::current_device(),
        call,
        settle,
    )
}

type AllocManagedFn = unsafe extern "C" fn(*mut CuDevicePtr, usize, c_uint) -> CuResult;

pub fn mem_alloc_managed(
    f: DriverFn,
    via: Via,
    dptr: *mut CuDevicePtr,
    bytes: usize,
    flags: c_uint,
) -> CuResult {
    let real = real_driver!(f, via, AllocManagedFn);
    if dptr.is_null() {
        // SAFETY: forwards the caller's arguments unchanged.
        return unsafe { real(dptr, bytes, flags) };
    }
    // SAFETY: as in `mem_alloc`.
    side_alloc(
        code(f),
        MemKind::Managed,
        || Key::Pointer(unsafe { *dptr }),
        bytes as u64,
        || unsafe { real(dptr, bytes, flags) },
    )
}

type AllocAsyncFn = unsafe extern "C" fn(*mut CuDevicePtr, usize, CuStream) -> CuResult;

pub fn mem_alloc_async(
    f: DriverFn,
    via: Via,
    caller: Caller,
    dptr: *mut CuDevicePtr,
    bytes: usize,
    stream: CuStream,
) -> CuResult {
    let real = real_driver!(f, via, AllocAsyncFn);
    if dptr.is_null() {
        // SAFETY: forwards the caller's arguments unchanged.
        return unsafe { real(dptr, bytes, stream) };
    }
    // SAFETY: as in `mem_alloc`.
    device_alloc(
        caller,
        code(f),
        || Key::Pointer(unsafe { *dptr }),
        bytes,
        |a| device_of_stream(a, stream),
        || unsafe { real(dptr, bytes, stream) },
    )
}

type AllocPoolFn = unsafe extern "C" fn(*mut CuDevicePtr, usize, CuMemPool, CuStream) -> CuResult;

/// Counted on the pool's device, learned when the driver handed the pool out (the driver API has no
/// query for a pool's location); on the stream's device for a pool the hook never saw.
pub fn mem_alloc_from_pool(
    f: DriverFn,
    via: Via,
    caller: Caller,
    dptr: *mut CuDevicePtr,
    bytes: usize,
    pool: CuMemPool,
    stream: CuStream,
) -> CuResult {
    let real = real_driver!(f, via, AllocPoolFn);
    if dptr.is_null() {
        // SAFETY: forwards the caller's arguments unchanged.
        return unsafe { real(dptr, bytes, pool, stream) };
    }
    let device = |a: &state::Active| {
        a.ledger
            .pool_device(pool as u64)
            .or_else(|| device_of_stream(a, stream))
    };
    device_alloc(
        caller,
        code(f),
        // SAFETY: `dptr` is non-null and written by the successful real call before it is read.
        || Key::Pointer(unsafe { *dptr }),
        bytes,
        device,
        // SAFETY: forwards the caller's arguments unchanged.
        || unsafe { real(dptr, bytes, pool, stream) },
    )
}

type PoolCreateFn = unsafe extern "C" fn(*mut CuMemPool, *const CuLocationHead) -> CuResult;

/// Remembers the device of a pool created on one.
pub fn mem_pool_create(
    f: DriverFn,
    via: Via,
    pool: *mut CuMemPool,
    props: *const CuLocationHead,
) -> CuResult {
    let real = real_driver!(f, via, PoolCreateFn);
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(pool, props) };
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

pub fn mem_pool_destroy(f: DriverFn, via: Via, pool: CuMemPool) -> CuResult {
    let real = real_driver!(f, via, unsafe extern "C" fn(CuMemPool) -> CuResult);
    // SAFETY: forwards the caller's argument unchanged.
    let rc = unsafe { real(pool) };
    if rc == CUDA_SUCCESS {
        if let Some(active) = state::active() {
            active.ledger.set_pool_device(pool as u64, None);
        }
    }
    rc
}

/// `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool`: the pool handed out belongs to `device`.
pub fn device_get_mem_pool(
    f: DriverFn,
    via: Via,
    pool: *mut CuMemPool,
    device: CuDevice,
) -> CuResult {
    let real = real_driver!(
        f,
        via,
        unsafe extern "C" fn(*mut CuMemPool, CuDevice) -> CuResult
    );
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(pool, device) };
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

pub fn mem_free(f: DriverFn, via: Via, dptr: CuDevicePtr) -> CuResult {
    let real = real_driver!(f, via, unsafe extern "C" fn(CuDevicePtr) -> CuResult);
    // SAFETY: forwards the caller's argument unchanged.
    release(code(f), Key::Pointer(dptr), || unsafe { real(dptr) })
}

pub fn mem_free_async(f: DriverFn, via: Via, dptr: CuDevicePtr, stream: CuStream) -> CuResult {
    let real = real_driver!(
        f,
        via,
        unsafe extern "C" fn(CuDevicePtr, CuStream) -> CuResult
    );
    // SAFETY: forwards the caller's arguments unchanged.
    release(code(f), Key::Pointer(dptr), || unsafe {
        real(dptr, stream)
    })
}

type CreateFn =
    unsafe extern "C" fn(*mut CuMemHandle, usize, *const CuLocationHead, u64) -> CuResult;

/// Physical memory of the virtual memory management API, counted on the property's location.
pub fn mem_create(
    f: DriverFn,
    via: Via,
    caller: Caller,
    handle: *mut CuMemHandle,
    bytes: usize,
    prop: *const CuLocationHead,
    flags: u64,
) -> CuResult {
    let real = real_driver!(f, via, CreateFn);
    // SAFETY: forwards the caller's arguments unchanged.
    let call = || unsafe { real(handle, bytes, prop, flags) };
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
            code(f),
            key,
            bytes,
            |_| u32::try_from(location_id).ok(),
            call,
        )
    } else {
        side_alloc(code(f), MemKind::HostPinned, key, bytes as u64, call)
    }
}

pub fn mem_release(f: DriverFn, via: Via, handle: CuMemHandle) -> CuResult {
    let real = real_driver!(f, via, unsafe extern "C" fn(CuMemHandle) -> CuResult);
    // SAFETY: forwards the caller's argument unchanged.
    release(code(f), Key::Handle(handle), || unsafe { real(handle) })
}

pub fn mem_get_info(f: DriverFn, via: Via, free: *mut usize, total: *mut usize) -> CuResult {
    let real = real_driver!(
        f,
        via,
        unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult
    );
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(free, total) };
    if rc == CUDA_SUCCESS {
        ceiling_view(driver::current_device(), free, total);
    }
    rc
}

pub fn device_total_mem(f: DriverFn, via: Via, bytes: *mut usize, device: CuDevice) -> CuResult {
    let real = real_driver!(
        f,
        via,
        unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult
    );
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(bytes, device) };
    if rc == CUDA_SUCCESS {
        ceiling_view(u32::try_from(device).ok(), std::ptr::null_mut(), bytes);
    }
    rc
}

pub fn mem_host_alloc(
    f: DriverFn,
    via: Via,
    pp: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CuResult {
    let real = real_driver!(
        f,
        via,
        unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult
    );
    // SAFETY: forwards the caller's arguments unchanged.
    let call = || unsafe { real(pp, bytes, flags) };
    if pp.is_null() {
        return call();
    }
    // SAFETY: `pp` is non-null and written by the successful call before it is read.
    side_alloc(
        code(f),
        MemKind::HostPinned,
        || Key::Pointer(unsafe { *pp } as u64),
        bytes as u64,
        call,
    )
}

pub fn mem_alloc_host(f: DriverFn, via: Via, pp: *mut *mut c_void, bytes: usize) -> CuResult {
    let real = real_driver!(
        f,
        via,
        unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult
    );
    // SAFETY: forwards the caller's arguments unchanged.
    let call = || unsafe { real(pp, bytes) };
    if pp.is_null() {
        return call();
    }
    // SAFETY: as in `mem_host_alloc`.
    side_alloc(
        code(f),
        MemKind::HostPinned,
        || Key::Pointer(unsafe { *pp } as u64),
        bytes as u64,
        call,
    )
}

pub fn mem_free_host(f: DriverFn, via: Via, p: *mut c_void) -> CuResult {
    let real = real_driver!(f, via, unsafe extern "C" fn(*mut c_void) -> CuResult);
    // SAFETY: forwards the caller's argument unchanged.
    release(code(f), Key::Pointer(p as u64), || unsafe { real(p) })
}

/// `cuStreamDestroy*`: the stream's cached device is forgotten first, so a later stream that
/// receives the same handle is asked again.
pub fn stream_destroy(f: DriverFn, via: Via, stream: CuStream) -> CuResult {
    let real = real_driver!(f, via, unsafe extern "C" fn(CuStream) -> CuResult);
    if let Some(active) = state::active() {
        active.ledger.forget_stream(stream as u64);
    }
    // SAFETY: forwards the caller's argument unchanged.
    unsafe { real(stream) }
}

/// `cuCtxDestroy*` (`arg`: the context), `cuDevicePrimaryCtxReset*` and
/// `cuDevicePrimaryCtxRelease*` (`arg`: the device): every stream of a destroyed context dies with
/// it (and the primary context may be destroyed), so every cached stream is forgotten.
pub fn streams_gone<A>(f: DriverFn, via: Via, arg: A) -> CuResult {
    let real = real_driver!(f, via, unsafe extern "C" fn(A) -> CuResult);
    forget_streams();
    // SAFETY: forwards the caller's argument unchanged.
    unsafe { real(arg) }
}

#[cold]
fn forget_streams() {
    if let Some(active) = state::active() {
        active.ledger.forget_all_streams();
    }
}

/// After a module or library load: the context grew, so an emulated device's overhead is measured
/// again (nothing else is done).
fn loaded(rc: CuResult) -> CuResult {
    if rc == CUDA_SUCCESS {
        if let Some(active) = state::active() {
            emulation::module_loaded(active.segment, driver::current_device());
        }
    }
    rc
}

/// `cuModuleLoadData`, `cuModuleLoadFatBinary`, and `cuModuleLoad` (a path where the image was:
/// the same C signature but for the pointer's type).
pub fn module_load_data(
    f: DriverFn,
    via: Via,
    module: *mut *mut c_void,
    image: *const c_void,
) -> CuResult {
    let real = real_driver!(
        f,
        via,
        unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult
    );
    // SAFETY: forwards the caller's arguments unchanged.
    loaded(unsafe { real(module, image) })
}

pub fn module_load_data_ex(
    f: DriverFn,
    via: Via,
    module: *mut *mut c_void,
    image: *const c_void,
    count: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CuResult {
    let real = real_driver!(
        f,
        via,
        unsafe extern "C" fn(
            *mut *mut c_void,
            *const c_void,
            c_uint,
            *mut c_int,
            *mut *mut c_void,
        ) -> CuResult
    );
    // SAFETY: forwards the caller's arguments unchanged.
    loaded(unsafe { real(module, image, count, options, values) })
}

type LibraryLoadFn = unsafe extern "C" fn(
    *mut *mut c_void,
    *const c_void,
    *mut c_int,
    *mut *mut c_void,
    c_uint,
    *mut c_int,
    *mut *mut c_void,
    c_uint,
) -> CuResult;

/// `cuLibraryLoadData`, and `cuLibraryLoadFromFile` (a path where the code was). (A library loads into every context; the current device is measured, and
/// the others at their next measurement.)
#[allow(clippy::too_many_arguments)]
pub fn library_load(
    f: DriverFn,
    via: Via,
    library: *mut *mut c_void,
    code: *const c_void,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    jit_count: c_uint,
    library_options: *mut c_int,
    library_values: *mut *mut c_void,
    library_count: c_uint,
) -> CuResult {
    let real = real_driver!(f, via, LibraryLoadFn);
    // SAFETY: forwards the caller's arguments unchanged.
    loaded(unsafe {
        real(
            library,
            code,
            jit_options,
            jit_values,
            jit_count,
            library_options,
            library_values,
            library_count,
        )
    })
}

// ---- runtime bodies ----

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
    match emulation::reserve(active.segment, dev, bytes) {
        Some(new_used) => {
            record_device_alloc(
                active,
                entry,
                Key::Pointer(address),
                dev,
                bytes,
                new_used,
                ticket,
                module,
            );
            rc
        }
        None => {
            refused(active, entry, dev, bytes, module);
            if let Some(free) = runtime::target(RuntimeFn::Free) {
                // SAFETY: `free` is `cudaFree`; the address was just allocated by the runtime.
                unsafe {
                    as_fn::<unsafe extern "C" fn(*mut c_void) -> CudaError>(free)(
                        address as *mut c_void,
                    )
                };
            }
            // SAFETY: `out` is non-null; the refused allocation is not handed out.
            unsafe { *out = std::ptr::null_mut() };
            CUDART_ERROR_MEMORY_ALLOCATION
        }
    }
}

/// `cudaMalloc` and `cudaMallocHost`: counted as `kind` (device or pinned host memory).
#[inline(always)]
pub fn rt_malloc(
    f: RuntimeFn,
    caller: Caller,
    kind: MemKind,
    out: *mut *mut c_void,
    bytes: usize,
) -> CudaError {
    let real = real_runtime!(
        f,
        unsafe extern "C" fn(*mut *mut c_void, usize) -> CudaError
    );
    // SAFETY: forwards the caller's arguments unchanged.
    runtime_alloc(
        caller,
        rt_code(f),
        kind,
        out,
        bytes as u64,
        || unsafe { real(out, bytes) },
        || bytes as u64,
    )
}

/// `cudaMallocManaged` and `cudaHostAlloc` (a size and flags): counted as `kind` (managed or pinned
/// host memory).
#[inline(always)]
pub fn rt_malloc_flags(
    f: RuntimeFn,
    caller: Caller,
    kind: MemKind,
    out: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CudaError {
    let real = real_runtime!(
        f,
        unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CudaError
    );
    // SAFETY: forwards the caller's arguments unchanged.
    runtime_alloc(
        caller,
        rt_code(f),
        kind,
        out,
        bytes as u64,
        || unsafe { real(out, bytes, flags) },
        || bytes as u64,
    )
}

pub fn rt_malloc_async(
    f: RuntimeFn,
    caller: Caller,
    out: *mut *mut c_void,
    bytes: usize,
    stream: CuStream,
) -> CudaError {
    let real = real_runtime!(
        f,
        unsafe extern "C" fn(*mut *mut c_void, usize, CuStream) -> CudaError
    );
    // SAFETY: forwards the caller's arguments unchanged.
    runtime_alloc(
        caller,
        rt_code(f),
        MemKind::Device,
        out,
        bytes as u64,
        || unsafe { real(out, bytes, stream) },
        || bytes as u64,
    )
}

pub fn rt_malloc_from_pool(
    f: RuntimeFn,
    caller: Caller,
    out: *mut *mut c_void,
    bytes: usize,
    pool: CuMemPool,
    stream: CuStream,
) -> CudaError {
    let real = real_runtime!(
        f,
        unsafe extern "C" fn(*mut *mut c_void, usize, CuMemPool, CuStream) -> CudaError
    );
    // SAFETY: forwards the caller's arguments unchanged.
    runtime_alloc(
        caller,
        rt_code(f),
        MemKind::Device,
        out,
        bytes as u64,
        || unsafe { real(out, bytes, pool, stream) },
        || bytes as u64,
    )
}

pub fn rt_malloc_pitch(
    f: RuntimeFn,
    caller: Caller,
    out: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> CudaError {
    let real = real_runtime!(
        f,
        unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> CudaError
    );
    runtime_alloc(
        caller,
        rt_code(f),
        MemKind::Device,
        out,
        width.saturating_mul(height) as u64,
        // SAFETY: forwards the caller's arguments unchanged.
        || unsafe { real(out, pitch, width, height) },
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

pub fn rt_free(f: RuntimeFn, p: *mut c_void) -> CudaError {
    let real = real_runtime!(f, unsafe extern "C" fn(*mut c_void) -> CudaError);
    // SAFETY: forwards the caller's argument unchanged.
    release_taking(
        rt_code(f),
        Key::Pointer(p as u64),
        || unsafe { real(p) },
        true,
    )
}

pub fn rt_free_async(f: RuntimeFn, p: *mut c_void, stream: CuStream) -> CudaError {
    let real = real_runtime!(f, unsafe extern "C" fn(*mut c_void, CuStream) -> CudaError);
    // SAFETY: forwards the caller's arguments unchanged.
    release_taking(
        rt_code(f),
        Key::Pointer(p as u64),
        || unsafe { real(p, stream) },
        true,
    )
}

pub fn rt_mem_get_info(f: RuntimeFn, free: *mut usize, total: *mut usize) -> CudaError {
    let real = real_runtime!(f, unsafe extern "C" fn(*mut usize, *mut usize) -> CudaError);
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(free, total) };
    if rc == CUDA_SUCCESS {
        ceiling_view(driver::current_device(), free, total);
    }
    rc
}

//! The driver functions the hook wraps or calls, found by address.
//!
//! The functions are the rows of the driver's table (`crate::table::driver_table`). At first contact
//! with the driver (the first lookup whose result lies in `libcuda.so*`, or the first call of an
//! exported driver shadow), the real address of every one is resolved from the driver library under
//! its exact versioned name; [`function_at`] maps a real address back to its function, which the
//! doors (`crate::exports`) use to hand out their wrapper instead. Keyed by address, not by name, so
//! `cuGetProcAddress`'s version and per-thread-stream choices (different functions for one name)
//! are honoured exactly.
//!
//! The tables of real functions (the driver's own, and the next definition after this library for
//! the exported shadows) and their resolution are [`crate::resolve::Library`]'s, shared with NVML.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::ffi::*;
use crate::resolve::Library;
use crate::table::Row;

/// Expands the driver's table (`crate::table`) into [`DriverFn`], `NAME_ARRAY`, `ALL` and
/// [`rows`] (each row's C signature).
macro_rules! driver_functions {
    ($($rows:tt)*) => { crate::table::functions! { DriverFn -> CuResult; $($rows)* } };
}
crate::table::driver_table!(driver_functions);

/// Versioned names, in [`DriverFn`] order (the timeline names entry points by them).
pub const NAMES: &[&std::ffi::CStr] = &NAME_ARRAY;

pub use crate::resolve::Via;

/// The driver's real functions (see [`crate::resolve`]).
static DRIVER: Library<COUNT> = Library::new(&NAME_ARRAY, b"libcuda.so", c"libcuda.so.1");

/// The real function of row `R`, cast to the row's C signature; `None` when no driver can be
/// found.
#[inline]
pub fn real<R: Row<Library = DriverFn>>(via: Via) -> Option<R::Fn> {
    // SAFETY: the address was resolved under `R`'s exact versioned name, whose C signature is
    // `R::Fn` (the row states both).
    DRIVER
        .target(R::ID as usize, via)
        .map(|p| unsafe { R::cast(p) })
}

/// The driver function whose real address is `p`, the result of a lookup of `name`; the first such
/// lookup of a name the table lists (before the driver was found) is the first contact, which
/// resolves every function from the library holding `p`.
pub fn function_at(name: &[u8], p: usize) -> Option<DriverFn> {
    if !DRIVER.is_ready() {
        if !DRIVER.knows(name) {
            return None;
        }
        DRIVER.contact(p);
    }
    DRIVER.index_of_real(p).and_then(|i| ALL.get(i)).copied()
}

/// In a forked child: a resolution that a parent thread had under way at the instant of `fork` is
/// started again rather than waited for (that thread does not exist in the child).
pub fn forked() {
    DRIVER.forked();
}

/// Devices the process sees, 0 until learned (once, after the first successful allocation).
static DEVICE_COUNT: AtomicU32 = AtomicU32::new(0);

/// True when the process sees exactly one device: every allocation is then on device 0, and no
/// driver query is needed to learn it.
#[inline]
pub fn single_device() -> bool {
    DEVICE_COUNT.load(Ordering::Relaxed) == 1
}

/// Learns the number of devices (once; called after a successful allocation, when the driver is
/// surely initialised). The count cannot change during a process's life.
#[inline]
pub fn learn_device_count() {
    if DEVICE_COUNT.load(Ordering::Relaxed) == 0 {
        learn_device_count_slow();
    }
}

#[cold]
fn learn_device_count_slow() {
    let Some(call) = real::<rows::DeviceGetCount>(Via::Driver) else {
        return;
    };
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer for the duration of the call.
    if unsafe { call(&mut count) } == 0 && count > 0 {
        DEVICE_COUNT.store(count as u32, Ordering::Relaxed);
    }
}

/// The device of the calling thread's current context, `None` without one.
#[inline]
pub fn current_device() -> Option<u32> {
    if single_device() {
        return Some(0);
    }
    let call = real::<rows::CtxGetDevice>(Via::Driver)?;
    let mut device: c_int = -1;
    // SAFETY: `device` is a valid out-pointer for the duration of the call.
    let rc = unsafe { call(&mut device) };
    (rc == 0).then(|| u32::try_from(device).ok()).flatten()
}

/// True for the null, legacy (1) and per-thread (2) streams, which mean the current context.
#[inline]
pub fn is_special_stream(stream: *mut c_void) -> bool {
    (stream as usize) <= 2
}

/// The device a stream belongs to, asked of the driver; the current context's device for the
/// legacy, per-thread and null streams or when the driver predates `cuStreamGetDevice`.
#[inline]
pub fn stream_device(stream: *mut c_void) -> Option<u32> {
    if !is_special_stream(stream) {
        if let Some(call) = real::<rows::StreamGetDevice>(Via::Driver) {
            let mut device: c_int = -1;
            // SAFETY: `device` is a valid out-pointer; `stream` is the caller's own stream.
            if unsafe { call(stream, &mut device) } == 0 {
                return u32::try_from(device).ok();
            }
        }
    }
    current_device()
}

/// True once the driver was found (used to decide whether a process "used CUDA").
pub fn contacted() -> bool {
    DRIVER.is_ready()
}

/// The number of devices the driver shows this process, asked now (`None` before `cuInit` or
/// without a driver). For NVML's views, never on the allocation path.
pub fn device_count() -> Option<u32> {
    let call = real::<rows::DeviceGetCount>(Via::Driver)?;
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer for the duration of the call.
    let rc = unsafe { call(&mut count) };
    (rc == 0).then(|| u32::try_from(count).ok()).flatten()
}

/// The UUID of CUDA device `ordinal` (`cuDeviceGet` then `cuDeviceGetUuid`), to find it in NVML.
pub fn device_uuid(ordinal: u32) -> Option<[u8; 16]> {
    let get = real::<rows::DeviceGet>(Via::Driver)?;
    let get_uuid = real::<rows::DeviceGetUuid>(Via::Driver)?;
    let mut device: c_int = -1;
    // SAFETY: `device` is a valid out-pointer for the duration of the call.
    if unsafe { get(&mut device, c_int::try_from(ordinal).ok()?) } != 0 {
        return None;
    }
    let mut uuid = [0u8; 16];
    // SAFETY: `uuid` is 16 writable bytes (a CUuuid).
    (unsafe { get_uuid(uuid.as_mut_ptr(), device) } == 0).then_some(uuid)
}

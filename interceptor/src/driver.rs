//! The driver functions the hook wraps or calls, found by address.
//!
//! At first contact with the driver (the first lookup whose result lies in `libcuda.so*`, or the
//! first call of an exported driver shadow), the real address of every function below is resolved
//! from the driver library under its exact versioned name. From then on, whichever door hands out a
//! real address P (`dlsym`, `cuGetProcAddress`, `cuGetProcAddress_v2`) hands out our wrapper of P
//! instead. Keyed by address, not by name, so `cuGetProcAddress`'s version and per-thread-stream
//! choices (different functions for one name) are honoured exactly.
//!
//! The tables of real functions (the driver's own, and the next definition after this library for
//! the exported shadows) and their resolution are [`crate::resolve::Library`]'s, shared with NVML.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::exports;
use crate::resolve::Library;

/// Declares the driver functions: index, versioned name, and the wrapper handed out in place of the
/// real function (`None` for functions the hook only calls).
macro_rules! driver_functions {
    ($( $id:ident = $name:literal => $wrapper:expr ),* $(,)?) => {
        /// A driver function the hook knows.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        #[allow(clippy::enum_variant_names)]
        pub enum DriverFn { $( $id ),* }

        const COUNT: usize = [ $( stringify!($id) ),* ].len();
        /// Versioned names, in [`DriverFn`] order.
        const NAME_ARRAY: [&CStr; COUNT] = [ $( $name ),* ];
        pub const NAMES: &[&CStr] = &NAME_ARRAY;

        /// Address of the wrapper of each function, `0` for those never handed out.
        fn wrapper_address(f: DriverFn) -> usize {
            match f { $( DriverFn::$id => $wrapper ),* }
        }

        const ALL: [DriverFn; COUNT] = [ $( DriverFn::$id ),* ];
    };
}

driver_functions! {
    MemAlloc = c"cuMemAlloc_v2" => exports::wrap::cuMemAlloc_v2 as *const () as usize,
    MemFree = c"cuMemFree_v2" => exports::wrap::cuMemFree_v2 as *const () as usize,
    MemAllocPitch = c"cuMemAllocPitch_v2" => exports::wrap::cuMemAllocPitch_v2 as *const () as usize,
    MemAllocManaged = c"cuMemAllocManaged" => exports::wrap::cuMemAllocManaged as *const () as usize,
    MemAllocAsync = c"cuMemAllocAsync" => exports::wrap::cuMemAllocAsync as *const () as usize,
    MemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz" => exports::wrap::cuMemAllocAsync_ptsz as *const () as usize,
    MemFreeAsync = c"cuMemFreeAsync" => exports::wrap::cuMemFreeAsync as *const () as usize,
    MemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz" => exports::wrap::cuMemFreeAsync_ptsz as *const () as usize,
    MemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync" => exports::wrap::cuMemAllocFromPoolAsync as *const () as usize,
    MemAllocFromPoolAsyncPtsz = c"cuMemAllocFromPoolAsync_ptsz" => exports::wrap::cuMemAllocFromPoolAsync_ptsz as *const () as usize,
    MemCreate = c"cuMemCreate" => exports::wrap::cuMemCreate as *const () as usize,
    MemRelease = c"cuMemRelease" => exports::wrap::cuMemRelease as *const () as usize,
    MemGetInfo = c"cuMemGetInfo_v2" => exports::wrap::cuMemGetInfo_v2 as *const () as usize,
    DeviceTotalMem = c"cuDeviceTotalMem_v2" => exports::wrap::cuDeviceTotalMem_v2 as *const () as usize,
    MemHostAlloc = c"cuMemHostAlloc" => exports::wrap::cuMemHostAlloc as *const () as usize,
    MemAllocHost = c"cuMemAllocHost_v2" => exports::wrap::cuMemAllocHost_v2 as *const () as usize,
    MemFreeHost = c"cuMemFreeHost" => exports::wrap::cuMemFreeHost as *const () as usize,
    MemPoolCreate = c"cuMemPoolCreate" => exports::wrap::cuMemPoolCreate as *const () as usize,
    MemPoolDestroy = c"cuMemPoolDestroy" => exports::wrap::cuMemPoolDestroy as *const () as usize,
    DeviceGetDefaultMemPool = c"cuDeviceGetDefaultMemPool" => exports::wrap::cuDeviceGetDefaultMemPool as *const () as usize,
    DeviceGetMemPool = c"cuDeviceGetMemPool" => exports::wrap::cuDeviceGetMemPool as *const () as usize,
    GetProcAddress = c"cuGetProcAddress" => exports::wrap::cuGetProcAddress as *const () as usize,
    GetProcAddressV2 = c"cuGetProcAddress_v2" => exports::wrap::cuGetProcAddress_v2 as *const () as usize,
    StreamDestroy = c"cuStreamDestroy" => exports::wrap::cuStreamDestroy as *const () as usize,
    StreamDestroyV2 = c"cuStreamDestroy_v2" => exports::wrap::cuStreamDestroy_v2 as *const () as usize,
    CtxDestroy = c"cuCtxDestroy" => exports::wrap::cuCtxDestroy as *const () as usize,
    CtxDestroyV2 = c"cuCtxDestroy_v2" => exports::wrap::cuCtxDestroy_v2 as *const () as usize,
    PrimaryCtxReset = c"cuDevicePrimaryCtxReset" => exports::wrap::cuDevicePrimaryCtxReset as *const () as usize,
    PrimaryCtxResetV2 = c"cuDevicePrimaryCtxReset_v2" => exports::wrap::cuDevicePrimaryCtxReset_v2 as *const () as usize,
    PrimaryCtxRelease = c"cuDevicePrimaryCtxRelease" => exports::wrap::cuDevicePrimaryCtxRelease as *const () as usize,
    PrimaryCtxReleaseV2 = c"cuDevicePrimaryCtxRelease_v2" => exports::wrap::cuDevicePrimaryCtxRelease_v2 as *const () as usize,
    ModuleLoad = c"cuModuleLoad" => exports::wrap::cuModuleLoad as *const () as usize,
    ModuleLoadData = c"cuModuleLoadData" => exports::wrap::cuModuleLoadData as *const () as usize,
    ModuleLoadDataEx = c"cuModuleLoadDataEx" => exports::wrap::cuModuleLoadDataEx as *const () as usize,
    ModuleLoadFatBinary = c"cuModuleLoadFatBinary" => exports::wrap::cuModuleLoadFatBinary as *const () as usize,
    LibraryLoadData = c"cuLibraryLoadData" => exports::wrap::cuLibraryLoadData as *const () as usize,
    LibraryLoadFromFile = c"cuLibraryLoadFromFile" => exports::wrap::cuLibraryLoadFromFile as *const () as usize,
    CtxGetDevice = c"cuCtxGetDevice" => 0,
    DeviceGetUuid = c"cuDeviceGetUuid" => 0,
    DeviceGet = c"cuDeviceGet" => 0,
    StreamGetDevice = c"cuStreamGetDevice" => 0,
    DeviceGetCount = c"cuDeviceGetCount" => 0,
}

pub use crate::resolve::Via;

/// The driver's real functions (see [`crate::resolve`]).
static DRIVER: Library<COUNT> = Library::new(&NAME_ARRAY, b"libcuda.so", c"libcuda.so.1");

/// The function to call for `f`, `None` when no driver can be found.
#[inline]
pub fn target(f: DriverFn, via: Via) -> Option<usize> {
    DRIVER.target(f as usize, via)
}

/// Maps the result `p` of a lookup of `symbol` to what the caller should get: our wrapper when `p`
/// is a real driver (or NVML) function we wrap, otherwise `p` itself.
pub fn substitute(symbol: *const c_char, p: *mut c_void) -> *mut c_void {
    if p.is_null() || symbol.is_null() {
        return p;
    }
    // SAFETY: `symbol` is the NUL-terminated name the caller passed to the lookup.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if name.starts_with(b"nvml") {
        return crate::nvml::substitute(name, p);
    }
    if !name.starts_with(b"cu") {
        return p;
    }
    if !DRIVER.is_ready() {
        if !DRIVER.knows(name) {
            return p;
        }
        DRIVER.contact(p as usize);
    }
    wrapper_for(p as usize).map_or(p, |w| w as *mut c_void)
}

/// Our wrapper of the real driver function at `p`, if we wrap it.
pub fn wrapper_for(p: usize) -> Option<usize> {
    DRIVER
        .index_of_real(p)
        .and_then(|i| ALL.get(i))
        .map(|&f| wrapper_address(f))
        .filter(|&w| w != 0)
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
    let Some(f) = target(DriverFn::DeviceGetCount, Via::Driver) else {
        return;
    };
    let mut count: c_int = 0;
    // SAFETY: `f` is the driver's `cuDeviceGetCount(int *)`, resolved by its exact name.
    let call: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
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
    let f = target(DriverFn::CtxGetDevice, Via::Driver)?;
    let mut device: c_int = -1;
    // SAFETY: `f` is the driver's `cuCtxGetDevice(CUdevice *)`, resolved by its exact name.
    let call: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
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
        if let Some(f) = target(DriverFn::StreamGetDevice, Via::Driver) {
            let mut device: c_int = -1;
            // SAFETY: `f` is `cuStreamGetDevice(CUstream, CUdevice *)`, resolved by exact name.
            let call: unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int =
                unsafe { std::mem::transmute(f) };
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
    let f = target(DriverFn::DeviceGetCount, Via::Driver)?;
    let mut count: c_int = 0;
    // SAFETY: `f` is the driver's `cuDeviceGetCount(int *)`, resolved by its exact name.
    let call: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
    // SAFETY: `count` is a valid out-pointer for the duration of the call.
    let rc = unsafe { call(&mut count) };
    (rc == 0).then(|| u32::try_from(count).ok()).flatten()
}

/// The UUID of CUDA device `ordinal` (`cuDeviceGet` then `cuDeviceGetUuid`), to find it in NVML.
pub fn device_uuid(ordinal: u32) -> Option<[u8; 16]> {
    let get = target(DriverFn::DeviceGet, Via::Driver)?;
    let get_uuid = target(DriverFn::DeviceGetUuid, Via::Driver)?;
    let mut device: c_int = -1;
    // SAFETY: `get` is `cuDeviceGet(CUdevice *, int)`, resolved by its exact name.
    let get: unsafe extern "C" fn(*mut c_int, c_int) -> c_int = unsafe { std::mem::transmute(get) };
    // SAFETY: `device` is a valid out-pointer for the duration of the call.
    if unsafe { get(&mut device, c_int::try_from(ordinal).ok()?) } != 0 {
        return None;
    }
    let mut uuid = [0u8; 16];
    // SAFETY: `get_uuid` is `cuDeviceGetUuid(CUuuid *, CUdevice)`; a CUuuid is 16 bytes.
    let get_uuid: unsafe extern "C" fn(*mut u8, c_int) -> c_int =
        unsafe { std::mem::transmute(get_uuid) };
    // SAFETY: `uuid` is 16 writable bytes.
    (unsafe { get_uuid(uuid.as_mut_ptr(), device) } == 0).then_some(uuid)
}

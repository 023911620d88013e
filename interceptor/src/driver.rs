//! The driver functions the hook wraps or calls, found by address.
//!
//! At first contact with the driver (the first lookup whose result lies in `libcuda.so*`, or the
//! first call of an exported driver shadow), the real address of every function below is resolved
//! from the driver library under its exact versioned name. From then on, whichever door hands out a
//! real address P (`dlsym`, `cuGetProcAddress`, `cuGetProcAddress_v2`) hands out our wrapper of P
//! instead. Keyed by address, not by name, so `cuGetProcAddress`'s version and per-thread-stream
//! choices (different functions for one name) are honoured exactly.
//!
//! Two pointer tables: `REAL` (the driver's own functions, called by the wrappers we hand out) and
//! `NEXT` (what `dlsym(RTLD_NEXT)` gives after this library, called by our exported shadows, so that
//! another preloaded library between us and the driver stays in the chain).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};

use crate::dlsym::real_dlsym;
use crate::exports;

/// Declares the driver functions: index, versioned name, and the wrapper handed out in place of the
/// real function (`None` for functions the hook only calls).
macro_rules! driver_functions {
    ($( $id:ident = $name:literal => $wrapper:expr ),* $(,)?) => {
        /// A driver function the hook knows.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        #[allow(clippy::enum_variant_names)]
        pub enum DriverFn { $( $id ),* }

        /// Versioned names, in [`DriverFn`] order.
        pub const NAMES: &[&CStr] = &[ $( $name ),* ];

        /// Address of the wrapper of each function, `0` for those never handed out.
        fn wrapper_address(f: DriverFn) -> usize {
            match f { $( DriverFn::$id => $wrapper ),* }
        }

        const COUNT: usize = NAMES.len();
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

/// How a body reaches the real function: through the driver's own address (wrappers handed out by
/// address) or through the next definition after this library (exported shadows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Driver,
    Next,
}

static REAL: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
static NEXT: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

const UNKNOWN: u8 = 0;
const RESOLVING: u8 = 1;
const READY: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The function to call for `f`, `None` when no driver can be found.
#[inline]
pub fn target(f: DriverFn, via: Via) -> Option<usize> {
    let table = match via {
        Via::Driver => &REAL,
        Via::Next => &NEXT,
    };
    let p = table[f as usize].load(Ordering::Acquire);
    if p != 0 {
        return Some(p);
    }
    resolve_slow(f, via)
}

#[cold]
fn resolve_slow(f: DriverFn, via: Via) -> Option<usize> {
    if via == Via::Next {
        // SAFETY: a lookup of a NUL-terminated name; RTLD_NEXT from this library finds the next
        // definition after us, never our own.
        let p = unsafe { real_dlsym(libc::RTLD_NEXT, NAMES[f as usize].as_ptr()) } as usize;
        if p != 0 {
            NEXT[f as usize].store(p, Ordering::Release);
            return Some(p);
        }
    }
    ensure_loaded_driver();
    let p = REAL[f as usize].load(Ordering::Acquire);
    if p == 0 {
        return None;
    }
    if via == Via::Next {
        // Nothing after us defines it (the driver sits in a local scope): the driver's own
        // function is the next one, and caching it keeps the lookup off every later call.
        NEXT[f as usize].store(p, Ordering::Release);
    }
    Some(p)
}

/// First contact through an already loaded `libcuda.so.1`, when no lookup went through our doors
/// yet (a program linked to the driver calling our exported shadows).
#[cold]
pub fn ensure_loaded_driver() -> bool {
    if STATE.load(Ordering::Acquire) == READY {
        return true;
    }
    // SAFETY: RTLD_NOLOAD only returns a handle when the library is already loaded; nothing runs.
    let handle = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        )
    };
    !handle.is_null() && resolve_all(handle)
}

/// Resolves every function from the driver library `handle` (once per process).
fn resolve_all(handle: *mut c_void) -> bool {
    loop {
        match STATE.compare_exchange(UNKNOWN, RESOLVING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(READY) => return true,
            // Another thread is resolving: it takes microseconds, once per process.
            Err(_) => std::thread::yield_now(),
        }
    }
    for f in ALL {
        // SAFETY: `handle` is a live handle of the driver library; names are NUL-terminated.
        let p = unsafe { real_dlsym(handle, NAMES[f as usize].as_ptr()) } as usize;
        REAL[f as usize].store(p, Ordering::Release);
    }
    STATE.store(READY, Ordering::Release);
    true
}

/// True when `path`'s file name is the driver's (`libcuda.so`, `libcuda.so.1`, `libcuda.so.580...`).
fn is_driver_file(path: &CStr) -> bool {
    let bytes = path.to_bytes();
    let name = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
    name.starts_with(b"libcuda.so")
}

/// First contact through a lookup result: if `p` lies in the driver library, resolve from it.
#[cold]
fn contact(p: usize) {
    // SAFETY: `Dl_info` is plain data; dladdr fills it for any address and reports failure as 0.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is writable; `p` is only used as a number to look up.
    if unsafe { libc::dladdr(p as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return;
    }
    // SAFETY: dladdr returned a NUL-terminated file name owned by the loader.
    if !is_driver_file(unsafe { CStr::from_ptr(info.dli_fname) }) {
        return;
    }
    // SAFETY: the library is loaded (it holds `p`); RTLD_NOLOAD gives its handle without loading.
    let handle = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if !handle.is_null() {
        resolve_all(handle);
    }
}

/// Maps the result `p` of a lookup of `symbol` to what the caller should get: our wrapper when `p`
/// is a real driver function we wrap, otherwise `p` itself.
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
    if STATE.load(Ordering::Acquire) != READY {
        if !NAMES.iter().any(|n| n.to_bytes() == name) {
            return p;
        }
        contact(p as usize);
    }
    wrapper_for(p as usize).map_or(p, |w| w as *mut c_void)
}

/// Our wrapper of the real driver function at `p`, if we wrap it.
pub fn wrapper_for(p: usize) -> Option<usize> {
    ALL.iter()
        .find(|&&f| REAL[f as usize].load(Ordering::Acquire) == p)
        .map(|&f| wrapper_address(f))
        .filter(|&w| w != 0)
}

/// In a forked child: a resolution that a parent thread had under way at the instant of `fork` is
/// started again rather than waited for (that thread does not exist in the child).
pub fn forked() {
    let _ = STATE.compare_exchange(RESOLVING, UNKNOWN, Ordering::AcqRel, Ordering::Relaxed);
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
    STATE.load(Ordering::Acquire) == READY
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

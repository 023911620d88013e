//! The tables of every entry point the hook knows: one row per function, the one place where a
//! function is listed. Four tables, one per library: [`driver_table`], [`runtime_table`],
//! [`nvml_table`] and [`cpython_table`] (functions the hook only calls).
//!
//! A table is a macro that hands its rows to a macro its caller names (`table!(then)`), so each
//! layer expands the same rows into what it needs, and no layer reaches up into another:
//! - resolution (`driver.rs`, `runtime.rs`, `nvml.rs`, `cpython.rs`) expands them ([`functions`])
//!   into the enum of functions (`DriverFn`, `RuntimeFn`, `NvmlFn`, `CpythonFn`), the array of exact
//!   (versioned) names the real functions are resolved by, and one type per row (`rows::Id`, a
//!   [`Row`]) carrying its C signature, through which the library hands out the real function
//!   already cast (`driver::real::<rows::MemAlloc>(via)`);
//! - the doors (`exports.rs`) expand them into the exported shadow of each function (`#[no_mangle]`,
//!   `Via::Next`: the next definition after this library), the wrapper handed out in place of the
//!   real function by `dlsym` and `cuGetProcAddress` (`Via::Driver`: the library's own function),
//!   and the substitution map (real function → wrapper).
//!
//! A row is either
//!
//! ```text
//! Id = c"versioned_name" => fn exported_name(arg: CType, ...) => body(arg expressions);
//! ```
//!
//! a wrapped function: its enum variant, the exact name it is resolved by, its C signature (the
//! return type is the library's: `CUresult`, `cudaError_t`, `nvmlReturn_t`), and its policy: the
//! body (in `driver_hooks.rs`, `runtime_hooks.rs`, `streams.rs`, `loads.rs`, `nvml_hooks.rs`, or
//! `exports.rs` for the `cuGetProcAddress` doors) called as `body(entry, call, expressions...)`:
//! `entry` ([`Entry`]) names the row and how it was reached, `call` is the real function bound to
//! the caller's own arguments (the body calls it once, or not at all when it refuses), and the
//! expressions are the arguments the body reads. Which body a row names, with which arguments, is
//! what it is: an allocation (`mem_alloc`; `rt_malloc` with the memory kind it counts as), a free
//! (`mem_free`, ...), a view (`mem_get_info`), or a pass-through with a side effect
//! (`streams_gone`, `module_loaded`). A body that charges an allocation to the module of its
//! caller gets `caller!()` first: it expands inside the generated shadow or wrapper, where it reads
//! that function's return address (`crate::modules`). Functions that differ only in arguments the
//! policy does not read share a body (`cudaMalloc`, `cudaMallocAsync`, `cudaMallocFromPoolAsync`:
//! `rt_malloc`). Or it is
//!
//! ```text
//! Id = c"versioned_name" => fn(arg: CType, ...);
//! ```
//!
//! a function the hook only calls itself (no shadow, no wrapper), typed the same way. Adding an
//! entry point is one row here (and a test); `docs/architecture.md` ("Adding an entry point") says
//! what else to check.
//!
//! The exported name and the versioned name are written both (a `c"..."` literal cannot be made
//! from an identifier); the doors check at compile time that they agree.

/// The CUDA driver's functions. Order is the timeline's entry code: append new rows.
macro_rules! driver_table {
    ($then:ident) => {
        $then! {
            MemAlloc = c"cuMemAlloc_v2" => fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, bytes: usize) => mem_alloc(caller!(), dptr, bytes);
            MemFree = c"cuMemFree_v2" => fn cuMemFree_v2(dptr: CuDevicePtr) => mem_free(dptr);
            MemAllocPitch = c"cuMemAllocPitch_v2" => fn cuMemAllocPitch_v2(dptr: *mut CuDevicePtr, pitch: *mut usize, width: usize, height: usize, element: c_uint) => mem_alloc_pitch(caller!(), dptr, pitch, width, height);
            MemAllocManaged = c"cuMemAllocManaged" => fn cuMemAllocManaged(dptr: *mut CuDevicePtr, bytes: usize, flags: c_uint) => mem_alloc_managed(dptr, bytes);
            MemAllocAsync = c"cuMemAllocAsync" => fn cuMemAllocAsync(dptr: *mut CuDevicePtr, bytes: usize, stream: CuStream) => mem_alloc_async(caller!(), dptr, bytes, stream);
            MemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz" => fn cuMemAllocAsync_ptsz(dptr: *mut CuDevicePtr, bytes: usize, stream: CuStream) => mem_alloc_async(caller!(), dptr, bytes, stream);
            MemFreeAsync = c"cuMemFreeAsync" => fn cuMemFreeAsync(dptr: CuDevicePtr, stream: CuStream) => mem_free(dptr);
            MemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz" => fn cuMemFreeAsync_ptsz(dptr: CuDevicePtr, stream: CuStream) => mem_free(dptr);
            MemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync" => fn cuMemAllocFromPoolAsync(dptr: *mut CuDevicePtr, bytes: usize, pool: CuMemPool, stream: CuStream) => mem_alloc_from_pool(caller!(), dptr, bytes, pool, stream);
            MemAllocFromPoolAsyncPtsz = c"cuMemAllocFromPoolAsync_ptsz" => fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CuDevicePtr, bytes: usize, pool: CuMemPool, stream: CuStream) => mem_alloc_from_pool(caller!(), dptr, bytes, pool, stream);
            MemCreate = c"cuMemCreate" => fn cuMemCreate(handle: *mut CuMemHandle, bytes: usize, prop: *const CuLocationHead, flags: u64) => mem_create(caller!(), handle, bytes, prop);
            MemRelease = c"cuMemRelease" => fn cuMemRelease(handle: CuMemHandle) => mem_release(handle);
            MemGetInfo = c"cuMemGetInfo_v2" => fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => mem_get_info(free, total);
            DeviceTotalMem = c"cuDeviceTotalMem_v2" => fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CuDevice) => device_total_mem(bytes, device);
            MemHostAlloc = c"cuMemHostAlloc" => fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) => mem_host_alloc(pp, bytes);
            MemAllocHost = c"cuMemAllocHost_v2" => fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) => mem_host_alloc(pp, bytes);
            MemFreeHost = c"cuMemFreeHost" => fn cuMemFreeHost(p: *mut c_void) => mem_free(p as CuDevicePtr);
            MemPoolCreate = c"cuMemPoolCreate" => fn cuMemPoolCreate(pool: *mut CuMemPool, props: *const CuLocationHead) => mem_pool_create(pool, props);
            MemPoolDestroy = c"cuMemPoolDestroy" => fn cuMemPoolDestroy(pool: CuMemPool) => mem_pool_destroy(pool);
            DeviceGetDefaultMemPool = c"cuDeviceGetDefaultMemPool" => fn cuDeviceGetDefaultMemPool(pool: *mut CuMemPool, device: CuDevice) => device_get_mem_pool(pool, device);
            DeviceGetMemPool = c"cuDeviceGetMemPool" => fn cuDeviceGetMemPool(pool: *mut CuMemPool, device: CuDevice) => device_get_mem_pool(pool, device);
            GetProcAddress = c"cuGetProcAddress" => fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => get_proc_address(symbol, pfn);
            GetProcAddressV2 = c"cuGetProcAddress_v2" => fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => get_proc_address(symbol, pfn);
            StreamDestroy = c"cuStreamDestroy" => fn cuStreamDestroy(stream: CuStream) => stream_destroy(stream);
            StreamDestroyV2 = c"cuStreamDestroy_v2" => fn cuStreamDestroy_v2(stream: CuStream) => stream_destroy(stream);
            CtxDestroy = c"cuCtxDestroy" => fn cuCtxDestroy(ctx: *mut c_void) => streams_gone();
            CtxDestroyV2 = c"cuCtxDestroy_v2" => fn cuCtxDestroy_v2(ctx: *mut c_void) => streams_gone();
            PrimaryCtxReset = c"cuDevicePrimaryCtxReset" => fn cuDevicePrimaryCtxReset(device: CuDevice) => streams_gone();
            PrimaryCtxResetV2 = c"cuDevicePrimaryCtxReset_v2" => fn cuDevicePrimaryCtxReset_v2(device: CuDevice) => streams_gone();
            PrimaryCtxRelease = c"cuDevicePrimaryCtxRelease" => fn cuDevicePrimaryCtxRelease(device: CuDevice) => streams_gone();
            PrimaryCtxReleaseV2 = c"cuDevicePrimaryCtxRelease_v2" => fn cuDevicePrimaryCtxRelease_v2(device: CuDevice) => streams_gone();
            ModuleLoad = c"cuModuleLoad" => fn cuModuleLoad(module: *mut *mut c_void, path: *const c_char) => module_loaded();
            ModuleLoadData = c"cuModuleLoadData" => fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) => module_loaded();
            ModuleLoadDataEx = c"cuModuleLoadDataEx" => fn cuModuleLoadDataEx(module: *mut *mut c_void, image: *const c_void, count: c_uint, options: *mut c_int, values: *mut *mut c_void) => module_loaded();
            ModuleLoadFatBinary = c"cuModuleLoadFatBinary" => fn cuModuleLoadFatBinary(module: *mut *mut c_void, image: *const c_void) => module_loaded();
            LibraryLoadData = c"cuLibraryLoadData" => fn cuLibraryLoadData(library: *mut *mut c_void, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, library_count: c_uint) => module_loaded();
            LibraryLoadFromFile = c"cuLibraryLoadFromFile" => fn cuLibraryLoadFromFile(library: *mut *mut c_void, path: *const c_char, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, library_count: c_uint) => module_loaded();
            CtxGetDevice = c"cuCtxGetDevice" => fn(device: *mut CuDevice);
            DeviceGetUuid = c"cuDeviceGetUuid" => fn(uuid: *mut u8, device: CuDevice);
            DeviceGet = c"cuDeviceGet" => fn(device: *mut CuDevice, ordinal: c_int);
            StreamGetDevice = c"cuStreamGetDevice" => fn(stream: CuStream, device: *mut CuDevice);
            DeviceGetCount = c"cuDeviceGetCount" => fn(count: *mut c_int);
        }
    };
}

/// The CUDA runtime's functions (shadows only: the runtime has no lookup door of its own). Order is
/// the timeline's entry code (from `RUNTIME_BASE` on): append new rows.
macro_rules! runtime_table {
    ($then:ident) => {
        $then! {
            Malloc = c"cudaMalloc" => fn cudaMalloc(out: *mut *mut c_void, bytes: usize) => rt_malloc(caller!(), MemKind::Device, out, bytes);
            Free = c"cudaFree" => fn cudaFree(p: *mut c_void) => rt_free(p);
            MallocAsync = c"cudaMallocAsync" => fn cudaMallocAsync(out: *mut *mut c_void, bytes: usize, stream: CuStream) => rt_malloc(caller!(), MemKind::Device, out, bytes);
            MallocAsyncPtsz = c"cudaMallocAsync_ptsz" => fn cudaMallocAsync_ptsz(out: *mut *mut c_void, bytes: usize, stream: CuStream) => rt_malloc(caller!(), MemKind::Device, out, bytes);
            FreeAsync = c"cudaFreeAsync" => fn cudaFreeAsync(p: *mut c_void, stream: CuStream) => rt_free(p);
            FreeAsyncPtsz = c"cudaFreeAsync_ptsz" => fn cudaFreeAsync_ptsz(p: *mut c_void, stream: CuStream) => rt_free(p);
            MallocFromPoolAsync = c"cudaMallocFromPoolAsync" => fn cudaMallocFromPoolAsync(out: *mut *mut c_void, bytes: usize, pool: CuMemPool, stream: CuStream) => rt_malloc(caller!(), MemKind::Device, out, bytes);
            MallocFromPoolAsyncPtsz = c"cudaMallocFromPoolAsync_ptsz" => fn cudaMallocFromPoolAsync_ptsz(out: *mut *mut c_void, bytes: usize, pool: CuMemPool, stream: CuStream) => rt_malloc(caller!(), MemKind::Device, out, bytes);
            MallocManaged = c"cudaMallocManaged" => fn cudaMallocManaged(out: *mut *mut c_void, bytes: usize, flags: c_uint) => rt_malloc(caller!(), MemKind::Managed, out, bytes);
            MallocPitch = c"cudaMallocPitch" => fn cudaMallocPitch(out: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) => rt_malloc_pitch(caller!(), out, pitch, width, height);
            MallocHost = c"cudaMallocHost" => fn cudaMallocHost(out: *mut *mut c_void, bytes: usize) => rt_malloc(caller!(), MemKind::HostPinned, out, bytes);
            HostAlloc = c"cudaHostAlloc" => fn cudaHostAlloc(out: *mut *mut c_void, bytes: usize, flags: c_uint) => rt_malloc(caller!(), MemKind::HostPinned, out, bytes);
            FreeHost = c"cudaFreeHost" => fn cudaFreeHost(p: *mut c_void) => rt_free(p);
            MemGetInfo = c"cudaMemGetInfo" => fn cudaMemGetInfo(free: *mut usize, total: *mut usize) => mem_get_info(free, total);
        }
    };
}

/// NVML's functions: the memory figures it shows (adjusted to the views), and those the hook calls
/// to measure a process's use.
macro_rules! nvml_table {
    ($then:ident) => {
        $then! {
            MemoryInfo = c"nvmlDeviceGetMemoryInfo" => fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) => memory_info(device, memory);
            MemoryInfoV2 = c"nvmlDeviceGetMemoryInfo_v2" => fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) => memory_info_v2(device, memory);
            Processes = c"nvmlDeviceGetComputeRunningProcesses" => fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) => processes(device, count, infos);
            ProcessesV2 = c"nvmlDeviceGetComputeRunningProcesses_v2" => fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) => processes(device, count, infos);
            ProcessesV3 = c"nvmlDeviceGetComputeRunningProcesses_v3" => fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) => processes(device, count, infos);
            Init = c"nvmlInit_v2" => fn();
            GetUuid = c"nvmlDeviceGetUUID" => fn(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint);
            HandleByUuid = c"nvmlDeviceGetHandleByUUID" => fn(uuid: *const c_char, device: *mut nvmlDevice_t);
        }
    };
}

/// CPython's functions the hook calls to read a thread's Python frames without the GIL
/// (`crate::cpython`): called only, never wrapped. Their return types differ, so each row states
/// its own (`-> c_int`).
macro_rules! cpython_table {
    ($then:ident) => {
        $then! {
            IsInitialized = c"Py_IsInitialized" => fn() -> c_int;
            IsFinalizing = c"Py_IsFinalizing" => fn() -> c_int;
            IsFinalizingPrivate = c"_Py_IsFinalizing" => fn() -> c_int;
            ThisThreadState = c"PyGILState_GetThisThreadState" => fn() -> *mut c_void;
            Addr2Line = c"PyCode_Addr2Line" => fn(code: *mut c_void, offset: c_int) -> c_int;
            GetVersion = c"Py_GetVersion" => fn() -> *const c_char;
        }
    };
}

/// Expands a table's rows into its enum of functions, the array of their exact names, in row order,
/// and one type per row (`rows::Id`, a [`Row`]) carrying the row's C signature:
/// `functions!(Enum -> ReturnType)` inside a table call, i.e. `driver_table!(driver_functions)`
/// where `driver_functions` is a local `macro_rules!` that calls this one. Used by the resolution
/// layer, which hands out each row's real function already cast to its signature.
macro_rules! functions {
    ($enum:ident -> $ret:ty; $( $id:ident = $name:literal => fn $($sym:ident)? ( $($arg:ident : $ty:ty),* ) $(-> $own_ret:ty)? $( => $body:ident ( $($pass:expr),* ) )? ; )*) => {
        /// A function of this library the hook knows (a row of its table in `table.rs`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        #[allow(clippy::enum_variant_names)]
        pub enum $enum { $( $id ),* }

        /// The number of functions.
        pub const COUNT: usize = [ $( stringify!($id) ),* ].len();
        /// Exact (versioned) names, in enum order.
        pub const NAME_ARRAY: [&std::ffi::CStr; COUNT] = [ $( $name ),* ];
        /// Every function, in enum order (the resolution of a library wrapped by address maps a real
        /// function's index back to its function with it).
        #[allow(dead_code)]
        pub const ALL: [$enum; COUNT] = [ $( $enum::$id ),* ];

        /// One type per row, each a [`crate::table::Row`] with the row's C signature.
        pub mod rows {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[doc = concat!("The row `", stringify!($id), "`.")]
                pub struct $id;
                impl crate::table::Row for $id {
                    type Library = $enum;
                    const ID: $enum = $enum::$id;
                    type Fn = unsafe extern "C" fn($($ty),*) -> crate::table::return_type!($ret $(, $own_ret)?);
                    unsafe fn cast(p: usize) -> Self::Fn {
                        // SAFETY: the caller's contract: `p` is the address of this row's function,
                        // resolved under its exact name, whose C signature is `Self::Fn`.
                        unsafe { std::mem::transmute::<usize, Self::Fn>(p) }
                    }
                }
            )*
        }
    };
}

/// A row's return type: its own when it states one (`-> c_int`), else its library's.
macro_rules! return_type {
    ($library:ty) => {
        $library
    };
    ($library:ty, $own:ty) => {
        $own
    };
}

/// A row of a table as a type (`driver::rows::MemAlloc`, generated by `functions!`): its function
/// and its C signature. The resolution layer hands out a row's real function as `Row::Fn`
/// (`driver::real::<rows::MemAlloc>(via)`), so no other file states a signature or casts an
/// address.
pub trait Row {
    /// The library's enum of functions (`DriverFn`, `RuntimeFn`, `NvmlFn`).
    type Library;
    /// This row's function.
    const ID: Self::Library;
    /// The row's C signature, as a function pointer.
    type Fn: Copy;
    /// `p` as this row's function.
    ///
    /// # Safety
    /// `p` must be the address of a function of exactly this row's signature (one resolved under
    /// the row's exact name).
    unsafe fn cast(p: usize) -> Self::Fn;
}

/// How a body reaches the real function: through the library's own address (wrappers handed out by
/// address) or through the next definition after this library (exported shadows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Driver,
    Next,
}

/// What a body is told about the entry point it runs for: which row, reached which way. (The real
/// function itself comes as the body's `call`, already bound to the caller's arguments.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<F> {
    pub function: F,
    pub via: Via,
}

pub(crate) use {cpython_table, driver_table, functions, nvml_table, return_type, runtime_table};

/// True when the bytes of `a` and `b` are equal (usable in a constant, for the doors' check that a
/// row's exported name and versioned name agree).
pub const fn same_name(a: &std::ffi::CStr, b: &str) -> bool {
    let (a, b) = (a.to_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

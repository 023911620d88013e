//! Every symbol the library exports, in one place. Each is one line over a body in [`crate::hooks`].
//!
//! - runtime shadows (`cudaMalloc`, ...): door 1, symbol interposition of the CUDA runtime;
//! - driver shadows (`cuMemAlloc_v2`, ...): door 4, for programs linked to the driver; they call the
//!   next definition after this library (`RTLD_NEXT`), so other preloaded libraries stay chained;
//! - [`wrap`]: the same driver functions as handed out by address (doors 2 and 3: `dlsym`,
//!   `cuGetProcAddress`, `cuGetProcAddress_v2`); they call the driver's own function;
//! - NVML shadows and [`nvml_wrap`]: the same two doors for NVML's memory functions
//!   ([`crate::nvml`]);
//! - `dlsym` itself lives in [`crate::dlsym`] (it is a naked trampoline);
//! - `gpumemhook_*`: the in-process reader interface.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::{DriverFn, Via};
use crate::ffi::*;
use crate::hooks;
use crate::nvml::{self, NvmlFn, NvmlReturn};
use crate::runtime::RuntimeFn;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
};

/// Declares each driver function once and generates its exported shadow (reached through
/// `RTLD_NEXT`) and its address wrapper (reached through the driver's own address).
macro_rules! driver_exports {
    ($( fn $name:ident($($arg:ident: $ty:ty),*) => $body:ident($id:ident); )*) => {
        $(
            /// # Safety
            /// Called as the CUDA driver function of this name, under that function's contract.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CuResult {
                hooks::$body(DriverFn::$id, Via::Next, $($arg),*)
            }
        )*
        /// The wrappers handed out in place of the driver's own functions.
        pub mod wrap {
            use super::*;
            $(
                /// # Safety
                /// Called as the CUDA driver function it replaces, under that function's contract.
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> CuResult {
                    hooks::$body(DriverFn::$id, Via::Driver, $($arg),*)
                }
            )*
        }
    };
}

driver_exports! {
    fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, bytes: usize) => mem_alloc(MemAlloc);
    fn cuMemFree_v2(dptr: CuDevicePtr) => mem_free(MemFree);
    fn cuMemAllocPitch_v2(dptr: *mut CuDevicePtr, pitch: *mut usize, width: usize, height: usize, element: c_uint) => mem_alloc_pitch(MemAllocPitch);
    fn cuMemAllocManaged(dptr: *mut CuDevicePtr, bytes: usize, flags: c_uint) => mem_alloc_managed(MemAllocManaged);
    fn cuMemAllocAsync(dptr: *mut CuDevicePtr, bytes: usize, stream: CuStream) => mem_alloc_async(MemAllocAsync);
    fn cuMemAllocAsync_ptsz(dptr: *mut CuDevicePtr, bytes: usize, stream: CuStream) => mem_alloc_async(MemAllocAsyncPtsz);
    fn cuMemFreeAsync(dptr: CuDevicePtr, stream: CuStream) => mem_free_async(MemFreeAsync);
    fn cuMemFreeAsync_ptsz(dptr: CuDevicePtr, stream: CuStream) => mem_free_async(MemFreeAsyncPtsz);
    fn cuMemAllocFromPoolAsync(dptr: *mut CuDevicePtr, bytes: usize, pool: CuMemPool, stream: CuStream) => mem_alloc_from_pool(MemAllocFromPoolAsync);
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CuDevicePtr, bytes: usize, pool: CuMemPool, stream: CuStream) => mem_alloc_from_pool(MemAllocFromPoolAsyncPtsz);
    fn cuMemCreate(handle: *mut CuMemHandle, bytes: usize, prop: *const CuLocationHead, flags: u64) => mem_create(MemCreate);
    fn cuMemRelease(handle: CuMemHandle) => mem_release(MemRelease);
    fn cuMemPoolCreate(pool: *mut CuMemPool, props: *const CuLocationHead) => mem_pool_create(MemPoolCreate);
    fn cuMemPoolDestroy(pool: CuMemPool) => mem_pool_destroy(MemPoolDestroy);
    fn cuDeviceGetDefaultMemPool(pool: *mut CuMemPool, device: CuDevice) => device_get_mem_pool(DeviceGetDefaultMemPool);
    fn cuDeviceGetMemPool(pool: *mut CuMemPool, device: CuDevice) => device_get_mem_pool(DeviceGetMemPool);
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => mem_get_info(MemGetInfo);
    fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CuDevice) => device_total_mem(DeviceTotalMem);
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) => mem_host_alloc(MemHostAlloc);
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) => mem_alloc_host(MemAllocHost);
    fn cuMemFreeHost(p: *mut c_void) => mem_free_host(MemFreeHost);
    fn cuStreamDestroy(stream: CuStream) => stream_destroy(StreamDestroy);
    fn cuStreamDestroy_v2(stream: CuStream) => stream_destroy(StreamDestroyV2);
    fn cuCtxDestroy(ctx: *mut c_void) => context_gone(CtxDestroy);
    fn cuCtxDestroy_v2(ctx: *mut c_void) => context_gone(CtxDestroyV2);
    fn cuDevicePrimaryCtxReset(device: CuDevice) => primary_context_gone(PrimaryCtxReset);
    fn cuDevicePrimaryCtxReset_v2(device: CuDevice) => primary_context_gone(PrimaryCtxResetV2);
    fn cuDevicePrimaryCtxRelease(device: CuDevice) => primary_context_gone(PrimaryCtxRelease);
    fn cuDevicePrimaryCtxRelease_v2(device: CuDevice) => primary_context_gone(PrimaryCtxReleaseV2);
    fn cuModuleLoad(module: *mut *mut c_void, path: *const c_char) => module_load(ModuleLoad);
    fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) => module_load_data(ModuleLoadData);
    fn cuModuleLoadDataEx(module: *mut *mut c_void, image: *const c_void, count: c_uint, options: *mut c_int, values: *mut *mut c_void) => module_load_data_ex(ModuleLoadDataEx);
    fn cuModuleLoadFatBinary(module: *mut *mut c_void, image: *const c_void) => module_load_data(ModuleLoadFatBinary);
    fn cuLibraryLoadData(library: *mut *mut c_void, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, library_count: c_uint) => library_load(LibraryLoadData);
    fn cuLibraryLoadFromFile(library: *mut *mut c_void, path: *const c_char, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, library_count: c_uint) => library_load_from_file(LibraryLoadFromFile);
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => get_proc_address(GetProcAddress);
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => get_proc_address_v2(GetProcAddressV2);
}

/// Declares each NVML function once and generates its exported shadow (reached through
/// `RTLD_NEXT`) and its address wrapper (handed out by the `dlsym` door), as for the driver.
macro_rules! nvml_exports {
    ($( fn $name:ident($($arg:ident: $ty:ty),*) => $body:ident($id:ident); )*) => {
        $(
            /// # Safety
            /// Called as the NVML function of this name, under that function's contract.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> NvmlReturn {
                nvml::$body(NvmlFn::$id, Via::Next, $($arg),*)
            }
        )*
        /// The wrappers handed out in place of NVML's own functions.
        pub mod nvml_wrap {
            use super::*;
            $(
                /// # Safety
                /// Called as the NVML function it replaces, under that function's contract.
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> NvmlReturn {
                    nvml::$body(NvmlFn::$id, Via::Driver, $($arg),*)
                }
            )*
        }
    };
}

nvml_exports! {
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) => memory_info(MemoryInfo);
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) => memory_info_v2(MemoryInfoV2);
    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) => processes(Processes);
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) => processes(ProcessesV2);
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) => processes(ProcessesV3);
}

/// Declares each runtime shadow as one line over its body.
macro_rules! runtime_exports {
    ($( fn $name:ident($($arg:ident: $ty:ty),*) => $body:ident($id:ident); )*) => {
        $(
            /// # Safety
            /// Called as the CUDA runtime function of this name, under that function's contract.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CudaError {
                hooks::$body(RuntimeFn::$id, $($arg),*)
            }
        )*
    };
}

runtime_exports! {
    fn cudaMalloc(out: *mut *mut c_void, bytes: usize) => rt_malloc(Malloc);
    fn cudaFree(p: *mut c_void) => rt_free(Free);
    fn cudaMallocAsync(out: *mut *mut c_void, bytes: usize, stream: CuStream) => rt_malloc_async(MallocAsync);
    fn cudaMallocAsync_ptsz(out: *mut *mut c_void, bytes: usize, stream: CuStream) => rt_malloc_async(MallocAsyncPtsz);
    fn cudaFreeAsync(p: *mut c_void, stream: CuStream) => rt_free_async(FreeAsync);
    fn cudaFreeAsync_ptsz(p: *mut c_void, stream: CuStream) => rt_free_async(FreeAsyncPtsz);
    fn cudaMallocFromPoolAsync(out: *mut *mut c_void, bytes: usize, pool: CuMemPool, stream: CuStream) => rt_malloc_from_pool(MallocFromPoolAsync);
    fn cudaMallocFromPoolAsync_ptsz(out: *mut *mut c_void, bytes: usize, pool: CuMemPool, stream: CuStream) => rt_malloc_from_pool(MallocFromPoolAsyncPtsz);
    fn cudaMallocManaged(out: *mut *mut c_void, bytes: usize, flags: c_uint) => rt_malloc_managed(MallocManaged);
    fn cudaMallocPitch(out: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) => rt_malloc_pitch(MallocPitch);
    fn cudaMallocHost(out: *mut *mut c_void, bytes: usize) => rt_malloc_host(MallocHost);
    fn cudaHostAlloc(out: *mut *mut c_void, bytes: usize, flags: c_uint) => rt_host_alloc(HostAlloc);
    fn cudaFreeHost(p: *mut c_void) => rt_free(FreeHost);
    fn cudaMemGetInfo(free: *mut usize, total: *mut usize) => rt_mem_get_info(MemGetInfo);
}

/// The in-process segment, for readers in this process (NULL when disabled). Asking for it is a use:
/// a forked child that has none yet makes its own.
#[no_mangle]
pub extern "C" fn gpumemhook_segment() -> *const gpumemhook_reader::Segment {
    crate::state::active().map_or(std::ptr::null(), |a| a.segment as *const _)
}

/// The segment file's path (NUL-terminated), NULL for a private segment or while this process has
/// none (a forked child before its first CUDA call or [`gpumemhook_segment`]).
#[no_mangle]
pub extern "C" fn gpumemhook_segment_path() -> *const c_char {
    crate::state::segment_path()
}

/// The hook's version (NUL-terminated).
#[no_mangle]
pub extern "C" fn gpumemhook_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

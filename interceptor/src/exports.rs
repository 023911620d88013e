//! The doors: every symbol the library exports, the wrappers handed out by address, and the
//! substitution of a real function's address by its wrapper. The top layer (see
//! `docs/architecture.md`, "Layers of the hook").
//!
//! Generated from the tables of `crate::table`, one macro arm per library, each row giving:
//! - its exported shadow (`cuMemAlloc_v2`, `cudaMalloc`, `nvmlDeviceGetMemoryInfo`, ...): door 1
//!   (runtime) and door 4 (driver, NVML); driver and NVML shadows call the next definition after
//!   this library (`Via::Next`, i.e. `RTLD_NEXT`), so other preloaded libraries stay chained;
//! - its wrapper ([`wrap`], [`nvml_wrap`]): the same function as handed out by address (doors 2
//!   and 3: `dlsym`, `cuGetProcAddress`, `cuGetProcAddress_v2`); it calls the library's own function
//!   (`Via::Driver`);
//! - its place in the substitution map: [`substitute`] maps a real function's address (found by
//!   `crate::driver::function_at` / `crate::nvml::function_at`) to the wrapper.
//!
//! Also here, so that this file is the one list of what the library exports: the bodies of the
//! `cuGetProcAddress` doors (they substitute in the driver's answer), `dlsym` (the naked trampoline
//! that `crate::dlsym` defines, instantiated here with its lookup), and the `gpumemhook_*`
//! in-process reader interface (`gpumemhook_segment`, `gpumemhook_segment_path`,
//! `gpumemhook_arm_oom_report`, `gpumemhook_trace_scope`, `gpumemhook_version`). A row's body is its
//! policy, in `crate::hooks` or `crate::nvml_hooks`.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use gpumemhook_reader::MemKind;

use crate::driver::{self, DriverFn, Via};
use crate::ffi::*;
use crate::modules::caller; // the `caller!()` of the table's rows, which expand here
use crate::nvml::{self, NvmlFn, NvmlReturn};
use crate::runtime::{as_fn, RuntimeFn};
use crate::table::same_name;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
};

/// The address of row `$sym`'s wrapper in module `$module`, `None` for a row without one.
macro_rules! wrapper_of {
    ($module:ident) => {
        None
    };
    ($module:ident $sym:ident) => {
        Some($module::$sym as *const () as usize)
    };
}

/// Checks at compile time that a row's exported name is its versioned name.
macro_rules! check_name {
    ($name:literal) => {};
    ($name:literal $sym:ident) => {
        const _: () = assert!(same_name($name, stringify!($sym)), "a row's names differ");
    };
}

/// The bodies the driver's rows name: the policy's, and the `cuGetProcAddress` doors below.
mod driver_bodies {
    pub use super::{get_proc_address, get_proc_address_v2};
    pub use crate::hooks::*;
}

/// The driver's rows: exported shadows, wrappers, and the map from a function to its wrapper. Every
/// driver shadow and wrapper is generated here, in this one arm: what they should all do before
/// their body (read something of the caller, say) is one line here.
macro_rules! driver_doors {
    ($( $id:ident = $name:literal $( => fn $sym:ident ( $($arg:ident : $ty:ty),* ) => $body:ident ( $($pass:expr),* ) )? ; )*) => {
        $( check_name!($name $($sym)?); )*
        $($(
            /// # Safety
            /// Called as the CUDA driver function of this name, under that function's contract.
            #[no_mangle]
            #[inline(never)]
            pub unsafe extern "C" fn $sym($($arg: $ty),*) -> CuResult {
                driver_bodies::$body(DriverFn::$id, Via::Next, $($pass),*)
            }
        )?)*
        /// The wrappers handed out in place of the driver's own functions.
        pub mod wrap {
            use super::*;
            $($(
                /// # Safety
                /// Called as the CUDA driver function it replaces, under that function's contract.
                #[inline(never)]
                pub unsafe extern "C" fn $sym($($arg: $ty),*) -> CuResult {
                    driver_bodies::$body(DriverFn::$id, Via::Driver, $($pass),*)
                }
            )?)*
        }
        /// Our wrapper of driver function `f`, `None` for those the hook only calls.
        fn driver_wrapper(f: DriverFn) -> Option<usize> {
            match f { $( DriverFn::$id => wrapper_of!(wrap $($sym)?) ),* }
        }
    };
}
crate::table::driver_table!(driver_doors);

/// The runtime's rows: exported shadows (the runtime is reached by symbol interposition only), all
/// generated in this one arm.
macro_rules! runtime_doors {
    ($( $id:ident = $name:literal $( => fn $sym:ident ( $($arg:ident : $ty:ty),* ) => $body:ident ( $($pass:expr),* ) )? ; )*) => {
        $( check_name!($name $($sym)?); )*
        $($(
            /// # Safety
            /// Called as the CUDA runtime function of this name, under that function's contract.
            #[no_mangle]
            #[inline(never)]
            pub unsafe extern "C" fn $sym($($arg: $ty),*) -> CudaError {
                crate::hooks::$body(RuntimeFn::$id, $($pass),*)
            }
        )?)*
    };
}
crate::table::runtime_table!(runtime_doors);

/// NVML's rows: exported shadows, wrappers, and the map from a function to its wrapper (all of them
/// generated in this one arm, as for the driver).
macro_rules! nvml_doors {
    ($( $id:ident = $name:literal $( => fn $sym:ident ( $($arg:ident : $ty:ty),* ) => $body:ident ( $($pass:expr),* ) )? ; )*) => {
        $( check_name!($name $($sym)?); )*
        $($(
            /// # Safety
            /// Called as the NVML function of this name, under that function's contract.
            #[no_mangle]
            pub unsafe extern "C" fn $sym($($arg: $ty),*) -> NvmlReturn {
                crate::nvml_hooks::$body(NvmlFn::$id, Via::Next, $($pass),*)
            }
        )?)*
        /// The wrappers handed out in place of NVML's own functions.
        pub mod nvml_wrap {
            use super::*;
            $($(
                /// # Safety
                /// Called as the NVML function it replaces, under that function's contract.
                pub unsafe extern "C" fn $sym($($arg: $ty),*) -> NvmlReturn {
                    crate::nvml_hooks::$body(NvmlFn::$id, Via::Driver, $($pass),*)
                }
            )?)*
        }
        /// Our wrapper of NVML function `f`, `None` for those the hook only calls.
        fn nvml_wrapper(f: NvmlFn) -> Option<usize> {
            match f { $( NvmlFn::$id => wrapper_of!(nvml_wrap $($sym)?) ),* }
        }
    };
}
crate::table::nvml_table!(nvml_doors);

/// Maps the result `p` of a lookup of `symbol` (by `dlsym` or `cuGetProcAddress`) to what the caller
/// should get: our wrapper when `p` is a real driver (or NVML) function we wrap, otherwise `p`.
pub fn substitute(symbol: *const c_char, p: *mut c_void) -> *mut c_void {
    if p.is_null() || symbol.is_null() {
        return p;
    }
    // SAFETY: `symbol` is the NUL-terminated name the caller passed to the lookup.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let wrapper = if name.starts_with(b"nvml") {
        nvml::function_at(name, p as usize).and_then(nvml_wrapper)
    } else if name.starts_with(b"cu") {
        driver::function_at(name, p as usize).and_then(driver_wrapper)
    } else {
        None
    };
    wrapper.map_or(p, |w| w as *mut c_void)
}

// ---- the `cuGetProcAddress` doors ----

type GetProcFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;
type GetProcV2Fn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;

/// `cuGetProcAddress` (v1): whatever it hands out passes through [`substitute`].
pub fn get_proc_address(
    f: DriverFn,
    via: Via,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    let Some(real) = driver::target(f, via) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: resolved under the exact versioned name of `f`, whose C signature is `GetProcFn`.
    let real = unsafe { as_fn::<GetProcFn>(real) };
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(symbol, pfn, version, flags) };
    substitute_out(rc, symbol, pfn);
    rc
}

/// `cuGetProcAddress_v2`: as v1, with the symbol-status out-parameter passed along.
pub fn get_proc_address_v2(
    f: DriverFn,
    via: Via,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    let Some(real) = driver::target(f, via) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: resolved under the exact versioned name of `f`, whose C signature is `GetProcV2Fn`.
    let real = unsafe { as_fn::<GetProcV2Fn>(real) };
    // SAFETY: forwards the caller's arguments unchanged.
    let rc = unsafe { real(symbol, pfn, version, flags, status) };
    substitute_out(rc, symbol, pfn);
    rc
}

fn substitute_out(rc: CuResult, symbol: *const c_char, pfn: *mut *mut c_void) {
    if rc == CUDA_SUCCESS && !pfn.is_null() {
        // SAFETY: `pfn` is non-null and was written by the successful call.
        unsafe { *pfn = substitute(symbol, *pfn) };
    }
}

// ---- `dlsym` (door 2; the trampoline is `crate::dlsym`'s) ----

/// The non-`RTLD_NEXT` path of our `dlsym`: glibc's answer, with our wrapper substituted.
extern "C" fn dlsym_lookup(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: forwards the caller's own arguments unchanged.
    let p = unsafe { crate::resolve::real_dlsym(handle, symbol) };
    substitute(symbol, p)
}

#[cfg(all(gpumemhook_dlsym_versions, target_arch = "x86_64"))]
crate::dlsym::exported_dlsym!(
    "gpumemhook_dlsym",
    [
        ".symver gpumemhook_dlsym, dlsym@GLIBC_2.2.5",
        ".symver gpumemhook_dlsym, dlsym@@GLIBC_2.34"
    ],
    dlsym_lookup
);
#[cfg(all(gpumemhook_dlsym_versions, target_arch = "aarch64"))]
crate::dlsym::exported_dlsym!(
    "gpumemhook_dlsym",
    [
        ".symver gpumemhook_dlsym, dlsym@GLIBC_2.17",
        ".symver gpumemhook_dlsym, dlsym@@GLIBC_2.34"
    ],
    dlsym_lookup
);
#[cfg(all(
    not(gpumemhook_dlsym_versions),
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
crate::dlsym::exported_dlsym!("dlsym", [], dlsym_lookup);

/// Without a trampoline for this architecture, `RTLD_NEXT` lookups are made on the caller's behalf
/// from here: correct unless another preloaded library relies on `RTLD_NEXT` through us.
///
/// # Safety
/// As for glibc's `dlsym`.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    dlsym_lookup(handle, symbol)
}

// ---- the in-process reader interface ----

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

/// Lets the next out-of-memory write a report again (`GPUMEMHOOK_OOM_REPORT`; `%n` in its path
/// numbers the reports). Returns 1, or 0 when no out-of-memory report was asked for.
#[no_mangle]
pub extern "C" fn gpumemhook_arm_oom_report() -> c_int {
    c_int::from(crate::report::arm_out_of_memory_report())
}

/// Marks a scope opening (`open != 0`) or closing on the timeline. Called by in-process readers.
#[no_mangle]
pub extern "C" fn gpumemhook_trace_scope(open: c_int, slot: u32, name: *const c_char) {
    crate::trace::scope_mark(open != 0, slot, || {
        if name.is_null() {
            b""
        } else {
            // SAFETY: a non-null `name` is the caller's NUL-terminated string.
            unsafe { CStr::from_ptr(name) }.to_bytes()
        }
    });
}

/// The hook's version (NUL-terminated).
#[no_mangle]
pub extern "C" fn gpumemhook_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

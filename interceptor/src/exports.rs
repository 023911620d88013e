//! The doors: every symbol the library exports, the wrappers handed out by address, and the
//! substitution of a real function's address by its wrapper. The top layer (see
//! `docs/architecture.md`, "Layers of the hook").
//!
//! Generated from the tables of `crate::table` by one macro arm for the three libraries (`doors!`,
//! with `door!` for one row reached one way), each row giving:
//! - its exported shadow (`cuMemAlloc_v2`, `cudaMalloc`, `nvmlDeviceGetMemoryInfo`, ...): door 1
//!   (runtime) and door 4 (driver, NVML); driver and NVML shadows call the next definition after
//!   this library (`Via::Next`, i.e. `RTLD_NEXT`), so other preloaded libraries stay chained;
//! - its wrapper ([`wrap`], [`nvml_wrap`]; the runtime's are never handed out): the same function as handed out by address (doors 2
//!   and 3: `dlsym`, `cuGetProcAddress`, `cuGetProcAddress_v2`); it calls the library's own function
//!   (`Via::Driver`);
//! - its place in the substitution map: [`substitute`] maps a real function's address (found by
//!   `crate::driver::function_at` / `crate::nvml::function_at`) to the wrapper.
//!
//! Also here, so that this file is the one list of what the library exports: the bodies of the
//! `cuGetProcAddress` doors (they substitute in the driver's answer), `dlsym` (the naked trampoline
//! that `crate::dlsym` defines, instantiated here with its lookup), and the `gpumemhook_*`
//! in-process reader interface (`gpumemhook_segment`, `gpumemhook_segment_path`,
//! `gpumemhook_arm_oom_report`, `gpumemhook_trace_scope`, `gpumemhook_version`), whose names and C
//! signatures are the rows of `gpumemhook_reader::export_rows` (`reader/src/exports.rs`; checked
//! at compile time, at the end of this file). A row's body is its policy (the policy layer:
//! `crate::driver_hooks`, `crate::runtime_hooks`, `crate::nvml_hooks`, ...).
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use gpumemhook_segment::MemKind;

use crate::driver::{self, DriverFn};
use crate::ffi::*;
use crate::modules::caller; // the `caller!()` of the table's rows, which expand here
use crate::nvml::{self, NvmlFn, NvmlReturn, NVML_ERROR_LIBRARY_NOT_FOUND};
use crate::runtime::RuntimeFn;
use crate::table::{same_name, Entry, Via};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
};

/// The address of row `$sym`'s wrapper, `None` for a row without one.
macro_rules! wrapper_of {
    () => {
        None
    };
    ($sym:ident) => {
        Some($sym as *const () as usize)
    };
}

/// Checks at compile time that a row's exported name is its versioned name.
macro_rules! check_name {
    ($name:literal) => {};
    ($name:literal $sym:ident) => {
        const _: () = assert!(same_name($name, stringify!($sym)), "a row's names differ");
    };
}

/// One row's door reached `$via` (`Next`: the exported shadow; `Driver`: the wrapper handed out by
/// address), for the library described by the rest: its function enum, return type, what to answer
/// when the real function cannot be found, the module of its `real::<Row>(via)` and its bodies. A
/// row the hook only calls has no door.
macro_rules! door {
    ($via:ident [$($attr:meta)?] $enum:ident $ret:ty, $missing:expr, $lib:ident $bodies:ident; $id:ident ( $($arg:ident : $ty:ty),* )) => {};
    ($via:ident [$($attr:meta)?] $enum:ident $ret:ty, $missing:expr, $lib:ident $bodies:ident; $id:ident $sym:ident ( $($arg:ident : $ty:ty),* ) => $body:ident ( $($pass:expr),* )) => {
        /// # Safety
        /// Called as the function of this name, under that function's contract.
        $(#[$attr])?
        #[inline(never)]
        pub unsafe extern "C" fn $sym($($arg: $ty),*) -> $ret {
            let Some(real) = crate::$lib::real::<crate::$lib::rows::$id>(Via::$via) else {
                return $missing;
            };
            // SAFETY: `real` is this row's function, resolved under its exact name and cast to its
            // C signature; it is called with the caller's own arguments, under the caller's contract.
            let call = move || unsafe { real($($arg),*) };
            $bodies::$body(Entry { function: $enum::$id, via: Via::$via }, call, $($pass),*)
        }
    };
}

/// Every door of one library, from its table: the exported shadows (`Via::Next`: the next
/// definition after this library, so other preloaded libraries stay chained), the wrappers handed
/// out in place of its own functions (module `$wrap`, `Via::Driver`) and the map from a function to
/// its wrapper (`$wrap::of`). The one arm for the three libraries: what every shadow and wrapper
/// should do before its body (read something of the caller, say) is one line in `door!`.
macro_rules! doors {
    ($enum:ident -> $ret:ty, missing $missing:expr, real $lib:ident, bodies $bodies:ident, wrappers $wrap:ident; $( $id:ident = $name:literal => fn $($sym:ident)? ( $($arg:ident : $ty:ty),* ) $( => $body:ident ( $($pass:expr),* ) )? ; )*) => {
        $( check_name!($name $($sym)?); )*
        $( door!(Next [no_mangle] $enum $ret, $missing, $lib $bodies; $id $($sym)? ($($arg: $ty),*) $(=> $body($($pass),*))?); )*
        /// The wrappers handed out in place of the library's own functions.
        // The runtime has no lookup door: its wrappers and `of` are never used.
        #[allow(dead_code)]
        pub mod $wrap {
            use super::*;
            $( door!(Driver [] $enum $ret, $missing, $lib $bodies; $id $($sym)? ($($arg: $ty),*) $(=> $body($($pass),*))?); )*
            /// Our wrapper of function `f`, `None` for those the hook only calls.
            pub fn of(f: $enum) -> Option<usize> {
                match f { $( $enum::$id => wrapper_of!($($sym)?) ),* }
            }
        }
    };
}

/// The bodies the driver's rows name: the policy's, and the `cuGetProcAddress` doors below.
mod driver_bodies {
    pub use super::get_proc_address;
    pub use crate::driver_hooks::*;
    pub use crate::loads::*;
    pub use crate::skeletons::mem_get_info;
    pub use crate::streams::{stream_destroy, streams_gone};
}

macro_rules! driver_doors {
    ($($rows:tt)*) => {
        doors! { DriverFn -> CuResult, missing CUDA_ERROR_NOT_INITIALIZED, real driver, bodies driver_bodies, wrappers wrap; $($rows)* }
    };
}
crate::table::driver_table!(driver_doors);

/// The bodies the runtime's rows name.
use crate::runtime_hooks as runtime_bodies;

macro_rules! runtime_doors {
    ($($rows:tt)*) => {
        doors! { RuntimeFn -> CudaError, missing CUDART_ERROR_INSUFFICIENT_DRIVER, real runtime, bodies runtime_bodies, wrappers runtime_wrap; $($rows)* }
    };
}
crate::table::runtime_table!(runtime_doors);

/// The bodies NVML's rows name.
use crate::nvml_hooks as nvml_bodies;

macro_rules! nvml_doors {
    ($($rows:tt)*) => {
        doors! { NvmlFn -> NvmlReturn, missing NVML_ERROR_LIBRARY_NOT_FOUND, real nvml, bodies nvml_bodies, wrappers nvml_wrap; $($rows)* }
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
        nvml::function_at(name, p as usize).and_then(nvml_wrap::of)
    } else if name.starts_with(b"cu") {
        driver::function_at(name, p as usize).and_then(wrap::of)
    } else {
        None
    };
    wrapper.map_or(p, |w| w as *mut c_void)
}

// ---- the `cuGetProcAddress` doors ----

/// `cuGetProcAddress` and `cuGetProcAddress_v2`: whatever they hand out passes through
/// [`substitute`].
pub fn get_proc_address(
    _: Entry<DriverFn>,
    call: impl FnOnce() -> CuResult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
) -> CuResult {
    let rc = call();
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
pub extern "C" fn gpumemhook_segment() -> *const gpumemhook_segment::Segment {
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

/// The exit report's contents now, as JSON: the snapshot with the allocations still held (`live`,
/// largest first, with their modules and Python sites), for an in-process reader that must name
/// what a block of code left behind (the pytest plugin's leak and budget messages). Writes the text
/// into `buf` when it fits in `cap` bytes and returns its length either way (no NUL): a caller with
/// too small a buffer calls again with a larger one. 0 while the hook is not counting. Never on an
/// allocation path, so it may allocate.
#[no_mangle]
pub extern "C" fn gpumemhook_report_json(buf: *mut u8, cap: usize) -> usize {
    let Some(active) = crate::state::active() else {
        return 0;
    };
    let text = crate::report::json(
        active.segment,
        active.segment_path().as_deref(),
        &active.ledger,
    );
    copy_out(text.as_bytes(), buf, cap)
}

/// The contract of the hook's JSON exports: `text` is copied into `buf` when it fits in `cap`
/// bytes, and its length is returned either way (no NUL), so a caller whose buffer was too small
/// calls again with a larger one.
fn copy_out(text: &[u8], buf: *mut u8, cap: usize) -> usize {
    if !buf.is_null() && text.len() <= cap {
        // SAFETY: the caller hands a writable buffer of `cap` bytes, and `text.len() <= cap`.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, text.len()) };
    }
    text.len()
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

/// Checks at compile time that every row of the hook's in-process interface
/// (`gpumemhook_reader::export_rows`, by which readers look the functions up) is a function above,
/// exported under the row's name with exactly the row's C signature.
macro_rules! check_own_exports {
    ($( $id:ident = $sym:ident : fn( $($ty:ty),* ) -> $ret:ty; )*) => {
        $(
            const _: <gpumemhook_reader::export_rows::$id as gpumemhook_reader::Export>::Fn = $sym;
        )*
    };
}
gpumemhook_reader::hook_exports!(check_own_exports);

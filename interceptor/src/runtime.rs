//! The real CUDA runtime functions behind our runtime shadows (the rows of
//! `crate::table::runtime_table`).
//!
//! Found with `dlsym(RTLD_NEXT, name)` (the next definition after this library in the global
//! scope). A runtime loaded into a local scope (as Python's `import` and `ctypes.CDLL` do) is not in
//! the global scope, so when that finds nothing, the loaded objects are searched for a
//! `libcudart.so*` and the name is looked up there. Results are cached; a miss is not, so a runtime
//! loaded later is still found. With several runtimes loaded, the first one found serves every
//! caller of the shadows.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi::*;
use crate::resolve::{is_own_address, real_dlsym};
use crate::table::{Row, Via};

/// Expands the runtime's table (`crate::table`) into [`RuntimeFn`], `NAME_ARRAY`, `ALL` and
/// [`rows`] (each row's C signature).
macro_rules! runtime_functions {
    ($($rows:tt)*) => { crate::table::functions! { RuntimeFn -> CudaError; $($rows)* } };
}
crate::table::runtime_table!(runtime_functions);

const NAMES: &[&CStr] = &NAME_ARRAY;

static REAL: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

/// The real runtime function of row `R`, cast to the row's C signature; `None` when the process
/// has no CUDA runtime. The runtime is only ever reached through the next definition after this
/// library (it has no lookup door), whatever `_via` says: the doors ask every library alike.
#[inline]
pub fn real<R: Row<Library = RuntimeFn>>(_via: Via) -> Option<R::Fn> {
    // SAFETY: the address was resolved under `R`'s exact name, whose C signature is `R::Fn`.
    address(R::ID).map(|p| unsafe { R::cast(p) })
}

/// The address of the real runtime function `f`, resolved on first use.
#[inline]
fn address(f: RuntimeFn) -> Option<usize> {
    let p = REAL[f as usize].load(Ordering::Acquire);
    if p != 0 {
        return Some(p);
    }
    resolve(f)
}

#[cold]
fn resolve(f: RuntimeFn) -> Option<usize> {
    let name = NAMES[f as usize];
    // SAFETY: NUL-terminated name; RTLD_NEXT from this library never returns our own shadow.
    let mut p = unsafe { real_dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if p == 0 {
        p = find_loaded_runtime()
            // SAFETY: a live handle from dlopen(RTLD_NOLOAD) and a NUL-terminated name.
            .map(|h| unsafe { real_dlsym(h, name.as_ptr()) } as usize)
            .unwrap_or(0);
    }
    if p == 0 || p == own_shadow_address(f) {
        return None;
    }
    REAL[f as usize].store(p, Ordering::Release);
    Some(p)
}

/// Our own shadow of `f`, which a lookup through a runtime handle can never return, but which we
/// must never call as "the real one" whatever a loader does.
fn own_shadow_address(f: RuntimeFn) -> usize {
    let name = NAMES[f as usize];
    // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
    let p = unsafe { real_dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    if p != 0 && is_own_address(p) {
        p
    } else {
        usize::MAX
    }
}

/// A handle of the first loaded `libcudart.so*`, in any scope.
fn find_loaded_runtime() -> Option<*mut c_void> {
    let mut found: Option<std::ffi::CString> = None;
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid `dl_phdr_info` and our `data` pointer unchanged.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Option<std::ffi::CString>)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: `dlpi_name` is a NUL-terminated path owned by the loader.
        let path = unsafe { CStr::from_ptr(info.dlpi_name) };
        let bytes = path.to_bytes();
        let name = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
        if name.starts_with(b"libcudart.so") {
            *found = Some(path.to_owned());
            return 1;
        }
        0
    }
    // SAFETY: `visit` matches the callback type and `found` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut Option<_>).cast()) };
    let path = found?;
    // SAFETY: the library is loaded; RTLD_NOLOAD returns its handle without running anything.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    (!h.is_null()).then_some(h)
}

/// The name of the runtime function with index `index`, for the timeline.
pub fn name_by_index(index: usize) -> &'static str {
    NAMES
        .get(index)
        .and_then(|n| n.to_str().ok())
        .unwrap_or("?")
}

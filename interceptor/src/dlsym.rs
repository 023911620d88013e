//! The transparent `dlsym`.
//!
//! glibc decides what `RTLD_NEXT` means from its caller's return address. If our `dlsym` called the
//! real one for such a lookup, glibc would take *us* for the caller, and another preloaded library's
//! `dlsym(RTLD_NEXT, ...)` could skip us or get its own function back (infinite recursion). So
//! `RTLD_NEXT` lookups leave through a tail jump (a naked trampoline): glibc sees the true caller.
//! Every other lookup goes through [`crate::driver::substitute`], which hands out our wrapper where
//! the result is a driver function we wrap.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`. Read by the trampoline, so it must stay a plain word (and local to this library,
/// so the trampoline can address it directly).
static GPUMEMHOOK_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Finds glibc's `dlsym` by version (our own `dlsym` shadows the unversioned name).
extern "C" fn resolve_real_dlsym() -> usize {
    let current = GPUMEMHOOK_REAL_DLSYM.load(Ordering::Acquire);
    if current != 0 {
        return current;
    }
    let mut p = 0usize;
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated strings; returns NULL when absent.
        p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) } as usize;
        if p != 0 {
            break;
        }
    }
    if p == 0 {
        p = no_dlsym as *const () as usize;
    }
    GPUMEMHOOK_REAL_DLSYM.store(p, Ordering::Release);
    p
}

/// Stands in for a `dlsym` that could not be found (never seen with glibc): finds nothing.
extern "C" fn no_dlsym(_handle: *mut c_void, _symbol: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Calls glibc's `dlsym` with this library as the caller.
///
/// # Safety
/// `symbol` must be NUL-terminated; `handle` a handle, `RTLD_DEFAULT` or `RTLD_NEXT`.
pub unsafe fn real_dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let f: DlsymFn = std::mem::transmute(resolve_real_dlsym());
    f(handle, symbol)
}

/// The non-`RTLD_NEXT` path of our `dlsym`.
extern "C" fn dlsym_lookup(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: forwards the caller's own arguments unchanged.
    let p = unsafe { real_dlsym(handle, symbol) };
    crate::driver::substitute(symbol, p)
}

/// The exported `dlsym`: `RTLD_NEXT` (-1) tail-jumps to glibc with the caller's return address
/// untouched; anything else goes to [`dlsym_lookup`].
///
/// # Safety
/// glibc's `dlsym` contract: a valid handle (or `RTLD_DEFAULT`/`RTLD_NEXT`) and a NUL-terminated name.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {lookup}",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        // First use before our constructor ran: resolve glibc's dlsym, keeping the arguments and a
        // 16-byte aligned stack across the call, then jump as above.
        "2:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        lookup = sym dlsym_lookup,
        real = sym GPUMEMHOOK_REAL_DLSYM,
        resolve = sym resolve_real_dlsym,
    )
}

/// Without a trampoline for this architecture, `RTLD_NEXT` lookups are made on the caller's behalf
/// from here: correct unless another preloaded library relies on `RTLD_NEXT` through us.
///
/// # Safety
/// As for glibc's `dlsym`.
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    dlsym_lookup(handle, symbol)
}

/// Resolves glibc's `dlsym` eagerly (from the constructor).
pub fn init() {
    resolve_real_dlsym();
}

//! Resolution: finding the real functions of a wrapped library (the CUDA driver, NVML) by exact
//! name, once per process, and mapping a real function's address back to its entry; and glibc's own
//! `dlsym` ([`real_dlsym`]), which every lookup of a real function goes through (the exported
//! `dlsym` door, `crate::dlsym`, jumps to it too).
//!
//! A [`Library`] holds two tables per entry: `real` (the library's own function, resolved from its
//! handle at first contact) and `next` (what `dlsym(RTLD_NEXT)` gives after this library, called by
//! the exported shadows so that another preloaded library between us and the real one stays in the
//! chain). Resolution is a small atomic state machine, `UNKNOWN → RESOLVING → READY`; a forked
//! child restarts a resolution that a parent thread had under way instead of waiting for a thread
//! that does not exist in the child.

use std::ffi::c_char;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

// ---- glibc's `dlsym` (our own exported `dlsym` shadows the unversioned name) ----

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`. Read by the trampoline, so it must stay a plain word (and local to this library,
/// so the trampoline can address it directly).
pub static GPUMEMHOOK_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Finds glibc's `dlsym` by version (our own `dlsym` shadows the unversioned name).
pub extern "C" fn resolve_real_dlsym() -> usize {
    let current = GPUMEMHOOK_REAL_DLSYM.load(Ordering::Acquire);
    if current != 0 {
        return current;
    }
    let mut p = 0usize;
    // The current version first, then the architecture's first one (glibc before 2.34).
    #[cfg(target_arch = "aarch64")]
    let versions = [c"GLIBC_2.34", c"GLIBC_2.17"];
    #[cfg(not(target_arch = "aarch64"))]
    let versions = [c"GLIBC_2.34", c"GLIBC_2.2.5"];
    for version in versions {
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

/// Resolves glibc's `dlsym` eagerly (from the constructor).
pub fn init() {
    resolve_real_dlsym();
}

/// True when `p` lies inside this library.
pub fn is_own_address(p: usize) -> bool {
    fn base_of(p: usize) -> usize {
        // SAFETY: `Dl_info` is plain data; dladdr fills it or returns 0.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is writable; `p` is only looked up.
        if unsafe { libc::dladdr(p as *const libc::c_void, &mut info) } == 0 {
            return 0;
        }
        info.dli_fbase as usize
    }
    let own = base_of(is_own_address as *const () as usize);
    own != 0 && base_of(p) == own
}

// ---- a wrapped library's functions ----

const UNKNOWN: u8 = 0;
const RESOLVING: u8 = 1;
const READY: u8 = 2;

pub use crate::table::Via;

/// The real functions of one library, `N` entries named by `names`.
pub struct Library<const N: usize> {
    names: &'static [&'static CStr; N],
    /// The start of the library's file name (`libcuda.so`, `libnvidia-ml.so`), to recognise it.
    file_prefix: &'static [u8],
    /// The name to `dlopen(RTLD_NOLOAD)` it by when the program loaded it without our doors.
    soname: &'static CStr,
    state: AtomicU8,
    real: [AtomicUsize; N],
    next: [AtomicUsize; N],
}

impl<const N: usize> Library<N> {
    pub const fn new(
        names: &'static [&'static CStr; N],
        file_prefix: &'static [u8],
        soname: &'static CStr,
    ) -> Self {
        Library {
            names,
            file_prefix,
            soname,
            state: AtomicU8::new(UNKNOWN),
            real: [const { AtomicUsize::new(0) }; N],
            next: [const { AtomicUsize::new(0) }; N],
        }
    }

    /// The exact name of entry `index`.
    pub fn name(&self, index: usize) -> Option<&'static CStr> {
        self.names.get(index).copied()
    }

    /// True when `name` is one of the entries' names.
    pub fn knows(&self, name: &[u8]) -> bool {
        self.names.iter().any(|n| n.to_bytes() == name)
    }

    /// True once the library's functions were resolved.
    #[inline]
    pub fn is_ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == READY
    }

    /// The function to call for entry `index`, `None` when the library cannot be found.
    #[inline]
    pub fn target(&self, index: usize, via: Via) -> Option<usize> {
        let table = match via {
            Via::Driver => &self.real,
            Via::Next => &self.next,
        };
        let p = table.get(index)?.load(Ordering::Acquire);
        if p != 0 {
            return Some(p);
        }
        self.target_slow(index, via)
    }

    #[cold]
    fn target_slow(&self, index: usize, via: Via) -> Option<usize> {
        let name = self.name(index)?;
        if via == Via::Next {
            // SAFETY: a lookup of a NUL-terminated name; RTLD_NEXT from this library finds the
            // next definition after us, never our own.
            let p = unsafe { real_dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
            if p != 0 {
                self.next[index].store(p, Ordering::Release);
                return Some(p);
            }
        }
        self.ensure_loaded();
        let p = self.real[index].load(Ordering::Acquire);
        if p == 0 {
            return None;
        }
        if via == Via::Next {
            // Nothing after us defines it (the library sits in a local scope): its own function
            // is the next one, and caching it keeps the lookup off every later call.
            self.next[index].store(p, Ordering::Release);
        }
        Some(p)
    }

    /// Resolves from the library if the process already loaded it (no lookup went through our
    /// doors yet: a program linked to it calling our exported shadows).
    #[cold]
    pub fn ensure_loaded(&self) -> bool {
        if self.is_ready() {
            return true;
        }
        // SAFETY: RTLD_NOLOAD only returns a handle when the library is already loaded; nothing
        // runs.
        let handle =
            unsafe { libc::dlopen(self.soname.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        !handle.is_null() && self.resolve_all(handle)
    }

    /// Resolves every entry from the library `handle` (once per process).
    pub fn resolve_all(&self, handle: *mut c_void) -> bool {
        loop {
            match self.state.compare_exchange(
                UNKNOWN,
                RESOLVING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(READY) => return true,
                // Another thread is resolving: it takes microseconds, once per process.
                Err(_) => std::thread::yield_now(),
            }
        }
        for (slot, name) in self.real.iter().zip(self.names.iter()) {
            // SAFETY: `handle` is a live handle of the library; names are NUL-terminated.
            let p = unsafe { real_dlsym(handle, name.as_ptr()) } as usize;
            slot.store(p, Ordering::Release);
        }
        self.state.store(READY, Ordering::Release);
        true
    }

    /// First contact through a lookup result: if `p` lies in this library, resolve from it.
    #[cold]
    pub fn contact(&self, p: usize) {
        // SAFETY: `Dl_info` is plain data; dladdr fills it for any address and reports failure as 0.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is writable; `p` is only used as a number to look up.
        if unsafe { libc::dladdr(p as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
            return;
        }
        // SAFETY: dladdr returned a NUL-terminated file name owned by the loader.
        let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
        let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        if !file.starts_with(self.file_prefix) {
            return;
        }
        // SAFETY: the library is loaded (it holds `p`); RTLD_NOLOAD gives its handle without
        // loading anything.
        let handle = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if !handle.is_null() {
            self.resolve_all(handle);
        }
    }

    /// The entry whose real function is at `p`.
    pub fn index_of_real(&self, p: usize) -> Option<usize> {
        if p == 0 {
            return None;
        }
        self.real
            .iter()
            .position(|slot| slot.load(Ordering::Acquire) == p)
    }

    /// In a forked child: a resolution that a parent thread had under way at the instant of `fork`
    /// is started again rather than waited for.
    pub fn forked(&self) {
        let _ =
            self.state
                .compare_exchange(RESOLVING, UNKNOWN, Ordering::AcqRel, Ordering::Relaxed);
    }
}

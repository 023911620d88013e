//! Python call sites (`GPUMEMHOOK_STACKS=python:<min bytes>`): the Python frame (file, line,
//! function) that made each device allocation of at least that size, for the leak and
//! out-of-memory reports.
//!
//! The hook asks CPython itself, through its C API found in the process (`dlsym`), only for
//! allocations at or above the threshold (every other allocation pays one load and one comparison),
//! and only on a thread that holds the GIL at that moment. The hook never waits for the GIL: a thread
//! holding it may be waiting for a lock the allocating thread holds (a framework allocator's mutex,
//! say), and waiting would deadlock the program. So an allocation made with the GIL released records
//! no site: PyTorch's and JAX's operators release it before they allocate; CuPy's allocator, and any
//! C extension that allocates under the GIL, record theirs. A site is interned once (`file:line in function`) and its number
//! stored in the ledger entry. The cost of a recorded site is measured in `BENCHMARKS.md`.
//!
//! Interning takes a lock and allocates: it happens only on this opt-in path. A forked child starts
//! a table of its own (the parent's lock may have been held at the instant of `fork`).

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::ledger::MAX_SITE;

/// The smallest allocation whose site is recorded; `u64::MAX` when stacks are off.
static FROM: AtomicU64 = AtomicU64::new(u64::MAX);

/// Turns recording on for allocations of at least `bytes` (at start-up).
pub fn enable(bytes: u64) {
    FROM.store(bytes, Ordering::Relaxed);
}

/// The site of a device allocation of `bytes` made now on this thread; 0 for none.
#[inline]
pub fn site(bytes: u64) -> u32 {
    if bytes < FROM.load(Ordering::Relaxed) {
        return 0;
    }
    python_site()
}

/// The interned sites of this process image: number `i + 1` is `list[i]`.
#[derive(Default)]
struct Sites {
    numbers: HashMap<String, u32>,
    list: Vec<String>,
}

/// This image's table (leaked; a forked child drops the pointer and makes its own).
static TABLE: AtomicPtr<Mutex<Sites>> = AtomicPtr::new(std::ptr::null_mut());

fn table() -> &'static Mutex<Sites> {
    let p = TABLE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null TABLE is a leaked `Box<Mutex<Sites>>` that lives forever.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::default());
    match TABLE.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: just published; leaked for the rest of the process.
        Ok(_) => unsafe { &*fresh },
        Err(theirs) => {
            // SAFETY: `fresh` was never shared; `theirs` is the leaked table another thread won with.
            unsafe {
                drop(Box::from_raw(fresh));
                &*theirs
            }
        }
    }
}

/// In a forked child (async-signal-safe: one plain store): start an empty table.
pub fn forked() {
    TABLE.store(std::ptr::null_mut(), Ordering::Relaxed);
}

/// The text of site `number` (`file:line in function`), `None` for 0 or an unknown number.
pub fn describe(number: u32) -> Option<String> {
    let index = usize::try_from(number).ok()?.checked_sub(1)?;
    let sites = table().lock().ok()?;
    sites.list.get(index).cloned()
}

fn intern(text: String) -> u32 {
    let Ok(mut sites) = table().lock() else {
        return 0;
    };
    if let Some(&n) = sites.numbers.get(&text) {
        return n;
    }
    let Ok(n) = u32::try_from(sites.list.len() + 1) else {
        return 0;
    };
    if n > MAX_SITE {
        return 0;
    }
    sites.list.push(text.clone());
    sites.numbers.insert(text, n);
    n
}

thread_local! {
    /// True while this thread is inside CPython on the hook's behalf: an allocation made there (by
    /// a finalizer, say) records no site of its own.
    static ASKING: Cell<bool> = const { Cell::new(false) };
}

/// The C API functions used, found once (0: not found yet; 1: this process has no Python).
static API: [AtomicUsize; FUNCTIONS.len()] = [const { AtomicUsize::new(0) }; FUNCTIONS.len()];
const NO_PYTHON: usize = 1;
const FUNCTIONS: [&CStr; 9] = [
    c"Py_IsInitialized",
    c"PyGILState_Check",
    c"PyEval_GetFrame",
    c"PyFrame_GetLineNumber",
    c"PyFrame_GetCode",
    c"PyObject_GetAttrString",
    c"PyUnicode_AsUTF8",
    c"Py_DecRef",
    c"PyErr_Clear",
];

/// The addresses of [`FUNCTIONS`], `None` when the process has no Python.
fn api() -> Option<[usize; FUNCTIONS.len()]> {
    let mut found = [0usize; FUNCTIONS.len()];
    for (i, name) in FUNCTIONS.iter().enumerate() {
        let mut p = API[i].load(Ordering::Relaxed);
        if p == 0 {
            // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
            let q =
                unsafe { crate::resolve::real_dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
            p = if q == 0 { NO_PYTHON } else { q };
            API[i].store(p, Ordering::Relaxed);
        }
        if p == NO_PYTHON {
            return None;
        }
        found[i] = p;
    }
    Some(found)
}

#[cold]
fn python_site() -> u32 {
    if ASKING.with(Cell::get) {
        return 0;
    }
    let Some(api) = api() else {
        return 0;
    };
    ASKING.with(|a| a.set(true));
    let text = ask_python(&api);
    ASKING.with(|a| a.set(false));
    text.map_or(0, intern)
}

type NoArgInt = unsafe extern "C" fn() -> c_int;
type NoArgPtr = unsafe extern "C" fn() -> *mut c_void;
type PtrInt = unsafe extern "C" fn(*mut c_void) -> c_int;
type PtrPtr = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type GetAttr = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type AsUtf8 = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type DecRef = unsafe extern "C" fn(*mut c_void);
type NoArg = unsafe extern "C" fn();

/// `file:line in function` of the innermost Python frame of this thread, if it holds the GIL.
fn ask_python(api: &[usize; FUNCTIONS.len()]) -> Option<String> {
    // SAFETY: each address was found under the exact name of a CPython C API function whose C
    // signature is the one it is cast to (stable ABI, Python 3.9+).
    let (initialized, holds_gil, frame_of, line_of, code_of, get_attr, as_utf8, dec_ref, clear) = unsafe {
        (
            std::mem::transmute::<usize, NoArgInt>(api[0]),
            std::mem::transmute::<usize, NoArgInt>(api[1]),
            std::mem::transmute::<usize, NoArgPtr>(api[2]),
            std::mem::transmute::<usize, PtrInt>(api[3]),
            std::mem::transmute::<usize, PtrPtr>(api[4]),
            std::mem::transmute::<usize, GetAttr>(api[5]),
            std::mem::transmute::<usize, AsUtf8>(api[6]),
            std::mem::transmute::<usize, DecRef>(api[7]),
            std::mem::transmute::<usize, NoArg>(api[8]),
        )
    };
    // SAFETY: both may be called at any time, GIL held or not.
    if unsafe { initialized() } == 0 || unsafe { holds_gil() } == 0 {
        return None;
    }
    // SAFETY: this thread holds the GIL (checked above), which every call below requires. The frame
    // is borrowed and stays alive while this thread runs C code under it; `code`, `file` and `name`
    // are new references, released below; the UTF-8 buffers belong to their strings.
    unsafe {
        let frame = frame_of();
        if frame.is_null() {
            return None;
        }
        let line = line_of(frame);
        let code = code_of(frame);
        if code.is_null() {
            clear();
            return None;
        }
        let text = |attribute: &CStr| {
            let object = get_attr(code, attribute.as_ptr());
            if object.is_null() {
                clear();
                return String::from("?");
            }
            let utf8 = as_utf8(object);
            let s = if utf8.is_null() {
                clear();
                String::from("?")
            } else {
                CStr::from_ptr(utf8).to_string_lossy().into_owned()
            };
            dec_ref(object);
            s
        };
        let file = text(c"co_filename");
        let function = text(c"co_name");
        dec_ref(code);
        Some(format!("{file}:{line} in {function}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_are_interned_once_and_described_by_number() {
        let a = intern("train.py:10 in step".into());
        let b = intern("train.py:11 in step".into());
        assert_ne!(a, 0);
        assert_ne!(a, b);
        assert_eq!(intern("train.py:10 in step".into()), a);
        assert_eq!(describe(a).as_deref(), Some("train.py:10 in step"));
        assert_eq!(describe(0), None);
        assert_eq!(describe(u32::MAX), None);
    }

    #[test]
    fn without_python_or_below_the_threshold_no_site_is_recorded() {
        // The test binary has no CPython: the lookup finds nothing and records nothing.
        enable(1024);
        assert_eq!(site(1023), 0);
        assert_eq!(site(4096), 0);
    }
}

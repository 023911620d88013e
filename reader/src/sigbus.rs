//! The SIGBUS guard over reader mappings: a fault inside a registered range (the file shrank under
//! the mapping) replaces the range with zeroed anonymous memory and marks it tripped; the faulting
//! access then completes on zeroes. Faults elsewhere go to the handler installed before ours (or
//! the default action). The handler is installed the first time a reader maps a file, and only
//! touches a fixed table of atomics, `mmap` and `sigaction`, all async-signal-safe.
//!
//! Kept apart from the segment files (`crate::shm`), which register every reader mapping with it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Reader mappings guarded at once; past that a mapping goes unguarded.
const SLOTS: usize = 256;

struct Slot {
    start: AtomicUsize,
    /// 0: free; `usize::MAX`: being registered.
    len: AtomicUsize,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
    }
}; SLOTS];
static TRIPPED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
static INSTALL: Once = Once::new();
/// The handler that was installed before ours.
static PREVIOUS: OnceLock<Previous> = OnceLock::new();

struct Previous(libc::sigaction);
// SAFETY: a sigaction is plain data (a handler address, flags, a mask), written once.
unsafe impl Sync for Previous {}
// SAFETY: as above.
unsafe impl Send for Previous {}

/// A registered range; unregistered on drop.
#[derive(Debug)]
pub struct Guarded {
    slot: Option<usize>,
}

impl Guarded {
    /// Registers `[start, start + len)` (installing the handler on first use).
    pub fn new(start: usize, len: usize) -> Guarded {
        install();
        for (i, slot) in TABLE.iter().enumerate() {
            if slot
                .len
                .compare_exchange(0, usize::MAX, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                TRIPPED[i].store(false, Ordering::SeqCst);
                slot.start.store(start, Ordering::SeqCst);
                slot.len.store(len, Ordering::SeqCst);
                return Guarded { slot: Some(i) };
            }
        }
        Guarded { slot: None }
    }

    /// True once a fault replaced the range.
    pub fn tripped(&self) -> bool {
        self.slot.is_some_and(|i| TRIPPED[i].load(Ordering::SeqCst))
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            TABLE[i].start.store(0, Ordering::SeqCst);
            TABLE[i].len.store(0, Ordering::SeqCst);
        }
    }
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: plain-data structs for sigaction, filled before use.
        let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
        ours.sa_sigaction = on_sigbus as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        // SAFETY: as above.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `sa_mask` is a valid sigset to empty.
        unsafe { libc::sigemptyset(&mut ours.sa_mask) };
        // SAFETY: only reads the current disposition into `previous`.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } != 0 {
            return;
        }
        // Recorded before ours is installed, so the handler always finds it.
        let _ = PREVIOUS.set(Previous(previous));
        // SAFETY: installs our handler (a valid `extern "C"` function of the SA_SIGINFO type).
        unsafe { libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut()) };
    });
}

/// The part of `siginfo_t` a fault fills (the same `repr(C)` prefix on every Linux ABI).
#[repr(C)]
struct FaultInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    addr: *mut libc::c_void,
}

extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info.cast::<FaultInfo>()).addr } as usize;
    for (i, slot) in TABLE.iter().enumerate() {
        let start = slot.start.load(Ordering::SeqCst);
        let len = slot.len.load(Ordering::SeqCst);
        if start != 0 && len != usize::MAX && addr >= start && addr - start < len {
            // SAFETY: replaces exactly our own registered mapping with fresh anonymous memory;
            // nothing else lives in that range.
            let replaced = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if replaced == libc::MAP_FAILED {
                // Returning would fault again forever: take the default action instead.
                restore_default(signal);
                return;
            }
            TRIPPED[i].store(true, Ordering::SeqCst);
            return;
        }
    }
    chain(signal, info, context);
}

/// Hands a fault that is not ours to the handler installed before ours.
fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let Some(Previous(previous)) = PREVIOUS.get() else {
        restore_default(signal);
        return;
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Returning re-runs the faulting access, which now gets the default action.
        restore_default(signal);
    } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(signal, info, context);
    } else {
        // SAFETY: a plain handler of the classic signature.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(signal);
    }
}

fn restore_default(signal: libc::c_int) {
    // SAFETY: plain-data struct; resets the signal to its default action.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &default, std::ptr::null_mut());
    }
}

//! Start-up, the process-wide state, fork and exit.
//!
//! An atomic state machine: `UNINIT` → `INITIALIZING` → `READY`, or → `DISABLED` (final: every call
//! passes straight through). The constructor runs it when the library loads; a hook called earlier
//! (from another library's constructor) runs it on first use. Configuration is read here, once.

use std::cell::Cell;
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::OnceLock;

use gpumemhook_reader::layout::{Segment, FLAG_PRIVATE};
use gpumemhook_reader::{process, shm};

use crate::config::Config;
use crate::ledger::Ledger;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const READY: u8 = 2;
const DISABLED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static SEGMENT: AtomicPtr<Segment> = AtomicPtr::new(std::ptr::null_mut());
/// The segment file's path as a C string (leaked; replaced in a forked child), NULL when private.
static SEGMENT_PATH: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
static LEDGER: OnceLock<Ledger> = OnceLock::new();
static REPORT_PATH: OnceLock<Option<String>> = OnceLock::new();
static TRACE_PATH: OnceLock<Option<String>> = OnceLock::new();

thread_local! {
    /// True on the thread running initialisation, whose own re-entrant calls pass through.
    static INITIALIZING_HERE: Cell<bool> = const { Cell::new(false) };
}

/// What a hook counts into.
pub struct Active {
    pub segment: &'static Segment,
    pub ledger: &'static Ledger,
}

/// The segment and ledger when counting is on; `None` means "pass the call straight through".
#[inline]
pub fn active() -> Option<Active> {
    if STATE.load(Ordering::Acquire) != READY && !init() {
        return None;
    }
    let segment = SEGMENT.load(Ordering::Acquire);
    // SAFETY: a non-null SEGMENT points at a segment that stays mapped for the process lifetime.
    let segment = unsafe { segment.as_ref() }?;
    Some(Active {
        segment,
        ledger: LEDGER.get()?,
    })
}

/// The segment, if any (for readers inside the process).
pub fn segment() -> Option<&'static Segment> {
    // SAFETY: as in `active`.
    unsafe { SEGMENT.load(Ordering::Acquire).as_ref() }
}

/// The segment file's path, NULL for a private segment or before start-up.
pub fn segment_path() -> *const c_char {
    SEGMENT_PATH.load(Ordering::Acquire)
}

/// Runs start-up if nobody has; returns true when counting is on.
#[cold]
pub fn init() -> bool {
    loop {
        match STATE.compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(READY) => return true,
            Err(DISABLED) => return false,
            Err(_) => {
                if INITIALIZING_HERE.with(Cell::get) {
                    return false;
                }
                std::thread::yield_now();
            }
        }
    }
    INITIALIZING_HERE.with(|c| c.set(true));
    let outcome = start();
    INITIALIZING_HERE.with(|c| c.set(false));
    STATE.store(if outcome { READY } else { DISABLED }, Ordering::Release);
    outcome
}

fn warn(message: &str) {
    eprintln!("gpumemhook: {message}");
}

fn start() -> bool {
    crate::dlsym::init();
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            warn(&format!(
                "{}; refusing to run without the ceiling asked for",
                e.0
            ));
            // SAFETY: ends the process at once with a failure status, as promised for bad settings.
            unsafe { libc::_exit(2) }
        }
    };
    if config.disabled {
        return false;
    }
    let _ = REPORT_PATH.set(config.report_path.clone());
    let tracing = config
        .trace_path
        .as_ref()
        .is_some_and(|_| crate::trace::enable(config.trace_events));
    if config.trace_path.is_some() && !tracing {
        warn("cannot map the timeline buffer; no timeline will be written");
    }
    let _ = TRACE_PATH.set(config.trace_path.clone().filter(|_| tracing));
    LEDGER.get_or_init(Ledger::new);
    let segment = make_segment();
    segment.set_limit(None, config.limit_all);
    for &(device, bytes) in &config.limit_per_device {
        segment.set_limit(Some(device), Some(bytes));
    }
    SEGMENT.store(segment as *const Segment as *mut Segment, Ordering::Release);
    // SAFETY: plain C callbacks registered once; they only touch this module's statics.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(in_forked_child));
    }
    true
}

/// Creates this process's segment file, or a private segment (with one warning) if that fails.
fn make_segment() -> &'static Segment {
    let pid = std::process::id();
    let command = process::command_line(pid).unwrap_or_default();
    let ticks = process::start_ticks(pid).unwrap_or(0);
    let dir = shm::segment_dir();
    let (mapping, flags) = match shm::create(&dir, process::current_uid(), pid) {
        Ok(m) => (m, 0),
        Err(e) => {
            warn(&format!(
                "cannot create a segment in {} ({e}); counting in process memory only, so other \
                 processes cannot read this one (set GPUMEMHOOK_SHM_DIR to a writable directory)",
                dir.display()
            ));
            match shm::private() {
                Ok(m) => (m, FLAG_PRIVATE),
                Err(_) => {
                    warn("cannot map process memory for counters; counting is off");
                    // SAFETY: ends the process: there is nowhere to count into.
                    unsafe { libc::_exit(2) }
                }
            }
        }
    };
    let path = mapping
        .path()
        .and_then(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok())
        .map_or(std::ptr::null_mut(), |c| c.into_raw());
    SEGMENT_PATH.store(path, Ordering::Release);
    let segment = mapping.leak();
    segment.set_job_labels(&gpumemhook_reader::JobLabels::of_this_process()); // job labels (issue 13)
    segment.initialise(pid, ticks, process::unix_now_ns(), &command, flags);
    segment
}

/// In a forked child: a segment of its own (starting from zero, keeping the ceilings), and a new
/// ledger epoch so the parent's allocations are never counted as the child's frees.
extern "C" fn in_forked_child() {
    let Some(parent) = segment() else {
        return;
    };
    let child = make_segment();
    for (c, p) in child.devices.iter().zip(parent.devices.iter()) {
        c.limit
            .store(p.limit.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    if let Some(ledger) = LEDGER.get() {
        ledger.new_epoch();
    }
    crate::trace::forked();
    SEGMENT.store(child as *const Segment as *mut Segment, Ordering::Release);
}

/// At exit: write the report and timeline if asked (and the process used CUDA), then remove the
/// segment file.
extern "C" fn at_exit() {
    if let Some(segment) = segment().filter(|s| crate::report::used_gpu(s)) {
        if let Some(Some(pattern)) = REPORT_PATH.get() {
            crate::report::write(pattern, segment, path_of_segment().as_deref());
        }
        if let Some(Some(pattern)) = TRACE_PATH.get() {
            crate::trace::write(pattern, segment);
        }
    }
    let path = SEGMENT_PATH.load(Ordering::Acquire);
    if !path.is_null() {
        // SAFETY: `path` is the NUL-terminated path of our own segment file.
        unsafe { libc::unlink(path) };
    }
}

fn path_of_segment() -> Option<std::path::PathBuf> {
    let p = SEGMENT_PATH.load(Ordering::Acquire);
    // SAFETY: a non-null SEGMENT_PATH is a leaked, NUL-terminated CString.
    (!p.is_null()).then(|| {
        std::path::PathBuf::from(
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned(),
        )
    })
}

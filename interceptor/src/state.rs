//! Start-up, the process-wide state, fork and exit.
//!
//! An atomic state machine:
//!
//! ```text
//! UNINIT ──► INITIALIZING ──► READY ──fork (in the child)──► FORKED ──first CUDA call──► INITIALIZING
//!                        └──► DISABLED (final: every call passes straight through)
//! ```
//!
//! The constructor runs start-up when the library loads; a hook called earlier (from another
//! library's constructor) runs it on first use. Configuration is read here, once.
//!
//! What a hook counts into (segment and ledger) is one pointer, [`ACTIVE`]: the hot path pays one
//! load. A forked child drops its parent's in the `atfork` child handler, which only stores plain
//! words (no allocation, no lock), and makes its own segment and ledger at its first CUDA call: a
//! child that never uses CUDA leaves no segment, report or timeline, and never touches anything a
//! parent thread may have held at the instant of `fork`. A process in a group joins it after making
//! its segment (a forked child joins as a member of its own, `crate::group`).

use gpumemhook_reader::{create_segment, private_segment};
use gpumemhook_segment::{command_line, current_uid, own_pid_namespace, start_ticks, unix_now_ns};
use std::cell::Cell;
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use gpumemhook_reader::Emulation;
use gpumemhook_segment::MAX_DEVICES;
use gpumemhook_segment::{Segment, FLAG_PRIVATE, NO_LIMIT};

use crate::config::Config;
use crate::diag::warn;
use crate::ledger::Ledger;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const READY: u8 = 2;
const DISABLED: u8 = 3;
const FORKED: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// This process image's counting state; null until READY, and again in a forked child until its
/// first CUDA call.
static ACTIVE: AtomicPtr<Active> = AtomicPtr::new(std::ptr::null_mut());
/// What start-up read, kept for forked children (configuration is never read twice).
static SETTINGS: OnceLock<Settings> = OnceLock::new();
/// The ceilings in force when this process was forked, for its own segment.
static INHERITED_LIMITS: [AtomicU64; MAX_DEVICES] =
    [const { AtomicU64::new(NO_LIMIT) }; MAX_DEVICES];

thread_local! {
    /// True on the thread running initialisation, whose own re-entrant calls pass through.
    static INITIALIZING_HERE: Cell<bool> = const { Cell::new(false) };
}

struct Settings {
    report_path: Option<PathBuf>,
    trace_path: Option<PathBuf>,
    shm_dir: PathBuf,
    /// The card each device emulates, kept for forked children.
    emulation: [Option<Emulation>; MAX_DEVICES],
    /// The group to join and its ceiling (`crate::group`).
    group: Option<(String, Option<u64>)>,
}

/// What a hook counts into.
pub struct Active {
    pub segment: &'static Segment,
    pub ledger: Ledger,
    /// The segment file's path, `None` for a private segment.
    path: Option<CString>,
}

impl Active {
    /// The segment file's path, `None` for a private segment.
    pub fn segment_path(&self) -> Option<PathBuf> {
        self.path
            .as_ref()
            .map(|p| PathBuf::from(p.to_string_lossy().into_owned()))
    }
}

/// The segment and ledger when counting is on; `None` means "pass the call straight through".
#[inline]
pub fn active() -> Option<&'static Active> {
    let p = ACTIVE.load(Ordering::Acquire);
    if p.is_null() && !init() {
        return None;
    }
    // SAFETY: a non-null ACTIVE points at a leaked `Active` that lives for the rest of the process
    // (it is only ever replaced in a forked child, where the old one stays mapped).
    unsafe { ACTIVE.load(Ordering::Acquire).as_ref() }
}

/// The state, if this process image made one, without starting anything.
fn current() -> Option<&'static Active> {
    // SAFETY: as in `active`.
    unsafe { ACTIVE.load(Ordering::Acquire).as_ref() }
}

/// The segment file's path, NULL for a private segment or before start-up.
pub fn segment_path() -> *const c_char {
    current()
        .and_then(|a| a.path.as_ref())
        .map_or(std::ptr::null(), |p| p.as_ptr())
}

/// Runs start-up (or a forked child's first-use set-up) if nobody has; true when counting is on.
#[cold]
pub fn init() -> bool {
    loop {
        let seen = STATE.load(Ordering::Acquire);
        match seen {
            READY => return true,
            DISABLED => return false,
            UNINIT | FORKED => {
                if STATE
                    .compare_exchange(seen, INITIALIZING, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                INITIALIZING_HERE.with(|c| c.set(true));
                let outcome = if seen == UNINIT {
                    start()
                } else {
                    start_child()
                };
                INITIALIZING_HERE.with(|c| c.set(false));
                STATE.store(if outcome { READY } else { DISABLED }, Ordering::Release);
                return outcome;
            }
            _ => {
                if INITIALIZING_HERE.with(Cell::get) {
                    return false;
                }
                std::thread::yield_now();
            }
        }
    }
}

fn start() -> bool {
    crate::resolve::init();
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            warn(&e.0);
            // SAFETY: ends the process at once with a failure status, as promised for bad settings.
            unsafe { libc::_exit(2) }
        }
    };
    for line in &config.not_settings {
        warn(line);
    }
    if config.disabled {
        return false;
    }
    let tracing = config
        .trace_path
        .as_ref()
        .is_some_and(|pattern| crate::trace::enable(pattern, config.trace_max));
    if config.trace_path.is_some() && !tracing {
        warn("cannot map the timeline's table of call sites; no timeline will be written");
    }
    if config.report_path.is_some() || config.oom_report_path.is_some() {
        crate::ledger::stamp_births();
    }
    if let Some(pattern) = config.oom_report_path.clone() {
        crate::report::enable_out_of_memory_report(pattern);
    }
    if let Some(bytes) = config.python_stacks_from {
        crate::stacks::enable(bytes, config.python_stacks_depth);
    }
    let settings = SETTINGS.get_or_init(|| Settings {
        report_path: config.report_path.clone(),
        trace_path: config.trace_path.clone().filter(|_| tracing),
        shm_dir: config.shm_dir.clone(),
        emulation: std::array::from_fn(|device| {
            config
                .emulate_per_device
                .iter()
                .find(|&&(d, _)| d as usize == device)
                .map(|&(_, e)| e)
                .or(config.emulate_all)
        }),
        group: config.group.clone().map(|name| (name, config.group_limit)),
    });
    let limit_of = |device: u32| {
        config
            .limit_per_device
            .iter()
            .find(|&&(d, _)| d == device)
            .map(|&(_, bytes)| bytes)
            .or(config.limit_all)
    };
    expect_group(settings);
    if !make_active(settings, limit_of) {
        return false;
    }
    // SAFETY: plain C callbacks registered once; they only touch this module's statics.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(in_forked_child));
    }
    true
}

/// A forked child's first CUDA call: a segment and a ledger of its own, with the ceilings in force
/// when it was forked.
fn start_child() -> bool {
    let Some(settings) = SETTINGS.get() else {
        return false;
    };
    // Its group (if any) it joins at its first call that counts, as every image does
    // (`crate::group::forked` made it pending).
    make_active(settings, |d| {
        match INHERITED_LIMITS[d as usize].load(Ordering::Relaxed) {
            NO_LIMIT => None,
            l => Some(l),
        }
    })
}

/// The group the settings name, if any, to be joined at this image's first call that counts.
fn expect_group(settings: &Settings) {
    let Some((name, limit)) = &settings.group else {
        return;
    };
    crate::group::expect(crate::group::Plan {
        dir: settings.shm_dir.clone(),
        name: name.clone(),
        limit: *limit,
        emulated_totals: std::array::from_fn(|d| settings.emulation[d].map_or(0, |e| e.total)),
    });
}

/// Creates this image's segment and ledger and publishes them.
fn make_active(settings: &Settings, limit_of: impl Fn(u32) -> Option<u64>) -> bool {
    let Some(ledger) = Ledger::new() else {
        warn("cannot map memory for the ledger; counting is off");
        return false;
    };
    let Some((segment, path)) = make_segment(settings) else {
        return false;
    };
    // A forked child's new segment: the modules its parent named keep their slots.
    crate::modules::publish(segment);
    crate::trace::attach(segment);
    for device in 0..MAX_DEVICES as u32 {
        segment.start_limit(device, limit_of(device));
    }
    for (counters, emulation) in segment.devices.iter().zip(settings.emulation.iter()) {
        if let Some(e) = emulation {
            counters
                .emulated_card
                .store(u64::from(e.card_code), Ordering::Relaxed);
            counters.emulated_total.store(e.total, Ordering::Relaxed);
        }
    }
    let active = Box::new(Active {
        segment,
        ledger,
        path,
    });
    ACTIVE.store(Box::into_raw(active), Ordering::Release);
    true
}

/// Creates this process's segment file, or a private segment (with one warning) if that fails.
fn make_segment(settings: &Settings) -> Option<(&'static Segment, Option<CString>)> {
    let pid = std::process::id();
    let command = command_line(pid).unwrap_or_default();
    let ticks = start_ticks(pid).unwrap_or(0);
    let dir = &settings.shm_dir;
    let (mapping, flags) = match create_segment(dir, current_uid(), pid) {
        Ok(m) => (m, 0),
        Err(e) => {
            warn(&format!(
                "cannot create a segment in {} ({e}); counting in process memory only, so other \
                 processes cannot read this one (set GPUMEMHOOK_SHM_DIR to a writable directory)",
                dir.display()
            ));
            match private_segment() {
                Ok(m) => (m, FLAG_PRIVATE),
                Err(_) => {
                    warn("cannot map process memory for counters; counting is off");
                    return None;
                }
            }
        }
    };
    let path = mapping
        .path()
        .and_then(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok());
    let segment = mapping.leak();
    gpumemhook_reader::JobLabels::of_this_process().write_to(segment); // job labels (issue 13)
                                                                       // Before the magic is published: a reader of another pid namespace must never see a header
                                                                       // that does not say the pid is not one of its own.
    let namespace = own_pid_namespace().unwrap_or(0);
    segment
        .header
        .pid_namespace
        .store(namespace, Ordering::Relaxed);
    segment.initialise(pid, ticks, unix_now_ns(), &command, flags);
    Some((segment, path))
}

/// In a forked child (async-signal-safe: plain atomic stores only): forget the parent's segment and
/// ledger, keep its ceilings for the child's own segment, made at the child's first CUDA call.
extern "C" fn in_forked_child() {
    if let Some(parent) = current() {
        for (inherited, counters) in INHERITED_LIMITS.iter().zip(parent.segment.devices.iter()) {
            inherited.store(counters.limit.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
    ACTIVE.store(std::ptr::null_mut(), Ordering::Release);
    crate::trace::forked();
    crate::modules::forked();
    crate::stacks::forked();
    crate::report::forked();
    crate::owned::forked();
    crate::driver::forked();
    crate::emulation::forked();
    crate::group::forked();
    if STATE.load(Ordering::Acquire) == READY {
        STATE.store(FORKED, Ordering::Release);
    }
}

/// At exit: write the report and timeline if asked (and the process used CUDA), then remove the
/// segment file. A forked child that never used CUDA has no state of its own and does nothing.
extern "C" fn at_exit() {
    let Some(active) = current() else {
        return;
    };
    if crate::report::used_gpu(active.segment) {
        if let Some(settings) = SETTINGS.get() {
            if let Some(pattern) = &settings.report_path {
                crate::report::write(
                    &gpumemhook_reader::expand_output(pattern),
                    active.segment,
                    active.segment_path().as_deref(),
                    &active.ledger,
                );
            }
            if settings.trace_path.is_some() {
                crate::trace::finish(active.segment);
            }
        }
    }
    if let Some(path) = &active.path {
        // SAFETY: `path` is the NUL-terminated path of our own segment file.
        unsafe { libc::unlink(path.as_ptr()) };
    }
}

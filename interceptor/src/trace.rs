//! The timeline recorder (`GPUMEMHOOK_TRACE=path`).
//!
//! Events go into one preallocated buffer (an anonymous mapping the kernel backs page by page as it
//! fills): a thread claims a slot with one `fetch_add` and writes it; nothing is formatted, locked or
//! allocated on the hot path. At exit the slots are sorted by time and written as Chrome trace JSON
//! (the format lives in `gpumemhook_reader::trace`). Events past the buffer's capacity
//! (`GPUMEMHOOK_TRACE_EVENTS`, default 4 Mi events) are counted as dropped and reported in the file
//! and on stderr. A process killed before exit writes no timeline.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

use gpumemhook_reader::trace::{Event, EventKind};
use gpumemhook_reader::{MemKind, Segment};

/// Entry-point codes: driver functions by [`crate::driver::DriverFn`] index, runtime functions
/// from [`RUNTIME_BASE`] on, scope events by their index in the scope-name table.
pub type EntryCode = u16;
pub const RUNTIME_BASE: EntryCode = 64;

/// One slot. `ts_ns` is written last (release): a zero timestamp marks a slot still being written.
#[repr(C)]
struct Slot {
    ts_ns: AtomicU64,
    address: u64,
    bytes: u64,
    used: u64,
    device: u32,
    tid: u32,
    entry: EntryCode,
    kind: u8,
    mem: u8,
}

static BUFFER: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
static CAPACITY: AtomicU64 = AtomicU64::new(0);
static NEXT: AtomicU64 = AtomicU64::new(0);
/// Names of scopes seen by [`gpumemhook_trace_scope`] (cold path).
static SCOPE_NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
}

fn tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            // The system call, not glibc's gettid(), which only glibc 2.30+ has (the library must load
            // on glibc 2.17). SAFETY: SYS_gettid takes no arguments and cannot fail.
            t.set(unsafe { libc::syscall(libc::SYS_gettid) } as u32);
        }
        t.get()
    })
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists (served by the vDSO).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
        .max(1)
}

/// Turns recording on with room for `capacity` events (at start-up).
pub fn enable(capacity: u64) -> bool {
    let bytes = capacity.saturating_mul(std::mem::size_of::<Slot>() as u64) as usize;
    // SAFETY: an anonymous private mapping, zero-filled; checked below. MAP_NORESERVE: only the
    // pages events actually fill take memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    CAPACITY.store(capacity, Ordering::Relaxed);
    BUFFER.store(p.cast(), Ordering::Release);
    true
}

/// Records one event; a no-op (one load) when recording is off.
#[inline]
pub fn record(
    kind: EventKind,
    entry: EntryCode,
    device: u32,
    bytes: u64,
    used: u64,
    address: u64,
    mem: MemKind,
) {
    let buffer = BUFFER.load(Ordering::Relaxed);
    if buffer.is_null() {
        return;
    }
    record_slow(buffer, kind, entry, device, bytes, used, address, mem);
}

#[allow(clippy::too_many_arguments)]
fn record_slow(
    buffer: *mut Slot,
    kind: EventKind,
    entry: EntryCode,
    device: u32,
    bytes: u64,
    used: u64,
    address: u64,
    mem: MemKind,
) {
    let index = NEXT.fetch_add(1, Ordering::Relaxed);
    if index >= CAPACITY.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: `index` is below the capacity the buffer was mapped with and was claimed by this
    // thread alone through `fetch_add`, so nobody else writes this slot.
    let slot = unsafe { &mut *buffer.add(index as usize) };
    slot.address = address;
    slot.bytes = bytes;
    slot.used = used;
    slot.device = device;
    slot.tid = tid();
    slot.entry = entry;
    slot.kind = kind as u8;
    slot.mem = mem as u8;
    slot.ts_ns.store(now_ns(), Ordering::Release);
}

/// In a forked child: start an empty timeline (the buffer is the child's private copy).
pub fn forked() {
    NEXT.store(0, Ordering::Relaxed);
}

/// Marks a scope opening (`open != 0`) or closing on the timeline. Called by in-process readers.
#[no_mangle]
pub extern "C" fn gpumemhook_trace_scope(open: c_int, slot: u32, name: *const c_char) {
    if BUFFER.load(Ordering::Relaxed).is_null() {
        return;
    }
    let name = if name.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null `name` is the caller's NUL-terminated string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    let code = {
        let mut names = SCOPE_NAMES.lock().unwrap_or_else(|e| e.into_inner());
        names.push(name);
        (names.len() - 1) as EntryCode
    };
    let kind = if open != 0 {
        EventKind::ScopeOpen
    } else {
        EventKind::ScopeClose
    };
    record(kind, code, 0, 0, 0, u64::from(slot), MemKind::Device);
}

fn kind_of(code: u8) -> EventKind {
    match code {
        0 => EventKind::Alloc,
        1 => EventKind::Free,
        2 => EventKind::Denied,
        3 => EventKind::Failed,
        4 => EventKind::ScopeOpen,
        _ => EventKind::ScopeClose,
    }
}

fn mem_of(code: u8) -> MemKind {
    match code {
        1 => MemKind::Managed,
        2 => MemKind::HostPinned,
        _ => MemKind::Device,
    }
}

/// Writes the timeline at exit to `pattern` (`%p` becomes the pid).
pub fn write(pattern: &str, segment: &Segment) {
    let buffer = BUFFER.load(Ordering::Acquire);
    if buffer.is_null() {
        return;
    }
    let capacity = CAPACITY.load(Ordering::Relaxed);
    let claimed = NEXT.load(Ordering::Acquire);
    let recorded = claimed.min(capacity);
    let dropped = claimed - recorded;
    let scope_names: Vec<String> = SCOPE_NAMES.lock().map(|n| n.clone()).unwrap_or_default();
    // Scope names are leaked once, at exit, so events can borrow them for the writer.
    let scope_names: Vec<&'static str> = scope_names
        .into_iter()
        .map(|n| &*Box::leak(n.into_boxed_str()))
        .collect();
    let mut events: Vec<Event> = (0..recorded as usize)
        .filter_map(|i| {
            // SAFETY: slots below `recorded` lie inside the mapping.
            let slot = unsafe { &*buffer.add(i) };
            let ts_ns = slot.ts_ns.load(Ordering::Acquire);
            (ts_ns != 0).then(|| {
                let kind = kind_of(slot.kind);
                let name = match kind {
                    EventKind::ScopeOpen | EventKind::ScopeClose => {
                        scope_names.get(slot.entry as usize).copied().unwrap_or("")
                    }
                    _ => entry_name(slot.entry),
                };
                Event {
                    ts_ns,
                    kind,
                    device: slot.device,
                    bytes: slot.bytes,
                    used: slot.used,
                    address: slot.address,
                    name,
                    mem: mem_of(slot.mem),
                    tid: slot.tid,
                    scope: slot.address as u32,
                }
            })
        })
        .collect();
    events.sort_by_key(|e| e.ts_ns);
    let limits: BTreeMap<u32, u64> = segment
        .active_devices()
        .into_iter()
        .filter_map(|d| Some((d, segment.device(d)?.limit()?)))
        .collect();
    let path = pattern.replace("%p", &std::process::id().to_string());
    let written = std::fs::File::create(&path).and_then(|f| {
        let mut out = std::io::BufWriter::new(f);
        gpumemhook_reader::trace::write_chrome_trace(
            &mut out,
            std::process::id(),
            &segment.command(),
            &events,
            &limits,
            dropped,
        )
    });
    match written {
        Err(e) => eprintln!("gpumemhook: cannot write the timeline to {path}: {e}"),
        Ok(()) if dropped > 0 => eprintln!(
            "gpumemhook: the timeline {path} misses the last {dropped} events (buffer of {capacity}; \
             raise GPUMEMHOOK_TRACE_EVENTS)"
        ),
        Ok(()) => {}
    }
}

/// The name of an entry point code.
fn entry_name(code: EntryCode) -> &'static str {
    if code >= RUNTIME_BASE {
        crate::runtime::name_by_index(usize::from(code - RUNTIME_BASE))
    } else {
        crate::driver::NAMES
            .get(usize::from(code))
            .and_then(|n| n.to_str().ok())
            .unwrap_or("?")
    }
}

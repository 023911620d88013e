//! Python call sites (`GPUMEMHOOK_STACKS=python:<min bytes>[:depth=<n>]`): the innermost Python
//! frames (file, line, function) of the thread that made each device allocation of at least that
//! size, for the leak and out-of-memory reports and the timeline.
//!
//! Only allocations at or above the threshold look (every other allocation pays one load and one
//! comparison). The frames are read from CPython's memory by [`cpython`], without the GIL, so an
//! allocation made with the GIL released (PyTorch's, JAX's and CuPy's operators release it) has its
//! site as well as one made under it; the hook never waits for the GIL, which could deadlock. A
//! thread of a Python process without a Python frame (autograd's backward thread, NCCL's) records
//! `no Python frame, thread '<name>'`. A site (`file:line in function`, then the callers' frames
//! after ` < `, `depth` frames at most, 3 by default) is interned once and its number stored in the
//! ledger entry. The cost of a recorded site is measured in `BENCHMARKS.md`.
//!
//! Interning takes a lock and allocates: it happens only on this opt-in path. A forked child starts
//! a table of its own (the parent's lock may have been held at the instant of `fork`).

use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use gpumemhook_reader::env;
use gpumemhook_segment::Segment;

use crate::cpython;
use crate::ledger::MAX_SITE;

/// The smallest allocation whose site is recorded; `u64::MAX` when stacks are off.
static FROM: AtomicU64 = AtomicU64::new(u64::MAX);

/// Turns recording on for allocations of at least `bytes`, `depth` frames each (at start-up); finds
/// and checks the interpreter now, so that one it cannot read is said at once.
pub fn enable(bytes: u64, depth: usize) {
    DEPTH.store(depth.clamp(1, MAX_DEPTH), Ordering::Relaxed);
    FROM.store(bytes, Ordering::Relaxed);
    cpython::available();
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
    /// The site of each chain of frames seen (code object, offset, names), innermost first.
    by_frames: HashMap<Vec<cpython::RawFrame>, u32, BuildHasherDefault<WordHasher>>,
}

/// A hasher for the frame chains: words mixed by multiplication (the default SipHash costs more
/// than the rest of a site's lookup; these keys come from the process itself, not from an
/// adversary).
#[derive(Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
    fn write_i32(&mut self, word: i32) {
        self.write_u64(word as u32 as u64);
    }
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

/// In a forked child (async-signal-safe: plain stores): start an empty table (the child's own
/// segment starts with no site named).
pub fn forked() {
    TABLE.store(std::ptr::null_mut(), Ordering::Relaxed);
}

/// Counts a device allocation of `bytes` made at `site` in the segment's per-site breakdown
/// (nothing for 0, nor for sites past the segment's slots). A site is named there before its
/// first charge.
#[inline]
pub fn charge(site: u32, bytes: u64, segment: &Segment) {
    if let Some(slot) = segment.sites.slot(site) {
        if slot.named.load(Ordering::Acquire) == 0 {
            name(site, segment);
        }
        slot.charge(bytes);
    }
}

#[cold]
fn name(site: u32, segment: &Segment) {
    if let Some(text) = describe(site) {
        segment.sites.name(site, &text);
    }
}

/// Takes a freed device allocation of `bytes` made at `site` out of the breakdown.
#[inline]
pub fn discharge(site: u32, bytes: u64, segment: &Segment) {
    if let Some(slot) = segment.sites.slot(site) {
        slot.discharge(bytes);
    }
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

/// The most frames a site may hold (`depth=` of `GPUMEMHOOK_STACKS`).
const MAX_DEPTH: usize = env::STACKS_MAX_DEPTH as usize;
/// Between a site's frames, innermost first: "called from".
pub const FRAME_SEPARATOR: &str = " < ";
/// What a site of a thread without a Python frame starts with; the thread's name follows.
pub const NO_PYTHON_FRAME: &str = "no Python frame, thread ";

/// Frames per site.
static DEPTH: AtomicUsize = AtomicUsize::new(env::STACKS_DEFAULT_DEPTH as usize);

#[cold]
fn python_site() -> u32 {
    let mut frames = [cpython::RawFrame::default(); MAX_DEPTH];
    let depth = DEPTH.load(Ordering::Relaxed).clamp(1, MAX_DEPTH);
    let n = cpython::frames(&mut frames[..depth]);
    if n == 0 {
        return if cpython::available() {
            intern(format!("{NO_PYTHON_FRAME}{}", thread_name()))
        } else {
            0
        };
    }
    let found = &frames[..n];
    // The frames seen before give their site without reading a line table or a name again.
    if let Ok(sites) = table().lock() {
        if let Some(&number) = sites.by_frames.get(found) {
            return number;
        }
    }
    let mut text = String::with_capacity(96 * n);
    for (i, f) in found.iter().map(cpython::describe).enumerate() {
        if i > 0 {
            text.push_str(FRAME_SEPARATOR);
        }
        let _ = write!(text, "{}:{} in {}", f.file, f.line, f.function);
    }
    let number = intern(text);
    if let Ok(mut sites) = table().lock() {
        if number != 0 && sites.by_frames.len() < MAX_FRAME_KEYS {
            sites.by_frames.insert(found.to_vec(), number);
        }
    }
    number
}

/// The most frame chains remembered (each names a site already interned): beyond, a site is read
/// afresh each time.
const MAX_FRAME_KEYS: usize = 1 << 20;

/// This thread's name (`prctl(PR_GET_NAME)`: one system call, no file), quoted; its id when unnamed.
fn thread_name() -> String {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes and a NUL into the buffer.
    let rc = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    let end = name.iter().position(|&b| b == 0).unwrap_or(16);
    if rc == 0 && end > 0 {
        format!("'{}'", String::from_utf8_lossy(&name[..end]))
    } else {
        // SAFETY: gettid has no preconditions.
        format!("{}", unsafe { libc::syscall(libc::SYS_gettid) })
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
        enable(1024, 3);
        assert_eq!(site(1023), 0);
        assert_eq!(site(4096), 0);
    }
}

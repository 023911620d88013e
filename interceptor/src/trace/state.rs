//! The recorder's life as a type: the states of its file ([`RecorderState`]), held in one atomic
//! whose every move is a named transition of [`Lifecycle`], and the facts of the file being
//! written ([`FileFacts`]), which a forked child forgets in one call.
//!
//! ```text
//!   Off --enable--> Unopened --begin_open--> Opening --opened--> Open
//!                      ^                                   +---> Failed   (said once)
//!                      |                                   +---> Off      (/dev/null)
//!   any --restart_in_child (fork)--+        Open --stop (the file was cut)--> Off
//! ```
//!
//! Who moves it: `enable` at start-up; `begin_open` and `opened` the one thread that makes the
//! file at the first event (the others wait while it is `Opening`); `stop` whoever sees the file
//! cut; `restart_in_child` the fork child handler, async-signal-safe like everything it calls
//! here (atomic stores only). The hot path reads the state with one relaxed load
//! ([`Lifecycle::is_off`]).

use std::path::PathBuf;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

use gpumemhook_segment::{RecordingHeader, MAX_DEVICES};

/// `FileFacts::header_guard` when the header has no guard.
pub const NO_GUARD: usize = usize::MAX;
/// `FileFacts::limits_seen` of a device whose ceiling is not recorded yet.
pub const UNSEEN: u64 = u64::MAX - 1;
/// Slots of the pool of chunks handed on (`FileFacts::pool`; past them, a rest is left unused).
pub const POOL_SLOTS: usize = 64;

/// Whether the recorder writes, and whether its file is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecorderState {
    /// Nothing is recorded: not asked for, sent to `/dev/null`, or stopped (the file was cut).
    Off = 0,
    /// Recording was asked for; the file is made at the first event.
    Unopened = 1,
    /// One thread is making the file; the others wait for it.
    Opening = 2,
    /// The file is made: events are written.
    Open = 3,
    /// The file could not be made (said once): events are dropped.
    Failed = 4,
}

impl RecorderState {
    const fn of(code: u8) -> RecorderState {
        match code {
            1 => RecorderState::Unopened,
            2 => RecorderState::Opening,
            3 => RecorderState::Open,
            4 => RecorderState::Failed,
            _ => RecorderState::Off,
        }
    }
}

/// The recorder's state in one atomic; it changes only through the transitions below.
pub struct Lifecycle(AtomicU8);

impl Lifecycle {
    pub const fn new() -> Lifecycle {
        Lifecycle(AtomicU8::new(RecorderState::Off as u8))
    }

    /// Whether nothing is recorded: the hot path's one check (a relaxed load).
    #[inline]
    pub fn is_off(&self) -> bool {
        self.0.load(Ordering::Relaxed) == RecorderState::Off as u8
    }

    /// The state now (what a thread that acts on the file reads, with acquire: an `Open` state
    /// comes with the file's facts stored before it).
    pub fn now(&self) -> RecorderState {
        RecorderState::of(self.0.load(Ordering::Acquire))
    }

    /// Off to Unopened: recording is asked for (at start-up).
    pub fn enable(&self) {
        self.0
            .store(RecorderState::Unopened as u8, Ordering::Release);
    }

    /// Unopened to Opening: true for the one thread that is to make the file.
    pub fn begin_open(&self) -> bool {
        self.0
            .compare_exchange(
                RecorderState::Unopened as u8,
                RecorderState::Opening as u8,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Opening to what making the file gave: Open, Failed, or Off (a target that keeps nothing).
    pub fn opened(&self, outcome: Opened) {
        let state = match outcome {
            Opened::Open => RecorderState::Open,
            Opened::Failed => RecorderState::Failed,
            Opened::Discarded => RecorderState::Off,
        };
        self.0.store(state as u8, Ordering::Release);
    }

    /// To Off for good in this process image: the file was cut under the program.
    pub fn stop(&self) {
        self.0.store(RecorderState::Off as u8, Ordering::Release);
    }

    /// In a forked child whose parent recorded: to Unopened, the child's own file made at its
    /// first event (async-signal-safe: one store).
    pub fn restart_in_child(&self) {
        self.0
            .store(RecorderState::Unopened as u8, Ordering::Release);
    }
}

/// What making the file gave ([`Lifecycle::opened`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// The file is made and its header mapped.
    Open,
    /// It could not be made (said once).
    Failed,
    /// The target keeps nothing (`/dev/null`): nothing is recorded.
    Discarded,
}

/// The facts of the file this process image writes: made with it, forgotten by a forked child
/// ([`FileFacts::forget`]), which records into a file of its own.
#[derive(Debug)]
pub struct FileFacts {
    /// The file's descriptor, -1 before it is made.
    pub fd: AtomicI32,
    /// The header page, mapped for the life of the process image; null before the file is made.
    pub header: AtomicPtr<RecordingHeader>,
    /// The SIGBUS guard's slot of the header page (`GuardSlot::raw`), [`NO_GUARD`] for none.
    pub header_guard: AtomicUsize,
    /// The end of the file's range reserved so far: a file shorter than this was cut by another
    /// process (truncated, or copied over).
    pub reserved_end: AtomicU64,
    /// The next chunk's claim number.
    pub next_chunk: AtomicU64,
    /// Where an unmappable target gets its copy at exit (a leaked `PathBuf`), null for none.
    pub copy_to: AtomicPtr<PathBuf>,
    /// Events lost before the header could count them.
    pub lost_before_header: AtomicU64,
    /// The disk was full at the last try: events are lost, and only one in `FULL_RETRY` tries
    /// again (counted here).
    pub full: AtomicBool,
    pub retries: AtomicU64,
    /// The full disk was said.
    pub said_full: AtomicBool,
    /// The cut was said.
    pub said_cut: AtomicBool,
    /// The next scope name's number (0 is "none").
    pub scope_names: AtomicU32,
    /// Per device: the ceiling last recorded ([`UNSEEN`] before any), and the segment's time
    /// stamps of the last peak restart and ceiling change already recorded (0 before any).
    pub limits_seen: [AtomicU64; MAX_DEVICES],
    pub resets_seen: [AtomicU64; MAX_DEVICES],
    pub ceilings_seen: [AtomicU64; MAX_DEVICES],
    /// Which entry points and modules have their name in the file: one bit each.
    pub entries_written: [AtomicU64; 4],
    pub modules_written: [AtomicU64; 4],
    /// The rests of chunks handed on by threads that ended (the recorder's pool).
    pub pool: [AtomicU64; POOL_SLOTS],
}

impl FileFacts {
    pub const fn new() -> FileFacts {
        FileFacts {
            fd: AtomicI32::new(-1),
            header: AtomicPtr::new(std::ptr::null_mut()),
            header_guard: AtomicUsize::new(NO_GUARD),
            reserved_end: AtomicU64::new(0),
            next_chunk: AtomicU64::new(0),
            copy_to: AtomicPtr::new(std::ptr::null_mut()),
            lost_before_header: AtomicU64::new(0),
            full: AtomicBool::new(false),
            retries: AtomicU64::new(0),
            said_full: AtomicBool::new(false),
            said_cut: AtomicBool::new(false),
            scope_names: AtomicU32::new(1),
            limits_seen: [const { AtomicU64::new(UNSEEN) }; MAX_DEVICES],
            resets_seen: [const { AtomicU64::new(0) }; MAX_DEVICES],
            ceilings_seen: [const { AtomicU64::new(0) }; MAX_DEVICES],
            entries_written: [const { AtomicU64::new(0) }; 4],
            modules_written: [const { AtomicU64::new(0) }; 4],
            pool: [const { AtomicU64::new(0) }; POOL_SLOTS],
        }
    }

    /// In a forked child: every fact back to what [`FileFacts::new`] makes (the parent's file is
    /// not the child's); the parent's descriptor, -1 for none, is handed back for the caller to
    /// close. Async-signal-safe: atomic stores only.
    pub fn forget(&self) -> i32 {
        let fd = self.fd.swap(-1, Ordering::Relaxed);
        self.header.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.header_guard.store(NO_GUARD, Ordering::Relaxed);
        self.reserved_end.store(0, Ordering::Relaxed);
        self.next_chunk.store(0, Ordering::Relaxed);
        self.copy_to.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.lost_before_header.store(0, Ordering::Relaxed);
        self.full.store(false, Ordering::Relaxed);
        self.retries.store(0, Ordering::Relaxed);
        self.said_full.store(false, Ordering::Relaxed);
        self.said_cut.store(false, Ordering::Relaxed);
        self.scope_names.store(1, Ordering::Relaxed);
        for seen in &self.limits_seen {
            seen.store(UNSEEN, Ordering::Relaxed);
        }
        let zeroed = self.resets_seen.iter().chain(&self.ceilings_seen);
        let zeroed = zeroed
            .chain(&self.entries_written)
            .chain(&self.modules_written);
        for word in zeroed.chain(&self.pool) {
            word.store(0, Ordering::Relaxed);
        }
        fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_makes_the_file_and_a_fork_child_starts_over() {
        let life = Lifecycle::new();
        assert!(life.is_off());
        assert!(
            !life.begin_open(),
            "nothing is made before recording is asked for"
        );
        life.enable();
        assert_eq!(life.now(), RecorderState::Unopened);
        assert!(life.begin_open());
        assert!(!life.begin_open(), "one thread makes the file");
        assert_eq!(life.now(), RecorderState::Opening);
        life.opened(Opened::Failed);
        assert_eq!(life.now(), RecorderState::Failed);
        assert!(
            !life.is_off() && !life.begin_open(),
            "a failed file is not made again"
        );
        life.restart_in_child();
        assert!(life.begin_open(), "a forked child makes a file of its own");
        life.opened(Opened::Open);
        assert_eq!(life.now(), RecorderState::Open);
        life.stop();
        assert!(life.is_off());
        life.restart_in_child();
        assert!(life.begin_open());
        life.opened(Opened::Discarded);
        assert!(
            life.is_off(),
            "/dev/null keeps nothing: nothing is recorded"
        );
    }

    #[test]
    fn a_fork_child_forgets_every_fact_of_its_parents_file() {
        let mut dirty = std::mem::MaybeUninit::<FileFacts>::uninit();
        // SAFETY: every field is an atomic integer, pointer or bool, for which bytes of 1 are a
        // valid value (a bool's `true`), so the struct is initialized once they are written.
        let facts = unsafe {
            dirty.as_mut_ptr().write_bytes(1, 1);
            dirty.assume_init()
        };
        let new = format!("{:?}", FileFacts::new());
        assert_ne!(format!("{facts:?}"), new);
        assert_eq!(
            facts.forget(),
            0x0101_0101,
            "the parent's descriptor, to close"
        );
        assert_eq!(
            format!("{facts:?}"),
            new,
            "a fact the child kept of its parent's file"
        );
    }
}

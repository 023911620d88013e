//! The SIGBUS guard over mappings of files that another process may shrink: a fault inside a
//! registered range (the file shrank under the mapping) replaces the range with zeroed anonymous
//! memory and marks it tripped; the faulting access then completes on zeroes. Faults elsewhere go
//! to the handler installed before ours (or the default action), which is put back in place for
//! them (see [`chain`]). The handler is installed the first time a range is registered, and only
//! touches a fixed table of atomics, `mmap` and `sigaction`, all async-signal-safe.
//!
//! Two users, one table: readers register every segment mapping (`crate::shm`, [`Guarded`], freed
//! on drop), and the hook's flight recorder registers its header and each chunk it writes
//! ([`GuardSlot`], freed by its owner: a chunk outlives the value that mapped it), so that a
//! timeline truncated or replaced under the program costs the timeline, never the program.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Ranges guarded at once (reader mappings, and the recorder's header and one chunk per writing
/// thread); past that [`GuardSlot::new`] answers `None`.
const SLOTS: usize = 4096;

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

/// A registered range, released by whoever owns the mapping ([`GuardSlot::release`]): the hook's
/// chunks pass from thread to thread, so no value's lifetime says when their range ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardSlot(usize);

impl GuardSlot {
    /// Registers `[start, start + len)` (installing the handler on first use); `None` when every
    /// slot is taken (the range is then unguarded: a caller that cannot afford that does not use
    /// it).
    pub fn new(start: usize, len: usize) -> Option<GuardSlot> {
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
                return Some(GuardSlot(i));
            }
        }
        None
    }

    /// True once a fault replaced the range (one load: the recorder asks at every event).
    #[inline]
    pub fn tripped(self) -> bool {
        TRIPPED
            .get(self.0)
            .is_some_and(|t| t.load(Ordering::Relaxed))
    }

    /// Unregisters the range (before it is unmapped: a fault there is then no longer ours).
    pub fn release(self) {
        if let Some(slot) = TABLE.get(self.0) {
            slot.start.store(0, Ordering::SeqCst);
            slot.len.store(0, Ordering::SeqCst);
        }
    }

    /// The slot's number, for an owner that keeps it in an atomic word.
    pub fn raw(self) -> usize {
        self.0
    }

    /// The slot numbered `raw` ([`GuardSlot::raw`]); `None` for a number no slot has.
    pub fn from_raw(raw: usize) -> Option<GuardSlot> {
        (raw < SLOTS).then_some(GuardSlot(raw))
    }
}

/// A registered range; unregistered on drop.
#[derive(Debug)]
pub struct Guarded {
    slot: Option<GuardSlot>,
}

impl Guarded {
    /// Registers `[start, start + len)` (installing the handler on first use).
    pub fn new(start: usize, len: usize) -> Guarded {
        Guarded {
            slot: GuardSlot::new(start, len),
        }
    }

    /// True once a fault replaced the range.
    pub fn tripped(&self) -> bool {
        self.slot.is_some_and(GuardSlot::tripped)
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.release();
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
    _context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let fault = unsafe { &*info.cast::<FaultInfo>() };
    // Only a fault of the access itself names an address: a SIGBUS sent by a process carries its
    // pid and uid in those bytes, which it chooses (`rt_sigqueueinfo`).
    if !repeats(fault.code) {
        chain(signal, info);
        return;
    }
    let addr = fault.addr as usize;
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
    chain(signal, info);
}

/// Hands a fault that is not ours to the handler installed before ours, by the kernel rather than
/// by a call: the previous disposition goes back in place, then
/// * a fault of the access itself ([`repeats`]) returns, so the faulting access runs again and its
///   fault is delivered to that handler with its own flags, mask and stack;
/// * any other SIGBUS (sent by a process, an asynchronous memory error report), which returning
///   would not repeat, is queued again to this thread with its own siginfo, and (ours runs
///   `SA_NODEFER`) delivered at once.
///
/// Calling the previous handler from here would need its address turned into a function pointer
/// of a signature only its flags tell. Handing it over through `sigaction` needs no such cast, and
/// gives the handler exactly what it asked for. What it costs: from then on SIGBUS is the previous
/// handler's, and reader mappings are no longer guarded (a process whose SIGBUS was not ours was
/// almost always about to die of it).
fn chain(signal: libc::c_int, info: *mut libc::siginfo_t) {
    let installed = match PREVIOUS.get() {
        // SAFETY: reinstalls the disposition `sigaction` gave us, unchanged.
        Some(Previous(previous)) => unsafe {
            libc::sigaction(signal, previous, std::ptr::null_mut()) == 0
        },
        None => false,
    };
    if !installed {
        restore_default(signal);
    }
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let code = unsafe { (*info.cast::<FaultInfo>()).code };
    if !repeats(code) {
        // Sent again to this thread with its own siginfo (sender, code and all): Linux lets a
        // process queue any siginfo to itself.
        // SAFETY: rt_tgsigqueueinfo with our own pid and thread id and the siginfo we were given;
        // a system call, async-signal-safe.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                libc::getpid(),
                libc::syscall(libc::SYS_gettid),
                signal,
                info,
            )
        };
        if sent != 0 {
            // SAFETY: raise is async-signal-safe.
            unsafe { libc::raise(signal) };
        }
    }
}

/// Whether a SIGBUS of this `si_code` comes back when the handler returns: a fault of the
/// faulting access itself, which runs again (misaligned, no such address, a hardware error of the
/// object, a memory error consumed by the access). The others (sent by a process, an asynchronous
/// memory error report, the kernel's own) do not, and are sent again instead.
fn repeats(code: libc::c_int) -> bool {
    const BUS_ADRALN: libc::c_int = 1;
    const BUS_ADRERR: libc::c_int = 2;
    const BUS_OBJERR: libc::c_int = 3;
    const BUS_MCEERR_AR: libc::c_int = 4;
    matches!(code, BUS_ADRALN | BUS_ADRERR | BUS_OBJERR | BUS_MCEERR_AR)
}

fn restore_default(signal: libc::c_int) {
    // SAFETY: plain-data struct; resets the signal to its default action.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &default, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    //! Each case runs in a child: this test binary again, filtered to [`case`], with the case named
    //! in [`CASE`], since a fault's disposition is the whole process's.

    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    const CASE: &str = "SIGBUS_GUARD_CASE";

    extern "C" fn exit_42(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(42) }
    }

    extern "C" fn exit_43(_: libc::c_int) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(43) }
    }

    /// Installs `handler` for SIGBUS, SA_SIGINFO when `siginfo`.
    fn install_previous(handler: usize, siginfo: bool) {
        // SAFETY: a zeroed sigaction is valid plain data; it installs a valid handler.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler;
            action.sa_flags = if siginfo { libc::SA_SIGINFO } else { 0 };
            assert_eq!(
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()),
                0
            );
        }
    }

    /// A shared mapping of one page over a memfd of `size` bytes.
    fn map_memfd(size: libc::off_t) -> (libc::c_int, *mut u8) {
        // SAFETY: plain system calls on our own descriptor and a fresh mapping.
        unsafe {
            let fd = libc::memfd_create(c"sigbus-test".as_ptr(), 0);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, size), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            (fd, p.cast())
        }
    }

    /// Reads a byte past the end of an empty file's mapping: a real bus error outside any guarded
    /// range (while one range is guarded, so our handler is installed).
    fn fault_outside() -> u8 {
        let (_, guarded) = map_memfd(4096);
        let _guard = Guarded::new(guarded as usize, 4096);
        let (_, empty) = map_memfd(0);
        // SAFETY: deliberately faults (SIGBUS): the page lies past the end of the file.
        unsafe { std::ptr::read_volatile(empty) }
    }

    /// The child's side: does nothing unless [`CASE`] names a case.
    #[test]
    fn case() {
        let Ok(case) = std::env::var(CASE) else {
            return;
        };
        match case.as_str() {
            "previous-siginfo" => {
                install_previous(exit_42 as *const () as usize, true);
                fault_outside();
            }
            "previous-plain" => {
                install_previous(exit_43 as *const () as usize, false);
                fault_outside();
            }
            "default" => {
                fault_outside();
            }
            "raised" => {
                install_previous(exit_42 as *const () as usize, true);
                let (_, guarded) = map_memfd(4096);
                let _guard = Guarded::new(guarded as usize, 4096);
                // SAFETY: sends SIGBUS to this thread.
                unsafe { libc::raise(libc::SIGBUS) };
            }
            "forged" => {
                // A SIGBUS queued by a process, its address bytes naming a guarded page: not a
                // fault, so the page stays mapped and the previous handler gets the signal.
                install_previous(exit_42 as *const () as usize, true);
                let (_, page) = map_memfd(4096);
                let _guard = Guarded::new(page as usize, 4096);
                // SAFETY: a zeroed siginfo is valid plain data; the fields written are the prefix
                // every Linux ABI shares (`FaultInfo`).
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                {
                    // SAFETY: `FaultInfo` is a prefix of `siginfo_t`.
                    let fields =
                        unsafe { &mut *(&mut info as *mut libc::siginfo_t).cast::<FaultInfo>() };
                    fields.signo = libc::SIGBUS;
                    fields.code = libc::SI_QUEUE;
                    fields.addr = page.cast();
                }
                // SAFETY: queues a signal to this thread with the siginfo built above.
                unsafe {
                    libc::syscall(
                        libc::SYS_rt_tgsigqueueinfo,
                        libc::getpid(),
                        libc::syscall(libc::SYS_gettid),
                        libc::SIGBUS,
                        &info,
                    )
                };
            }
            "inside" => {
                install_previous(exit_42 as *const () as usize, true);
                let (fd, page) = map_memfd(4096);
                let guard = Guarded::new(page as usize, 4096);
                // SAFETY: shrinks our own file; the read below faults inside the guarded range.
                assert_eq!(unsafe { libc::ftruncate(fd, 0) }, 0);
                // SAFETY: the guard replaces the page with zeroes.
                let byte = unsafe { std::ptr::read_volatile(page) };
                assert_eq!(byte, 0);
                assert!(guard.tripped());
                std::process::exit(7);
            }
            other => panic!("unknown case {other}"),
        }
        std::process::exit(99);
    }

    /// Runs a case in a child; a child that loops on its fault is killed after 20 s (and fails).
    fn run_case(name: &str) -> std::process::ExitStatus {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "sigbus::tests::case",
                "--test-threads",
                "1",
                "-q",
            ])
            .env(CASE, name)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("case {name} did not end");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn a_fault_outside_the_guard_reaches_the_previous_siginfo_handler() {
        assert_eq!(run_case("previous-siginfo").code(), Some(42));
    }

    #[test]
    fn a_fault_outside_the_guard_reaches_the_previous_plain_handler() {
        assert_eq!(run_case("previous-plain").code(), Some(43));
    }

    #[test]
    fn a_fault_outside_the_guard_with_no_previous_handler_is_the_default_action() {
        assert_eq!(run_case("default").signal(), Some(libc::SIGBUS));
    }

    #[test]
    fn a_sigbus_sent_by_a_process_reaches_the_previous_handler() {
        assert_eq!(run_case("raised").code(), Some(42));
    }

    #[test]
    fn a_sigbus_queued_with_a_guarded_address_is_no_fault_and_reaches_the_previous_handler() {
        assert_eq!(run_case("forged").code(), Some(42));
    }

    #[test]
    fn a_fault_inside_the_guard_reads_zeroes() {
        assert_eq!(run_case("inside").code(), Some(7));
    }
}

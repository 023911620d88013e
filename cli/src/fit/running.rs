//! The trials `fit` has running, which it owns: each trial is started in a process group of its own
//! (its directory and its process group recorded in [`RUNNING`]), ended with its whole group, and
//! never left behind. When `fit` is told to stop (SIGTERM, SIGINT, SIGHUP), ends with an error or
//! panics, [`RunningTrials::stop_all`] sends the signal to every running trial's group, waits for
//! them [`GRACE`], kills what is left, and removes their directories.
//!
//! Each trial is also a memory group of its own (`GPUMEMHOOK_GROUP`, `docs/groups.md`), named
//! [`memory_group`] of `fit`'s pid and the trial's id, so that all its processes share one ceiling
//! or card and one joint peak; its group file goes with its directory, whichever way the trial
//! ends (a file of that name left by an earlier `fit` of the same pid is removed before it starts).
//!
//! A trial's group is ended while its leader is still unreaped (seen ended with `WNOWAIT`), so that
//! its id cannot yet belong to another process (so too a trial ended at its time limit, or once
//! its outcome no longer matters to the search): whatever the trial left running in its group is
//! killed with it, and reaped (`fit` is the subreaper of what its trials orphan), so that no
//! process of the group is left, not even a zombie.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use crate::launch::{signal_name, Signals, TempDir};

/// How long a trial's group is given to end after its signal (SIGTERM on a time limit, or what
/// `fit` was sent) before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// How long the members of an ended trial's group are waited for, to reap them.
const REAP_WAIT: Duration = Duration::from_secs(2);

/// How long, after SIGKILL, the trials' threads are given to reap their groups and read the last of
/// their stderr (`trial::STDERR_WAIT`) before `stop_all` goes on without them.
const AFTER_KILL: Duration = Duration::from_secs(4);

/// How often a running trial is looked at (its end, its time limit).
const POLL: Duration = Duration::from_millis(20);

/// Every trial `fit` has running.
pub(super) static RUNNING: RunningTrials = RunningTrials {
    state: Mutex::new(State {
        trials: Vec::new(),
        next_id: 0,
        stopping: false,
        signals: None,
    }),
    changed: Condvar::new(),
};

pub(super) struct RunningTrials {
    state: Mutex<State>,
    /// Notified when a trial is gone.
    changed: Condvar,
}

struct State {
    trials: Vec<Entry>,
    next_id: u64,
    /// Set by [`RunningTrials::stop_all`]: no trial starts after it.
    stopping: bool,
    /// The signals `fit` takes for itself ([`RunningTrials::own`]), unblocked again in each trial.
    signals: Option<Signals>,
}

struct Entry {
    id: u64,
    dir: PathBuf,
    /// The process group, once the trial is started (its leader's pid).
    group: Option<libc::pid_t>,
}

/// A running trial's directory (its reports), removed with its entry when dropped.
pub(super) struct TrialDir {
    id: u64,
    dir: TempDir,
}

impl TrialDir {
    pub(super) fn path(&self) -> &Path {
        &self.dir.0
    }

    /// The trial's memory group ([`memory_group`]).
    pub(super) fn memory_group(&self) -> String {
        memory_group(self.id)
    }
}

/// The memory group of trial `id` of this `fit`: `fit-<pid>-<id>-<token>`, unique among the
/// trials of every `fit` running at once, and not to be guessed: another user cannot make a file at
/// its name before the trial does (the segment directory is everyone's).
fn memory_group(id: u64) -> String {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let token = TOKEN.get_or_init(unguessable);
    format!("fit-{}-{id}-{token:016x}", std::process::id())
}

/// 64 bits from the kernel's random source (`/dev/urandom`: the `getrandom` call is newer than the
/// oldest C library the wheel supports), the clock and pid mixed in where it cannot be read.
fn unguessable() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_ok() {
        return u64::from_ne_bytes(bytes);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    now ^ (u64::from(std::process::id()) << 32)
}

impl Drop for TrialDir {
    fn drop(&mut self) {
        let mut state = RUNNING.lock();
        state.trials.retain(|e| e.id != self.id);
        // The directory goes while the entry's lock is held: `stop_all` never finds it half gone.
        let _ = std::fs::remove_dir_all(&self.dir.0);
        crate::groups::remove(&memory_group(self.id));
        drop(state);
        RUNNING.changed.notify_all();
    }
}

/// How a trial's process ended.
pub(super) struct Ended {
    pub(super) status: ExitStatus,
    /// Whether its time limit ended it.
    pub(super) timed_out: bool,
    /// Whether it was ended because its outcome no longer mattered.
    pub(super) stopped: bool,
}

impl RunningTrials {
    /// Makes `fit` the owner of its trials from here on: SIGTERM, SIGINT and SIGHUP (from a process
    /// or a terminal: the trials' groups are not the terminal's, so a Ctrl-C reaches them only
    /// through `fit`) stop every running trial ([`RunningTrials::stop_all`]), then `fit` exits
    /// 128+N; a panic stops them before the process aborts. Called before any thread starts, so
    /// that every thread inherits the blocked signals. `live`: a progress line is on stderr.
    pub(super) fn own(&'static self, live: bool) {
        const STOPPING: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
        let signals = Signals::block(&STOPPING);
        self.lock().signals = Some(signals);
        // What a trial orphans comes to fit, which reaps it with the trial's group; best effort:
        // without it, such processes are reaped by init as before.
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument and changes only
        // this process's own attribute.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
        signals.take(move |sig, _| {
            let (running, left) = self.stop_all(sig);
            if live {
                say!("\r\x1b[2K");
            }
            let were = match running {
                1 => "1 trial was".to_string(),
                n => format!("{n} trials were"),
            };
            let left = match left {
                0 => "none is left".to_string(),
                n => format!("{n} did not end after SIGKILL"),
            };
            sayln!(
                "gpumemhook fit: {}: stopped ({were} running, {left})",
                signal_name(sig)
            );
            std::process::exit(128 + sig);
        });
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            self.stop_all_after_panic();
        }));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new directory `<base>/.gpumemhook-fit-XXXXXX` for a trial, recorded so that it is removed
    /// whatever happens to `fit`; `Ok(None)` when `fit` is stopping.
    pub(super) fn make_dir(&self, base: &Path) -> anyhow::Result<Option<TrialDir>> {
        let mut state = self.lock();
        if state.stopping {
            return Ok(None);
        }
        let dir = TempDir::new(base, ".gpumemhook-fit")?;
        state.next_id += 1;
        let id = state.next_id;
        // Left by an earlier `fit` of this pid that was killed: its figures are not this trial's.
        crate::groups::remove(&memory_group(id));
        state.trials.push(Entry {
            id,
            dir: dir.0.clone(),
            group: None,
        });
        Ok(Some(TrialDir { id, dir }))
    }

    /// Starts `command` as the trial of `dir`, in a process group of its own, unless `fit` is
    /// stopping (`Ok(None)`). Started and recorded under one lock: no signal falls between.
    pub(super) fn spawn(&self, dir: &TrialDir, command: &mut Command) -> io::Result<Option<Child>> {
        use std::os::unix::process::CommandExt;
        let mut state = self.lock();
        if state.stopping {
            return Ok(None);
        }
        if let Some(signals) = state.signals {
            signals.unblock_in_child(command);
        }
        let child = command.process_group(0).spawn()?;
        if let Some(e) = state.trials.iter_mut().find(|e| e.id == dir.id) {
            e.group = Some(child.id() as libc::pid_t);
        }
        Ok(Some(child))
    }

    /// Waits for a trial started by [`RunningTrials::spawn`] to end, ending its group at `limit` or
    /// once `moot` is set (SIGTERM, then SIGKILL after [`GRACE`]); whatever of its group outlives
    /// the leader is killed, and the whole group reaped.
    pub(super) fn wait(
        &self,
        child: &Child,
        limit: Option<Duration>,
        moot: &AtomicBool,
    ) -> io::Result<Ended> {
        let group = child.id() as libc::pid_t;
        let started = Instant::now();
        let (mut timed_out, mut stopped) = (false, false);
        let mut terminated_at: Option<Instant> = None;
        let status = loop {
            if let Some(status) = leader_ended(group)? {
                break status;
            }
            let past_limit = limit.is_some_and(|l| started.elapsed() >= l);
            if terminated_at.is_none() && !timed_out && !stopped {
                timed_out = past_limit;
                stopped = !past_limit && moot.load(Ordering::Relaxed);
                if timed_out || stopped {
                    terminated_at = Some(Instant::now());
                    signal_group(group, libc::SIGTERM);
                }
            }
            if terminated_at.is_some_and(|at| at.elapsed() >= GRACE) {
                terminated_at = None;
                signal_group(group, libc::SIGKILL);
            }
            std::thread::sleep(POLL);
        };
        // The leader is not reaped yet, so the group's id is still its own.
        signal_group(group, libc::SIGKILL);
        reap_group(group);
        Ok(Ended {
            status,
            timed_out,
            stopped,
        })
    }

    /// Whether `fit` is stopping (its trials' outcomes no longer matter).
    pub(super) fn stopping(&self) -> bool {
        self.lock().stopping
    }

    /// Stops every running trial and starts no more: `signal` to each trial's group, [`GRACE`] for
    /// them to end (their threads reap them), SIGKILL to what is left, then their directories
    /// removed. Returns how many were running, and how many of them had not ended even so (a
    /// process stuck in the kernel). Safe to call more than once.
    pub(super) fn stop_all(&self, signal: libc::c_int) -> (usize, usize) {
        let mut state = self.lock();
        state.stopping = true;
        let running = state.trials.len();
        for group in state.trials.iter().filter_map(|e| e.group) {
            signal_group(group, signal);
        }
        state = self.wait_empty(state, GRACE);
        for group in state.trials.iter().filter_map(|e| e.group) {
            signal_group(group, libc::SIGKILL);
        }
        state = self.wait_empty(state, AFTER_KILL);
        for entry in &state.trials {
            end_leftovers(&memory_group(entry.id));
            let _ = std::fs::remove_dir_all(&entry.dir);
            crate::groups::remove(&memory_group(entry.id));
        }
        remove_stale_segments();
        (running, state.trials.len())
    }

    /// [`RunningTrials::stop_all`] from a panic hook: the panicking thread may hold the lock (then
    /// nothing is done rather than wait for ever).
    pub(super) fn stop_all_after_panic(&self) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            // The guard, if taken, goes at the end of this statement: stop_all locks again.
            let free = !matches!(self.state.try_lock(), Err(TryLockError::WouldBlock));
            if free {
                self.stop_all(libc::SIGTERM);
                return;
            }
            std::thread::sleep(POLL);
        }
    }

    fn wait_empty<'a>(
        &self,
        mut state: MutexGuard<'a, State>,
        wait: Duration,
    ) -> MutexGuard<'a, State> {
        let deadline = Instant::now() + wait;
        while !state.trials.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state
    }
}

/// Stops the running trials when dropped: on `fit`'s own errors (a panic is the panic hook's, as
/// the release build aborts without unwinding).
pub(super) struct StopOnDrop;

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        RUNNING.stop_all(libc::SIGTERM);
    }
}

/// How the process `pid`, a child of this one, ended, or `None` while it runs; it is left unreaped.
fn leader_ended(pid: libc::pid_t) -> io::Result<Option<ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    loop {
        // SAFETY: siginfo_t is plain data that waitid fills; zeroed, si_pid reads 0 when nothing
        // has ended.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-pointer; WNOWAIT leaves the child unreaped.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if r == 0 {
            // SAFETY: waitid filled `info` for a child's end, or left it zeroed (si_pid 0).
            let (ended, status) = unsafe { (info.si_pid(), info.si_status()) };
            if ended == 0 {
                return Ok(None);
            }
            // The wait status waitpid would have given, from waitid's fields.
            let raw = match info.si_code {
                libc::CLD_EXITED => (status & 0xff) << 8,
                libc::CLD_DUMPED => status | 0x80,
                _ => status,
            };
            return Ok(Some(ExitStatus::from_raw(raw)));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Reaps every member of `group` (its leader and, `fit` being their subreaper, whatever it started
/// that was orphaned), until none is left or [`REAP_WAIT`] has passed (a process stuck in the
/// kernel cannot be waited for).
fn reap_group(group: libc::pid_t) {
    let deadline = Instant::now() + REAP_WAIT;
    loop {
        // SAFETY: waitpid of this process's own children in `group`; no status is read.
        while unsafe { libc::waitpid(-group, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        // SAFETY: signal 0 only asks whether any process of the group is left.
        let left = unsafe { libc::kill(-group, 0) } == 0
            || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        if !left || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(POLL);
    }
}

/// Ends what the trial whose memory group is `group_name` left running outside its process group
/// (a daemon that called `setsid`, say). Such a process is orphaned to `fit`, the subreaper of
/// whatever its trials start, and carries the trial's `GPUMEMHOOK_GROUP` in its environment: each
/// child of `fit` with it is killed and reaped; its own children are orphaned to `fit` in turn, and
/// found the same way, until none is left or [`REAP_WAIT`] has passed.
/// Returns how many it ended.
pub(super) fn end_leftovers(group_name: &str) -> usize {
    let me = std::process::id();
    let mark = format!("{}={group_name}", gpumemhook_reader::env::GROUP);
    let deadline = Instant::now() + REAP_WAIT;
    let mut ended = 0;
    loop {
        let left: Vec<u32> = gpumemhook_reader::children_of(me)
            .into_iter()
            .filter(|&pid| environment_has(pid, &mark))
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return ended;
        }
        ended += left.len();
        for &pid in &left {
            // SAFETY: kill(2) of a child of this process, which it has not reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        for &pid in &left {
            // SAFETY: waits for a child of this process; no status is read.
            unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
        }
    }
}

/// Whether process `pid`'s environment holds the entry `entry` (`NAME=value`).
fn environment_has(pid: u32, entry: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == entry.as_bytes()))
}

/// Removes the segment files of this user's processes that are gone (the trials' processes that
/// were killed had no exit to remove theirs), as a listing does.
pub(super) fn remove_stale_segments() {
    let _ = gpumemhook_reader::list_segments(gpumemhook_reader::Owners::Me);
}

fn signal_group(group: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) of a process group this process started (a negative pid names the group).
    unsafe { libc::kill(-group, signal) };
}

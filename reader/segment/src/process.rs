//! Facts about processes from `/proc`: identity (pid plus start time, and the pid namespace the pid
//! means something in), liveness, the real uid of a process, and the actor tokens the scope
//! protocol names its actors by.
//!
//! A pid is a number in one pid namespace: a process in a container (a pod without `hostPID`) has
//! one pid there and another on the node, and `/proc` shows each reader the pids of its own
//! namespace and those below it. So a process is named by its pid *in its own namespace* together
//! with that namespace ([`pid_namespace_of`]: the inode of `/proc/<pid>/ns/pid`, the same number
//! from any namespace), and a reader of another namespace finds it, where it can see it at all,
//! through `NSpid` ([`namespace_pids`]).

/// Field 22 of `/proc/<pid>/stat`: the process start time in clock ticks since boot. With the pid it
/// identifies one process: a later process that reuses the pid has a different start time.
pub fn start_ticks(pid: u32) -> Option<u64> {
    // One open and one read into the stack (the line is a few hundred bytes): listing a thousand
    // processes calls this a thousand times, and `read_to_string` would add a size query, more
    // reads and an allocation to each.
    use std::io::Read;
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut buffer = [0u8; 2048];
    let mut len = 0;
    while len < buffer.len() {
        match file.read(&mut buffer[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let stat = std::str::from_utf8(&buffer[..len]).ok()?;
    // The command (field 2) is in parentheses and may itself contain spaces or parentheses.
    let after_command = &stat[stat.rfind(')')? + 1..];
    // `after_command` starts at field 3 (state); field 22 is the 20th from there.
    after_command.split_whitespace().nth(19)?.parse().ok()
}

/// True when `pid` runs now and is the process that started at `ticks` (when known).
pub fn is_same_process_alive(pid: u32, ticks: Option<u64>) -> bool {
    match (start_ticks(pid), ticks) {
        (Some(now), Some(expected)) => now == expected,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// True when a process with this pid exists (any start time).
pub fn is_alive(pid: u32) -> bool {
    pid != 0 && start_ticks(pid).is_some()
}

/// The pid namespace the process `pid` (a pid of the caller's namespace) lives in: the inode of
/// `/proc/<pid>/ns/pid`; `None` when `/proc` does not say.
pub fn pid_namespace_of(pid: u32) -> Option<u64> {
    namespace_inode(&format!("/proc/{pid}/ns/pid"))
}

/// The pid namespace this process lives in. Asked once per process: a reader asks for every
/// segment it judges, and a `stat` of `/proc/self/ns/pid` costs a few microseconds. The answer is
/// kept with the pid it was found for, since a process's namespace never changes but a forked
/// child's may (its parent having called `unshare(CLONE_NEWPID)`); only a pid 1 that did that and
/// then forked would hand its child (pid 1 again) its own answer, which no reader does.
pub fn own_pid_namespace() -> Option<u64> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    // `pid << 32 | namespace` in one word (a namespace's inode number is 32 bits in the kernel), so
    // that no thread can read one process's namespace beside another's pid.
    static KEPT: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let kept = KEPT.load(Relaxed);
    if kept >> 32 == u64::from(pid) && kept as u32 != 0 {
        return Some(u64::from(kept as u32));
    }
    let namespace = namespace_inode("/proc/self/ns/pid")?;
    if let Ok(small) = u32::try_from(namespace) {
        KEPT.store(u64::from(pid) << 32 | u64::from(small), Relaxed);
    }
    Some(namespace)
}

/// The inode of the namespace file `path` (a link `stat` follows to the namespace itself).
fn namespace_inode(path: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The inode of the initial pid namespace, which the kernel fixes (`PROC_PID_INIT_INO`): a node's
/// processes outside any container live there.
pub const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// The pids of `pid` (a pid of the caller's namespace) in every pid namespace from the caller's
/// down to its own, outermost first (`NSpid` in `/proc/<pid>/status`): the last is the pid the
/// process sees itself by.
pub fn namespace_pids(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().map(|p| p.parse().ok()).collect()
}

/// Every process this process can see that lives in one of `namespaces` (pid namespaces other than
/// the caller's), keyed by its namespace and the pid it sees itself by, with its pid here: one
/// pass over `/proc`, asked only about the namespaces a reader met.
pub fn visible_in(namespaces: &[u64]) -> std::collections::HashMap<(u64, u32), u32> {
    let mut found = std::collections::HashMap::new();
    if namespaces.is_empty() {
        return found;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Some(namespace) = pid_namespace_of(pid).filter(|n| namespaces.contains(n)) else {
            continue;
        };
        if let Some(&inner) = namespace_pids(pid).as_deref().and_then(<[u32]>::last) {
            found.insert((namespace, inner), pid);
        }
    }
    found
}

/// The uid of the Kubernetes pod the process `pid` runs in, from its cgroup path, where the kubelet
/// puts every container of a pod: `.../kubepods/<class>/pod<uid>/...` (the cgroupfs driver) or
/// `.../kubepods-<class>-pod<uid, '_' for '-'>.slice/...` (the systemd driver). `None` outside a
/// pod, and where the reader's cgroup namespace hides the path (a reader inside the pod).
pub fn pod_uid_of(pid: u32) -> Option<String> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroups
        .lines()
        .find_map(|line| pod_uid_in(line.splitn(3, ':').nth(2)?))
}

/// The pod uid in one cgroup path (see [`pod_uid_of`]).
fn pod_uid_in(path: &str) -> Option<String> {
    if !path.contains("kubepods") {
        return None;
    }
    path.split('/').find_map(|part| {
        let part = part.strip_suffix(".slice").unwrap_or(part);
        let uid = &part[part.rfind("pod")? + 3..];
        let is_uid = uid.len() >= 32
            && uid
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_');
        is_uid.then(|| uid.replace('_', "-"))
    })
}

/// The real user id of the process `pid` (first field of `Uid:` in `/proc/<pid>/status`).
pub fn real_uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Bits of an actor token holding the low bits of the thread's start ticks.
const TOKEN_TICK_BITS: u32 = 29;
const TOKEN_TICK_MASK: u64 = (1 << TOKEN_TICK_BITS) - 1;

/// The token of an actor in the scope protocol: `thread id << 29 | low 29 bits of the thread's start
/// ticks` (61 bits, never zero). Anyone can tell from `/proc` whether the thread still runs
/// ([`token_alive`]); a later thread that reuses the id has other start ticks. Computed once per
/// thread (and again after a fork, where the thread id changes).
pub fn actor_token() -> u64 {
    thread_local! {
        static CACHED: std::cell::Cell<(u32, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    // The system call, not glibc's gettid(), which only glibc 2.30+ has: the hook links this
    // crate and must load on glibc 2.17.
    // SAFETY: SYS_gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    CACHED.with(|cached| {
        let (for_tid, token) = cached.get();
        if for_tid == tid && token != 0 {
            return token;
        }
        let ticks = start_ticks(tid).unwrap_or(0);
        let token = (u64::from(tid) << TOKEN_TICK_BITS) | (ticks & TOKEN_TICK_MASK);
        cached.set((tid, token));
        token
    })
}

/// True while the thread named by an [`actor_token`] runs. Without a readable `/proc` nothing can
/// be told, and every actor counts as alive (so nothing is taken from a live one).
pub fn token_alive(token: u64) -> bool {
    let tid = token >> TOKEN_TICK_BITS;
    let Ok(tid) = u32::try_from(tid) else {
        return false;
    };
    match start_ticks(tid) {
        Some(ticks) => tid != 0 && ticks & TOKEN_TICK_MASK == token & TOKEN_TICK_MASK,
        None => tid != 0 && start_ticks(std::process::id()).is_none(),
    }
}

/// The command line of `pid`, arguments joined by spaces.
pub fn command_line(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    Some(words.join(" "))
}

/// The processes whose parent is `parent`, from `/proc` (none where it cannot be read).
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // After the command's closing parenthesis: the state, then the parent's pid.
                    let rest = stat.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// Every descendant of `ancestor` (children first, then theirs), at most `max` of them.
pub fn descendants_of(ancestor: u32, max: usize) -> Vec<u32> {
    let mut found = children_of(ancestor);
    let mut next = 0;
    while next < found.len() && found.len() < max {
        let more = children_of(found[next]);
        found.extend(more);
        next += 1;
    }
    found.truncate(max);
    found
}

/// This process's effective uid: whose files it may write.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// The real user id of this process.
pub fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Wall-clock time in nanoseconds since the Unix epoch.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_identified() {
        let pid = std::process::id();
        let ticks = start_ticks(pid);
        assert!(ticks.is_some());
        assert!(is_same_process_alive(pid, ticks));
        assert!(!is_same_process_alive(pid, ticks.map(|t| t + 1)));
        assert!(command_line(pid).is_some_and(|c| !c.is_empty()));
        assert_eq!(real_uid_of(pid), Some(current_uid()));
    }

    #[test]
    fn this_processs_namespace_is_the_one_proc_names_and_is_kept() {
        let here = pid_namespace_of(std::process::id());
        assert!(here.is_some());
        assert_eq!(own_pid_namespace(), here);
        assert_eq!(own_pid_namespace(), here, "kept");
        let mine = namespace_pids(std::process::id()).unwrap();
        assert_eq!(mine.first(), Some(&std::process::id()));
    }

    #[test]
    fn pod_uids_are_read_from_both_drivers_cgroup_paths_only() {
        let uid = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc";
        let systemd = uid.replace('-', "_");
        for path in [
            format!("/kubepods/burstable/pod{uid}/0123abcd"),
            format!("/kubepods/pod{uid}/0123abcd"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd}.slice/cri-containerd-0a.scope"),
        ] {
            assert_eq!(pod_uid_in(&path).as_deref(), Some(uid), "{path}");
        }
        for path in [
            "/",
            "/user.slice/pod0f1e2d3c",
            &format!("/docker/pod{uid}"),
            "/kubepods/besteffort",
        ] {
            assert_eq!(pod_uid_in(path), None, "{path}");
        }
    }

    #[test]
    fn actor_tokens_are_alive_while_their_thread_runs() {
        let mine = actor_token();
        assert_ne!(mine, 0);
        assert_eq!(actor_token(), mine);
        assert!(token_alive(mine));
        let other = std::thread::spawn(actor_token).join().unwrap();
        assert_ne!(other, mine);
        // `join` returns when the thread's id is cleared, a moment before the kernel removes its
        // task from /proc (a busy machine made it seen alive once): dead within a second.
        let dead = (0..1000).any(|_| {
            let dead = !token_alive(other);
            if !dead {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            dead
        });
        assert!(dead, "the thread has exited");
        assert!(!token_alive(0));
        assert!(!token_alive(u64::MAX));
        assert!(!token_alive(mine ^ 1), "same thread id, other start ticks");
    }
}

//! Facts about processes from `/proc`: identity (pid plus start time) and liveness.

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
    }
}

//! The terminal, for every command: how a command ends when the reader of its output goes away
//! (by SIGPIPE, as `ls` does, never a panic). Used by the crate root and by the commands that keep
//! SIGPIPE ignored (`run`, `fit`, `exporter`); it uses no other module.

/// A command whose output's reader went away (`gpumemhook ls | head -1`) ends as `ls` does: by
/// SIGPIPE, quietly, with the status shells and tools know (141), instead of a panic ("failed
/// printing to stdout") and a core. Rust's runtime ignores SIGPIPE, so that a write to a closed pipe
/// is an error; `print!` panics on it. Not for the commands that serve or watch over others
/// (`exporter` writes to sockets, `run` and `fit` outlive their children's output): they keep the
/// error.
pub fn end_quietly_when_the_reader_goes() {
    // SAFETY: sets this process's disposition of one signal to the default; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Prints `text` on standard output, for a command that keeps SIGPIPE ignored: a reader that went
/// away ends it as it ends every other command, by SIGPIPE (status 141 in a shell), never a panic;
/// another error (a full disk) is returned.
pub fn print_or_end(text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            end_quietly_when_the_reader_goes();
            // SAFETY: raises a signal at this process; its disposition is the default (above).
            unsafe { libc::raise(libc::SIGPIPE) };
            Err(e)
        }
        other => other,
    }
}

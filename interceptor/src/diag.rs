//! Diagnostics: one line to stderr, written so that it can never hurt the program.
//!
//! Rust's `eprintln!` panics when stderr cannot be written (a closed pipe with SIGPIPE ignored, as
//! in every Python program run as `python train.py 2>&1 | head`), and with `panic = "abort"` that
//! would kill a job that had finished its work. Here a message is one raw `write(2)` whose errors
//! are ignored, made with SIGPIPE blocked on the calling thread, so that a program which kept
//! SIGPIPE's default action is not killed by a message it never asked for.

/// Writes `gpumemhook: <message>` and a newline to stderr, ignoring every error.
pub fn warn(message: &str) {
    let mut line = Vec::with_capacity(message.len() + 13);
    line.extend_from_slice(b"gpumemhook: ");
    line.extend_from_slice(message.as_bytes());
    line.push(b'\n');
    write_stderr(&line);
}

fn write_stderr(bytes: &[u8]) {
    gpumemhook_reader::without_sigpipe(|| {
        let mut rest = bytes;
        while !rest.is_empty() {
            // SAFETY: writes from a live slice to fd 2; the result is only inspected.
            let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
            if n > 0 {
                rest = &rest[(n as usize).min(rest.len())..];
            } else if n < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
                continue;
            } else {
                break;
            }
        }
    })
}

//! What the CLI keeps of a child's output: [`Tail`], a ring of its last lines holding at most
//! [`MAX_BYTES`] in all, a line longer than [`MAX_LINE`] cut in its middle with a mark saying how
//! much was left out (`... [cut 1.40 GiB] ...`). A child may write without end and without a newline
//! (a progress bar); what is kept of it stays bounded, and so does the reading ([`Reader`]: a
//! thread that reads a pipe to its end, which the caller stops waiting for after a bound).
//!
//! Every place the CLI reads a child's output goes through here: `fit`'s trials (the last lines of
//! a failed trial's stderr) and the Python package's probe for the hook library.

use gpumemhook_reader::format_size;
use std::collections::VecDeque;
use std::io::Read;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The most bytes kept of a child's output, all lines together.
pub const MAX_BYTES: usize = 64 * 1024;

/// The most bytes kept of one line: its first and its last half, the middle replaced by the mark.
pub const MAX_LINE: usize = 4 * 1024;

/// The last lines of a stream, bounded in count and in bytes.
#[derive(Debug, Default)]
pub struct Tail {
    /// At most this many complete lines are kept (the newest).
    lines_kept: usize,
    lines: VecDeque<String>,
    /// The bytes of `lines`.
    bytes: usize,
    /// The line being read: its head (at most half of [`MAX_LINE`]) ...
    head: Vec<u8>,
    /// ... its last bytes past the head (at most half of [`MAX_LINE`]) ...
    end: VecDeque<u8>,
    /// ... and how many bytes between them were left out.
    cut: u64,
}

impl Tail {
    /// An empty tail keeping the last `lines` lines.
    pub fn new(lines: usize) -> Tail {
        Tail {
            lines_kept: lines.max(1),
            ..Tail::default()
        }
    }

    /// Takes in the next bytes of the stream.
    pub fn push(&mut self, mut bytes: &[u8]) {
        const HALF: usize = MAX_LINE / 2;
        while !bytes.is_empty() {
            let (part, newline) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => (&bytes[..i], true),
                None => (bytes, false),
            };
            let to_head = part.len().min(HALF - self.head.len());
            self.head.extend_from_slice(&part[..to_head]);
            let rest = &part[to_head..];
            // Past the head, only the last HALF bytes are kept: what falls out is counted.
            let from_rest = rest.len().min(HALF);
            let overflow = (self.end.len() + from_rest).saturating_sub(HALF);
            self.cut += (rest.len() - from_rest + overflow) as u64;
            self.end.drain(..overflow);
            self.end.extend(&rest[rest.len() - from_rest..]);
            bytes = &bytes[part.len()..];
            if newline {
                self.end_line();
                bytes = &bytes[1..];
            }
        }
    }

    /// Closes the line being read (the stream's end: a last line without its newline).
    fn end_line(&mut self) {
        let mut line = String::from_utf8_lossy(&self.head).into_owned();
        if self.cut > 0 {
            line.push_str(&format!("… [cut {}] …", format_size(self.cut)));
        }
        let (front, back) = self.end.as_slices();
        line.push_str(&String::from_utf8_lossy(&[front, back].concat()));
        self.head.clear();
        self.end.clear();
        self.cut = 0;
        self.bytes += line.len();
        self.lines.push_back(line);
        while self.lines.len() > self.lines_kept || (self.bytes > MAX_BYTES && self.lines.len() > 1)
        {
            if let Some(old) = self.lines.pop_front() {
                self.bytes -= old.len();
            }
        }
    }

    /// The lines kept, the one being read included, oldest first.
    pub fn lines(mut self) -> Vec<String> {
        if !self.head.is_empty() || !self.end.is_empty() || self.cut > 0 {
            self.end_line();
        }
        self.lines.into()
    }
}

/// A thread reading one of a child's pipes into a [`Tail`] until the pipe's end.
pub struct Reader {
    shared: Arc<(Mutex<(Tail, bool)>, Condvar)>,
}

impl Reader {
    /// Starts reading `from` (a child's stdout or stderr), keeping its last `lines` lines.
    pub fn start(mut from: impl Read + Send + 'static, lines: usize) -> Reader {
        let shared = Arc::new((Mutex::new((Tail::new(lines), false)), Condvar::new()));
        let theirs = Arc::clone(&shared);
        std::thread::spawn(move || {
            let (state, ended) = &*theirs;
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
                state.0.push(&buffer[..n]);
            }
            state.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
            ended.notify_all();
        });
        Reader { shared }
    }

    /// What was read, once the pipe has ended or `wait` has passed: a process outside the child's
    /// (a daemon it started) may hold the pipe open for ever, and is not waited for.
    pub fn finish(self, wait: Duration) -> Vec<String> {
        let (state, ended) = &*self.shared;
        let deadline = Instant::now() + wait;
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        while !state.1 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = ended
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        std::mem::take(&mut state.0).lines()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_lines_are_kept_whole_and_split_reads_make_no_difference() {
        let text = b"one\ntwo\nthree\nfour";
        let mut whole = Tail::new(2);
        whole.push(text);
        let mut split = Tail::new(2);
        for b in text {
            split.push(&[*b]);
        }
        assert_eq!(whole.lines(), ["three", "four"]);
        assert_eq!(split.lines(), ["three", "four"]);
    }

    #[test]
    fn an_endless_line_is_cut_with_a_mark_and_the_whole_stays_bounded() {
        let mut tail = Tail::new(15);
        let chunk = vec![b'x'; 1 << 20];
        tail.push(b"start");
        for _ in 0..64 {
            tail.push(&chunk);
        }
        tail.push(b"the end\nlast\n");
        let lines = tail.lines();
        assert_eq!(lines.len(), 2);
        let cut = &lines[0];
        assert!(cut.starts_with("startxxx"), "{cut:.40}");
        assert!(cut.ends_with("xxxthe end"), "{cut:.40}");
        let left_out = (64u64 << 20) + 12 - MAX_LINE as u64;
        assert!(
            cut.contains(&format!("… [cut {}] …", format_size(left_out))),
            "{}",
            &cut[MAX_LINE / 2 - 5..MAX_LINE / 2 + 40]
        );
        assert!(cut.len() < MAX_LINE + 64);
        assert_eq!(lines[1], "last");

        let mut many = Tail::new(1000);
        for _ in 0..100 {
            many.push(&chunk[..MAX_LINE]);
            many.push(b"\n");
        }
        let lines = many.lines();
        assert!(lines.iter().map(String::len).sum::<usize>() <= MAX_BYTES);
        assert!(lines.len() < 100, "the oldest went to stay under the bound");
    }
}

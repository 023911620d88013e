//! Opening a file that `report`, `plot`, `view` or `export` is handed, whatever it is: its format
//! is recognised from its first bytes (the recording's magic, or the `{` or `[` JSON starts with)
//! before anything is read further, so that `/dev/zero`, random bytes or a huge file of zeros is
//! refused at once; a pipe, a FIFO or a device is read with a bound on the wait (a FIFO nobody
//! writes to, a writer that stalls), never blocking for ever.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{Cursor, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use gpumemhook_reader::RECORDING_MAGIC;

/// How long a pipe, a FIFO or a device may give nothing before it is given up: a FIFO with no
/// writer, or a writer that stopped.
pub const PIPE_WAIT: Duration = Duration::from_secs(10);
/// How many first bytes are looked at to tell the format: JSON may start with white space.
const SNIFF_BYTES: usize = 4096;

/// What a file's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The flight recorder's binary timeline (`GMHTRACE`).
    Recording,
    /// JSON: a timeline of earlier versions or of `export --chrome`, an exit report, `ls --json`.
    Json,
}

/// A file opened and recognised, ready to be read from its start.
pub struct Input {
    pub format: Format,
    /// A regular file (read in place, by offset, and again if need be), not a pipe or a device.
    pub regular: bool,
    /// The bytes read to recognise it (a pipe's, which cannot be read again).
    sniffed: Vec<u8>,
    file: Waited,
}

impl Input {
    /// Opens `path` without waiting (a FIFO with no writer opens at once) and recognises its
    /// format, waiting at most [`PIPE_WAIT`] for its first bytes; an error in one line otherwise.
    pub fn open(path: &Path) -> Result<Input> {
        let label = path.display();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .with_context(|| format!("cannot read {label}"))?;
        let regular = file.metadata().is_ok_and(|m| m.is_file());
        let mut file = Waited(file);
        let mut sniffed = vec![0u8; SNIFF_BYTES];
        let got = if regular {
            read_until_told(|buf, at| file.0.read_at(buf, at as u64), &mut sniffed)
        } else {
            read_until_told(|buf, _| file.read(buf), &mut sniffed)
        }
        .with_context(|| format!("cannot read {label}"))?;
        sniffed.truncate(got);
        let format = recognise(&sniffed).with_context(|| format!("{label}"))?;
        if format == Format::Recording && !regular {
            bail!(
                "{label}: a binary timeline is read in place: give its file, not a pipe or a device"
            );
        }
        if regular {
            sniffed.clear();
        }
        Ok(Input {
            format,
            regular,
            sniffed,
            file,
        })
    }

    /// The file from its first byte (a pipe's first bytes, already taken, given back first).
    pub fn into_reader(self) -> impl Read {
        Cursor::new(self.sniffed).chain(self.file)
    }
}

/// Reads into `buf` from `read` (given the buffer and the offset reached) until its bytes tell the
/// format (a pipe's writer may send a few and wait), `buf` is full or the file ends; the number
/// of bytes read.
fn read_until_told(
    mut read: impl FnMut(&mut [u8], usize) -> std::io::Result<usize>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() && !told(&buf[..got]) {
        match read(&mut buf[got..], got) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Whether `first` bytes are enough to tell the format: a byte other than white space, past what
/// could still be the magic's start.
fn told(first: &[u8]) -> bool {
    !RECORDING_MAGIC.starts_with(first) && first.iter().any(|b| !b.is_ascii_whitespace())
}

/// The format that `first` bytes start, or why they are none this version reads.
fn recognise(first: &[u8]) -> Result<Format> {
    if first.starts_with(&RECORDING_MAGIC) {
        return Ok(Format::Recording);
    }
    let text = first.strip_prefix(b"\xef\xbb\xbf").unwrap_or(first);
    match text.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{' | b'[') => Ok(Format::Json),
        None if first.is_empty() => bail!("empty: not a gpumemhook timeline or report"),
        None => bail!(
            "only white space in its first {} bytes: not a gpumemhook timeline or report",
            first.len()
        ),
        Some(_) => {
            let shown: Vec<String> = first.iter().take(8).map(|b| format!("{b:02x}")).collect();
            bail!(
                "not a gpumemhook timeline or report: it starts with bytes {} (a timeline starts \
                 with GMHTRACE, a report or an older timeline is JSON)",
                shown.join(" ")
            )
        }
    }
}

/// A file read in non-blocking mode, each read waiting at most [`PIPE_WAIT`] for bytes to come.
struct Waited(File);

impl Read for Waited {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            wait_readable(&self.0)?;
            match self.0.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

/// Waits until `file` has bytes (or its writer has gone), at most [`PIPE_WAIT`].
fn wait_readable(file: &File) -> std::io::Result<()> {
    let mut poll = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one pollfd, alive for the call, for a descriptor this File owns.
        let ready = unsafe { libc::poll(&mut poll, 1, PIPE_WAIT.as_millis() as libc::c_int) };
        match ready {
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "nothing came in {} s (a pipe or FIFO that no one writes to?)",
                        PIPE_WAIT.as_secs()
                    ),
                ))
            }
            n if n > 0 => return Ok(()),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_first_bytes() {
        assert_eq!(recognise(b"GMHTRACE\x02\0").unwrap(), Format::Recording);
        assert_eq!(recognise(b" \n\t{\"pid\": 1}").unwrap(), Format::Json);
        assert_eq!(recognise(b"\xef\xbb\xbf[]").unwrap(), Format::Json);
        let zeros = recognise(&[0u8; 4096]).unwrap_err().to_string();
        assert!(zeros.contains("starts with bytes 00 00"), "{zeros}");
        assert!(recognise(b"").unwrap_err().to_string().contains("empty"));
        assert!(recognise(b"    ")
            .unwrap_err()
            .to_string()
            .contains("white space"));
    }
}

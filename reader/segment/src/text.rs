//! Text in the segment: NUL-padded bytes in atomic byte cells (the command line, scope names, job
//! labels, module paths, the writer's version), written truncated to fit and read back lossily, so
//! that no bytes in a hostile segment can make a reader fail.

use std::sync::atomic::{AtomicU8, Ordering};

/// Writes `text` NUL-padded into `cells`, cut at a character boundary to fit with a final NUL.
pub fn write_text(cells: &[AtomicU8], text: &str) {
    write_bytes(
        cells,
        cut_text(text, cells.len().saturating_sub(1)).as_bytes(),
    );
}

/// `text` cut at a character boundary to at most `max_bytes`: what [`write_text`] keeps of it in
/// `max_bytes + 1` cells (a figure read from elsewhere, a timeline's longer command line, is cut
/// by the same rule where it stands for the segment's).
pub fn cut_text(text: &str, max_bytes: usize) -> &str {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Writes `bytes` NUL-padded into `cells`, cut to fit with a final NUL (a path need not be UTF-8).
pub fn write_bytes(cells: &[AtomicU8], bytes: &[u8]) {
    let keep = bytes.len().min(cells.len().saturating_sub(1));
    for (i, cell) in cells.iter().enumerate() {
        let byte = if i < keep { bytes[i] } else { 0 };
        cell.store(byte, Ordering::Relaxed);
    }
}

/// Reads NUL-padded text written by [`write_text`].
pub fn read_text(cells: &[AtomicU8]) -> String {
    let bytes: Vec<u8> = cells
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_a_character_boundary_and_read_back() {
        let cells: [AtomicU8; 6] = Default::default();
        write_text(&cells, "ééé");
        assert_eq!(read_text(&cells), "éé");
        assert_eq!(cut_text("ééé", 5), "éé");
        assert_eq!(cut_text("ab", 5), "ab");
        write_bytes(&cells, b"ab\xff");
        assert_eq!(read_text(&cells), "ab\u{fffd}");
    }
}

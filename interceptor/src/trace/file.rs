//! The recorder's file at its lowest: mapping a range of it, storing a record so that readers in
//! other processes see it whole, and guarding a mapping against a file cut under it. Used by the
//! recorder ([`super`]) and by its ring ([`super::ring`]).

use std::sync::atomic::{AtomicU64, Ordering};

use gpumemhook_reader::GuardSlot;

/// Stores record `index` of `slots`: its words 1 to 3, then its first word, with release, so a
/// reader that sees the first word sees the rest.
pub fn store(slots: *mut u64, index: u64, words: [u64; 4]) {
    // SAFETY: `slots` is the first of the records `append` handed this thread, `index` one of
    // them; the words are 8-aligned (the mapping is page-aligned, records 32 bytes). Stored
    // atomically because readers in other processes may read them at any time.
    unsafe {
        let at = slots.add(index as usize * 4);
        for (i, &word) in words.iter().enumerate().skip(1) {
            AtomicU64::from_ptr(at.add(i)).store(word.to_le(), Ordering::Relaxed);
        }
        AtomicU64::from_ptr(at).store(words[0].to_le(), Ordering::Release);
    }
}

/// Maps `len` bytes of our file at `offset` (already reserved), shared: what is stored there is
/// the file's.
pub fn map_shared(fd: i32, offset: libc::off_t, len: u64) -> std::io::Result<*mut libc::c_void> {
    // SAFETY: a new shared mapping of a range of our own file; the answer is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p)
}

/// Registers `len` bytes mapped at `at` with the SIGBUS guard for good: its slot's raw value.
pub fn guarded(at: *mut libc::c_void, len: u64) -> std::io::Result<usize> {
    GuardSlot::new(at as usize, len as usize)
        .map(GuardSlot::raw)
        .ok_or_else(|| std::io::Error::other("every slot of the SIGBUS guard is taken"))
}

//! What the `loom` models share: the reader's fold of a value into a maximum
//! (`gpumemhook_reader::counters::fold_max`), restated over loom's atomics.

use loom::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// Raises `cell` to `value` unless it already holds as much.
pub fn fold_max(cell: &AtomicU64, value: u64) {
    let mut current = cell.load(SeqCst);
    while current < value {
        match cell.compare_exchange(current, value, SeqCst, SeqCst) {
            Ok(_) => return,
            Err(seen) => current = seen,
        }
    }
}

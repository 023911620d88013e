//! The thread-local runtime frame: how a runtime shadow (`cudaMalloc`, ...) learns that the driver
//! wrapper beneath it, on the same thread, already counted the allocation.
//!
//! Counting happens in the driver wrappers, where the device is known. A runtime shadow opens a
//! frame, calls the real runtime, and counts the allocation itself only if no driver wrapper marked
//! the frame: then the runtime reached the driver by a path the hook does not see, and the
//! allocation is still counted exactly once.

use std::cell::Cell;

thread_local! {
    /// Bits 1.. hold the depth of runtime frames on this thread; bit 0 says a driver wrapper
    /// accounted a call inside the innermost frame. `const` and without a destructor, so reaching
    /// it never allocates.
    static FRAME: Cell<u32> = const { Cell::new(0) };
}

const ACCOUNTED: u32 = 1;
const DEPTH_ONE: u32 = 2;
/// Set inside a runtime free whose shadow already took the ledger entry: the driver wrapper
/// beneath must not look it up again (it would only miss).
const TAKEN: u32 = 1 << 31;

/// RAII: a runtime shadow's frame, open until dropped.
pub struct RuntimeFrame {
    saved: u32,
}

impl RuntimeFrame {
    #[inline]
    pub fn enter() -> RuntimeFrame {
        Self::enter_with(0)
    }

    /// A frame for a runtime free whose ledger entry the shadow already took.
    #[inline]
    pub fn enter_taken() -> RuntimeFrame {
        Self::enter_with(TAKEN)
    }

    /// One frame deeper, not yet accounted, with `flags` set.
    #[inline]
    fn enter_with(flags: u32) -> RuntimeFrame {
        let saved = FRAME.with(Cell::get);
        FRAME.with(|f| f.set((saved & !ACCOUNTED).wrapping_add(DEPTH_ONE) | flags));
        RuntimeFrame { saved }
    }

    /// True when a driver wrapper accounted a call inside this frame.
    #[inline]
    pub fn accounted(&self) -> bool {
        FRAME.with(Cell::get) & ACCOUNTED != 0
    }
}

impl Drop for RuntimeFrame {
    #[inline]
    fn drop(&mut self) {
        // An inner frame's accounting is also the outer frame's: the outer must not count again.
        // Outside every frame nothing is remembered.
        let inner = if self.saved >= DEPTH_ONE {
            FRAME.with(Cell::get) & ACCOUNTED
        } else {
            0
        };
        FRAME.with(|f| f.set(self.saved | inner));
    }
}

/// Called by driver wrappers: marks the innermost runtime frame, if any, as accounted. Returns
/// true inside a runtime free that already took its ledger entry.
#[inline]
pub fn mark_accounted() -> bool {
    FRAME.with(|f| {
        let v = f.get();
        if v >= DEPTH_ONE {
            f.set(v | ACCOUNTED);
        }
        v & TAKEN != 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_nest_and_propagate() {
        mark_accounted();
        assert_eq!(
            FRAME.with(Cell::get),
            0,
            "outside a frame nothing is marked"
        );
        let outer = RuntimeFrame::enter();
        assert!(!outer.accounted());
        {
            let inner = RuntimeFrame::enter();
            mark_accounted();
            assert!(inner.accounted());
        }
        assert!(outer.accounted());
        drop(outer);
        assert_eq!(FRAME.with(Cell::get), 0);
    }
}

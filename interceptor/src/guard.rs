//! The thread-local runtime frame: how a runtime shadow (`cudaMalloc`, ...) learns that the driver
//! wrapper beneath it, on the same thread, already counted the allocation.
//!
//! Counting happens in the driver wrappers, where the device is known. A runtime shadow opens a
//! frame, calls the real runtime, and counts the allocation itself only if no driver wrapper marked
//! the frame: then the runtime reached the driver by a path the hook does not see, and the
//! allocation is still counted exactly once.
//!
//! The frame also carries the module its caller belongs to (`crate::modules`): the driver wrapper
//! beneath charges the allocation to the program or library that called the runtime, never to the
//! runtime itself.

use crate::local::LOCAL;

// The frame word, `crate::local::Local::frame`: bits 1..=22 hold the depth of runtime frames on
// this thread; bit 0 says a driver wrapper accounted a call inside the innermost frame; bits 23..=30
// hold the innermost frame's module; bit 31 is [`TAKEN`].

/// The frame word of this thread.
#[inline(always)]
fn frame() -> u32 {
    LOCAL.with(|l| l.frame.get())
}

#[inline(always)]
fn set_frame(word: u32) {
    LOCAL.with(|l| l.frame.set(word));
}

const ACCOUNTED: u32 = 1;
const DEPTH_ONE: u32 = 2;
const DEPTH_MASK: u32 = ((1 << 22) - 1) << 1;
const MODULE_SHIFT: u32 = 23;
const MODULE_MASK: u32 = 0xff << MODULE_SHIFT;
/// Set inside a runtime free whose shadow already took the ledger entry: the driver wrapper
/// beneath must not look it up again (it would only miss).
const TAKEN: u32 = 1 << 31;

/// What a driver wrapper learns from the innermost runtime frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// Inside a runtime free that already took its ledger entry.
    pub taken: bool,
    /// The module of the runtime's caller, `None` outside every runtime frame.
    pub module: Option<u8>,
}

/// RAII: a runtime shadow's frame, open until dropped.
pub struct RuntimeFrame {
    saved: u32,
}

impl RuntimeFrame {
    /// A runtime allocation's frame, for a caller in `module`.
    #[inline]
    pub fn enter(module: u8) -> RuntimeFrame {
        Self::enter_with(u32::from(module) << MODULE_SHIFT)
    }

    /// A frame for a runtime free whose ledger entry the shadow already took.
    #[inline]
    pub fn enter_taken() -> RuntimeFrame {
        Self::enter_with(TAKEN)
    }

    /// One frame deeper, not yet accounted, with `flags` (and the module) set.
    #[inline]
    fn enter_with(flags: u32) -> RuntimeFrame {
        let saved = frame();
        let depth = (saved & DEPTH_MASK).wrapping_add(DEPTH_ONE) & DEPTH_MASK;
        set_frame(depth | flags);
        RuntimeFrame { saved }
    }

    /// True when a driver wrapper accounted a call inside this frame.
    #[inline]
    pub fn accounted(&self) -> bool {
        frame() & ACCOUNTED != 0
    }
}

impl Drop for RuntimeFrame {
    #[inline]
    fn drop(&mut self) {
        // An inner frame's accounting is also the outer frame's: the outer must not count again.
        // Outside every frame nothing is remembered.
        let inner = if self.saved & DEPTH_MASK != 0 {
            frame() & ACCOUNTED
        } else {
            0
        };
        set_frame(self.saved | inner);
    }
}

/// Called by driver wrappers: marks the innermost runtime frame, if any, as accounted, and says
/// what that frame knows.
#[inline]
pub fn mark_accounted() -> Mark {
    LOCAL.with(|l| {
        let v = l.frame.get();
        let inside = v & DEPTH_MASK != 0;
        if inside {
            l.frame.set(v | ACCOUNTED);
        }
        Mark {
            taken: v & TAKEN != 0,
            module: inside.then_some(((v & MODULE_MASK) >> MODULE_SHIFT) as u8),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_nest_and_propagate() {
        assert_eq!(
            mark_accounted(),
            Mark {
                taken: false,
                module: None
            }
        );
        assert_eq!(frame(), 0, "outside a frame nothing is marked");
        let outer = RuntimeFrame::enter(7);
        assert!(!outer.accounted());
        {
            let inner = RuntimeFrame::enter(255);
            assert_eq!(mark_accounted().module, Some(255));
            assert!(inner.accounted());
            {
                let free = RuntimeFrame::enter_taken();
                let m = mark_accounted();
                assert!(m.taken && free.accounted());
            }
        }
        assert!(outer.accounted());
        assert_eq!(
            mark_accounted().module,
            Some(7),
            "the outer frame's module is back"
        );
        drop(outer);
        assert_eq!(frame(), 0);
    }
}

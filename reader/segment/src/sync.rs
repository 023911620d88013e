//! The atomics of the protocols this crate holds: those that several processes run on one shared
//! file (the group's tally, `crate::tally`; the scope protocol, `crate::window` and `crate::floor`),
//! and the one the hook's threads run on a table one of them owns (`crate::owned`). std's and
//! portable-atomic's 128-bit word in the product, loom's under `--cfg loom`, so that the loom models
//! (`reader/segment/tests/loom_*.rs`) run this crate's own code.
//!
//! Waiting is bounded everywhere in the shared-file protocols ([`Patience`]): by time in the product
//! (no process may wait long on another's half-done state), by a count of tries under loom (which
//! explores every interleaving of a few steps, not wall-clock time). A thread of one process waits
//! on another of its threads with [`back_off`].

#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// One wait of a spin loop, `spins` being how many came before it: the first 64 stay on the CPU,
/// later ones yield it. The hook's spin locks wait this way, and so does `crate::owned`'s reader of
/// another thread's table.
#[cfg(not(loom))]
#[inline]
pub fn back_off(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

/// Under loom every wait lets the other threads run: loom explores what a spin loop waits for, not
/// how long it spins.
#[cfg(loom)]
pub fn back_off(_spins: u32) {
    loom::thread::yield_now();
}

/// Between a `SeqCst` write and a `SeqCst` read of another word (the store-buffering shape of the
/// scope protocol, `crate::window`): nothing in the product, where `SeqCst` accesses already fall in
/// one total order, so one side sees the other's write. loom models `SeqCst` accesses as
/// acquire/release only (it would report the outcome they rule out), but models `SeqCst` fences:
/// under loom this is one, standing for the order the accesses already give.
#[inline(always)]
pub fn order_store_load() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// A 128-bit word changed only by whole-word compare-and-swap: lock-free (`cmpxchg16b` on x86-64,
/// `ldxp`/`stxp` or `casp` on AArch64), so it is atomic across processes that map it.
#[cfg(not(loom))]
#[repr(transparent)]
pub struct Word128(portable_atomic::AtomicU128);

#[cfg(not(loom))]
impl Word128 {
    pub fn new(value: u128) -> Word128 {
        Word128(portable_atomic::AtomicU128::new(value))
    }

    /// Whether this machine changes the word without a lock (a lock would be one process's own,
    /// no good for a word shared between processes).
    pub fn is_lock_free() -> bool {
        portable_atomic::AtomicU128::is_lock_free()
    }

    #[inline(always)]
    pub fn load(&self) -> u128 {
        self.0.load(Ordering::SeqCst)
    }

    #[inline(always)]
    pub fn compare_exchange(&self, current: u128, new: u128) -> Result<u128, u128> {
        self.0
            .compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst)
    }
}

/// loom has no 128-bit atomic: a modelled mutex around the value gives the same whole-word
/// atomicity for the model's purposes.
#[cfg(loom)]
pub struct Word128(loom::sync::Mutex<u128>);

#[cfg(loom)]
impl Word128 {
    pub fn new(value: u128) -> Word128 {
        Word128(loom::sync::Mutex::new(value))
    }

    pub fn is_lock_free() -> bool {
        true
    }

    pub fn load(&self) -> u128 {
        *self.0.lock().unwrap()
    }

    pub fn compare_exchange(&self, current: u128, new: u128) -> Result<u128, u128> {
        let mut value = self.0.lock().unwrap();
        if *value == current {
            *value = new;
            Ok(current)
        } else {
            Err(*value)
        }
    }
}

/// How long one side of a protocol may wait for another process.
#[cfg(not(loom))]
pub struct Patience {
    deadline: std::time::Instant,
}

#[cfg(not(loom))]
impl Patience {
    pub fn new(limit: std::time::Duration) -> Patience {
        Patience {
            deadline: std::time::Instant::now() + limit,
        }
    }

    /// Whether the time is up.
    pub fn over(&self) -> bool {
        std::time::Instant::now() >= self.deadline
    }

    /// Lets the process being waited for run.
    pub fn pause(&self) {
        std::thread::yield_now();
    }
}

#[cfg(loom)]
pub struct Patience {
    tries: std::cell::Cell<u32>,
}

#[cfg(loom)]
impl Patience {
    pub fn new(_limit: std::time::Duration) -> Patience {
        Patience {
            tries: std::cell::Cell::new(0),
        }
    }

    pub fn over(&self) -> bool {
        self.tries.get() >= 2
    }

    pub fn pause(&self) {
        self.tries.set(self.tries.get() + 1);
        loom::thread::yield_now();
    }
}

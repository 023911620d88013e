//! Waiting for a spin lock: the hook's locks (a ledger shard, the module registry) are held for a
//! few instructions, so a waiter spins briefly on the CPU, then lets the holder run. No lock of the
//! hook ever blocks in the kernel, and a forked child never waits for one a parent thread held
//! (each owner resets or abandons its locks in the child).

/// One wait of a spin loop, `spins` being how many came before it: the first 64 stay on the CPU,
/// later ones yield it.
#[inline]
pub fn back_off(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

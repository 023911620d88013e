//! Waiting for a spin lock: the hook's locks (a ledger shard, the module registry) are held for a
//! few instructions, so a waiter spins briefly on the CPU, then lets the holder run. No lock of the
//! hook ever blocks in the kernel, and a forked child never waits for one a parent thread held
//! (each owner resets or abandons its locks in the child).
//!
//! The wait itself is the segment crate's (`gpumemhook_segment::back_off`), where the
//! per-thread table's protocol (`gpumemhook_segment::owned`) waits the same way.

/// One wait of a spin loop, `spins` being how many came before it: the first 64 stay on the CPU,
/// later ones yield it.
pub use gpumemhook_segment::back_off;

//! The hook's thread-local state, in one block: the runtime frame word of `crate::guard` and the
//! ledger table of `crate::owned`.
//!
//! Why one block: in a shared library the address of a thread-local variable comes from a call to
//! `__tls_get_addr`, and a driver wrapper reaches both words; with one block (and the ledger's
//! operations inlined into the wrappers) the compiler asks once per wrapper instead of twice.
//! `const` and without a destructor, so reaching it never allocates, and it stays readable in
//! `pthread` key destructors.

use std::cell::Cell;

/// This thread's words.
pub struct Local {
    /// The runtime frame (`crate::guard`): depth, accounted, module, taken.
    pub frame: Cell<u32>,
    /// This thread's ledger table (`crate::owned`, which gives the pointer its type).
    pub table: Cell<*mut u8>,
}

thread_local! {
    pub static LOCAL: Local = const {
        Local {
            frame: Cell::new(0),
            table: Cell::new(std::ptr::null_mut()),
        }
    };
}

//! gpumemhook's segment: the shared memory every hooked process keeps its counts in, and the
//! protocols that every process mapping it runs (and the one the hook's threads run among themselves
//! on their ledger tables, [`owned`]). The hook writes through this crate on its hot path; the
//! reader (`gpumemhook-reader`), the CLI and the Python package read and change the same words
//! through it. Nothing here opens a file or knows a command: that is the reader's.
//!
//! Modules: [`layout`] (the process segment: types and constants only), [`counters`] (counting
//! allocations, frees, modules and sites on it), [`ceiling`] (the ceiling and the views of free and
//! total memory under it), [`scope`] (process scopes: the process segment's side of the scope
//! protocol, its floor word in [`floor`]), [`window`] (the one scope protocol of process and group
//! scopes: slot states, the window's restart, the allocation's fold), [`group`] (the group file's format and what its members run on it:
//! claiming a slot, the group's ceiling, its scopes' side, sweeping the dead), [`tally`] (a group's
//! crash-consistent count, member and sweeper sides), [`text`] (text in the segment's byte cells),
//! [`process`] (process and thread identity from `/proc`: who is alive, who holds a transient
//! state), and, for the hook's ledger, [`owned`] (the protocol of a table one thread owns and others
//! read and claim from: the hook's per-thread tables of live pointers), all over [`sync`] (the
//! protocols' atomics: std's, or loom's for the models).
//!
//! Under `--cfg loom` only [`sync`], [`tally`], [`window`], [`floor`] and [`owned`] are built: the
//! loom models (`tests/loom_tally.rs`, `tests/loom_scope.rs`, `tests/loom_owned.rs`) run that code,
//! and nothing else of the crate uses loom's atomics.

#[cfg(not(loom))]
pub mod ceiling;
#[cfg(not(loom))]
pub mod counters;
pub mod floor;
#[cfg(not(loom))]
pub mod group;
#[cfg(not(loom))]
pub mod layout;
pub mod owned;
#[cfg(not(loom))]
pub mod process;
#[cfg(not(loom))]
pub mod scope;
pub mod sync;
pub mod tally;
#[cfg(not(loom))]
pub mod text;
pub mod window;

#[cfg(not(loom))]
pub use layout::{MemKind, Segment, MAX_DEVICES, MAX_SCOPES};

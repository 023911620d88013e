//! gpumemhook's reader: the one definition of the shared-memory segment the hook writes, and the API
//! to read it, from the process itself or from another one.
//!
//! Start with [`Process`]: [`Process::current`] for this process, [`Process::attach`] for another,
//! [`list_processes`] for all of this user's; then [`Process::snapshot`], [`Process::used`],
//! [`Process::peak`], [`Process::open_scope`], [`Process::set_limit`].
//!
//! Modules: [`attach`] (that API), [`layout`] (the segment: types and constants only),
//! [`counters`] (counting allocations, frees, modules and sites on it), [`ceiling`] (the ceiling and
//! the views of free and total memory under it), [`scope`] (process scopes: the
//! process segment's side of the scope protocol, its floor word in [`floor`]), [`window`] (the one
//! scope protocol of process and group scopes: slot states, the window's restart, the allocation's
//! fold), [`labels`]
//! (job labels: rank, Slurm job, pod), [`output`] (every file the hook and the CLI write: `%p`
//! expansion, and the one rule for what a path may name), [`packages`] (the Python distribution
//! that installed a shared object), [`shm`] (segment files),
//! [`sigbus`] (the guard that turns a shrunk reader mapping into zeroes, not a crash),
//! [`snapshot`] (plain-data copies, also the exit report format), [`size`] (parsing and printing
//! sizes), [`group`] (a group of processes: one count, peak, ceiling and card), [`env`] (the `GPUMEMHOOK_*` variables and `LD_PRELOAD`), [`process`] (process identity
//! from `/proc`), [`error`] (typed errors), [`cards`] (the cards an emulation knows), [`trace`] (the
//! timeline file: its events, writer and reader), [`text`] (text in the segment's byte cells),
//! [`writable`] (the check, before any work, that a file to be written later can be), [`exports`]
//! (the hook's own in-process functions, by row), [`tally`] (a group's crash-consistent count,
//! member and sweeper sides) over [`sync`] (its atomics: std's, or loom's for the models).
//!
//! Under `--cfg loom` only [`sync`], [`tally`], [`window`] and [`floor`] are built: the loom models
//! (`tests/loom_tally.rs`, `tests/loom_scope.rs`) run that code, and nothing else of the crate uses
//! loom's atomics.

#[cfg(not(loom))]
pub mod attach;
#[cfg(not(loom))]
pub mod cards;
#[cfg(not(loom))]
pub mod ceiling;
#[cfg(not(loom))]
pub mod counters;
#[cfg(not(loom))]
pub mod env;
#[cfg(not(loom))]
pub mod error;
#[cfg(not(loom))]
pub mod exports;
pub mod floor;
#[cfg(not(loom))]
pub mod group;
#[cfg(not(loom))]
pub mod labels;
#[cfg(not(loom))]
pub mod layout;
#[cfg(not(loom))]
pub mod output;
#[cfg(not(loom))]
pub mod packages;
#[cfg(not(loom))]
pub mod process;
#[cfg(not(loom))]
pub mod scope;
#[cfg(not(loom))]
pub mod shm;
#[cfg(not(loom))]
pub mod sigbus;
#[cfg(not(loom))]
pub mod size;
#[cfg(not(loom))]
pub mod snapshot;
pub mod sync;
pub mod tally;
#[cfg(not(loom))]
pub mod text;
#[cfg(not(loom))]
pub mod trace;
pub mod window;
#[cfg(not(loom))]
pub mod writable;

#[cfg(not(loom))]
pub use attach::{
    check_device, list_processes, list_segments, list_segments_in, Listing, Owners, Process,
    ProcessEntry, Scope, ScopeReading, Skipped,
};
#[cfg(not(loom))]
pub use error::{Error, Refusal, Result};
#[cfg(not(loom))]
pub use labels::JobLabels;
#[cfg(not(loom))]
pub use layout::{MemKind, Segment, MAX_DEVICES, MAX_SCOPES};
#[cfg(not(loom))]
pub use size::{
    binary_unit, check_limit, format_size, is_unit, parse_amount, parse_count, parse_size,
    spaced_size, SizeError, MAX_SIZE,
};
#[cfg(not(loom))]
pub use snapshot::{
    DeviceStats, EmulatedStats, HostStats, LiveAllocation, ModuleStats, OomInfo, RecentEvent,
    ScopeStats, SiteStats, Snapshot,
};

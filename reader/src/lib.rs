//! gpumemhook's reader: the API to read the shared-memory segment the hook writes, from the process
//! itself or from another one, and what the CLI and the Python package share above it. The segment
//! itself (its layout and the protocols every process that maps it runs) is the segment crate's
//! (`reader/segment`, `gpumemhook-segment`), re-exported here: [`layout`], [`counters`],
//! [`ceiling`], [`scope`], [`floor`], [`window`], [`tally`], [`sync`], [`text`], [`process`].
//!
//! Start with [`Process`]: [`Process::current`] for this process, [`Process::attach`] for another,
//! [`list_processes`] for all of this user's; then [`Process::snapshot`], [`Process::used`],
//! [`Process::peak`], [`Process::open_scope`], [`Process::set_limit`].
//!
//! Modules: [`attach`] (that API), [`labels`] (job labels: rank, Slurm job, pod), [`output`] (every
//! file the hook and the CLI write: `%p` expansion, and the one rule for what a path may name),
//! [`packages`] (the Python distribution that installed a shared object), [`shm`] (segment files),
//! [`sigbus`] (the guard that turns a shrunk reader mapping into zeroes, not a crash),
//! [`snapshot`] (plain-data copies, also the exit report format), [`size`] (parsing and printing
//! sizes), [`group`] (a group of processes: one count, peak, ceiling and card; its file and
//! mapping), [`env`] (the `GPUMEMHOOK_*` variables and `LD_PRELOAD`), [`error`] (typed errors),
//! [`cards`] (the cards an emulation knows), [`trace`] (the timeline file: its events, writer and
//! reader), [`writable`] (the check, before any work, that a file to be written later can be),
//! [`exports`] (the hook's own in-process functions, by row).

// The loom models (`reader/segment/tests/loom_*.rs`) build with `--cfg loom`, where the segment
// crate keeps only its protocols. Nothing of this crate runs in a model, so under loom it is empty.
#![cfg(not(loom))]

// The segment and its protocols are the segment crate's; they are named here too, so that every
// consumer reaches the segment through this crate's one facade.
pub use gpumemhook_segment::{
    ceiling, counters, floor, layout, process, scope, sync, tally, text, window,
};

pub mod attach;
pub mod cards;
pub mod env;
pub mod error;
pub mod exports;
pub mod group;
pub mod labels;
pub mod output;
pub mod packages;
pub mod shm;
pub mod sigbus;
pub mod size;
pub mod snapshot;
pub mod trace;
pub mod writable;

pub use attach::{
    check_device, list_processes, list_segments, list_segments_in, Listing, Owners, Process,
    ProcessEntry, Scope, ScopeReading, Skipped,
};
pub use error::{Error, Refusal, Result};
pub use labels::JobLabels;
pub use layout::{MemKind, Segment, MAX_DEVICES, MAX_SCOPES};
pub use size::{
    binary_unit, check_limit, format_size, is_unit, parse_amount, parse_count, parse_size,
    spaced_size, SizeError, MAX_SIZE,
};
pub use snapshot::{
    DeviceStats, EmulatedStats, HostStats, LiveAllocation, ModuleStats, OomInfo, RecentEvent,
    ScopeStats, SiteStats, Snapshot,
};

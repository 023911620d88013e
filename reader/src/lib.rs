//! gpumemhook's reader: the API to read the shared-memory segment the hook writes, from the process
//! itself or from another one, and what the CLI and the Python package share above it. The segment
//! itself (its layout and the protocols every process that maps it runs) is the segment crate's
//! (`reader/segment`, `gpumemhook-segment`), whose facade (the layouts, process identity) is
//! re-exported here.
//!
//! Everything this crate offers is named at its root; its modules are private but [`env`] (the
//! table of variable names, read as `env::LIMIT`). `tests/integration/modules.rs` holds every
//! crate to that: no crate names another's modules.
//!
//! Start with [`Process`]: [`Process::current`] for this process, [`Process::attach`] for another,
//! [`list_processes`] for all of this user's; then [`Process::snapshot`], [`Process::used`],
//! [`Process::peak`], [`Process::open_scope`], [`Process::set_limit`].
//!
//! Modules: [`attach`] (that API), [`labels`] (job labels: rank, Slurm job, pod), [`output`] (every
//! file the hook and the CLI write: `%p` expansion, and the one rule for what a path may name),
//! [`packages`] (the Python distribution that installed a shared object), [`shm`] (segment files),
//! [`sigbus`] (the guard that turns a shrunk mapping, a reader's or the recorder's, into zeroes, not a
//! crash),
//! [`snapshot`] (plain-data copies, also the exit report format), [`size`] (parsing and printing
//! sizes), [`group`] (a group of processes: one count, peak, ceiling and card; its file and
//! mapping), [`env`] (the `GPUMEMHOOK_*` variables and `LD_PRELOAD`), [`error`] (typed errors),
//! [`cards`] (the cards an emulation knows), [`writable`] (the check, before any work, that a file
//! to be written later can be),
//! [`exports`] (the hook's own in-process functions, by row). The timeline (reading the flight
//! recorder's file, the Timeline, its replay and exports) is the timeline crate's
//! (`reader/timeline`, `gpumemhook-timeline`), built on this one.

// The loom models (`reader/segment/tests/loom_*.rs`) build with `--cfg loom`, where the segment
// crate keeps only its protocols. Nothing of this crate runs in a model, so under loom it is empty.
#![cfg(not(loom))]

mod attach;
mod cards;
pub mod env;
mod error;
mod exports;
mod group;
mod labels;
mod output;
mod packages;
mod shm;
mod sigbus;
mod size;
mod snapshot;
mod writable;

// The facade: everything the hook, the CLI, the Python package, the tests and the benchmarks use
// is named here, at the root; the modules are private (but `env`, the table of variable names,
// read as `env::LIMIT`). Each is named here as its module names it: an item whose name would say
// less at the root is named for the root in its module (`group::open_group`), never renamed here,
// so that grep finds it. The segment crate's facade is named here too: the process segment's
// layout (types and constants) and the rest of its root.
pub use gpumemhook_segment::layout::*;
pub use gpumemhook_segment::{
    actor_token, children_of, clock_ns, command_line, current_uid, descendants_of, effective_uid,
    is_alive, is_same_process_alive, namespace_pids, own_pid_namespace, pid_namespace_of,
    real_uid_of, scope_phase_of, start_ticks, token_alive, unix_now_ns, visible_in, EventKind,
    GroupDevice, GroupHeader, GroupScopeSlot, GroupSegment, GroupSlots, MemberSlot, GROUP_LAYOUT,
    GROUP_MAGIC, GROUP_NAME_LEN, GROUP_SCOPE_LABEL_LEN, GROUP_SIZE, INITIAL_PID_NAMESPACE,
    MAX_GROUP_SCOPES, MAX_MEMBERS, SCOPE_FREE, SCOPE_OPEN,
};
pub use gpumemhook_segment::{DeviceFigures, SummaryFigures};

pub use attach::{
    check_device, list_processes, list_segments, list_segments_in, Listing, Owners, Process,
    ProcessEntry, Scope, ScopeReading, Skipped,
};
pub use cards::{
    card_label, card_names, find_card, parse_card, Basis, Card, EmulateError, Emulation, CARDS,
};
pub use error::{Error, Refusal, Result, HOW_TO_HOOK};
pub use exports::{export_rows, lookup_export, Export};
pub use gpumemhook_segment::RECORDING_MAGIC;
pub use group::scope::{GroupScope, GroupScopes};
pub use group::{
    check_group_name, group_path, group_stats, open_group, open_or_create_group, remove_group,
    GroupMapping, GroupOom, GroupStats, MemberStats, Membership, GROUP_FILE_PREFIX,
};
pub use labels::{JobLabels, JOB_VARIABLES};
pub use output::{
    create_own, create_replacing, expand_output, expand_output_numbered, live_target,
    output_target, without_sigpipe, write_file, OutputTarget,
};
pub use packages::module_label;
pub use shm::{
    create_segment, open_segment_file, parse_segment_name, private_segment, reserve_file_range,
    segment_dir, segment_path, segment_path_in, LockAnchor, SegmentMapping, SegmentName,
};
pub use sigbus::GuardSlot;
pub use size::{
    binary_unit, check_limit, format_size, is_unit, parse_amount, parse_count, parse_size,
    spaced_size, SizeError, SizeRule, MAX_SIZE, SIZE_RULE,
};
pub use snapshot::{
    kept_command, module_file_name, sort_modules, DeviceStats, EmulatedStats, HostStats,
    LiveAllocation, ModuleStats, OomInfo, RecentEvent, ScopeDeviceStats, ScopeStats, SiteStats,
    Snapshot, LIVE_LISTED, OTHER_MODULE_NAME,
};
pub use writable::check_writable;

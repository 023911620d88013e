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
//! [`cards`] (the cards an emulation knows), [`trace`] (the timeline's events, the Chrome JSON
//! writer and reader, the builder of a [`Timeline`]), [`recording`] (reading the flight
//! recorder's file, whose format is the segment crate's), [`writable`] (the check, before any work, that a file to be written later can be),
//! [`exports`] (the hook's own in-process functions, by row).

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
mod recording;
mod shm;
mod sigbus;
mod size;
mod snapshot;
mod trace;
mod writable;

// The facade: everything the hook, the CLI, the Python package, the tests and the benchmarks use
// is named here, at the root; the modules are private (but `env`, the table of variable names,
// read as `env::LIMIT`). A name that would say less at the root than in its module is renamed
// here (`group::open` is `open_group`). The segment crate's facade is named here too: the
// process segment's layout (types and constants) and the rest of its root.
pub use gpumemhook_segment::layout::*;
pub use gpumemhook_segment::{
    actor_token, children_of, clock_ns, command_line, current_uid, descendants_of, effective_uid,
    is_alive, is_same_process_alive, namespace_pids, own_pid_namespace, pid_namespace_of,
    real_uid_of, scope_phase_of, start_ticks, token_alive, unix_now_ns, visible_in, GroupDevice,
    GroupHeader, GroupScopeSlot, GroupSegment, GroupSlots, MemberSlot, GROUP_LAYOUT, GROUP_MAGIC,
    GROUP_NAME_LEN, GROUP_SCOPE_LABEL_LEN, GROUP_SIZE, INITIAL_PID_NAMESPACE, MAX_GROUP_SCOPES,
    MAX_MEMBERS, SCOPE_FREE, SCOPE_OPEN,
};
pub use gpumemhook_segment::{DeviceFigures, SummaryFigures};

pub use attach::{
    check_device, list_processes, list_segments, list_segments_in, Listing, Owners, Process,
    ProcessEntry, Scope, ScopeReading, Skipped,
};
pub use cards::{
    find as find_card, label as card_label, names as card_names, parse as parse_card, Basis, Card,
    EmulateError, Emulation, CARDS,
};
pub use error::{Error, Refusal, Result, HOW_TO_HOOK};
pub use exports::{lookup as lookup_export, rows as export_rows, Export};
pub use gpumemhook_segment::RECORDING_MAGIC;
pub use group::scope::{GroupScope, Scopes as GroupScopes};
pub use group::{
    check_name as check_group_name, group_path, open as open_group,
    open_or_create as open_or_create_group, remove as remove_group, stats as group_stats,
    GroupMapping, GroupOom, GroupStats, MemberStats, Membership, GROUP_FILE_PREFIX,
};
pub use labels::{JobLabels, JOB_VARIABLES};
pub use output::{
    create_own, create_replacing, expand as expand_output,
    expand_numbered as expand_output_numbered, live_target, target as output_target,
    without_sigpipe, write_file, Target as OutputTarget,
};
pub use packages::module_label;
pub use recording::{
    close_recording, is_recording, read_recording, read_recording_teed, write_recording_as_chrome,
    Ending, Recording, RecordingEnd,
};
pub use shm::{
    create as create_segment, open as open_segment_file, parse_file_name as parse_segment_name,
    private as private_segment, reserve_range as reserve_file_range, segment_dir, segment_path,
    segment_path_in, LockAnchor, Mapping as SegmentMapping, SegmentName,
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
pub use trace::{
    read_chrome_trace, read_chrome_trace_from, write_chrome_trace, AllocationEvent,
    ChromeTraceWriter, Event, EventKind, EventSink, Keep, Mark, MarkKind, RingPart, RunInfo,
    Timeline, TimelineBuilder, TraceError,
};
pub use writable::check_writable;

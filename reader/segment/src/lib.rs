//! gpumemhook's segment: the shared memory every hooked process keeps its counts in, and the
//! protocols that every process mapping it runs (and the one the hook's threads run among themselves
//! on their ledger tables, [`owned`]). The hook writes through this crate on its hot path; the
//! reader (`gpumemhook-reader`), the CLI and the Python package read and change the same words
//! through it. Nothing here opens a file or knows a command: that is the reader's.
//!
//! Modules: [`layout`] (the process segment: types and constants only), [`counters`] (counting
//! allocations, frees, modules and sites on it), [`peak`] (the device peak: an allocation's fold and a
//! restart racing it), [`ceiling`] (the ceiling and the views of free and
//! total memory under it), [`scope`] (process scopes: the process segment's side of the scope
//! protocol, its floor word in [`floor`]), [`window`] (the one scope protocol of process and group
//! scopes: slot states, the window's restart, the allocation's fold), [`group`] (the group file's format and what its members run on it:
//! claiming a slot, the group's ceiling, its scopes' side, sweeping the dead), [`tally`] (a group's
//! crash-consistent count, member and sweeper sides), [`text`] (text in the segment's byte cells),
//! [`process`] (process and thread identity from `/proc`: who is alive, who holds a transient
//! state), [`recording`] (the flight recorder's file: header, chunks, records), [`ring`] (a recording
//! bounded in size: the summary of what its ring overwrote), and, for the hook's ledger, [`owned`] (the protocol of a table one thread owns and others
//! read and claim from: the hook's per-thread tables of live pointers), all over [`sync`] (the
//! protocols' atomics: std's, or loom's for the models).
//!
//! The hook and the crates above the reader take what they need from this crate's root (the
//! layouts, process identity, the clock, the per-thread tables' protocol); only the reader, which builds the segment and group files
//! on the protocols, uses the modules (`tests/integration/modules.rs` checks).
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
pub mod peak;
#[cfg(not(loom))]
pub mod process;
#[cfg(not(loom))]
pub mod recording;
#[cfg(not(loom))]
pub mod ring;
#[cfg(not(loom))]
pub mod scope;
pub mod sync;
pub mod tally;
#[cfg(not(loom))]
pub mod text;
pub mod window;

// The crate's facade for the hook and the crates above the reader: the process segment's layout
// (types and constants only), the group file's, process identity and the clock. The protocol
// modules stay public for the reader, which builds the segment and group files on them.
#[cfg(not(loom))]
pub use counters::clock_ns;
#[cfg(not(loom))]
pub use group::{
    GroupDevice, GroupHeader, GroupScopeSlot, GroupSegment, GroupSlots, MemberSlot, GROUP_LAYOUT,
    GROUP_MAGIC, GROUP_NAME_LEN, GROUP_SCOPE_LABEL_LEN, GROUP_SIZE, MAX_GROUP_SCOPES, MAX_MEMBERS,
};
#[cfg(not(loom))]
pub use layout::*;
pub use owned::{ClaimSet, Entries, TableSync, FROZEN};
#[cfg(not(loom))]
pub use process::{
    actor_token, children_of, command_line, current_uid, descendants_of, effective_uid, is_alive,
    is_same_process_alive, namespace_pids, own_pid_namespace, pid_namespace_of, real_uid_of,
    start_ticks, token_alive, unix_now_ns, visible_in, INITIAL_PID_NAMESPACE,
};
#[cfg(not(loom))]
pub use recording::{
    chunk_events, chunk_offset, decode_recording_header, fill_field, text_records, ChunkItem,
    ChunkReader, EventKind, EventRecord, Record, RecordError, RecordingHeader,
    RecordingHeaderError, RecordingHeaderFields, RingLayout, TextClass, CEILING_AT_EXIT,
    CEILING_CHANGED, CEILING_IN_FORCE, CHUNK_BYTES, ENDED_BY_RUN, ENDED_BY_WRITER, MAX_EVENT_CODE,
    MAX_NARROW, MAX_TEXT_LEN, NO_CEILING, NO_MODULE, ORDER_BITS, RECORDING_COMMAND_LEN,
    RECORDING_HEADER_BYTES, RECORDING_HOST_LEN, RECORDING_LABELS_LEN, RECORDING_MAGIC,
    RECORDING_VERSION, RECORDS_PER_CHUNK, RECORD_BYTES, RING_RECORDING_VERSION,
};
#[cfg(not(loom))]
pub use ring::{
    bucket_of, module_cell, read_summary, ring_layout_for, DeviceFigures, RingDevice, RingSummary,
    SummaryFigures, FIRST_BUCKET_NS, MIN_RING_BYTES, RING_BUCKETS, RING_MODULE_CELLS,
    SUMMARY_CHUNKS, SUMMARY_MAGIC,
};
pub use sync::back_off;
pub use window::{scope_phase_of, SCOPE_FREE, SCOPE_OPEN};

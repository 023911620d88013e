//! gpumemhook's timeline: the flight recorder's file (its format is the segment crate's,
//! `gpumemhook_segment::recording`) read as one stream of events, and what is made from that
//! stream: the [`Timeline`] that `report`, `plot` and `view` draw from, its replay to the figures
//! the segment's counters would have shown, and the exports other viewers open (Chrome JSON,
//! Perfetto's protobuf trace, PyTorch's memory snapshot). The CLI's commands call this crate and
//! encode nothing themselves; the hook does not link it (it writes the file with the segment
//! crate's definitions alone).
//!
//! Everything this crate offers is named at its root; its modules are private.
//!
//! Modules: [`recording`] (reading the recorder's file, two passes, into an [`EventSink`]),
//! [`trace`] (the event model, the Chrome JSON writer and reader, the builder of a [`Timeline`]),
//! [`replay`] (a timeline's counters replayed to peaks, `used` and scopes), [`replayed`] (`report
//! --json` of a timeline: the exit report's shape), [`perfetto`] and [`pytorch`] (the encoders).

mod perfetto;
mod pytorch;
mod recording;
mod replay;
mod replayed;
mod trace;

pub use perfetto::write_perfetto;
pub use pytorch::write_pytorch;
pub use recording::{
    close_recording, is_recording, read_recording, read_recording_teed, write_recording_as_chrome,
    Ending, Recording, RecordingEnd,
};
pub use replay::{replay, time_span, used_at, DeviceReplay, ScopeReplay};
pub use replayed::{recording_json, timeline_json};
pub use trace::{
    read_chrome_trace, read_chrome_trace_from, write_chrome_trace, AllocationEvent,
    ChromeTraceWriter, Event, EventSink, Keep, Mark, MarkKind, RunInfo, Timeline, TimelineBuilder,
    TraceError,
};

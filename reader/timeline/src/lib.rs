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
//! Modules: `event` (the event model: an [`Event`], and an [`EventSink`] that takes them),
//! `recording` (reading the recorder's file, in two passes, into an [`EventSink`]), `timeline`
//! (the [`Timeline`] and how much of it a reader keeps, [`Keep`]), `builder` (the
//! [`TimelineBuilder`], the sink that makes a [`Timeline`]), `replay` (a timeline's counters
//! replayed to peaks, `used` and scopes), `replayed` (`report --json` of a timeline: the exit
//! report's shape), the encoders `chrome_writer`, `perfetto` and `pytorch`,
//! `chrome_reader` (Chrome JSON read back, as it streams), and `error`.

mod builder;
mod chrome_reader;
mod chrome_writer;
mod error;
mod event;
mod perfetto;
mod pytorch;
mod recording;
mod replay;
mod replayed;
mod timeline;

pub use builder::TimelineBuilder;
pub use chrome_reader::{read_chrome_trace, read_chrome_trace_from};
pub use chrome_writer::{write_chrome_trace, ChromeTraceWriter};
pub use error::TraceError;
pub use event::{Event, EventSink};
pub use perfetto::write_perfetto;
pub use pytorch::write_pytorch;
pub use recording::{
    close_recording, is_recording, read_recording, read_recording_teed, write_recording_as_chrome,
    Ending, Recording, RecordingEnd,
};
pub use replay::{replay, time_span, used_at, DeviceReplay, ScopeReplay};
pub use replayed::{recording_json, timeline_json};
pub use timeline::{AllocationEvent, Keep, Mark, MarkKind, RunInfo, Timeline};

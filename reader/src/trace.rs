//! The timeline file (`GPUMEMHOOK_TRACE`): its one definition, written by the hook at exit and read
//! by `gpumemhook plot` and the tests.
//!
//! The file is Chrome trace JSON (`{"traceEvents": [...]}`), which Perfetto and chrome://tracing
//! open. Timestamps (`ts`) are microseconds (fractional) of `CLOCK_MONOTONIC`. Events:
//! - one counter event per allocation or free that changed a device's `used`:
//!   `{"ph": "C", "name": "device <d> used", "ts", "pid", "args": {"used": bytes}}`;
//! - one counter event per device whenever the ceiling in force changes (and at the device's first
//!   event, once it has had a ceiling: a device that never had one has no such counter):
//!   `{"ph": "C", "name": "device <d> limit", "ts", "pid", "args": {"limit": bytes}}`, where
//!   0 means no ceiling (files written before these events existed have only the metadata's
//!   `limits`, the ceilings in force at exit; the reader then takes those for the whole run);
//! - one instant event per allocation, free, refusal or failure:
//!   `{"ph": "i", "name": <entry point>, "cat": "alloc" | "free" | "denied" | "failed",
//!    "ts", "pid", "tid", "args": {"device", "bytes", "used", "address", "kind", "module", "site"}}`,
//!   where `kind` (`managed`, `host_pinned`) is left out for device memory, `module` (the file
//!   name of the shared object that asked for device memory) is left out when unknown, and `site`
//!   (the Python call site, `GPUMEMHOOK_STACKS`) when none was recorded;
//! - one instant event per device whose peak was restarted (`reset_peak`, from this process or
//!   another): `{"ph": "i", "s": "g", "name": "reset_peak", "cat": "reset_peak", "ts", "pid",
//!   "tid", "args": {"device"}}`, at the time of the restart; the device's peak counts from its
//!   `used` then;
//! - scopes opened and closed in the process, as `{"ph": "b"/"e", "cat": "scope", "id": <slot>,
//!   "name", "ts", "pid", "tid"}` async spans;
//! - metadata: `process_name`, and a `gpumemhook` event (`"ph": "M"`) whose `args` hold the ceiling
//!   per device at exit (`limits`), the number of events recorded, `dropped` (events past the
//!   buffer) and `end`, the time of exit (µs, the clock of `ts`), and what places the run among
//!   others ([`RunInfo`]): `labels` (the job labels, rank and group among them), `host`, and
//!   `wall_offset` (µs to add to a `ts` to get Unix time, so timelines of several machines line
//!   up). It comes last: the file is written as a stream.
//!
//! A ceiling change or a peak restart made by another process (`gpumemhook limit PID`) is seen by
//! the hook at the device's next event or at exit, and written at the time it happened: a ceiling
//! changed after the last allocation is still a step of the `limit` counter.

use gpumemhook_segment::layout::{MemKind, MAX_SCOPES};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;

pub use gpumemhook_segment::recording::EventKind;

/// One recorded event, as the hook hands it to the writer at exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event<'a> {
    pub ts_ns: u64,
    pub kind: EventKind,
    pub device: u32,
    pub bytes: u64,
    /// `used` of the device right after the event.
    pub used: u64,
    pub address: u64,
    /// Entry point name, or the scope name.
    pub name: &'a str,
    /// Managed / pinned host / device.
    pub mem: gpumemhook_segment::layout::MemKind,
    pub tid: u32,
    /// Scope slot for scope events.
    pub scope: u32,
    /// The ceiling of `device` in force at the event, `None` when there was none.
    pub limit: Option<u64>,
    /// File name of the module charged with a device allocation or free, `""` when unknown.
    pub module: &'a str,
    /// The Python call site of a device allocation, refusal or free (`GPUMEMHOOK_STACKS`), `""`
    /// for none.
    pub site: &'a str,
}

/// What takes a timeline's events one at a time, in time order: the Chrome writer and
/// [`TimelineBuilder`] (the flight recorder's reader hands its events to either).
pub trait EventSink {
    /// One event of the count.
    fn event(&mut self, e: &Event<'_>) -> std::io::Result<()>;
    /// A step of `device`'s ceiling that is not an event of the count (the ceiling in force at an
    /// event, or at exit), taken where it differs from the last.
    fn ceiling_step(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) -> std::io::Result<()>;
    /// A ring timeline's summary of the events it overwrote, before any event: a sink that sums
    /// starts from it.
    fn ring(&mut self, _ring: &RingPart) -> std::io::Result<()> {
        Ok(())
    }
}

impl<W: Write> EventSink for ChromeTraceWriter<W> {
    fn event(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        ChromeTraceWriter::event(self, e)
    }

    fn ceiling_step(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) -> std::io::Result<()> {
        self.ceiling_at_exit(ts_ns, device, limit)
    }
}

/// Writes a timeline one event at a time: memory stays constant whatever the number of events
/// (the hook writes millions at exit). Events may come in any order; viewers sort by `ts`.
///
/// The device-memory events of each device also give a counter track of `used` and, whenever the
/// ceiling in force differs from the one last written for that device, a counter `"device <d>
/// limit"` whose value is the ceiling in bytes, 0 meaning none. A device that never had a ceiling
/// has no such counter (viewers would draw a ceiling of 0 bytes); one whose first ceiling came
/// mid-run starts at 0 from its first event.
pub struct ChromeTraceWriter<W: Write> {
    out: W,
    pid: u32,
    /// Per device: the ceiling last written (`UNSEEN` until its first ceiling).
    limits_written: Vec<u64>,
    /// Per device without a ceiling yet: the time of its first event, where its counter starts at
    /// 0 once it gets one.
    no_ceiling_since: Vec<Option<u64>>,
    events: u64,
    /// One event's text, built here and written with one call: the writer formats integers with
    /// `itoa` and copies fixed text, because `write!`'s general formatting machinery made writing
    /// a million events take over a second.
    line: Vec<u8>,
}

const UNSEEN: u64 = u64::MAX - 1;

/// Appends `value` in decimal.
fn push_int(line: &mut Vec<u8>, value: impl itoa::Integer) {
    line.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// Appends `text` as a JSON string: plain names as they are, anything else through serde_json.
fn push_str(line: &mut Vec<u8>, text: &str) {
    if text
        .bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        line.push(b'"');
        line.extend_from_slice(text.as_bytes());
        line.push(b'"');
    } else {
        // Writing JSON into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *line, text);
    }
}

/// Appends `0x` and `value` in lowercase hexadecimal.
fn push_hex(line: &mut Vec<u8>, value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    line.extend_from_slice(b"0x");
    let digits = (64 - value.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        line.push(DIGITS[((value >> (i * 4)) & 0xf) as usize]);
    }
}

impl<W: Write> ChromeTraceWriter<W> {
    /// Starts the file: the JSON preamble and the process name.
    pub fn new(mut out: W, pid: u32, command: &str) -> std::io::Result<Self> {
        out.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
        let mut line = Vec::with_capacity(512);
        line.extend_from_slice(b"{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":");
        push_int(&mut line, pid);
        line.extend_from_slice(b",\"args\":{\"name\":");
        push_str(&mut line, command);
        line.extend_from_slice(b"}}");
        out.write_all(&line)?;
        Ok(ChromeTraceWriter {
            out,
            pid,
            limits_written: vec![UNSEEN; gpumemhook_segment::layout::MAX_DEVICES],
            no_ceiling_since: vec![None; gpumemhook_segment::layout::MAX_DEVICES],
            events: 0,
            line,
        })
    }

    /// Starts an event in `self.line`: it follows the process name written by `new`. `ts` is in
    /// microseconds with three decimals, made from integers.
    fn open_event(&mut self, ph: &[u8], ts_ns: u64) {
        let line = &mut self.line;
        line.extend_from_slice(b",\n{\"ph\":\"");
        line.extend_from_slice(ph);
        line.extend_from_slice(b"\",\"ts\":");
        push_int(line, ts_ns / 1000);
        let frac = ts_ns % 1000;
        line.extend_from_slice(&[
            b'.',
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ]);
        line.extend_from_slice(b",\"pid\":");
        push_int(line, self.pid);
    }

    /// Writes one event.
    pub fn event(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        self.events += 1;
        self.line.clear();
        match e.kind {
            EventKind::ScopeOpen | EventKind::ScopeClose => self.scope_event(e),
            EventKind::Ceiling => self.ceiling(e.ts_ns, e.device, e.limit),
            EventKind::PeakReset => {
                self.open_event(b"i", e.ts_ns);
                let line = &mut self.line;
                // A global instant: the restart is the device's, not a thread's.
                line.extend_from_slice(b",\"s\":\"g\",\"cat\":\"");
                line.extend_from_slice(e.kind.category().as_bytes());
                line.extend_from_slice(b"\",\"tid\":");
                push_int(line, e.tid);
                line.extend_from_slice(b",\"name\":\"reset_peak\",\"args\":{\"device\":");
                push_int(line, e.device);
                line.extend_from_slice(b"}}");
                self.ceiling(e.ts_ns, e.device, e.limit);
            }
            kind => {
                self.memory_event(e);
                if e.mem == gpumemhook_segment::layout::MemKind::Device {
                    self.ceiling(e.ts_ns, e.device, e.limit);
                    if matches!(kind, EventKind::Alloc | EventKind::Free) {
                        self.counter(e.ts_ns, e.device, b" used\",\"args\":{\"used\":", e.used);
                    }
                }
            }
        }
        self.out.write_all(&self.line)
    }

    /// A scope's open or close: the begin or end of an async slice.
    fn scope_event(&mut self, e: &Event<'_>) {
        let ph: &[u8] = if e.kind == EventKind::ScopeOpen {
            b"b"
        } else {
            b"e"
        };
        self.open_event(ph, e.ts_ns);
        let line = &mut self.line;
        line.extend_from_slice(b",\"cat\":\"");
        line.extend_from_slice(e.kind.category().as_bytes());
        line.extend_from_slice(b"\",\"id\":");
        push_int(line, e.scope);
        line.extend_from_slice(b",\"tid\":");
        push_int(line, e.tid);
        line.extend_from_slice(b",\"name\":");
        push_str(line, e.name);
        line.push(b'}');
    }

    /// An allocation, a free or a refusal: an instant of its thread, its figures in `args`.
    fn memory_event(&mut self, e: &Event<'_>) {
        let cat = e.kind.category().as_bytes();
        let mem = e.mem.name().as_bytes();
        self.open_event(b"i", e.ts_ns);
        let line = &mut self.line;
        // No "s" (scope): an instant event's default scope is its thread.
        line.extend_from_slice(b",\"cat\":\"");
        line.extend_from_slice(cat);
        line.extend_from_slice(b"\",\"tid\":");
        push_int(line, e.tid);
        line.extend_from_slice(b",\"name\":");
        push_str(line, e.name);
        line.extend_from_slice(b",\"args\":{\"device\":");
        push_int(line, e.device);
        line.extend_from_slice(b",\"bytes\":");
        push_int(line, e.bytes);
        line.extend_from_slice(b",\"used\":");
        push_int(line, e.used);
        line.extend_from_slice(b",\"address\":\"");
        push_hex(line, e.address);
        line.push(b'"');
        // `kind` only when not device memory (the reader's default): millions of events make
        // every byte count.
        if e.mem != gpumemhook_segment::layout::MemKind::Device {
            line.extend_from_slice(b",\"kind\":\"");
            line.extend_from_slice(mem);
            line.push(b'"');
        }
        if !e.module.is_empty() {
            line.extend_from_slice(b",\"module\":");
            push_str(line, e.module);
        }
        if !e.site.is_empty() {
            line.extend_from_slice(b",\"site\":");
            push_str(line, e.site);
        }
        line.extend_from_slice(b"}}");
    }

    /// Appends a `limit` counter step of `device` when `limit` differs from the ceiling last
    /// written for that device; none while the device has never had a ceiling.
    fn ceiling(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) {
        let limit = limit.unwrap_or(0);
        let Some(written) = self.limits_written.get_mut(device as usize) else {
            return;
        };
        if *written == UNSEEN {
            let since = &mut self.no_ceiling_since[device as usize];
            if limit == 0 {
                since.get_or_insert(ts_ns);
                return;
            }
            if let Some(since) = since.take() {
                *written = 0;
                self.counter(since, device, b" limit\",\"args\":{\"limit\":", 0);
            }
        }
        let written = &mut self.limits_written[device as usize];
        if std::mem::replace(written, limit) != limit {
            self.counter(ts_ns, device, b" limit\",\"args\":{\"limit\":", limit);
        }
    }

    /// Writes the ceiling of `device` in force at exit (`ts_ns`) as a last `limit` step, where it
    /// differs from the one written last: a ceiling changed after the device's last event is
    /// still on the timeline. Not an event of the count.
    pub fn ceiling_at_exit(
        &mut self,
        ts_ns: u64,
        device: u32,
        limit: Option<u64>,
    ) -> std::io::Result<()> {
        self.line.clear();
        self.ceiling(ts_ns, device, limit);
        self.out.write_all(&self.line)
    }

    /// Appends a counter event of `device`: `middle` closes its name and opens its one value.
    fn counter(&mut self, ts_ns: u64, device: u32, middle: &[u8], value: u64) {
        self.open_event(b"C", ts_ns);
        let line = &mut self.line;
        line.extend_from_slice(b",\"name\":\"device ");
        push_int(line, device);
        line.extend_from_slice(middle);
        push_int(line, value);
        line.extend_from_slice(b"}}");
    }

    /// Ends the file with the summary metadata: the ceilings in force at exit, the number of
    /// events written and of events dropped (past the buffer), and the time of exit (`end_ns`,
    /// nanoseconds of the events' clock). Returns the output, flushed.
    pub fn finish(
        mut self,
        limits: &BTreeMap<u32, u64>,
        dropped: u64,
        end_ns: u64,
        info: &RunInfo,
    ) -> std::io::Result<W> {
        let end_us = (end_ns / 1000) as f64 + (end_ns % 1000) as f64 / 1000.0;
        let mut args = json!({"limits": limits, "events": self.events, "dropped": dropped,
            "end": end_us, "labels": info.labels});
        if let Some(host) = &info.host {
            args["host"] = json!(host);
        }
        if let Some(offset) = info.wall_offset_us {
            args["wall_offset"] = json!(offset);
        }
        let summary = json!({"ph": "M", "name": "gpumemhook", "pid": self.pid, "args": args});
        self.out.write_all(b",\n")?;
        serde_json::to_writer(&mut self.out, &summary)?;
        self.out.write_all(b"]}\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes `events` as Chrome trace JSON (see [`ChromeTraceWriter`]), ending at the last event.
pub fn write_chrome_trace(
    out: &mut impl Write,
    pid: u32,
    command: &str,
    events: &[Event<'_>],
    limits: &BTreeMap<u32, u64>,
    dropped: u64,
) -> std::io::Result<()> {
    let mut writer = ChromeTraceWriter::new(out, pid, command)?;
    for e in events {
        writer.event(e)?;
    }
    let end_ns = events.iter().map(|e| e.ts_ns).max().unwrap_or(0);
    writer
        .finish(limits, dropped, end_ns, &RunInfo::default())
        .map(drop)
}

/// Where a run stands among others: what lines up the timelines of a job's processes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunInfo {
    /// The process's job labels (rank, local rank, group, job name...), as its segment has them.
    pub labels: crate::labels::JobLabels,
    /// The machine's host name, `None` when unknown.
    pub host: Option<String>,
    /// Microseconds to add to a timestamp (`CLOCK_MONOTONIC`) to get Unix time, `None` when the
    /// file does not say.
    pub wall_offset_us: Option<f64>,
}

/// A timeline read back from a trace file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub pid: u32,
    pub command: String,
    /// Rank, group, host and wall clock of the run.
    pub info: RunInfo,
    /// The writer died before finishing the file (a recording cut short by SIGKILL, say): the
    /// timeline ends at its last whole event.
    pub cut_short: bool,
    /// Its process died without finishing it and `gpumemhook run` closed it: `Some(signal)` when
    /// the signal that killed it is known.
    pub killed_by: Option<Option<u32>>,
    /// Per device: `(ts in µs, used after)` in file order.
    pub used: BTreeMap<u32, Vec<(f64, u64)>>,
    /// `(name, open µs, close µs or None while still open at exit)`.
    pub scopes: Vec<(String, f64, Option<f64>)>,
    /// The ceilings in force at exit, per device (the metadata's `limits`).
    pub limits: BTreeMap<u32, u64>,
    /// Per device, when its peak was restarted (`reset_peak`), µs, in file order.
    pub peak_resets: BTreeMap<u32, Vec<f64>>,
    /// When the process exited (µs), for files that say (the metadata's `end`).
    pub end: Option<f64>,
    /// Per device, the ceiling over time: `(ts in µs, ceiling from then on, None for no ceiling)`,
    /// in file order. From the `device <d> limit` counter events; for a file without them, one step
    /// per device of the metadata's `limits`, at the timeline's first timestamp.
    pub ceilings: BTreeMap<u32, Vec<(f64, Option<u64>)>>,
    /// Allocations refused by the ceiling and allocations the driver failed, in file order.
    pub marks: Vec<Mark>,
    pub events: u64,
    pub dropped: u64,
    /// Count of instant events per category (`alloc`, `free`, `denied`, `failed`), every memory
    /// kind together.
    pub counts: BTreeMap<String, u64>,
    /// The same counts split by memory kind: `kind_counts[kind][category]`, kind being `device`,
    /// `managed` or `host_pinned` (events without a kind count as `device`).
    pub kind_counts: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per device and module, the module's device bytes over time: `(ts in µs, held after)`,
    /// summed from the device allocations and frees that name their module, in file order.
    pub module_used: BTreeMap<u32, BTreeMap<String, Vec<(f64, u64)>>>,
    /// Every allocation, free, refusal and failure of device memory, in file order, with what the
    /// file says of each (`gpumemhook view` pairs frees with their allocations by address).
    pub allocations: Vec<AllocationEvent>,
    /// Per device, how many changes of `used` the timeline had, where `used` holds only some of
    /// them ([`Keep::Peaks`]); empty when `used` is whole.
    pub used_changes: BTreeMap<u32, u64>,
    /// A ring timeline's (`GPUMEMHOOK_TRACE_MAX`): what it kept of the events it overwrote; the
    /// fields above hold only the events after [`RingPart::detail_from`] (and some before).
    pub ring: Option<RingPart>,
}

/// What a ring timeline kept of the events it overwrote: their sums, the segment's peaks, and
/// `used`'s lowest and highest per interval (`gpumemhook_segment::ring`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RingPart {
    pub figures: gpumemhook_segment::SummaryFigures,
    /// The names of the modules the figures number.
    pub module_names: BTreeMap<u8, String>,
}

impl RingPart {
    /// The time of the newest event overwritten (µs): every event after it is in the timeline;
    /// `None` when the ring overwrote nothing.
    pub fn detail_from(&self) -> Option<f64> {
        (self.figures.evicted_events > 0).then(|| self.figures.detail_from_ns as f64 / 1000.0)
    }

    /// The name of a module the figures number (`""` for none, or one the file does not name).
    pub fn module_name(&self, number: u8) -> &str {
        self.module_names.get(&number).map_or("", String::as_str)
    }
}

/// One device-memory allocation, free, refusal or failure, as the timeline holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocationEvent {
    /// µs, as every timestamp of the file.
    pub ts: f64,
    /// [`EventKind::Alloc`], [`EventKind::Free`], [`EventKind::Denied`] or [`EventKind::Failed`].
    pub kind: EventKind,
    pub device: u32,
    pub bytes: u64,
    /// The device address (`0x…` in the file), 0 when unreadable.
    pub address: u64,
    pub tid: u32,
    /// The module charged, `""` when unknown.
    pub module: String,
    /// The Python call site, `""` when none was recorded.
    pub site: String,
}

impl Timeline {
    /// How many `event` events (alloc, free, denied, failed) of memory `kind` the timeline holds.
    pub fn count(&self, kind: MemKind, event: EventKind) -> u64 {
        self.kind_counts
            .get(kind.name())
            .and_then(|c| c.get(event.category()))
            .copied()
            .unwrap_or(0)
    }
}

/// Whether an allocation was refused by the ceiling or failed in the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// Refused by gpumemhook's ceiling (`cat` `denied`).
    Denied,
    /// Failed in the driver (`cat` `failed`).
    Failed,
}

/// An allocation that did not happen, where it would sit on the `used` curve.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub kind: MarkKind,
    /// µs, as every timestamp of the file.
    pub ts: f64,
    pub device: u32,
    /// The size asked for.
    pub bytes: u64,
    /// The device's `used` at that moment (unchanged by the refusal).
    pub used: u64,
    /// Memory kind asked for: `device`, `managed` or `host_pinned`.
    pub memory: String,
}

/// Why a trace could not be read.
#[derive(Debug)]
pub struct TraceError {
    message: String,
    /// The file is JSON without a `traceEvents` list: no timeline at all (an exit report, say),
    /// rather than a broken one.
    pub not_a_timeline: bool,
}

impl TraceError {
    pub(crate) fn broken(message: String) -> TraceError {
        TraceError {
            message,
            not_a_timeline: false,
        }
    }
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TraceError {}

/// Reads a trace written by [`write_chrome_trace`], held in `text`.
pub fn read_chrome_trace(text: &str) -> Result<Timeline, TraceError> {
    read_events(&mut serde_json::Deserializer::from_str(text))
}

/// Reads a trace written by [`write_chrome_trace`] from `input` as it comes (a file: give it
/// buffered): one event at a time, so that memory holds the timeline's figures, never the file's
/// text or a tree of all its events (at 10⁶ events, 348 MB of text parse into about 7 GB of tree).
pub fn read_chrome_trace_from(input: impl std::io::Read) -> Result<Timeline, TraceError> {
    read_events(&mut serde_json::Deserializer::from_reader(input))
}

/// The one reader behind both: the root object is walked key by key, and each element of its
/// `traceEvents` list is parsed on its own and taken into the timeline at once.
fn read_events<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
) -> Result<Timeline, TraceError> {
    let mut reading = Reading::default();
    let keys = serde::Deserializer::deserialize_map(&mut *de, RootVisitor(&mut reading))
        .map_err(|e| TraceError::broken(format!("not JSON ({e})")))?;
    de.end()
        .map_err(|e| TraceError::broken(format!("not JSON ({e})")))?;
    if !keys.events {
        let message = if keys.devices && keys.pid {
            "this is an exit report, not a timeline: record one with `gpumemhook run --trace \
             FILE` (or GPUMEMHOOK_TRACE=FILE) and give that"
                .into()
        } else {
            "no \"traceEvents\" list: not a Chrome trace (a timeline is written by `gpumemhook \
             run --trace FILE` or GPUMEMHOOK_TRACE=FILE)"
                .into()
        };
        return Err(TraceError {
            message,
            not_a_timeline: true,
        });
    }
    Ok(reading.finish())
}

/// Builds a [`Timeline`] from events as they come, to what [`read_chrome_trace`] gives for the
/// Chrome file [`ChromeTraceWriter`] writes of the same events (a test holds the two equal).
///
/// With [`Keep::Peaks`], a change of `used` is kept only when a replay's figures may need it: the
/// first; one above every value since the last anchor (a scope opening or a peak restart, when
/// `used` then is the new base); the last before each anchor and at the end. Each device's peak
/// (over the run and since a restart, and when first reached), its last `used`, and each scope's
/// base and peak are then those of the whole curve (a test of `crate::replay` in the CLI holds
/// them equal on random timelines).
pub struct TimelineBuilder {
    reading: Reading,
    /// Per device, the ceiling last taken (as the writer's `limits_written`).
    limits_taken: Vec<u64>,
    keep: Keep,
    /// Per device, for [`Keep::Peaks`]: the highest `used` since the last anchor, and the latest
    /// change not kept.
    highs: BTreeMap<u32, (u64, Option<(f64, u64)>)>,
    /// When the last anchor was (µs).
    last_anchor: f64,
}

/// How much of a timeline a reader keeps: what grows with its events beyond the `used` curves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Keep {
    /// The figures a replay states (`report`, `run`): each device's `used` kept only where it
    /// matters to them (see [`TimelineBuilder`]), with the number of changes in
    /// [`Timeline::used_changes`]; ceilings, scopes and marks whole. Memory then grows with the
    /// number of new highs, not of events.
    Peaks,
    /// The whole `used` curves (`plot`), ceilings, scopes, marks.
    Figures,
    /// And each module's bytes over time (`plot --by-module`).
    Modules,
    /// And every allocation event (`view`, which pairs frees with allocations).
    Everything,
}

impl TimelineBuilder {
    pub fn new(keep: Keep) -> TimelineBuilder {
        TimelineBuilder {
            reading: Reading::default(),
            limits_taken: vec![UNSEEN; gpumemhook_segment::layout::MAX_DEVICES],
            keep,
            highs: BTreeMap::new(),
            last_anchor: f64::NEG_INFINITY,
        }
    }

    /// A change of `used` on `device`: kept as [`Keep`] says.
    fn take_used(&mut self, device: u32, ts: f64, used: u64) {
        let series = self.reading.t.used.entry(device).or_default();
        if self.keep != Keep::Peaks {
            series.push((ts, used));
            return;
        }
        *self.reading.t.used_changes.entry(device).or_default() += 1;
        let (high, pending) = self.highs.entry(device).or_insert((0, None));
        if series.is_empty() || used > *high || ts <= self.last_anchor {
            // A change at the anchor's own time is at the anchor: it is the new base.
            *high = if ts <= self.last_anchor {
                used
            } else {
                used.max(*high)
            };
            *pending = None;
            series.push((ts, used));
        } else {
            *pending = Some((ts, used));
        }
    }

    /// A scope opened or a peak restarted at `ts`: each device's latest change is kept, and its
    /// `used` now is the base new highs are counted from.
    fn anchor(&mut self, ts: f64) {
        self.last_anchor = ts;
        for (device, (high, pending)) in &mut self.highs {
            let series = self.reading.t.used.entry(*device).or_default();
            if let Some(point) = pending.take() {
                series.push(point);
            }
            *high = series.last().map_or(0, |&(_, used)| used);
        }
    }

    /// The timeline, given what the file says of the run: the ceilings in force at exit, events
    /// lost, the end (µs), and the run's place.
    pub fn finish(
        mut self,
        pid: u32,
        command: String,
        limits: BTreeMap<u32, u64>,
        dropped: u64,
        end_ns: Option<u64>,
        info: RunInfo,
    ) -> Timeline {
        for (device, (_, pending)) in &mut self.highs {
            if let Some(point) = pending.take() {
                self.reading.t.used.entry(*device).or_default().push(point);
            }
        }
        let t = &mut self.reading.t;
        t.pid = pid;
        t.command = command;
        t.limits = limits;
        t.dropped = dropped;
        t.end = end_ns.map(micros);
        t.info = info;
        self.reading.finish()
    }

    fn see(&mut self, ts: f64) {
        let first = &mut self.reading.first_ts;
        *first = Some(first.map_or(ts, |f| f.min(ts)));
    }
}

/// Nanoseconds as the file's microseconds (the same `f64` the Chrome file's text parses to).
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl EventSink for TimelineBuilder {
    fn event(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        let ts = micros(e.ts_ns);
        self.see(ts);
        self.reading.t.events += 1;
        match e.kind {
            EventKind::ScopeOpen => {
                self.anchor(ts);
                self.reading.open_scope(u64::from(e.scope), e.name, ts);
            }
            EventKind::ScopeClose => {
                if let Some((n, start)) = self.reading.open.remove(&u64::from(e.scope)) {
                    self.reading.t.scopes.push((n, start, Some(ts)));
                }
            }
            EventKind::Ceiling => self.ceiling_step(e.ts_ns, e.device, e.limit)?,
            EventKind::PeakReset => {
                self.anchor(ts);
                self.reading
                    .t
                    .peak_resets
                    .entry(e.device)
                    .or_default()
                    .push(ts);
                self.ceiling_step(e.ts_ns, e.device, e.limit)?;
            }
            kind => {
                self.reading.t.take_memory(
                    &MemoryInstant {
                        ts,
                        cat: kind.category(),
                        device: Some(e.device),
                        bytes: e.bytes,
                        used: e.used,
                        address: e.address,
                        tid: e.tid,
                        memory: e.mem.name(),
                        module: e.module,
                        site: e.site,
                    },
                    self.keep,
                );
                if e.mem == MemKind::Device {
                    self.ceiling_step(e.ts_ns, e.device, e.limit)?;
                    if matches!(kind, EventKind::Alloc | EventKind::Free) {
                        self.take_used(e.device, ts, e.used);
                    }
                }
            }
        }
        Ok(())
    }

    fn ceiling_step(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) -> std::io::Result<()> {
        let limit = limit.unwrap_or(0);
        let changed = self
            .limits_taken
            .get_mut(device as usize)
            .is_some_and(|taken| std::mem::replace(taken, limit) != limit);
        if changed {
            let ts = micros(ts_ns);
            self.see(ts);
            self.reading
                .t
                .ceilings
                .entry(device)
                .or_default()
                .push((ts, (limit != 0).then_some(limit)));
        }
        Ok(())
    }
}

/// What reading a trace has gathered so far.
#[derive(Default)]
struct Reading {
    t: Timeline,
    /// Scopes begun and not yet ended, by id: name and start.
    open: BTreeMap<u64, (String, f64)>,
    /// The earliest time of an event, `None` before the first.
    first_ts: Option<f64>,
}

impl Reading {
    /// Takes one element of `traceEvents`.
    fn take(&mut self, e: &Value) {
        let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
        let name = e.get("name").and_then(Value::as_str).unwrap_or("");
        let ts = e.get("ts").and_then(Value::as_f64).unwrap_or(0.0);
        let args = e.get("args");
        if ph != "M" && e.get("ts").is_some() {
            self.first_ts = Some(self.first_ts.map_or(ts, |first| first.min(ts)));
        }
        let id = || e.get("id").and_then(Value::as_u64).unwrap_or(0);
        let t = &mut self.t;
        match ph {
            "M" => t.take_metadata(name, e, args),
            "C" => t.take_counter(name, ts, args),
            "i" => t.take_instant(e, ts, args, Keep::Everything),
            "b" => self.open_scope(id(), name, ts),
            "e" => {
                if let Some((n, start)) = self.open.remove(&id()) {
                    t.scopes.push((n, start, Some(ts)));
                }
            }
            _ => {}
        }
    }

    /// A scope opened at `ts` in `slot`, kept until it closes. A slot the hook never gives (it
    /// has [`MAX_SCOPES`]) can only be a forged file's: not kept, so that the scopes open at once
    /// cost at most that many entries, however many a file opens and never closes.
    fn open_scope(&mut self, slot: u64, name: &str, ts: f64) {
        if slot < MAX_SCOPES as u64 {
            self.open.insert(slot, (name.to_string(), ts));
        }
    }

    /// The timeline, once every event is in: scopes still open at the end, the ceilings of a file
    /// from before ceiling events, and no ceiling steps for a device that never had a ceiling
    /// (files of earlier versions start every device's counter at 0, meaning none).
    fn finish(self) -> Timeline {
        let mut t = self.t;
        t.scopes
            .extend(self.open.into_values().map(|(n, start)| (n, start, None)));
        if t.ceilings.is_empty() {
            // A file from before ceiling events: the ceilings at exit are all it knows.
            let start = self.first_ts.unwrap_or(0.0);
            for (&d, &limit) in &t.limits {
                t.ceilings.insert(d, vec![(start, Some(limit))]);
            }
        }
        t.ceilings
            .retain(|_, steps| steps.iter().any(|(_, limit)| limit.is_some()));
        t
    }
}

/// Which keys of the root object a trace had (an exit report has `devices` and `pid`).
#[derive(Default)]
struct RootKeys {
    events: bool,
    devices: bool,
    pid: bool,
}

/// The root object: `traceEvents` read element by element, every other value skipped unread.
struct RootVisitor<'a>(&'a mut Reading);

impl<'de> serde::de::Visitor<'de> for RootVisitor<'_> {
    type Value = RootKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<RootKeys, M::Error> {
        let mut keys = RootKeys::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "traceEvents" if !keys.events => {
                    keys.events = true;
                    map.next_value_seed(EventsSeed(&mut *self.0))?;
                }
                other => {
                    keys.devices |= other == "devices";
                    keys.pid |= other == "pid";
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(keys)
    }
}

/// The `traceEvents` list, each element parsed alone and taken at once.
struct EventsSeed<'a>(&'a mut Reading);

impl<'de> serde::de::DeserializeSeed<'de> for EventsSeed<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for EventsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of trace events")
    }

    fn visit_seq<S: serde::de::SeqAccess<'de>>(self, mut seq: S) -> Result<(), S::Error> {
        while let Some(event) = seq.next_element::<Value>()? {
            self.0.take(&event);
        }
        Ok(())
    }
}

/// An allocation, free, refusal or failure as either reader found it.
struct MemoryInstant<'a> {
    ts: f64,
    /// The category (`alloc`, `free`, `denied`, `failed`, or one this version does not know).
    cat: &'a str,
    device: Option<u32>,
    bytes: u64,
    used: u64,
    address: u64,
    tid: u32,
    /// The memory kind's name (`device`, `managed`, `host_pinned`).
    memory: &'a str,
    module: &'a str,
    site: &'a str,
}

/// The parts of [`read_chrome_trace`], one per kind of event.
impl Timeline {
    /// The process's name and pid, and gpumemhook's own record (counts, end, ceilings at exit).
    fn take_metadata(&mut self, name: &str, e: &Value, args: Option<&Value>) {
        if name == "process_name" {
            self.pid = e.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
            self.command = args
                .and_then(|a| a.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
        } else if let (Some(a), "gpumemhook") = (args, name) {
            self.events = a.get("events").and_then(Value::as_u64).unwrap_or(0);
            self.dropped = a.get("dropped").and_then(Value::as_u64).unwrap_or(0);
            self.end = a.get("end").and_then(Value::as_f64);
            if let Some(labels) = a.get("labels") {
                self.info.labels = serde_json::from_value(labels.clone()).unwrap_or_default();
            }
            self.info.host = a.get("host").and_then(Value::as_str).map(str::to_string);
            self.info.wall_offset_us = a.get("wall_offset").and_then(Value::as_f64);
            for (d, v) in a
                .get("limits")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if let (Ok(d), Some(v)) = (d.parse(), v.as_u64()) {
                    self.limits.insert(d, v);
                }
            }
        }
    }

    /// A step of a device's `used` or `limit` counter.
    fn take_counter(&mut self, name: &str, ts: f64, args: Option<&Value>) {
        let Some((device, series)) = name
            .strip_prefix("device ")
            .and_then(|r| r.split_once(' '))
            .and_then(|(d, series)| Some((d.parse::<u32>().ok()?, series)))
        else {
            return;
        };
        let value = |key| args.and_then(|a| a.get(key)).and_then(Value::as_u64);
        match (series, value(series)) {
            ("used", Some(used)) => self.used.entry(device).or_default().push((ts, used)),
            ("limit", Some(limit)) => self
                .ceilings
                .entry(device)
                .or_default()
                .push((ts, (limit != 0).then_some(limit))),
            _ => {}
        }
    }

    /// A peak restart, or an allocation, free or refusal: counted, and kept as an allocation
    /// event, a module's step and a mark as it applies.
    fn take_instant(&mut self, e: &Value, ts: f64, args: Option<&Value>, keep: Keep) {
        let cat = e.get("cat").and_then(Value::as_str).unwrap_or("");
        let arg = |key| args.and_then(|a| a.get(key));
        let device = arg("device").and_then(Value::as_u64).map(|d| d as u32);
        if cat == EventKind::PeakReset.category() {
            if let Some(device) = device {
                self.peak_resets.entry(device).or_default().push(ts);
            }
            return;
        }
        let text = |key| arg(key).and_then(Value::as_str).unwrap_or("");
        self.take_memory(
            &MemoryInstant {
                ts,
                cat,
                device,
                bytes: arg("bytes").and_then(Value::as_u64).unwrap_or(0),
                used: arg("used").and_then(Value::as_u64).unwrap_or(0),
                address: u64::from_str_radix(text("address").trim_start_matches("0x"), 16)
                    .unwrap_or(0),
                tid: e.get("tid").and_then(Value::as_u64).unwrap_or(0) as u32,
                memory: arg("kind")
                    .and_then(Value::as_str)
                    .unwrap_or(MemKind::Device.name()),
                module: text("module"),
                site: text("site"),
            },
            keep,
        );
    }

    /// An allocation, free, refusal or failure (or an instant of a category this version does not
    /// know): counted by category and memory kind; of device memory, kept as an allocation event
    /// and a module's step (as `keep` says); a refusal or failure, as a mark.
    fn take_memory(&mut self, m: &MemoryInstant<'_>, keep: Keep) {
        let count = |map: &mut BTreeMap<String, u64>, key: &str| match map.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                map.insert(key.to_string(), 1);
            }
        };
        count(&mut self.counts, m.cat);
        match self.kind_counts.get_mut(m.memory) {
            Some(counts) => count(counts, m.cat),
            None => {
                let mut counts = BTreeMap::new();
                count(&mut counts, m.cat);
                self.kind_counts.insert(m.memory.to_string(), counts);
            }
        }
        let event = EventKind::of_category(m.cat);
        if let (Some(event), Some(device), true) =
            (event, m.device, m.memory == MemKind::Device.name())
        {
            if matches!(event, EventKind::Alloc | EventKind::Free)
                && !m.module.is_empty()
                && keep >= Keep::Modules
            {
                self.module_step(device, m.module, m.ts, event, m.bytes);
            }
            if keep == Keep::Everything {
                self.allocations.push(AllocationEvent {
                    ts: m.ts,
                    kind: event,
                    device,
                    bytes: m.bytes,
                    address: m.address,
                    tid: m.tid,
                    module: m.module.to_string(),
                    site: m.site.to_string(),
                });
            }
        }
        let kind = match event {
            Some(EventKind::Denied) => Some(MarkKind::Denied),
            Some(EventKind::Failed) => Some(MarkKind::Failed),
            _ => None,
        };
        if let (Some(kind), Some(device)) = (kind, m.device) {
            self.marks.push(Mark {
                kind,
                ts: m.ts,
                device,
                bytes: m.bytes,
                used: m.used,
                memory: m.memory.to_string(),
            });
        }
    }

    /// The next step of what `module` holds on `device`: an allocation or free of `bytes`.
    fn module_step(&mut self, device: u32, module: &str, ts: f64, event: EventKind, bytes: u64) {
        let modules = self.module_used.entry(device).or_default();
        if !modules.contains_key(module) {
            modules.insert(module.to_string(), Vec::new());
        }
        let Some(series) = modules.get_mut(module) else {
            return;
        };
        let before = series.last().map_or(0, |&(_, held)| held);
        let after = if event == EventKind::Alloc {
            before.saturating_add(bytes)
        } else {
            before.saturating_sub(bytes)
        };
        series.push((ts, after));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_and_memory_kinds_map_back_from_their_codes() {
        use gpumemhook_segment::layout::MemKind;
        for kind in [
            EventKind::Alloc,
            EventKind::Free,
            EventKind::Denied,
            EventKind::Failed,
            EventKind::ScopeOpen,
            EventKind::ScopeClose,
            EventKind::Ceiling,
            EventKind::PeakReset,
        ] {
            assert_eq!(EventKind::from_code(kind as u8), Some(kind));
            assert_eq!(
                EventKind::of_category(kind.category()).is_some(),
                kind.is_allocation()
            );
        }
        assert_eq!(EventKind::from_code(8), None);
        for kind in [
            EventKind::Alloc,
            EventKind::Free,
            EventKind::Denied,
            EventKind::Failed,
        ] {
            assert_eq!(EventKind::of_category(kind.category()), Some(kind));
        }
        assert_eq!(EventKind::of_category("scope"), None);
        assert_eq!(EventKind::of_category("x"), None);
        assert_eq!(EventKind::from_code(u8::MAX), None);
        for kind in [MemKind::Device, MemKind::Managed, MemKind::HostPinned] {
            assert_eq!(MemKind::from_code(kind as u8), Some(kind));
        }
        assert_eq!(MemKind::from_code(3), None);
    }

    /// A timeline in the written format, by hand: device 0 under a 4 GiB ceiling lowered to
    /// 862 MiB (where an allocation is refused) and lifted; a managed and a pinned allocation; a
    /// driver failure on device 1.
    const STEPPED: &str = r#"{"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "python3 demo.py"}},
        {"ph": "M", "name": "gpumemhook", "pid": 7,
         "args": {"limits": {"0": 4294967296}, "events": 7, "dropped": 0}},
        {"ph": "C", "name": "device 0 limit", "ts": 10.0, "pid": 7, "args": {"limit": 4294967296}},
        {"ph": "i", "s": "t", "name": "cuMemAlloc_v2", "cat": "alloc", "ts": 10.0, "pid": 7,
         "tid": 1, "args": {"device": 0, "bytes": 1048576, "used": 1048576, "address": "0x1",
         "kind": "device"}},
        {"ph": "C", "name": "device 0 used", "ts": 10.0, "pid": 7, "args": {"used": 1048576}},
        {"ph": "i", "s": "t", "name": "cuMemAllocManaged", "cat": "alloc", "ts": 11.0, "pid": 7,
         "tid": 1, "args": {"device": 0, "bytes": 4096, "used": 1048576, "address": "0x2",
         "kind": "managed"}},
        {"ph": "i", "s": "t", "name": "cuMemHostAlloc", "cat": "alloc", "ts": 12.0, "pid": 7,
         "tid": 1, "args": {"device": 0, "bytes": 64, "used": 1048576, "address": "0x3",
         "kind": "host_pinned"}},
        {"ph": "C", "name": "device 0 limit", "ts": 20.0, "pid": 7, "args": {"limit": 903872512}},
        {"ph": "i", "s": "t", "name": "cuMemAlloc_v2", "cat": "denied", "ts": 25.0, "pid": 7,
         "tid": 1, "args": {"device": 0, "bytes": 1073741824, "used": 1048576, "address": "0x0",
         "kind": "device"}},
        {"ph": "C", "name": "device 1 limit", "ts": 26.0, "pid": 7, "args": {"limit": 0}},
        {"ph": "i", "s": "t", "name": "cuMemAlloc_v2", "cat": "failed", "ts": 26.0, "pid": 7,
         "tid": 1, "args": {"device": 1, "bytes": 512, "used": 0, "address": "0x0",
         "kind": "device"}},
        {"ph": "C", "name": "device 0 limit", "ts": 30.0, "pid": 7, "args": {"limit": 0}}
    ], "displayTimeUnit": "ms"}"#;

    /// A reader that hands out at most three bytes a call, as a pipe or a slow disk may.
    struct Trickle<'a>(&'a [u8]);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(3).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_trace_read_as_it_streams_is_the_trace_read_whole() {
        let whole = read_chrome_trace(STEPPED).unwrap();
        let streamed = read_chrome_trace_from(Trickle(STEPPED.as_bytes())).unwrap();
        assert_eq!(streamed, whole);
        // Device memory only: the allocation, the refusal and the failure.
        assert_eq!(streamed.allocations.len(), 3);
        assert_eq!(streamed.ceilings[&0].len(), 3);
    }

    #[test]
    fn a_trace_reader_tells_no_timeline_from_a_broken_one() {
        let report = r#"{"pid": 7, "devices": [], "traceEvent": []}"#;
        let e = read_chrome_trace_from(report.as_bytes()).unwrap_err();
        assert!(
            e.not_a_timeline && e.to_string().contains("exit report"),
            "{e}"
        );
        let other = read_chrome_trace(r#"{"x": {"traceEvents": []}}"#).unwrap_err();
        assert!(
            other.not_a_timeline && other.to_string().contains("traceEvents"),
            "{other}"
        );
        for broken in [
            &STEPPED[..STEPPED.len() / 2],
            "[1, 2]",
            "",
            "{\"traceEvents\": 3}",
        ] {
            let e = read_chrome_trace_from(broken.as_bytes()).unwrap_err();
            assert!(!e.not_a_timeline, "{broken}: {e}");
            assert!(e.to_string().starts_with("not JSON"), "{broken}: {e}");
        }
    }

    #[test]
    fn ceiling_changes_are_steps_per_device() {
        let t = read_chrome_trace(STEPPED).unwrap();
        assert_eq!(
            t.ceilings[&0],
            vec![
                (10.0, Some(4 << 30)),
                (20.0, Some(903_872_512)),
                (30.0, None)
            ]
        );
        // Device 1's counter says 0 (none) only: it never had a ceiling, so it has no steps.
        assert!(!t.ceilings.contains_key(&1));
        // The metadata's ceilings at exit are still read as they are.
        assert_eq!(t.limits[&0], 4 << 30);
    }

    #[test]
    fn refused_and_failed_allocations_are_marks_on_the_curve() {
        let t = read_chrome_trace(STEPPED).unwrap();
        assert_eq!(
            t.marks,
            vec![
                Mark {
                    kind: MarkKind::Denied,
                    ts: 25.0,
                    device: 0,
                    bytes: 1 << 30,
                    used: 1 << 20,
                    memory: "device".into()
                },
                Mark {
                    kind: MarkKind::Failed,
                    ts: 26.0,
                    device: 1,
                    bytes: 512,
                    used: 0,
                    memory: "device".into()
                },
            ]
        );
    }

    #[test]
    fn counts_are_split_by_memory_kind() {
        let t = read_chrome_trace(STEPPED).unwrap();
        assert_eq!(t.counts["alloc"], 3);
        assert_eq!(t.count(MemKind::Device, EventKind::Alloc), 1);
        assert_eq!(t.count(MemKind::Managed, EventKind::Alloc), 1);
        assert_eq!(t.count(MemKind::HostPinned, EventKind::Alloc), 1);
        assert_eq!(t.count(MemKind::Device, EventKind::Denied), 1);
        assert_eq!(t.count(MemKind::Device, EventKind::Failed), 1);
        assert_eq!(t.count(MemKind::Managed, EventKind::Free), 0);
    }

    #[test]
    fn a_file_without_ceiling_events_falls_back_to_the_ceilings_at_exit() {
        let mut root: Value = serde_json::from_str(STEPPED).unwrap();
        let list = root["traceEvents"].as_array_mut().unwrap();
        list.retain(|e| !e["name"].as_str().unwrap().ends_with(" limit"));
        let old = root.to_string();
        assert!(!old.contains("device 0 limit"));
        let t = read_chrome_trace(&old).unwrap();
        assert_eq!(t.ceilings.len(), 1);
        assert_eq!(t.ceilings[&0], vec![(10.0, Some(4 << 30))]);
        // Without any ceiling at all there is no step.
        let none = read_chrome_trace(r#"{"traceEvents": []}"#).unwrap();
        assert!(none.ceilings.is_empty() && none.marks.is_empty());
    }
}

#[cfg(test)]
mod writer_tests {
    use super::*;
    use gpumemhook_segment::layout::MemKind;

    /// An allocation, a scope opened with a name to escape, a free, the scope closed: on device 3
    /// of thread 42, `used` near the top of its range.
    fn sample_events() -> [Event<'static>; 4] {
        let event = |kind, name, ts_ns, address| Event {
            ts_ns,
            kind,
            device: 3,
            bytes: 4096,
            used: u64::MAX - 7,
            address,
            name,
            mem: MemKind::Device,
            tid: 42,
            scope: 5,
            limit: Some(1 << 40),
            module: match kind {
                EventKind::Alloc | EventKind::Free => "libc10_cuda.so",
                _ => "",
            },
            site: match kind {
                EventKind::Alloc => "train.py:7 in \"step\"",
                _ => "",
            },
        };
        [
            event(EventKind::Alloc, "cuMemAlloc_v2", 1_000_000_007, 0),
            event(
                EventKind::ScopeOpen,
                "a \"quoted\"\\ name\n",
                1_000_000_050,
                5,
            ),
            event(
                EventKind::Free,
                "cuMemFree_v2",
                2_000_000_999,
                0xdead_beef_0000,
            ),
            event(
                EventKind::ScopeClose,
                "a \"quoted\"\\ name\n",
                3_000_000_000,
                5,
            ),
        ]
    }

    #[test]
    fn the_streamed_file_is_json_with_escaped_names_and_exact_numbers() {
        let events = sample_events();
        let mut out = Vec::new();
        write_chrome_trace(&mut out, 77, "prog --x \"y\"", &events, &BTreeMap::new(), 2).unwrap();
        let root: Value = serde_json::from_slice(&out).expect("valid JSON");
        let list = root["traceEvents"].as_array().unwrap();
        let alloc = list.iter().find(|e| e["cat"] == "alloc").unwrap();
        assert_eq!(alloc["ts"].as_f64().unwrap(), 1_000_000.007);
        assert_eq!(alloc["args"]["used"].as_u64(), Some(u64::MAX - 7));
        assert_eq!(alloc["args"]["address"], "0x0");
        assert_eq!(alloc["args"]["site"], "train.py:7 in \"step\"");
        let free = list.iter().find(|e| e["cat"] == "free").unwrap();
        assert!(free["args"].get("site").is_none(), "no site, no field");
        assert_eq!(free["args"]["address"], "0xdeadbeef0000");
        assert_eq!(free["ts"].as_f64().unwrap(), 2_000_000.999);
        let limits: Vec<_> = list
            .iter()
            .filter(|e| e["name"] == "device 3 limit")
            .collect();
        assert_eq!(limits.len(), 1, "written once while the ceiling stays");
        assert_eq!(limits[0]["args"]["limit"].as_u64(), Some(1 << 40));
        let t = read_chrome_trace(std::str::from_utf8(&out).unwrap()).unwrap();
        assert_eq!(t.command, "prog --x \"y\"");
        assert_eq!(t.scopes.len(), 1);
        assert_eq!(t.scopes[0].0, "a \"quoted\"\\ name\n");
        assert_eq!((t.events, t.dropped), (4, 2));
        assert_eq!(alloc["args"]["module"], "libc10_cuda.so");
        let kept: Vec<_> = t
            .allocations
            .iter()
            .map(|a| (a.kind, a.address, a.tid, a.module.as_str(), a.site.as_str()))
            .collect();
        assert_eq!(
            kept,
            [
                (
                    EventKind::Alloc,
                    0,
                    42,
                    "libc10_cuda.so",
                    "train.py:7 in \"step\""
                ),
                (EventKind::Free, 0xdead_beef_0000, 42, "libc10_cuda.so", ""),
            ]
        );
        assert_eq!(
            t.module_used[&3]["libc10_cuda.so"],
            vec![(1_000_000.007, 4096), (2_000_000.999, 0)]
        );
    }
}

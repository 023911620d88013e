//! The Chrome trace JSON of a timeline (`export --chrome`): its one definition, written here from
//! the event stream and read back by `crate::chrome_reader` (earlier versions wrote the timeline
//! itself in this form; those files are read the same way).
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

use gpumemhook_segment::recording::EventKind;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;

use crate::event::{Event, EventSink, UNSEEN};
use crate::timeline::RunInfo;

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

#[cfg(test)]
mod writer_tests {
    use super::*;
    use crate::chrome_reader::read_chrome_trace;
    use gpumemhook_segment::layout::MemKind;
    use serde_json::Value;

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

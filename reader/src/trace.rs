//! The timeline file (`GPUMEMHOOK_TRACE`): its one definition, written by the hook at exit and read
//! by `gpumemhook plot` and the tests.
//!
//! The file is Chrome trace JSON (`{"traceEvents": [...]}`), which Perfetto and chrome://tracing
//! open. Timestamps (`ts`) are microseconds (fractional) of `CLOCK_MONOTONIC`. Events:
//! - one counter event per allocation or free that changed a device's `used`:
//!   `{"ph": "C", "name": "device <d> used", "ts", "pid", "args": {"used": bytes}}`;
//! - a counter event whenever the ceiling in force for a device changes (and at the device's first
//!   event): `{"ph": "C", "name": "device <d> limit", "ts", "pid", "args": {"limit": bytes}}`, 0
//!   meaning no ceiling;
//! - one instant event per allocation, free, refusal or failure:
//!   `{"ph": "i", "s": "t", "name": <entry point>, "cat": "alloc" | "free" | "denied" | "failed",
//!    "ts", "pid", "tid", "args": {"device", "bytes", "used", "address", "kind"}}`;
//! - scopes opened and closed in the process, as `{"ph": "b"/"e", "cat": "scope", "id": <slot>,
//!   "name", "ts", "pid", "tid"}` async spans;
//! - metadata: `process_name`, and a `gpumemhook` event (`"ph": "M"`) whose `args` hold the ceiling
//!   per device at exit (`limits`), the number of events recorded and `dropped` (events past the
//!   buffer). It comes last: the file is written as a stream.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;

/// Environment variable: path of the timeline to write at exit (`%p` becomes the pid).
pub const TRACE_ENV: &str = "GPUMEMHOOK_TRACE";

/// What a recorded event was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum EventKind {
    Alloc = 0,
    Free = 1,
    Denied = 2,
    Failed = 3,
    ScopeOpen = 4,
    ScopeClose = 5,
}

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
    pub mem: crate::layout::MemKind,
    pub tid: u32,
    /// Scope slot for scope events.
    pub scope: u32,
    /// The ceiling of `device` in force at the event, `None` when there was none.
    pub limit: Option<u64>,
}

/// Writes a timeline one event at a time: memory stays constant whatever the number of events
/// (the hook writes millions at exit). Events may come in any order; viewers sort by `ts`.
///
/// The device-memory events of each device also give a counter track of `used` and, whenever the
/// ceiling in force differs from the one last written for that device (and at the device's first
/// event), a counter `"device <d> limit"` whose value is the ceiling in bytes, 0 meaning none.
pub struct ChromeTraceWriter<W: Write> {
    out: W,
    pid: u32,
    /// Per device: the ceiling last written (`UNSEEN` before the device's first event).
    limits_written: Vec<u64>,
    events: u64,
}

const UNSEEN: u64 = u64::MAX - 1;

impl<W: Write> ChromeTraceWriter<W> {
    /// Starts the file: the JSON preamble and the process name.
    pub fn new(mut out: W, pid: u32, command: &str) -> std::io::Result<Self> {
        out.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
        write!(
            out,
            "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"args\":{{\"name\":"
        )?;
        serde_json::to_writer(&mut out, command)?;
        out.write_all(b"}}")?;
        Ok(ChromeTraceWriter {
            out,
            pid,
            limits_written: vec![UNSEEN; crate::layout::MAX_DEVICES],
            events: 0,
        })
    }

    fn open_event(&mut self, ph: &str, ts_ns: u64) -> std::io::Result<()> {
        // Every event follows the process name written by `new`. Microseconds with three decimals, formatted from integers (no float formatting).
        write!(
            self.out,
            ",\n{{\"ph\":\"{ph}\",\"ts\":{}.{:03},\"pid\":{}",
            ts_ns / 1000,
            ts_ns % 1000,
            self.pid
        )
    }

    /// Writes one event.
    pub fn event(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        self.events += 1;
        match e.kind {
            EventKind::ScopeOpen | EventKind::ScopeClose => {
                let ph = if e.kind == EventKind::ScopeOpen { "b" } else { "e" };
                self.open_event(ph, e.ts_ns)?;
                write!(self.out, ",\"cat\":\"scope\",\"id\":{},\"tid\":{},\"name\":", e.scope, e.tid)?;
                serde_json::to_writer(&mut self.out, e.name)?;
                self.out.write_all(b"}")
            }
            kind => {
                let cat = match kind {
                    EventKind::Alloc => "alloc",
                    EventKind::Free => "free",
                    EventKind::Denied => "denied",
                    _ => "failed",
                };
                let mem = match e.mem {
                    crate::layout::MemKind::Device => "device",
                    crate::layout::MemKind::Managed => "managed",
                    crate::layout::MemKind::HostPinned => "host_pinned",
                };
                self.open_event("i", e.ts_ns)?;
                write!(self.out, ",\"s\":\"t\",\"cat\":\"{cat}\",\"tid\":{},\"name\":", e.tid)?;
                serde_json::to_writer(&mut self.out, e.name)?;
                write!(
                    self.out,
                    ",\"args\":{{\"device\":{},\"bytes\":{},\"used\":{},\"address\":\"{:#x}\",\"kind\":\"{mem}\"}}}}",
                    e.device, e.bytes, e.used, e.address
                )?;
                if e.mem != crate::layout::MemKind::Device {
                    return Ok(());
                }
                let limit = e.limit.unwrap_or(0);
                if let Some(written) = self.limits_written.get_mut(e.device as usize) {
                    if *written != limit {
                        *written = limit;
                        self.open_event("C", e.ts_ns)?;
                        write!(
                            self.out,
                            ",\"name\":\"device {} limit\",\"args\":{{\"limit\":{limit}}}}}",
                            e.device
                        )?;
                    }
                }
                if matches!(kind, EventKind::Alloc | EventKind::Free) {
                    self.open_event("C", e.ts_ns)?;
                    write!(
                        self.out,
                        ",\"name\":\"device {} used\",\"args\":{{\"used\":{}}}}}",
                        e.device, e.used
                    )?;
                }
                Ok(())
            }
        }
    }

    /// Ends the file with the summary metadata: the ceilings in force at exit, the number of
    /// events written and of events dropped (past the buffer). Returns the output, flushed.
    pub fn finish(mut self, limits: &BTreeMap<u32, u64>, dropped: u64) -> std::io::Result<W> {
        let summary = json!({"ph": "M", "name": "gpumemhook", "pid": self.pid,
            "args": {"limits": limits, "events": self.events, "dropped": dropped}});
        self.out.write_all(b",\n")?;
        serde_json::to_writer(&mut self.out, &summary)?;
        self.out.write_all(b"]}\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes `events` as Chrome trace JSON (see [`ChromeTraceWriter`]).
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
    writer.finish(limits, dropped).map(drop)
}

/// A timeline read back from a trace file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub pid: u32,
    pub command: String,
    /// Per device: `(ts in µs, used after)` in file order.
    pub used: BTreeMap<u32, Vec<(f64, u64)>>,
    /// `(name, open µs, close µs or None while still open at exit)`.
    pub scopes: Vec<(String, f64, Option<f64>)>,
    pub limits: BTreeMap<u32, u64>,
    pub events: u64,
    pub dropped: u64,
    /// Count of instant events per category (`alloc`, `free`, `denied`, `failed`).
    pub counts: BTreeMap<String, u64>,
}

/// Why a trace could not be read.
#[derive(Debug)]
pub struct TraceError(pub String);

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

/// Reads a trace file written by [`write_chrome_trace`].
pub fn read_chrome_trace(text: &str) -> Result<Timeline, TraceError> {
    let root: Value =
        serde_json::from_str(text).map_err(|e| TraceError(format!("not JSON ({e})")))?;
    let events = root
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| TraceError("no \"traceEvents\" list: not a Chrome trace".into()))?;
    let mut t = Timeline::default();
    let mut open: BTreeMap<u64, (String, f64)> = BTreeMap::new();
    for e in events {
        let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
        let name = e.get("name").and_then(Value::as_str).unwrap_or("");
        let ts = e.get("ts").and_then(Value::as_f64).unwrap_or(0.0);
        let args = e.get("args");
        match ph {
            "M" if name == "process_name" => {
                t.pid = e.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
                t.command = args
                    .and_then(|a| a.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
            }
            "M" if name == "gpumemhook" => {
                if let Some(a) = args {
                    t.events = a.get("events").and_then(Value::as_u64).unwrap_or(0);
                    t.dropped = a.get("dropped").and_then(Value::as_u64).unwrap_or(0);
                    if let Some(l) = a.get("limits").and_then(Value::as_object) {
                        for (d, v) in l {
                            if let (Ok(d), Some(v)) = (d.parse(), v.as_u64()) {
                                t.limits.insert(d, v);
                            }
                        }
                    }
                }
            }
            "C" => {
                let device = name
                    .strip_prefix("device ")
                    .and_then(|r| r.strip_suffix(" used"))
                    .and_then(|d| d.parse().ok());
                let used = args.and_then(|a| a.get("used")).and_then(Value::as_u64);
                if let (Some(d), Some(u)) = (device, used) {
                    t.used.entry(d).or_default().push((ts, u));
                }
            }
            "i" => {
                let cat = e
                    .get("cat")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                *t.counts.entry(cat).or_default() += 1;
            }
            "b" => {
                let id = e.get("id").and_then(Value::as_u64).unwrap_or(0);
                open.insert(id, (name.to_string(), ts));
            }
            "e" => {
                let id = e.get("id").and_then(Value::as_u64).unwrap_or(0);
                if let Some((n, start)) = open.remove(&id) {
                    t.scopes.push((n, start, Some(ts)));
                }
            }
            _ => {}
        }
    }
    t.scopes
        .extend(open.into_values().map(|(n, start)| (n, start, None)));
    Ok(t)
}

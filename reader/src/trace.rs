//! The timeline file (`GPUMEMHOOK_TRACE`): its one definition, written by the hook at exit and read
//! by `gpumemhook plot` and the tests.
//!
//! The file is Chrome trace JSON (`{"traceEvents": [...]}`), which Perfetto and chrome://tracing
//! open. Timestamps (`ts`) are microseconds (fractional) of `CLOCK_MONOTONIC`. Events:
//! - one counter event per allocation or free that changed a device's `used`:
//!   `{"ph": "C", "name": "device <d> used", "ts", "pid", "args": {"used": bytes}}`;
//! - one instant event per allocation, free, refusal or failure:
//!   `{"ph": "i", "s": "t", "name": <entry point>, "cat": "alloc" | "free" | "denied" | "failed",
//!    "ts", "pid", "tid", "args": {"device", "bytes", "used", "address", "kind"}}`;
//! - scopes opened and closed in the process, as `{"ph": "b"/"e", "cat": "scope", "id": <slot>,
//!   "name", "ts", "pid"}` async spans;
//! - metadata: `process_name`, and a `gpumemhook` event (`"ph": "M"`) whose `args` hold the ceiling
//!   per device (`limits`), the number of events recorded and `dropped` (events past the buffer).

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

/// One recorded event, as the hook keeps it in memory until exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub ts_ns: u64,
    pub kind: EventKind,
    pub device: u32,
    pub bytes: u64,
    /// `used` of the device right after the event.
    pub used: u64,
    pub address: u64,
    /// Entry point name (static), or the scope name.
    pub name: &'static str,
    /// Managed / pinned host / device.
    pub mem: crate::layout::MemKind,
    pub tid: u32,
    /// Scope slot for scope events.
    pub scope: u32,
}

/// Writes `events` (in recording order) as Chrome trace JSON.
pub fn write_chrome_trace(
    out: &mut impl Write,
    pid: u32,
    command: &str,
    events: &[Event],
    limits: &BTreeMap<u32, u64>,
    dropped: u64,
) -> std::io::Result<()> {
    let us = |ns: u64| ns as f64 / 1000.0;
    let mut list: Vec<Value> = Vec::with_capacity(events.len() * 2 + 2);
    list.push(json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": command}}));
    list.push(json!({"ph": "M", "name": "gpumemhook", "pid": pid,
        "args": {"limits": limits, "events": events.len(), "dropped": dropped}}));
    for e in events {
        let ts = us(e.ts_ns);
        match e.kind {
            EventKind::ScopeOpen | EventKind::ScopeClose => {
                let ph = if e.kind == EventKind::ScopeOpen {
                    "b"
                } else {
                    "e"
                };
                list.push(
                    json!({"ph": ph, "cat": "scope", "id": e.scope, "name": e.name,
                    "ts": ts, "pid": pid, "tid": e.tid}),
                );
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
                list.push(
                    json!({"ph": "i", "s": "t", "name": e.name, "cat": cat, "ts": ts,
                    "pid": pid, "tid": e.tid, "args": {"device": e.device, "bytes": e.bytes,
                    "used": e.used, "address": format!("{:#x}", e.address), "kind": mem}}),
                );
                if mem == "device" && matches!(kind, EventKind::Alloc | EventKind::Free) {
                    list.push(
                        json!({"ph": "C", "name": format!("device {} used", e.device),
                        "ts": ts, "pid": pid, "args": {"used": e.used}}),
                    );
                }
            }
        }
    }
    serde_json::to_writer(
        &mut *out,
        &json!({"traceEvents": list, "displayTimeUnit": "ms"}),
    )?;
    out.flush()
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

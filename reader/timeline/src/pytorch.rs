//! `export --pytorch`: a timeline as the snapshot PyTorch's memory viewer reads (the pickled dict
//! of `torch.cuda.memory._snapshot()`: `segments` and `device_traces`), written with serde-pickle.
//!
//! The hook sees the driver's and the runtime's allocations, not the caching allocator's blocks,
//! so each allocation is one segment holding one block: an allocation is a `segment_alloc` and an
//! `alloc` of the same address and size, a free is `free_requested`, `free_completed` and
//! `segment_free`, a refusal or a driver failure is an `oom` (with `device_free`, the room left
//! under the ceiling then, 0 without one). `segments` holds what is still allocated at the end,
//! which the viewer's views start from and walk back. Each entry's `frames` name who allocated:
//! the Python call site's frames (`GPUMEMHOOK_STACKS`), innermost first, then the module charged
//! (`filename` the shared object, `name` `<shared object>`). Only device memory is in it, as in
//! PyTorch's.
//!
//! The snapshot is made as the events come ([`PyTorchRecorder`], an [`EventSink`]). Like
//! PyTorch's own recorder (`_record_memory_history(max_entries=N)`, a ring per device), each
//! device's trace keeps its last entries only (`--entries`, 100,000 by default): the viewer cannot
//! open millions. Entries are dropped an event at a time (an allocation's two, a free's three), and
//! the trace never holds more than that many while it is made. A time window ([`TimeWindow`],
//! `--from`/`--to`) keeps only the entries of events inside it. Memory then holds the kept
//! entries, what is allocated, and one caller per call site and module (entries share it), never
//! the run's events.

use crate::event::{Event, EventSink};
use crate::timeline::Timeline;
use gpumemhook_reader::EventKind;
use gpumemhook_segment::layout::{MemKind, MAX_DEVICES};
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Write};
use std::rc::Rc;

/// One frame of a stack, as PyTorch writes it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Frame<'a> {
    pub filename: &'a str,
    pub line: u64,
    pub name: &'a str,
}

/// Who made an entry: its Python call site (`""` for none) and its module (`""` when unknown),
/// written as PyTorch's `frames`. One per call site and module, shared by the entries that name
/// them.
#[derive(Clone, Debug)]
pub struct Caller(Rc<(String, String)>);

impl Serialize for Caller {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (site, module) = &*self.0;
        let frames = site_frames(site);
        let module = (!module.is_empty()).then(|| Frame {
            filename: module,
            line: 0,
            name: "<shared object>",
        });
        let mut seq =
            serializer.serialize_seq(Some(frames.len() + usize::from(module.is_some())))?;
        for frame in frames.iter().chain(&module) {
            seq.serialize_element(frame)?;
        }
        seq.end()
    }
}

/// One action of the allocator, as `device_traces` holds it.
#[derive(Debug, Serialize)]
pub struct TraceEntry {
    pub action: &'static str,
    /// Absent for `oom`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    pub size: u64,
    pub stream: u64,
    pub time_us: i64,
    pub frames: Caller,
    /// Only for `oom`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
}

/// A piece of a segment: here, the whole of it.
#[derive(Debug, Serialize)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: &'static str,
    pub frames: Caller,
}

/// Memory one allocation call returned, still held at the end.
#[derive(Debug, Serialize)]
pub struct Segment {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    pub segment_type: &'static str,
    pub segment_pool_id: (u64, u64),
    pub is_expandable: bool,
    pub frames: Caller,
    pub blocks: Vec<Block>,
}

/// The pickled dict.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    /// Indexed by device, each its last entries.
    pub device_traces: Vec<VecDeque<TraceEntry>>,
}

/// The entries PyTorch's memory viewer is given per device unless `--entries` says otherwise.
pub const DEFAULT_PYTORCH_ENTRIES: usize = 100_000;

/// The time whose events' entries are kept: nanoseconds since the timeline's first event (as
/// `plot --from`/`--to` count), each end included; `None` for no bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeWindow {
    pub from_ns: Option<u64>,
    pub to_ns: Option<u64>,
}

impl TimeWindow {
    fn holds(&self, since_first_ns: u64) -> bool {
        self.from_ns.is_none_or(|from| since_first_ns >= from)
            && self.to_ns.is_none_or(|to| since_first_ns <= to)
    }
}

/// The entries a snapshot left out: older than each device's last `--entries`, or of events
/// outside the time window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeftOut {
    pub older: u64,
    pub outside: u64,
}

/// Appends `entry` to `trace`, keeping at most `max` entries: the oldest events' entries go.
fn push_kept(trace: &mut VecDeque<TraceEntry>, entry: TraceEntry, max: usize, left: &mut u64) {
    trace.push_back(entry);
    if trace.len() <= max {
        return;
    }
    while trace.len() > max
        || trace
            .front()
            .is_some_and(|e| !matches!(e.action, "segment_alloc" | "free_requested" | "oom"))
    {
        trace.pop_front();
        *left += 1;
    }
}

/// The frames of a Python call site (`file:line in function < file:line in caller < ...`),
/// innermost first; a part that does not read so is one frame named by its text.
pub fn site_frames(site: &str) -> Vec<Frame<'_>> {
    if site.is_empty() {
        return Vec::new();
    }
    site.split(" < ")
        .map(|part| {
            let parsed = part.rsplit_once(" in ").and_then(|(at, function)| {
                let (file, line) = at.rsplit_once(':')?;
                Some(Frame {
                    filename: file,
                    line: line.parse().ok()?,
                    name: function,
                })
            });
            parsed.unwrap_or(Frame {
                filename: "",
                line: 0,
                name: part,
            })
        })
        .collect()
}

/// One device-memory event as the snapshot takes it.
pub struct Taken<'a> {
    pub kind: EventKind,
    pub device: u32,
    pub bytes: u64,
    pub address: u64,
    pub ts_ns: u64,
    /// The ceiling in force then.
    pub limit: Option<u64>,
    pub site: &'a str,
    pub module: &'a str,
}

/// Makes the snapshot as device-memory events come, in time order.
pub struct PyTorchRecorder {
    max: usize,
    window: TimeWindow,
    /// The time of the first event (ns): what the window counts from.
    first_ns: Option<u64>,
    traces: Vec<VecDeque<TraceEntry>>,
    /// What each device holds: per (device, address), the size and who allocated it.
    live: BTreeMap<(u32, u64), (u64, Caller)>,
    /// Per device, the bytes its live allocations hold.
    held: BTreeMap<u32, u64>,
    /// One caller per call site and module.
    callers: HashMap<String, HashMap<String, Caller>>,
    left: LeftOut,
}

impl PyTorchRecorder {
    /// Keeps each device's last `max` entries of the events inside `window`.
    pub fn new(max: usize, window: TimeWindow) -> PyTorchRecorder {
        PyTorchRecorder {
            max,
            window,
            first_ns: None,
            traces: Vec::new(),
            live: BTreeMap::new(),
            held: BTreeMap::new(),
            callers: HashMap::new(),
            left: LeftOut::default(),
        }
    }

    /// The timeline's first event is at `ts_ns` (the first call counts).
    pub fn first_event(&mut self, ts_ns: u64) {
        self.first_ns.get_or_insert(ts_ns);
    }

    fn caller(&mut self, site: &str, module: &str) -> Caller {
        if let Some(caller) = self.callers.get(site).and_then(|m| m.get(module)) {
            return caller.clone();
        }
        let caller = Caller(Rc::new((site.to_string(), module.to_string())));
        let modules = self.callers.entry(site.to_string()).or_default();
        modules.insert(module.to_string(), caller.clone());
        caller
    }

    /// Takes one event: what is allocated follows every event; the trace, those in the window.
    pub fn take(&mut self, e: &Taken<'_>) {
        if e.device as usize >= MAX_DEVICES {
            return;
        }
        let device = e.device as usize;
        if self.traces.len() <= device {
            self.traces.resize_with(device + 1, VecDeque::new);
        }
        let since_first = e
            .ts_ns
            .saturating_sub(*self.first_ns.get_or_insert(e.ts_ns));
        let kept = self.window.holds(since_first);
        let held = self.held.entry(e.device).or_default();
        let (actions, addr, size, caller, device_free): (&[&'static str], _, _, _, _) = match e.kind
        {
            EventKind::Alloc => {
                *held += e.bytes;
                let caller = self.caller(e.site, e.module);
                let entry = (e.bytes, caller.clone());
                self.live.insert((e.device, e.address), entry);
                (
                    &["segment_alloc", "alloc"],
                    Some(e.address),
                    e.bytes,
                    caller,
                    None,
                )
            }
            EventKind::Free => {
                let (size, caller) = match self.live.remove(&(e.device, e.address)) {
                    Some(freed) => freed,
                    None => (e.bytes, self.caller(e.site, e.module)),
                };
                let held = self.held.entry(e.device).or_default();
                *held = held.saturating_sub(size);
                let actions = &["free_requested", "free_completed", "segment_free"];
                (actions, Some(e.address), size, caller, None)
            }
            EventKind::Denied | EventKind::Failed => {
                let free = e.limit.map_or(0, |c| c.saturating_sub(*held));
                let caller = self.caller(e.site, e.module);
                (&["oom"], None, e.bytes, caller, Some(free))
            }
            _ => return,
        };
        if !kept {
            self.left.outside += actions.len() as u64;
            return;
        }
        let time_us = (e.ts_ns as f64 / 1000.0).round() as i64;
        for &action in actions {
            let entry = TraceEntry {
                action,
                addr,
                size,
                stream: 0,
                time_us,
                frames: caller.clone(),
                device_free,
            };
            push_kept(
                &mut self.traces[device],
                entry,
                self.max,
                &mut self.left.older,
            );
        }
    }

    /// The snapshot, and the entries it left out.
    pub fn finish(self) -> (Snapshot, LeftOut) {
        let segments = self
            .live
            .into_iter()
            .map(|((device, address), (size, frames))| Segment {
                device,
                address,
                total_size: size,
                allocated_size: size,
                active_size: size,
                requested_size: size,
                stream: 0,
                segment_type: if size > 1 << 20 { "large" } else { "small" },
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: frames.clone(),
                blocks: vec![Block {
                    address,
                    size,
                    requested_size: size,
                    state: "active_allocated",
                    frames,
                }],
            })
            .collect();
        let snapshot = Snapshot {
            segments,
            device_traces: self.traces,
        };
        (snapshot, self.left)
    }

    /// Writes the pickled snapshot to `out`; returns the entries it left out.
    pub fn write(self, mut out: &mut dyn Write) -> io::Result<LeftOut> {
        let (snapshot, left) = self.finish();
        serde_pickle::to_writer(&mut out, &snapshot, serde_pickle::SerOptions::new())
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(left)
    }
}

impl EventSink for PyTorchRecorder {
    fn event(&mut self, e: &Event<'_>) -> io::Result<()> {
        let device_memory = e.mem == MemKind::Device;
        // The first event as `plot` counts time from: a change of `used`, a scope, a refusal.
        let first = match e.kind {
            EventKind::Alloc | EventKind::Free => device_memory,
            EventKind::Denied | EventKind::Failed => true,
            EventKind::ScopeOpen | EventKind::ScopeClose => true,
            EventKind::Ceiling | EventKind::PeakReset => false,
        };
        if first {
            self.first_event(e.ts_ns);
        }
        if device_memory {
            self.take(&Taken {
                kind: e.kind,
                device: e.device,
                bytes: e.bytes,
                address: e.address,
                ts_ns: e.ts_ns,
                limit: e.limit,
                site: e.site,
                module: e.module,
            });
        }
        Ok(())
    }

    fn ceiling_step(&mut self, _: u64, _: u32, _: Option<u64>) -> io::Result<()> {
        Ok(())
    }
}

/// The ceiling of `device` in force at `ts`, if any.
fn ceiling_at(t: &Timeline, device: u32, ts: f64) -> Option<u64> {
    let steps = t.ceilings.get(&device)?;
    let step = steps
        .iter()
        .filter(|s| s.0 <= ts)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    step?.1
}

/// The snapshot of `t` (a timeline read whole: one of an earlier version's Chrome JSON): its
/// allocations in time order through a [`PyTorchRecorder`].
#[cfg(test)]
pub fn snapshot(t: &Timeline, max: usize, window: TimeWindow) -> (Snapshot, LeftOut) {
    recorder_of(t, max, window).finish()
}

fn recorder_of(t: &Timeline, max: usize, window: TimeWindow) -> PyTorchRecorder {
    let mut recorder = PyTorchRecorder::new(max, window);
    if let Some((first, _)) = crate::replay::time_span(t) {
        recorder.first_event(crate::perfetto::ns(first));
    }
    let mut events: Vec<_> = t.allocations.iter().collect();
    events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    for e in events {
        recorder.take(&Taken {
            kind: e.kind,
            device: e.device,
            bytes: e.bytes,
            address: e.address,
            ts_ns: crate::perfetto::ns(e.ts),
            limit: ceiling_at(t, e.device, e.ts),
            site: &e.site,
            module: &e.module,
        });
    }
    recorder
}

/// Writes the pickled snapshot of `t` to `out`, each device's last `max` trace entries of the
/// events in `window`; returns the entries left out.
pub fn write_pytorch(
    t: &Timeline,
    max: usize,
    window: TimeWindow,
    out: &mut dyn Write,
) -> io::Result<LeftOut> {
    recorder_of(t, max, window).write(out)
}

/// Writes the pickled snapshot of the recording at `path` to `out`, made as the recording is
/// read (each device's last `max` entries of the events in `window`); returns the entries left
/// out.
pub fn write_recording_as_pytorch(
    path: &std::path::Path,
    max: usize,
    window: TimeWindow,
    out: &mut dyn Write,
) -> Result<LeftOut, crate::error::TraceError> {
    let recording = crate::recording::Recording::open(path)?;
    let mut recorder = PyTorchRecorder::new(max, window);
    recording.replay(&mut recorder)?;
    recorder.write(out).map_err(|e| {
        crate::error::TraceError::broken(format!("cannot write the PyTorch snapshot: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::AllocationEvent;
    use serde_pickle::{HashableValue as K, Value};

    fn event(ts: f64, kind: EventKind, device: u32, bytes: u64, address: u64) -> AllocationEvent {
        AllocationEvent {
            ts,
            kind,
            device,
            bytes,
            address,
            tid: 1,
            module: "libtorch_cuda.so".into(),
            site: "train.py:12 in step < train.py:40 in <module>".into(),
        }
    }

    /// Device 1: a and b allocated, a freed, a refusal under a 4 MiB ceiling; b held at the end.
    fn timeline() -> Timeline {
        let mut t = Timeline::default();
        t.used.insert(1, vec![]);
        t.ceilings.insert(1, vec![(0.0, Some(4 << 20))]);
        t.allocations = vec![
            event(1.0, EventKind::Alloc, 1, 1 << 20, 0x1000),
            event(2.0, EventKind::Alloc, 1, 2 << 20, 0x9000_0000),
            event(3.0, EventKind::Free, 1, 1 << 20, 0x1000),
            event(4.0, EventKind::Denied, 1, 8 << 20, 0),
        ];
        t
    }

    fn get<'v>(v: &'v Value, key: &str) -> &'v Value {
        let Value::Dict(d) = v else {
            panic!("not a dict: {v:?}")
        };
        &d[&K::String(key.into())]
    }

    fn list(v: &Value) -> &[Value] {
        match v {
            Value::List(l) => l,
            other => panic!("not a list: {other:?}"),
        }
    }

    #[test]
    fn the_pickle_has_the_documented_structure() {
        let mut bytes = Vec::new();
        assert_eq!(
            write_pytorch(
                &timeline(),
                DEFAULT_PYTORCH_ENTRIES,
                TimeWindow::default(),
                &mut bytes
            )
            .unwrap(),
            LeftOut::default()
        );
        let v = serde_pickle::value_from_slice(&bytes, Default::default()).unwrap();
        let traces = list(get(&v, "device_traces"));
        assert_eq!(traces.len(), 2, "indexed by device");
        assert!(list(&traces[0]).is_empty());
        let actions: Vec<&Value> = list(&traces[1]).iter().map(|e| get(e, "action")).collect();
        let names = [
            "segment_alloc",
            "alloc",
            "segment_alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "segment_free",
            "oom",
        ];
        assert_eq!(
            actions,
            names
                .map(|n| Value::String(n.into()))
                .iter()
                .collect::<Vec<_>>()
        );
        let first = &list(&traces[1])[1];
        assert_eq!(get(first, "addr"), &Value::I64(0x1000));
        assert_eq!(get(first, "size"), &Value::I64(1 << 20));
        assert_eq!(get(first, "time_us"), &Value::I64(1));
        let frames = list(get(first, "frames"));
        assert_eq!(
            get(&frames[0], "filename"),
            &Value::String("train.py".into())
        );
        assert_eq!(get(&frames[0], "line"), &Value::I64(12));
        assert_eq!(
            get(&frames[2], "filename"),
            &Value::String("libtorch_cuda.so".into())
        );
        let oom = list(&traces[1]).last().unwrap();
        // 4 MiB ceiling, 2 MiB held.
        assert_eq!(get(oom, "device_free"), &Value::I64(2 << 20));
        let segments = list(get(&v, "segments"));
        assert_eq!(segments.len(), 1, "b is held at the end");
        assert_eq!(get(&segments[0], "address"), &Value::I64(0x9000_0000));
        let block = &list(get(&segments[0], "blocks"))[0];
        assert_eq!(
            get(block, "state"),
            &Value::String("active_allocated".into())
        );
    }

    #[test]
    fn each_device_keeps_its_last_entries_an_event_at_a_time() {
        let actions = |max| {
            let t = timeline();
            let (s, left) = snapshot(&t, max, TimeWindow::default());
            let kept: Vec<&str> = s.device_traces[1].iter().map(|e| e.action).collect();
            (kept, left.older)
        };
        // 8 entries: two allocations (2 each), a free (3), a refusal (1).
        assert_eq!(actions(8).1, 0);
        assert_eq!(
            actions(4),
            (
                vec!["free_requested", "free_completed", "segment_free", "oom"],
                4
            )
        );
        // Three would cut the free: it goes whole.
        assert_eq!(actions(3), (vec!["oom"], 7));
        // What is held at the end is whole whatever the trace keeps.
        assert_eq!(
            snapshot(&timeline(), 1, TimeWindow::default())
                .0
                .segments
                .len(),
            1
        );
    }

    #[test]
    fn a_time_window_keeps_the_entries_of_the_events_inside_it() {
        // From 1 µs to 2 µs after the first event (at 1 µs): b's allocation and a's free.
        let window = TimeWindow {
            from_ns: Some(1_000),
            to_ns: Some(2_000),
        };
        let (s, left) = snapshot(&timeline(), DEFAULT_PYTORCH_ENTRIES, window);
        let kept: Vec<(&str, i64)> = s.device_traces[1]
            .iter()
            .map(|e| (e.action, e.time_us))
            .collect();
        assert_eq!(
            kept,
            [
                ("segment_alloc", 2),
                ("alloc", 2),
                ("free_requested", 3),
                ("free_completed", 3),
                ("segment_free", 3)
            ]
        );
        // a's allocation (2 entries) and the refusal (1) were outside.
        assert_eq!(
            left,
            LeftOut {
                older: 0,
                outside: 3
            }
        );
        // What is held at the end is whole whatever the window.
        assert_eq!(s.segments.len(), 1);
        // A window that ends before the refusal still knows the bytes held then: b's.
        let early = TimeWindow {
            from_ns: None,
            to_ns: Some(500),
        };
        let (s, left) = snapshot(&timeline(), DEFAULT_PYTORCH_ENTRIES, early);
        assert_eq!(s.device_traces[1].len(), 2);
        assert_eq!(left.outside, 6);
    }

    #[test]
    fn a_site_reads_as_frames_innermost_first() {
        assert_eq!(
            site_frames("a.py:3 in f < b.py:9 in <module>"),
            [
                Frame {
                    filename: "a.py",
                    line: 3,
                    name: "f"
                },
                Frame {
                    filename: "b.py",
                    line: 9,
                    name: "<module>"
                },
            ]
        );
        let odd = "no Python frame, thread 'loader'";
        assert_eq!(
            site_frames(odd),
            [Frame {
                filename: "",
                line: 0,
                name: odd
            }]
        );
        assert!(site_frames("").is_empty());
    }
}

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
//! Like PyTorch's own recorder (`_record_memory_history(max_entries=N)`, a ring per device), each
//! device's trace keeps its last entries only (`--entries`, 100,000 by default): the viewer cannot
//! open millions. Entries are dropped an event at a time (an allocation's two, a free's three), and
//! the trace never holds more than that many while it is made.

use crate::timeline::{AllocationEvent, Timeline};
use gpumemhook_reader::EventKind;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Write};

/// One frame of a stack, as PyTorch writes it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Frame<'a> {
    pub filename: &'a str,
    pub line: u64,
    pub name: &'a str,
}

/// One action of the allocator, as `device_traces` holds it.
#[derive(Debug, Serialize)]
pub struct TraceEntry<'a> {
    pub action: &'static str,
    /// Absent for `oom`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    pub size: u64,
    pub stream: u64,
    pub time_us: i64,
    pub frames: Vec<Frame<'a>>,
    /// Only for `oom`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
}

/// A piece of a segment: here, the whole of it.
#[derive(Debug, Serialize)]
pub struct Block<'a> {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: &'static str,
    pub frames: Vec<Frame<'a>>,
}

/// Memory one allocation call returned, still held at the end.
#[derive(Debug, Serialize)]
pub struct Segment<'a> {
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
    pub frames: Vec<Frame<'a>>,
    pub blocks: Vec<Block<'a>>,
}

/// The pickled dict.
#[derive(Debug, Serialize)]
pub struct Snapshot<'a> {
    pub segments: Vec<Segment<'a>>,
    /// Indexed by device, each its last entries.
    pub device_traces: Vec<VecDeque<TraceEntry<'a>>>,
}

/// The entries PyTorch's memory viewer is given per device unless `--entries` says otherwise.
pub const DEFAULT_PYTORCH_ENTRIES: usize = 100_000;

/// Appends `entry` to `trace`, keeping at most `max` entries: the oldest events' entries go.
fn push_kept<'a>(
    trace: &mut VecDeque<TraceEntry<'a>>,
    entry: TraceEntry<'a>,
    max: usize,
    left: &mut u64,
) {
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

/// Who made `e`: its call site's frames, then its module.
fn frames(e: &AllocationEvent) -> Vec<Frame<'_>> {
    let mut frames = site_frames(&e.site);
    if !e.module.is_empty() {
        frames.push(Frame {
            filename: &e.module,
            line: 0,
            name: "<shared object>",
        });
    }
    frames
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

fn entry<'a>(
    action: &'static str,
    addr: u64,
    size: u64,
    ts: f64,
    frames: &[Frame<'a>],
) -> TraceEntry<'a> {
    TraceEntry {
        action,
        addr: Some(addr),
        size,
        stream: 0,
        time_us: ts.round() as i64,
        frames: frames.to_vec(),
        device_free: None,
    }
}

/// The snapshot of `t`: its allocations replayed in time order, each device's last `max` trace
/// entries kept; and how many older entries were left out.
pub fn snapshot(t: &Timeline, max: usize) -> (Snapshot<'_>, u64) {
    let mut events: Vec<&AllocationEvent> = t.allocations.iter().collect();
    events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    let devices = t.used.keys().chain(t.allocations.iter().map(|e| &e.device));
    let count = devices.max().map_or(0, |&d| d as usize + 1);
    let mut traces: Vec<VecDeque<TraceEntry>> = (0..count).map(|_| VecDeque::new()).collect();
    let mut left = 0;
    // What each device holds: per (device, address), the size and who allocated it.
    let mut live: BTreeMap<(u32, u64), (u64, Vec<Frame>)> = BTreeMap::new();
    let mut used: BTreeMap<u32, u64> = BTreeMap::new();
    for e in events {
        let trace = &mut traces[e.device as usize];
        let held = used.entry(e.device).or_default();
        match e.kind {
            EventKind::Alloc => {
                let frames = frames(e);
                for action in ["segment_alloc", "alloc"] {
                    let made = entry(action, e.address, e.bytes, e.ts, &frames);
                    push_kept(trace, made, max, &mut left);
                }
                *held += e.bytes;
                live.insert((e.device, e.address), (e.bytes, frames));
            }
            EventKind::Free => {
                let (size, frames) = live
                    .remove(&(e.device, e.address))
                    .unwrap_or_else(|| (e.bytes, frames(e)));
                for action in ["free_requested", "free_completed", "segment_free"] {
                    let made = entry(action, e.address, size, e.ts, &frames);
                    push_kept(trace, made, max, &mut left);
                }
                *held = held.saturating_sub(size);
            }
            EventKind::Denied | EventKind::Failed => {
                let oom = TraceEntry {
                    addr: None,
                    device_free: Some(
                        ceiling_at(t, e.device, e.ts).map_or(0, |c| c.saturating_sub(*held)),
                    ),
                    ..entry("oom", 0, e.bytes, e.ts, &frames(e))
                };
                push_kept(trace, oom, max, &mut left);
            }
            _ => {}
        }
    }
    let segments = live
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
        device_traces: traces,
    };
    (snapshot, left)
}

/// Writes the pickled snapshot of `t` to `out`, each device's last `max` trace entries; returns
/// how many older entries were left out.
pub fn write_pytorch(t: &Timeline, max: usize, mut out: &mut dyn Write) -> io::Result<u64> {
    let (snapshot, left) = snapshot(t, max);
    serde_pickle::to_writer(&mut out, &snapshot, serde_pickle::SerOptions::new())
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;
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
            write_pytorch(&timeline(), DEFAULT_PYTORCH_ENTRIES, &mut bytes).unwrap(),
            0
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
            let (s, left) = snapshot(&t, max);
            let kept: Vec<&str> = s.device_traces[1].iter().map(|e| e.action).collect();
            (kept, left)
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
        assert_eq!(snapshot(&timeline(), 1).0.segments.len(), 1);
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

//! `export --perfetto`: a timeline as Perfetto's own protobuf trace (a `Trace` of `TracePacket`s),
//! written one packet at a time as the events come ([`PerfettoWriter`], an [`EventSink`]): memory
//! holds the tracks and the scopes not yet placed, never the run. The messages are Perfetto's own:
//! its `.proto` files, vendored in `reader/timeline/proto/` trimmed to the fields written here,
//! generated once by prost-build into `crate::perfetto_protos` (`scripts/build/perfetto-protos`),
//! so that no field number or enum value is copied by hand.
//!
//! What it holds: one process track (pid, command, job labels; the rank in its name), and under
//! it a counter track per device of `used`, of the ceiling (0 for none) and of each module's
//! bytes; scopes as slices, on as many tracks ("lanes") as overlapping scopes need (a scope inside
//! another stays on its lane, nested: `crate::scope_lanes`); refusals, driver failures and peak
//! restarts as instant events on a track of their device. Every packet is of one sequence; the
//! first clears its incremental state (none is used: no interning), and each track's descriptor
//! is written when the track is first needed, before any event on it. Packets of different tracks
//! are not in time order (a scope's slice is written once its lane is known), which Perfetto's
//! trace processor sorts. Timestamps are nanoseconds of `CLOCK_MONOTONIC`.

use crate::error::TraceError;
use crate::event::{Event, EventSink, UNSEEN};
use crate::recording::{Ending, Recording};
use crate::scope_lanes::{in_time_order, LaneAction, Lanes};
use crate::timeline::{MarkKind, RunInfo, Timeline};
use gpumemhook_segment::layout::{MemKind, MAX_SCOPES};
use gpumemhook_segment::recording::EventKind;
#[cfg(test)]
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::Path;

#[cfg(test)]
use crate::perfetto_protos::Trace;
use crate::perfetto_protos::{
    counter_descriptor, debug_annotation, trace_packet, track_descriptor, track_event,
    CounterDescriptor, DebugAnnotation, ProcessDescriptor, TracePacket, TrackDescriptor,
    TrackEvent,
};
use trace_packet::{Data, OptionalTrustedPacketSequenceId};

const TYPE_SLICE_BEGIN: i32 = track_event::Type::SliceBegin as i32;
const TYPE_SLICE_END: i32 = track_event::Type::SliceEnd as i32;
const TYPE_INSTANT: i32 = track_event::Type::Instant as i32;
const TYPE_COUNTER: i32 = track_event::Type::Counter as i32;
const UNIT_SIZE_BYTES: i32 = counter_descriptor::Unit::SizeBytes as i32;
const SEQ_INCREMENTAL_STATE_CLEARED: u32 =
    trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32;
/// The one sequence every packet is written on.
const SEQUENCE: u32 = 1;

/// A timeline's time (µs, `f64`) as Perfetto's (ns, `u64`); a negative time becomes 0.
pub fn ns(us: f64) -> u64 {
    (us * 1000.0).round() as u64
}

/// Writes the packets of a trace: each is field 1 of `Trace`, so their concatenation is the file.
struct Packets<'a> {
    out: &'a mut dyn Write,
    buf: Vec<u8>,
    written: u64,
}

impl Packets<'_> {
    fn put(&mut self, timestamp: Option<u64>, data: Data) -> io::Result<()> {
        let first = self.written == 0;
        let packet = TracePacket {
            timestamp,
            optional_trusted_packet_sequence_id: Some(
                OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(SEQUENCE),
            ),
            sequence_flags: first.then_some(SEQ_INCREMENTAL_STATE_CLEARED),
            first_packet_on_sequence: first.then_some(true),
            data: Some(data),
        };
        self.buf.clear();
        prost::encoding::message::encode(1, &packet, &mut self.buf);
        self.written += 1;
        self.out.write_all(&self.buf)
    }

    fn track(&mut self, descriptor: TrackDescriptor) -> io::Result<()> {
        self.put(None, Data::TrackDescriptor(descriptor))
    }

    fn event(&mut self, ts_ns: u64, event: TrackEvent) -> io::Result<()> {
        self.put(Some(ts_ns), Data::TrackEvent(event))
    }

    fn counter(&mut self, track: u64, ts_ns: u64, value: u64) -> io::Result<()> {
        self.event(
            ts_ns,
            TrackEvent {
                r#type: Some(TYPE_COUNTER),
                track_uuid: Some(track),
                counter_value_field: Some(track_event::CounterValueField::CounterValue(
                    i64::try_from(value).unwrap_or(i64::MAX),
                )),
                ..Default::default()
            },
        )
    }
}

/// The name of the process's track: its command without the program's directory (the track's
/// command line keeps it), and its rank when it has one.
fn process_name(command: &str, info: &RunInfo) -> String {
    let (program, rest) = command.split_once(' ').unwrap_or((command, ""));
    let program = program.rsplit('/').next().unwrap_or(program);
    let command = format!("{program} {rest}");
    let command = command.trim_end();
    match &info.labels.rank {
        Some(rank) => format!("{command} (rank {rank})"),
        None => command.to_string(),
    }
}

/// A counter track of bytes under the process's track.
fn bytes_track(uuid: u64, parent: u64, name: String, device: u32) -> TrackDescriptor {
    TrackDescriptor {
        uuid: Some(uuid),
        parent_uuid: Some(parent),
        static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(name)),
        counter: Some(CounterDescriptor {
            unit: Some(UNIT_SIZE_BYTES),
            y_axis_share_key: Some(format!("device {device}")),
        }),
        ..Default::default()
    }
}

/// A track of slices or instants under the process's track.
fn slice_track(uuid: u64, parent: u64, name: String) -> TrackDescriptor {
    TrackDescriptor {
        uuid: Some(uuid),
        parent_uuid: Some(parent),
        static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(name)),
        ..Default::default()
    }
}

/// A device's ceiling track: the step last taken, and the track once the device has had a
/// ceiling (a device that never had one has none: viewers would draw a ceiling of 0 bytes).
struct CeilingTrack {
    taken: u64,
    track: Option<u64>,
    /// The device's first step, of no ceiling: where its counter starts at 0 once it has one.
    none_since: Option<u64>,
}

/// Writes a Perfetto trace as the timeline's events come, in time order, each track described
/// when first needed. Memory holds one entry per track (devices, modules, scope lanes) and the
/// scopes not yet on a lane (`crate::scope_lanes`): not the events.
pub struct PerfettoWriter<'a> {
    packets: Packets<'a>,
    /// The process's track; the others are numbered after it, under the pid in the high bits so
    /// that two processes' traces never share one.
    process: u64,
    next_uuid: u64,
    used: BTreeMap<u32, u64>,
    ceilings: BTreeMap<u32, CeilingTrack>,
    /// Per device and module: its track and the bytes it holds.
    modules: BTreeMap<u32, HashMap<String, (u64, u64)>>,
    instants: BTreeMap<u32, u64>,
    lanes: Lanes,
    lane_tracks: Vec<u64>,
    /// The latest time seen (ns): where scopes still open at the end close.
    last_ns: u64,
}

impl<'a> PerfettoWriter<'a> {
    /// Starts the trace with the process's track.
    pub fn new(
        out: &'a mut dyn Write,
        pid: u32,
        command: &str,
        info: &RunInfo,
    ) -> io::Result<Self> {
        let process = u64::from(pid) << 32;
        let mut packets = Packets {
            out,
            buf: Vec::new(),
            written: 0,
        };
        packets.track(TrackDescriptor {
            uuid: Some(process),
            process: Some(ProcessDescriptor {
                pid: Some(pid as i32),
                cmdline: vec![command.to_string()],
                process_name: Some(process_name(command, info)),
                process_labels: info
                    .labels
                    .pairs()
                    .map(|(label, value)| format!("{label}={value}"))
                    .collect(),
            }),
            ..Default::default()
        })?;
        Ok(PerfettoWriter {
            packets,
            process,
            next_uuid: process,
            used: BTreeMap::new(),
            ceilings: BTreeMap::new(),
            modules: BTreeMap::new(),
            instants: BTreeMap::new(),
            lanes: Lanes::default(),
            lane_tracks: Vec::new(),
            last_ns: 0,
        })
    }

    fn uuid(&mut self) -> u64 {
        self.next_uuid += 1;
        self.next_uuid
    }

    /// Time has come to `ts_ns`: scopes that opened before it may be put on their lanes.
    fn advance(&mut self, ts_ns: u64) -> io::Result<()> {
        self.last_ns = self.last_ns.max(ts_ns);
        self.lanes.advance(ts_ns);
        self.write_lanes()
    }

    /// `used` of `device` after a change.
    fn used(&mut self, device: u32, ts_ns: u64, used: u64) -> io::Result<()> {
        let track = match self.used.get(&device) {
            Some(&track) => track,
            None => {
                let track = self.uuid();
                let name = format!("device {device} used");
                let descriptor = bytes_track(track, self.process, name, device);
                self.packets.track(descriptor)?;
                self.used.insert(device, track);
                track
            }
        };
        self.packets.counter(track, ts_ns, used)
    }

    /// The ceiling of `device` in force from `ts_ns`, written where it differs from the last.
    fn ceiling(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) -> io::Result<()> {
        let limit = limit.unwrap_or(0);
        let state = self.ceilings.entry(device).or_insert(CeilingTrack {
            taken: UNSEEN,
            track: None,
            none_since: None,
        });
        if std::mem::replace(&mut state.taken, limit) == limit {
            return Ok(());
        }
        if let Some(track) = state.track {
            return self.packets.counter(track, ts_ns, limit);
        }
        if limit == 0 {
            state.none_since.get_or_insert(ts_ns);
            return Ok(());
        }
        let none_since = state.none_since.take();
        let track = self.uuid();
        if let Some(state) = self.ceilings.get_mut(&device) {
            state.track = Some(track);
        }
        let name = format!("device {device} ceiling");
        let mut descriptor = bytes_track(track, self.process, name, device);
        descriptor.description = Some("the allocation ceiling in force; 0: none".into());
        self.packets.track(descriptor)?;
        if let Some(since) = none_since {
            self.packets.counter(track, since, 0)?;
        }
        self.packets.counter(track, ts_ns, limit)
    }

    /// What `module` holds on `device` after a change.
    fn module_held(&mut self, device: u32, module: &str, ts_ns: u64, held: u64) -> io::Result<()> {
        let track = self.module_track(device, module)?;
        if let Some(entry) = self
            .modules
            .get_mut(&device)
            .and_then(|m| m.get_mut(module))
        {
            entry.1 = held;
        }
        self.packets.counter(track, ts_ns, held)
    }

    /// The track of `module` on `device`, described when first needed.
    fn module_track(&mut self, device: u32, module: &str) -> io::Result<u64> {
        if let Some(&(track, _)) = self.modules.get(&device).and_then(|m| m.get(module)) {
            return Ok(track);
        }
        let track = self.uuid();
        let name = format!("device {device} {module}");
        self.packets
            .track(bytes_track(track, self.process, name, device))?;
        let modules = self.modules.entry(device).or_default();
        modules.insert(module.to_string(), (track, 0));
        Ok(track)
    }

    /// An allocation or free of `bytes` charged to `module`.
    fn module_step(&mut self, e: &Event<'_>) -> io::Result<()> {
        let held = self
            .modules
            .get(&e.device)
            .and_then(|m| m.get(e.module))
            .map_or(0, |&(_, held)| held);
        let held = match e.kind {
            EventKind::Alloc => held.saturating_add(e.bytes),
            _ => held.saturating_sub(e.bytes),
        };
        self.module_held(e.device, e.module, e.ts_ns, held)
    }

    /// The instants' track of `device`, described when first needed.
    fn instant_track(&mut self, device: u32) -> io::Result<u64> {
        if let Some(&track) = self.instants.get(&device) {
            return Ok(track);
        }
        let track = self.uuid();
        let name = format!("device {device} events");
        self.packets.track(slice_track(track, self.process, name))?;
        self.instants.insert(device, track);
        Ok(track)
    }

    /// A refusal or a driver failure of `bytes` on `device`, `used` then, of `memory`'s kind.
    fn mark(
        &mut self,
        kind: MarkKind,
        ts_ns: u64,
        device: u32,
        (bytes, used): (u64, u64),
        memory: &str,
    ) -> io::Result<()> {
        let (category, what) = match kind {
            MarkKind::Denied => ("denied", "refused by the ceiling"),
            MarkKind::Failed => ("failed", "failed in the driver"),
        };
        let size = gpumemhook_reader::format_size(bytes);
        let mut args = vec![annotation("bytes", bytes), annotation("used", used)];
        args.push(DebugAnnotation {
            name_field: Some(debug_annotation::NameField::Name("memory".into())),
            value: Some(debug_annotation::Value::StringValue(memory.to_string())),
        });
        let event = TrackEvent {
            r#type: Some(TYPE_INSTANT),
            track_uuid: Some(self.instant_track(device)?),
            name_field: Some(track_event::NameField::Name(format!("{size} {what}"))),
            categories: vec![category.into()],
            debug_annotations: args,
            ..Default::default()
        };
        self.packets.event(ts_ns, event)
    }

    /// A restart of `device`'s peak.
    fn peak_restart(&mut self, ts_ns: u64, device: u32) -> io::Result<()> {
        let event = TrackEvent {
            r#type: Some(TYPE_INSTANT),
            track_uuid: Some(self.instant_track(device)?),
            name_field: Some(track_event::NameField::Name("peak restarted".into())),
            categories: vec!["reset_peak".into()],
            ..Default::default()
        };
        self.packets.event(ts_ns, event)
    }

    /// The slices' begins and ends the lanes have decided, each lane described when first used.
    fn write_lanes(&mut self) -> io::Result<()> {
        let actions = std::mem::take(&mut self.lanes.actions);
        for action in &actions {
            let (lane, ts, name) = match action {
                LaneAction::Begin { lane, ts, name, .. } => (*lane, *ts, Some(name)),
                LaneAction::End { lane, ts } => (*lane, *ts, None),
            };
            while self.lane_tracks.len() <= lane {
                let track = self.uuid();
                let name = match self.lane_tracks.len() {
                    0 => "scopes".to_string(),
                    n => format!("scopes ({})", n + 1),
                };
                self.packets.track(slice_track(track, self.process, name))?;
                self.lane_tracks.push(track);
            }
            let event = TrackEvent {
                r#type: Some(match name {
                    Some(_) => TYPE_SLICE_BEGIN,
                    None => TYPE_SLICE_END,
                }),
                track_uuid: Some(self.lane_tracks[lane]),
                name_field: name.map(|n| track_event::NameField::Name(n.clone())),
                categories: name.map_or(vec![], |_| vec!["scope".into()]),
                ..Default::default()
            };
            self.packets.event(ts, event)?;
        }
        // The buffer is handed back, emptied, to be filled again without allocating.
        self.lanes.actions = actions;
        self.lanes.actions.clear();
        Ok(())
    }

    /// Ends the trace at `end_ns` (the end of the run, or its last event): scopes still open
    /// close there.
    pub fn finish(mut self, end_ns: u64) -> io::Result<()> {
        let last = self.last_ns.max(end_ns);
        self.lanes.finish(last);
        self.write_lanes()?;
        self.packets.out.flush()
    }
}

impl EventSink for PerfettoWriter<'_> {
    fn event(&mut self, e: &Event<'_>) -> io::Result<()> {
        self.advance(e.ts_ns)?;
        match e.kind {
            EventKind::ScopeOpen if (e.scope as usize) < MAX_SCOPES => {
                self.lanes.open(u64::from(e.scope), e.name, e.ts_ns);
            }
            EventKind::ScopeOpen => {}
            EventKind::ScopeClose => self.lanes.close(u64::from(e.scope), e.ts_ns),
            EventKind::Ceiling => self.ceiling(e.ts_ns, e.device, e.limit)?,
            EventKind::PeakReset => {
                self.peak_restart(e.ts_ns, e.device)?;
                self.ceiling(e.ts_ns, e.device, e.limit)?;
            }
            kind => {
                let mark = match kind {
                    EventKind::Denied => Some(MarkKind::Denied),
                    EventKind::Failed => Some(MarkKind::Failed),
                    _ => None,
                };
                if let Some(mark) = mark {
                    let figures = (e.bytes, e.used);
                    self.mark(mark, e.ts_ns, e.device, figures, e.mem.name())?;
                }
                if e.mem == MemKind::Device {
                    self.ceiling(e.ts_ns, e.device, e.limit)?;
                    if matches!(kind, EventKind::Alloc | EventKind::Free) {
                        self.used(e.device, e.ts_ns, e.used)?;
                        if !e.module.is_empty() {
                            self.module_step(e)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn ceiling_step(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) -> io::Result<()> {
        self.last_ns = self.last_ns.max(ts_ns);
        self.ceiling(ts_ns, device, limit)
    }
}

/// Writes the recording at `path` as a Perfetto trace into `out`, as it is read: memory does not
/// grow with its events.
pub fn write_recording_as_perfetto(path: &Path, out: &mut dyn Write) -> Result<(), TraceError> {
    let recording = Recording::open(path)?;
    let io = |e: io::Error| TraceError::broken(format!("cannot write the Perfetto trace: {e}"));
    let command = recording.command();
    let mut writer =
        PerfettoWriter::new(out, recording.pid(), &command, &recording.info()).map_err(io)?;
    let end = recording.replay(&mut writer)?;
    // A recording cut short ends at its last event.
    let end_ns = match end.ending {
        Ending::Finished => end.end_ns.unwrap_or(end.last_ns),
        _ => end.last_ns,
    };
    writer.finish(end_ns).map_err(io)
}

/// Writes the Perfetto trace of `t` (a timeline read whole: one of an earlier version's Chrome
/// JSON) to `out`, through [`PerfettoWriter`]: its counters track by track, then its scopes and
/// its instants, each in time order.
pub fn write_perfetto(t: &Timeline, out: &mut dyn Write) -> io::Result<()> {
    let mut w = PerfettoWriter::new(out, t.pid, &t.command, &t.info)?;
    for (&device, series) in &t.used {
        for &(ts, used) in series {
            w.used(device, ns(ts), used)?;
        }
    }
    for (&device, steps) in &t.ceilings {
        for &(ts, ceiling) in steps {
            w.ceiling(ns(ts), device, ceiling)?;
        }
    }
    for (&device, modules) in &t.module_used {
        for (module, series) in modules {
            for &(ts, held) in series {
                w.module_held(device, module, ns(ts), held)?;
            }
        }
    }
    write_scopes(t, &mut w)?;
    for m in &t.marks {
        let figures = (m.bytes, m.used);
        w.mark(m.kind, ns(m.ts), m.device, figures, &m.memory)?;
    }
    for (&device, restarts) in &t.peak_resets {
        for &ts in restarts {
            w.peak_restart(ns(ts), device)?;
        }
    }
    let last = t
        .end
        .into_iter()
        .chain(t.used.values().filter_map(|s| s.last().map(|p| p.0)))
        .chain(t.scopes.iter().flat_map(|s| [Some(s.1), s.2]).flatten())
        .fold(0.0, f64::max);
    w.finish(ns(last))
}

/// The scopes of `t`, their opens and closes in time order.
fn write_scopes(t: &Timeline, w: &mut PerfettoWriter<'_>) -> io::Result<()> {
    let spans: Vec<(u64, Option<u64>)> = t
        .scopes
        .iter()
        .map(|(_, open, close)| (ns(*open), close.map(ns)))
        .collect();
    for (ts, opens, i) in in_time_order(&spans) {
        w.advance(ts)?;
        match opens {
            true => w.lanes.open(i as u64, &t.scopes[i].0, ts),
            false => w.lanes.close(i as u64, ts),
        }
    }
    Ok(())
}

fn annotation(name: &str, value: u64) -> DebugAnnotation {
    DebugAnnotation {
        name_field: Some(debug_annotation::NameField::Name(name.into())),
        value: Some(debug_annotation::Value::UintValue(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Mark;

    /// Device 0: 1 MiB, then 3 MiB, then 1 MiB held, under a ceiling of 4 MiB lifted later; one
    /// module; a refusal; a peak restart; two overlapping scopes and one nested.
    fn timeline() -> Timeline {
        let mut t = Timeline {
            pid: 4242,
            command: "/usr/bin/python train.py".into(),
            ..Default::default()
        };
        t.info.labels.rank = Some("3".into());
        t.used
            .insert(0, vec![(10.0, 1 << 20), (20.5, 3 << 20), (30.0, 1 << 20)]);
        t.ceilings
            .insert(0, vec![(10.0, Some(4 << 20)), (25.0, None)]);
        let modules = BTreeMap::from([("libtorch.so".to_string(), vec![(10.0, 1 << 20)])]);
        t.module_used.insert(0, modules);
        t.marks.push(Mark {
            kind: MarkKind::Denied,
            ts: 22.0,
            device: 0,
            bytes: 8 << 20,
            used: 3 << 20,
            memory: "device".into(),
        });
        t.peak_resets.insert(0, vec![26.0]);
        t.scopes = vec![
            ("a".into(), 5.0, Some(25.0)),
            ("b".into(), 15.0, Some(35.0)),
            ("a.inner".into(), 6.0, Some(7.0)),
        ];
        t
    }

    fn decode(t: &Timeline) -> Trace {
        let mut bytes = Vec::new();
        write_perfetto(t, &mut bytes).unwrap();
        Trace::decode(bytes.as_slice()).unwrap()
    }

    /// A track's name, its descriptor's `name` (one member of a oneof).
    fn track_name(d: &TrackDescriptor) -> Option<&str> {
        match &d.static_or_dynamic_name {
            Some(track_descriptor::StaticOrDynamicName::Name(name)) => Some(name),
            None => None,
        }
    }

    /// An event's name (one member of a oneof).
    fn event_name(e: &TrackEvent) -> Option<&str> {
        match &e.name_field {
            Some(track_event::NameField::Name(name)) => Some(name),
            None => None,
        }
    }

    /// A counter event's value (one member of a oneof).
    fn counter_of(e: &TrackEvent) -> i64 {
        match e.counter_value_field {
            Some(track_event::CounterValueField::CounterValue(v)) => v,
            None => panic!("a counter event without a value"),
        }
    }

    fn descriptor_named<'a>(trace: &'a Trace, name: &str) -> &'a TrackDescriptor {
        trace
            .packet
            .iter()
            .find_map(|p| match &p.data {
                Some(Data::TrackDescriptor(d)) if track_name(d) == Some(name) => Some(d),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no track {name}"))
    }

    fn events_on(trace: &Trace, track: u64) -> Vec<(u64, &TrackEvent)> {
        let events = trace.packet.iter().filter_map(|p| match &p.data {
            Some(Data::TrackEvent(e)) if e.track_uuid == Some(track) => Some((p.timestamp?, e)),
            _ => None,
        });
        events.collect()
    }

    /// Device 0 under a ceiling of 4 MiB lifted at a peak restart, with a module; a refusal;
    /// scopes nested, overlapping and one never closed; device 1 without a ceiling.
    fn events() -> Vec<Event<'static>> {
        let event = |ts_ns, kind, device, (bytes, used), name, scope, limit| Event {
            ts_ns,
            kind,
            device,
            bytes,
            used,
            address: 0x1000 + bytes,
            name,
            mem: MemKind::Device,
            tid: 7,
            scope,
            limit,
            module: if scope == 0 { "libtorch.so" } else { "" },
            site: "",
        };
        let ceiling = Some(4 << 20);
        let (alloc, free) = (EventKind::Alloc, EventKind::Free);
        let (open, close) = (EventKind::ScopeOpen, EventKind::ScopeClose);
        vec![
            event(
                1_000,
                alloc,
                0,
                (1 << 20, 1 << 20),
                "cuMemAlloc",
                0,
                ceiling,
            ),
            event(2_000, open, 0, (0, 0), "a", 1, ceiling),
            event(2_500, open, 0, (0, 0), "a.inner", 2, ceiling),
            event(3_000, close, 0, (0, 0), "a.inner", 2, ceiling),
            event(4_000, open, 0, (0, 0), "b", 3, ceiling),
            event(
                5_000,
                alloc,
                0,
                (2 << 20, 3 << 20),
                "cuMemAlloc",
                0,
                ceiling,
            ),
            event(5_500, alloc, 1, (1 << 20, 1 << 20), "cuMemAlloc", 0, None),
            event(
                6_000,
                EventKind::Denied,
                0,
                (8 << 20, 3 << 20),
                "cuMemAlloc",
                0,
                ceiling,
            ),
            event(7_000, close, 0, (0, 0), "a", 1, ceiling),
            event(8_000, EventKind::PeakReset, 0, (0, 3 << 20), "", 4, None),
            event(9_000, free, 0, (2 << 20, 1 << 20), "cuMemFree", 0, None),
            event(9_500, open, 0, (0, 0), "never closed", 5, None),
        ]
    }

    /// Per track name, its events: time, type, name and counter value.
    type Tracks = BTreeMap<String, Vec<(u64, i32, Option<String>, Option<i64>)>>;

    fn tracks(trace: &Trace) -> Tracks {
        let mut names = BTreeMap::new();
        let mut tracks = Tracks::new();
        for packet in &trace.packet {
            match &packet.data {
                Some(Data::TrackDescriptor(d)) => {
                    let name = track_name(d).unwrap_or("process").to_string();
                    names.insert(d.uuid.unwrap(), name.clone());
                    tracks.entry(name).or_default();
                }
                Some(Data::TrackEvent(e)) => {
                    let value = e
                        .counter_value_field
                        .map(|track_event::CounterValueField::CounterValue(v)| v);
                    let name = event_name(e).map(str::to_string);
                    let track = &names[&e.track_uuid.unwrap()];
                    let event = (packet.timestamp.unwrap(), e.r#type.unwrap(), name, value);
                    tracks.get_mut(track).unwrap().push(event);
                }
                None => panic!("an empty packet"),
            }
        }
        tracks
    }

    #[test]
    fn written_as_the_events_come_it_is_the_trace_of_the_timeline_they_make() {
        let info = RunInfo::default();
        let mut streamed = Vec::new();
        let mut writer = PerfettoWriter::new(&mut streamed, 42, "python train.py", &info).unwrap();
        let mut builder = crate::builder::TimelineBuilder::new(crate::timeline::Keep::Everything);
        for e in events() {
            writer.event(&e).unwrap();
            builder.event(&e).unwrap();
        }
        writer.finish(10_000).unwrap();
        let limits = BTreeMap::new();
        let command = "python train.py".to_string();
        let t = builder.finish(42, command, limits, 0, Some(10_000), info);
        let streamed = tracks(&Trace::decode(streamed.as_slice()).unwrap());
        let whole = tracks(&decode(&t));
        assert_eq!(streamed, whole);
        // What the timeline holds is all there.
        let names: Vec<&str> = streamed.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "device 0 ceiling",
                "device 0 events",
                "device 0 libtorch.so",
                "device 0 used",
                "device 1 libtorch.so",
                "device 1 used",
                "process",
                "scopes",
                "scopes (2)"
            ]
        );
        let ceiling: Vec<Option<i64>> = streamed["device 0 ceiling"].iter().map(|e| e.3).collect();
        assert_eq!(ceiling, [Some(4 << 20), Some(0)]);
        let scopes: Vec<(u64, i32)> = streamed["scopes"].iter().map(|e| (e.0, e.1)).collect();
        let (begin, end) = (TYPE_SLICE_BEGIN, TYPE_SLICE_END);
        let lane = [(2_000, begin), (2_500, begin), (3_000, end), (7_000, end)];
        assert_eq!(scopes[..4], lane);
        // The scope never closed ends at the end of the run.
        assert_eq!(scopes[4..], [(9_500, begin), (10_000, end)]);
    }

    #[test]
    fn the_counters_decode_back_to_the_timelines_figures() {
        let trace = decode(&timeline());
        let used = descriptor_named(&trace, "device 0 used");
        assert_eq!(used.counter.as_ref().unwrap().unit, Some(UNIT_SIZE_BYTES));
        let values: Vec<(u64, i64)> = events_on(&trace, used.uuid.unwrap())
            .into_iter()
            .map(|(ts, e)| (ts, counter_of(e)))
            .collect();
        assert_eq!(
            values,
            [(10_000, 1 << 20), (20_500, 3 << 20), (30_000, 1 << 20)]
        );
        let ceiling = descriptor_named(&trace, "device 0 ceiling");
        let steps: Vec<i64> = events_on(&trace, ceiling.uuid.unwrap())
            .into_iter()
            .map(|(_, e)| counter_of(e))
            .collect();
        assert_eq!(steps, [4 << 20, 0]);
        let module = descriptor_named(&trace, "device 0 libtorch.so");
        assert_eq!(events_on(&trace, module.uuid.unwrap()).len(), 1);
    }

    #[test]
    fn the_first_packet_clears_the_sequence_and_descriptors_come_first() {
        let trace = decode(&timeline());
        let first = &trace.packet[0];
        assert_eq!(first.sequence_flags, Some(SEQ_INCREMENTAL_STATE_CLEARED));
        let Some(Data::TrackDescriptor(process)) = &first.data else {
            panic!("the process's track first")
        };
        let p = process.process.as_ref().unwrap();
        assert_eq!(p.pid, Some(4242));
        assert_eq!(p.process_name.as_deref(), Some("python train.py (rank 3)"));
        assert_eq!(p.cmdline, ["/usr/bin/python train.py"]);
        assert!(p.process_labels.contains(&"rank=3".to_string()));
        assert!(trace
            .packet
            .iter()
            .all(|p| p.optional_trusted_packet_sequence_id
                == Some(OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(
                    SEQUENCE
                ))));
        // Every event's track was described before it.
        let mut described = std::collections::BTreeSet::new();
        for packet in &trace.packet {
            match &packet.data {
                Some(Data::TrackDescriptor(d)) => {
                    described.insert(d.uuid.unwrap());
                }
                Some(Data::TrackEvent(e)) => assert!(described.contains(&e.track_uuid.unwrap())),
                None => panic!("an empty packet"),
            }
        }
    }

    #[test]
    fn overlapping_scopes_take_two_lanes_and_a_nested_one_stays_inside() {
        let trace = decode(&timeline());
        let lane = descriptor_named(&trace, "scopes").uuid.unwrap();
        let kinds: Vec<(u64, i32, Option<&str>)> = events_on(&trace, lane)
            .into_iter()
            .map(|(ts, e)| (ts, e.r#type.unwrap(), event_name(e)))
            .collect();
        assert_eq!(
            kinds,
            [
                (5_000, TYPE_SLICE_BEGIN, Some("a")),
                (6_000, TYPE_SLICE_BEGIN, Some("a.inner")),
                (7_000, TYPE_SLICE_END, None),
                (25_000, TYPE_SLICE_END, None),
            ]
        );
        let second = descriptor_named(&trace, "scopes (2)").uuid.unwrap();
        assert_eq!(events_on(&trace, second).len(), 2);
    }

    #[test]
    fn refusals_and_restarts_are_instants() {
        let trace = decode(&timeline());
        let track = descriptor_named(&trace, "device 0 events").uuid.unwrap();
        let names: Vec<(u64, &str)> = events_on(&trace, track)
            .into_iter()
            .map(|(ts, e)| (ts, event_name(e).unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                (22_000, "8.00 MiB refused by the ceiling"),
                (26_000, "peak restarted")
            ]
        );
    }
}

//! `export --perfetto`: a timeline as Perfetto's own protobuf trace (a `Trace` of `TracePacket`s),
//! written one packet at a time. The messages are Perfetto's own: its `.proto` files, vendored in
//! `reader/timeline/proto/` trimmed to the fields written here, generated once by prost-build
//! into `crate::perfetto_protos` (`scripts/build/perfetto-protos`), so that no field number or
//! enum value is copied by hand.
//!
//! What it holds: one process track (pid, command, job labels; the rank in its name), and under
//! it a counter track per device of `used`, of the ceiling (0 for none) and of each module's
//! bytes; scopes as slices, on as many tracks ("lanes") as overlapping scopes need (a scope inside
//! another stays on its lane, nested); refusals, driver failures and peak restarts as instant
//! events on a track of their device. Every packet is of one sequence; the first clears its
//! incremental state (none is used: no interning), and the track descriptors come before any event.
//! Timestamps are nanoseconds of `CLOCK_MONOTONIC`, as the timeline's microseconds are.

use crate::timeline::{MarkKind, Timeline};
#[cfg(test)]
use prost::Message;
use std::collections::BTreeMap;
use std::io::{self, Write};

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

    fn event(&mut self, ts_us: f64, event: TrackEvent) -> io::Result<()> {
        self.put(Some(ns(ts_us)), Data::TrackEvent(event))
    }

    fn counter(&mut self, track: u64, ts_us: f64, value: u64) -> io::Result<()> {
        self.event(
            ts_us,
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
fn process_name(t: &Timeline) -> String {
    let (program, rest) = t.command.split_once(' ').unwrap_or((&t.command, ""));
    let program = program.rsplit('/').next().unwrap_or(program);
    let command = format!("{program} {rest}");
    let command = command.trim_end();
    match &t.info.labels.rank {
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

/// Track ids: the process's, then one after another from it, all under the pid in the high bits
/// so that two processes' traces never share one.
struct Uuids {
    next: u64,
}

impl Uuids {
    fn take(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// Writes the Perfetto trace of `t` to `out`.
pub fn write_perfetto(t: &Timeline, out: &mut dyn Write) -> io::Result<()> {
    let mut p = Packets {
        out,
        buf: Vec::new(),
        written: 0,
    };
    let process = u64::from(t.pid) << 32;
    let mut ids = Uuids { next: process };
    p.track(TrackDescriptor {
        uuid: Some(process),
        process: Some(ProcessDescriptor {
            pid: Some(t.pid as i32),
            cmdline: vec![t.command.clone()],
            process_name: Some(process_name(t)),
            process_labels: t
                .info
                .labels
                .pairs()
                .map(|(label, value)| format!("{label}={value}"))
                .collect(),
        }),
        ..Default::default()
    })?;
    write_counters(t, &mut p, process, &mut ids)?;
    write_scopes(t, &mut p, process, &mut ids)?;
    write_instants(t, &mut p, process, &mut ids)
}

/// Per device, `used` and the ceiling; per device and module, the module's bytes. Each track's
/// descriptor goes just before its values.
fn write_counters(t: &Timeline, p: &mut Packets, process: u64, ids: &mut Uuids) -> io::Result<()> {
    for (&device, series) in &t.used {
        let track = ids.take();
        p.track(bytes_track(
            track,
            process,
            format!("device {device} used"),
            device,
        ))?;
        for &(ts, used) in series {
            p.counter(track, ts, used)?;
        }
    }
    for (&device, steps) in &t.ceilings {
        if steps.iter().all(|(_, c)| c.is_none()) {
            continue;
        }
        let track = ids.take();
        let mut d = bytes_track(track, process, format!("device {device} ceiling"), device);
        d.description = Some("the allocation ceiling in force; 0: none".into());
        p.track(d)?;
        for &(ts, ceiling) in steps {
            p.counter(track, ts, ceiling.unwrap_or(0))?;
        }
    }
    for (&device, modules) in &t.module_used {
        for (module, series) in modules {
            let track = ids.take();
            let name = format!("device {device} {module}");
            p.track(bytes_track(track, process, name, device))?;
            for &(ts, held) in series {
                p.counter(track, ts, held)?;
            }
        }
    }
    Ok(())
}

/// The lane of each scope (by index in `scopes`, each `(open, close)`): the first lane where the
/// scope starts after every scope still open there has ended, or lies inside the innermost one;
/// so that the begin and end events of one lane always nest.
pub fn scope_lanes(scopes: &[(f64, f64)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scopes.len()).collect();
    // By start, and the longer first at one start: the outer scope takes the lane first.
    order.sort_by(|&a, &b| {
        let (sa, sb) = (scopes[a], scopes[b]);
        sa.0.total_cmp(&sb.0).then(sb.1.total_cmp(&sa.1))
    });
    let mut open: Vec<Vec<f64>> = Vec::new(); // per lane, the ends of its scopes still open
    let mut lane_of = vec![0; scopes.len()];
    for i in order {
        let (start, end) = scopes[i];
        let lane = (0..open.len()).find(|&l| {
            while open[l].last().is_some_and(|&e| e <= start) {
                open[l].pop();
            }
            open[l].last().is_none_or(|&outer| end <= outer)
        });
        let lane = lane.unwrap_or_else(|| {
            open.push(Vec::new());
            open.len() - 1
        });
        open[lane].push(end);
        lane_of[i] = lane;
    }
    lane_of
}

/// Scopes as slices, a track per lane; a scope still open at exit ends at the timeline's end.
fn write_scopes(t: &Timeline, p: &mut Packets, process: u64, ids: &mut Uuids) -> io::Result<()> {
    let last = t
        .end
        .into_iter()
        .chain(t.used.values().filter_map(|s| s.last().map(|p| p.0)))
        .chain(t.scopes.iter().flat_map(|s| [Some(s.1), s.2]).flatten())
        .fold(f64::MIN, f64::max);
    let spans: Vec<(f64, f64)> = t
        .scopes
        .iter()
        .map(|(_, open, close)| (*open, close.unwrap_or(last).max(*open)))
        .collect();
    let lane_of = scope_lanes(&spans);
    // Per lane, its events in time order: at one time an end before a begin (the scope before
    // closes first), and begins in the order the lanes were filled (the outer scope first).
    let mut lanes: BTreeMap<usize, Vec<(f64, bool, usize)>> = BTreeMap::new();
    for (i, &(open, close)) in spans.iter().enumerate() {
        let lane = lanes.entry(lane_of[i]).or_default();
        lane.push((open, true, i));
        lane.push((close, false, i));
    }
    for (lane, mut events) in lanes {
        events.sort_by(|a, b| {
            let outer_first = |x: &(f64, bool, usize)| (spans[x.2].0, -spans[x.2].1);
            a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then_with(|| {
                let (oa, ob) = (outer_first(a), outer_first(b));
                let by_start = oa.0.total_cmp(&ob.0).then(oa.1.total_cmp(&ob.1));
                if a.1 {
                    by_start
                } else {
                    by_start.reverse()
                }
            })
        });
        let track = ids.take();
        let name = match lane {
            0 => "scopes".to_string(),
            n => format!("scopes ({})", n + 1),
        };
        p.track(slice_track(track, process, name))?;
        for (ts, begin, i) in events {
            let event = TrackEvent {
                r#type: Some(if begin {
                    TYPE_SLICE_BEGIN
                } else {
                    TYPE_SLICE_END
                }),
                track_uuid: Some(track),
                name_field: begin.then(|| track_event::NameField::Name(t.scopes[i].0.clone())),
                categories: if begin { vec!["scope".into()] } else { vec![] },
                ..Default::default()
            };
            p.event(ts, event)?;
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

/// Refusals, failures and peak restarts: instants on one track per device that has any.
fn write_instants(t: &Timeline, p: &mut Packets, process: u64, ids: &mut Uuids) -> io::Result<()> {
    let mut tracks: BTreeMap<u32, u64> = BTreeMap::new();
    let devices = t.marks.iter().map(|m| m.device);
    let devices = devices.chain(t.peak_resets.keys().copied());
    for device in devices {
        if let std::collections::btree_map::Entry::Vacant(v) = tracks.entry(device) {
            let track = ids.take();
            let name = format!("device {device} events");
            p.track(slice_track(track, process, name))?;
            v.insert(track);
        }
    }
    for m in &t.marks {
        let (category, what) = match m.kind {
            MarkKind::Denied => ("denied", "refused by the ceiling"),
            MarkKind::Failed => ("failed", "failed in the driver"),
        };
        let bytes = gpumemhook_reader::format_size(m.bytes);
        let mut args = vec![annotation("bytes", m.bytes), annotation("used", m.used)];
        args.push(DebugAnnotation {
            name_field: Some(debug_annotation::NameField::Name("memory".into())),
            value: Some(debug_annotation::Value::StringValue(m.memory.clone())),
        });
        let event = TrackEvent {
            r#type: Some(TYPE_INSTANT),
            track_uuid: Some(tracks[&m.device]),
            name_field: Some(track_event::NameField::Name(format!("{bytes} {what}"))),
            categories: vec![category.into()],
            debug_annotations: args,
            ..Default::default()
        };
        p.event(m.ts, event)?;
    }
    for (device, restarts) in &t.peak_resets {
        for &ts in restarts {
            let event = TrackEvent {
                r#type: Some(TYPE_INSTANT),
                track_uuid: Some(tracks[device]),
                name_field: Some(track_event::NameField::Name("peak restarted".into())),
                categories: vec!["reset_peak".into()],
                ..Default::default()
            };
            p.event(ts, event)?;
        }
    }
    Ok(())
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

    #[test]
    fn lanes_nest_or_separate() {
        // Equal starts: the longer is the outer; one starting as another ends shares its lane.
        let lanes = scope_lanes(&[(0.0, 1.0), (0.0, 5.0), (1.0, 2.0), (3.0, 9.0)]);
        assert_eq!(lanes, [0, 0, 0, 1]);
    }
}

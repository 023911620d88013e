//! Reading a timeline's Chrome trace JSON (`export --chrome`, and the timelines of earlier
//! versions) as it streams: the root object walked key by key, each element of `traceEvents`
//! parsed on its own and taken into a [`Timeline`] at once.

use gpumemhook_segment::layout::MemKind;
use gpumemhook_segment::recording::EventKind;
use serde_json::Value;

use crate::error::TraceError;
use crate::timeline::{Keep, MemoryInstant, Reading, Timeline};

/// Reads a trace written by [`crate::write_chrome_trace`], held in `text`.
pub fn read_chrome_trace(text: &str) -> Result<Timeline, TraceError> {
    read_events(&mut serde_json::Deserializer::from_str(text))
}

/// Reads a trace written by [`crate::write_chrome_trace`] from `input` as it comes (a file: give it
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

/// Reading Chrome JSON, one element of `traceEvents` at a time.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{Mark, MarkKind};

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
